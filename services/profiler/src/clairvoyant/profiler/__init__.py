"""The profiler service: workflow and workload prediction.

``core`` is the pure prediction core.  Around it: ``consumer`` (the durable JetStream consumer of
``cv.requests.completed``), ``persistence`` (profiles in SQL, Alembic ``migrations``), ``grpc_api``
(Annotate, GetProfile, ListWorkflowTypes), ``app`` (wiring), ``metrics``, ``cli`` (serve, show, evaluate)."""

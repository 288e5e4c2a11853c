"""The OpenAI-compatible HTTP and gRPC front door.

Request path (``pipeline.Pipeline``, shared by ``http_api`` and ``grpc_api``): authenticate
(``auth``) -> validate (``openai_api``) -> resolve the model (``models``) -> annotate (optional
profiler) -> Scheduler.Schedule -> Worker.Generate -> stream -> Scheduler.Complete + one
CompletionRecord on JetStream (``records``).  ``app`` wires both edges over ``frontend``; start it
with ``python -m clairvoyant.gateway``.
"""

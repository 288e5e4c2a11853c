"""The profiler service: workflow and workload prediction.  The pure prediction core is in ``core``;
the service adapter (gRPC, JetStream consumer, SQL persistence) is not built yet."""

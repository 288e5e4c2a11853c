"""The OpenAI-compatible HTTP and gRPC front door."""

"""Generated protobuf and gRPC stubs for clairvoyant.v1 (do not edit; `make proto`)."""

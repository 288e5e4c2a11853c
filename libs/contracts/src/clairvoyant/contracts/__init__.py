"""Clairvoyant gRPC contracts (generated from proto/clairvoyant/v1)."""

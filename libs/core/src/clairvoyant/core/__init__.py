"""Shared configuration, errors, telemetry, event bus, registry and value types."""

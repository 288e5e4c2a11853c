"""Global queues per model, priority and routing policies."""

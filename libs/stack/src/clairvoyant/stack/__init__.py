"""The local stack: ``python -m clairvoyant.stack`` (``make run``) and ``Stack`` for tests and benchmarks.

The only package that knows the services, by the module names it starts them with.  A local
NATS server and free ports come from ``clairvoyant.stack.natsserver``.
"""

from clairvoyant.stack.launcher import (
    DEFAULT_MODEL,
    RestartPolicy,
    Service,
    Stack,
    StackConfig,
    describe_exit,
    main,
)

__all__ = ["DEFAULT_MODEL", "RestartPolicy", "Service", "Stack", "StackConfig", "describe_exit", "main"]

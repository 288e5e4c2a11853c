"""The bench's name for the workload library, which lives in ``clairvoyant.workloads`` (libs/workloads)
so that the profiler's offline evaluation reads the same programs without importing the bench."""

from clairvoyant.workloads import *  # noqa: F403 - the library's public names, as they are
from clairvoyant.workloads import __all__ as __all__

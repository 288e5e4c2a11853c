"""The program types under their bench path, for the simulator's imports (``clairvoyant.workloads.program``)."""

from clairvoyant.workloads.program import (
    Call,
    CallSegment,
    NewSegment,
    Segment,
    SystemSegment,
    WorkflowProgram,
)

__all__ = ["Call", "CallSegment", "NewSegment", "Segment", "SystemSegment", "WorkflowProgram"]

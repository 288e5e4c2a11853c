"""Multi-agent workloads: a workflow spec, built-in workloads calibrated from the seeds and real
traces, and a generator of workflow programs (static DAGs of calls) for the driver and simulator.

    from clairvoyant.workloads import get_workload
    program = get_workload("coding_assistant").instantiate(numpy.random.default_rng(0), "wf-0")
"""

from clairvoyant.workloads.accuracy import (
    AccuracyModel,
    InputClass,
    InputLabeller,
    WorkflowInput,
    agent_depths,
    config_space,
    label_input,
    labelled_inputs,
    model_costs,
)
from clairvoyant.workloads.base import AgentStats, ToolStats, Workload, WorkloadStats
from clairvoyant.workloads.errors import ProgramError, SpecError, WorkloadDataError, WorkloadError
from clairvoyant.workloads.generator import SpecWorkload
from clairvoyant.workloads.program import (
    Call,
    CallSegment,
    NewSegment,
    Segment,
    SystemSegment,
    WorkflowProgram,
)
from clairvoyant.workloads.registry import WORKLOADS, check_workload_name, get_workload, list_workloads
from clairvoyant.workloads.spec import WorkflowSpec, load_spec
from clairvoyant.workloads.traces import TraceWorkload

__all__ = [
    "WORKLOADS",
    "AccuracyModel",
    "AgentStats",
    "Call",
    "CallSegment",
    "InputClass",
    "InputLabeller",
    "NewSegment",
    "ProgramError",
    "Segment",
    "SpecError",
    "SpecWorkload",
    "SystemSegment",
    "ToolStats",
    "TraceWorkload",
    "WorkflowInput",
    "WorkflowProgram",
    "WorkflowSpec",
    "Workload",
    "WorkloadDataError",
    "WorkloadError",
    "WorkloadStats",
    "agent_depths",
    "config_space",
    "check_workload_name",
    "get_workload",
    "label_input",
    "labelled_inputs",
    "list_workloads",
    "load_spec",
    "model_costs",
]

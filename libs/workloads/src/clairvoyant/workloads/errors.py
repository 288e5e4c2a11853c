"""The workload library's exceptions.  Callers catch ``WorkloadError`` for all of them."""

from __future__ import annotations


class WorkloadError(Exception):
    """Base of every error raised by ``clairvoyant.workloads``."""


class SpecError(WorkloadError, ValueError):
    """A workflow spec is invalid.  ``problems`` lists ``(path, message)`` pairs, e.g.
    ``("agents.engineer.output.cv", "must be >= 0")``; ``str()`` shows them one per line."""

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        where = f" {source}" if source else ""
        lines = [f"{path}: {message}" if path else message for path, message in problems]
        super().__init__(f"invalid workflow spec{where}:\n  " + "\n  ".join(lines))


class WorkloadDataError(WorkloadError, FileNotFoundError):
    """A trace-driven workload or replayed arrival process cannot find its data files."""


class TraceFormatError(WorkloadError, ValueError):
    """A trace file that exists but cannot be read as one: the message names the file, the line
    and the run (trace or session) it belongs to."""


class ProgramError(WorkloadError):
    """A generated ``WorkflowProgram`` breaks an invariant (see ``WorkflowProgram.check_integrity``)."""

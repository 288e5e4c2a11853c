"""KV moves in the simulator: a placement whose ``Decision.kv_source`` names another replica.

``KvMigrations.plan`` exports from the source, at once, the cached prefix of the call's prompt and
says when the transfer ends (``EmulatesKvTransfer.kv_transfer_seconds``), if the scheduler core's
rule (``scheduler.core.migration.worth_moving``) says the move beats recomputing what it saves.
The source keeps its copy; the simulator starts the call when the transfer ends
(``ReplicaStepper.land``).  Exports and plans only peek at the caches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from clairvoyant.bench.sim.prompts import PromptBook
from clairvoyant.bench.sim.replicas import TENANT, Replica
from clairvoyant.scheduler.core import Decision
from clairvoyant.scheduler.core.migration import worth_moving
from clairvoyant.worker.core.kv_transfer import KvPrefix, export_prefix
from clairvoyant.worker.runners.base import EmulatesKvTransfer
from clairvoyant.workloads.program import WorkflowProgram


class Migration(NamedTuple):
    """A KV transfer the simulator made for a placement (``Decision.kv_source``)."""

    call_id: str  # the call that waited for it
    source: str  # replica the session's KV was exported from
    target: str  # replica it was imported into, where the call runs
    tokens: int  # exported (and charged) tokens: the whole blocks of the prompt the source caches
    saved_tokens: int  # of which the call's prompt would have recomputed on the target
    start: float  # virtual time of the placement
    end: float  # start + the transfer's modelled seconds: the call joins the target then


class KvMigrations:
    """Plans the moves that placements ask for; ``made`` lists those planned, in order."""

    def __init__(self, replicas: Mapping[str, Replica], prompts: PromptBook) -> None:
        self.replicas = replicas
        self.prompts = prompts
        self.made: list[Migration] = []

    def plan(self, decision: Decision, program: WorkflowProgram, now: float) -> tuple[KvPrefix, float] | None:
        """The session's prefix to move for ``decision`` and when the move ends, if the rule says
        to move it (None: the call starts at once and recomputes)."""
        source = self.replicas.get(decision.kv_source or "")
        target = self.replicas[decision.worker_id]
        runner = target.runner
        if source is None or source is target or not isinstance(runner, EmulatesKvTransfer):
            return None
        prompt = self.prompts.prompt(program.workflow_type, program.call(decision.request_id))
        kv = source.engine.kv
        prefix = export_prefix(kv, source.runner, TENANT, token_ids=prompt, workflow_id=program.workflow_id)
        if prefix is None:
            return None
        saved = saved_tokens(target, prefix, len(prompt))
        seconds = runner.kv_transfer_seconds(prefix.num_tokens)
        if not worth_moving(saved, seconds, runner.recompute_seconds(saved) if saved else 0.0):
            return None
        move = Migration(
            decision.request_id, source.worker_id, target.worker_id, prefix.num_tokens, saved, now, now + seconds
        )
        self.made.append(move)
        return prefix, move.end


def saved_tokens(target: Replica, prefix: KvPrefix, prompt_tokens: int) -> int:
    """Tokens of the prompt that ``prefix`` (a prefix of it) covers and ``target`` does not cache
    yet, in whole blocks short of the prompt's last token (as the engine matches)."""
    kv = target.engine.kv
    if kv.cache is None:
        return 0
    blocks = min(prefix.num_tokens, prompt_tokens - 1) // kv.block_size
    cached = len(kv.cache.peek(TENANT, prefix.token_ids, blocks))
    return (blocks - cached) * kv.block_size

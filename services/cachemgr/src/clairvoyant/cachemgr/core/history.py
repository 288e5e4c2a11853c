"""The tenant-scoped workflow history: the finished calls of each live workflow, compactly.

Per (tenant, workflow_id): each finished call's request id, agent, start, prompt and output token
ids (``array('I')``) and prompt/response block-hash chains (``array('Q')``), kept in (start,
request id) order, which is the order ``AGENT[-N]`` counts in.  ``nbytes`` is the bytes of those
arrays, ``static_nbytes`` those of the static prefixes below (Python's object overhead is not
counted).

Bounds and lifetime: past ``max_bytes`` of workflow calls the least recently active workflow is
evicted whole (the
one just recorded too, when it alone is over); a workflow idle for ``idle_ttl_s`` expires
(``expire``); the manager ends one whose call said ``workflow_end`` (``end``).  Every way out is
reported to the caller, which tells the policy to forget it.

Static prefixes (``${static:...}``): per (tenant, workflow_type_id, agent_id) the prompts of the
agent's first call in its two most recent instances are kept (at most ``max_static_tokens`` each);
the static prefix is the longest common full-block prefix of the two, as token ids.  One instance is
not enough to tell a system prompt from a first input, so it needs two (the profiler also asks for
at least two).  At most ``max_static_agents`` agents are kept, least recently updated out first, so
static prefixes hold at most ``max_static_agents * 2 * max_static_tokens`` token ids (and their
hashes) outside ``max_bytes``.

Nothing here crosses tenants except ``references(..., all_tenants=True)``, which the manager asks
only when cross-tenant sharing is configured.
"""

from __future__ import annotations

from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes, common_prefix, sequence_hashes
from clairvoyant.policy.cache import CompletedCall

WorkflowKey = tuple[str, str]  # (tenant, workflow_id)
StaticKey = tuple[str, str, str]  # (tenant, workflow_type_id, agent_id)


@dataclass(frozen=True, slots=True)
class HistoryCall:
    """One finished call of a workflow (arrays: token ids 'I', chained block hashes 'Q')."""

    request_id: str
    agent_id: str
    start: float
    prompt: array[int]
    output: array[int]
    prompt_hashes: array[int]
    response_hashes: array[int]

    @property
    def nbytes(self) -> int:
        return sum(
            a.itemsize * len(a) for a in (self.prompt, self.output, self.prompt_hashes, self.response_hashes)
        )

    def sequence(self) -> list[int]:
        """Prompt then output token ids (what the response chain is computed over)."""
        return self.prompt.tolist() + self.output.tolist()


@dataclass(slots=True)
class _Workflow:
    workflow_type_id: str
    last_active: float
    calls: list[HistoryCall] = field(default_factory=list)
    hashes: set[int] = field(default_factory=set)  # every block of its calls' chains
    nbytes: int = 0


@dataclass(slots=True)
class _Static:
    samples: deque[tuple[array[int], array[int]]]  # (tokens 'I', hashes 'Q')
    prefix: array[int]  # token ids of the common full-block prefix
    prefix_hashes: tuple[int, ...] = ()  # its chained block hashes

    @property
    def nbytes(self) -> int:
        return 4 * len(self.prefix) + sum(4 * len(t) + 8 * len(h) for t, h in self.samples)


class Recorded(NamedTuple):
    """What ``WorkflowHistory.record`` did."""

    workflow: WorkflowKey | None  # where the call went (None: no workflow ids, or evicted)
    evicted: tuple[WorkflowKey, ...]  # workflows evicted to stay under the byte cap, oldest first


def call_chains(call: CompletedCall) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The call's (prompt, response) chains: from the record, else computed from its token ids."""
    prompt, response = call.prompt_block_hashes, call.response_block_hashes
    if call.prompt_token_ids and not prompt:
        computed = sequence_hashes(call.prompt_token_ids, call.output_token_ids)
        prompt = tuple(computed[0])
        response = response or (tuple(computed[1]) if call.output_token_ids else ())
    elif call.output_token_ids and call.prompt_token_ids and not response:
        response = tuple(sequence_hashes(call.prompt_token_ids, call.output_token_ids)[1])
    return prompt, response


class WorkflowHistory:
    """See the module docstring."""

    def __init__(
        self,
        *,
        max_bytes: int = 256 << 20,
        idle_ttl_s: float = 600.0,
        max_static_agents: int = 1024,
        max_static_tokens: int = 8192,
    ) -> None:
        if max_bytes < 0 or idle_ttl_s <= 0:
            raise ValueError("max_bytes must be >= 0 and idle_ttl_s > 0")
        self.max_bytes = max_bytes
        self.idle_ttl_s = idle_ttl_s
        self.max_static_agents = max_static_agents
        self.max_static_tokens = max_static_tokens
        self.nbytes = 0  # workflow calls
        self.static_nbytes = 0  # static prefix samples
        self._workflows: OrderedDict[WorkflowKey, _Workflow] = OrderedDict()  # least recently active first
        self._refs: dict[str, Counter[int]] = {}  # tenant -> block hash -> live workflows holding it
        self._static: OrderedDict[StaticKey, _Static] = OrderedDict()
        self._static_refs: dict[str, Counter[int]] = {}  # tenant -> block hash -> static prefixes holding it

    # ---- updates --------------------------------------------------------------------------------

    def record(self, call: CompletedCall, now: float) -> Recorded:
        """Add a finished call to its workflow (created on its first call)."""
        meta = call.app_metadata
        if meta is None or not meta.workflow_id:
            return Recorded(None, ())
        key = (call.tenant, meta.workflow_id)
        workflow = self._workflows.get(key)
        if workflow is None:
            workflow = self._workflows[key] = _Workflow(meta.workflow_type_id, now)
        self._workflows.move_to_end(key)
        workflow.last_active = max(workflow.last_active, now)
        prompt_hashes, response_hashes = call_chains(call)
        entry = HistoryCall(
            request_id=call.request_id,
            agent_id=meta.agent_id,
            start=call.start,
            prompt=array("I", call.prompt_token_ids),
            output=array("I", call.output_token_ids),
            prompt_hashes=array("Q", prompt_hashes),
            response_hashes=array("Q", response_hashes),
        )
        first_of_agent = all(c.agent_id != meta.agent_id for c in workflow.calls)
        at = len(workflow.calls)
        while at > 0 and (workflow.calls[at - 1].start, workflow.calls[at - 1].request_id) > (
            call.start,
            call.request_id,
        ):
            at -= 1
        workflow.calls.insert(at, entry)
        workflow.nbytes += entry.nbytes
        self.nbytes += entry.nbytes
        refs = self._refs.setdefault(call.tenant, Counter())
        for block_hash in (*prompt_hashes, *response_hashes):
            if block_hash not in workflow.hashes:
                workflow.hashes.add(block_hash)
                refs[block_hash] += 1
        if first_of_agent and entry.prompt:
            self._add_static_sample((call.tenant, meta.workflow_type_id, meta.agent_id), entry)
        evicted: list[WorkflowKey] = []
        while self.nbytes > self.max_bytes and self._workflows:
            evicted.append(next(iter(self._workflows)))
            self._drop(evicted[-1])
        return Recorded(key if key in self._workflows else None, tuple(evicted))

    def end(self, tenant: str, workflow_id: str) -> bool:
        """The workflow ended: its history goes.  False if it held none."""
        if (tenant, workflow_id) not in self._workflows:
            return False
        self._drop((tenant, workflow_id))
        return True

    def expire(self, now: float) -> list[WorkflowKey]:
        """Drop the workflows idle for ``idle_ttl_s`` at ``now``; returns them, least recent first."""
        expired: list[WorkflowKey] = []
        while self._workflows:
            key, workflow = next(iter(self._workflows.items()))
            if workflow.last_active + self.idle_ttl_s > now:
                break
            self._drop(key)
            expired.append(key)
        return expired

    # ---- queries --------------------------------------------------------------------------------

    def __contains__(self, key: WorkflowKey) -> bool:
        return key in self._workflows

    def __len__(self) -> int:
        return len(self._workflows)

    def calls(self, tenant: str, workflow_id: str) -> Sequence[HistoryCall]:
        """The workflow's finished calls in (start, request id) order; empty for an unknown one."""
        workflow = self._workflows.get((tenant, workflow_id))
        return tuple(workflow.calls) if workflow is not None else ()

    def workflow_type(self, tenant: str, workflow_id: str) -> str | None:
        workflow = self._workflows.get((tenant, workflow_id))
        return workflow.workflow_type_id if workflow is not None else None

    def holds(self, tenant: str, workflow_id: str, block_hash: int) -> bool:
        workflow = self._workflows.get((tenant, workflow_id))
        return workflow is not None and block_hash in workflow.hashes

    def references(self, tenant: str, block_hash: int, *, all_tenants: bool = False) -> int:
        """Live workflows whose chains hold the block: of ``tenant``, or of every tenant."""
        if all_tenants:
            return sum(refs[block_hash] for refs in (*self._refs.values(), *self._static_refs.values()))
        return sum(
            refs[block_hash] for refs in (self._refs.get(tenant), self._static_refs.get(tenant)) if refs
        )

    def static_prefix(self, tenant: str, workflow_type_id: str, agent_id: str) -> tuple[int, ...] | None:
        """The agent's static prefix as token ids; None until two instances agree on a block."""
        found = self._static.get((tenant, workflow_type_id, agent_id))
        return tuple(found.prefix) if found is not None and found.prefix else None

    def check_integrity(self) -> None:
        assert sum(w.nbytes for w in self._workflows.values()) == self.nbytes, "byte count drifted"
        assert sum(s.nbytes for s in self._static.values()) == self.static_nbytes, "static bytes drifted"
        for key, workflow in self._workflows.items():
            assert workflow.nbytes == sum(c.nbytes for c in workflow.calls), f"{key}: byte count drifted"
        refs: dict[str, Counter[int]] = {}
        for (tenant, _), workflow in self._workflows.items():
            refs.setdefault(tenant, Counter()).update(workflow.hashes)
        assert {t: +c for t, c in self._refs.items() if +c} == refs, "reference counts drifted"

    # ---- internals ------------------------------------------------------------------------------

    def _drop(self, key: WorkflowKey) -> None:
        workflow = self._workflows.pop(key)
        self.nbytes -= workflow.nbytes
        refs = self._refs[key[0]]
        for block_hash in workflow.hashes:
            refs[block_hash] -= 1
            if refs[block_hash] <= 0:
                del refs[block_hash]
        if not refs:
            del self._refs[key[0]]

    def _add_static_sample(self, key: StaticKey, call: HistoryCall) -> None:
        limit = self.max_static_tokens - self.max_static_tokens % BLOCK_TOKENS
        tokens = call.prompt[:limit]
        hashes = call.prompt_hashes[: limit // BLOCK_TOKENS]
        if len(hashes) < len(tokens) // BLOCK_TOKENS:  # a record without a chain
            hashes = array("Q", chain_hashes(tokens))
        found = self._static.pop(key, None)
        if found is None:
            found = _Static(deque(maxlen=2), array("I"))
        else:
            self.static_nbytes -= found.nbytes
            self._count_static(key[0], found, -1)
        found.samples.append((tokens, hashes))
        found.prefix, found.prefix_hashes = array("I"), ()
        if len(found.samples) == 2:
            (_, older), (latest, newer) = found.samples
            shared = common_prefix(older, newer)
            found.prefix = latest[: shared * BLOCK_TOKENS]
            found.prefix_hashes = tuple(newer[:shared])
        self._static[key] = found
        self.static_nbytes += found.nbytes
        self._count_static(key[0], found, +1)
        while len(self._static) > self.max_static_agents:
            (tenant, _, _), gone = self._static.popitem(last=False)
            self.static_nbytes -= gone.nbytes
            self._count_static(tenant, gone, -1)

    def _count_static(self, tenant: str, static: _Static, sign: int) -> None:
        """A static prefix counts as one reference to each of its blocks (an agent's system prompt
        outlives the workflow that computed it: the next instance starts with it)."""
        if not static.prefix_hashes:
            return
        refs = self._static_refs.setdefault(tenant, Counter())
        refs.update({h: sign for h in static.prefix_hashes})
        if sign < 0:
            for block_hash in static.prefix_hashes:
                if refs[block_hash] <= 0:
                    del refs[block_hash]
            if not refs:
                del self._static_refs[tenant]

"""Agent-name normalization: many per-task agent names folded into the few agents they really are.

Some agent frameworks name an agent per task (``expert_17``, ``expert_203``, ...): each name is
seen once or twice, so none gathers statistics.  ``AgentNames`` maps a record's agent id (and its
upstream agent id) to a normalized name, in this order, each step off unless configured:

1. ``pattern``: a regular expression searched in the name.  With a capture group, a name it
   matches becomes the text of group 1 (``^(expert)_\\d+$``: ``expert_17`` -> ``expert``);
   without one, every match is replaced by ``replacement`` (``\\d+`` and ``+``: ``expert_+``).
   Names it does not match, and names it would leave empty, are unchanged.
2. ``prompt_prefix_blocks``: agents whose prompts start with the same N chained 16-token block
   hashes (the system prompt) share one name, that of the first agent seen with that prefix, so an
   agent that is alone with its system prompt keeps its name.  A record with fewer prompt blocks
   keeps the name its agent was last grouped under, or its own.

``normalized(record)`` applies both at ingest.  ``lookup(agent_id)`` is what annotate uses, since
an annotate request carries no prompt: the pattern applies to any name, and a name ingested before
takes the group it was last grouped under; a name never ingested keeps its (pattern-normalized)
name, and the profile serves it its length prior (priors.py).  At most ``max_names`` names and
prefixes are remembered (the least recently used are forgotten first).  Nothing here raises on a
record; an invalid ``pattern``, or a ``replacement`` with a character agent ids may not hold
(``expr.AGENT_PATTERN``), raises ``ValueError`` when the profile is created (the service settings
reject both at start).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from clairvoyant.profiler.core.expr import AGENT_PATTERN

if TYPE_CHECKING:
    from clairvoyant.profiler.core.profile_types import CallRecord


@dataclass(frozen=True, slots=True)
class AgentNameConfig:
    pattern: str = ""  # regular expression over agent ids; "" turns the pattern step off
    replacement: str = "+"  # what each match becomes without a capture group (agent-id characters)
    prompt_prefix_blocks: int = 0  # leading prompt blocks that identify a system prompt; 0: off
    max_names: int = 100_000  # names and prompt prefixes remembered (least recently used forgotten)

    @property
    def enabled(self) -> bool:
        return bool(self.pattern) or self.prompt_prefix_blocks > 0


def compile_pattern(config: AgentNameConfig) -> re.Pattern[str] | None:
    """``config.pattern`` compiled (None when off); ``ValueError`` for a pattern that does not
    compile or a replacement that would put into a name a character agent ids may not hold."""
    if not config.pattern:
        return None
    if config.replacement and not AGENT_PATTERN.fullmatch(config.replacement):
        raise ValueError(f"agent name replacement {config.replacement!r}: agent ids match {AGENT_PATTERN.pattern}")
    try:
        return re.compile(config.pattern)
    except re.error as exc:
        raise ValueError(f"agent name pattern {config.pattern!r}: {exc}") from None


class AgentNames:
    """A profile's agent-name normalization (module doc); the identity when its config is off."""

    def __init__(self, config: AgentNameConfig | None = None) -> None:
        self.config = config or AgentNameConfig()
        self._pattern = compile_pattern(self.config)
        self._groups: OrderedDict[int, str] = OrderedDict()  # prompt prefix hash -> its group's name
        self._aliases: OrderedDict[str, str] = OrderedDict()  # name after the pattern -> its group

    def normalized(self, record: CallRecord) -> CallRecord:
        """``record`` with its agent and upstream agent names normalized (the same object when the
        config is off or nothing changes)."""
        if not self.config.enabled:
            return record
        agent_id = self._grouped(self._renamed(record.agent_id), record.prompt_blocks)
        upstream = record.upstream_agent_id
        if upstream is not None:
            upstream = self.lookup(upstream)
        if agent_id == record.agent_id and upstream == record.upstream_agent_id:
            return record
        return replace(record, agent_id=agent_id, upstream_agent_id=upstream)

    def lookup(self, agent_id: str) -> str:
        """The normalized name of ``agent_id`` without its prompt (annotate's case; module doc)."""
        if not self.config.enabled:
            return agent_id
        name = self._renamed(agent_id)
        return self._aliases.get(name, name)

    def _renamed(self, agent_id: str) -> str:
        if self._pattern is None:
            return agent_id
        if self._pattern.groups:
            match = self._pattern.search(agent_id)
            return match.group(1) if match is not None and match.group(1) else agent_id
        return self._pattern.sub(self.config.replacement, agent_id) or agent_id

    def _grouped(self, name: str, prompt_blocks: tuple[int, ...]) -> str:
        blocks = self.config.prompt_prefix_blocks
        if blocks <= 0:
            return name
        if len(prompt_blocks) < blocks:
            return self._aliases.get(name, name)
        # The hashes are chained: block i's hash stands for the whole prefix up to it.
        group = self._remember(self._groups, prompt_blocks[blocks - 1], name)
        self._remember(self._aliases, name, group, overwrite=True)
        return group

    def _remember(self, table: OrderedDict[Any, str], key: Any, value: str, overwrite: bool = False) -> str:
        if overwrite or key not in table:
            table[key] = value
        table.move_to_end(key)
        while len(table) > self.config.max_names:
            table.popitem(last=False)
        return table[key]

    def to_state(self) -> dict[str, Any]:
        # Hashes as strings: unsigned 64-bit values do not survive every JSON reader as numbers.
        return {
            "groups": [[str(h), name] for h, name in self._groups.items()],
            "aliases": [[name, group] for name, group in self._aliases.items()],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], config: AgentNameConfig) -> AgentNames:
        names = cls(config)
        names._groups = OrderedDict((int(h), name) for h, name in state.get("groups", []))
        names._aliases = OrderedDict((name, group) for name, group in state.get("aliases", []))
        return names

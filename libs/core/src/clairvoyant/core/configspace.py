"""Configuration spaces: which served model runs each agent of a workflow (Aragog, seeds/002 §3.1).

A *configuration* assigns one model to every agent of a workflow type; with ``k`` options per agent
and ``n`` agents there are ``k**n`` of them.  A configuration is a number in ``[0, size)``: agent
``i``'s option index is its digit in a mixed radix whose first agent is the least significant.  A
*set* of configurations is a bit mask (a Python int of ``size`` bits), so the operations the
scheduler runs per dispatch (prune to the configurations that ran agent ``a`` on model ``m``, ask
which models are still viable for an agent, count what is left) are a few integer operations,
as the seed's bit-vector state (§4).

Options are ordered by cost, cheapest first: the *reference* configuration (the seed's ``c*``) runs
every agent on its last option, the *base* configuration on its first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ConfigSpace:
    """The configurations of one workflow type.  ``agents`` in the workflow's topological order
    (their depth order is the scheduler's business); ``options[i]``: agent i's candidate models,
    cheapest first."""

    workflow_type: str
    agents: tuple[str, ...]
    options: tuple[tuple[str, ...], ...]
    _strides: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _uses: dict[tuple[str, str], int] = field(init=False, repr=False, compare=False)
    _position: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.agents:
            raise ValueError(f"configuration space of {self.workflow_type!r} has no agents")
        if len(self.agents) != len(self.options):
            raise ValueError("agents and options must have the same length")
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"configuration space of {self.workflow_type!r} names an agent twice")
        for agent, opts in zip(self.agents, self.options, strict=True):
            if not opts or len(set(opts)) != len(opts):
                raise ValueError(f"agent {agent!r} needs one or more distinct model options")
        strides, stride = [], 1
        for opts in self.options:
            strides.append(stride)
            stride *= len(opts)
        object.__setattr__(self, "_strides", tuple(strides))
        object.__setattr__(self, "_position", {a: i for i, a in enumerate(self.agents)})
        uses: dict[tuple[str, str], int] = {}
        for i, (agent, opts) in enumerate(zip(self.agents, self.options, strict=True)):
            for level, model in enumerate(opts):
                uses[(agent, model)] = self._mask_where(i, level)
        object.__setattr__(self, "_uses", uses)

    def _mask_where(self, position: int, level: int) -> int:
        mask = 0
        for config in range(self.size):
            if self.level(config, position) == level:
                mask |= 1 << config
        return mask

    # ---- numbering -------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._strides[-1] * len(self.options[-1])

    @property
    def everything(self) -> int:
        """The mask of every configuration."""
        return (1 << self.size) - 1

    @property
    def reference(self) -> int:
        """``c*``: every agent on its most expensive option."""
        return self.size - 1

    @property
    def base(self) -> int:
        """Every agent on its cheapest option."""
        return 0

    def position(self, agent: str) -> int | None:
        """The agent's index in ``agents``; None when the space does not know it."""
        return self._position.get(agent)

    def level(self, config: int, position: int) -> int:
        """Agent ``position``'s option index in ``config``."""
        return (config // self._strides[position]) % len(self.options[position])

    def levels(self, config: int) -> tuple[int, ...]:
        return tuple(self.level(config, i) for i in range(len(self.agents)))

    def config(self, levels: Sequence[int]) -> int:
        """The configuration with these option indices, one per agent."""
        if len(levels) != len(self.agents):
            raise ValueError(f"expected {len(self.agents)} option indices, got {len(levels)}")
        for i, level in enumerate(levels):
            if not 0 <= level < len(self.options[i]):
                raise ValueError(f"agent {self.agents[i]!r} has no option {level}")
        return sum(level * stride for level, stride in zip(levels, self._strides, strict=True))

    def config_of(self, models: Mapping[str, str]) -> int:
        """The configuration running each agent on ``models[agent]``."""
        levels = []
        for agent, opts in zip(self.agents, self.options, strict=True):
            if models.get(agent) not in opts:
                raise ValueError(f"agent {agent!r} cannot run on {models.get(agent)!r}; options: {list(opts)}")
            levels.append(opts.index(models[agent]))
        return self.config(levels)

    def models(self, config: int) -> dict[str, str]:
        """Agent -> model of ``config``."""
        return {a: self.options[i][self.level(config, i)] for i, a in enumerate(self.agents)}

    def name(self, config: int) -> str:
        """A readable name: the agents' models joined by '+', in agent order."""
        return "+".join(self.options[i][self.level(config, i)] for i in range(len(self.agents)))

    # ---- sets ------------------------------------------------------------------------------------

    def uses(self, agent: str, model: str) -> int:
        """The mask of configurations that run ``agent`` on ``model`` (0 when none does)."""
        return self._uses.get((agent, model), 0)

    def viable_models(self, mask: int, agent: str) -> tuple[str, ...]:
        """``agent``'s options that some configuration of ``mask`` uses, cheapest first."""
        i = self._position.get(agent)
        if i is None:
            return ()
        return tuple(m for m in self.options[i] if mask & self._uses[(agent, m)])

    def upgrades(self, config: int) -> Iterator[int]:
        """The configurations one step more expensive than ``config``: one agent moved to its next
        option, the others unchanged (the edges of the seed's Figure 7)."""
        for i, opts in enumerate(self.options):
            if self.level(config, i) + 1 < len(opts):
                yield config + self._strides[i]

    def members(self, mask: int) -> Iterator[int]:
        """The configurations of ``mask``, in increasing order."""
        while mask:
            low = mask & -mask
            yield low.bit_length() - 1
            mask ^= low

    def cost(self, config: int, model_cost: Mapping[str, float]) -> float:
        """The sum of the agents' model costs (e.g. parameters, so FLOPs per token)."""
        return sum(model_cost[self.options[i][self.level(config, i)]] for i in range(len(self.agents)))

"""What ``python -m clairvoyant.profiler show`` prints and draws for one profile.

The drawing is the pruned transition automaton laid out in columns by distance from the start
(``^``), with the end (``$``) last; an edge's width is its transition probability.  matplotlib
only (no graphviz binary), rendered off-screen.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import NamedTuple

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch
from rich.console import Console
from rich.table import Table

from clairvoyant.profiler.core import TransitionAutomaton, WorkflowProfile
from clairvoyant.profiler.core.automaton import END, START


def print_profile(profile: WorkflowProfile, console: Console) -> None:
    confidence = profile.confidence
    console.print(f"[bold]{profile.tenant} / {profile.workflow_type_id}[/bold]")
    console.print(f"path expression: {profile.expression or '(none yet)'}", markup=False, soft_wrap=True)
    console.print(f"tier: {confidence.tier.value} ({confidence.reason})", markup=False)
    console.print(f"instances: {profile.instances}")
    if profile.acceptance is not None:
        console.print(f"acceptance: {profile.acceptance:.3f}")
    console.print(agent_table(profile))


def agent_table(profile: WorkflowProfile) -> Table:
    """One row per agent, in Kairos rank order (schedule-first at the top)."""
    table = Table(title="agents")
    for column in ("agent", "calls", "out p50", "out p99", "out cv", "service s", "remaining s", "rank"):
        table.add_column(column, justify="left" if column == "agent" else "right")
    summaries = profile.agent_summaries()
    rank = profile.ranking().rank
    for agent_id in sorted(summaries, key=lambda a: (rank.get(a, len(rank)), a)):
        s = summaries[agent_id]
        table.add_row(
            agent_id,
            str(s.calls),
            _num(s.output_len.p50 if s.output_len else None, 0),
            _num(s.output_len.p99 if s.output_len else None, 0),
            _num(s.output_len.cv if s.output_len else None, 2),
            _num(s.service_s.mean if s.service_s else None, 2),
            _num(s.remaining_s.mean if s.remaining_s else None, 2),
            str(rank[agent_id]) if agent_id in rank else "-",
        )
    return table


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class Layout(NamedTuple):
    positions: dict[str, tuple[float, float]]  # state -> (column, row)
    edges: list[tuple[str, str, float]]  # (u, v, P(v | u)) of the pruned automaton


def layout(automaton: TransitionAutomaton) -> Layout:
    """Columns by breadth-first distance from ``^``; ``$`` in a column of its own at the end."""
    edges = [(u, v, p) for u in sorted(automaton.counts) for v, p in automaton.successors(u).items()]
    depth = {START: 0}
    queue = deque([START])
    while queue:
        u = queue.popleft()
        for v in automaton.successors(u):
            if v not in depth and v != END:
                depth[v] = depth[u] + 1
                queue.append(v)
    last = max(depth.values()) + 1
    for state in automaton.states:  # unreachable after pruning: put them at the far end
        depth.setdefault(state, last)
        last = max(last, depth[state] + 1)
    depth[END] = last
    columns: dict[int, list[str]] = {}
    for state, column in depth.items():
        columns.setdefault(column, []).append(state)
    positions = {}
    for column, states in columns.items():
        for row, state in enumerate(sorted(states)):
            positions[state] = (float(column), row - (len(states) - 1) / 2.0)
    return Layout(positions, edges)


def draw_automaton(profile: WorkflowProfile, path: Path) -> Layout:
    """Write the pruned automaton of ``profile`` as a PNG to ``path``; returns what was drawn."""
    automaton = profile.automaton.pruned(profile.config.synthesis.prune_threshold)
    drawn = layout(automaton)
    pos = drawn.positions
    columns = max((x for x, _ in pos.values()), default=0.0) + 1
    rows = max((sum(1 for p in pos.values() if p[0] == x) for x, _ in pos.values()), default=1)
    figure = Figure(figsize=(max(6.0, 2.2 * columns), max(3.5, 1.6 * rows + 1.5)), dpi=100)
    ax = figure.add_subplot()
    for u, v, p in drawn.edges:
        (x1, y1), (x2, y2) = pos[u], pos[v]
        width = 0.5 + 6.0 * p
        if u == v:  # self-loop: a loop above the node
            arrow = FancyArrowPatch(
                (x1 - 0.12, y1 + 0.1), (x1 + 0.12, y1 + 0.1), connectionstyle="arc3,rad=-1.6",
                arrowstyle="-|>", mutation_scale=12, lw=width, color="tab:blue", alpha=0.7,
            )
            ax.text(x1, y1 + 0.36, f"{p:.2f}", ha="center", fontsize=8)
        else:
            bend = 0.0 if x2 == x1 + 1 and y1 == y2 else (0.35 if x2 <= x1 else 0.15)
            arrow = FancyArrowPatch(
                (x1, y1), (x2, y2), connectionstyle=f"arc3,rad={bend}", arrowstyle="-|>", mutation_scale=12,
                lw=width, color="tab:red" if x2 <= x1 else "tab:blue", alpha=0.7, shrinkA=30, shrinkB=30,
            )
            ax.text((x1 + x2) / 2, (y1 + y2) / 2 + 0.1 + (0.3 if x2 <= x1 else 0.0), f"{p:.2f}",
                    ha="center", fontsize=8)
        ax.add_patch(arrow)
    for state, (x, y) in pos.items():
        special = state in (START, END)
        box = {"boxstyle": "round,pad=0.5", "facecolor": "lightgray" if special else "white", "edgecolor": "black"}
        ax.text(x, y, "start" if state == START else "end" if state == END else state,
                ha="center", va="center", fontsize=9, zorder=4, bbox=box)
    title = f"{profile.tenant} / {profile.workflow_type_id}: {profile.expression or '(no expression)'}"
    ax.set_title(title.replace("$", r"\$"),
                 fontsize=9, wrap=True)
    ax.set_xlim(-0.6, columns - 0.4)
    ys = [y for _, y in pos.values()] or [0.0]
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.9)
    ax.axis("off")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", bbox_inches="tight")
    return drawn

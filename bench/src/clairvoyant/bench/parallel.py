"""Simulated runs side by side: one process per run, ``jobs`` at a time.

Each run (one preset on one experiment config) is independent and deterministic, so running
several at once changes nothing but the wall time: a result is the one the same run gives alone
(tests/bench/test_parallel_runs.py compares them).  Processes are spawned, not forked (a fork
of a process that has started torch's thread pool can hang), and each receives its config,
preset and prepared annotator pickled, the same state ``run_sim`` would copy in-process.

Progress travels from the runs to the caller as ``(run index, SimProgress)`` over a queue, so one
display can show every run's bar.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, NamedTuple

from clairvoyant.bench.sim.simulator import Annotator, SimProgress

ProgressCallback = Callable[[int, SimProgress], None]  # (run index, where it stands)
ResultCallback = Callable[[int, dict[str, Any]], None]  # (run index, its result), as each ends
POLL_S = 0.2  # how often the parent forwards progress while runs are going
SEND_EVERY_S = 0.1  # a run sends its progress at most this often (and always its last)


class SimTask(NamedTuple):
    """One simulated run: a preset on an experiment config (``experiment.ExperimentConfig``)."""

    config: Any
    policy: str
    annotator: Annotator | None  # prepared (``experiment.make_annotator``); each run copies it
    # What runs it (``experiment.run_sim``): a module-level function, so a spawned process gets it
    # by reference.  Passed in, so that this module needs nothing of the experiment's.
    simulate: Callable[..., dict[str, Any]]


def default_jobs(tasks: int) -> int:
    """One process per CPU this process may use, and no more than there are runs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, tasks))


def run_tasks(
    tasks: Sequence[SimTask],
    jobs: int = 1,
    on_progress: ProgressCallback | None = None,
    on_result: ResultCallback | None = None,
) -> list[dict[str, Any]]:
    """Every task's run (its ``simulate``), ``jobs`` at a time; results in task order.  A run that raises
    cancels the runs not yet started and re-raises in the caller."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if jobs == 1 or len(tasks) <= 1:
        serial = []
        for index, task in enumerate(tasks):
            serial.append(_run(index, task, on_progress))
            if on_result is not None:
                on_result(index, serial[-1])
        return serial
    context = multiprocessing.get_context("spawn")
    updates = context.Queue()
    results: list[dict[str, Any] | None] = [None] * len(tasks)
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(tasks)), mp_context=context, initializer=_worker_init, initargs=(updates,)
    ) as pool:
        futures: dict[Future[dict[str, Any]], int] = {
            pool.submit(_worker_run, index, task): index for index, task in enumerate(tasks)
        }
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
                _forward(updates, on_progress)
                for future in sorted(done, key=futures.__getitem__):
                    index = futures[future]
                    result = results[index] = future.result()
                    if on_result is not None:
                        on_result(index, result)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        _forward(updates, on_progress)
    return [result for result in results if result is not None]


def _run(index: int, task: SimTask, on_progress: ProgressCallback | None) -> dict[str, Any]:
    report = None if on_progress is None else (lambda where: on_progress(index, where))
    return task.simulate(task.config, task.policy, task.annotator, progress=report)


def _forward(updates: Any, on_progress: ProgressCallback | None) -> None:
    while True:
        try:
            index, where = updates.get_nowait()
        except queue.Empty:
            return
        if on_progress is not None:
            on_progress(index, SimProgress(*where))


# ---- in the worker processes ---------------------------------------------------------------------

_updates: Any = None


def _worker_init(updates: Any) -> None:
    global _updates
    _updates = updates


def _worker_run(index: int, task: SimTask) -> dict[str, Any]:
    last_sent = 0.0

    def send(i: int, where: SimProgress) -> None:
        nonlocal last_sent
        now = time.monotonic()
        if now - last_sent >= SEND_EVERY_S or where.workflows_done == where.workflows_total:
            last_sent = now
            _updates.put((i, tuple(where)))

    return _run(index, task, send)

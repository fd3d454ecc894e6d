"""Parallel MCMC chains as Ray tasks (the Ray edge of :mod:`placement_rl.search.mcmc`).

Each chain is one Ray task (``num_cpus=1``) with its own seed and initial candidates; chains report
their proposal count and best cost to a small progress actor, which the driver polls to drive one
progress bar. Works on the local Ray (started if none is running) or on the cluster ``ray.init()``
connects to (``RAY_ADDRESS``, e.g. inside ``ray job submit``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import ray

from placement_rl.graph import OpGraph
from placement_rl.search.mcmc import Budget, MCMCResult, finish, run_chain
from placement_rl.sim.cost import CostModel
from placement_rl.topology import DeviceTopology


@ray.remote(num_cpus=0)
class _Progress:
    """Latest (proposals, best cost) per chain."""

    def __init__(self, chains: int) -> None:
        self.proposals = [0] * chains
        self.best = [float("inf")] * chains

    def report(self, chain: int, proposals: int, best_cost_s: float) -> None:
        self.proposals[chain] = proposals
        self.best[chain] = best_cost_s

    def snapshot(self) -> tuple[int, float]:
        return sum(self.proposals), min(self.best)


@ray.remote(num_cpus=1)
def _chain(
    graph: OpGraph,
    topology: DeviceTopology,
    chain: int,
    budget: Budget,
    seed: int,
    candidates: list[str],
    options: dict[str, Any],
    progress: Any,
) -> dict[str, Any]:
    def report(proposals: int, best_cost_s: float) -> None:
        progress.report.remote(chain, proposals, best_cost_s)

    return run_chain(graph, topology, budget, seed=seed, candidates=candidates, report=report, **options)


def chain_candidates(initial: Sequence[str], chains: int) -> list[list[str]]:
    """Initial candidates per chain: round-robin, every chain at least one."""
    return [[c for j, c in enumerate(initial) if j % chains == k] or [initial[k % len(initial)]] for k in range(chains)]


def run_chains(
    graph: OpGraph,
    topology: DeviceTopology,
    *,
    budget: Budget,
    chains: int,
    seed: int,
    beta: float,
    oom_penalty: float,
    initial: Sequence[str],
    cost_model: CostModel | None,
    delta: bool,
    progress: bool,
    space_options: dict[str, Any],
) -> MCMCResult:
    """Run ``chains`` MCMC chains as Ray tasks and keep the best plan (see :func:`placement_rl.search.mcmc`)."""
    if not ray.is_initialized():
        ray.init()
    start = time.perf_counter()
    tracker = _Progress.remote(chains)
    graph_ref, topo_ref = ray.put(graph), ray.put(topology)
    options = {
        "beta": beta,
        "oom_penalty": oom_penalty,
        "space_options": space_options,
        "cost_model": cost_model,
        "delta": delta,
    }
    pending = [
        _chain.remote(graph_ref, topo_ref, k, budget, seed + k, cands, options, tracker)
        for k, cands in enumerate(chain_candidates(initial, chains))
    ]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        total = budget.proposals * chains if budget.proposals is not None else None
        bar = tqdm(total=total, unit="proposal", desc=f"mcmc x{chains}", dynamic_ncols=True)
    outcomes: list[dict[str, Any]] = []
    remaining = list(pending)
    while remaining:
        done, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=0.5)
        outcomes.extend(ray.get(done))
        if bar is not None:
            proposals, best = ray.get(tracker.snapshot.remote())
            bar.update(proposals - bar.n)
            bar.set_postfix(best_ms=f"{best * 1e3:.3f}", chains_left=len(remaining))
    if bar is not None:
        bar.close()
    ray.kill(tracker)
    return finish(graph, topology, outcomes, time.perf_counter() - start, cost_model, oom_penalty)


# ------------------------------------------------------------------------------------------ FT
@ray.remote(num_cpus=1)
def _ft_chunk(parts: Any, cells: Any, keep_cells: int, sum_cells: int, tolerance: float) -> Any:
    from placement_rl.search.ft.frontier import _combine_chunk

    return _combine_chunk(parts, cells, keep_cells, sum_cells, tolerance)


class RayChunks:
    """``map_chunks`` for FT: the kept cells of one large combine split over Ray tasks.

    TensorOpt's multithreading (the cumulative frontiers of different configurations of one op are
    independent) as Ray tasks. A combine small enough for one chunk runs in the driver.

    Attributes:
        chunk_points: candidate points per task (smaller than the serial default, so that large
            combines spread over the cluster's CPUs).
        tasks: Ray tasks submitted so far.
    """

    def __init__(self, chunk_points: int = 500_000) -> None:
        self.chunk_points = chunk_points
        self.tasks = 0

    def __call__(self, fn: Any, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        if len(args) == 1:
            return [fn(*args[0])]
        if not ray.is_initialized():
            ray.init()
        self.tasks += len(args)
        return list(ray.get([_ft_chunk.remote(*a) for a in args]))


def ft_frontier(
    graph: OpGraph,
    topology: DeviceTopology,
    devices: Sequence[str] | int | None = None,
    *,
    progress: bool = False,
    chunk_points: int = 500_000,
    **options: Any,
) -> Any:
    """:func:`placement_rl.search.ft.run_ft` (``options`` are its keyword arguments) with large
    combines as Ray tasks of at most ``chunk_points`` candidates, and a progress bar over the ops."""
    from placement_rl.progress import step_progress
    from placement_rl.search.ft import run_ft

    desc = f"FT-{options.get('method', 'ldp')} {graph.name}"
    with step_progress(graph.num_ops, desc, progress) as report:
        return run_ft(graph, topology, devices, map_chunks=RayChunks(chunk_points), progress=report, **options)

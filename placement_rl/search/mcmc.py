"""FlexFlow's execution optimizer: Metropolis-Hastings over SOAP configurations (sec. 6).

A proposal picks an op uniformly at random and gives it a configuration drawn from its
:class:`~placement_rl.search.space.SearchSpace` set; it is accepted with probability
``min(1, exp(beta' * (cost(S) - cost(S*))))``, ``S`` the current strategy and ``S*`` the proposal,
where ``beta' = beta / cost(initial)`` makes ``beta`` scale-free (``beta = 100``: a proposal 1%
worse is accepted with probability ``e^-1``; the default is 50). ``cost`` is the simulated makespan; a plan that does
not fit in memory costs ``makespan * (1 + oom_penalty * (1 + overflow))`` with ``overflow`` the
largest relative excess of a device's peak over its memory, so the search is steered back into
memory.

Initial candidates (FlexFlow): data parallelism, the expert strategy and random strategies. Each
candidate is searched until its share of the budget (seconds or proposals) is spent, or until no
improvement was found for half of that share. With ``chains=N`` the candidates are spread over N
independent chains with their own seeds, run by an injected task map (serially by default; as Ray
tasks with :class:`placement_rl.rl.parallel.RayMap`); the best plan wins.

Proposals are evaluated by delta simulation by default (:class:`~placement_rl.sim.delta.DeltaSimulator`:
only the changed op's tasks and their neighbourhood are rebuilt and the schedule is resumed from the
first moment it can differ), which gives exactly the makespan and memory of a full simulation.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placement_rl.graph import OpGraph
from placement_rl.parallel import TaskMap, serial_map
from placement_rl.plan import OpConfig, Plan, data_parallel, expert, subset_data_parallel
from placement_rl.progress import Progress
from placement_rl.search.space import SearchSpace
from placement_rl.sim.cost import CostModel
from placement_rl.sim.delta import DeltaSimulator, oom_cost
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import SimContext
from placement_rl.topology import DeviceTopology

INITIAL_CANDIDATES = ("data_parallel", "expert", "random")
#: FlexFlow's candidates plus the best data-parallel plan on one device group (a machine, or all devices of
#: one type): on heterogeneous clusters dropping slow devices or slow links is a move no single-op proposal makes.
EXTENDED_CANDIDATES = (*INITIAL_CANDIDATES, "subset_data_parallel")


@dataclass(frozen=True)
class Budget:
    """A search budget: wall-clock seconds or a number of proposals (exactly one is set)."""

    seconds: float | None = None
    proposals: int | None = None

    @classmethod
    def parse(cls, value: Budget | str | int | float) -> Budget:
        """``"30s"``, ``"2m"``, ``"1.5h"`` -> seconds; ``100000`` or ``"100000"`` -> proposals."""
        if isinstance(value, Budget):
            return value
        if isinstance(value, bool):
            raise ValueError(f"budget {value!r}: expected seconds like '30s' or a number of proposals")
        if isinstance(value, int):
            if value < 1:
                raise ValueError(f"budget {value}: expected at least 1 proposal")
            return cls(proposals=value)
        if isinstance(value, float):
            raise ValueError(f"budget {value!r}: write seconds as '{value}s' or give an integer number of proposals")
        text = str(value).strip()
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|h)", text)
        if match:
            seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]
            if seconds <= 0:
                raise ValueError(f"budget {value!r}: expected a positive duration")
            return cls(seconds=seconds)
        if text.isdigit():
            return cls.parse(int(text))
        raise ValueError(f"budget {value!r}: expected seconds ('30s', '2m', '1h') or a number of proposals ('100000')")

    def split(self, parts: int) -> Budget:
        """One of ``parts`` equal shares."""
        if self.seconds is not None:
            return Budget(seconds=self.seconds / parts)
        return Budget(proposals=max(1, (self.proposals or 1) // parts))

    def __str__(self) -> str:
        return f"{self.seconds:g}s" if self.seconds is not None else f"{self.proposals} proposals"


@dataclass(frozen=True)
class MCMCResult:
    """The outcome of a search.

    Attributes:
        plan: the best plan found.
        result: its full simulation.
        cost_s: its cost (the makespan, penalized if it does not fit).
        initial_costs_s: cost of each initial candidate, by name.
        costs_s: ``(proposals,)`` cost of the current strategy after each proposal (the best chain's).
        best_costs_s: ``(proposals,)`` best cost so far after each proposal (the best chain's).
        proposals: proposals made, all chains together.
        accepted: proposals accepted, all chains together.
        elapsed_s: wall-clock time of the search.
        chains: number of chains.
    """

    plan: Plan
    result: SimResult
    cost_s: float
    initial_costs_s: dict[str, float]
    costs_s: np.ndarray
    best_costs_s: np.ndarray
    proposals: int
    accepted: int
    elapsed_s: float
    chains: int = 1
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposals if self.proposals else 0.0

    @property
    def proposals_per_s(self) -> float:
        return self.proposals / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "cost_s": self.cost_s,
            "makespan_s": self.result.makespan_s,
            "oom": self.result.oom,
            "initial_costs_s": self.initial_costs_s,
            "proposals": self.proposals,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "proposals_per_s": self.proposals_per_s,
            "elapsed_s": self.elapsed_s,
            "chains": self.chains,
            **self.stats,
        }


def plan_cost(result: SimResult, oom_penalty: float) -> float:
    """The search cost of a simulated plan (see the module docstring and :func:`oom_cost`)."""
    return oom_cost(result.makespan_s, result.peak_memory_bytes, result.memory_capacity_bytes, oom_penalty)


def initial_plan(
    name: str,
    graph: OpGraph,
    topology: DeviceTopology,
    space: SearchSpace,
    rng: np.random.Generator,
    cost_model: CostModel | None = None,
) -> Plan:
    """One of FlexFlow's initial candidates, on the search space's devices (``cost_model`` judges
    subset data parallelism's device groups)."""
    if name == "data_parallel":
        return data_parallel(graph, topology, space.devices)
    if name == "expert":
        return expert(graph, topology, space.devices)
    if name == "random":
        return space.random_plan(rng)
    if name == "subset_data_parallel":
        return subset_data_parallel(graph, topology, space.devices, cost_model)
    raise ValueError(f"initial candidate {name!r}; expected one of {list(EXTENDED_CANDIDATES)}")


Reporter = Callable[[int, float], None]


def run_chain(
    graph: OpGraph,
    topology: DeviceTopology,
    budget: Budget,
    *,
    seed: int,
    candidates: Sequence[str],
    beta: float,
    oom_penalty: float,
    space_options: dict[str, Any],
    cost_model: CostModel | None = None,
    delta: bool = True,
    cutoff: bool = True,
    report: Reporter | None = None,
) -> dict[str, Any]:
    """One Markov chain over its initial candidates, each given an equal share of ``budget``.

    Returns plain data (picklable, for Ray): the best op configurations, costs, counters, traces.
    """
    rng = np.random.default_rng(seed)
    ctx = SimContext(graph, topology, cost_model)
    space = SearchSpace(graph, topology, **space_options)
    share = budget.split(len(candidates))
    n = graph.num_ops
    best_cfgs: list[OpConfig] = []
    best_cost = math.inf
    initial_costs: dict[str, float] = {}
    costs: list[float] = []
    best_trace: list[float] = []
    proposals = accepted = 0
    last_report = time.perf_counter()
    for name in candidates:
        plan = initial_plan(name, graph, topology, space, rng, ctx.cost)
        cfgs = [plan[op.name] for op in graph.ops]
        sim = DeltaSimulator(ctx, cfgs, oom_penalty) if delta else _FullEvaluator(ctx, cfgs, oom_penalty)
        current = sim.cost
        initial_costs[name] = current
        scale = beta / current if current > 0 else beta
        if current < best_cost:
            best_cost, best_cfgs = current, list(cfgs)
        start = time.perf_counter()
        last_improvement = start
        steps = 0
        last_improvement_step = 0
        while True:
            now = time.perf_counter()
            if share.seconds is not None:
                if now - start >= share.seconds or now - last_improvement > share.seconds / 2:
                    break
            elif steps >= (share.proposals or 0) or steps - last_improvement_step > (share.proposals or 0) / 2:
                break
            i = int(rng.integers(n))
            cfg = space.random_config(i, rng)
            steps += 1
            proposals += 1
            if cfg != sim.configs[i]:
                if cutoff:
                    # Draw the acceptance number first: the proposal is certainly rejected above
                    # `limit`, so its simulation may stop there. The draw is undone when the
                    # proposal is accepted without it, so the chain is the same as without cutoff.
                    state = rng.bit_generator.state
                    u = rng.random()
                    proposed = sim.propose(i, cfg, rejection_limit(current, u, scale))
                    if proposed <= current:
                        rng.bit_generator.state = state
                    accept = proposed <= current or u < math.exp(scale * (current - proposed))
                else:
                    proposed = sim.propose(i, cfg)
                    accept = proposed <= current or rng.random() < math.exp(scale * (current - proposed))
                if accept:
                    sim.accept()
                    current = proposed
                    accepted += 1
                    if current < best_cost:
                        best_cost, best_cfgs = current, list(sim.configs)
                        last_improvement, last_improvement_step = time.perf_counter(), steps
                else:
                    sim.reject()
            costs.append(current)
            best_trace.append(best_cost)
            if report is not None and now - last_report > 0.5:
                report(proposals, best_cost)
                last_report = now
    if report is not None:
        report(proposals, best_cost)
    return {
        "configs": best_cfgs,
        "cost_s": best_cost,
        "initial_costs_s": initial_costs,
        "costs_s": np.array(costs),
        "best_costs_s": np.array(best_trace),
        "proposals": proposals,
        "accepted": accepted,
    }


def rejection_limit(current_s: float, u: float, scale: float) -> float:
    """A cost above which the Metropolis test ``u < exp(scale * (current_s - cost))`` certainly fails.

    The test fails exactly when ``cost >= current_s - ln(u) / scale``; the limit is that, raised by
    one part in 10^9 so that rounding in ``exp`` never turns a cut-off proposal into an accepted one.
    """
    if u <= 0.0:
        return math.inf
    return (current_s - math.log(u) / scale) * (1.0 + 1e-9)


class _FullEvaluator:
    """The evaluator interface of :class:`DeltaSimulator`, by full re-simulation (for comparison)."""

    def __init__(self, ctx: SimContext, configs: list[OpConfig], oom_penalty: float) -> None:
        self.ctx = ctx
        self.oom_penalty = oom_penalty
        self.configs = list(configs)
        self.compiled = [ctx.compile_uncached(i, c) for i, c in enumerate(configs)]
        self.cost = plan_cost(ctx.run(self.compiled), oom_penalty)
        self._pending: tuple[int, OpConfig, Any] | None = None

    def propose(self, index: int, cfg: OpConfig, limit_s: float = math.inf) -> float:
        compiled = self.ctx.compile_uncached(index, cfg)
        previous = self.compiled[index]
        self.compiled[index] = compiled
        cost = plan_cost(self.ctx.run(self.compiled), self.oom_penalty)
        self.compiled[index] = previous
        self._pending = (index, cfg, compiled)
        return cost

    def accept(self) -> None:
        assert self._pending is not None
        index, cfg, compiled = self._pending
        self.configs[index], self.compiled[index] = cfg, compiled
        self._pending = None

    def reject(self) -> None:
        self._pending = None


def mcmc(
    graph: OpGraph,
    topology: DeviceTopology,
    *,
    budget: Budget | str | int = "10s",
    chains: int = 1,
    seed: int = 0,
    beta: float = 50.0,
    oom_penalty: float = 10.0,
    initial: Sequence[str] = EXTENDED_CANDIDATES,
    cost_model: CostModel | None = None,
    delta: bool = True,
    cutoff: bool = True,
    progress: bool = False,
    task_map: TaskMap | None = None,
    **space_options: Any,
) -> MCMCResult:
    """Search for a fast plan with FlexFlow's MCMC (see the module docstring).

    Args:
        graph: the op graph.
        topology: the cluster.
        budget: seconds (``"30s"``) or proposals (``100000``), per chain.
        chains: independent chains, each with its own seed and share of the initial candidates.
        seed: chain ``k`` uses seed ``seed + k``; the same seed and proposal budget give the same plan.
        beta: scale-free inverse temperature (``beta / cost(initial)`` multiplies cost differences).
        oom_penalty: cost multiplier for plans that do not fit.
        initial: initial candidates, spread round-robin over the chains: FlexFlow's ``data_parallel``,
            ``expert`` and ``random`` (:data:`INITIAL_CANDIDATES`, FlexFlow's own setting) and
            ``subset_data_parallel``; the default is all four (:data:`EXTENDED_CANDIDATES`), as in
            ``placement-rl plan``.
        cost_model: the simulator's cost model.
        delta: evaluate proposals with delta simulation (same results, faster).
        cutoff: stop simulating a proposal once its makespan is certainly above the cost at which
            the Metropolis test rejects it (the acceptance number is drawn first; same chain, faster).
        progress: show a progress bar of proposals and the best cost.
        task_map: runs the chains (:mod:`placement_rl.parallel`); the default runs them one after
            the other in this process, :class:`placement_rl.rl.parallel.RayMap` as Ray tasks. The
            result does not depend on it (with a proposal budget).
        **space_options: passed to :class:`SearchSpace` (``max_partitions``, ``dim_kinds``, ``devices``).

    Returns:
        The best plan with its simulation and the search statistics.
    """
    budget = Budget.parse(budget)
    if isinstance(chains, bool) or not isinstance(chains, int) or chains < 1:
        raise ValueError(f"chains = {chains!r}; expected at least 1")
    for name, value in (("beta", beta), ("oom_penalty", oom_penalty)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} = {value!r}; expected a finite number > 0")
    bad = [c for c in initial if c not in EXTENDED_CANDIDATES]
    if bad or not initial:
        raise ValueError(
            f"initial candidates {list(initial)}; expected a non-empty subset of {list(EXTENDED_CANDIDATES)}"
        )
    SearchSpace(graph, topology, **space_options)  # validate options before starting any chain
    options = {"beta": beta, "oom_penalty": oom_penalty, "space_options": space_options, "cost_model": cost_model,
               "delta": delta, "cutoff": cutoff}  # fmt: skip
    args = [
        (graph, topology, budget, seed + k, cands, options) for k, cands in enumerate(chain_candidates(initial, chains))
    ]
    start = time.perf_counter()
    total = budget.proposals * chains if budget.proposals is not None else budget.seconds
    label = "mcmc" if chains == 1 else f"mcmc x{chains}"
    with Progress(total, label, "proposal", enabled=progress, seconds=budget.seconds is not None) as bar:
        latest: dict[int, tuple[int, float]] = {}

        def report(chain: int, value: tuple[int, float]) -> None:
            latest[chain] = value
            done = sum(p for p, _ in latest.values())
            bar.update_to(done, proposals=done, best_ms=f"{min(b for _, b in latest.values()) * 1e3:.3f}")

        outcomes = (task_map or serial_map)(_chain_task, args, report if progress else None)
    return finish(graph, topology, outcomes, time.perf_counter() - start, cost_model, oom_penalty)


def chain_candidates(initial: Sequence[str], chains: int) -> list[list[str]]:
    """Initial candidates per chain: round-robin, every chain at least one."""
    return [[c for j, c in enumerate(initial) if j % chains == k] or [initial[k % len(initial)]] for k in range(chains)]


def _chain_task(
    graph: OpGraph,
    topology: DeviceTopology,
    budget: Budget,
    seed: int,
    candidates: list[str],
    options: dict[str, Any],
    report: Callable[[tuple[int, float]], None] | None = None,
) -> dict[str, Any]:
    """One chain as a task of a :class:`~placement_rl.parallel.TaskMap` (module level, so Ray can ship it)."""
    relay = None if report is None else (lambda proposals, best_cost_s: report((proposals, best_cost_s)))
    return run_chain(graph, topology, budget, seed=seed, candidates=candidates, report=relay, **options)


def finish(
    graph: OpGraph,
    topology: DeviceTopology,
    outcomes: Sequence[dict[str, Any]],
    elapsed_s: float,
    cost_model: CostModel | None,
    oom_penalty: float,
) -> MCMCResult:
    """Pick the best chain and simulate its plan in full."""
    from placement_rl.sim.simulator import simulate

    best = min(outcomes, key=lambda o: o["cost_s"])
    plan = Plan(graph.name, {op.name: cfg for op, cfg in zip(graph.ops, best["configs"], strict=True)}, name="mcmc")
    result = simulate(graph, topology, plan, cost_model)
    initial: dict[str, float] = {}
    for o in outcomes:
        for name, cost in o["initial_costs_s"].items():
            initial[name] = min(cost, initial.get(name, math.inf))
    return MCMCResult(
        plan=plan,
        result=result,
        cost_s=plan_cost(result, oom_penalty),
        initial_costs_s=initial,
        costs_s=best["costs_s"],
        best_costs_s=best["best_costs_s"],
        proposals=sum(o["proposals"] for o in outcomes),
        accepted=sum(o["accepted"] for o in outcomes),
        elapsed_s=elapsed_s,
        chains=len(outcomes),
    )

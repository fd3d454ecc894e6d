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

Beyond FlexFlow (options of :func:`mcmc`, FlexFlow's behaviour by default): ``proposals`` adds
moves a strategy needs (:mod:`placement_rl.search.proposals`: a neighbour's configuration, a
connected group moved to one device group, a sync-mode or replica-count change, and the plans v2
moves: another micro-batch count or pipeline schedule, recomputation, a ZeRO stage; the coordinated
moves: a parameter group, a layer range, a stage boundary or a device subset at once; the
``adaptive`` mix, whose weights follow what improves the chain); ``adaptive`` moves the temperature
toward a target rate of accepted worse proposals; ``tempering`` runs several replicas per chain at
geometrically spaced temperatures that swap states by the Metropolis rule; ``restart`` returns the
replicas to the best plan so far when no better one was found for a while.
The chain's state is a whole :class:`~placement_rl.plan.Plan`: the plan found carries its
micro-batches, schedule and virtual stages. A proposal whose 1F1B order waits for itself
(:class:`~placement_rl.sim.pipeline.ScheduleDeadlock`) costs ``inf``: it is rejected (and counted,
``stats["deadlocks"]``), drawing the same random numbers as any rejected proposal. The ``layerwise``
candidate (:data:`ALL_CANDIDATES`, not among the defaults) is the start micro-batch moves turn
into a pipeline.

Proposals are evaluated by delta simulation by default (:class:`~placement_rl.sim.delta.DeltaSimulator`:
only the changed ops' tasks and their neighbourhood are rebuilt and the schedule is resumed from the
first moment it can differ), which gives exactly the makespan and memory of a full simulation; a
new micro-batch count or schedule rebuilds (:meth:`~placement_rl.sim.delta.DeltaSimulator.propose_plan`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from placement_rl.graph import OpGraph
from placement_rl.parallel import Report, TaskMap, serial_map
from placement_rl.plan import OpConfig, Plan, data_parallel, expert, layerwise, subset_data_parallel
from placement_rl.plan.core import Schedule
from placement_rl.progress import Progress
from placement_rl.search.proposals import PipelineFields, Proposer, parse_proposals
from placement_rl.search.space import SearchSpace
from placement_rl.sim.cost import CostModel
from placement_rl.sim.delta import DeltaSimulator, oom_cost
from placement_rl.sim.limits import SimulationTooLarge
from placement_rl.sim.pipeline import ScheduleDeadlock
from placement_rl.sim.result import SimResult
from placement_rl.sim.simulator import SimContext
from placement_rl.topology import DeviceTopology

INITIAL_CANDIDATES = ("data_parallel", "expert", "random")
#: FlexFlow's candidates plus the best data-parallel plan on one device group (a machine, or all devices of
#: one type): on heterogeneous clusters dropping slow devices or slow links is a move no single-op proposal makes.
EXTENDED_CANDIDATES = (*INITIAL_CANDIDATES, "subset_data_parallel")
#: Every candidate a search may start from: also ``layerwise`` (contiguous stages, one per device), the
#: start a ``micro_batches`` proposal turns into a pipeline.
ALL_CANDIDATES = (*EXTENDED_CANDIDATES, "layerwise")


#: The largest budget a search takes: 30 days of wall-clock time, or a billion proposals (a larger one is
#: a typo, not a plan; at a few thousand proposals per second a billion is days of work).
MAX_BUDGET_S = 30 * 86400.0
MAX_BUDGET_PROPOSALS = 10**9


@dataclass(frozen=True)
class Budget:
    """A search budget: wall-clock seconds or a number of proposals (exactly one is set), at most
    :data:`MAX_BUDGET_S` seconds or :data:`MAX_BUDGET_PROPOSALS` proposals."""

    seconds: float | None = None
    proposals: int | None = None

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.proposals is None):
            raise ValueError(f"{self!r}: expected exactly one of seconds or proposals")
        if self.seconds is not None and not 0 < self.seconds <= MAX_BUDGET_S:
            raise ValueError(
                f"budget {self.seconds:g} s ({duration_words(self.seconds)}): expected a positive duration of at "
                f"most {duration_words(MAX_BUDGET_S)} ({MAX_BUDGET_S:g} s)"
            )
        if self.proposals is not None and not 0 < self.proposals <= MAX_BUDGET_PROPOSALS:
            raise ValueError(
                f"budget {self.proposals:,} proposals: expected between 1 and {MAX_BUDGET_PROPOSALS:,} proposals"
            )

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
            if value > MAX_BUDGET_PROPOSALS:
                raise ValueError(f"budget {value:,} proposals: expected at most {MAX_BUDGET_PROPOSALS:,}")
            return cls(proposals=value)
        if isinstance(value, float):
            raise ValueError(f"budget {value!r}: write seconds as '{value}s' or give an integer number of proposals")
        text = str(value).strip()
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|m|h)", text)
        if match:
            seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]
            if seconds <= 0:
                raise ValueError(f"budget {value!r}: expected a positive duration")
            if seconds > MAX_BUDGET_S:
                raise ValueError(
                    f"budget {_quote(text)} is {duration_words(seconds)}: expected at most "
                    f"{duration_words(MAX_BUDGET_S)} ('{MAX_BUDGET_S / 3600:g}h')"
                )
            return cls(seconds=seconds)
        if text.isdigit():
            if len(text.lstrip("0")) > len(str(MAX_BUDGET_PROPOSALS)):  # before int(): no huge conversions
                raise ValueError(f"budget {_quote(text)} proposals: expected at most {MAX_BUDGET_PROPOSALS:,}")
            return cls.parse(int(text))
        raise ValueError(
            f"budget {_quote(text)}: expected seconds ('30s', '2m', '1h') or a number of proposals ('100000')"
        )

    def describe(self) -> str:
        """The budget in words: ``"2 days 3 h"``, ``"100,000 proposals"``."""
        if self.seconds is not None:
            return duration_words(self.seconds)
        return f"{self.proposals:,} proposals"

    def split(self, parts: int) -> Budget:
        """One of ``parts`` equal shares."""
        if self.seconds is not None:
            return Budget(seconds=self.seconds / parts)
        return Budget(proposals=max(1, (self.proposals or 1) // parts))

    def __str__(self) -> str:
        return f"{self.seconds:g}s" if self.seconds is not None else f"{self.proposals} proposals"


def _quote(text: str, limit: int = 40) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def duration_words(seconds: float) -> str:
    """A duration in days, hours, minutes and seconds, largest first (``"30 days"``, ``"1 h 30 min"``,
    ``"45 s"``); only the two largest units are kept."""
    if not math.isfinite(seconds):
        return "unbounded"
    if seconds < 60:
        return f"{seconds:g} s"
    parts = []
    rest = round(seconds)
    for size, unit in ((86400, "day"), (3600, "h"), (60, "min"), (1, "s")):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''}")
    return " ".join(parts[:2])


@dataclass(frozen=True)
class MCMCResult:
    """The outcome of a search.

    Attributes:
        plan: the best plan found (with its pipeline fields: micro-batches, schedule, virtual stages).
        result: its full simulation.
        cost_s: its cost (the makespan, penalized if it does not fit).
        initial_costs_s: cost of each initial candidate, by name.
        costs_s: ``(proposals,)`` cost of the current strategy after each proposal (the best chain's).
        best_costs_s: ``(proposals,)`` best cost so far after each proposal (the best chain's).
        proposals: proposals made, all chains together.
        accepted: proposals accepted, all chains together.
        elapsed_s: wall-clock time of the search, preparation included (simulating the initial plans,
            and compiling the simulator's kernels on a fresh install).
        chains: number of chains.
        times_s: ``(proposals,)`` seconds since the search began after each proposal (the best chain's).
        stats: further statistics: proposals and acceptances by kind (with ``proposals`` other than
            ``"flexflow"``), the adaptive temperature's final multiplier, tempering swaps, the
            proposals cut off (``cut_off``), those whose schedule waits for itself (``deadlocks``) and
            those over the simulator's memory bound (``too_large``), both rejected.
        interrupted: the search was stopped by Ctrl-C (``KeyboardInterrupt``) before its budget was
            spent; ``plan`` is the best found until then, the chains after the interrupted one did not run
            (chains run as Ray tasks: the best plan they had reported, :func:`partial_outcome`).
        search_s: seconds spent proposing, all chains together: what a seconds budget counts (the
            initial plans' simulations are not in it).
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
    times_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    stats: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False
    search_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposals if self.proposals else 0.0

    @property
    def proposals_per_s(self) -> float:
        """Proposals per second of search (per chain-second when chains ran side by side)."""
        seconds = self.search_s if self.search_s > 0 else self.elapsed_s
        return self.proposals / seconds if seconds > 0 else 0.0

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
            "search_s": self.search_s,
            "chains": self.chains,
            "interrupted": self.interrupted,
            **self.stats,
        }


def plan_cost(result: SimResult, oom_penalty: float) -> float:
    """The search cost of a simulated plan (see the module docstring and :func:`oom_cost`)."""
    return oom_cost(result.makespan_s, result.peak_memory_bytes, result.memory_capacity_bytes, oom_penalty)


def initial_plan(
    name: str | Plan,
    graph: OpGraph,
    topology: DeviceTopology,
    space: SearchSpace,
    rng: np.random.Generator,
    cost_model: CostModel | None = None,
) -> Plan:
    """One of FlexFlow's initial candidates, on the search space's devices (``cost_model`` judges
    subset data parallelism's device groups); a :class:`Plan` given as a candidate is itself (checked
    against the graph and topology)."""
    if isinstance(name, Plan):
        name.validate(graph, topology)
        return name
    if name == "data_parallel":
        return data_parallel(graph, topology, space.devices)
    if name == "expert":
        return expert(graph, topology, space.devices)
    if name == "random":
        return space.random_plan(rng)
    if name == "subset_data_parallel":
        return subset_data_parallel(graph, topology, space.devices, cost_model)
    if name == "layerwise":
        return layerwise(graph, topology, space.devices)
    raise ValueError(f"initial candidate {name!r}; expected one of {list(ALL_CANDIDATES)}")


#: ``report(proposals, best_cost_s, search_s)``, and with ``report_best`` the best plan so far (:func:`run_chain`).
Reporter = Callable[..., None]

#: Adaptive temperature: every ADAPT_WINDOW worse proposals the temperature multiplier moves by
#: ADAPT_FACTOR toward the target rate of accepted worse proposals, within ADAPT_LIMITS.
ADAPT_WINDOW = 50
ADAPT_FACTOR = 1.5
ADAPT_LIMITS = (1e-2, 1e4)


def run_chain(
    graph: OpGraph,
    topology: DeviceTopology,
    budget: Budget,
    *,
    seed: int,
    candidates: Sequence[str | Plan],
    beta: float,
    oom_penalty: float,
    space_options: dict[str, Any],
    cost_model: CostModel | None = None,
    delta: bool = True,
    cutoff: bool = True,
    report: Reporter | None = None,
    proposals: str | Mapping[str, float] = "flexflow",
    adaptive: float | None = None,
    tempering: int = 1,
    beta_ratio: float = 3.0,
    restart: int | None = None,
    started_at: float | None = None,
    interruptible: bool = False,
    report_best: bool = False,
) -> dict[str, Any]:
    """One Markov chain over its initial candidates, each given an equal share of ``budget``.

    ``proposals``, ``adaptive``, ``tempering``, ``beta_ratio`` and ``restart`` are :func:`mcmc`'s. ``started_at``
    is the search's ``time.time()`` at its start (recorded times count from it; default: this chain's start).

    With ``interruptible``, a ``KeyboardInterrupt`` (Ctrl-C) ends the chain early: it returns what it
    has, marked ``interrupted`` (no configurations when it came before the first candidate was evaluated).

    ``report(proposals, best_cost_s, search_s)`` is called when the first candidate's search begins,
    then about every 0.5 s and at the end; ``search_s`` counts only the seconds spent proposing. With
    ``report_best`` every report has a fourth value, the best plan so far as :func:`partial_outcome`
    takes it (``None`` before a plan was evaluated): a chain run elsewhere (a Ray task) thus leaves its
    best plan with the driver, which keeps it when Ctrl-C stops the search.

    Returns plain data (picklable, for Ray): the best op configurations, costs, counters, traces.
    """
    rng = np.random.default_rng(seed)
    ctx = SimContext(graph, topology, cost_model)
    space = SearchSpace(graph, topology, **space_options)
    proposer = Proposer(graph, topology, space, proposals)
    share = budget.split(len(candidates))
    best_cfgs: list[OpConfig] = []
    best_pipeline = PipelineFields()
    best_cost = math.inf
    initial_costs: dict[str, float] = {}
    costs: list[float] = []
    best_trace: list[float] = []
    times: list[float] = []
    proposals_made = accepted = 0
    chain_start = time.perf_counter()
    offset = max(0.0, time.time() - started_at) if started_at is not None else 0.0
    last_report = chain_start
    searched_s = 0.0  # seconds spent proposing, over the candidates finished so far
    searching_since: float | None = None  # when the current candidate's proposals began
    replicas = max(1, tempering)
    heat = 1.0  # adaptive temperature: multiplies every replica's beta
    worse_tried = worse_taken = 0
    swaps_tried = swaps_taken = 0
    cut_off = 0  # proposals whose simulation stopped above the rejection limit
    deadlocks = 0  # proposals whose schedule waits for itself (rejected)
    too_large = 0  # proposals whose task graph is over the simulator's memory bound (rejected)
    restarts = 0  # returns of every replica to the best plan so far
    accepted_by_kind = dict.fromkeys(proposer.kinds, 0)
    interrupted = False

    def post(search_s: float) -> None:
        if report is None:
            return
        if not report_best:
            report(proposals_made, best_cost, search_s)
            return
        best = None
        if best_cfgs:
            best = {
                "configs": best_cfgs,
                "pipeline": (best_pipeline.micro_batches, best_pipeline.schedule, best_pipeline.virtual_stages),
                "cost_s": best_cost,
                "initial_costs_s": dict(initial_costs),
                "accepted": accepted,
            }
        report(proposals_made, best_cost, search_s, best)

    try:
        for name in candidates:
            plan = initial_plan(name, graph, topology, space, rng, ctx.cost)
            sims: list[DeltaSimulator | _FullEvaluator] = [
                DeltaSimulator.for_plan(ctx, plan, oom_penalty) if delta else _FullEvaluator(ctx, plan, oom_penalty)
                for _ in range(replicas)
            ]
            current = [sim.cost for sim in sims]
            initial_costs[candidate_name(name)] = current[0]
            scale = beta / current[0] if current[0] > 0 else beta
            betas = [scale / beta_ratio**k for k in range(replicas)]  # replica 0 is the coldest
            if current[0] < best_cost:
                best_cost, best_cfgs, best_pipeline = current[0], list(sims[0].configs), _fields(sims[0])
            start = searching_since = time.perf_counter()
            last_improvement = start
            steps = 0
            if name is candidates[0]:
                post(searched_s)
            last_improvement_step = last_restart_step = 0
            while True:
                now = time.perf_counter()
                if share.seconds is not None:
                    if now - start >= share.seconds or now - last_improvement > share.seconds / 2:
                        break
                elif steps >= (share.proposals or 0) or steps - last_improvement_step > (share.proposals or 0) / 2:
                    break
                if restart is not None and steps - max(last_improvement_step, last_restart_step) >= restart:
                    last_restart_step = steps
                    if any(c > best_cost for c in current):  # stuck away from the best: every replica back to it
                        best_plan = Plan(
                            graph.name,
                            {op.name: c for op, c in zip(graph.ops, best_cfgs, strict=True)},
                            micro_batches=best_pipeline.micro_batches,
                            schedule=best_pipeline.schedule,
                            virtual_stages=best_pipeline.virtual_stages,
                        )
                        sims = [
                            DeltaSimulator.for_plan(ctx, best_plan, oom_penalty)
                            if delta
                            else _FullEvaluator(ctx, best_plan, oom_penalty)
                            for _ in range(replicas)
                        ]
                        current = [sim.cost for sim in sims]
                        heat = 1.0
                        restarts += 1
                r = steps % replicas
                sim = sims[r]
                fields = _fields(sim)
                kind, change = proposer.draw(sim.configs, rng, fields)
                if isinstance(change, Plan):  # a whole new plan (restage)
                    plan_change: PipelineFields | Plan | None = change
                    changes: dict[int, OpConfig] = {}
                elif isinstance(change, PipelineFields):
                    plan_change = change if change != fields else None
                    changes = {}
                else:
                    plan_change, changes = None, {i: c for i, c in change.items() if c != sim.configs[i]}
                steps += 1
                proposals_made += 1
                gain = 0.0  # relative improvement of the current cost (for an adaptive mix)
                if changes or plan_change is not None:
                    scale = heat * betas[r]
                    if cutoff:
                        # Draw the acceptance number first: the proposal is certainly rejected above
                        # `rejection_limit`, so its simulation may stop there. The draw is undone when the
                        # proposal is accepted without it, so the chain is the same as without cutoff.
                        state = rng.bit_generator.state
                        u = rng.random()
                        proposed, failed = _propose(sim, changes, plan_change, rejection_limit(current[r], u, scale))
                        cut_off += proposed == math.inf and not failed
                        worse = proposed > current[r]
                        if not worse:
                            rng.bit_generator.state = state
                        take = not worse or u < math.exp(scale * (current[r] - proposed))
                    else:
                        proposed, failed = _propose(sim, changes, plan_change)
                        worse = proposed > current[r]
                        take = not worse or rng.random() < math.exp(scale * (current[r] - proposed))
                    deadlocks += failed == "deadlock"
                    too_large += failed == "too_large"
                    if take:
                        sim.accept()
                        if 0 < proposed < current[r]:
                            gain = (current[r] - proposed) / current[r]
                        current[r] = proposed
                        accepted += 1
                        accepted_by_kind[kind] += 1
                        worse_taken += worse
                        if proposed < best_cost:
                            best_cost, best_cfgs, best_pipeline = proposed, list(sim.configs), _fields(sim)
                            last_improvement, last_improvement_step = time.perf_counter(), steps
                    else:
                        sim.reject()
                    worse_tried += worse
                    if adaptive is not None and worse_tried >= ADAPT_WINDOW:
                        # too many worse plans taken: cool down; too few: heat up
                        heat *= ADAPT_FACTOR if worse_taken / worse_tried > adaptive else 1 / ADAPT_FACTOR
                        heat = min(max(heat, ADAPT_LIMITS[0]), ADAPT_LIMITS[1])
                        worse_tried = worse_taken = 0
                proposer.feedback(kind, gain)
                if replicas > 1 and r == replicas - 1:  # one sweep done: try to swap a random adjacent pair
                    k = int(rng.integers(replicas - 1))
                    swaps_tried += 1
                    if rng.random() < swap_probability(
                        heat * betas[k], heat * betas[k + 1], current[k], current[k + 1]
                    ):
                        sims[k], sims[k + 1] = sims[k + 1], sims[k]
                        current[k], current[k + 1] = current[k + 1], current[k]
                        swaps_taken += 1
                costs.append(current[0])
                best_trace.append(best_cost)
                times.append(offset + time.perf_counter() - chain_start)
                if report is not None and now - last_report > 0.5:
                    post(searched_s + now - start)
                    last_report = now
            searched_s += time.perf_counter() - start
            searching_since = None
    except KeyboardInterrupt:  # Ctrl-C: stop here and hand back the best plan so far
        if not interruptible:
            raise
        interrupted = True
        if searching_since is not None:
            searched_s += time.perf_counter() - searching_since
        steps_traced = min(len(costs), len(best_trace), len(times))  # the interrupt may fall between appends
        del costs[steps_traced:], best_trace[steps_traced:], times[steps_traced:]
    post(searched_s)
    stats: dict[str, Any] = {"cut_off": cut_off} if cutoff else {}
    if deadlocks:
        stats["deadlocks"] = deadlocks
    if too_large:
        stats["too_large"] = too_large
    if proposer.kinds != ["flexflow"]:
        stats["proposals_by_kind"] = dict(proposer.counts)
        stats["accepted_by_kind"] = accepted_by_kind
    if adaptive is not None:
        stats["final_heat"] = heat
    if proposer.adaptive:  # pairs, not a dict: chains' weights are not summed
        stats["final_mix"] = tuple((k, round(w, 4)) for k, w in proposer.mix.items())
    if restart is not None:
        stats["restarts"] = restarts
    if replicas > 1:
        stats["swaps_tried"], stats["swaps_accepted"] = swaps_tried, swaps_taken
    return {
        "configs": best_cfgs,
        "pipeline": (best_pipeline.micro_batches, best_pipeline.schedule, best_pipeline.virtual_stages),
        "cost_s": best_cost,
        "initial_costs_s": initial_costs,
        "costs_s": np.array(costs),
        "best_costs_s": np.array(best_trace),
        "times_s": np.array(times),
        "proposals": proposals_made,
        "accepted": accepted,
        "search_s": searched_s,
        "stats": stats,
        "interrupted": interrupted,
    }


def rejection_limit(current_s: float, u: float, scale: float) -> float:
    """A cost above which the Metropolis test ``u < exp(scale * (current_s - cost))`` certainly fails.

    The test fails exactly when ``cost >= current_s - ln(u) / scale``; the limit is that, raised by
    one part in 10^9 so that rounding in ``exp`` never turns a cut-off proposal into an accepted one.
    """
    if u <= 0.0:
        return math.inf
    return (current_s - math.log(u) / scale) * (1.0 + 1e-9)


def swap_probability(beta_i: float, beta_j: float, cost_i: float, cost_j: float) -> float:
    """Parallel tempering's Metropolis rule for exchanging the states of replicas ``i`` and ``j``:
    ``min(1, exp((beta_i - beta_j) * (cost_i - cost_j)))`` (a colder replica holding the worse state
    always swaps)."""
    exponent = (beta_i - beta_j) * (cost_i - cost_j)
    return 1.0 if exponent >= 0 else math.exp(exponent)


def _fields(sim: DeltaSimulator | _FullEvaluator) -> PipelineFields:
    return PipelineFields(sim.micro_batches, sim.schedule, sim.virtual_stages)


def _propose(
    sim: DeltaSimulator | _FullEvaluator,
    changes: dict[int, OpConfig],
    plan_change: PipelineFields | Plan | None,
    limit_s: float = math.inf,
) -> tuple[float, str]:
    """The cost of a proposal (op changes, new pipeline fields or a whole plan), and why it could not
    be simulated: ``"deadlock"`` when its schedule waits for itself (:class:`ScheduleDeadlock`),
    ``"too_large"`` when its task graph is over the simulator's memory bound
    (:class:`~placement_rl.sim.limits.SimulationTooLarge`), else ``""``. Either way the cost is then
    ``inf``, rejected by any Metropolis test, and nothing is pending."""
    try:
        if isinstance(plan_change, Plan):
            return sim.propose_plan(plan_change, limit_s), ""
        if plan_change is not None:
            plan = sim.plan().with_schedule(plan_change.micro_batches, plan_change.schedule, plan_change.virtual_stages)
            return sim.propose_plan(plan, limit_s), ""
        if len(changes) == 1 and limit_s == math.inf:
            ((i, cfg),) = changes.items()
            return sim.propose(i, cfg), ""
        return sim.propose_many(changes, limit_s), ""
    except ScheduleDeadlock:
        sim.reject()
        return math.inf, "deadlock"
    except SimulationTooLarge:
        sim.reject()
        return math.inf, "too_large"


class _FullEvaluator:
    """The evaluator interface of :class:`DeltaSimulator`, by full re-simulation (for comparison)."""

    def __init__(self, ctx: SimContext, plan: Plan, oom_penalty: float) -> None:
        self.ctx = ctx
        self.oom_penalty = oom_penalty
        self._plan = plan
        self.configs = [plan[op.name] for op in ctx.graph.ops]
        self.cost = plan_cost(ctx.simulate(plan, validate=False), oom_penalty)
        self.proposed_makespan_s = math.nan
        self._pending: Plan | None = None

    @property
    def micro_batches(self) -> int:
        return self._plan.micro_batches

    @property
    def schedule(self) -> Schedule:
        return self._plan.schedule

    @property
    def virtual_stages(self) -> int:
        return self._plan.virtual_stages

    def plan(self, name: str = "plan") -> Plan:
        return dataclasses.replace(self._plan, name=name)

    def propose(self, index: int, cfg: OpConfig, limit_s: float = math.inf) -> float:
        return self.propose_many({index: cfg})

    def propose_many(self, changes: Mapping[int, OpConfig], limit_s: float = math.inf) -> float:
        ops = self.ctx.graph.ops
        plan = self._plan.with_configs({**self._plan.configs, **{ops[i].name: c for i, c in changes.items()}})
        return self.propose_plan(plan)

    def propose_plan(self, plan: Plan, limit_s: float = math.inf) -> float:
        self._pending = None
        result = self.ctx.simulate(plan, validate=False)
        self._pending = plan
        self.proposed_makespan_s = result.makespan_s
        return plan_cost(result, self.oom_penalty)

    def accept(self) -> None:
        assert self._pending is not None
        self._plan, self._pending = self._pending, None
        self.configs = [self._plan[op.name] for op in self.ctx.graph.ops]

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
    initial: Sequence[str | Plan] = EXTENDED_CANDIDATES,
    cost_model: CostModel | None = None,
    delta: bool = True,
    cutoff: bool = True,
    progress: bool = False,
    task_map: TaskMap | None = None,
    proposals: str | Mapping[str, float] = "flexflow",
    adaptive: float | None = None,
    tempering: int = 1,
    beta_ratio: float = 3.0,
    restart: int | None = None,
    interruptible: bool = False,
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
            ``expert`` and ``random`` (:data:`INITIAL_CANDIDATES`, FlexFlow's own setting),
            ``subset_data_parallel`` and ``layerwise``; the default is the first four
            (:data:`EXTENDED_CANDIDATES`), as in ``placement-rl plan``; a :class:`Plan` among them is a
            start of its own (``placement-rl plan`` adds the best plan of the methods it ran before MCMC).
        cost_model: the simulator's cost model.
        delta: evaluate proposals with delta simulation (same results, faster).
        cutoff: stop simulating a proposal once its makespan is certainly above the cost at which
            the Metropolis test rejects it (the acceptance number is drawn first; same chain, faster).
        progress: show a progress bar of proposals and the best cost.
        task_map: runs the chains (:mod:`placement_rl.parallel`); the default runs them one after
            the other in this process, :class:`placement_rl.rl.parallel.RayMap` as Ray tasks. The
            result does not depend on it (with a proposal budget).
        proposals: the proposal kinds (:mod:`placement_rl.search.proposals`): ``"flexflow"`` (the
            default, FlexFlow's one random op and configuration: the same plans as before for a seed
            and proposal budget), ``"neighbour"``, ``"group"``, ``"sync"``, ``"replicas"``,
            ``"micro_batches"``, ``"schedule"``, ``"recompute"``, ``"zero"``, the coordinated moves
            ``"param_group"``, ``"block"``, ``"stage_shift"``, ``"device_subset"``, the mixes ``"mixed"``,
            ``"soap"``, ``"memory"``, ``"coordinated"`` (every kind) and ``"adaptive"`` (``coordinated``'s
            kinds, weighted by how often and how much each improved the chain, each kept at a quarter of
            its start weight at least), or a ``{kind: weight}`` mapping.
        adaptive: a target rate of accepted worse proposals (in ``(0, 1)``, e.g. ``0.1``): the
            temperature adapts toward it (every 50 worse proposals, beta times or over 1.5); ``None``
            (the default) keeps beta fixed.
        tempering: replicas per chain for parallel tempering (1, the default: none). Replica ``k``
            runs at ``beta / beta_ratio**k``; after each sweep (one proposal per replica) a random
            adjacent pair swaps states by the Metropolis rule (:func:`swap_probability`); the
            proposal budget counts every replica's proposals.
        beta_ratio: the ratio between adjacent tempering replicas' betas (> 1).
        restart: after this many proposals without a new best plan (counted from the last restart too),
            every replica returns to the best plan so far and the adaptive temperature to beta
            (``stats["restarts"]`` counts the returns that moved a replica); ``None`` (the default):
            never. The candidate still ends by FlexFlow's rule (half its share without improvement).
        interruptible: Ctrl-C (``KeyboardInterrupt``) ends the search early and the best plan found so
            far is returned, marked ``interrupted`` (the chains after the interrupted one do not run);
            ``KeyboardInterrupt`` is raised only when no plan had been evaluated yet. Chains run by
            another ``task_map`` (Ray tasks) report their best plan with their progress (about every
            0.5 s, :func:`run_chain`'s ``report_best``); Ctrl-C in the driver returns the best of those
            reports (its traces empty, its counts those reported). Off by default: a caller that records
            results (``compare``) must not take a cut-short search for a finished one.
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
    parse_proposals(proposals)
    if adaptive is not None and (
        isinstance(adaptive, bool) or not isinstance(adaptive, (int, float)) or not 0 < adaptive < 1
    ):
        raise ValueError(f"adaptive = {adaptive!r}; expected a target acceptance rate in (0, 1) or None")
    if isinstance(tempering, bool) or not isinstance(tempering, int) or tempering < 1:
        raise ValueError(f"tempering = {tempering!r}; expected an integer >= 1 (replicas per chain)")
    if isinstance(beta_ratio, bool) or not isinstance(beta_ratio, (int, float)) or not beta_ratio > 1:
        raise ValueError(f"beta_ratio = {beta_ratio!r}; expected a number > 1")
    check_restart(restart)
    bad = [c for c in initial if not isinstance(c, Plan) and c not in ALL_CANDIDATES]
    if bad or not initial:
        raise ValueError(
            f"initial candidates {[candidate_name(c) for c in initial]}; expected a non-empty subset of "
            f"{list(ALL_CANDIDATES)} (or plans to start from)"
        )
    SearchSpace(graph, topology, **space_options)  # validate options before starting any chain
    options = {"beta": beta, "oom_penalty": oom_penalty, "space_options": space_options, "cost_model": cost_model,
               "delta": delta, "cutoff": cutoff, "proposals": proposals, "adaptive": adaptive,
               "tempering": tempering, "beta_ratio": beta_ratio, "restart": restart, "started_at": time.time(),
               "interruptible": interruptible and task_map is None,
               "report_best": interruptible and task_map is not None}  # fmt: skip
    args = [
        (graph, topology, budget, seed + k, cands, options) for k, cands in enumerate(chain_candidates(initial, chains))
    ]
    start = time.perf_counter()
    # proposals, or chain-seconds of search (chains side by side or one after another)
    total = (budget.proposals if budget.proposals is not None else budget.seconds or 0.0) * chains
    label = "mcmc" if chains == 1 else f"mcmc x{chains}"
    timed = budget.seconds is not None
    remote_best = options["report_best"]  # chains elsewhere: their reports carry their best plans
    with Progress(total, f"{label}: simulating the initial plans", "proposal", enabled=progress, seconds=timed) as bar:
        latest: dict[int, tuple[Any, ...]] = {}

        def report(chain: int, value: tuple[Any, ...]) -> None:
            if not latest:
                bar.describe(label)
            latest[chain] = value
            done = sum(v[0] for v in latest.values())
            searched_s = sum(v[2] for v in latest.values())
            best_s = min(v[1] for v in latest.values())
            shown = (
                {"proposals": done}
                if not math.isfinite(best_s)
                else {"proposals": done, "best_ms": f"{best_s * 1e3:.3f}"}
            )
            bar.update_to(searched_s if timed else done, **shown)

        try:
            outcomes = (task_map or _serial_until_interrupted)(
                _chain_task, args, report if progress or remote_best else None
            )
        except KeyboardInterrupt:
            if not remote_best:
                raise
            # Ctrl-C in the driver: the chains' last reports hold their best plans (finish() raises
            # KeyboardInterrupt again when none had reported one)
            outcomes = [partial_outcome(v) for _, v in sorted(latest.items())]
    return finish(graph, topology, outcomes, time.perf_counter() - start, cost_model, oom_penalty)


def partial_outcome(value: tuple[Any, ...]) -> dict[str, Any]:
    """A chain's outcome (as :func:`run_chain` returns it) from its last report with ``report_best``
    (``(proposals, best_cost_s, search_s, best)``), for a search interrupted before the chain returned:
    its best plan and counts, no traces, marked ``interrupted``; no configurations when it reported no plan."""
    proposals, best_cost_s, search_s, best = value
    best = best or {}
    return {
        "configs": best.get("configs", []),
        "pipeline": best.get("pipeline", (1, "1f1b", 1)),
        "cost_s": best.get("cost_s", best_cost_s),
        "initial_costs_s": best.get("initial_costs_s", {}),
        "costs_s": np.zeros(0),
        "best_costs_s": np.zeros(0),
        "times_s": np.zeros(0),
        "proposals": proposals,
        "accepted": best.get("accepted", 0),
        "search_s": search_s,
        "stats": {},
        "interrupted": True,
    }


def check_restart(restart: object) -> None:
    """Raise ``ValueError`` unless ``restart`` is ``None`` or a positive number of proposals."""
    if restart is not None and (isinstance(restart, bool) or not isinstance(restart, int) or restart < 1):
        raise ValueError(f"restart = {restart!r}; expected a number of proposals >= 1 or None")


def _serial_until_interrupted(
    fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], report: Report | None = None
) -> list[Any]:
    """:func:`~placement_rl.parallel.serial_map` for chains, stopping after a chain that Ctrl-C interrupted."""
    out: list[Any] = []
    for k, a in enumerate(args):

        def relay(_: int, value: Any, k: int = k) -> None:
            if report is not None:
                report(k, value)

        out += serial_map(fn, [a], None if report is None else relay)
        if out[-1].get("interrupted"):
            break
    return out


def candidate_name(candidate: str | Plan) -> str:
    """How results name an initial candidate: its name, or a plan's ``plan:<its name>``."""
    return f"plan:{candidate.name}" if isinstance(candidate, Plan) else candidate


def chain_candidates(initial: Sequence[str | Plan], chains: int) -> list[list[str | Plan]]:
    """Initial candidates per chain: round-robin, every chain at least one."""
    return [[c for j, c in enumerate(initial) if j % chains == k] or [initial[k % len(initial)]] for k in range(chains)]


def _chain_task(
    graph: OpGraph,
    topology: DeviceTopology,
    budget: Budget,
    seed: int,
    candidates: list[str | Plan],
    options: dict[str, Any],
    report: Callable[[tuple[int, float, float]], None] | None = None,
) -> dict[str, Any]:
    """One chain as a task of a :class:`~placement_rl.parallel.TaskMap` (module level, so Ray can ship it)."""
    relay = None if report is None else (lambda *value: report(value))
    return run_chain(graph, topology, budget, seed=seed, candidates=candidates, report=relay, **options)


def finish(
    graph: OpGraph,
    topology: DeviceTopology,
    outcomes: Sequence[dict[str, Any]],
    elapsed_s: float,
    cost_model: CostModel | None,
    oom_penalty: float,
) -> MCMCResult:
    """Pick the best chain and simulate its plan in full.

    Raises:
        KeyboardInterrupt: when Ctrl-C came before any chain had evaluated a plan (nothing to return).
    """
    from placement_rl.sim.simulator import simulate

    interrupted = any(o.get("interrupted", False) for o in outcomes)
    outcomes = [o for o in outcomes if o["configs"]]
    if not outcomes:
        raise KeyboardInterrupt("interrupted before the search had evaluated a plan")
    best = min(outcomes, key=lambda o: o["cost_s"])
    micro_batches, schedule, virtual_stages = best.get("pipeline", (1, "1f1b", 1))
    plan = Plan(
        graph.name,
        {op.name: cfg for op, cfg in zip(graph.ops, best["configs"], strict=True)},
        name="mcmc",
        micro_batches=micro_batches,
        schedule=schedule,
        virtual_stages=virtual_stages,
    )
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
        times_s=best.get("times_s", np.zeros(0)),
        proposals=sum(o["proposals"] for o in outcomes),
        accepted=sum(o["accepted"] for o in outcomes),
        elapsed_s=elapsed_s,
        chains=len(outcomes),
        search_s=sum(o.get("search_s", 0.0) for o in outcomes),
        stats=_merge_stats([o.get("stats", {}) for o in outcomes]),
        interrupted=interrupted,
    )


def _merge_stats(stats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Chains' statistics together: counts summed (by key inside dicts), other values as a list per chain."""
    merged: dict[str, Any] = {}
    for key in dict.fromkeys(k for s in stats for k in s):
        values = [s[key] for s in stats if key in s]
        if all(isinstance(v, dict) for v in values):
            merged[key] = {k: sum(v.get(k, 0) for v in values) for k in dict.fromkeys(k for v in values for k in v)}
        elif all(isinstance(v, int) for v in values):
            merged[key] = sum(values)
        else:
            merged[key] = values if len(values) > 1 else values[0]
    return merged

"""Search baselines: SOAP spaces, delta simulation exactness, MCMC, exact optima, Ray chains."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from placement_rl.graph import Op
from placement_rl.graph.coarsen import coarsen
from placement_rl.plan import OpConfig, Plan, data_parallel, pipeline
from placement_rl.plan.core import sample_shares, zero_eligible
from placement_rl.search import Budget, SearchSpace, exhaustive, mcmc
from placement_rl.search.mcmc import plan_cost, run_chain
from placement_rl.search.proposals import (
    COORDINATED_KINDS,
    PipelineFields,
    Proposer,
    fits_micro_batches,
    micro_batch_options,
)
from placement_rl.sim import CostModel, DeltaSimulator
from placement_rl.sim.pipeline import ScheduleDeadlock
from placement_rl.sim.simulator import SimContext, simulate
from placement_rl.topology import load_preset

#: The papers' flat model: the exact-optimum instances were built for it (under the calibrated model lenet
#: on 4 GPUs is bound by the host issuing kernels; FlexFlow's one-op chain then ends 1% above the optimum).
ROOFLINE = CostModel(calibration=None)


def test_budget_parsing() -> None:
    assert Budget.parse("30s") == Budget(seconds=30.0)
    assert Budget.parse("2m") == Budget(seconds=120.0)
    assert Budget.parse(1000) == Budget(proposals=1000)
    assert Budget.parse("1000") == Budget(proposals=1000)
    assert Budget(proposals=9).split(3) == Budget(proposals=3)
    for bad in ("fast", "-3s", 0, 2.5):
        with pytest.raises(ValueError, match="budget"):
            Budget.parse(bad)  # type: ignore[arg-type]


def test_search_space_configs_are_valid_and_sampled_from_the_set(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    topo = load_preset("flexflow-p100")
    space = SearchSpace(graph, topo)
    conv = next(i for i, op in enumerate(graph.ops) if op.op_type == "conv2d" and op.output_shapes[0][2] == 8)
    configs = list(space.configs(conv))
    assert len(configs) == space.size(conv) == len(set(configs))
    assert all(c.num_partitions <= 16 and len(c.devices) == c.num_partitions for c in configs)
    # On an 8x8 feature map: data-parallel, channel-split and 4x4 spatial configs of 16 partitions.
    kinds = {tuple(sorted(c.degree_map)) for c in configs if c.num_partitions == 16}
    assert ("sample",) in kinds and ("channel",) in kinds and ("height", "width") in kinds
    rng = np.random.default_rng(0)
    plan = space.random_plan(rng)
    plan.validate(graph, topo)
    assert all(space.contains(i, plan[op.name]) for i, op in enumerate(graph.ops))
    sample_only = SearchSpace(graph, topo, dim_kinds=("sample",), devices=[d.name for d in topo.devices[:4]])
    assert all(
        set(c.degree_map) <= {"sample"} and set(c.devices) <= set(sample_only.devices)
        for c in sample_only.configs(conv)
    )
    with pytest.raises(ValueError, match="dim_kinds"):
        SearchSpace(graph, topo, dim_kinds=("batch",))


def _with_v2_fields(op: Op, cfg: OpConfig, rng: np.random.Generator, micro_batches: int = 1) -> OpConfig | None:
    """``cfg`` with, at random, recomputation, a ZeRO stage (where valid) and an uneven batch split (with a
    sample split, one task per device); None when ``micro_batches`` do not allow it."""
    changes: dict[str, object] = {}
    if rng.random() < 0.3:
        changes["recompute"] = True
    if zero_eligible(op, cfg) and rng.random() < 0.5:
        changes["zero"] = int(rng.integers(1, 4))
    dim = op.sample_dim
    if dim is not None and cfg.degree_map.get(dim.name, 1) > 1 and len(set(cfg.devices)) == len(cfg.devices):
        if rng.random() < 0.3:
            weights = rng.dirichlet(np.ones(len(cfg.devices))) + 0.5
            candidate = cfg.replace(weights=dict(zip(cfg.devices, (weights / weights.sum()).tolist(), strict=True)))
            shares = sample_shares(op, candidate)
            if shares and min(shares) * (dim.size // micro_batches) >= 1:  # every slice keeps a sample
                changes["weights"] = candidate.weights
    cfg = cfg.replace(**changes) if changes else cfg
    return cfg if fits_micro_batches(op, cfg, micro_batches) else None


@pytest.mark.parametrize(
    ("network", "mode"), [("flow", "eager"), ("circuit", "eager"), ("pairwise", "eager"), ("flow", "cuda_graphs")]
)
@pytest.mark.parametrize(
    ("model", "options", "preset", "groups", "proposals"),
    [
        ("inception_v3", {}, "tensoropt", 0, 250),
        ("rnnlm", {"steps": 6}, "tag-testbed", 0, 500),
        ("transformer", {}, "h100-2x8", 60, 400),
        ("lenet", {}, "trinity", 0, 600),
    ],
)
def test_delta_simulation_equals_full_simulation(
    model, options, preset, groups, proposals, network, mode, zoo_graph
) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph(model, **options)
    if groups:
        graph = coarsen(graph, groups)
    topo = load_preset(preset)
    # 4 MiB buckets: a change moves other ops' shards from bucket to bucket; eager: host lanes
    cost = CostModel(network=network, bucket_bytes=4 * 2**20, execution_mode=mode)
    space = SearchSpace(graph, topo)
    dp = data_parallel(graph, topo)
    delta = DeltaSimulator(SimContext(graph, topo, cost), [dp[op.name] for op in graph.ops])
    assert delta.cost == plan_cost(simulate(graph, topo, dp, cost), 10.0)
    rng = np.random.default_rng(7)
    # the coordinated moves (a parameter group, a layer range, a stage boundary, a device subset)
    coordinated = Proposer(graph, topo, space, dict.fromkeys(COORDINATED_KINDS, 1.0))
    cuts = 0
    for step in range(proposals if network == "flow" else proposals // 2):
        if step % 5 == 4:
            _, drawn = coordinated.draw(delta.configs, rng)
            changes = {i: c for i, c in drawn.items() if c != delta.configs[i]}  # type: ignore[union-attr]
            if not changes:
                continue
        elif step % 3 == 2:  # several ops at once: random ones, or a connected run of ops
            k = int(rng.integers(2, 6))
            start = int(rng.integers(graph.num_ops))
            indices = (
                rng.choice(graph.num_ops, size=min(k, graph.num_ops), replace=False).tolist()
                if step % 2
                else [(start + d) % graph.num_ops for d in range(k)]
            )
            changes = {int(i): space.random_config(int(i), rng) for i in indices}
        else:
            i = int(rng.integers(graph.num_ops))
            changes = {i: space.random_config(i, rng)}
        # plans v2: recomputation, ZeRO stages and uneven batch splits among the proposals
        changes = {i: _with_v2_fields(graph.ops[i], c, rng) or c for i, c in changes.items()}
        # With a limit near the cost: cut off only when the cost is above the limit, else exact.
        limit = delta.cost * (0.9 + 0.3 * rng.random())
        bounded = delta.propose_many(changes, limit)
        delta.reject()
        if len(changes) == 1:
            ((i, cfg),) = changes.items()
            proposed = delta.propose(i, cfg)
        else:
            proposed = delta.propose_many(changes)
        plan = Plan(graph.name, {**delta.plan().configs, **{graph.ops[i].name: c for i, c in changes.items()}})
        assert proposed == plan_cost(simulate(graph, topo, plan, cost, validate=False), 10.0)
        assert bounded == proposed or (bounded == np.inf and delta.proposed_makespan_s > limit)
        cuts += bounded == np.inf
        if rng.random() < 0.5:
            delta.accept()
        else:
            delta.reject()
    # The kept state is the accepted plan's: its full simulation matches too.
    assert delta.result().makespan_s == simulate(graph, topo, delta.plan(), cost).makespan_s
    assert cuts > 0  # the limits above did cut some proposals off


def test_reach_counts_what_a_proposal_leaves_alone(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    topo = load_preset("tensoropt")
    ctx = SimContext(graph, topo)
    dp = data_parallel(graph, topo)
    delta = DeltaSimulator(ctx, [dp[op.name] for op in graph.ops])
    before = delta.cost
    makespan = simulate(graph, topo, dp).makespan_s
    # the current configuration again: every task re-timed starts as it does now
    same = delta.reach({5: delta.configs[5]})
    assert same.kept + same.timed == same.tasks and same.makespan_change_s == 0.0
    assert 0 < same.new < same.timed and same.unchanged == same.timed - same.new == same.shifted_tail
    space = SearchSpace(graph, topo)
    rng = np.random.default_rng(3)
    kept = moved = 0
    for _ in range(6):
        i = int(rng.integers(graph.num_ops))
        cfg = space.random_config(i, rng)
        reach = delta.reach({i: cfg})
        plan = Plan(graph.name, {**delta.plan().configs, graph.ops[i].name: cfg})
        assert reach.makespan_s == simulate(graph, topo, plan, validate=False).makespan_s
        assert reach.makespan_change_s == reach.makespan_s - makespan
        assert reach.kept + reach.timed == reach.tasks and 0 <= reach.unchanged <= reach.timed - reach.new
        assert 0 <= reach.shifted_tail <= reach.timed - reach.new
        kept += reach.kept > 0
        moved += reach.unchanged < reach.timed
    assert kept > 0 and moved > 0
    with pytest.raises(RuntimeError, match="without a pending proposal"):  # nothing is left pending
        delta.accept()
    assert delta.cost == before
    with pytest.raises(ValueError, match="at least one changed op"):
        delta.reach({})


@pytest.mark.parametrize(
    ("model", "options", "preset", "micro_batches", "schedule", "network", "mode", "proposals"),
    [
        ("lenet", {}, "trinity", 4, "1f1b", "flow", "eager", 60),
        pytest.param("lenet", {}, "trinity", 2, "gpipe", "circuit", "cuda_graphs", 150, marks=pytest.mark.slow),
        pytest.param("rnnlm", {"steps": 3}, "tag-testbed", 2, "gpipe", "flow", "eager", 150, marks=pytest.mark.slow),
        pytest.param("rnnlm", {"steps": 3}, "tag-testbed", 4, "1f1b", "pairwise", "eager", 150, marks=pytest.mark.slow),
    ],
)
def test_delta_simulation_of_pipelined_plans_equals_full_simulation(
    model, options, preset, micro_batches, schedule, network, mode, proposals, zoo_graph
) -> None:  # type: ignore[no-untyped-def]
    """Micro-batches, schedules and the plans v2 fields: every proposal's cost (a one-op change is its
    copies' change, the schedule's order re-derived from the proposed stages) equals the full
    simulation's, a 1F1B order that waits for itself is refused by both, and a plan-level change
    (micro-batch count, schedule) rebuilds to the same cost."""
    graph = zoo_graph(model, **options)
    topo = load_preset(preset)
    cost = CostModel(network=network, bucket_bytes=4 * 2**20, execution_mode=mode)
    space = SearchSpace(graph, topo)
    start = pipeline(graph, topo, 4, micro_batches=micro_batches, schedule=schedule)
    delta = DeltaSimulator.for_plan(SimContext(graph, topo, cost), start)
    assert delta.cost == plan_cost(simulate(graph, topo, start, cost), 10.0)
    rng = np.random.default_rng(11)
    coordinated = Proposer(graph, topo, space, dict.fromkeys(COORDINATED_KINDS, 1.0))
    counts = [m for m in (1, 2, 4, 8) if graph.batch_size and graph.batch_size % m == 0]
    checked = deadlocks = rebuilt = cuts = coordinated_checked = 0
    for step in range(proposals):
        current = delta.plan()
        if step % 15 == 14:  # a plan-level change: another micro-batch count or schedule
            options_m = micro_batch_options(graph, delta.configs, counts)
            plan = current.with_schedule(
                options_m[int(rng.integers(len(options_m)))], ("gpipe", "1f1b")[int(rng.integers(2))]
            )
            try:
                expected = plan_cost(simulate(graph, topo, plan, cost), 10.0)
            except ScheduleDeadlock:
                with pytest.raises(ScheduleDeadlock):
                    delta.propose_plan(plan)
                continue
            assert delta.propose_plan(plan) == expected
            rebuilt += 1
        elif step % 5 == 3:  # a coordinated move (a stage boundary shifted, a layer range moved, ...), not kept
            fields = PipelineFields(delta.micro_batches, delta.schedule, delta.virtual_stages)
            _, moved = coordinated.draw(delta.configs, rng, fields)
            changes = {i: c for i, c in moved.items() if c != delta.configs[i]}  # type: ignore[union-attr]
            if changes:
                plan = current.with_configs({**current.configs, **{graph.ops[i].name: c for i, c in changes.items()}})
                plan.validate(graph, topo)
                try:
                    expected = plan_cost(simulate(graph, topo, plan, cost, validate=False), 10.0)
                except ScheduleDeadlock:
                    with pytest.raises(ScheduleDeadlock):
                        delta.propose_many(changes)
                    continue
                assert delta.propose_many(changes) == expected
                delta.reject()
                coordinated_checked += 1
            continue
        else:
            indices = rng.choice(graph.num_ops, size=int(rng.integers(1, 4)), replace=False).tolist()
            drawn = {int(i): _with_v2_fields(graph.ops[i], space.random_config(int(i), rng), rng, delta.micro_batches)
                     for i in indices}  # fmt: skip
            changes = {i: c for i, c in drawn.items() if c is not None}
            if not changes:
                continue
            plan = current.with_configs({**current.configs, **{graph.ops[i].name: c for i, c in changes.items()}})
            plan.validate(graph, topo)
            try:
                expected = plan_cost(simulate(graph, topo, plan, cost, validate=False), 10.0)
            except ScheduleDeadlock:
                with pytest.raises(ScheduleDeadlock):
                    delta.propose_many(changes)
                deadlocks += 1
                continue
            limit = delta.cost * (0.9 + 0.3 * rng.random())
            bounded = delta.propose_many(changes, limit)
            delta.reject()
            assert delta.propose_many(changes) == expected
            assert bounded == expected or (bounded == np.inf and delta.proposed_makespan_s > limit)
            cuts += bounded == np.inf
            checked += 1
        if rng.random() < 0.5:
            delta.accept()
            assert delta.cost == expected
        else:
            delta.reject()
    final = delta.plan()
    assert final.micro_batches == delta.micro_batches and final.schedule == delta.schedule
    assert delta.result().makespan_s == simulate(graph, topo, final, cost).makespan_s
    assert checked > proposals // 2 and rebuilt > 0 and cuts > 0 and coordinated_checked > 0
    assert deadlocks > 0 or schedule == "gpipe"


@pytest.mark.parametrize("network", ["flow", "circuit"])
def test_cutting_off_rejected_proposals_leaves_the_chain_unchanged(network: str, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    topo = load_preset("tag-testbed")
    cost = CostModel(network=network)
    runs = [mcmc(graph, topo, budget=150, seed=3, cost_model=cost, cutoff=cutoff) for cutoff in (False, True)]
    assert np.array_equal(runs[0].costs_s, runs[1].costs_s)
    assert runs[0].plan == runs[1].plan and runs[0].accepted == runs[1].accepted
    assert runs[1].stats["cut_off"] > 0 and "cut_off" not in runs[0].stats


@pytest.fixture(scope="module")
def four_gpus():  # type: ignore[no-untyped-def]
    topo = load_preset("flexflow-p100")
    return topo, [d.name for d in topo.devices[:4]]


@pytest.mark.parametrize(("model", "options"), [("lenet", {}), ("rnnlm", {"steps": 2})])
def test_mcmc_reaches_the_exhaustive_optimum(model, options, four_gpus, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    topo, devices = four_gpus
    graph = coarsen(zoo_graph(model, **options), 4)  # 4 op groups x 10 configurations on 4 GPUs: 10^4 plans
    space = SearchSpace(graph, topo, devices=devices)
    exact = exhaustive(graph, topo, space, cost_model=ROOFLINE)
    assert exact.complete and exact.leaves + exact.pruned >= 1
    # A chain may stop on FlexFlow's rule near the optimum (rnnlm: seeds 0 and 1 end 0.075% above it
    # under flows), so up to three seeds: one reaches the optimum, and none ends more than 0.1% above.
    for seed in range(3):
        found = mcmc(graph, topo, budget=6000, seed=seed, devices=devices, cost_model=ROOFLINE)
        assert found.plan.validate(graph, topo) is None
        assert found.cost_s <= exact.cost_s * 1.001
        if found.cost_s == pytest.approx(exact.cost_s, rel=1e-12):
            break
    else:
        pytest.fail(f"no seed reached the optimum {exact.cost_s}")
    # FlexFlow's proposals with neighbour and group moves (the "soap" mix stays in the same space):
    # the optimum with every seed 0-9 within 400 proposals (each seed finds it within its first 120;
    # benchmarks/search.py exact)
    for seed in range(10):
        found = mcmc(graph, topo, budget=400, seed=seed, devices=devices, proposals="soap", cost_model=ROOFLINE)
        assert found.cost_s == pytest.approx(exact.cost_s, rel=1e-12), f"seed {seed}: {found.cost_s}"


def test_branch_and_bound_agrees_with_plain_enumeration(four_gpus, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    topo, devices = four_gpus
    graph = coarsen(zoo_graph("lenet"), 3)
    space = SearchSpace(graph, topo, devices=devices[:2])
    ctx = SimContext(graph, topo)
    brute = min(
        plan_cost(
            ctx.simulate(
                Plan(graph.name, dict(zip([op.name for op in graph.ops], combo, strict=True))), validate=False
            ),
            10.0,
        )
        for combo in itertools.product(*(list(space.configs(i)) for i in range(graph.num_ops)))
    )
    assert exhaustive(graph, topo, space).cost_s == brute


def test_mcmc_improves_on_data_parallelism_and_reports_statistics(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("inception_v3")
    topo = load_preset("tag-testbed")
    result = mcmc(graph, topo, budget=300, seed=1)
    assert result.cost_s <= result.initial_costs_s["data_parallel"]
    assert result.proposals == result.costs_s.shape[0] == result.best_costs_s.shape[0] <= 300
    assert 0.0 < result.acceptance_rate < 1.0 and result.proposals_per_s > 0
    assert np.all(np.diff(result.best_costs_s[:100]) <= 0)  # best-so-far never rises within one candidate
    result.plan.validate(graph, topo)
    assert result.result.makespan_s == simulate(graph, topo, result.plan).makespan_s
    # Same seed and proposal budget: the same plan.
    assert mcmc(graph, topo, budget=300, seed=1).plan == result.plan


def test_a_seconds_budget_counts_only_search_time_and_the_bar_follows_it(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    topo = load_preset("trinity")
    reports: list[tuple[int, float, float]] = []
    out = run_chain(
        graph,
        topo,
        Budget.parse("0.3s"),
        seed=0,
        candidates=["data_parallel", "random"],
        beta=1.0,
        oom_penalty=10.0,
        space_options={},
        report=lambda *value: reports.append(value),
    )
    assert reports[0][0] == 0 and reports[0][2] == 0.0  # said when the first candidate's search begins
    assert reports[-1] == (out["proposals"], out["cost_s"], out["search_s"])
    assert all(a[2] <= b[2] for a, b in zip(reports, reports[1:], strict=False))
    assert out["search_s"] > 0
    found = mcmc(graph, topo, budget="0.2s", chains=2, seed=0)
    # chains one after another: their search time is inside the wall time, with the preparation
    assert 0 < found.search_s < found.elapsed_s and found.summary()["search_s"] == found.search_s
    assert found.proposals_per_s == pytest.approx(found.proposals / found.search_s)


def test_a_seconds_bar_moves_by_the_seconds_it_is_given() -> None:
    from placement_rl.progress import Progress

    with Progress(3.0, "search", enabled=True, seconds=True, leave=False) as bar:
        bar.update_to(1.5, proposals=10)
        assert bar._bar.n == 1.5
        bar.update_to(7.0)  # past the budget: the bar stops at its total
        assert bar._bar.n == 3.0


def test_bad_search_arguments(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    topo = load_preset("trinity")
    with pytest.raises(ValueError, match="chains = 0"):
        mcmc(graph, topo, budget=10, chains=0)
    with pytest.raises(ValueError, match="initial candidates"):
        mcmc(graph, topo, budget=10, initial=("greedy",))
    with pytest.raises(ValueError, match="budget 'soon'"):
        mcmc(graph, topo, budget="soon")
    for bad in (-1000.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"beta = .*; expected a finite number > 0"):
            mcmc(graph, topo, budget=10, beta=bad)


def test_parallel_chains_as_ray_tasks(ray_local, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    from placement_rl.rl.parallel import RayMap

    graph = coarsen(zoo_graph("inception_v3"), 20)
    topo = load_preset("tag-testbed")
    ray_map = RayMap()
    reports: list[tuple[int, object]] = []
    result = mcmc(graph, topo, budget=150, chains=2, seed=3, task_map=ray_map, progress=True)
    assert result.chains == 2 and ray_map.tasks == 2
    # The chains as Ray tasks give what the default in-process map gives.
    serial = mcmc(graph, topo, budget=150, chains=2, seed=3)
    assert serial.plan == result.plan and serial.proposals == result.proposals

    # Progress reported by remote tasks reaches the caller, tagged by task; the latest value wins.
    def _report_twice(x: int, report) -> int:  # type: ignore[no-untyped-def]  # local: shipped by value
        report(x)
        report(2 * x)
        return x

    assert ray_map(_report_twice, [(1,), (2,)], lambda k, value: reports.append((k, value))) == [1, 2]
    assert dict(reports) == {0: 2, 1: 4}
    # Each chain is deterministic: rerun them in-process and compare.
    options = {"beta": 50.0, "oom_penalty": 10.0, "space_options": {}, "cost_model": None, "delta": True}
    local = [
        run_chain(graph, topo, Budget(proposals=150), seed=3, candidates=["data_parallel", "random"], **options),
        run_chain(graph, topo, Budget(proposals=150), seed=4, candidates=["expert"], **options),
    ]
    assert result.cost_s == pytest.approx(min(o["cost_s"] for o in local), rel=1e-12)
    assert result.proposals == sum(o["proposals"] for o in local)


def test_subset_data_parallel_keeps_the_fast_device_group(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    from placement_rl.plan import subset_data_parallel

    graph = zoo_graph("inception_v3")  # batch 96 on tag-testbed's 100 Gb/s network
    topo = load_preset("tag-testbed")
    # 95 per-tensor all-reduces, each holding its ring: communication-bound beyond one machine
    per_tensor = CostModel(network="circuit", bucket_bytes=0)
    plan = subset_data_parallel(graph, topo, [d.name for d in topo.devices], per_tensor)
    assert sorted(plan.devices_used()) == [f"m0/gpu{k}" for k in range(4)]  # the NVLink V100 machine
    dp = data_parallel(graph, topo)
    assert simulate(graph, topo, plan, per_tensor).makespan_s < simulate(graph, topo, dp, per_tensor).makespan_s / 2
    # DDP's buckets as flows: a few large all-reduces, and all 16 GPUs are the fastest group
    plan = subset_data_parallel(graph, topo, [d.name for d in topo.devices], CostModel())
    assert len(plan.devices_used()) == 16

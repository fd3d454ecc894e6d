"""MCMC proposal kinds, acceptance (adaptive temperature, parallel tempering) and recorded times."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from placement_rl.graph.coarsen import coarsen
from placement_rl.methods import anytime_trace, get_method
from placement_rl.plan import Plan, data_parallel
from placement_rl.search import SearchSpace, mcmc
from placement_rl.search.mcmc import swap_probability
from placement_rl.search.proposals import (
    ADAPT_FLOOR,
    COORDINATED_KINDS,
    MIXES,
    PROPOSAL_KINDS,
    Proposer,
    connected_group,
    parse_proposals,
    transfer_config,
    with_replicas,
)
from placement_rl.sim import DeltaSimulator
from placement_rl.sim.simulator import SimContext, simulate
from placement_rl.topology import DeviceTopology, load_preset
from placement_rl.topology.builder import TopologyBuilder, Uplink, switched_machine
from placement_rl.topology.devices import gbit_to_bytes_per_s


@pytest.fixture(scope="module")
def instance(zoo_graph):  # type: ignore[no-untyped-def]
    graph = zoo_graph("rnnlm", steps=3)  # shared parameters (the unrolled cells), ops without a sample split
    topo = load_preset("tag-testbed")  # mixed machines and device types
    return graph, topo, SearchSpace(graph, topo)


def _drawn(instance, kind: str, draws: int = 60):  # type: ignore[no-untyped-def]
    """``(configs before, changes)`` of ``draws`` proposals of one kind from data parallel and random plans."""
    graph, topo, space = instance
    proposer = Proposer(graph, topo, space, kind)
    rng = np.random.default_rng(0)
    out = []
    for k in range(draws):
        plan = data_parallel(graph, topo) if k % 2 else space.random_plan(rng)
        configs = [plan[op.name] for op in graph.ops]
        if kind == "group":  # unfiltered (draw() leaves out configurations outside the search space)
            changes = proposer.group(rng)
        else:
            drawn_kind, changes = proposer.draw(configs, rng)
            assert drawn_kind == kind
        # every proposal is a valid plan
        Plan(graph.name, {**plan.configs, **{graph.ops[i].name: c for i, c in changes.items()}}).validate(graph, topo)
        out.append((configs, changes))
    assert sum(bool(c) for _, c in out) >= draws // 4
    return [(configs, changes) for configs, changes in out if changes]


def test_neighbour_takes_a_neighbours_devices(instance) -> None:  # type: ignore[no-untyped-def]
    near = Proposer(*instance).neighbours
    for configs, changes in _drawn(instance, "neighbour"):
        ((i, cfg),) = changes.items()
        assert any(set(cfg.devices) <= set(configs[j].devices) for j in near[i])


def test_group_moves_a_connected_group_to_one_device_group(instance) -> None:  # type: ignore[no-untyped-def]
    graph, topo, space = instance
    near = Proposer(*instance).neighbours
    for _, changes in _drawn(instance, "group"):
        members = list(changes)
        union = set().union(*(c.devices for c in changes.values()))
        # one device group: every op on a subset of the group's devices, the largest config spans it
        assert max(len(set(c.devices)) for c in changes.values()) == len(union) or len(union) == 1
        shared = {graph.ops[i].param_key for i in members}
        if len(members) > 1 and not (len(shared) == 1 and None not in shared):  # else an unrolled layer
            reached = {members[0]}
            frontier = [members[0]]
            while frontier:
                frontier = [j for i in frontier for j in near[i] if j in changes and j not in reached]
                reached.update(frontier)
            assert reached == set(members)


def test_sync_changes_only_the_sync_mode(instance) -> None:  # type: ignore[no-untyped-def]
    graph = instance[0]
    for configs, changes in _drawn(instance, "sync"):
        for i, cfg in changes.items():
            assert graph.ops[i].param_bytes > 0
            assert (cfg.devices, cfg.degrees) == (configs[i].devices, configs[i].degrees)
        assert len({c.sync for c in changes.values()}) == 1  # shared parameters change together
        i = next(iter(changes))
        assert (changes[i].sync, changes[i].ps_device) != (configs[i].sync, configs[i].ps_device) or changes[
            i
        ].sync == "parameter_server"


def test_replicas_changes_only_the_replica_count(instance) -> None:  # type: ignore[no-untyped-def]
    for configs, changes in _drawn(instance, "replicas"):
        ((i, cfg),) = changes.items()
        assert cfg.degrees == configs[i].degrees and cfg.replicas != configs[i].replicas
        R = min(cfg.replicas, configs[i].replicas)
        for p in range(cfg.num_partitions):  # existing replicas kept in order
            old = configs[i].devices[p * configs[i].replicas : p * configs[i].replicas + R]
            assert cfg.devices[p * cfg.replicas : p * cfg.replicas + R] == old
    cfg = with_replicas(data_parallel(instance[0], instance[1])[instance[0].ops[5].name], 1, instance[2].devices)
    assert cfg.replicas == 1


def test_soap_mix_stays_in_the_search_space(instance) -> None:  # type: ignore[no-untyped-def]
    graph, topo, space = instance
    proposer = Proposer(graph, topo, space, "soap")
    assert proposer.in_space and not Proposer(graph, topo, space, "mixed").in_space
    rng = np.random.default_rng(1)
    configs = [space.random_plan(rng)[op.name] for op in graph.ops]
    for _ in range(100):
        _, changes = proposer.draw(configs, rng)
        assert all(space.contains(i, c) for i, c in changes.items())
        configs = [changes.get(i, c) for i, c in enumerate(configs)]


def test_transfer_config_and_connected_group(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    topo = load_preset("trinity")
    space = SearchSpace(graph, topo)
    conv = next(i for i, op in enumerate(graph.ops) if op.op_type == "conv2d")
    dense = next(i for i, op in enumerate(graph.ops) if op.op_type == "linear")
    dp = data_parallel(graph, topo)
    # a config valid for the op is kept as it is
    assert (
        transfer_config(graph.ops[conv], dp[graph.ops[dense].name], space.degree_options(conv))
        == dp[graph.ops[dense].name]
    )
    # a channel split the op cannot take becomes its own split over the same devices
    cfg = next(c for c in space.configs(conv) if "channel" in c.degree_map and c.num_partitions == 2)
    moved = transfer_config(graph.ops[dense], cfg, space.degree_options(dense))
    assert set(moved.devices) <= set(cfg.devices) and moved.num_partitions <= 2
    Plan(graph.name, {**dp.configs, graph.ops[dense].name: moved}).validate(graph, topo)
    chain = [(1,), (0, 2), (1, 3), (2,)]
    assert sorted(connected_group(chain, 0, 3, np.random.default_rng(0))) == [0, 1, 2]
    assert sorted(connected_group(chain, 3, 10, np.random.default_rng(0))) == [0, 1, 2, 3]


def test_proposal_names_are_checked(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    assert parse_proposals("mixed") == pytest.approx(MIXES["mixed"])
    assert parse_proposals({"flexflow": 3, "group": 1}) == {"flexflow": 0.75, "group": 0.25}
    for bad in ("random", {"teleport": 1.0}, {"group": -1.0}, {"group": 0}):
        with pytest.raises(ValueError, match="propos"):
            parse_proposals(bad)  # type: ignore[arg-type]
    # the new kinds and mixes are among the names an unknown one is told about
    for bad in ("adaptve", {"stage": 1.0}):
        with pytest.raises(ValueError) as error:
            parse_proposals(bad)  # type: ignore[arg-type]
        assert all(name in str(error.value) for name in COORDINATED_KINDS)
        if isinstance(bad, str):
            assert "'coordinated'" in str(error.value) and "'adaptive'" in str(error.value)
    assert set(parse_proposals("adaptive")) == set(PROPOSAL_KINDS) == set(parse_proposals("coordinated"))
    graph, topo = zoo_graph("lenet"), load_preset("trinity")
    with pytest.raises(ValueError, match="proposals = 'random'; expected one of"):
        mcmc(graph, topo, budget=10, proposals="random")
    with pytest.raises(ValueError, match="adaptive = 2"):
        mcmc(graph, topo, budget=10, adaptive=2)
    with pytest.raises(ValueError, match="tempering = 0"):
        mcmc(graph, topo, budget=10, tempering=0)
    with pytest.raises(ValueError, match="restart = 0; expected a number of proposals"):
        mcmc(graph, topo, budget=10, restart=0)
    method = get_method("mcmc")
    assert method.check is not None
    with pytest.raises(ValueError, match="proposals = 'random'"):
        method.check({"proposals": "random"}, graph, topo)
    with pytest.raises(ValueError, match="restart = -5"):
        method.check({"restart": -5}, graph, topo)
    method.check({"proposals": "adaptive", "restart": 100}, graph, topo)


def test_propose_many_matches_one_op_proposals_in_turn(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = coarsen(zoo_graph("inception_v3"), 12)
    topo = load_preset("tag-testbed")
    space = SearchSpace(graph, topo)
    dp = data_parallel(graph, topo)
    ctx = SimContext(graph, topo)
    together = DeltaSimulator(ctx, [dp[op.name] for op in graph.ops])
    one_by_one = DeltaSimulator(ctx, [dp[op.name] for op in graph.ops])
    rng = np.random.default_rng(3)
    changes = {i: space.random_config(i, rng) for i in (2, 3, 7)}
    cost = together.propose_many(changes)
    together.accept()
    for i, cfg in changes.items():
        last = one_by_one.set(i, cfg)
    assert cost == last and together.configs == one_by_one.configs
    with pytest.raises(ValueError, match="at least one changed op"):
        together.propose_many({})
    with pytest.raises(ValueError, match=r"op indices \[99\]"):
        together.propose_many({99: changes[2]})


def test_default_proposals_are_flexflows_and_reproducible(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = coarsen(zoo_graph("inception_v3"), 12)
    topo = load_preset("tag-testbed")
    default = mcmc(graph, topo, budget=200, seed=4)
    named = mcmc(graph, topo, budget=200, seed=4, proposals="flexflow")
    assert named.plan == default.plan and np.array_equal(named.costs_s, default.costs_s)
    assert "proposals_by_kind" not in default.stats
    mixed = mcmc(graph, topo, budget=200, seed=4, proposals="mixed")
    assert mixed.plan == mcmc(graph, topo, budget=200, seed=4, proposals="mixed").plan
    assert sum(mixed.stats["proposals_by_kind"].values()) == mixed.proposals
    assert mixed.cost_s <= mixed.initial_costs_s["data_parallel"]
    # recorded times: one per proposal, never decreasing, within the search
    default = mcmc(graph, topo, budget=200, seed=4, initial=("random",))
    times = default.times_s
    assert times.shape == default.best_costs_s.shape and np.all(np.diff(times) >= 0)
    assert 0 <= times[0] and times[-1] <= default.elapsed_s
    trace = anytime_trace(default.best_costs_s, default.elapsed_s, times)
    assert trace[-1] == (default.elapsed_s, float(default.best_costs_s[-1]))
    improved = np.flatnonzero(default.best_costs_s < default.best_costs_s[0])
    assert improved.size and trace[1][0] == pytest.approx(times[improved[0]])


def test_anytime_trace_uses_recorded_times() -> None:
    best = np.array([5.0, 4.0, 4.0, 3.0])
    assert anytime_trace(best, 8.0) == ((2.0, 5.0), (4.0, 4.0), (8.0, 3.0))  # a steady rate without times
    assert anytime_trace(best, 8.0, np.array([0.5, 1.0, 6.0, 7.0])) == ((0.5, 5.0), (1.0, 4.0), (7.0, 3.0), (8.0, 3.0))


def test_tempering_swaps_follow_the_metropolis_rule(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    # a colder replica (larger beta) holding the worse state always hands it to the hotter one
    assert swap_probability(2.0, 1.0, 5.0, 3.0) == 1.0
    # otherwise exp((beta_i - beta_j) (cost_i - cost_j))
    assert swap_probability(2.0, 1.0, 3.0, 5.0) == pytest.approx(math.exp(-2.0))
    assert swap_probability(1.0, 2.0, 5.0, 3.0) == pytest.approx(math.exp(-2.0))
    assert swap_probability(2.0, 2.0, 3.0, 5.0) == 1.0  # equal temperatures: always
    graph = coarsen(zoo_graph("lenet"), 4)
    topo = load_preset("trinity")
    found = mcmc(graph, topo, budget=300, seed=0, tempering=3, initial=("data_parallel",))
    # one swap attempt per sweep of the three replicas; a proposal budget counts every replica
    assert found.stats["swaps_tried"] == found.proposals // 3
    assert 0 < found.stats["swaps_accepted"] <= found.stats["swaps_tried"]
    assert found.plan == mcmc(graph, topo, budget=300, seed=0, tempering=3, initial=("data_parallel",)).plan


def test_adaptive_temperature_moves_toward_the_target(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = coarsen(zoo_graph("lenet"), 4)
    topo = load_preset("trinity")
    options = {"budget": 600, "seed": 0, "initial": ("random",), "proposals": "soap"}
    # very hot (nearly every worse plan taken) but hardly any should be: the temperature falls
    cooler = mcmc(graph, topo, adaptive=0.001, beta=0.01, **options)
    # FlexFlow's beta (few worse plans taken) but nearly all should be: the temperature rises
    hotter = mcmc(graph, topo, adaptive=0.99, **options)
    assert cooler.stats["final_heat"] > 1.0 > hotter.stats["final_heat"]


# ------------------------------------------------------------------------------ coordinated moves
def _mixed_cluster(fast: int = 2, slow: int = 2) -> DeviceTopology:
    """Issue 29's (b) in small: one machine of NVLink V100s and single-K80 machines over 10 Gb/s."""
    b = TopologyBuilder()
    eth: Uplink = (b.switch("eth-switch"), gbit_to_bytes_per_s(10), "ethernet")
    switched_machine(b, "V100-SXM2-16GB", fast, eth, nvlink_bytes_per_s=25e9)
    for _ in range(slow):
        switched_machine(b, "K80", 1, eth)
    return b.build(f"{fast}xV100+{slow}xK80")


def _draws(graph, topo, kind: str, plans, draws: int = 60):  # type: ignore[no-untyped-def]
    """``(configs before, changes without no-ops)`` of ``draws`` proposals of ``kind`` from ``plans`` in turn,
    each a valid plan."""
    proposer = Proposer(graph, topo, SearchSpace(graph, topo), kind)
    rng = np.random.default_rng(0)
    out = []
    for k in range(draws):
        plan = plans[k % len(plans)]
        configs = [plan[op.name] for op in graph.ops]
        drawn, changes = proposer.draw(configs, rng)
        assert drawn == kind
        changes = {i: c for i, c in changes.items() if c != configs[i]}
        Plan(graph.name, {**plan.configs, **{graph.ops[i].name: c for i, c in changes.items()}}).validate(graph, topo)
        out.append((configs, changes))
    return out


def test_param_group_moves_every_op_sharing_the_parameters_together(instance) -> None:  # type: ignore[no-untyped-def]
    graph, topo, space = instance  # rnnlm: each LSTM layer's 3 steps share one param_key
    proposer = Proposer(graph, topo, space, "param_group")
    shared = [g for g in proposer.param_groups if len(g) > 1]
    assert shared and all(len({graph.ops[i].param_key for i in g}) == 1 for g in shared)
    moved_shared = 0
    for _, changes in _draws(graph, topo, "param_group", [data_parallel(graph, topo)], 80):
        if not changes:
            continue
        group = proposer.shared[next(iter(changes))]
        assert set(changes) <= set(group)  # one parameter group, and (below) all of it
        if len(group) > 1:
            moved_shared += 1
            assert set(changes) == set(group)
            assert len(set(changes.values())) == 1  # the steps are alike: one configuration for all
    assert moved_shared >= 10


def test_block_moves_a_layer_range_to_one_device_set(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("alexnet")  # no shared parameters: a block is exactly a range of ops
    topo = _mixed_cluster()
    ranges = 0
    for _, changes in _draws(graph, topo, "block", [data_parallel(graph, topo)], 60):
        if len(changes) < 2:
            continue
        # changes leave out the ops whose configuration stays: a sub-range's ops all lie in one range,
        # and every moved op is on one device set (a prefix of the widest) with one strategy
        widest = max((c.devices for c in changes.values()), key=len)
        assert all(c.devices == widest[: len(c.devices)] for c in changes.values())
        ranges += 1
    assert ranges >= 20


def test_stage_shift_moves_boundary_ops_to_the_neighbouring_stage(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    from placement_rl.plan import pipeline
    from placement_rl.plan.core import pipeline_stages

    graph = zoo_graph("alexnet")
    topo = _mixed_cluster()
    start = pipeline(graph, topo, 2)
    stages = pipeline_stages(graph, start)
    assert len(stages) == 2
    (left_devices, left), (right_devices, right) = ((s.devices, s.ops) for s in stages)
    shifted = 0
    for _, changes in _draws(graph, topo, "stage_shift", [start], 30):
        assert changes
        moved = sorted(changes)
        if set(moved) <= set(left):  # the left stage's last ops join the right stage
            assert moved == list(left[-len(moved) :])
            assert all(set(c.devices) <= set(right_devices) for c in changes.values())
        else:  # the right stage's first ops join the left one
            assert moved == list(right[: len(moved)])
            assert all(set(c.devices) <= set(left_devices) for c in changes.values())
        shifted += 1
    assert shifted == 30
    # one stage (data parallelism): nothing to shift
    assert not any(changes for _, changes in _draws(graph, topo, "stage_shift", [data_parallel(graph, topo)], 10))


def test_device_subset_drops_or_adds_a_machine_or_a_device_type(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    topo = _mixed_cluster()
    machines = {d.machine for d in topo.devices}
    groups = [{d.name for d in topo.devices if d.machine == m} for m in machines] + [
        {d.name for d in topo.devices if d.device_type == t} for t in ("V100-SXM2-16GB", "K80")
    ]
    dp = data_parallel(graph, topo)
    fast = data_parallel(graph, topo, [d.name for d in topo.devices if d.device_type != "K80"])
    dropped_k80 = 0
    for configs, changes in _draws(graph, topo, "device_subset", [dp, fast], 80):
        if not changes:
            continue
        # one group dropped from (or added to) every changed op's devices
        differences = {frozenset(set(configs[i].devices) ^ set(c.devices)) for i, c in changes.items()}
        assert any(all(d <= g for d in differences) for g in groups)
        after = {op.name: c for op, c in zip(graph.ops, configs, strict=True)}
        after.update({graph.ops[i].name: c for i, c in changes.items()})
        dropped_k80 += configs[0] == dp[graph.ops[0].name] and after == dict(fast.configs)
    assert dropped_k80 >= 1  # data parallelism without the slow GPUs is one move away


def test_restage_proposes_a_pipeline_over_machines(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    from placement_rl.plan.core import pipeline_stages

    graph = zoo_graph("alexnet")
    topo = _mixed_cluster(fast=2, slow=3)  # 4 machines
    machines = {d.name: d.machine for d in topo.devices}
    proposer = Proposer(graph, topo, SearchSpace(graph, topo), "restage")
    rng = np.random.default_rng(0)
    dp = data_parallel(graph, topo)
    configs = [dp[op.name] for op in graph.ops]
    seen_stages, with_zero = set(), 0
    for _ in range(40):
        kind, plan = proposer.draw(configs, rng)
        assert kind == "restage" and isinstance(plan, Plan)
        plan.validate(graph, topo)
        stages = pipeline_stages(graph, plan)
        # one stage per chosen machine, each on all of that machine's devices, in listing order
        assert len(stages) >= 2 and all(len({machines[d] for d in s.devices}) == 1 for s in stages)
        owners = [machines[s.devices[0]] for s in stages]
        assert owners == sorted(owners, key=[d.machine for d in topo.devices].index)
        assert len(stages) <= plan.micro_batches <= 4 * len(stages) and plan.schedule == "1f1b"
        seen_stages.add(len(stages))
        with_zero += any(c.zero for c in plan.configs.values())
    assert seen_stages == {2, 3, 4} and 5 <= with_zero <= 35
    # one machine: nothing to restage
    one = _mixed_cluster(fast=2, slow=0)
    assert Proposer(graph, one, SearchSpace(graph, one), "restage").draw(configs[:], rng)[1] == {}


def test_adaptive_mix_follows_improvements_with_a_floor(instance) -> None:  # type: ignore[no-untyped-def]
    graph, topo, space = instance
    fixed = Proposer(graph, topo, space, "coordinated")
    fixed.feedback("block", 0.05)
    assert fixed.mix == pytest.approx(parse_proposals("coordinated"))  # a fixed mix does not adapt
    proposer = Proposer(graph, topo, space, "adaptive")
    assert proposer.mix == pytest.approx(parse_proposals("adaptive"))
    for _ in range(200):
        proposer.feedback("block", 0.02)  # 2% better each time
        proposer.feedback("sync", 0.001)  # 0.1% better each time: a tenth of the credit
        for kind in proposer.kinds:
            if kind not in ("block", "sync"):
                proposer.feedback(kind, 0.0)
    mix = proposer.mix
    assert sum(mix.values()) == pytest.approx(1.0)
    assert max(mix, key=mix.__getitem__) == "block" and mix["block"] > 0.5
    gained = {k: mix[k] / parse_proposals("adaptive")[k] for k in mix}  # weight over start weight
    assert gained["block"] > gained["sync"] > gained["flexflow"]
    start = parse_proposals("adaptive")
    assert all(mix[k] >= ADAPT_FLOOR * start[k] * (1 - 1e-9) for k in mix)  # no kind starves
    # the chain draws from the adapted weights and reports them
    found = mcmc(coarsen(graph, 6), topo, budget=150, seed=0, proposals="adaptive", initial=("data_parallel",))
    final = dict(found.stats["final_mix"])
    assert set(final) == set(start) and final != pytest.approx(start, abs=1e-4)


def test_mcmc_from_data_parallelism_drops_the_slow_gpus(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    """Issue 29's (b) in small: LeNet on 2 NVLink V100s and 2 single-K80 machines over 10 Gb/s, where data
    parallelism on the V100s is 1.37x faster than on all four. From data parallelism alone, 200 proposals
    (seeded) of the coordinated mixes reach it; FlexFlow's one-op moves do not move at all."""
    from placement_rl.plan import subset_data_parallel

    graph = zoo_graph("lenet", batch_size=256)
    topo = _mixed_cluster()
    hand = simulate(graph, topo, subset_data_parallel(graph, topo)).makespan_s
    assert sorted(subset_data_parallel(graph, topo).devices_used()) == ["m0/gpu0", "m0/gpu1"]
    options = {"budget": 200, "seed": 0, "initial": ("data_parallel",)}
    flexflow = mcmc(graph, topo, **options)
    assert flexflow.result.makespan_s > 1.3 * hand
    for proposals in ("coordinated", "adaptive"):
        found = mcmc(graph, topo, proposals=proposals, **options)  # type: ignore[arg-type]
        assert found.result.makespan_s <= hand * 1.001, proposals


def test_restarts_return_to_the_best_plan(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = coarsen(zoo_graph("lenet"), 4)
    topo = load_preset("trinity")
    # hot (beta 0.5: most worse plans taken), so the chain wanders off the best plan and is called back
    options = {"budget": 400, "seed": 0, "beta": 0.5, "initial": ("data_parallel",), "proposals": "soap"}
    found = mcmc(graph, topo, restart=20, **options)  # type: ignore[arg-type]
    assert found.stats["restarts"] > 0
    assert found.cost_s <= found.initial_costs_s["data_parallel"]
    assert found.plan == mcmc(graph, topo, restart=20, **options).plan  # type: ignore[arg-type]
    assert "restarts" not in mcmc(graph, topo, **options).stats  # type: ignore[arg-type]


def test_the_command_lines_help_names_every_proposal_kind_and_mix() -> None:
    from placement_rl.cli.common import PROPOSALS_HELP
    from placement_rl.search.proposals import MIXES, PROPOSAL_KINDS

    named = set(re.findall(r"[a-z_]+", PROPOSALS_HELP))
    assert set(PROPOSAL_KINDS) | set(MIXES) <= named

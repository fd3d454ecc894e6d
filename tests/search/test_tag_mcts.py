"""TAG's search space (TagProblem) and its Monte-Carlo tree search (MCTS)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest

import placement_rl.envs  # noqa: F401  (registers the env ids)
from placement_rl.graph import OpGraph
from placement_rl.graph.coarsen import coarsen
from placement_rl.plan import TAG_OPTIONS, data_parallel, data_parallel_per_tensor
from placement_rl.search.mcts import MCTS, MCTSConfig, mcts_search, self_play
from placement_rl.search.tag import TagProblem, device_groups, device_subsets, leaf_value
from placement_rl.sim import simulate
from placement_rl.sim.cost import CostModel
from placement_rl.topology import random_topology, resolve_topology


@pytest.fixture(scope="module")
def lenet_testbed(zoo_graph: Callable[..., OpGraph]) -> TagProblem:
    graph = zoo_graph("lenet")
    return TagProblem(graph, coarsen(graph, 6), resolve_topology("tag-testbed"))


def random_decisions(problem: TagProblem, rng: np.random.Generator, k: int) -> list[int]:
    decisions: list[int] = []
    for _ in range(k):
        decisions.append(int(rng.choice(np.flatnonzero(problem.action_mask(decisions)))))
    return decisions


def test_subsets_rule_singletons_then_fastest_prefixes_then_by_size() -> None:
    topo = resolve_topology("tag-testbed")  # 7 machines: m0 has 4 V100s, the others 2 GPUs each
    groups = device_groups(topo)
    assert [g.name for g in groups] == [f"m{i}" for i in range(7)]
    subsets = device_subsets(groups, topo, 64)
    assert len(subsets) == 64 and len(set(subsets)) == 64
    assert subsets[:7] == tuple((k,) for k in range(7))
    assert subsets[7] == tuple(range(7))  # every GPU: data parallelism
    flops = [sum(topo.device(n).peak_flops for n in g.devices) for g in groups]
    ranked = sorted(range(7), key=lambda k: (-flops[k], k))
    assert subsets[8] == tuple(sorted(ranked[:2]))  # the two fastest groups
    assert len(device_subsets(groups, topo, 200)) == 2**7 - 1
    with pytest.raises(ValueError, match="max_subsets = 7, but 'tag-testbed' has 7 device groups"):
        device_subsets(groups, topo, 7)
    by_type = device_groups(topo, "gpu_type")
    assert sorted(g.name for g in by_type) == sorted({d.device_type for d in topo.devices})
    with pytest.raises(ValueError, match="device grouping 'rack'"):
        device_groups(topo, "rack")


def test_no_decision_is_data_parallelism(lenet_testbed: TagProblem) -> None:
    p = lenet_testbed
    dp = simulate(p.graph, p.topology, data_parallel(p.graph, p.topology))
    e = p.evaluate(())
    assert e.makespan_s == dp.makespan_s and e.speedup == 1.0 and e.value == 0.0
    per_tensor = TagProblem(p.graph, p.groups, p.topology, reference="data_parallel_per_tensor")
    reference = simulate(p.graph, p.topology, data_parallel_per_tensor(p.graph, p.topology))
    assert per_tensor.evaluate(()).speedup == pytest.approx(reference.makespan_s / dp.makespan_s, rel=1e-12)
    with pytest.raises(ValueError, match="reference 'dp'"):
        TagProblem(p.graph, p.groups, p.topology, reference="dp")


def test_evaluate_equals_a_fresh_simulation_of_the_plan(lenet_testbed: TagProblem) -> None:
    p = lenet_testbed
    rng = np.random.default_rng(0)
    options_seen: set[str] = set()
    for k in [1, 2, 3, p.num_groups, p.num_groups]:
        decisions = random_decisions(p, rng, k)
        options_seen |= {TAG_OPTIONS[a % 4] for a in decisions}
        plan = p.plan(decisions)
        plan.validate(p.graph, p.topology)
        full = simulate(p.graph, p.topology, plan)
        e = p.evaluate(decisions)
        assert e.makespan_s == full.makespan_s  # bit for bit: the same compiled ops and schedule
        assert e.oom == full.oom
        assert np.array_equal(e.peak_memory_bytes, full.peak_memory_bytes.astype(np.float64))
        assert e.speedup == pytest.approx(p.baseline.makespan_s / full.makespan_s, rel=1e-12)
        assert p.evaluate(decisions) is e  # cached
    assert len(options_seen) >= 3


def test_completion_rule_follows_the_first_decision(lenet_testbed: TagProblem) -> None:
    p = lenet_testbed
    first = p.action(2, "duplicate")
    choices = p.complete([first])
    assert all(c == (2, TAG_OPTIONS.index("duplicate"), 0) for c in choices)
    ps = p.action(7, "parameter_server")
    choices = p.complete([ps, ps, ps])
    turns = [choices[int(p.order[k])][2] for k in range(3)]
    assert turns == [0, 1, 2]  # servers round-robin over the subset's GPUs, in decision order
    devs = p.subset_devices(7)
    servers = [p.group_config(int(p.order[k]), choices[int(p.order[k])]).ps_device for k in range(3)]
    assert servers == [devs[t % len(devs)] for t in range(3)]
    assert "parameter_server" in p.describe(ps) and "GPUs" in p.describe(ps)
    with pytest.raises(ValueError, match="decision 0 = 9999"):
        p.evaluate([9999])


def test_model_parallel_splits_the_group_in_partial_plans(zoo_graph: Callable[..., OpGraph]) -> None:
    graph = zoo_graph("lenet")
    topo = resolve_topology("tag-testbed")
    p = TagProblem(graph, coarsen(graph, 2), topo)  # big groups, so METIS has ops to split
    mp = p.action(0, "model_parallel")  # machine m0: 4 GPUs
    plan = p.plan([mp])  # one decision; the other group follows the rule
    used = {d for cfg in plan.configs.values() for d in cfg.devices}
    assert len(used) > 1 and used <= set(p.subset_devices(0))
    assert all(len(cfg.devices) == 1 for cfg in plan.configs.values())


def test_memory_mask_refuses_what_does_not_fit(zoo_graph: Callable[..., OpGraph]) -> None:
    graph = zoo_graph("vgg19")
    topo = random_topology(126)  # two machines of one GPU each
    p = TagProblem.for_graph(graph, topo, max_groups=8)
    mask = p.action_mask([])
    g = int(p.order[0])
    fits = [bool((p.need(g, a) <= p.capacity_bytes).all()) for a in range(p.num_actions)]
    assert mask.tolist() == [int(f) for f in fits] or (not any(fits) and mask.all())


def test_mcts_with_a_uniform_prior_reaches_the_exhaustive_optimum(zoo_graph: Callable[..., OpGraph]) -> None:
    graph = zoo_graph("lenet")
    topo = resolve_topology("trinity")  # one machine: one device group of 4 GPUs
    # The flat roofline (calibration=None): the instance's mixed optimum (1.7x over data parallelism) was
    # built for it; under the calibrated eager model lenet is host-bound and the best plan gains only 1.09x.
    cost = CostModel(calibration=None)
    p = TagProblem(graph, coarsen(graph, 4), topo, cost=cost)  # 4 groups x 4 options: 256 plans
    assert p.num_groups == 4 and p.num_actions == 4
    best = min(
        (p.evaluate(d) for d in itertools.product(range(p.num_actions), repeat=4)),
        key=lambda e: (e.oom, e.makespan_s),
    )
    assert best.speedup > 1.5  # the optimum mixes options: not the data-parallel root
    found = mcts_search(p, iterations=400)
    assert found.evaluation.makespan_s == best.makespan_s and not found.evaluation.oom
    assert len(found.decisions) == 4
    assert simulate(graph, topo, p.plan(found.decisions), cost).makespan_s == best.makespan_s
    assert found.anytime[-1][2] == pytest.approx(best.speedup)


def test_mcts_tree_reuse_and_targets(lenet_testbed: TagProblem) -> None:
    p = lenet_testbed
    tree = MCTS(p, None, MCTSConfig(leaf_batch=4))
    tree.run(iterations=60)
    assert tree.iterations == 60
    pi = tree.policy()
    assert pi.shape == (p.num_actions,) and pi.sum() == pytest.approx(1.0)
    assert not pi[~tree.root.valid].any()
    a = int(np.argmax(pi))
    visits_below = tree.root.n[a]
    tree.commit(a)
    assert tree.root.decisions == (a,)
    assert tree.root.n.sum() == visits_below - 1  # the subtree's statistics survive (the first visit was the leaf)
    with pytest.raises(ValueError, match="not valid at the root"):
        tree.commit(p.num_actions)


def test_prior_steers_the_search_and_bad_priors_are_refused(lenet_testbed: TagProblem) -> None:
    p = lenet_testbed
    target = p.action(0, "duplicate")
    calls: list[int] = []

    def peaked(prefixes: object) -> np.ndarray:
        batch = list(prefixes)  # type: ignore[call-overload]
        calls.append(len(batch))
        probs = np.full((len(batch), p.num_actions), 1e-6)
        probs[:, target] = 1.0
        return probs

    tree = MCTS(p, peaked, MCTSConfig(leaf_batch=4, c_puct=5.0))
    tree.run(iterations=20)
    assert int(np.argmax(tree.root.n)) == target
    assert max(calls) > 1  # leaves are expanded in batches
    with pytest.raises(ValueError, match="prior returned shape"):
        MCTS(p, lambda prefixes: np.ones((1, 3)))


def test_self_play_records_targets(lenet_testbed: TagProblem) -> None:
    samples, result = self_play(
        lenet_testbed, None, np.random.default_rng(0), iterations_per_move=20, moves=3, min_visits=10
    )
    assert [len(d) for d, _ in samples] == [0, 1, 2]
    assert all(pi.sum() == pytest.approx(1.0) for _, pi in samples)
    assert result.iterations == 60


def test_leaf_value_shape() -> None:
    assert leaf_value(0.5, False) == -0.5
    assert leaf_value(2.0, False) == 1.0
    assert leaf_value(17.0, False) == pytest.approx(2.0)  # (17 - 1) ** 0.25
    assert leaf_value(3.0, True) == -1.0


def test_env_evaluate_and_observe_leave_the_episode_alone() -> None:
    env = gym.make(
        "placement_rl/Placement-v0",
        config={
            "action_space": "tag",
            "generator": {"kind": "fixed", "model": "lenet", "topology": "tag-testbed"},
            "max_groups": 6,
        },
    ).unwrapped
    obs, _ = env.reset(seed=0)
    problem = env.tag_problem()
    assert obs["action_mask"].shape == (64 * 4,)
    assert obs["slice_mask"].sum() == len(problem.subsets)
    rng = np.random.default_rng(1)
    decisions = random_decisions(problem, rng, 3)
    predicted = env.observe(decisions)
    before = env.snapshot()
    e = env.evaluate(decisions)
    for a in decisions:
        obs, *_ = env.step(a)
    assert e.makespan_s == env._partial_s
    for key in obs:
        assert np.array_equal(obs[key], predicted[key]), key
    env.restore(before)
    assert env._actions == ()
    with pytest.raises(ValueError, match="decision 0 = True"):
        env.evaluate([True])


@pytest.mark.slow  # 3-4 s: compare_methods simulates every reference row
def test_mcts_method_in_comparisons(zoo_graph: Callable[..., OpGraph]) -> None:
    from placement_rl.methods import compare_methods, get_method

    graph = zoo_graph("lenet")
    topo = resolve_topology("tag-testbed")
    (row,) = compare_methods(graph, topo, ["mcts"], options={"mcts": {"budget": 40, "max_groups": 6}})
    assert row.method == "mcts" and not row.oom
    assert row.speedup_over_dp >= 1.0  # the search starts from data parallelism and keeps the best leaf
    row.plan.validate(graph, topo)
    check = get_method("mcts").check
    assert check is not None
    for bad, message in (
        ({"budget": "soon"}, "budget = 'soon'"),
        ({"device_grouping": "rack"}, "device_grouping = 'rack'"),
        ({"c_puct": -1}, "c_puct = -1"),
        ({"max_groups": 0}, "max_groups = 0"),
        ({"reference": "dp"}, "reference = 'dp'"),
    ):
        with pytest.raises(ValueError, match=message):
            check(bad, None, None)

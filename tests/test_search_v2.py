"""The searches and plans v2: MCMC's micro-batch, schedule, recomputation and ZeRO moves, and FT's
ZeRO and recomputation options.

The hand-built instances use the flat roofline with efficiency 1 (an op of F FLOPs takes F / 1e12 s)
on four devices in a line: a model whose parameter state fits only when ZeRO shards it, one whose
activations fit only when recomputed (or held for fewer micro-batches), and a chain of layers with
large parameters over slow links, where a layerwise plan gains from micro-batches.
"""

from __future__ import annotations

import numpy as np
import pytest

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import Plan, data_parallel, layerwise, pipeline
from placement_rl.plan import recompute as recompute_plan
from placement_rl.plan import zero as zero_plan
from placement_rl.plan.core import zero_eligible
from placement_rl.search import SearchSpace, mcmc
from placement_rl.search.ft import run_ft
from placement_rl.search.proposals import (
    COORDINATED_KINDS,
    MIXES,
    PROPOSAL_KINDS,
    PipelineFields,
    Proposer,
    interleaved_fits,
    micro_batch_options,
    parse_proposals,
    schedule_options,
)
from placement_rl.sim.cost import CostModel
from placement_rl.sim.simulator import simulate
from placement_rl.topology import Device, DeviceTopology, Link, load_preset

TFLOPS = 1e12
EXACT = CostModel(efficiency={}, default_efficiency=1.0, optimizer="adam", calibration=None)
BATCH = 16
MIB = 2**20


def _line(memory_bytes: int = 2**34, bandwidth_bytes_per_s: float = 1e11, latency_s: float = 0.0) -> DeviceTopology:
    devices = [Device(f"g{i}", "test-gpu", "m0", TFLOPS, memory_bytes, 1e12) for i in range(4)]
    links = [Link(f"g{i}", f"g{i + 1}", bandwidth_bytes_per_s, latency_s, "nvlink") for i in range(3)]
    return DeviceTopology("line", devices, links)


def _chain(params: list[int], activations: list[int]) -> OpGraph:
    """Linear layers in a chain (1 ms forward, 2 ms backward for the whole batch of 16)."""
    names = [chr(ord("a") + k) for k in range(len(params))]
    ops = [
        Op(
            name,
            "linear",
            ((BATCH, 8),),
            forward_flops=1e-3 * TFLOPS,
            backward_flops=2e-3 * TFLOPS,
            param_bytes=p,
            param_key=name if p else None,
            bytes_written=a,
            parallel_dims=(ParallelDim("sample", "sample", 0, BATCH),),
        )
        for name, p, a in zip(names, params, activations, strict=True)
    ]
    return OpGraph("chain", ops, [Tensor(x, y, (BATCH, 8), 64) for x, y in zip(names, names[1:], strict=False)])


def test_mcmc_fits_with_zero_where_data_parallelism_does_not() -> None:
    # op b holds 400 MiB of fp32 parameters: 1.6 GB of state with Adam on every replica; 1.2 GiB per
    # device fits it only sharded (ZeRO-1 over four replicas: 1 GB), and a sample-only search cannot
    # split the parameters themselves
    graph = _chain([0, 400 * MIB, MIB, 0], [MIB] * 4)
    tight = _line(memory_bytes=1200 * MIB)
    dp = data_parallel(graph, tight)
    assert simulate(graph, tight, dp, EXACT).oom
    assert not simulate(graph, tight, zero_plan(graph, dp, 1), EXACT).oom
    found = mcmc(graph, tight, budget=200, seed=0, cost_model=EXACT, proposals="mixed", dim_kinds=("sample",))
    assert not found.result.oom
    assert found.plan["b"].zero > 0 and len(found.plan["b"].devices) >= 2
    assert found.cost_s == found.result.makespan_s < found.initial_costs_s["data_parallel"] / 10
    assert found.stats["accepted_by_kind"]["zero"] > 0
    found.plan.validate(graph, tight)


def test_mcmc_fits_with_recomputation_where_data_parallelism_does_not() -> None:
    # eight layers of 400 MiB activations: data parallelism holds 900 MiB per device; recomputing
    # (or holding one micro-batch at a time under 1F1B) fits in 400 MiB
    graph = _chain([2**16] * 8, [400 * MIB] * 8)
    tight = _line(memory_bytes=400 * MIB)
    dp = data_parallel(graph, tight)
    assert simulate(graph, tight, dp, EXACT).oom
    assert not simulate(graph, tight, recompute_plan(graph, dp), EXACT).oom
    options = {"budget": 200, "seed": 0, "cost_model": EXACT, "dim_kinds": ("sample",)}
    recomputed = mcmc(graph, tight, proposals={"flexflow": 1, "recompute": 1}, **options)
    assert not recomputed.result.oom
    assert any(cfg.recompute for cfg in recomputed.plan.configs.values())
    # the whole mix: gradient accumulation under 1F1B holds one micro-batch's activations and costs
    # no recomputation, so it wins
    mixed = mcmc(graph, tight, proposals="mixed", **options)
    assert not mixed.result.oom and mixed.cost_s <= recomputed.cost_s
    assert mixed.plan.micro_batches > 1 or any(cfg.recompute for cfg in mixed.plan.configs.values())
    assert mixed.result.micro_batches == mixed.plan.micro_batches


def test_mcmc_pipelines_a_layerwise_start_over_slow_links() -> None:
    # four layers of 64 MiB parameters on a line of 1 GB/s links: data parallelism all-reduces them
    # (0.4 s), layerwise runs them one after the other (12 ms); micro-batches overlap the stages
    graph = _chain([64 * MIB] * 4, [MIB] * 4)
    slow = _line(bandwidth_bytes_per_s=1e9, latency_s=1e-5)
    start = layerwise(graph, slow)
    unpipelined = simulate(graph, slow, start, EXACT).makespan_s
    assert simulate(graph, slow, data_parallel(graph, slow), EXACT).makespan_s > 10 * unpipelined
    found = mcmc(graph, slow, budget=300, seed=0, cost_model=EXACT, proposals="mixed", initial=("layerwise",))
    assert found.initial_costs_s == {"layerwise": unpipelined}
    assert found.plan.micro_batches > 1 and found.result.micro_batches == found.plan.micro_batches
    assert found.cost_s < unpipelined / 3  # 12.1 ms -> 3.6 ms (16 micro-batches)
    assert simulate(graph, slow, found.plan, EXACT).makespan_s == found.cost_s
    assert Plan.from_dict(found.plan.to_dict()) == found.plan  # the pipeline fields travel with it
    # moving ops under 1F1B makes orders that wait for themselves: rejected, counted, not raised
    moved = mcmc(graph, slow, budget=300, seed=0, cost_model=EXACT, proposals={"flexflow": 1, "micro_batches": 1},
                 initial=("layerwise",))  # fmt: skip
    assert moved.stats["deadlocks"] > 0 and moved.plan.micro_batches > 1
    assert moved.cost_s < unpipelined / 3


def test_full_and_delta_evaluation_and_cutoff_give_the_same_chain() -> None:
    graph = _chain([64 * MIB] * 4, [MIB] * 4)
    slow = _line(bandwidth_bytes_per_s=1e9, latency_s=1e-5)
    options = {"budget": 150, "seed": 2, "cost_model": EXACT, "proposals": "memory", "initial": ("layerwise",)}
    runs = [
        mcmc(graph, slow, delta=delta, cutoff=cutoff, **options) for delta, cutoff in ((True, True), (False, False))
    ]
    assert np.array_equal(runs[0].costs_s, runs[1].costs_s)
    assert runs[0].plan == runs[1].plan and runs[0].accepted == runs[1].accepted


def test_memory_and_pipeline_moves_give_valid_plans(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("rnnlm", steps=3)  # shared parameters, ops without a sample split, batch 64
    topo = load_preset("tag-testbed")
    space = SearchSpace(graph, topo)
    starts = [
        data_parallel(graph, topo),
        pipeline(graph, topo, 4, micro_batches=4, schedule="1f1b"),
        pipeline(graph, topo, 2, micro_batches=4, schedule="interleaved", virtual_stages=2),
    ]
    rng = np.random.default_rng(0)
    for kind in ("micro_batches", "schedule", "recompute", "zero"):
        proposer = Proposer(graph, topo, space, kind)
        made = 0
        for k in range(24):
            plan = starts[k % len(starts)]
            configs = [plan[op.name] for op in graph.ops]
            drawn, change = proposer.draw(configs, rng, PipelineFields.of(plan))
            assert drawn == kind
            if isinstance(change, PipelineFields):
                assert kind in ("micro_batches", "schedule")
                proposed = plan.with_schedule(change.micro_batches, change.schedule, change.virtual_stages)
                made += proposed != plan
            else:
                assert kind in ("recompute", "zero")
                proposed = plan.with_configs({**plan.configs, **{graph.ops[i].name: c for i, c in change.items()}})
                made += bool(change)
                for i, cfg in change.items():  # only the memory option changed
                    old = configs[i]
                    assert (cfg.devices, cfg.degrees, cfg.sync) == (old.devices, old.degrees, old.sync)
                    assert (cfg.recompute, cfg.zero) != (old.recompute, old.zero)
            proposed.validate(graph, topo)
        assert made >= 8  # zero: only data parallelism replicates parameters
    # micro-batch counts divide the batch and every op's split of it; interleaved only where it fits
    dp = data_parallel(graph, topo)
    configs = [dp[op.name] for op in graph.ops]
    assert micro_batch_options(graph, configs, [1, 2, 4, 8, 16]) == [1, 2, 4]  # 16 GPUs split the 64 samples
    stacked = starts[2]
    assert ("interleaved", 2) in schedule_options(graph, [stacked[op.name] for op in graph.ops], 4)
    assert schedule_options(graph, [starts[1][op.name] for op in graph.ops], 4) == [("gpipe", 1), ("1f1b", 1)]
    assert not interleaved_fits(graph, [stacked[op.name] for op in graph.ops], 2, 3)
    assert not zero_eligible(graph.ops[0], configs[0]) or graph.ops[0].param_bytes > 0


def test_placement_moves_keep_memory_options_and_respect_micro_batches(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")  # batch 64
    topo = load_preset("trinity")
    space = SearchSpace(graph, topo)
    plan = recompute_plan(graph, zero_plan(graph, data_parallel(graph, topo), 1)).with_schedule(16, "gpipe")
    configs = [plan[op.name] for op in graph.ops]
    proposer = Proposer(graph, topo, space, {"flexflow": 1, "neighbour": 1, "group": 1, "replicas": 1})
    rng = np.random.default_rng(3)
    for _ in range(100):
        _, changes = proposer.draw(configs, rng, PipelineFields.of(plan))
        assert isinstance(changes, dict)
        for i, cfg in changes.items():
            assert cfg.recompute  # kept from the op's configuration
            assert cfg.zero == (1 if zero_eligible(graph.ops[i], cfg) else 0)
        trial = plan.with_configs({**plan.configs, **{graph.ops[i].name: c for i, c in changes.items()}})
        trial.validate(graph, topo)  # 16 micro-batches of 4 samples: no sample degree above 4


def test_the_new_kinds_are_named_and_mixed() -> None:
    for kind in ("micro_batches", "schedule", "recompute", "zero"):
        assert kind in PROPOSAL_KINDS and parse_proposals(kind) == {kind: 1.0}
    mixed = parse_proposals("mixed")
    # every kind but the coordinated moves and restage (the "coordinated" and "adaptive" mixes have those too)
    assert sum(mixed.values()) == pytest.approx(1.0)
    assert set(mixed) == set(PROPOSAL_KINDS) - set(COORDINATED_KINDS) - {"restage"}
    assert set(parse_proposals("coordinated")) == set(PROPOSAL_KINDS)
    # the five original kinds keep their proportions (FlexFlow's as much as the four others)
    assert mixed["flexflow"] == pytest.approx(sum(mixed[k] for k in ("neighbour", "group", "sync", "replicas")))
    assert set(MIXES["soap"]) == {"flexflow", "neighbour", "group"}


def test_ft_offers_zero_and_recomputation() -> None:
    graph = _chain([0, 8 * MIB, MIB, 0], [4 * MIB] * 4)
    topo = _line()
    plain = run_ft(graph, topo, 4, cost_model=EXACT, tolerance=0.0)
    zero = run_ft(graph, topo, 4, cost_model=EXACT, tolerance=0.0, zero=1)
    both = run_ft(graph, topo, 4, cost_model=EXACT, tolerance=0.0, zero=1, recompute=True)
    # ZeRO-1 moves what the all-reduce moves: the same fastest time, with less memory
    assert zero.points[-1].time_s == plain.points[-1].time_s
    assert zero.points[-1].memory_bytes < plain.points[-1].memory_bytes
    assert any(cfg.zero == 1 for p in zero.points for cfg in p.plan.configs.values())
    # recomputation: twice the configurations, the plain ones among them (the same fastest time), and
    # points with less memory that take longer
    assert np.array_equal(both.configs_per_op, 2 * zero.configs_per_op)
    assert both.points[-1].time_s == zero.points[-1].time_s
    assert both.points[0].memory_bytes < zero.points[0].memory_bytes
    assert both.points[0].time_s > zero.points[0].time_s
    assert any(cfg.recompute for cfg in both.points[0].plan.configs.values())
    for point in (*zero.points, *both.points):
        point.plan.validate(graph, topo)
    with pytest.raises(ValueError, match="zero = 4"):
        run_ft(graph, topo, 4, cost_model=EXACT, zero=4)

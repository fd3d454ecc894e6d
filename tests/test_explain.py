"""A plan in words: devices used and idle, the pipeline, per-family configurations, ZeRO, recomputation,
uneven batch splits, memory, where the time goes."""

from __future__ import annotations

import pytest

from placement_rl import plan as plans
from placement_rl.explain import explain_plan, time_breakdown
from placement_rl.ops import op_kind
from placement_rl.plan import OpConfig, Plan, data_parallel, pipeline_stages, single_device
from placement_rl.sim import simulate
from placement_rl.topology import load_preset


def test_devices_families_memory_and_the_comparison(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph, topo = zoo_graph("lenet"), load_preset("trinity")
    dp_plan, one_plan = data_parallel(graph, topo), single_device(graph, topo)
    dp, one = simulate(graph, topo, dp_plan), simulate(graph, topo, one_plan)
    words = explain_plan(graph, topo, one_plan, one, dp)
    assert words[0] == "uses 1 of 4 devices (1 x P100-PCIE-12GB): m0/gpu0"
    assert words[1] == "leaves 3 idle: m0/gpu1-3"
    assert any(line.startswith("conv (") and line.endswith("on one device") for line in words)
    assert any(line.startswith("memory: fits; peak ") for line in words)
    ratio = dp.makespan_s / one.makespan_s
    assert words[-1].startswith(f"{ratio:.2f}x ") and "data parallelism" in words[-1]
    dp_words = explain_plan(graph, topo, dp_plan, dp, dp)
    assert dp_words[0].startswith("uses 4 of 4 devices") and not dp_words[1].startswith("leaves")
    assert any("split batch / 4 over 4 devices; gradients all-reduced" in line for line in dp_words)
    assert dp_words[-1].startswith("1.00x as fast as data parallelism")


def test_parameter_splits_need_no_synchronization(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph, topo = zoo_graph("lenet"), load_preset("trinity")
    devices = [d.name for d in topo.devices]
    configs = dict(data_parallel(graph, topo).configs)
    dense = [op for op in graph.ops if op.op_type == "linear"]
    for op in dense:
        channel = op.parallel_dim("channel")
        degree = 2 if channel.size % 2 == 0 else 1
        configs[op.name] = OpConfig.make(devices[:degree], {"channel": degree})
    plan = Plan(graph.name, configs)
    words = explain_plan(graph, topo, plan, simulate(graph, topo, plan))
    assert any("channel (parameters) / 2 over 2 devices; parameters split: nothing to synchronize" in w for w in words)


def test_the_breakdown_is_the_critical_path(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph, topo = zoo_graph("lenet"), load_preset("trinity")
    result = simulate(graph, topo, data_parallel(graph, topo))
    spent = time_breakdown(result)
    steps = result.critical_path
    assert sum(spent.values()) == pytest.approx(sum(s.end_s - s.start_s for s in steps))
    assert spent["compute"] > 0 and spent["gradient synchronization"] > 0


def _gpt(zoo_graph):  # type: ignore[no-untyped-def]
    return zoo_graph("gpt", batch_size=8, num_layers=4, hidden=64, heads=4, seq_len=32, vocab_size=256)


def test_pipelines_zero_recomputation_and_weights_in_words(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph, topo = _gpt(zoo_graph), load_preset("trinity")
    devices = [d.name for d in topo.devices]
    plan = plans.pipeline(graph, topo, 2, data_parallel=2, micro_batches=2)
    plan = plans.recompute(graph, plans.zero(graph, plan, 1), {"attention", "linear"})
    configs = dict(plan.configs)
    for name in ("blocks_0_mlp_fc", "blocks_0_mlp_out"):
        configs[name] = configs[name].replace(weights={devices[1]: 0.25, devices[0]: 0.75})
    plan = plan.with_configs(configs)
    stages = pipeline_stages(graph, plan)
    sizes = sorted(len(s.ops) for s in stages)
    words = explain_plan(graph, topo, plan, simulate(graph, topo, plan))
    assert words[1] == f"2 pipeline stages of {sizes[0]} to {sizes[1]} ops (1F1B with 2 micro-batches)"
    with_params = sum(op.param_bytes > 0 for op in graph.ops)
    linear = sum(op.op_type == "linear" for op in graph.ops)
    assert f"ZeRO-1 over 2 replicas on {with_params} ops" in words
    assert f"recomputing {linear + 4} ops (linear, attention)" in words
    assert "uneven batch split on 2 ops (weights 0.75/0.25 over m0/gpu0-1)" in words
    everything = plans.recompute(graph, plans.fsdp(graph, plans.data_parallel(graph, topo, devices[:2])))
    words = explain_plan(graph, topo, everything, simulate(graph, topo, everything))
    assert f"ZeRO-3 (FSDP) over 2 replicas on {with_params} ops" in words
    assert any(w.startswith(f"recomputing all {graph.num_ops} ops (") and "more types)" in w for w in words)
    assert not any("pipeline" in w for w in words)  # one micro-batch, default schedule: no pipeline line


def test_interleaving_and_gradient_accumulation_in_words(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph, topo = _gpt(zoo_graph), load_preset("trinity")
    plan = plans.pipeline(graph, topo, 2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    words = explain_plan(graph, topo, plan, simulate(graph, topo, plan))
    assert words[2].startswith("4 pipeline stages of ")
    assert words[2].endswith(
        " ops on 2 device groups (interleaved 1F1B with 2 virtual stages per device group, 4 micro-batches)"
    )
    accumulate = data_parallel(graph, topo, [d.name for d in topo.devices][:2]).with_schedule(micro_batches=4)
    words = explain_plan(graph, topo, accumulate, simulate(graph, topo, accumulate))
    assert (
        f"one stage of {graph.num_ops} ops, no pipeline: 4 micro-batches per iteration (gradient accumulation)" in words
    )


def test_a_default_plan_says_nothing_of_the_v2_fields(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph, topo = _gpt(zoo_graph), load_preset("trinity")
    for plan in (data_parallel(graph, topo), plans.layerwise(graph, topo)):
        words = explain_plan(graph, topo, plan, simulate(graph, topo, plan))
        families = len({op_kind(op.op_type).family for op in graph.ops})
        idle = int(bool(set(d.name for d in topo.devices) - set(plan.devices_used())))
        assert len(words) == 1 + idle + families + 2  # devices, idle, families, memory, critical path
        assert not any(key in w for w in words for key in ("pipeline", "ZeRO", "recomputing", "uneven", "micro-batch"))


def test_a_megatron_layout_is_said_in_one_line(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    from placement_rl.plan import megatron

    graph = zoo_graph("gpt", batch_size=8, num_layers=2, hidden=256, heads=8, seq_len=64, vocab_size=512)
    cluster = load_preset("h100-2x8")
    plan = megatron(graph, cluster, tp=4, dp=2, pp=2, micro_batches=4)
    lines = explain_plan(graph, cluster, plan, simulate(graph, cluster, plan))
    # two row-parallel layers and one attention per layer are split 4 ways inside a machine
    assert "4-way tensor parallel inside each machine (6 ops), 2-way data parallel, 2 pipeline stages" in lines
    assert any("identical on the replicas, gradients all-reduced over the parts" in line for line in lines)
    across = megatron(graph, cluster, tp=4, dp=4).with_configs(
        {
            name: cfg.replace(devices=tuple(cfg.devices[i] for i in _interleave(len(cfg.devices))))
            for name, cfg in megatron(graph, cluster, tp=4, dp=4).configs.items()
        }
    )
    assert any("4-way tensor parallel across machines" in line for line in explain_plan(
        graph, cluster, across, simulate(graph, cluster, across)))  # fmt: skip


def _interleave(n: int) -> list[int]:
    """Device order 0, 8, 1, 9, ...: consecutive tasks alternate between the two machines."""
    half = n // 2
    return [k // 2 + (half if k % 2 else 0) for k in range(n)]

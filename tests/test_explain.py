"""A plan in words: devices used and idle, per-family configurations, memory, where the time goes."""

from __future__ import annotations

import pytest

from placement_rl.explain import explain_plan, time_breakdown
from placement_rl.plan import OpConfig, Plan, data_parallel, single_device
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

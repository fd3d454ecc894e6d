"""Identical data-parallel replicas simulated once equal the whole simulation, bit for bit."""

from __future__ import annotations

import pytest

from placement_rl.graph import OpGraph
from placement_rl.plan import OpConfig, Plan, data_parallel, megatron
from placement_rl.sim.cost import CostModel
from placement_rl.sim.replicas import rank_plan, replica_plan, simulate_replica
from placement_rl.sim.simulator import simulate
from placement_rl.topology import DeviceTopology, load_preset


@pytest.fixture(scope="module")
def gpt(zoo_graph) -> OpGraph:  # type: ignore[no-untyped-def]
    return zoo_graph("gpt", batch_size=8, num_layers=4, hidden=256, heads=8, seq_len=64, vocab_size=512)


@pytest.fixture(scope="module")
def cluster() -> DeviceTopology:
    return load_preset("dgx-h100-x2")  # 2 x 8 H100, a GPU's own NIC to each rail


CASES = [
    {"tp": 4, "dp": 4},
    {"tp": 8, "dp": 2},
    {"tp": 4, "dp": 2, "pp": 2, "micro_batches": 2},
    {"tp": 2, "dp": 4, "pp": 2, "micro_batches": 2, "schedule": "gpipe"},
    {"tp": 2, "dp": 4, "pp": 2, "micro_batches": 2, "zero_stage": 1, "recompute": "full"},
]


@pytest.mark.parametrize("network", ["flow", "circuit"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_one_replica_equals_the_whole_plan(
    gpt: OpGraph, cluster: DeviceTopology, case: dict[str, object], network: str
) -> None:
    plan = megatron(gpt, cluster, **case)  # type: ignore[arg-type]
    cost = CostModel(network=network)
    whole = simulate(gpt, cluster, plan, cost)
    dp, tp = int(case["dp"]), int(case["tp"])  # type: ignore[call-overload]
    one = simulate_replica(gpt, cluster, plan, dp, cost)
    assert one.makespan_s == whole.makespan_s
    assert one.peak_memory_bytes == pytest.approx(whole.peak_memory_bytes, rel=1e-6)  # bytes split by // dp
    assert one.busy_s == pytest.approx(whole.busy_s, rel=1e-12)
    # and one tensor-parallel rank of each group too
    rank = simulate_replica(gpt, cluster, plan, dp, cost, tp=tp)
    assert rank.makespan_s == whole.makespan_s
    assert rank.peak_memory_bytes == pytest.approx(whole.peak_memory_bytes, rel=1e-6)
    assert rank.busy_s == pytest.approx(whole.busy_s, rel=1e-12)
    assert len(rank.tasks) < len(one.tasks) < len(whole.tasks)


def test_plain_data_parallelism_too(gpt: OpGraph, cluster: DeviceTopology) -> None:
    eight = data_parallel(gpt, cluster, [d.name for d in cluster.devices][:8])  # one sample per GPU
    whole = simulate(gpt, cluster, eight)
    for dp in (2, 8):
        assert simulate_replica(gpt, cluster, eight, dp).makespan_s == whole.makespan_s


def test_plans_that_are_not_alike_replicas_are_refused(gpt: OpGraph, cluster: DeviceTopology) -> None:
    plan = megatron(gpt, cluster, tp=4, dp=4)
    with pytest.raises(ValueError, match="do not split into 3 replicas"):
        replica_plan(gpt, plan, 3)
    # one op laid out differently: its devices' replicas disagree with the other ops'
    name = gpt.ops[5].name
    cfg = plan[name]
    swapped = plan.with_configs({**plan.configs, name: cfg.replace(devices=tuple(reversed(cfg.devices)))})
    with pytest.raises(ValueError, match="expected the same layout in every op"):
        replica_plan(gpt, swapped, 4)
    lone = Plan(gpt.name, {op.name: OpConfig.make(cluster.devices[0].name) for op in gpt.ops})
    with pytest.raises(ValueError, match="do not split into 2 replicas"):
        replica_plan(gpt, lone, 2)


def test_ranks_that_are_not_alike_are_refused(gpt: OpGraph, cluster: DeviceTopology) -> None:
    plan = megatron(gpt, cluster, tp=4, dp=4)
    with pytest.raises(ValueError, match="expected one split of 2 tensor-parallel ranks"):
        rank_plan(gpt, plan, 2)

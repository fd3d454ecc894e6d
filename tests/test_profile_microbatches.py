"""Profiled op times under micro-batches, pipeline stages, recomputation and replicas; ops a profile does
not time are reported (``CostModel.analytic_ops`` and one warning line from the command line).

The pipeline cases reuse tests/test_pipeline_sim.py's chain: four ops of 1 ms forward and 2 ms backward
under the flat roofline, on links with no latency and unbounded bandwidth, so that the textbook
``(m + p - 1) (F + B) / m`` is exact. Their profile says 10 ms and 20 ms: an op timed by the analytic
model instead shows as a 10x shorter time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from placement_rl.cli import main
from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import OpConfig, Plan, data_parallel
from placement_rl.sim.cost import NO_WORK_OPS, CostModel, ProfileEntry, ProfileTable
from placement_rl.sim.pipeline import micro_batch_graph
from placement_rl.sim.replicas import simulate_replica
from placement_rl.sim.simulator import simulate
from placement_rl.topology import Device, DeviceTopology, Link, load_preset
from placement_rl.topology.core import MAX_BANDWIDTH_BYTES_PER_S

NAMES = ("a", "b", "c", "d")
FORWARD_S, BACKWARD_S = 10e-3, 20e-3  # the profile's times of each chain op at the whole batch (8)


def _op(name: str, op_type: str = "linear", shape: tuple[int, ...] = (8, 8), reduction: bool = False) -> Op:
    return Op(
        name,
        op_type,
        (shape,),
        forward_flops=1e9,  # 1 ms forward, 2 ms backward at 1 TFLOP/s, efficiency 1
        backward_flops=2e9,
        bytes_written=8 * 10**6,
        parallel_dims=(ParallelDim("sample", "sample", 0, 8, reduction),),
    )


def _chain() -> OpGraph:
    ops = [_op(n) for n in NAMES]
    return OpGraph("chain", ops, [Tensor(x, y, (8, 8), 8) for x, y in zip(NAMES, NAMES[1:], strict=False)])


def _line(n: int) -> DeviceTopology:
    devices = [Device(f"g{i}", "test-gpu", "m0", 1e12, 2**34, MAX_BANDWIDTH_BYTES_PER_S) for i in range(n)]
    links = [Link(f"g{i}", f"g{i + 1}", MAX_BANDWIDTH_BYTES_PER_S, 0.0, "nvlink") for i in range(n - 1)]
    return DeviceTopology("line", devices, links)


def _named_profile(graph: OpGraph, device_type: str, forward_s: float, backward_s: float) -> ProfileTable:
    """Entries under op names only (no name-less shape keys), at the whole batch, for every op that does work."""
    return ProfileTable(
        {
            (device_type, op.op_type, op.output_shapes[0], op.param_bytes, op.name): ProfileEntry(forward_s, backward_s)
            for op in graph.ops
            if op.op_type not in NO_WORK_OPS
        },
        precision="fp32",
        timing="cuda_events",
    )


def _exact(graph: OpGraph) -> CostModel:
    profile = _named_profile(graph, "test-gpu", FORWARD_S, BACKWARD_S)
    return CostModel(efficiency={}, default_efficiency=1.0, profile=profile, calibration=None)


def _stages(graph: OpGraph) -> Plan:
    return Plan(graph.name, {n: OpConfig.make(f"g{i}") for i, n in enumerate(NAMES)}, name="stages")


def test_a_scaled_profile_times_data_parallelism_alike_at_one_and_two_micro_batches(
    zoo_graph: Callable[..., OpGraph],
) -> None:
    # The report: a profile scaled x10 gave data parallelism 854.8 ms with one micro-batch and 105.1 ms with
    # two (the micro-batch copies' named entries were missed and their FLOPs timed them). Now two
    # micro-batches take the same work in halves: the same makespan within 2 %, both 10x the unscaled.
    graph = zoo_graph("lenet", batch_size=8)
    topology = load_preset("trinity")  # 4 GPUs: each micro-batch task is 1 of the 8 samples
    device_type = topology.devices[0].device_type
    plan = data_parallel(graph, topology)
    makespan_s: dict[tuple[int, int], float] = {}
    costs = [CostModel(profile=_named_profile(graph, device_type, s * 1e-3, s * 2e-3)) for s in (1, 10)]
    for scale, cost in zip((1, 10), costs, strict=True):
        for m in (1, 2):
            makespan_s[scale, m] = simulate(graph, topology, plan.with_schedule(m) if m > 1 else plan, cost).makespan_s
    assert makespan_s[10, 2] == pytest.approx(makespan_s[10, 1], rel=0.02)
    for m in (1, 2):
        assert makespan_s[10, m] / makespan_s[1, m] == pytest.approx(10, rel=0.05)
    # 12 ops of 3 ms over 4 GPUs, the all-reduce and the host's issue times besides
    assert makespan_s[10, 1] == pytest.approx(10 * 12 * 3e-3 / 4, rel=0.05)
    assert [cost.analytic_ops for cost in costs] == [{}, {}]  # every op from the profile


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_pipeline_stages_take_the_textbook_time_of_the_profile(schedule: str, m: int) -> None:
    graph, cost = _chain(), _exact(_chain())
    result = simulate(graph, _line(4), _stages(graph).with_schedule(m, schedule), cost)
    assert result.makespan_s == pytest.approx((m + 4 - 1) * (FORWARD_S + BACKWARD_S) / m, rel=1e-9)
    assert cost.analytic_ops == {}


def test_interleaved_stages_and_recomputation_spend_the_profiled_work() -> None:
    graph, cost = _chain(), _exact(_chain())
    interleaved = Plan(graph.name, {n: OpConfig.make(f"g{i % 2}") for i, n in enumerate(NAMES)})
    result = simulate(graph, _line(2), interleaved.with_schedule(4, "interleaved", 2), cost)
    assert result.busy_s.sum() == pytest.approx(4 * (FORWARD_S + BACKWARD_S), rel=1e-9)
    again = _stages(graph).with_schedule(4, "gpipe")
    again = again.with_configs({n: c.replace(recompute=True) for n, c in again.configs.items()})
    redo = simulate(graph, _line(4), again, cost)
    assert redo.busy_s.sum() == pytest.approx(4 * (2 * FORWARD_S + BACKWARD_S), rel=1e-9)  # the forward twice
    assert cost.analytic_ops == {}


def test_one_replica_with_micro_batches_equals_the_whole_plan_with_a_profile() -> None:
    graph, topology, cost = _chain(), _line(4), _exact(_chain())
    plan = Plan(graph.name, {n: OpConfig.make(["g0", "g1", "g2", "g3"], {"sample": 4}) for n in NAMES})
    plan = plan.with_schedule(2)
    whole = simulate(graph, topology, plan, cost)
    one = simulate_replica(graph, topology, plan, 2, cost)
    assert one.makespan_s == whole.makespan_s
    assert whole.busy_s.sum() == pytest.approx(4 * (FORWARD_S + BACKWARD_S), rel=1e-9)
    assert cost.analytic_ops == {}


def test_a_measured_micro_batch_shape_wins_and_the_scalar_loss_scales() -> None:
    loss = _op("loss", "cross_entropy", (), reduction=True)
    graph = OpGraph("g", [_op("a"), loss], [Tensor("a", "loss", (8, 8), 8)])
    copy_a, copy_loss = (micro_batch_graph(graph, 2).op(f"{n}@mb0") for n in ("a", "loss"))
    table = ProfileTable(
        {
            ("t", "linear", (8, 8), 0, "a"): ProfileEntry(8.0, 16.0),
            ("t", "linear", (2, 8), 0, "a"): ProfileEntry(3.0, 5.0),  # measured at batch 2 (not 8 / 4 = 2.0)
            ("t", "cross_entropy", (), 0, "loss"): ProfileEntry(1.0, 1.0),
        }
    )
    cost = CostModel(profile=table, calibration=None)
    a, whole_loss = graph.op("a"), graph.op("loss")
    # micro-batch copy at batch 4 split 2 ways: the measured batch-2 entry as it stands
    assert cost.profile_entry(copy_a, 0.5, (2, 8), 0, "t", batch_op=a, micro_batches=2) == (ProfileEntry(3, 5), 1)
    # split 4 ways (batch 1, not measured): the whole batch's entry, a quarter of a half
    assert cost.profile_entry(copy_a, 0.25, (1, 8), 0, "t", batch_op=a, micro_batches=2) == (
        ProfileEntry(8.0, 16.0),
        0.125,
    )
    # ... unless the micro-batch's whole shape (batch 4) was measured: a quarter of that
    at_4 = ProfileTable({**table.entries, ("t", "linear", (4, 8), 0, "a"): ProfileEntry(5.0, 9.0)})
    assert CostModel(profile=at_4, calibration=None).profile_entry(
        copy_a, 0.25, (1, 8), 0, "t", batch_op=a, micro_batches=2
    ) == (ProfileEntry(5.0, 9.0), 0.25)
    # the loss has one shape at every batch: its entry is the whole batch's, scaled by the micro-batch's share
    assert cost.profile_entry(copy_loss, 1.0, (), 0, "t", batch_op=whole_loss, micro_batches=2) == (
        ProfileEntry(1.0, 1.0),
        0.5,
    )
    assert cost.profile_entry(whole_loss, 0.5, (), 0, "t") == (ProfileEntry(1.0, 1.0), 0.5)
    assert cost.profile_entry(a, 1.0, (8, 8), 0, "other-gpu") is None
    with pytest.raises(ValueError, match=r"op 'a@mb0': micro_batches = 2 needs the whole-batch op \(batch_op\)"):
        cost.profile_entry(copy_a, 0.5, (2, 8), 0, "t", micro_batches=2)
    with pytest.raises(ValueError, match=r"micro_batches = 0; expected a positive integer"):
        cost.profile_entry(a, 1.0, (8, 8), 0, "t", micro_batches=0)


def test_ops_the_profile_does_not_time_are_listed_by_their_whole_batch_names() -> None:
    graph = _chain()
    full = _named_profile(graph, "test-gpu", FORWARD_S, BACKWARD_S)
    table = ProfileTable({key: e for key, e in full.entries.items() if key[4] in ("a", "c")})
    cost = CostModel(efficiency={}, default_efficiency=1.0, profile=table, calibration=None)
    result = simulate(graph, _line(4), _stages(graph).with_schedule(2), cost)
    assert cost.analytic_ops == {"b": "linear", "d": "linear"}  # not 'b@mb0', ...
    assert [op.name for op in table.missing_ops(graph.ops, ["test-gpu"])] == ["b", "d"]
    # a and c from the profile, b and d by the roofline (1 ms + 2 ms)
    assert result.busy_s.sum() == pytest.approx(2 * (FORWARD_S + BACKWARD_S) + 2 * 3e-3, rel=1e-9)
    assert CostModel(calibration=None).analytic_ops == {}  # without a profile nothing is a fallback


def test_the_command_line_names_the_ops_the_profile_does_not_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], zoo_graph: Callable[..., OpGraph], cached_zoo: None
) -> None:
    graph = zoo_graph("lenet", batch_size=8)
    full = _named_profile(graph, "P100-PCIE-12GB", 1e-3, 2e-3)  # trinity's GPUs
    path = tmp_path / "profile.json"
    ProfileTable({k: e for k, e in full.entries.items() if k[1] != "linear"}, precision="fp32").to_json(path)
    argv = ["simulate", "--model", "lenet", "--batch-size", "8", "--topology", "trinity", "--plan", "dp"]
    assert main([*argv, "--profile", str(path), "--micro-batches", "2", "--json"]) in (0, None)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: --profile {path}: 3 of 12 ops of 'lenet' have no entry for their whole batch, so the analytic "
        "model (FLOPs and bytes) times them: head_0 (linear), head_2 (linear), head_4 (linear)"
    ]

"""The cost model: roofline, profile overrides, interpolated bandwidth tables, collectives, files."""

from __future__ import annotations

import pytest

from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import Op, OpGraph, Tensor
from placement_rl.plan import OpConfig, Plan
from placement_rl.sim.cost import CommTable, CostModel, ProfileEntry, ProfileTable
from placement_rl.sim.simulator import simulate
from placement_rl.topology import Device, DeviceTopology, Link

# The formulas below are hand-computed under the papers' flat roofline (no calibration, no host lane).
ROOFLINE = CostModel(calibration=None)


def _op(flops: float, nbytes: int) -> Op:
    return Op(
        "x",
        "conv2d",
        ((8, 4),),
        forward_flops=flops,
        backward_flops=2 * flops,
        bytes_read=nbytes,
        bytes_written=0,
        param_bytes=64,
    )


def test_roofline_takes_the_slower_of_compute_and_memory() -> None:
    cost = CostModel(efficiency={"conv2d": 0.5}, calibration=None)  # the flat roofline's formula
    # 1 GFLOP at 0.5 * 1 TFLOP/s = 2 ms; 1 MB at 1 GB/s = 1 ms: compute bound.
    fwd, bwd = cost.task_times_s(_op(1e9, 10**6), 1.0, (8, 4), 64, "gpu", 1e12, 1e9)
    assert fwd == pytest.approx(2e-3) and bwd == pytest.approx(4e-3)
    # 10 MB makes it memory bound (backward moves twice the bytes).
    fwd, bwd = cost.task_times_s(_op(1e9, 10**7), 0.5, (4, 4), 64, "gpu", 1e12, 1e9)
    assert fwd == pytest.approx(5e-3) and bwd == pytest.approx(1e-2)


def test_profile_overrides_exact_shape_then_scaled_whole_op() -> None:
    table = ProfileTable(
        {
            ("V100", "conv2d", (8, 4), 64): ProfileEntry(1e-3, 3e-3),
            ("V100", "conv2d", (4, 4), 64): ProfileEntry(0.7e-3, 2e-3),
        }
    )
    # Without a calibration every profile is trusted as measured and the fallback is the flat roofline.
    cost = CostModel(profile=table, calibration=None)
    assert cost.task_times_s(_op(1e9, 0), 0.5, (4, 4), 64, "V100", 1e12, 1e12) == (0.7e-3, 2e-3)
    assert cost.task_times_s(_op(1e9, 0), 0.25, (2, 4), 64, "V100", 1e12, 1e12) == pytest.approx((0.25e-3, 0.75e-3))
    # Another device type falls back to the roofline.
    assert cost.task_times_s(_op(1e9, 0), 1.0, (8, 4), 64, "T4", 1e12, 1e12)[0] == pytest.approx(1e9 / (1e12 * 0.55))


def test_profile_matching_no_device_type_is_refused() -> None:
    table = ProfileTable(
        {
            ("V100", "conv2d", (8, 4), 64): ProfileEntry(1e-3, 3e-3),
            ("T4", "conv2d", (8, 4), 64): ProfileEntry(2e-3, 6e-3),
            ("T4", "relu", (8, 4), 0): ProfileEntry(1e-4, 1e-4),
        }
    )
    assert table.device_types() == ("T4", "V100")
    assert table.check_matches({"T4", "H100"}) == 2
    with pytest.raises(ValueError) as error:
        table.check_matches(["H100-SXM5-80GB"], "--profile p.json", "topology 'h100-2x8'")
    message = str(error.value)
    assert "--profile p.json: none of its 3 entries" in message
    assert "['T4', 'V100']" in message and "topology 'h100-2x8' has ['H100-SXM5-80GB']" in message


def test_comm_table_interpolates_in_log_size() -> None:
    table = CommTable({"p2p/pcie": [(2**10, 1e9), (2**20, 9e9)]})
    assert table.bandwidth("p2p/pcie", 2**15) == pytest.approx(5e9)  # halfway in log2
    assert table.bandwidth("p2p/pcie", 1) == 1e9 and table.bandwidth("p2p/pcie", 2**30) == 9e9
    assert table.bandwidth("p2p/nvlink", 2**15) is None
    cost = CostModel(comm_table=table)
    assert cost.transfer_time_s(2**15, 12e9, 1e-5, "pcie") == pytest.approx(1e-5 + 2**15 / 5e9)
    assert cost.transfer_time_s(2**15, 12e9, 1e-5, "nvlink") == pytest.approx(1e-5 + 2**15 / 12e9)


def test_comm_table_changes_simulated_transfers() -> None:
    g = OpGraph("pair", [Op("a", "relu", ((4,),)), Op("b", "relu", ((4,),))], [Tensor("a", "b", (4,), 2**20)])
    devs = [Device(n, "gpu", "m0", 1e12, 2**30, 1e12) for n in ("g0", "g1")]
    topo = DeviceTopology("pair", devs, [Link("g0", "g1", 1e10, 0.0, "pcie")])
    plan = Plan("pair", {"a": OpConfig.make("g0"), "b": OpConfig.make("g1")})
    plain = simulate(g, topo, plan, ROOFLINE)
    slow = simulate(g, topo, plan, CostModel(comm_table=CommTable({"p2p/pcie": [(1.0, 1e9)]}), calibration=None))
    assert plain.makespan_s == pytest.approx(2 * 2**20 / 1e10)
    assert slow.makespan_s == pytest.approx(2 * 2**20 / 1e9)


def test_collective_formulas() -> None:
    cost = CostModel()
    assert cost.all_reduce_time_s(8e6, 4, 1e9, 1e-5, "nvlink") == pytest.approx(6 * (1e-5 + 2e6 / 1e9))
    assert cost.all_reduce_time_s(8e6, 1, 1e9, 1e-5, "nvlink") == 0.0
    assert cost.broadcast_time_s(8e6, 4, 1e9, 1e-5) == pytest.approx(3e-5 + 8e-3)
    assert cost.all_gather_time_s(8e6, 4, 1e9, 1e-5) == pytest.approx(3 * (1e-5 + 2e-3))
    assert cost.reduce_scatter_time_s(8e6, 4, 1e9, 1e-5) == cost.all_gather_time_s(8e6, 4, 1e9, 1e-5)


def test_optimizer_state() -> None:
    assert CostModel(optimizer="adam").state_bytes_per_param_byte == 4.0
    assert CostModel(optimizer="sgd").state_bytes_per_param_byte == 2.0
    with pytest.raises(UnknownNameError, match="unknown optimizer 'adamw2'"):
        CostModel(optimizer="adamw2")
    with pytest.raises(ValueError, match="efficiency of 'conv2d' = 1.5"):
        CostModel(efficiency={"conv2d": 1.5})


def test_tables_round_trip_and_reject_bad_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = ProfileTable({("V100", "conv2d", (8, 4), 64): ProfileEntry(1e-3, 3e-3)}, device="cuda")
    table.to_json(tmp_path / "p.json")
    assert ProfileTable.from_json(tmp_path / "p.json") == table
    comm = CommTable({"p2p/pcie": [(1024.0, 1e9), (2048.0, 2e9)]})
    comm.to_json(tmp_path / "c.json")
    assert CommTable.from_json(tmp_path / "c.json") == CommTable({"p2p/pcie": [(1024.0, 1e9), (2048.0, 2e9)]})
    doc = comm.to_dict()
    with pytest.raises(SchemaError, match="size and bandwidth must be positive"):
        CommTable.from_dict({**doc, "curves": {"p2p/pcie": [[1024, 0]]}})
    bad = table.to_dict()
    bad["entries"][0]["forward_s"] = -1.0
    with pytest.raises(SchemaError, match="finite and non-negative"):
        ProfileTable.from_dict(bad)
    (tmp_path / "x.json").write_text("[1, 2", encoding="utf-8")
    with pytest.raises(SchemaError, match="malformed JSON"):
        CommTable.from_json(tmp_path / "x.json")

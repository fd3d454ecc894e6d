"""Micro-batches, pipeline schedules, recomputation, ZeRO and uneven splits in the simulator.

Hand-computed cases use the flat roofline with efficiency 1 (an op of F FLOPs takes F / 1e12 s) and
links with no latency and unbounded bandwidth, so a pipeline's makespan is the textbook
``(m + p - 1) (F + B)`` of ``p`` equal stages and ``m`` micro-batches.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import OpConfig, Plan, data_parallel
from placement_rl.sim.cost import CostModel
from placement_rl.sim.pipeline import ScheduleDeadlock, micro_batch_graph, schedule_slots
from placement_rl.sim.result import TASK_KINDS
from placement_rl.sim.simulator import simulate
from placement_rl.topology import Device, DeviceTopology, Link
from placement_rl.topology.core import MAX_BANDWIDTH_BYTES_PER_S

TFLOPS = 1e12
EXACT = CostModel(efficiency={}, default_efficiency=1.0, optimizer="adam", calibration=None)
ACT = 8 * 10**6  # activation bytes of each op for the whole batch
NAMES = ("a", "b", "c", "d")


def _device(name: str) -> Device:
    return Device(name, "test-gpu", "m0", TFLOPS, 2**34, MAX_BANDWIDTH_BYTES_PER_S)


def _op(name: str, batch: int = 8, param_bytes: int = 0) -> Op:
    return Op(
        name,
        "linear",
        ((batch, 8),),
        forward_flops=1e-3 * TFLOPS,  # 1 ms forward, 2 ms backward for the whole batch
        backward_flops=2e-3 * TFLOPS,
        param_bytes=param_bytes,
        param_key=name if param_bytes else None,
        bytes_written=ACT,
        parallel_dims=(ParallelDim("sample", "sample", 0, batch),),
    )


def _chain(param_bytes: int = 0) -> OpGraph:
    ops = [_op(n, param_bytes=param_bytes) for n in NAMES]
    return OpGraph("chain", ops, [Tensor(x, y, (8, 8), 8) for x, y in zip(NAMES, NAMES[1:], strict=False)])


def _line(n: int = 4) -> DeviceTopology:
    devices = [_device(f"g{i}") for i in range(n)]
    links = [Link(f"g{i}", f"g{i + 1}", MAX_BANDWIDTH_BYTES_PER_S, 0.0, "nvlink") for i in range(n - 1)]
    return DeviceTopology("line", devices, links)


def _stages(graph: OpGraph) -> Plan:
    return Plan(graph.name, {n: OpConfig.make(f"g{i}") for i, n in enumerate(NAMES)}, name="stages")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_equal_stages_take_the_textbook_pipeline_time(schedule: str, m: int) -> None:
    g, topo = _chain(), _line()
    result = simulate(g, topo, _stages(g).with_schedule(m, schedule), EXACT)
    assert result.makespan_s == pytest.approx((m + 4 - 1) * 3e-3 / m, rel=1e-9)
    assert result.micro_batches == m
    assert result.op_names == NAMES


def test_1f1b_holds_at_most_p_minus_r_micro_batches_and_gpipe_all() -> None:
    g, topo = _chain(), _line()
    m = 8
    mb = ACT / m
    gpipe = simulate(g, topo, _stages(g).with_schedule(m, "gpipe"), EXACT)
    one = simulate(g, topo, _stages(g).with_schedule(m, "1f1b"), EXACT)
    # activations held per micro-batch in flight, plus one micro-batch's backward workspace
    # (and the few bytes of the received tensors)
    assert gpipe.peak_memory_bytes / mb == pytest.approx([m + 1] * 4, abs=1e-3)
    assert one.peak_memory_bytes / mb == pytest.approx([4 + 1, 3 + 1, 2 + 1, 1 + 1], abs=1e-3)


def test_every_task_names_its_micro_batch_and_its_original_op() -> None:
    g, topo = _chain(param_bytes=4096), _line()
    result = simulate(g, topo, _stages(g).with_schedule(4, "1f1b"), EXACT)
    t = result.tasks
    compute = np.isin(t.kind, [TASK_KINDS.index("forward"), TASK_KINDS.index("backward")])
    assert sorted(set(t.micro_batch[compute].tolist())) == [0, 1, 2, 3]
    assert set(t.op.tolist()) <= set(range(4))
    assert np.bincount(t.op[compute], minlength=4).tolist() == [8, 8, 8, 8]  # 4 forwards, 4 backwards each


def test_gradient_accumulation_synchronizes_once_after_the_last_micro_batch() -> None:
    g = _chain(param_bytes=4 * 2**20)
    topo = _line(2)
    dp = Plan(g.name, {n: OpConfig.make(["g0", "g1"], {"sample": 2}) for n in NAMES})
    one = simulate(g, topo, dp, EXACT)
    four = simulate(g, topo, dp.with_schedule(4), EXACT)
    ar = TASK_KINDS.index("all_reduce")
    assert (four.tasks.kind == ar).sum() == (one.tasks.kind == ar).sum() > 0
    assert four.comm_bytes == pytest.approx(one.comm_bytes)
    backward = four.tasks.kind == TASK_KINDS.index("backward")
    syncs = four.tasks.kind == ar
    for k in np.flatnonzero(syncs):  # a bucket starts after its op's last micro-batch's backward
        last = four.tasks.end_s[backward & (four.tasks.op == four.tasks.op[k])].max()
        assert four.tasks.start_s[k] >= last - 1e-12
        assert four.tasks.micro_batch[k] == -1
    # the same compute, run in four parts, and the same parameter memory
    assert four.busy_s.sum() == pytest.approx(one.busy_s.sum(), rel=1e-9)


def test_a_1f1b_order_that_waits_for_itself_is_refused_and_gpipe_runs_it() -> None:
    g, topo = _chain(), _line(2)
    back_and_forth = Plan(g.name, {"a": OpConfig.make("g0"), "b": OpConfig.make("g1"), "c": OpConfig.make("g0"),
                                   "d": OpConfig.make("g1")})  # fmt: skip
    with pytest.raises(ScheduleDeadlock, match="use schedule 'gpipe'"):
        simulate(g, topo, back_and_forth.with_schedule(4, "1f1b"), EXACT)
    result = simulate(g, topo, back_and_forth.with_schedule(4, "gpipe"), EXACT)
    assert math.isfinite(result.makespan_s) and result.makespan_s > 0


def test_interleaved_chunks_shorten_the_bubble() -> None:
    g, topo = _chain(), _line(2)
    # four chunks, dealt to two device groups in turn: g0, g1, g0, g1
    interleaved = Plan(g.name, {n: OpConfig.make(f"g{i % 2}") for i, n in enumerate(NAMES)})
    contiguous = Plan(g.name, {n: OpConfig.make(f"g{i // 2}") for i, n in enumerate(NAMES)})
    m = 4
    plain = simulate(g, topo, contiguous.with_schedule(m, "1f1b"), EXACT).makespan_s
    inter = simulate(g, topo, interleaved.with_schedule(m, "interleaved", 2), EXACT).makespan_s
    ideal = 4 * 3e-3 / 2  # all work split evenly over two devices, no bubble
    assert ideal < inter < plain
    # the bubble of p stages of v chunks is (p - 1) / v chunk-times, half of the contiguous plan's
    assert inter - ideal == pytest.approx((plain - ideal) / 2, rel=1e-6)


def test_the_slot_orders_are_megatrons() -> None:
    f = [(0, mb, 0) for mb in range(4)]
    b = [(1, mb, 0) for mb in range(4)]
    assert schedule_slots("1f1b", 0, 2, 4, 1) == [f[0], f[1], b[0], f[2], b[1], f[3], b[2], b[3]]
    assert schedule_slots("1f1b", 1, 2, 4, 1) == [f[0], b[0], f[1], b[1], f[2], b[2], f[3], b[3]]
    assert schedule_slots("gpipe", 0, 2, 2, 1) == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    # interleaved, p = 2, v = 2, m = 4 (Megatron-LM's forward_backward_pipelining_with_interleaving):
    # rank 0 warms up with (p - r - 1) 2 + (v - 1) p = 4 forwards: chunk 0 of micro-batches 0-1,
    # then chunk 1 of micro-batches 0-1
    slots = schedule_slots("interleaved", 0, 2, 4, 2)
    assert slots[:4] == [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)]
    assert slots[4:6] == [(0, 2, 0), (1, 0, 1)]  # then 1F1B, backwards from the last chunk
    assert sorted(slots) == sorted({(k, mb, c) for k in (0, 1) for mb in range(4) for c in range(2)})


def test_recomputation_spends_a_forward_again_and_holds_less() -> None:
    g, topo = _chain(), _line()
    plan = _stages(g).with_schedule(4, "gpipe")
    again = plan.with_configs({n: c.replace(recompute=True) for n, c in plan.configs.items()})
    base, redo = simulate(g, topo, plan, EXACT), simulate(g, topo, again, EXACT)
    assert redo.busy_s.sum() == pytest.approx(base.busy_s.sum() * 4 / 3, rel=1e-9)  # 1 + 2 + 1 per op
    # GPipe keeps every micro-batch's output without recomputation; with it, one at a time
    assert base.peak_memory_bytes[0] / (ACT / 4) == pytest.approx(4 + 1, abs=1e-3)
    assert redo.peak_memory_bytes[0] / (ACT / 4) == pytest.approx(1 + 1, abs=1e-3)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_divides_the_sharded_state_among_the_replicas(stage: int) -> None:
    g = _chain(param_bytes=2**24)  # 4 Mi fp32 parameters per op
    topo = _line(4)
    cost = CostModel(efficiency={}, default_efficiency=1.0, optimizer="adam", calibration=None)
    dp = data_parallel(g, topo)
    zero = dp.with_configs({n: c.replace(zero=stage) for n, c in dp.configs.items()})
    plain, sharded = simulate(g, topo, dp, cost), simulate(g, topo, zero, cost)
    elements = 4 * 2**22
    state = {0: 4 + 4 + 8, 1: 4 + 4 + 8 / 4, 2: 4 + 4 / 4 + 8 / 4, 3: 4 / 4 + 4 / 4 + 8 / 4}
    activations = plain.peak_memory_bytes - elements * state[0]
    assert sharded.peak_memory_bytes == pytest.approx(activations + elements * state[stage], rel=1e-9)
    # stage 3 gathers the parameters before forward and backward: twice the all-reduce bytes (one
    # micro-batch); stages 1 and 2 move what an all-reduce moves
    factor = 2.0 if stage == 3 else 1.0
    assert sharded.comm_bytes == pytest.approx(plain.comm_bytes * factor, rel=1e-9)


def test_uneven_weights_split_the_batch_and_the_work() -> None:
    g, topo = _chain(), _line(3)
    weights = {"g0": 0.5, "g1": 0.25, "g2": 0.25}
    plan = Plan(g.name, {n: OpConfig.make(["g0", "g1", "g2"], {"sample": 3}, weights=weights) for n in NAMES})
    result = simulate(g, topo, plan, EXACT)
    assert result.busy_s == pytest.approx([12e-3 * w for w in weights.values()], rel=1e-9)
    assert result.makespan_s == pytest.approx(6e-3, rel=1e-9)
    even = plan.with_configs({n: c.replace(weights={d: 1 / 3 for d in weights}) for n, c in plan.configs.items()})
    assert simulate(g, topo, even, EXACT).makespan_s == pytest.approx(4e-3, rel=1e-9)


def test_micro_batches_must_divide_the_batch() -> None:
    g, topo = _chain(), _line()
    with pytest.raises(ValueError, match=r"3 micro-batches do not divide op 'a'.*size 8"):
        simulate(g, topo, _stages(g).with_schedule(3), EXACT)
    with pytest.raises(ValueError, match="3 micro-batches do not divide"):
        micro_batch_graph(g, 3)


def test_one_micro_batch_is_todays_simulation(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    g = zoo_graph("gpt", batch_size=4, num_layers=2, hidden=64, heads=4, seq_len=16)
    topo = _line(2)
    dp = data_parallel(g, topo)
    for schedule in ("gpipe", "1f1b"):
        assert simulate(g, topo, dp.with_schedule(1, schedule)).makespan_s == simulate(g, topo, dp).makespan_s


def test_the_trace_names_each_task_s_micro_batch() -> None:
    from placement_rl.sim.trace import chrome_trace

    g, topo = _chain(), _line()
    result = simulate(g, topo, _stages(g).with_schedule(2, "1f1b"), EXACT)
    events = [e for e in chrome_trace(result)["traceEvents"] if e.get("ph") == "X"]
    assert {e["args"].get("micro_batch") for e in events if e["cat"] == "forward"} == {0, 1}
    assert any(e["name"] == "a mb1 [forward]" for e in events)

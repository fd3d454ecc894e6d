"""Training precision: bytes per element of activations and parameter state, and compute at the dtype's peak.

Hand-built graphs whose memory and times are computed by hand under each precision; bad input (an
unknown precision, a device without the dtype's peak); the command line; the Llama-7B memory check
on ``h100-2x8``. The catalogue's per-dtype peaks and their JSON: ``tests/test_dtype_peaks.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from placement_rl import zoo
from placement_rl.cli import build_parser, main
from placement_rl.errors import UnknownNameError
from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.plan import OpConfig, Plan, data_parallel
from placement_rl.search.ft.costs import build_cost_graph
from placement_rl.sim.cost import PRECISIONS, CostModel
from placement_rl.sim.simulator import SimContext, simulate
from placement_rl.topology import (
    Device,
    DeviceTopology,
    Link,
    load_preset,
)
from placement_rl.topology.core import MAX_BANDWIDTH_BYTES_PER_S

TFLOPS = 1e12
BF16_PEAK, FP16_PEAK = 4 * TFLOPS, 2 * TFLOPS
GIB = 2**30


def _device(name: str, peaks: tuple[tuple[str, float], ...] = (("bf16", BF16_PEAK), ("fp16", FP16_PEAK))) -> Device:
    # 1 TFLOP/s fp32 and unlimited memory bandwidth: an op of F FLOPs takes F / peak seconds.
    return Device(name, "test-gpu", "m0", TFLOPS, 2**34, MAX_BANDWIDTH_BYTES_PER_S, peaks)


def _pair(**device: object) -> DeviceTopology:
    return DeviceTopology(
        "pair", [_device("g0", **device), _device("g1", **device)], [Link("g0", "g1", 1e9, 0.0, "pcie")]
    )  # type: ignore[arg-type]


def _cost(precision: str, optimizer: str = "adam") -> CostModel:
    # hand-computed under the papers' flat roofline (calibration=None): F FLOPs take exactly F / peak seconds
    return CostModel(efficiency={}, default_efficiency=1.0, optimizer=optimizer, precision=precision, calibration=None)


def _fc(element_bytes: int = 4, name: str = "fc") -> Op:
    """A linear layer of 1000 parameter elements and an (8, 16) output, traced at ``element_bytes``."""
    return Op(
        name,
        "linear",
        ((8, 16),),
        dtype_bytes=element_bytes,
        forward_flops=1e9,
        backward_flops=2e9,
        param_bytes=1000 * element_bytes,
        param_key=name,
        bytes_written=8 * 16 * element_bytes,
        parallel_dims=(ParallelDim("sample", "sample", 0, 8),),
    )


def _on(graph: OpGraph, where: dict[str, str]) -> Plan:
    return Plan(graph.name, {op: OpConfig.make(device) for op, device in where.items()})


# ------------------------------------------------------------------------------------- the table
def test_precision_records() -> None:
    assert PRECISIONS["fp32"].compute_dtype == "fp32" and CostModel().precision == "fp32"
    # fp32 Adam: 4 + 4 + 4 + 4; mixed-precision Adam: 2 + 2 (low-precision weights and gradients)
    # + 4 (fp32 master weights) + 2 * 4 (two fp32 moments).
    assert _cost("fp32").state_bytes_per_param_element == 16
    assert _cost("bf16-mixed").state_bytes_per_param_element == 2 + 2 + 4 + 2 * 4
    assert _cost("fp16-mixed", "sgd").state_bytes_per_param_element == 2 + 2 + 4
    assert _cost("fp32", "momentum").state_bytes_per_param_element == 12
    assert _cost("bf16-mixed").precision_spec.activation_bytes == 2
    assert (_cost("bf16-mixed").precision_spec.compute_dtype, _cost("fp16-mixed").precision_spec.compute_dtype) == (
        "bf16",
        "fp16",
    )


# ---------------------------------------------------------------------------- memory by hand
@pytest.mark.parametrize(
    ("precision", "optimizer", "element_bytes", "state_bytes", "activation_bytes"),
    [
        ("fp32", "adam", 4, 1000 * 16, 512),  # 1000 elements x (4 + 4 + 4 + 4); (8, 16) x 4 bytes
        ("bf16-mixed", "adam", 4, 1000 * 16, 256),  # 1000 x (2 + 2 + 4 + 4 + 4); (8, 16) x 2 bytes
        ("fp16-mixed", "sgd", 4, 1000 * 8, 256),  # 1000 x (2 + 2 + 4)
        ("fp32", "sgd", 4, 1000 * 8, 512),  # 1000 x (4 + 4)
        ("fp32", "momentum", 4, 1000 * 12, 512),
        # a graph traced in bf16 (2-byte elements): still 1000 parameter elements
        ("fp32", "adam", 2, 1000 * 16, 512),
        ("bf16-mixed", "adam", 2, 1000 * 16, 256),
    ],
)
def test_single_op_peak_memory_by_hand(
    precision: str, optimizer: str, element_bytes: int, state_bytes: int, activation_bytes: int
) -> None:
    graph = OpGraph("fc", [_fc(element_bytes)], [])
    cost = _cost(precision, optimizer)
    r = simulate(graph, _pair(), _on(graph, {"fc": "g0"}), cost)
    # static state + the forward output (kept until backward ends) + the backward workspace
    assert r.peak_memory_bytes.tolist() == [state_bytes + 2 * activation_bytes, 0]
    # the arrays the envs' memory estimate reads (envs.base.bytes_on_devices)
    compiled = SimContext(graph, _pair(), cost).compile(0, OpConfig.make("g0"))
    assert compiled.activation_bytes.tolist() == [activation_bytes]
    assert compiled.static_bytes.tolist() == [state_bytes]


def test_data_parallel_all_reduce_moves_gradient_bytes() -> None:
    graph = OpGraph("fc", [_fc()], [])
    plan = data_parallel(graph, _pair())
    fp32 = simulate(graph, _pair(), plan, _cost("fp32"))
    bf16 = simulate(graph, _pair(), plan, _cost("bf16-mixed"))
    # ring all-reduce over 2 devices: 2 (n - 1) steps of s / n bytes, s = 1000 gradient elements
    assert fp32.comm_bytes == 2 * 1000 * 4 and bf16.comm_bytes == 2 * 1000 * 2
    # each device holds all the state and half the batch: 1000 x 16 + 2 x (8 / 2) x 16 x bytes
    assert fp32.peak_memory_bytes.tolist() == [16000 + 2 * 256] * 2
    assert bf16.peak_memory_bytes.tolist() == [16000 + 2 * 128] * 2


def test_transfers_scale_floats_and_keep_integer_tensors() -> None:
    ids = Op(
        "ids", "input", ((8,),), dtype_bytes=8, bytes_written=64, parallel_dims=(ParallelDim("sample", "sample", 0, 8),)
    )
    a, b = _fc(name="a"), _fc(name="b")
    graph = OpGraph("g", [ids, a, b], [Tensor("ids", "a", (8,), 64), Tensor("a", "b", (8, 16), 512)])
    plan = _on(graph, {"ids": "g0", "a": "g1", "b": "g0"})
    for precision, float_bytes in (("fp32", 512), ("bf16-mixed", 256), ("fp16-mixed", 256)):
        ctx = SimContext(graph, _pair(), _cost(precision))
        assert ctx.e_bytes.tolist() == [64, float_bytes]  # int64 token ids keep 8 bytes per element
        r = ctx.simulate(_on(graph, {"ids": "g0", "a": "g1", "b": "g0"}))
        assert r.comm_bytes == 2 * (64 + float_bytes)  # each tensor forward and its gradient back
    assert simulate(graph, _pair(), plan).comm_bytes == 2 * (64 + 512)  # the default is fp32


def test_default_fp32_keeps_the_traced_figures(zoo_graph: Callable[..., OpGraph]) -> None:
    graph = zoo_graph("lenet")
    topology = load_preset("trinity")
    ctx = SimContext(graph, topology)
    assert ctx.e_bytes.tolist() == graph.arrays.edge_bytes.tolist()
    plan = data_parallel(graph, topology)
    for i, op in enumerate(graph.ops):
        compiled = ctx.compile(i, plan[op.name])
        assert compiled.activation_bytes.tolist() == [op.bytes_written / compiled.partitions] * len(compiled.devices)
        assert compiled.static_bytes.tolist() == [op.param_bytes * 4.0] * len(compiled.static_bytes)  # Adam: 4x


def test_ft_node_memory_by_hand() -> None:
    graph = OpGraph("fc", [_fc()], [])
    for precision, activation in (("fp32", 512), ("bf16-mixed", 256)):
        cost_graph, configs = build_cost_graph(graph, _pair(), cost_model=_cost(precision))
        dp = next(s for s, c in enumerate(configs[0]) if c.degree_map == {"sample": 2})
        # state (1000 x 16) + the workspace and the graph output, each half the batch
        assert cost_graph.node_memory_bytes[0][dp] == pytest.approx(16000 + activation / 2 + activation / 2)
        # compute at the dtype's peak: 3 GFLOP over 2 devices
        peak = TFLOPS if precision == "fp32" else BF16_PEAK
        assert cost_graph.node_time_s[0][dp] >= 3e9 / 2 / peak
        assert cost_graph.node_time_s[0][dp] < 3e9 / 2 / peak + 1e-3  # plus a small all-reduce


# ------------------------------------------------------------------------- compute at the peak
@pytest.mark.parametrize(
    ("precision", "peak"), [("fp32", TFLOPS), ("bf16-mixed", BF16_PEAK), ("fp16-mixed", FP16_PEAK)]
)
def test_compute_runs_at_the_compute_dtypes_peak(precision: str, peak: float) -> None:
    graph = OpGraph("fc", [_fc()], [])
    r = simulate(graph, _pair(), _on(graph, {"fc": "g0"}), _cost(precision))
    assert r.makespan_s == pytest.approx((1e9 + 2e9) / peak)  # forward + backward FLOPs / peak


def test_a_device_without_the_dtypes_peak_is_an_error() -> None:
    graph = OpGraph("fc", [_fc()], [])
    fp32_only = _pair(peaks=())
    with pytest.raises(ValueError, match=r"precision 'bf16-mixed' computes in bf16, but device 'g0' \(test-gpu\)"):
        simulate(graph, fp32_only, _on(graph, {"fc": "g0"}), _cost("bf16-mixed"))
    with pytest.raises(
        ValueError,
        match=r"has no tf32 peak FLOP/s \(it has: fp32, bf16, fp16\).*\['fp32', 'bf16-mixed', 'fp16-mixed'\]",
    ):
        simulate(graph, _pair(), _on(graph, {"fc": "g0"}), _cost("tf32"))
    with pytest.raises(ValueError, match="V100-SXM2-32GB"):  # bf16 needs Ampere or later
        simulate(graph, load_preset("tag-testbed"), _on(graph, {"fc": "m0/gpu0"}), _cost("bf16-mixed"))


def test_unknown_precision_lists_the_valid_names() -> None:
    with pytest.raises(
        UnknownNameError, match="unknown precision 'bf16'; expected one of: bf16-mixed, fp16-mixed, fp32, tf32"
    ):
        CostModel(precision="bf16")


# -------------------------------------------------------------------------------- the command line
@pytest.mark.parametrize(
    "command",
    [
        ["plan", "--model", "lenet"],
        ["simulate", "--model", "lenet", "--topology", "trinity", "--plan", "dp"],
        ["search", "mcmc", "--model", "lenet", "--topology", "trinity"],
        ["frontier", "--model", "lenet"],
    ],
)
def test_every_simulating_command_takes_precision(command: list[str]) -> None:
    args = build_parser().parse_args([*command, "--precision", "fp16-mixed"])
    assert args.precision == "fp16-mixed"
    assert build_parser().parse_args(command).precision == "fp32"


def test_cli_precision_changes_time_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    results = {}
    for precision in ("fp32", "bf16-mixed"):
        # replayed CUDA graphs: the GPU's time alone (eager, this small model is bound by the host issuing
        # kernels, which autocast makes slower, not faster)
        argv = ["simulate", "--model", "llama", "--topology", "h100-2x8", "--plan", "dp", "--json"]
        argv += ["--execution-mode", "cuda_graphs"]
        assert main([*argv, "--precision", precision]) == 0
        results[precision] = json.loads(capsys.readouterr().out)
    # data parallelism moves gradients (and a few KB of int64 token ids, which keep their size):
    # bf16 halves them; compute runs at 989 instead of 67 TFLOP/s
    assert results["bf16-mixed"]["comm_bytes"] == pytest.approx(results["fp32"]["comm_bytes"] / 2, rel=1e-4)
    assert results["bf16-mixed"]["makespan_s"] < results["fp32"]["makespan_s"]
    # the same parameter state (16 bytes per element) and half the activation bytes
    peaks = {p: max(r["peak_memory_bytes"].values()) for p, r in results.items()}
    assert peaks["bf16-mixed"] < peaks["fp32"]


def test_cli_rejects_bad_precisions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--model", "lenet", "--topology", "trinity", "--plan", "dp", "--precision", "bf16"]) == 2
    assert "unknown precision 'bf16'; expected one of: bf16-mixed, fp16-mixed, fp32, tf32" in capsys.readouterr().err
    _pair(peaks=()).to_json(tmp_path / "fp32-only.json")
    argv = ["simulate", "--model", "lenet", "--topology", str(tmp_path / "fp32-only.json"), "--plan", "dp"]
    assert main([*argv, "--precision", "bf16-mixed"]) == 2
    assert "error: precision 'bf16-mixed' computes in bf16, but device 'g0'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- Llama-7B
def _tensor_parallel(graph: OpGraph, topology: DeviceTopology) -> Plan:
    """Megatron-style: ops with a parameter dimension split it over each machine's GPUs (the batch over
    machines); every other op splits the batch over all GPUs; ops without a batch run everywhere."""
    devices = [d.name for d in topology.devices]  # machine-major: a machine's GPUs are consecutive
    machines = len(topology.machines())
    configs = {}
    for op in graph.ops:
        parameter = next((d for d in op.parallel_dims if d.kind == "parameter"), None)
        sample = op.sample_dim
        if parameter is not None and sample is not None:
            # partition (s, c) -> devices[s * per_machine + c]: parameter shards within one machine
            configs[op.name] = OpConfig.make(devices, {sample.name: machines, parameter.name: len(devices) // machines})
        elif sample is not None:
            configs[op.name] = OpConfig.make(devices, {sample.name: len(devices)})
        else:
            configs[op.name] = OpConfig.make(devices)
    return Plan(graph.name, configs, name="tensor_parallel")


@pytest.mark.slow  # imports the 7B graph (about 8 s on a loaded 2-core machine)
def test_llama_7b_bf16_mixed_needs_sharding_on_h100s() -> None:
    graph = zoo.load("llama_7b")  # batch 16: one 2048-token sequence per GPU
    topology = load_preset("h100-2x8")
    cost = CostModel(precision="bf16-mixed")
    state_gib = 6_738_415_616 * 16 / GIB  # 100.4 GiB of weights, gradients, master weights and moments
    dp = simulate(graph, topology, data_parallel(graph, topology), cost)
    assert dp.oom and len(dp.oom_devices) == 16
    assert min(dp.peak_memory_bytes) / GIB > state_gib > 80
    sharded = simulate(graph, topology, _tensor_parallel(graph, topology), cost)
    assert not sharded.oom and max(sharded.peak_memory_bytes) < 80 * GIB
    # in fp32 the same plan's activations (twice as large) no longer fit, and DP is 3x slower
    fp32 = CostModel()
    assert simulate(graph, topology, _tensor_parallel(graph, topology), fp32).oom
    assert simulate(graph, topology, data_parallel(graph, topology), fp32).makespan_s > 2 * dp.makespan_s

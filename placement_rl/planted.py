"""Planted instances: graphs x clusters built so that a known, hand-built plan is much better than
every baseline, to check whether the searches and agents find a good plan when there is one.

Each *kind* (:data:`KINDS`) is a way for data parallelism and the other baselines
(:data:`placement_rl.methods.BASELINES`) to go wrong, with the plan a person would write instead:

===================  =========================================================================
kind                 the instance and its planted plan
===================  =========================================================================
``slow_links_fc``    a CNN with a deep, wide fully-connected head on single-GPU machines over
                     10 Gb/s; the convolutions data parallel, the whole head on one GPU
``mixed_gpus``       ResNet-50 on a machine of fast NVLink GPUs and machines of slow GPUs over
                     slow Ethernet; data parallelism on the fast machine only
``recurrent_shared`` an LSTM language model (each layer's steps share one weight) on single-GPU
                     machines; one machine per layer (embedding with the first, the softmax
                     classifier on the last), pipelined over the steps, no weight synchronized
``fits_only_split``  a Llama whose data-parallel plan does not fit; a pipeline stage per NVLink
                     machine, data parallel with ZeRO-1 inside it
``pipeline_deep``    a deep Llama on single-GPU machines over slow links; one pipeline stage per
                     machine with micro-batches (only activations cross the network)
``straggler``        ResNet-50 on one machine with one old GPU among fast ones; data
                     parallelism without the straggler
``embedding_heavy``  a token model whose embedding table holds nearly all parameters, on one PCIe
                     machine; the table's columns sharded over the GPUs, the rest data parallel
``zero_fit``         a Wide ResNet whose data-parallel optimizer state does not fit; data
                     parallelism with ZeRO-1
===================  =========================================================================

:func:`build_instance` builds one instance and checks it: the planted plan must validate, fit in
memory and be at least :data:`DEFAULT_MARGIN` times faster than every baseline that fits, judged by
the project's default cost model as :func:`placement_rl.methods.compare_methods` judges it;
otherwise it raises :class:`PlantedError` naming the instance and the figures. ``variant = 0`` is the
instance as designed; every other variant draws the kind's sizes, link speeds and device counts from
the kind's ranges with a generator seeded by ``(kind, variant)``: held-out instances of the same kind,
for checking that a search tuned on the designed ones generalizes. :func:`build_suite` builds one
instance per kind; :func:`draw` makes a variant without the check (training instances). The bound
of every instance is :func:`placement_rl.methods.compute_lower_bound_s`.

The graphs are small (at most a few hundred ops) so that one simulation takes well under a second.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.methods import BASELINES, baseline_plan, compute_lower_bound_s, memory_over_bytes
from placement_rl.ops import DENSE_OPS, RECURRENT_OPS
from placement_rl.plan import OpConfig, Plan, data_parallel, megatron, zero
from placement_rl.sim import CostModel, SimContext, SimResult
from placement_rl.topology import DeviceTopology
from placement_rl.topology.builder import TopologyBuilder, switched_machine
from placement_rl.topology.devices import PCIE3_X16_BYTES_PER_S, gbit_to_bytes_per_s, make_device

#: How many times faster than every baseline that fits a planted plan must be.
DEFAULT_MARGIN = 1.5
#: NVLink between the GPUs of a machine that has it, bytes/s per direction (NVLink 2.0, as the presets).
_NVLINK_BYTES_PER_S = 25e9


class PlantedError(ValueError):
    """A planted instance whose planted plan does not validate, does not fit in memory, or is not
    the stated margin faster than every baseline (the message names the instance and the figures)."""


@dataclass(frozen=True)
class PlantedInstance:
    """One planted instance, checked (see the module docstring).

    Attributes:
        name: ``<kind>`` for the designed instance, ``<kind>/v<variant>`` for a held-out one.
        kind: its kind (a key of :data:`KINDS`).
        variant: 0 for the designed instance, else the seed of the held-out one.
        description: one line: the model, the cluster and the planted plan, with their sizes.
        graph: the op graph.
        topology: the cluster.
        plan: the planted plan (passes ``plan.validate(graph, topology)``).
        planted_makespan_s: the planted plan's simulated iteration time (default cost model).
        lower_bound_s: the heterogeneity-aware compute bound ``1 / sum_d (1 / T_type(d))``
            (:func:`~placement_rl.methods.compute_lower_bound_s`).
        baseline_makespans_s: each baseline's simulated iteration time, by name (also those that
            do not fit, see ``baseline_oom``).
        baseline_oom: the baselines whose plan does not fit in memory (they do not compete).
        margin: the factor the planted plan was checked to be faster by than every baseline that fits.
    """

    name: str
    kind: str
    variant: int
    description: str
    graph: OpGraph
    topology: DeviceTopology
    plan: Plan
    planted_makespan_s: float
    lower_bound_s: float
    baseline_makespans_s: Mapping[str, float] = field(default_factory=dict)
    baseline_oom: frozenset[str] = frozenset()
    margin: float = DEFAULT_MARGIN

    def speed_ratio(self, makespan_s: float) -> float:
        """A plan's speed relative to the planted plan's: ``planted_makespan_s / makespan_s``
        (1: as fast; above 1: faster; 0 for an infinite makespan)."""
        return self.planted_makespan_s / makespan_s if makespan_s > 0 else math.inf

    @property
    def best_baseline(self) -> tuple[str, float] | None:
        """``(name, makespan_s)`` of the fastest baseline that fits; ``None`` when none fits."""
        fitting = [(m, b) for b, m in self.baseline_makespans_s.items() if b not in self.baseline_oom]
        if not fitting:
            return None
        makespan_s, name = min(fitting)
        return name, makespan_s

    @property
    def planted_speedup(self) -> float:
        """How many times faster the planted plan is than the fastest baseline that fits (``inf``
        when none fits)."""
        best = self.best_baseline
        return math.inf if best is None else best[1] / self.planted_makespan_s


@dataclass(frozen=True)
class _Spec:
    """What a kind's builder makes: the instance before it is checked."""

    description: str
    graph: OpGraph
    topology: DeviceTopology
    plan: Plan


@dataclass(frozen=True)
class PlantedKind:
    """One kind of planted instance.

    Attributes:
        name: the kind's name.
        summary: one line: what goes wrong for the baselines and what the planted plan does.
        build: ``build(rng) -> _Spec``; ``rng`` is ``None`` for the designed instance, else the
            generator that draws a held-out instance's parameters.
    """

    name: str
    summary: str
    build: Callable[[random.Random | None], _Spec]


# ---------------------------------------------------------------------------------------- helpers
def _pick(rng: random.Random | None, designed: Any, choices: Iterable[Any]) -> Any:
    """``designed`` for the designed instance, else one of ``choices`` drawn from ``rng``."""
    return designed if rng is None else rng.choice(list(choices))


def _cluster(
    name: str,
    machines: Iterable[tuple[str, int]],
    link_gbit_per_s: float,
    *,
    nvlink: bool = False,
    memory_bytes: int | None = None,
) -> DeviceTopology:
    """Machines ``(device type, GPUs)`` on their PCIe switches (NVLink between the GPUs of a machine
    where ``nvlink`` and it has more than one), every switch joined to one Ethernet switch at
    ``link_gbit_per_s``."""
    b = TopologyBuilder()
    uplink = (b.switch("eth-switch"), gbit_to_bytes_per_s(link_gbit_per_s), "ethernet")
    for device_type, count in machines:
        nv = _NVLINK_BYTES_PER_S if nvlink and count > 1 else None
        switched_machine(b, device_type, count, uplink, nvlink_bytes_per_s=nv, memory_bytes=memory_bytes)  # type: ignore[arg-type]
    return b.build(name)


def _on(graph: OpGraph, assignment: Mapping[str, list[str]], name: str, **metadata: Any) -> Plan:
    """A plan running each op on its device list: split along its sample dimension over them where
    they divide it (data parallel), else replicated (one device: placed there)."""
    configs: dict[str, OpConfig] = {}
    for op in graph.ops:
        devices = assignment[op.name]
        dim = op.sample_dim
        if len(devices) > 1 and dim is not None and dim.size % len(devices) == 0:
            configs[op.name] = OpConfig.make(devices, {dim.name: len(devices)})
        else:
            configs[op.name] = OpConfig.make(devices)
    return Plan(graph.name, configs, name=name, metadata=dict(metadata))


def _import(module: nn.Module, inputs: tuple[Tensor, ...], name: str, meta: dict[str, Any]) -> OpGraph:
    from placement_rl.graph.importer import from_torch

    return from_torch(module, inputs, name=name, metadata=meta, tracer="fx", check_backward=False)


def _zoo(name: str, batch_size: int, **options: Any) -> OpGraph:
    from placement_rl import zoo

    return zoo.load(name, batch_size=batch_size, **options)


# ------------------------------------------------------------------------------------------ models
class _ConvNetWithWideHead(nn.Module):
    """3x3 convolutions with ReLU and 2x2 max pooling, global average pooling, then ``layers``
    fully-connected layers of ``width`` with ReLU and a classifier: few convolution weights and much
    convolution compute, many fully-connected weights and little fully-connected compute."""

    def __init__(self, channels: tuple[int, ...], width: int, layers: int, num_classes: int) -> None:
        super().__init__()
        features: list[nn.Module] = []
        c = 3
        for k in channels:
            features += [nn.Conv2d(c, k, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c = k
        features.append(nn.AdaptiveAvgPool2d(1))
        self.features = nn.Sequential(*features)
        head: list[nn.Module] = []
        for _ in range(layers):
            head += [nn.Linear(c, width), nn.ReLU()]
            c = width
        head.append(nn.Linear(c, num_classes))
        self.head = nn.Sequential(*head)
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, images: Tensor, target: Tensor) -> Tensor:
        return self.criterion(self.head(torch.flatten(self.features(images), 1)), target)


class _EmbeddingMlp(nn.Module):
    """Token embedding (``vocab x hidden``), a per-token MLP (``layers`` blocks ``hidden -> ffn ->
    hidden`` with ReLU), mean over the sequence and a classifier: the table holds nearly every weight."""

    def __init__(self, vocab_size: int, hidden: int, ffn: int, layers: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden)
        blocks: list[nn.Module] = []
        for _ in range(layers):
            blocks += [nn.Linear(hidden, ffn), nn.ReLU(), nn.Linear(ffn, hidden), nn.ReLU()]
        self.mlp = nn.Sequential(*blocks)
        self.classifier = nn.Linear(hidden, num_classes)
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, tokens: Tensor, target: Tensor) -> Tensor:
        x = self.mlp(self.embedding(tokens))
        return self.criterion(self.classifier(x.mean(dim=1)), target)


# ------------------------------------------------------------------------------------------- kinds
def _slow_links_fc(rng: random.Random | None) -> _Spec:
    machines = _pick(rng, 8, (8, 16))
    gbit = _pick(rng, 10, (5, 10))
    batch = _pick(rng, 256, (128, 256))
    width = _pick(rng, 4096, (4096, 3072))
    layers = _pick(rng, 6, (4, 6, 8))
    channels = (32, 64, 128)
    image = 128
    with torch.device("meta"):
        module = _ConvNetWithWideHead(channels, width, layers, 1000)
    images = torch.empty(batch, 3, image, image, device="meta")
    target = torch.empty(batch, dtype=torch.int64, device="meta")
    graph = _import(module, (images, target), "cnn_wide_head", {"channels": channels, "width": width, "layers": layers})
    topo = _cluster(f"{machines}x1-V100-{gbit}g", [("V100-SXM2-16GB", 1)] * machines, gbit)
    devices = [d.name for d in topo.devices]
    head_from = next(i for i, op in enumerate(graph.ops) if op.op_type in DENSE_OPS) - 1  # from the flatten on
    assignment = {op.name: (devices if i < head_from else devices[:1]) for i, op in enumerate(graph.ops)}
    params_m = graph.param_bytes / 4e6
    description = (
        f"CNN (convs {'-'.join(map(str, channels))} on {image}px, then {layers} FC layers of {width}; {params_m:.0f}M "
        f"params) at batch {batch} on {machines} single-V100 machines over {gbit} Gb/s; planted: the convolutions data "
        "parallel on every GPU, the whole FC head on one GPU"
    )
    return _Spec(description, graph, topo, _on(graph, assignment, "planted_fc_head_on_one_gpu"))


def _mixed_gpus(rng: random.Random | None) -> _Spec:
    fast_type = _pick(rng, "V100-SXM2-16GB", ("V100-SXM2-16GB", "V100-SXM2-32GB", "A100-SXM4-40GB"))
    slow_type = "K80"
    slow_machines = _pick(rng, 2, (1, 2))
    gbit = _pick(rng, 10, (5, 10))
    batch = (4 + 2 * slow_machines) * _pick(rng, 16, (12, 16))  # every device gets the same share
    graph = _zoo("resnet50", batch)
    machines = [(fast_type, 4)] + [(slow_type, 2)] * slow_machines
    topo = _cluster(f"4x{fast_type}+{2 * slow_machines}x{slow_type}-{gbit}g", machines, gbit, nvlink=True)
    fast = [d.name for d in topo.devices if d.machine == "m0"]
    plan = data_parallel(graph, topo, fast)
    description = (
        f"ResNet-50 at batch {batch} on one machine of 4 NVLink {fast_type} and {slow_machines} machines of 2 "
        f"{slow_type} over {gbit} Gb/s; planted: data parallelism on the fast machine only"
    )
    return _Spec(description, graph, topo, Plan(graph.name, dict(plan.configs), name="planted_fast_machine_dp"))


def _recurrent_shared(rng: random.Random | None) -> _Spec:
    layers = _pick(rng, 3, (2, 3))
    steps = _pick(rng, 20, (10, 20))
    batch = (layers + 1) * _pick(rng, 32, (16, 32))
    hidden = _pick(rng, 1024, (768, 1024))
    gbit = _pick(rng, 10, (10, 25))
    graph = _zoo("rnnlm", batch, num_layers=layers, hidden=hidden, steps=steps)
    topo = _cluster(f"{layers + 1}x1-V100-{gbit}g", [("V100-SXM2-16GB", 1)] * (layers + 1), gbit)
    devices = [d.name for d in topo.devices]
    # The stage of an op: its LSTM layer (the ops before the first layer with it, the ones after a
    # layer with that layer), the classifier and everything after it on the last machine.
    stage_of_key: dict[str, int] = {}
    stage = 0
    assignment: dict[str, list[str]] = {}
    for op in graph.ops:
        if op.op_type in RECURRENT_OPS and op.param_key is not None:
            stage = stage_of_key.setdefault(op.param_key, len(stage_of_key))
        elif op.op_type in DENSE_OPS:
            stage = layers
        assignment[op.name] = [devices[stage]]
    description = (
        f"RNNLM ({layers} LSTM layers of {hidden}, {steps} steps, vocab 10000) at batch {batch} on {layers + 1} "
        f"single-V100 machines over {gbit} Gb/s; planted: one machine per LSTM layer (embedding with the first), the "
        "classifier on the last, pipelined over the steps with no weight synchronized"
    )
    return _Spec(description, graph, topo, _on(graph, assignment, "planted_layer_per_machine"))


def _fits_only_split(rng: random.Random | None) -> _Spec:
    machines = _pick(rng, 2, (2, 4))
    layers = _pick(rng, 4, (6, 8))
    batch = _pick(rng, 16, (8, 16))
    gbit = _pick(rng, 10, (10, 25))
    graph = _zoo(
        "llama",
        batch,
        num_layers=layers,
        hidden=4096,
        heads=32,
        kv_heads=8,
        intermediate=11008,
        vocab_size=32000,
        seq_len=512,
    )
    topo = _cluster(f"{machines}x4-V100-16GB-{gbit}g", [("V100-SXM2-16GB", 4)] * machines, gbit, nvlink=True)
    # one sequence per micro-batch and replica: the smallest activations in flight, the most overlap
    micro = batch // 4
    plan = megatron(graph, topo, tp=1, pp=machines, dp=4, micro_batches=micro, zero_stage=1)
    params_b = graph.param_bytes / 4e9
    description = (
        f"Llama ({layers} layers of 4096, {params_b:.2f}B params, seq 512) at batch {batch} on {machines} machines of "
        f"4 NVLink V100-16GB over {gbit} Gb/s (data parallelism does not fit); planted: one pipeline stage per "
        f"machine (1F1B, {micro} micro-batches), data parallel with ZeRO-1 over the 4 GPUs inside each"
    )
    return _Spec(description, graph, topo, plan)


def _pipeline_deep(rng: random.Random | None) -> _Spec:
    machines = _pick(rng, 8, (6, 8))
    gbit = _pick(rng, 10, (5, 10))
    batch = machines * _pick(rng, 4, (4, 8))
    layers = machines
    graph = _zoo(
        "llama",
        batch,
        num_layers=layers,
        hidden=2048,
        heads=16,
        kv_heads=16,
        intermediate=5632,
        vocab_size=8000,
        seq_len=256,
    )
    topo = _cluster(f"{machines}x1-V100-{gbit}g", [("V100-SXM2-16GB", 1)] * machines, gbit)
    micro = 4 * machines  # a micro-batch per sample at the designed batch: the smallest pipeline bubble
    plan = megatron(graph, topo, tp=1, pp=machines, dp=1, micro_batches=micro)
    description = (
        f"Llama ({layers} layers of 2048, seq 256, vocab 8000) at batch {batch} on {machines} single-V100 machines "
        f"over {gbit} Gb/s; planted: one pipeline stage per machine (cut between layers), 1F1B, {micro} micro-batches"
    )
    return _Spec(description, graph, topo, plan)


def _straggler(rng: random.Random | None) -> _Spec:
    fast_count = _pick(rng, 7, (3, 5, 7))
    fast_type = _pick(rng, "V100-SXM2-16GB", ("V100-SXM2-16GB", "V100-SXM2-32GB", "A100-SXM4-40GB"))
    slow_type = "K80"
    pair = math.lcm(fast_count, fast_count + 1)  # a batch every GPU divides, with or without the straggler
    batch = pair * max(round(32 * fast_count / pair), 1)
    graph = _zoo("resnet50", batch)
    b = TopologyBuilder()
    machine, gpus = b.machine(fast_type, fast_count)
    straggler = f"{machine}/gpu{fast_count}"
    b.devices.append(make_device(straggler, slow_type, machine))
    b.fully_connected(gpus, _NVLINK_BYTES_PER_S, "nvlink")
    b.star(b.switch(f"{machine}/pcie"), [*gpus, straggler], PCIE3_X16_BYTES_PER_S, "pcie")
    topo = b.build(f"{fast_count}x{fast_type}+1x{slow_type}")
    plan = data_parallel(graph, topo, gpus)
    description = (
        f"ResNet-50 at batch {batch} on one machine of {fast_count} NVLink {fast_type} and one {slow_type} on PCIe; "
        "planted: data parallelism without the straggler"
    )
    return _Spec(description, graph, topo, Plan(graph.name, dict(plan.configs), name="planted_without_straggler"))


def _embedding_heavy(rng: random.Random | None) -> _Spec:
    vocab = _pick(rng, 1_000_000, (1_000_000, 1_500_000))
    gpus = _pick(rng, 8, (4, 8))
    batch = _pick(rng, 512, (256, 512))
    ffn = _pick(rng, 2048, (2048, 3072))
    hidden, layers, seq = 256, 4, 64
    with torch.device("meta"):
        module = _EmbeddingMlp(vocab, hidden, ffn, layers, 1000)
    tokens = torch.empty(batch, seq, dtype=torch.int64, device="meta")
    target = torch.empty(batch, dtype=torch.int64, device="meta")
    graph = _import(module, (tokens, target), "embedding_mlp", {"vocab_size": vocab, "hidden": hidden, "ffn": ffn})
    b = TopologyBuilder()
    switched_machine(b, "V100-SXM2-16GB", gpus, None)
    topo = b.build(f"1x{gpus}-V100-pcie")
    devices = [d.name for d in topo.devices]
    plan = _on(graph, {op.name: devices for op in graph.ops}, "planted_sharded_embedding")
    # the table's columns sharded over every GPU (each holds vocab x hidden / n, nothing synchronized);
    # its output goes from column shards to batch shards, a few MB where the gradient is a GB
    column = next(d.name for d in graph.op("embedding").parallel_dims if d.kind == "parameter")
    configs = {**plan.configs, "embedding": OpConfig.make(devices, {column: gpus})}
    description = (
        f"token classifier: embedding {vocab:,} x {hidden} ({vocab * hidden / 1e6:.0f}M params), {layers} per-token "
        f"MLP blocks of {ffn}, seq {seq}, batch {batch} on one machine of {gpus} V100 on PCIe; planted: the embedding "
        "table's columns sharded over the GPUs (nothing synchronized), the rest data parallel"
    )
    return _Spec(description, graph, topo, Plan(graph.name, configs, name=plan.name))


def _zero_fit(rng: random.Random | None) -> _Spec:
    gpus = _pick(rng, 8, (4, 8))
    batch = _pick(rng, 128, (128, 160)) if gpus == 8 else _pick(rng, 64, (64, 96))
    graph = _zoo("wideresnet", batch)
    topo = _cluster(f"1x{gpus}-V100-32GB", [("V100-SXM2-32GB", gpus)], 100, nvlink=True)
    plan = zero(graph, data_parallel(graph, topo), 1)
    description = (
        f"Wide ResNet-50 (1.82B params) at batch {batch} on one machine of {gpus} NVLink V100-32GB (the data-parallel "
        "optimizer state does not fit); planted: data parallelism with ZeRO-1"
    )
    planted = Plan(graph.name, dict(plan.configs), name="planted_zero1", metadata=dict(plan.metadata))
    return _Spec(description, graph, topo, planted)


#: The kinds of planted instance, by name, in the order :func:`build_suite` builds them.
KINDS: dict[str, PlantedKind] = {
    k.name: k
    for k in (
        PlantedKind(
            "slow_links_fc", "parameter-heavy FC head over slow links: convs DP, the head on one GPU", _slow_links_fc
        ),
        PlantedKind("mixed_gpus", "fast and slow GPU types over slow links: DP on the fast machine", _mixed_gpus),
        PlantedKind(
            "recurrent_shared", "LSTM layers sharing weights over steps: a machine per layer", _recurrent_shared
        ),
        PlantedKind(
            "fits_only_split", "DP does not fit: a pipeline stage per machine, ZeRO-1 DP in it", _fits_only_split
        ),
        PlantedKind("pipeline_deep", "deep model over slow links: a pipeline stage per machine", _pipeline_deep),
        PlantedKind("straggler", "one slow GPU among fast ones: DP without it", _straggler),
        PlantedKind(
            "embedding_heavy",
            "an embedding table holding most weights: its columns sharded over the GPUs",
            _embedding_heavy,
        ),
        PlantedKind("zero_fit", "DP's optimizer state does not fit: DP with ZeRO-1", _zero_fit),
    )
}


def kind_names() -> list[str]:
    """The kinds' names, in suite order."""
    return list(KINDS)


def get_kind(name: str) -> PlantedKind:
    """The kind called ``name``; :class:`UnknownNameError` listing the kinds otherwise."""
    if name not in KINDS:
        raise UnknownNameError("planted kind", name, KINDS)
    return KINDS[name]


# ------------------------------------------------------------------------------------- building
def instance_name(kind: str, variant: int = 0) -> str:
    """``kind`` for the designed instance, ``kind/v<variant>`` for a held-out one."""
    return kind if variant == 0 else f"{kind}/v{variant}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def check_instance(
    name: str,
    kind: str,
    variant: int,
    description: str,
    graph: OpGraph,
    topology: DeviceTopology,
    plan: Plan,
    *,
    cost_model: CostModel | None = None,
    margin: float = DEFAULT_MARGIN,
) -> PlantedInstance:
    """Check a planted plan against the baselines and return the instance (see :func:`build_instance`).

    Raises:
        PlantedError: naming ``name`` and the figures, when the plan does not validate, does not fit
            in memory, or some baseline that fits is less than ``margin`` times slower than it.
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 1:
        raise ValueError(f"margin = {margin!r}; expected a number >= 1")
    try:
        plan.validate(graph, topology)
    except ValueError as exc:
        raise PlantedError(
            f"planted instance {name!r}: the planted plan {plan.name!r} does not validate: {exc}"
        ) from exc
    ctx = SimContext(graph, topology, cost_model)
    planted = ctx.simulate(plan, validate=False)
    if planted.oom:
        raise PlantedError(
            f"planted instance {name!r}: the planted plan {plan.name!r} does not fit in memory: "
            f"{memory_over_bytes(planted) / 2**30:.2f} GiB over on {', '.join(planted.oom_devices)}"
        )
    results: dict[str, SimResult] = {
        b: ctx.simulate(baseline_plan(b, graph, topology), validate=False) for b in BASELINES
    }
    for b, result in results.items():
        if not result.oom and result.makespan_s < margin * planted.makespan_s:
            raise PlantedError(
                f"planted instance {name!r}: the planted plan {plan.name!r} ({_ms(planted.makespan_s)}) is only "
                f"{result.makespan_s / planted.makespan_s:.2f}x faster than baseline {b!r} "
                f"({_ms(result.makespan_s)}); expected at least {margin:g}x"
            )
    return PlantedInstance(
        name=name,
        kind=kind,
        variant=variant,
        description=description,
        graph=graph,
        topology=topology,
        plan=plan,
        planted_makespan_s=planted.makespan_s,
        lower_bound_s=compute_lower_bound_s(ctx),
        baseline_makespans_s={b: r.makespan_s for b, r in results.items()},
        baseline_oom=frozenset(b for b, r in results.items() if r.oom),
        margin=float(margin),
    )


def draw(kind: str, variant: int = 0) -> _Spec:
    """The graph, cluster and planted plan of ``kind``'s ``variant``, unchecked (:func:`build_instance`
    checks them): the designed instance for 0, else the kind's parameters drawn with a generator
    seeded by ``(kind, variant)``.

    Raises:
        UnknownNameError: for an unknown kind (the message lists the kinds).
        ValueError: for a variant that is not an integer >= 0.
    """
    spec = get_kind(kind)
    if isinstance(variant, bool) or not isinstance(variant, int) or variant < 0:
        raise ValueError(f"variant = {variant!r}; expected an integer >= 0 (0: the designed instance)")
    return spec.build(None if variant == 0 else random.Random(f"{kind}/{variant}"))


def build_instance(
    kind: str, variant: int = 0, *, cost_model: CostModel | None = None, margin: float = DEFAULT_MARGIN
) -> PlantedInstance:
    """Build and check one planted instance.

    Args:
        kind: a kind's name (:data:`KINDS`).
        variant: 0: the designed instance; any other integer: a held-out instance of the same kind
            whose sizes, link speeds and device counts are drawn from the kind's ranges with a
            generator seeded by ``(kind, variant)`` (the same variant always builds the same instance).
        cost_model: the judge (default: the project's default cost model, as ``compare`` uses).
        margin: how many times faster than every baseline that fits the planted plan must be.

    Raises:
        UnknownNameError: for an unknown kind (the message lists the kinds).
        PlantedError: when the planted plan does not validate, does not fit in memory, or is not
            ``margin`` times faster than every baseline that fits (the message names the instance
            and the figures).
    """
    made = draw(kind, variant)
    return check_instance(
        instance_name(kind, variant),
        kind,
        variant,
        made.description,
        made.graph,
        made.topology,
        made.plan,
        cost_model=cost_model,
        margin=margin,
    )


def build_suite(
    names: Iterable[str] | None = None,
    *,
    variant: int = 0,
    cost_model: CostModel | None = None,
    margin: float = DEFAULT_MARGIN,
) -> list[PlantedInstance]:
    """One checked instance per kind (default: every kind, in :data:`KINDS` order).

    Args:
        names: kind names, or one kind name as a string (``"straggler"``); every name is checked before
            anything is built.
        variant: 0 for the designed instances, else the held-out variant (:func:`build_instance`).
        cost_model: the judge (default cost model when ``None``).
        margin: the factor every planted plan must beat every baseline by.

    Raises:
        UnknownNameError: for an unknown kind name (the message lists the kinds).
        ValueError: for ``names`` that is neither a string nor an iterable of strings.
        PlantedError: for the first instance whose planted plan fails its check.
    """
    if names is None:
        chosen = list(KINDS)
    elif isinstance(names, str):  # one kind, not its letters
        chosen = [names]
    elif isinstance(names, (bytes, Mapping)) or not isinstance(names, Iterable):
        raise ValueError(f"names = {names!r}; expected a kind name or a list of them, among {list(KINDS)}")
    else:
        chosen = list(names)
    for name in chosen:
        if not isinstance(name, str):
            raise ValueError(f"names: {name!r} is not a kind name; expected names among {list(KINDS)}")
        get_kind(name)
    return [build_instance(k, variant, cost_model=cost_model, margin=margin) for k in chosen]


__all__ = [
    "DEFAULT_MARGIN",
    "KINDS",
    "PlantedError",
    "PlantedInstance",
    "PlantedKind",
    "build_instance",
    "build_suite",
    "check_instance",
    "get_kind",
    "instance_name",
    "kind_names",
]

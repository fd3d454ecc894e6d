"""Communication patterns: timed on the emulated cluster, and the same patterns simulated.

A :class:`Pattern` is either

* a small DAG of **steps** joined by **messages**: a step runs on one device, waits for its incoming
  messages, computes for ``compute_s`` seconds (a sleep in the emulation) and then sends its outgoing
  messages, all at once; a device runs its steps one after another in the order given; or
* one **all-reduce** of ``all_reduce_bytes`` over devices, gloo's own ``all_reduce`` in the emulation.

:func:`simulation_inputs` expresses a pattern as what :func:`placement_rl.simulate` takes: a step is an
op placed on its device, a message a tensor of its bytes between two ops, and a :class:`ProfileTable`
gives each op its compute time (an entry per op, keyed by a distinct output shape). Consecutive steps
of one device get an ordering tensor, so the simulator runs them in the emulation's order. An
all-reduce is one op with ``all_reduce_bytes`` of parameters replicated on its devices, which the
simulator synchronizes with its ring all-reduce. The simulator also simulates backward, which a
pattern does not have: every step's backward is parked :data:`PARKED_BACKWARD_S` later, and a pattern's
simulated time is the end of its last forward, transfer or all-reduce task (:func:`simulate_pattern`).

The catalogue (:func:`pattern_names`, :func:`patterns_for`) builds each pattern for any topology it
applies to; builders register by name (:func:`register_pattern`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placement_rl.errors import UnknownNameError
from placement_rl.graph import Op, OpGraph, Tensor
from placement_rl.plan import OpConfig, Plan
from placement_rl.sim import TASK_KINDS, CostModel, ProfileTable, simulate
from placement_rl.sim.cost import ProfileEntry
from placement_rl.topology import DeviceTopology

#: Backward time of every step: far beyond any pattern, so no gradient transfer overlaps the pattern.
PARKED_BACKWARD_S = 1e4

#: The model today's simulator implements when ``CostModel`` has no ``network`` field.
LEGACY_NETWORK_MODEL = "circuit"

_TIMED_KINDS = tuple(TASK_KINDS.index(k) for k in ("forward", "transfer", "all_reduce"))
_OP_TYPE = "identity"


@dataclass(frozen=True)
class Step:
    """One step of a pattern: on ``device``, after its incoming messages, compute ``compute_s`` seconds."""

    name: str
    device: str
    compute_s: float = 0.0


@dataclass(frozen=True)
class Message:
    """``num_bytes`` sent from step ``src`` (when it has computed) to step ``dst``; between two steps of
    one device it only orders them."""

    src: str
    dst: str
    num_bytes: int


@dataclass(frozen=True)
class Pattern:
    """A communication pattern (module docstring).

    Attributes:
        name: a short name, unique in the catalogue.
        description: what it exercises, for the table.
        steps: the steps in an order that is topological for the messages.
        messages: the messages between steps.
        all_reduce_devices: for an all-reduce pattern, its devices in ring order (then no steps).
        all_reduce_bytes: the all-reduced bytes (a multiple of 4: float32 elements).
    """

    name: str
    description: str
    steps: tuple[Step, ...] = ()
    messages: tuple[Message, ...] = ()
    all_reduce_devices: tuple[str, ...] = ()
    all_reduce_bytes: int = 0

    @property
    def kind(self) -> str:
        """``"all_reduce"`` or ``"dag"``."""
        return "all_reduce" if self.all_reduce_devices else "dag"

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices the pattern uses, in first-use order."""
        return tuple(dict.fromkeys((*self.all_reduce_devices, *(s.device for s in self.steps))))

    def check(self, topology: DeviceTopology) -> None:
        """Check the pattern against a topology.

        Raises:
            ValueError: naming the step, message or value that is wrong.
        """
        where = f"pattern {self.name!r}"
        for device in self.devices:
            topology.device(device)
        if self.kind == "all_reduce":
            if self.steps or self.messages:
                raise ValueError(f"{where}: an all-reduce pattern has no steps or messages")
            if len(set(self.all_reduce_devices)) != len(self.all_reduce_devices) or len(self.all_reduce_devices) < 2:
                raise ValueError(f"{where}: all-reduce devices {self.all_reduce_devices}; expected 2 or more, distinct")
            _check_bytes(self.all_reduce_bytes, f"{where}: all_reduce_bytes")
            return
        position = {}
        for i, step in enumerate(self.steps):
            if step.name in position:
                raise ValueError(f"{where}: duplicate step name {step.name!r}")
            if not (step.compute_s >= 0 and np.isfinite(step.compute_s)):
                raise ValueError(f"{where}: step {step.name!r} compute_s = {step.compute_s!r}; expected >= 0")
            position[step.name] = i
        if not self.steps:
            raise ValueError(f"{where}: no steps")
        for m in self.messages:
            for end in (m.src, m.dst):
                if end not in position:
                    raise UnknownNameError(f"step of {where}", end, position)
            if position[m.src] >= position[m.dst]:
                raise ValueError(
                    f"{where}: message {m.src!r} -> {m.dst!r} goes backwards; list steps in topological order"
                )
            if self.steps[position[m.src]].device != self.steps[position[m.dst]].device:
                _check_bytes(m.num_bytes, f"{where}: message {m.src!r} -> {m.dst!r}")

    def worker_spec(self, rank: Mapping[str, int]) -> dict[str, Any]:
        """The pattern as the worker reads it (devices replaced by ranks, steps and messages by index)."""
        if self.kind == "all_reduce":
            return {
                "name": self.name,
                "kind": "all_reduce",
                "ranks": [rank[d] for d in self.all_reduce_devices],
                "num_bytes": self.all_reduce_bytes,
            }
        index = {s.name: i for i, s in enumerate(self.steps)}
        return {
            "name": self.name,
            "kind": "dag",
            "steps": [{"rank": rank[s.device], "compute_s": s.compute_s} for s in self.steps],
            "messages": [
                {"src": index[m.src], "dst": index[m.dst], "num_bytes": m.num_bytes}
                for m in self.messages
                if self.steps[index[m.src]].device != self.steps[index[m.dst]].device
            ],
        }


def _check_bytes(value: int, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % 4:
        raise ValueError(f"{where} = {value!r}; expected a positive multiple of 4 bytes (float32 elements)")


# --------------------------------------------------------------------------------------- simulation
def simulation_inputs(pattern: Pattern, topology: DeviceTopology) -> tuple[OpGraph, Plan, ProfileTable]:
    """The graph, plan and profile that make :func:`placement_rl.simulate` run ``pattern`` (module docstring)."""
    pattern.check(topology)
    device_type = {d.name: d.device_type for d in topology.devices}
    entries: dict[tuple[str, str, tuple[int, ...], int], ProfileEntry] = {}
    if pattern.kind == "all_reduce":
        op = Op("all_reduce", _OP_TYPE, ((1,),), param_bytes=pattern.all_reduce_bytes, param_key="all_reduce")
        graph = OpGraph(pattern.name, [op], [])
        configs = {op.name: OpConfig.make(pattern.all_reduce_devices)}
        for d in pattern.all_reduce_devices:
            entries[device_type[d], _OP_TYPE, (1,), pattern.all_reduce_bytes] = ProfileEntry(0.0, 0.0)
    else:
        ops = [Op(s.name, _OP_TYPE, ((i + 1,),)) for i, s in enumerate(pattern.steps)]
        tensors = [Tensor(m.src, m.dst, (m.num_bytes // 4,), m.num_bytes) for m in pattern.messages]
        linked = {(m.src, m.dst) for m in pattern.messages}
        last: dict[str, str] = {}
        for s in pattern.steps:
            previous = last.get(s.device)
            if previous is not None and (previous, s.name) not in linked:
                tensors.append(Tensor(previous, s.name, (0,), 0))  # same device: an ordering, no transfer
            last[s.device] = s.name
        graph = OpGraph(pattern.name, ops, tensors)
        configs = {s.name: OpConfig.make(s.device) for s in pattern.steps}
        for i, s in enumerate(pattern.steps):
            entries[device_type[s.device], _OP_TYPE, (i + 1,), 0] = ProfileEntry(s.compute_s, PARKED_BACKWARD_S)
    return graph, Plan(graph.name, configs, name=pattern.name), ProfileTable(entries, device="emulated")


def network_models() -> tuple[str, ...]:
    """The network models this simulator offers, in its registry's order: the names of
    ``placement_rl.sim.network.NETWORK_MODELS`` once ``CostModel`` has a ``network`` field, else today's
    one model (:data:`LEGACY_NETWORK_MODEL`)."""
    if not _has_network_field():
        return (LEGACY_NETWORK_MODEL,)
    from placement_rl.sim import network

    return tuple(getattr(network, "NETWORK_MODELS", {LEGACY_NETWORK_MODEL: None}))


def _has_network_field() -> bool:
    return "network" in {f.name for f in dataclasses.fields(CostModel)}


def cost_model(profile: ProfileTable, network: str) -> CostModel:
    """The flat cost model (no calibration: a step takes exactly its profiled time, and no host lane
    issues it) with ``profile`` and, where ``CostModel`` has the field, ``network``."""
    options: dict[str, Any] = {"profile": profile}
    if "calibration" in {f.name for f in dataclasses.fields(CostModel)}:
        options["calibration"] = None
    if _has_network_field():
        options["network"] = network
    elif network != LEGACY_NETWORK_MODEL:
        raise UnknownNameError("network model of this simulator", network, [LEGACY_NETWORK_MODEL])
    return CostModel(**options)


def simulate_pattern(pattern: Pattern, topology: DeviceTopology, network: str = LEGACY_NETWORK_MODEL) -> float:
    """Simulated seconds from the start of ``pattern`` to the end of its last transfer, step or all-reduce."""
    graph, plan, profile = simulation_inputs(pattern, topology)
    tasks = simulate(graph, topology, plan, cost_model(profile, network)).tasks
    timed = np.isin(tasks.kind, _TIMED_KINDS)
    return float(tasks.end_s[timed].max()) if timed.any() else 0.0


# ---------------------------------------------------------------------------------------- catalogue
@dataclass(frozen=True)
class Sizes:
    """What the catalogue's patterns move and compute.

    Attributes:
        message_bytes: a point-to-point message; other patterns use fractions of it (a multiple of 256).
        compute_s: one forward step of the training-like patterns (backward takes twice as long).
    """

    message_bytes: int = 4 * 2**20
    compute_s: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.message_bytes, bool) or not isinstance(self.message_bytes, int):
            raise ValueError(f"message_bytes = {self.message_bytes!r}; expected an integer")
        if self.message_bytes < 1024 or self.message_bytes % 256:
            raise ValueError(f"message_bytes = {self.message_bytes}; expected a multiple of 256 bytes, at least 1 KiB")
        if not (self.compute_s >= 0 and np.isfinite(self.compute_s)):
            raise ValueError(f"compute_s = {self.compute_s!r}; expected a finite number >= 0")

    def fraction(self, divisor: int) -> int:
        """``message_bytes / divisor`` rounded down to whole float32 elements."""
        return max(4, self.message_bytes // divisor // 4 * 4)


PatternBuilder = Callable[[DeviceTopology, Sizes], Pattern | None]
_CATALOGUE: dict[str, PatternBuilder] = {}


def register_pattern(name: str) -> Callable[[PatternBuilder], PatternBuilder]:
    """Register a builder: ``builder(topology, sizes)`` returns the pattern, or ``None`` where it does not apply."""

    def add(builder: PatternBuilder) -> PatternBuilder:
        if name in _CATALOGUE:
            raise ValueError(f"pattern {name!r} is already registered")
        _CATALOGUE[name] = builder
        return builder

    return add


def pattern_names() -> list[str]:
    """The registered patterns, in table order."""
    return list(_CATALOGUE)


def patterns_for(
    topology: DeviceTopology, sizes: Sizes | None = None, names: Sequence[str] | None = None
) -> list[Pattern]:
    """The catalogue's patterns that apply to ``topology`` (those of ``names``, in catalogue order).

    Raises:
        UnknownNameError: for a name that is not registered.
    """
    sizes = sizes or Sizes()
    for name in names or ():
        if name not in _CATALOGUE:
            raise UnknownNameError("pattern", name, _CATALOGUE)
    wanted = set(names) if names is not None else set(_CATALOGUE)
    found = []
    for name, builder in _CATALOGUE.items():
        if name in wanted:
            pattern = builder(topology, sizes)
            if pattern is not None:
                pattern.check(topology)
                found.append(pattern)
    return found


def _machines(topology: DeviceTopology) -> list[list[str]]:
    return [[d.name for d in devices] for devices in topology.machines().values()]


def _transfers(name: str, description: str, pairs: Sequence[tuple[str, str]], num_bytes: int) -> Pattern:
    """Concurrent transfers: one sending step per source device, one receiving step per transfer."""
    sources = list(dict.fromkeys(src for src, _ in pairs))
    steps = [Step(f"send{i}", src) for i, src in enumerate(sources)]
    steps += [Step(f"recv{k}", dst) for k, (_, dst) in enumerate(pairs)]
    messages = [Message(f"send{sources.index(src)}", f"recv{k}", num_bytes) for k, (src, _) in enumerate(pairs)]
    return Pattern(name, description, tuple(steps), tuple(messages))


@register_pattern("p2p_intra")
def _p2p_intra(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    machine = next((m for m in _machines(topology) if len(m) > 1), None)
    if machine is None:
        return None
    return _transfers(
        "p2p_intra", f"{machine[0]} -> {machine[1]} (inside a machine)", [(machine[0], machine[1])], sizes.message_bytes
    )


@register_pattern("p2p_inter")
def _p2p_inter(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    machines = _machines(topology)
    if len(machines) < 2:
        return None
    a, b = machines[0][0], machines[1][0]
    return _transfers("p2p_inter", f"{a} -> {b} (between machines)", [(a, b)], sizes.message_bytes)


@register_pattern("p2p_duplex")
def _p2p_duplex(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    machines = _machines(topology)
    if len(machines) < 2:
        return None
    a, b = machines[0][0], machines[1][0]
    return _transfers("p2p_duplex", f"{a} <-> {b}, both directions at once", [(a, b), (b, a)], sizes.message_bytes)


@register_pattern("nic_shared")
def _nic_shared(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    machines = _machines(topology)
    if len(machines) < 2:
        return None
    local = machines[0]
    remote = [d for m in machines[1:] for d in m]
    pairs = [(local[k % len(local)], remote[k]) for k in range(min(max(len(local), 2), len(remote)))]
    if len(pairs) < 2:
        return None
    description = f"{len(pairs)} transfers at once out of {topology.devices[0].machine}'s NIC"
    return _transfers("nic_shared", description, pairs, sizes.message_bytes)


@register_pattern("mixed_paths")
def _mixed_paths(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    machines = _machines(topology)
    if len(machines) < 2 or len(machines[0]) < 2:
        return None
    a = machines[0][0]
    pairs = [(a, machines[1][0]), (a, machines[0][1])]
    return _transfers("mixed_paths", f"{a} sends across and inside its machine at once", pairs, sizes.message_bytes)


@register_pattern("fan_in")
def _fan_in(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    machines = _machines(topology)
    if len(machines) < 2:
        return None
    local = machines[0]
    senders = [d for m in machines[1:] for d in m]
    pairs = [(src, local[k % len(local)]) for k, src in enumerate(senders)]
    description = f"every other machine's devices into {topology.devices[0].machine} ({len(pairs)} transfers)"
    return _transfers("fan_in", description, pairs, sizes.fraction(2))


@register_pattern("incast")
def _incast(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    if topology.num_devices < 3:
        return None
    sink = topology.devices[0].name
    pairs = [(d.name, sink) for d in topology.devices[1:]]
    return _transfers("incast", f"every other device into {sink} ({len(pairs)} transfers)", pairs, sizes.fraction(2))


@register_pattern("all_to_all")
def _all_to_all(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    names = [d.name for d in topology.devices]
    if len(names) < 3:
        return None
    pairs = [(a, b) for a in names for b in names if a != b]
    return _transfers("all_to_all", f"every device to every other ({len(pairs)} transfers)", pairs, sizes.fraction(2))


def _ring_steps(devices: Sequence[str], num_bytes: int, prefix: str) -> tuple[list[Step], list[Message]]:
    """A ring all-reduce by explicit messages: ``2 (n - 1)`` rounds, in each every device sends one
    ``num_bytes / n`` chunk to the next (reduce-scatter, then all-gather)."""
    n = len(devices)
    chunk = max(4, num_bytes // n // 4 * 4)
    steps = [Step(f"{prefix}{j}.{k}", devices[k]) for j in range(2 * (n - 1) + 1) for k in range(n)]
    messages = [
        Message(f"{prefix}{j}.{k}", f"{prefix}{j + 1}.{(k + 1) % n}", chunk)
        for j in range(2 * (n - 1))
        for k in range(n)
    ]
    return steps, messages


@register_pattern("ring_sendrecv")
def _ring_sendrecv(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    devices = [d.name for d in topology.devices]
    if len(devices) < 2:
        return None
    steps, messages = _ring_steps(devices, sizes.message_bytes, "r")
    description = f"ring all-reduce of {sizes.message_bytes / 2**20:g} MiB by send/recv over {len(devices)} devices"
    return Pattern("ring_sendrecv", description, tuple(steps), tuple(messages))


@register_pattern("ring_gloo")
def _ring_gloo(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    devices = tuple(d.name for d in topology.devices)
    if len(devices) < 2:
        return None
    description = f"gloo all_reduce of {sizes.message_bytes / 2**20:g} MiB over {len(devices)} devices"
    return Pattern("ring_gloo", description, all_reduce_devices=devices, all_reduce_bytes=sizes.message_bytes)


@register_pattern("pipeline")
def _pipeline(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    """GPipe: 2 micro-batches through up to 4 stages, forward then backward (twice as long), activations
    and their gradients sent between stages."""
    stages = [d.name for d in topology.devices][:4]
    if len(stages) < 2:
        return None
    micro, act, c = 2, sizes.fraction(2), sizes.compute_s
    forward = [Step(f"f{s}.{b}", stages[s], c) for b in range(micro) for s in range(len(stages))]
    backward = [Step(f"b{s}.{b}", stages[s], 2 * c) for b in range(micro) for s in reversed(range(len(stages)))]
    messages = [Message(f"f{s}.{b}", f"f{s + 1}.{b}", act) for b in range(micro) for s in range(len(stages) - 1)]
    messages += [Message(f"b{s}.{b}", f"b{s - 1}.{b}", act) for b in range(micro) for s in range(1, len(stages))]
    messages += [Message(f"f{len(stages) - 1}.{b}", f"b{len(stages) - 1}.{b}", 0) for b in range(micro)]
    # each stage runs both forwards, then both backwards
    description = f"GPipe, 2 micro-batches x {len(stages)} stages, {c * 1e3:g} ms forward steps"
    return Pattern("pipeline", description, tuple(forward + backward), tuple(messages))


@register_pattern("dp_step")
def _dp_step(topology: DeviceTopology, sizes: Sizes) -> Pattern | None:
    """Data parallelism: forward and backward, a ring all-reduce of the gradients by send/recv, then the
    optimizer step."""
    devices = [d.name for d in topology.devices]
    if len(devices) < 2:
        return None
    c = sizes.compute_s
    ring, messages = _ring_steps(devices, sizes.message_bytes, "r")
    steps = [Step(f"fb{k}", d, 3 * c) for k, d in enumerate(devices)]
    steps += ring
    steps += [Step(f"opt{k}", d, c / 2) for k, d in enumerate(devices)]
    description = f"data-parallel step: {3 * c * 1e3:g} ms compute, ring all-reduce, {c / 2 * 1e3:g} ms optimizer"
    return Pattern("dp_step", description, tuple(steps), tuple(messages))

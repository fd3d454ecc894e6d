"""TensorOpt's parallel configurations of one op over a device mesh (the nodes' choices in FT).

TensorOpt (sec. 2.1) gives every op ``v`` a set of ``K_v`` parallel configurations; FT picks one per
op. :mod:`.rescheduling` prices moving tensors between them and :mod:`.costs` adds everything up.

**Configurations** (:func:`op_configs`). Every op runs SPMD on all ``n`` devices arranged as a
device mesh (Mesh-TensorFlow): the 1-D mesh ``(n,)`` and every 2-D mesh ``(a, n / a)``
(:func:`mesh_shapes`). Each mesh dimension either splits one of the op's parallel dimensions (its
size divides the dimension; two mesh dimensions may split the same one when their product divides
it) or replicates (``-1`` in TensorOpt's tensor map). Device ``(i, j)`` of an ``(a, b)`` mesh is
``devices[i * b + j]`` (row-major, the flat device index). Such a configuration is an
:class:`~placement_rl.plan.OpConfig` with ``degrees[d]`` = the product of the mesh sizes splitting
``d``; its device list is ordered so that task ``t`` is partition ``t // R``, replica ``t % R``
(partitions row-major over ``op.parallel_dims``; along a dimension split by two mesh dimensions the
index is mesh-major; replicas row-major over the replicating mesh dimensions). Sync is the ring
``all_reduce``.

**Devices** (:func:`resolve_devices`). FT works over an ordered subset of the topology's devices;
position ``i`` in that list is the *flat device index* the meshes and layouts use. A device count
``n`` means the ``n`` fastest devices in mesh order (:mod:`.devices`), not the first ``n`` listed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from placement_rl.graph import Op, ParallelDim
from placement_rl.plan import OpConfig
from placement_rl.search.ft.devices import fastest_devices
from placement_rl.sim.cost import CostModel
from placement_rl.topology import DeviceTopology

_DimsKey = tuple[tuple[str, str, int, int, bool], ...]


def mesh_shapes(num_devices: int) -> list[tuple[int, ...]]:
    """The device meshes TensorOpt considers for ``num_devices`` devices.

    Returns:
        The 1-D mesh ``(n,)`` then every 2-D mesh ``(a, n // a)`` with ``1 < a < n`` dividing ``n``,
        ``a`` increasing.

    Raises:
        ValueError: if ``num_devices`` is not a positive integer.
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, (int, np.integer)) or num_devices < 1:
        raise ValueError(f"num_devices = {num_devices!r}; expected a positive integer")
    n = int(num_devices)
    return [(n,)] + [(a, n // a) for a in range(2, n) if n % a == 0]


@dataclass(frozen=True)
class _Candidate:
    """One mesh configuration of an op, independent of device names.

    Attributes:
        mesh: the mesh shape.
        assign: per mesh dimension, the index in ``op.parallel_dims`` it splits, or -1 (replicate).
        perm: task ``t`` of the OpConfig runs on flat device index ``perm[t]``.
        degrees: ``(dim name, degree)`` pairs with degree > 1, sorted by name (OpConfig's form).
    """

    mesh: tuple[int, ...]
    assign: tuple[int, ...]
    perm: tuple[int, ...]
    degrees: tuple[tuple[str, int], ...]

    def factors(self) -> tuple[tuple[int, int, int], ...]:
        """``(stride, size, dim index or -1)`` per mesh dimension of size > 1, major first."""
        out = []
        stride = math.prod(self.mesh)
        for size, dim in zip(self.mesh, self.assign, strict=True):
            stride //= size
            if size > 1:
                out.append((stride, size, dim))
        return tuple(out)


def _dims_key(op: Op) -> _DimsKey:
    return tuple((d.name, d.kind, d.axis, d.size, d.reduction) for d in op.parallel_dims)


def _check_meshes(meshes: Sequence[Sequence[int]] | None, n: int) -> tuple[tuple[int, ...], ...]:
    if meshes is None:
        return tuple(mesh_shapes(n))
    out = []
    for mesh in meshes:
        shape = tuple(int(m) for m in mesh)
        if not shape or any(m < 1 for m in shape) or math.prod(shape) != n:
            raise ValueError(f"mesh {tuple(mesh)!r}: expected positive sizes whose product is the {n} device(s)")
        out.append(shape)
    if not out:
        raise ValueError("meshes is empty; expected at least one mesh shape")
    return tuple(out)


@lru_cache(maxsize=4096)
def _candidates(dims_key: _DimsKey, n: int, meshes: tuple[tuple[int, ...], ...]) -> tuple[_Candidate, ...]:
    """The deduplicated, ordered configurations of an op with parallel dims ``dims_key`` (see :func:`op_configs`)."""
    dims = [ParallelDim(name, kind, axis, size, red) for name, kind, axis, size, red in dims_key]  # type: ignore[arg-type]
    sample = next((k for k, d in enumerate(dims) if d.kind == "sample"), None)
    first: list[tuple[tuple[int, ...], tuple[int, ...]]] = [((n,), (-1,))]
    if sample is not None and dims[sample].size % n == 0 and n > 1:
        first.append(((n,), (sample,)))
    rest = []
    for mesh in meshes:
        choices = [[-1] + [k for k, d in enumerate(dims) if m > 1 and d.size % m == 0] for m in mesh]
        for assign in itertools.product(*choices):
            rest.append((mesh, tuple(assign)))
    seen: set[tuple[tuple[int, ...], tuple[tuple[str, int], ...]]] = set()
    out = []
    for mesh, assign in first + rest:
        degree = [1] * len(dims)
        for m, k in zip(mesh, assign, strict=True):
            if k >= 0:
                degree[k] *= m
        if any(dims[k].size % degree[k] for k in range(len(dims))):
            continue
        perm = _permutation(mesh, assign, degree)
        degrees = tuple(sorted((dims[k].name, degree[k]) for k in range(len(dims)) if degree[k] > 1))
        if (perm, degrees) in seen:
            continue
        seen.add((perm, degrees))
        out.append(_Candidate(mesh, assign, perm, degrees))
    return tuple(out)


def _permutation(mesh: tuple[int, ...], assign: tuple[int, ...], degree: list[int]) -> tuple[int, ...]:
    """Flat device index of each OpConfig task (partition-major over split dims in op order, then replica)."""
    n = math.prod(mesh)
    coords = np.array(np.unravel_index(np.arange(n), mesh)).reshape(len(mesh), n)
    partition = np.zeros(n, np.int64)
    for k, deg in enumerate(degree):
        if deg > 1:
            index = np.zeros(n, np.int64)
            for axis, (m, a) in enumerate(zip(mesh, assign, strict=True)):
                if a == k:
                    index = index * m + coords[axis]
            partition = partition * deg + index
    replica = np.zeros(n, np.int64)
    replicas = 1
    for axis, (m, a) in enumerate(zip(mesh, assign, strict=True)):
        if a < 0:
            replica = replica * m + coords[axis]
            replicas *= m
    task = partition * replicas + replica
    perm = np.empty(n, np.int64)
    perm[task] = np.arange(n)
    return tuple(perm.tolist())


def op_configs(
    op: Op,
    devices: Sequence[str],
    *,
    meshes: Sequence[Sequence[int]] | None = None,
    max_configs: int | None = None,
) -> list[OpConfig]:
    """TensorOpt's configurations of one op over exactly ``devices`` (see the module docstring).

    Order (deterministic): full replication first, then pure data parallelism (the 1-D mesh splitting
    the op's sample dimension, when ``len(devices)`` divides it), then every other configuration
    mesh by mesh (``meshes`` order, default :func:`mesh_shapes`), for each mesh the assignments in
    lexicographic order of (mesh dim 0's choice, mesh dim 1's choice, ...), each choice running
    through ``[replicate, op.parallel_dims in order]``. A configuration equal (as an OpConfig) to an
    earlier one is dropped. ``max_configs`` keeps the first ones, so any cap >= 2 keeps replication
    and data parallelism.

    Args:
        op: the op.
        devices: the device names, in mesh (row-major) order; every configuration uses all of them.
        meshes: mesh shapes whose sizes multiply to ``len(devices)`` (default :func:`mesh_shapes`).
        max_configs: keep at most this many (>= 1); ``None`` keeps all.

    Raises:
        ValueError: for no device, repeated devices, a bad mesh or ``max_configs < 1``.
    """
    names = _check_names(devices)
    return [_to_config(c, names) for c in _op_candidates(op, len(names), meshes, max_configs)]


def _op_candidates(
    op: Op, n: int, meshes: Sequence[Sequence[int]] | None, max_configs: int | None
) -> tuple[_Candidate, ...]:
    if max_configs is not None and (
        isinstance(max_configs, bool) or not isinstance(max_configs, int) or max_configs < 1
    ):
        raise ValueError(f"max_configs = {max_configs!r}; expected a positive integer or None")
    found = _candidates(_dims_key(op), n, _check_meshes(meshes, n))
    return found if max_configs is None else found[:max_configs]


def _to_config(c: _Candidate, names: Sequence[str]) -> OpConfig:
    return OpConfig(tuple(names[t] for t in c.perm), c.degrees, "all_reduce")


def _check_names(devices: Sequence[str]) -> list[str]:
    names = [devices] if isinstance(devices, str) else list(devices)
    if not names:
        raise ValueError("0 devices given; expected at least one device name")
    if len(set(names)) != len(names):
        dup = next(d for d in names if names.count(d) > 1)
        raise ValueError(f"device {dup!r} is listed more than once; expected distinct devices")
    return names


def resolve_devices(
    topology: DeviceTopology, devices: Sequence[str] | int | None, cost_model: CostModel | None = None
) -> list[str]:
    """The device names in use, in mesh order: ``None`` for all, a count ``n`` for the ``n`` fastest
    (:func:`~placement_rl.search.ft.devices.fastest_devices`: ranked by the peak FLOP/s of
    ``cost_model``'s compute dtype, whatever order the topology lists them in), or names (checked,
    kept in the order given). Mesh order (machine, then name) is the listing order of every preset."""
    all_names = [d.name for d in topology.devices]
    if devices is None:
        return fastest_devices(topology, len(all_names), cost_model)
    if isinstance(devices, (int, np.integer)):
        if isinstance(devices, bool) or not 1 <= devices <= len(all_names):
            raise ValueError(
                f"devices = {devices!r}; expected a device count from 1 to {len(all_names)} "
                f"(topology {topology.name!r})"
            )
        return fastest_devices(topology, int(devices), cost_model)
    names = _check_names(devices)
    for name in names:
        topology.device(name)  # UnknownNameError (a ValueError) naming the device
    return names


__all__ = ["mesh_shapes", "op_configs", "resolve_devices"]

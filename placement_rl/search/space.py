"""SOAP configuration sets: the parallel configurations a search may give each op (FlexFlow sec. 4).

A configuration is a degree per parallel dimension plus a *device view*: the ``P`` tasks of an op
with ``P = prod(degrees)`` partitions run on devices ``start, start + stride, ...`` of the
topology's device list (machine-major, so contiguous views stay inside machines). This is
FlexFlow's machine-view encoding; it keeps the set per op small while covering data, model,
hybrid and spatial parallelism on any subset-shaped block of devices.

The set is capped and documented:

* degrees divide their dimension, their product is at most ``max_partitions`` (default: the
  number of devices) and each dimension kind is allowed by ``dim_kinds``;
* views: every ``(start, stride)`` with ``start + stride * (P - 1) < D`` and ``stride <= D // P``
  (stride 1 only when ``P == 1``);
* gradient synchronization is the ring all-reduce (parameter servers, duplication and sufficient
  factor broadcasting, ``sfb``, are TAG's options, not FlexFlow's; a plan using them may start a
  search, whose proposals are all-reduce configurations: :func:`placement_rl.search.sfb.apply_sfb`
  turns a found plan's gradients to ``sfb`` where it pays).

``random_config`` samples a degree combination uniformly, then a view uniformly; ``configs``
enumerates the whole set in a fixed order (for exhaustive search).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np

from placement_rl.graph import Op, OpGraph
from placement_rl.plan import OpConfig, Plan
from placement_rl.topology import DeviceTopology

ALL_KINDS = ("sample", "attribute", "parameter")


class SearchSpace:
    """The per-op configuration sets of one (graph, topology) pair.

    Args:
        graph: the op graph.
        topology: the cluster; views index ``topology.devices``.
        max_partitions: the largest number of partitions of one op (default: number of devices).
        dim_kinds: the dimension kinds that may be split (default all; ``("sample",)`` restricts the
            search to data-parallel splits and placement).
        devices: restrict views to these devices (default all), e.g. for FlexFlow sec. 8.3's
            4-device exhaustive comparison.
    """

    def __init__(
        self,
        graph: OpGraph,
        topology: DeviceTopology,
        *,
        max_partitions: int | None = None,
        dim_kinds: Sequence[str] = ALL_KINDS,
        devices: Sequence[str] | None = None,
    ) -> None:
        unknown = set(dim_kinds) - set(ALL_KINDS)
        if unknown:
            raise ValueError(f"dim_kinds {sorted(unknown)}; expected a subset of {list(ALL_KINDS)}")
        self.graph = graph
        self.topology = topology
        self.devices = tuple(devices) if devices is not None else tuple(d.name for d in topology.devices)
        for name in self.devices:
            topology.device(name)
        self.num_devices = len(self.devices)
        self.max_partitions = min(max_partitions or self.num_devices, self.num_devices)
        if self.max_partitions < 1:
            raise ValueError(f"max_partitions = {max_partitions}; expected at least 1")
        self.dim_kinds = tuple(dim_kinds)
        self._degrees: dict[int, list[dict[str, int]]] = {}
        self._views = lru_cache(maxsize=None)(self._make_views)

    def degree_options(self, index: int) -> list[dict[str, int]]:
        """Degree combinations of op ``index`` (the first is all ones)."""
        found = self._degrees.get(index)
        if found is None:
            found = self._degrees[index] = _degree_combinations(
                self.graph.ops[index], self.dim_kinds, self.max_partitions
            )
        return found

    def _make_views(self, partitions: int) -> tuple[tuple[str, ...], ...]:
        D = self.num_devices
        strides = [1] if partitions == 1 else range(1, D // partitions + 1)
        return tuple(
            tuple(self.devices[start + stride * k] for k in range(partitions))
            for stride in strides
            for start in range(D - stride * (partitions - 1))
        )

    def views(self, partitions: int) -> tuple[tuple[str, ...], ...]:
        """Device tuples for an op of ``partitions`` tasks."""
        return self._views(partitions)

    def size(self, index: int) -> int:
        """Number of configurations of op ``index``."""
        return sum(len(self.views(math.prod(d.values()))) for d in self.degree_options(index))

    def configs(self, index: int) -> Iterator[OpConfig]:
        """Every configuration of op ``index``, in a fixed order."""
        for degrees in self.degree_options(index):
            for view in self.views(math.prod(degrees.values())):
                yield OpConfig.make(view, degrees)

    def random_config(self, index: int, rng: np.random.Generator) -> OpConfig:
        """A random configuration: a uniform degree combination, then a uniform view."""
        options = self.degree_options(index)
        degrees = options[int(rng.integers(len(options)))]
        views = self.views(math.prod(degrees.values()))
        return OpConfig.make(views[int(rng.integers(len(views)))], degrees)

    def random_plan(self, rng: np.random.Generator, name: str = "random") -> Plan:
        """A plan with a random configuration for every op."""
        return Plan(
            self.graph.name, {op.name: self.random_config(i, rng) for i, op in enumerate(self.graph.ops)}, name=name
        )

    def contains(self, index: int, cfg: OpConfig) -> bool:
        """Whether ``cfg`` is in op ``index``'s set."""
        degrees = cfg.degree_map
        return (
            degrees in self.degree_options(index)
            and cfg.devices in self.views(cfg.num_partitions)
            and cfg.sync == "all_reduce"
        )


def _degree_combinations(op: Op, kinds: Sequence[str], max_partitions: int) -> list[dict[str, int]]:
    dims = [d for d in op.parallel_dims if d.kind in kinds and d.size > 1]
    choices = [[k for k in range(1, min(d.size, max_partitions) + 1) if d.size % k == 0] for d in dims]
    combos = []
    for degrees in itertools.product(*choices):
        if math.prod(degrees) <= max_partitions:
            combos.append({d.name: k for d, k in zip(dims, degrees, strict=True) if k > 1})
    return combos or [{}]

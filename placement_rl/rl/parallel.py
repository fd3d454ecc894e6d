"""Ray tasks for the deterministic searches: :class:`RayMap`, the Ray-backed
:class:`~placement_rl.parallel.TaskMap` (MCMC chains, FT's chunks of one frontier product).

Each call runs as one Ray task (``num_cpus`` each, so the cluster is never oversubscribed). When the
caller wants progress, every task gets a ``report`` callable that posts its latest value to a small
actor; the driver polls that actor twice a second and relays the values, so one progress bar
follows all tasks. Works on the local Ray (started if none is running) or the
cluster ``ray.init()`` connects to (``RAY_ADDRESS``, e.g. inside ``ray job submit``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray

from placement_rl.parallel import Report
from placement_rl.rl.runtime import ensure_ray


@ray.remote(num_cpus=0)
class _Latest:
    """The latest value each task reported."""

    def __init__(self) -> None:
        self.values: dict[int, Any] = {}

    def post(self, index: int, value: Any) -> None:
        self.values[index] = value

    def take(self) -> dict[int, Any]:
        values, self.values = self.values, {}
        return values


class _Poster:
    """The ``report`` a remote task gets: posts to the actor (picklable, unlike a closure over the driver)."""

    def __init__(self, actor: Any, index: int) -> None:
        self.actor = actor
        self.index = index

    def __call__(self, value: Any) -> None:
        self.actor.post.remote(self.index, value)


def _call(fn: Callable[..., Any], poster: _Poster | None, *args: Any) -> Any:
    # The arguments travel as top-level task arguments: Ray resolves object refs only there.
    return fn(*args) if poster is None else fn(*args, report=poster)


class RayMap:
    """A :class:`~placement_rl.parallel.TaskMap` that runs every call as a Ray task.

    A single call runs in the driver (no task overhead). Arguments that are the same object in
    several calls (the graph, the topology) are put in the object store once.

    Attributes:
        num_cpus: CPUs each task reserves.
        chunk_points: FT's chunk size for this map (smaller than the serial default, so that
            large products spread over the cluster's CPUs).
        tasks: Ray tasks submitted so far.
    """

    def __init__(self, num_cpus: float = 1, chunk_points: int = 500_000) -> None:
        self.num_cpus = num_cpus
        self.chunk_points = chunk_points
        self.tasks = 0

    def __call__(
        self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], report: Report | None = None
    ) -> list[Any]:
        if len(args) == 1:
            if report is None:
                return [fn(*args[0])]
            return [fn(*args[0], report=lambda value: report(0, value))]
        ensure_ray()
        shared: dict[int, Any] = {}

        def ref(value: Any) -> Any:
            if isinstance(value, (int, float, str, bool, type(None))):
                return value
            if id(value) not in shared:
                shared[id(value)] = ray.put(value)
            return shared[id(value)]

        latest = _Latest.remote() if report is not None else None
        remote = ray.remote(num_cpus=self.num_cpus)(_call)
        pending = [
            remote.remote(fn, _Poster(latest, k) if latest is not None else None, *(ref(a) for a in call))
            for k, call in enumerate(args)
        ]
        self.tasks += len(pending)
        try:
            remaining = list(pending)
            while remaining:
                _, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=0.5)
                if latest is not None and report is not None:
                    for k, value in sorted(ray.get(latest.take.remote()).items()):
                        report(k, value)
            results = ray.get(pending)
            if latest is not None and report is not None:
                for k, value in sorted(ray.get(latest.take.remote()).items()):
                    report(k, value)
            return results
        finally:
            if latest is not None:
                ray.kill(latest)

"""Shared fixtures. Zoo graphs are imported once per session (imports take ~0.1-2 s each)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from placement_rl import zoo
from placement_rl.graph import OpGraph

_CACHE: dict[tuple[str, tuple[tuple[str, object], ...]], OpGraph] = {}


@pytest.fixture(scope="session")
def zoo_graph() -> Callable[..., OpGraph]:
    """``zoo_graph(name, **options)``: a cached ``zoo.load``; graphs are immutable so sharing is safe."""

    def load(name: str, **options: object) -> OpGraph:
        key = (name, tuple(sorted(options.items())))
        if key not in _CACHE:
            _CACHE[key] = zoo.load(name, **options)  # type: ignore[arg-type]
        return _CACHE[key]

    return load


@pytest.fixture(scope="session")
def ray_local():  # type: ignore[no-untyped-def]
    """One local Ray for the whole session (2 CPUs); shut down at the end, never `ray stop`."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()

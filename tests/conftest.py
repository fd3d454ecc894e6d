"""Shared fixtures and markers. Zoo graphs are imported once per session (imports take ~0.1-2 s each).

Markers (registered in pyproject.toml), applied here so the test files stay as they are:
``ray`` on every test that uses the ``ray_local`` fixture (directly or through other fixtures) and
on everything under tests/rl/; ``slow`` on the tests of :data:`SLOW` (new tests may also carry
``@pytest.mark.slow`` themselves, as the longer benchmark runs do). The fast core suite is
``pytest -q -m "not ray and not slow"``.

Everything a test reads lies in the checkout: ``outside_reads`` fails a test that opens, lists or
globs a path beside it (tests/checkout_guard.py), such as a data folder next to the checkout that a
developer's or CI's machine has and a user's fresh clone does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import checkout_guard
import pytest
import torch
import yaml
import zoo_cache
from slow_tests import SLOW

from placement_rl import zoo
from placement_rl.graph import OpGraph

TESTS = Path(__file__).resolve().parent
RL_TESTS = TESTS / "rl"
checkout_guard.install()


def _is_slow(nodeid: str) -> bool:
    function, _, params = nodeid.partition("[")
    cases = SLOW.get(function)
    return cases is not None and (not cases or params[:-1] in cases)


#: A training config small enough for a test: lenet at batch 32 on the trinity preset, 4 iterations.
TINY: dict[str, Any] = {
    "name": "tiny",
    "env": {
        "generator": {"kind": "fixed", "model": "lenet", "topology": "trinity", "batch_size": 32},
        "one_shot_ops": 16,
        "one_shot_groups": 4,
        "max_devices": 4,
        "node2vec_dim": 8,
        "reward": "speedup",
        # The papers' flat model: there a trained policy beats random by far on this instance (speedup ~8
        # against ~1.5). Under the calibrated model lenet at batch 32 is bound by the host issuing kernels,
        # and no plan is much faster than data parallelism.
        "cost_model": {"calibration": "roofline"},
    },
    "ppo": {"train_batch_size": 32, "minibatch_size": 16, "num_epochs": 2, "lr": 0.003},
    "run": {"iterations": 4, "num_env_runners": 0, "checkpoint_every": 2, "seed": 0},
}


@pytest.fixture(autouse=True)
def outside_reads() -> Iterator[None]:
    """Fail a test that read a path beside the checkout (tests/checkout_guard.py): what the tests need
    lies in the repository, so a fresh clone with nothing beside it passes."""
    checkout_guard.take()
    yield
    paths = checkout_guard.take()
    if paths:
        root = checkout_guard.ROOT
        pytest.fail(f"read beside the checkout {root}: {', '.join(paths[:5])}; keep what tests need in the repository")


@pytest.fixture(scope="session")
def tiny() -> dict[str, Any]:
    """The tiny training config (a dict, as in YAML)."""
    return TINY


@pytest.fixture(scope="session")
def tiny_yaml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny training config as a YAML file (its output folder inside the session's temp dir)."""
    folder = tmp_path_factory.mktemp("tiny")
    doc = {**TINY, "run": {**TINY["run"], "output_dir": str(folder / "run")}}
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (where README.md, benchmarks/ and tune_configs/ live)."""
    return TESTS.parent


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread for the session. The tests' models are small, and on a 2-core machine
    shared with other work, waking the second thread can stall an op for milliseconds: a few tests
    that train or time tiny models (lenet's iterations, node2vec) took seconds instead of tenths under
    load. A test that needs another count sets it and restores it (as tests/test_profiling.py does)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def zoo_graph() -> Callable[..., OpGraph]:
    """``zoo_graph(name, **options)``: a cached ``zoo.load`` (tests/zoo_cache.py); graphs are immutable so
    sharing is safe."""
    return zoo_cache.load


@pytest.fixture
def cached_zoo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand the session's cached imports (``zoo_graph``) in for ``zoo.load`` during one test: for the
    tests of the command line and of experiment files that run a command on the same small model over
    and over, and whose point is not the importer (tests/test_zoo.py and tests/test_importer*.py test it)."""
    monkeypatch.setattr(zoo, "load", zoo_cache.load)


@pytest.fixture(scope="session")
def ray_local():  # type: ignore[no-untyped-def]
    """One local Ray for the whole session (2 CPUs, bound to 127.0.0.1); shut down at the end, never `ray stop`."""
    import ray

    from placement_rl.rl.runtime import loopback_only

    loopback_only()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``ray`` every test that starts or uses Ray, and ``slow`` the tests of :data:`SLOW`."""
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()) or RL_TESTS in item.path.parents:
            item.add_marker(pytest.mark.ray)
        if _is_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)

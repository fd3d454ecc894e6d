"""Shared fixtures and markers. Zoo graphs are imported once per session (imports take ~0.1-2 s each).

Markers (registered in pyproject.toml), applied here so the test files stay as they are:
``ray`` on every test that uses the ``ray_local`` fixture (directly or through other fixtures) and
on everything under tests/rl/; ``slow`` on the tests of :data:`SLOW` (new tests may also carry
``@pytest.mark.slow`` themselves, as the longer benchmark runs do). The fast core suite is
``pytest -q -m "not ray and not slow"``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from placement_rl import zoo
from placement_rl.graph import OpGraph

TESTS = Path(__file__).resolve().parent
RL_TESTS = TESTS / "rl"

# Tests over about 5 s, from `pytest -q -m "not ray" --durations=0` on the 2-core machine with other
# runs competing (seconds in the comments; about a third of that on an idle machine): node id without
# parameters -> the parameter ids that are slow, or () for every case. A zoo graph is imported once per
# session (`zoo_graph`), so a first import is charged to whichever test asks first.
SLOW: dict[str, tuple[str, ...]] = {
    "tests/test_cli.py::test_plan_runs_every_method_and_writes_the_best": (),  # 81 s: every method, MCMC, FT
    "tests/test_cli.py::test_search_mcmc_writes_the_best_plan": (),  # 22 s
    "tests/test_search.py::test_mcmc_reaches_the_exhaustive_optimum": (),  # 63 s + 41 s: exhaustive search
    "tests/test_search.py::test_delta_simulation_equals_full_simulation": (
        "inception_v3-options0-tensoropt-0-500",  # 35 s
        "rnnlm-options1-tag-testbed-0-500",  # 11 s
        "transformer-options2-h100-2x8-60-400",  # 8 s
    ),
    "tests/test_coarsen.py::test_every_op_in_exactly_one_group": (
        "gnmt-60",  # 35 s
        "inception_v3-60",  # 13 s
        "resnet50-7",  # 11 s
    ),
    "tests/test_architecture.py::test_importing_the_core_loads_no_ray": (),  # 18 s: a fresh interpreter
    "tests/test_zoo.py::test_param_bytes_equal_the_modules": (  # builds the PyTorch module with its weights
        "bert_large",  # 28 s
        "rnnlm",  # 23 s
        "rnntc",  # 23 s
        "wideresnet",  # 12 s (7 GB of weights)
        "resnet101",  # 22 s with the graph's import, which no fast test shares
        "resnet50",  # 3-5 s, likewise
    ),
    "tests/test_zoo.py::test_batch_size_scales_activations_not_parameters": (),  # 13 s: resnet50 twice
    "tests/test_zoo.py::test_options_reach_the_architecture": (),  # 7 s: rnnlm's 40 steps, used by no fast test
    "tests/test_plan.py::test_layerwise_balances_by_device_speed": (),  # 11 s: resnet101
    "tests/envs/test_conformance.py::test_final_makespan_is_the_simulated_plan": (
        "sharding-inception_v3@tag-testbed",  # 15 s
        "placement-device-inception_v3@tag-testbed",  # 7 s
    ),
    "tests/search/test_frontier.py::test_frontier_equals_brute_force_pareto_set": (
        "dense (needs heuristics)-ldp",  # 9 s
        "dense (needs heuristics)-elimination",  # 8 s
    ),
}


def _is_slow(nodeid: str) -> bool:
    function, _, params = nodeid.partition("[")
    cases = SLOW.get(function)
    return cases is not None and (not cases or params[:-1] in cases)


_CACHE: dict[tuple[str, tuple[tuple[str, object], ...]], OpGraph] = {}
_ZOO_LOAD = zoo.load  # the importer itself, even while a test stands `zoo_graph` in for `zoo.load`


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (where README.md, benchmarks/ and tune_configs/ live)."""
    return TESTS.parent


@pytest.fixture(scope="session")
def zoo_graph() -> Callable[..., OpGraph]:
    """``zoo_graph(name, **options)``: a cached ``zoo.load``; graphs are immutable so sharing is safe."""

    def load(name: str, **options: object) -> OpGraph:
        key = (name, tuple(sorted(options.items())))
        if key not in _CACHE:
            _CACHE[key] = _ZOO_LOAD(name, **options)  # type: ignore[arg-type]
        return _CACHE[key]

    return load


@pytest.fixture(scope="session")
def ray_local():  # type: ignore[no-untyped-def]
    """One local Ray for the whole session (2 CPUs); shut down at the end, never `ray stop`."""
    import ray

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

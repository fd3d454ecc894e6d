"""The planted suite (placement_rl/planted.py): every kind builds, its planted plan validates, fits and
beats every baseline by the stated margin, the bound is below it, held-out variants build, and bad
names and bad planted plans are clear errors. The benchmark (benchmarks/planted.py) runs at a tiny budget."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from scripts import load_script

from placement_rl.errors import UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.methods import BASELINES, get_method
from placement_rl.plan import OpConfig, Plan, data_parallel, single_device
from placement_rl.planted import (
    DEFAULT_MARGIN,
    KINDS,
    PlantedError,
    PlantedInstance,
    _cluster,
    build_instance,
    build_suite,
    check_instance,
    get_kind,
    kind_names,
)
from placement_rl.sim import simulate
from placement_rl.topology import load_preset

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _instance(kind: str, variant: int = 0) -> PlantedInstance:
    return build_instance(kind, variant)


def test_at_least_eight_kinds_with_the_issues_five() -> None:
    names = kind_names()
    assert len(names) >= 8 and names == list(KINDS)
    for kind in ("slow_links_fc", "mixed_gpus", "recurrent_shared", "fits_only_split", "pipeline_deep"):
        assert kind in names


@pytest.mark.parametrize("kind", list(KINDS))
def test_kind_builds_and_its_planted_plan_beats_every_baseline(kind: str) -> None:
    inst = _instance(kind)
    assert inst.name == kind and inst.kind == kind and inst.variant == 0 and inst.description
    inst.plan.validate(inst.graph, inst.topology)
    result = simulate(inst.graph, inst.topology, inst.plan)
    assert not result.oom and result.makespan_s == inst.planted_makespan_s
    assert set(inst.baseline_makespans_s) == set(BASELINES)
    assert len(inst.baseline_oom) < len(BASELINES) or inst.planted_speedup == math.inf
    for b, makespan_s in inst.baseline_makespans_s.items():
        if b not in inst.baseline_oom:
            assert makespan_s >= DEFAULT_MARGIN * inst.planted_makespan_s, (b, makespan_s, inst.planted_makespan_s)
    assert inst.planted_speedup >= inst.margin == DEFAULT_MARGIN
    assert 0 < inst.lower_bound_s <= inst.planted_makespan_s
    assert inst.speed_ratio(inst.planted_makespan_s) == 1.0
    assert inst.graph.num_ops <= 400  # small enough for a search to simulate it many times


@pytest.mark.parametrize("kind", list(KINDS))
def test_held_out_variant_builds_and_differs(kind: str) -> None:
    held_out = _instance(kind, 1)
    assert held_out.name == f"{kind}/v1" and held_out.variant == 1 and held_out.kind == kind
    assert held_out.planted_speedup >= DEFAULT_MARGIN
    assert 0 < held_out.lower_bound_s <= held_out.planted_makespan_s


def test_a_variant_is_the_same_instance_every_time() -> None:
    import random

    build = get_kind("slow_links_fc").build
    a, b = build(random.Random("slow_links_fc/3")), build(random.Random("slow_links_fc/3"))
    assert a.description == b.description and a.topology.name == b.topology.name and a.plan == b.plan
    designs = {build(random.Random(f"slow_links_fc/{v}")).description for v in range(1, 9)}
    assert len(designs) > 1  # the variants draw other sizes


def test_unknown_kind_names_the_allowed_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        build_suite(["mixed_gpus", "no_such_kind"])
    message = str(info.value)
    assert "no_such_kind" in message and all(k in message for k in KINDS)
    with pytest.raises(UnknownNameError, match="planted kind 'nope'"):
        build_instance("nope")


def test_bad_variant_and_margin_are_refused() -> None:
    with pytest.raises(ValueError, match="variant = -1"):
        build_instance("embedding_heavy", -1)
    graph_topo = _lenet()
    with pytest.raises(ValueError, match="margin = 0.5"):
        check_instance("x", "k", 0, "", *graph_topo, data_parallel(*graph_topo), margin=0.5)


def _lenet() -> tuple[OpGraph, Any]:
    from placement_rl import zoo

    return zoo.load("lenet", batch_size=64), load_preset("trinity")


def test_planted_plan_that_does_not_validate_is_an_error_naming_the_instance() -> None:
    graph, topo = _lenet()
    configs = dict(single_device(graph, topo).configs)
    configs[graph.ops[0].name] = OpConfig.make("m9/gpu9")
    with pytest.raises(PlantedError, match=r"planted instance 'broken'.*does not validate.*m9/gpu9"):
        check_instance("broken", "k", 0, "", graph, topo, Plan(graph.name, configs, name="p"))


def test_planted_plan_that_does_not_fit_is_an_error_naming_the_instance() -> None:
    graph = _lenet()[0]
    tiny = _cluster("tiny-memory", [("V100-SXM2-16GB", 2)], 10, memory_bytes=2**20)
    with pytest.raises(PlantedError, match=r"planted instance 'too_big'.*does not fit in memory.*GiB over on m0/gpu"):
        check_instance("too_big", "k", 0, "", graph, tiny, single_device(graph, tiny))


def test_planted_plan_not_better_than_a_baseline_is_an_error_with_the_figures() -> None:
    graph, topo = _lenet()
    with pytest.raises(PlantedError) as info:
        check_instance("plain", "k", 0, "", graph, topo, data_parallel(graph, topo))
    message = str(info.value)
    assert "planted instance 'plain'" in message and "expected at least 1.5x" in message
    assert " ms)" in message and "faster than baseline" in message


# ------------------------------------------------------------------------------------ the benchmark
def _benchmark() -> ModuleType:
    return load_script("benchmarks/planted.py")


def test_benchmark_starts_searches_from_data_parallelism_alone() -> None:
    bench = _benchmark()
    assert bench.method_options(get_method("mcmc"), "5s") == {
        "proposals": "coordinated",
        "budget": "5s",
        "initial": ["data_parallel"],
        "seed": 0,
    }
    assert bench.method_options(get_method("mcmc"), "5s", "flexflow")["proposals"] == "flexflow"
    assert bench.method_options(get_method("mcts"), "5s")["budget"] == "5s"
    assert bench.method_options(get_method("zero"), "5s") == {}
    assert not set(bench.default_methods()) & set(BASELINES)


def test_benchmark_prints_ratios_to_the_planted_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _benchmark()
    monkeypatch.setattr(bench, "build_suite", lambda kinds, variant: [_instance(k, variant) for k in kinds])
    run: Callable[..., None] = bench.main
    run(["--instances", "embedding_heavy", "--methods", "zero,mcmc", "--budget", "10", "--json"])
    [row] = json.loads(capsys.readouterr().out)
    assert row["instance"] == "embedding_heavy" and row["planted_makespan_s"] > row["lower_bound_s"] > 0
    cells = row["methods"]
    assert set(cells) == {*BASELINES, "zero", "mcmc"}
    for b in BASELINES:
        ratio = cells[b]["ratio"]
        assert cells[b]["oom"] or ratio <= 1 / DEFAULT_MARGIN
    assert cells["mcmc"]["ratio"] > 0 and cells["mcmc"]["note"] == ""
    run(["--instances", "embedding_heavy", "--methods", "zero", "--budget", "10"])
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| embedding_heavy")]
    assert len(table) == 1 and table[0].count("|") == 4 + len(BASELINES) + 1 + 1
    assert "reached >= 0.9 of the planted plan's speed" in out and "zero 0/1" in out


def test_benchmark_refuses_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _benchmark()
    for argv in (["--methods", "nope"], ["--instances", "nope"], ["--budget", "soon"]):
        with pytest.raises(SystemExit):
            bench.main(argv)
    bad_sets = {
        "ft.nope=1": "ft has no option 'nope'; its options are ['device_counts', 'max_configs', 'stage_meshes']",
        "mcmc.budget=1": "method 'mcmc' is not run; the methods are ['ft']",
        "stage_meshes=1": "expected METHOD.OPTION=VALUE",
    }
    for item, message in bad_sets.items():
        with pytest.raises(SystemExit):
            bench.main(["--methods", "ft", "--set", item])
        assert message in capsys.readouterr().err


def test_benchmark_passes_method_options_and_runs_only_the_baselines_with_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _benchmark()
    monkeypatch.setattr(bench, "build_suite", lambda kinds, variant: [_instance(k, variant) for k in kinds])
    seen: list[dict[str, Any]] = []
    run_method = bench.run_method

    def spy(instance: Any, method: Any, options: dict[str, Any]) -> Any:
        seen.append({"method": method.name, **options})
        return run_method(instance, method, options)

    monkeypatch.setattr(bench, "run_method", spy)
    argv = ["--instances", "embedding_heavy", "--methods", "mcmc,data_parallel", "--budget", "5", "--json"]
    bench.main([*argv, "--set", "mcmc.chains=1", "--set", "mcmc.proposals=flexflow"])
    [row] = json.loads(capsys.readouterr().out)
    # the set options beside the benchmark's own; data_parallel is a baseline column, not run again
    assert seen == [{"method": "mcmc", **bench.method_options(get_method("mcmc"), "5", "flexflow"), "chains": 1}]
    assert set(row["methods"]) == {*BASELINES, "mcmc"}
    bench.main(["--instances", "embedding_heavy", "--methods", "none", "--json"])
    [row] = json.loads(capsys.readouterr().out)
    assert set(row["methods"]) == set(BASELINES) and len(seen) == 1


def test_benchmark_plan_defaults_column_is_the_best_of_plans_default_methods(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import placement_rl.methods as methods

    bench = _benchmark()
    monkeypatch.setattr(bench, "build_suite", lambda kinds, variant: [_instance(k, variant) for k in kinds])
    monkeypatch.setattr(methods, "AUTO_BUDGET_BOUNDS_S", (1.0, 1.0))  # each search 1 s instead of 10 s or more
    bench.main(["--instances", "embedding_heavy", "--methods", "none", "--plan-defaults", "--json"])
    [row] = json.loads(capsys.readouterr().out)
    plan = row["methods"]["plan"]
    method, budget = plan["note"].split("; ")
    assert method in methods.DEFAULT_METHODS and budget == "1s per search"
    # the planted plan (the table's columns split, the rest data parallel) is within reach of plan's defaults
    assert plan["ratio"] >= bench.REACHED and not plan["oom"]
    assert all(plan["ratio"] >= row["methods"][b]["ratio"] for b in BASELINES if not row["methods"][b]["oom"])

"""Anytime curves of learning methods: PPO trained on one instance (its best sampled plan and trace),
the GNN-prior tree search of a TAG checkpoint, and the benchmark's files (lenet, small budgets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from placement_rl import zoo
from placement_rl.methods import compare_methods
from placement_rl.rl.config import TrainConfig
from placement_rl.sim import simulate
from placement_rl.topology import resolve_topology

pytestmark = pytest.mark.slow  # a Ray training run each (5-30 s on the shared cores)


def _non_increasing(trace: Any) -> bool:
    return all(b[1] <= a[1] and b[0] >= a[0] for a, b in zip(trace, trace[1:], strict=False))


def test_training_curve_never_rises_and_ends_at_the_returned_plan(ray_local: Any, tiny: dict[str, Any]) -> None:
    from placement_rl.rl.train import train_on_instance

    graph, topology = zoo.load("lenet", batch_size=32), resolve_topology("trinity")
    out = train_on_instance(TrainConfig.from_dict(tiny), graph, topology, 2)
    assert out.iterations == 2 and out.env_steps == 2 * tiny["ppo"]["train_batch_size"]
    assert len(out.anytime) >= 2 and _non_increasing(out.anytime)
    assert out.anytime[-1][0] == pytest.approx(out.elapsed_s)
    simulated = simulate(graph, topology, out.plan)
    assert not simulated.oom
    assert out.anytime[-1][1] == pytest.approx(simulated.makespan_s) == pytest.approx(out.result.makespan_s)
    # Sampling explores: the first plan sampled is not the best one kept.
    assert out.anytime[0][1] > out.anytime[-1][1]


def test_a_bad_budget_is_refused_before_training(tiny: dict[str, Any]) -> None:
    from placement_rl.rl.anytime import training_method

    method = training_method(TrainConfig.from_dict(tiny))
    assert method.check is not None
    with pytest.raises(ValueError, match="budget = 'soon'"):
        method.check({"budget": "soon"}, None, None)


def test_gnn_prior_search_reports_its_trace(ray_local: Any, tmp_path: Path) -> None:
    from placement_rl.rl.anytime import prior_search_method
    from placement_rl.rl.train import train

    cfg = TrainConfig.from_dict(
        {
            "name": "tiny-tag",
            "agent": "tag",
            "env": {
                "generator": {"kind": "fixed", "model": "lenet", "topology": "tag-testbed", "batch_size": 32},
                "max_groups": 6,
                "device_grouping": "gpu_type",
                "max_device_groups": 4,
                "max_subsets": 8,
                "max_devices": 16,
            },
            "model": {"hidden": 32, "layers": 2},
            "mcts": {"iterations_per_move": 8, "min_visits": 2, "warm_start_iterations": 0},
            "training": {"episodes_per_runner": 1, "num_epochs": 1},
            "run": {"iterations": 1, "num_env_runners": 0, "seed": 0},
        }
    )
    run = train(cfg, out_dir=tmp_path / "run", progress=None)
    method = prior_search_method(run / "checkpoint_final")
    graph, topology = zoo.load("lenet", batch_size=32), resolve_topology("tag-testbed")
    [row] = compare_methods(graph, topology, [method], options={"tag": {"budget": 40}})
    assert _non_increasing(row.anytime)
    assert row.anytime[-1][1] == pytest.approx(row.makespan_s)
    assert row.makespan_s <= row.dp_makespan_s * (1 + 1e-9)  # the search starts from data parallelism


def test_benchmark_writes_one_png_per_instance_and_the_curves(
    ray_local: Any, tiny: dict[str, Any], tmp_path: Path
) -> None:
    from placement_rl.rl.anytime import anytime_benchmark

    lines: list[str] = []
    instances = [(zoo.load("lenet", batch_size=32), resolve_topology("trinity"))]
    rows = anytime_benchmark(
        instances, "1s", tmp_path, ppo=TrainConfig.from_dict(tiny), searches=("mcmc", "mcts"), progress=lines.append
    )
    assert [r["method"] for r in rows] == ["MCMC", "TAG, uniform prior (mcts)", "PPO (trinity)"]
    assert (tmp_path / "lenet@trinity.png").read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "anytime.json").read_text())["rows"]
    assert [r["method"] for r in saved] == [r["method"] for r in rows]
    for r in saved:
        assert _non_increasing(r["anytime"])
        assert r["anytime"][-1][1] == pytest.approx(r["makespan_s"])
    csv_lines = (tmp_path / "anytime.csv").read_text().splitlines()
    assert csv_lines[0] == "instance,method,seconds,best_makespan_ms"
    assert len(csv_lines) == 1 + sum(len(r["anytime"]) for r in saved)
    assert "| lenet@trinity | PPO (trinity) |" in (tmp_path / "results.md").read_text()
    assert any("iter 1" in line for line in lines)  # PPO's per-iteration progress


def test_the_prior_search_refuses_a_checkpoint_of_another_agent(tiny_run: Path) -> None:
    from placement_rl.errors import SchemaError
    from placement_rl.rl.anytime import prior_search_method

    with pytest.raises(SchemaError, match="holds a 'trinity' policy"):
        prior_search_method(tiny_run / "checkpoint_final")

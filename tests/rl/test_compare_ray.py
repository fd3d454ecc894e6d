"""``compare`` on Ray: cells as bounded Ray tasks give the rows of the serial run; learned methods."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from placement_rl.cli import main
from placement_rl.experiments import parse_experiment, prepare, read_rows, run_experiment
from placement_rl.rl.compare import RayCells, compare

DOC: dict[str, Any] = {
    "name": "ray",
    "models": [{"model": "lenet", "batch_size": 32}],
    "topologies": ["trinity"],
    "methods": ["data_parallel", "expert", {"method": "mcmc", "budget": 40}],
    "seeds": [0, 1],
}


def test_ray_cells_match_the_serial_run(ray_local: Any, tmp_path: Path) -> None:
    runner = RayCells(max_concurrent=2)
    on_ray = compare(parse_experiment(DOC, name="ray"), tmp_path / "ray", runner=runner, progress=False)
    serial = run_experiment(prepare(parse_experiment(DOC, name="ray")), tmp_path / "serial", progress=False)
    assert runner.tasks == len(serial.rows) == 4
    ray_rows = {r["cell"]: r for r in on_ray.rows}
    for row in serial.rows:  # deterministic methods, and MCMC with a proposal budget: the same plans
        assert ray_rows[row["cell"]]["makespan_s"] == pytest.approx(row["makespan_s"])
        assert (tmp_path / "ray" / ray_rows[row["cell"]]["plan_file"]).is_file()
    assert [r["cell"] for r in on_ray.rows] == [r["cell"] for r in serial.rows]  # rows in cell order


def test_ray_cells_cancel_what_is_left_when_closed(ray_local: Any) -> None:
    runner = RayCells(max_concurrent=1)
    results = runner(lambda a, b: a**b, [(2, k) for k in range(5)])
    assert next(results)[1] in {2**k for k in range(5)}
    results.close()  # e.g. Ctrl-C in the driver: the pending task is cancelled, nothing else is submitted
    assert runner.tasks == 2


def test_compare_command_with_a_trained_policy(tiny_run: Path, tmp_path: Path, capsys: Any) -> None:
    doc = {
        "models": [{"model": "lenet", "batch_size": 32}],
        "topologies": ["trinity"],
        "methods": ["data_parallel", {"method": "trinity", "checkpoint": str(tiny_run / "checkpoint_final")}],
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--concurrency", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["trinity"]["status"] == "ok" and rows["trinity"]["makespan_s"] > 0
    assert len(read_rows(out / "results.jsonl")) == 2
    # The tiny run trained on lenet: holding lenet out is refused before any cell runs.
    doc["methods"][1]["held_out"] = ["lenet"]
    path.write_text(yaml.safe_dump(doc))
    assert main(["compare", str(path), "--out", str(tmp_path / "held"), "--json"]) == 2
    assert "was trained on ['lenet'], which the entry holds out" in capsys.readouterr().err


def test_set_overrides_a_shipped_file(ray_local: Any, tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(DOC))
    report = compare(
        path,
        tmp_path / "out",
        overrides=["topologies=[random:3]", "methods.mcmc.budget=20", "seeds=1"],
        runner=RayCells(2),
        progress=False,
    )
    assert (
        len(report.rows) == 3
        and json.loads((tmp_path / "out" / "experiment.json").read_text())["methods"][2]["budget"] == 20
    )
    with pytest.raises(ValueError, match="has no method named 'mcmcc'"):
        compare(path, tmp_path / "bad", overrides=["methods.mcmcc.budget=1"])

"""Instances where no plan fits in memory: ``plan`` and ``compare`` say so, name the plan that needs the
least memory and what would fit, write standard JSON (``null``, never ``NaN`` or ``Infinity``) and
every cell; FT marks a plan that does not fit instead of presenting it as its answer.

The instance is lenet (batch 32) on trinity with every GPU's memory cut to 100 kB: no plan of any
method fits, and every method runs in well under a second.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from placement_rl import zoo
from placement_rl.cli import main
from placement_rl.experiments import read_rows
from placement_rl.methods import best_result, compare_methods, least_memory, memory_over_bytes
from placement_rl.search.ft import best_over_device_counts, pick_over_device_counts, run_ft
from placement_rl.sim import simulate
from placement_rl.topology import DeviceTopology, load_preset

CAPACITY_BYTES = 100_000


def _strict(text: str) -> Any:
    """JSON that must be standard: ``NaN``, ``Infinity`` and ``-Infinity`` raise."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def tiny_memory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """trinity with 100 kB per GPU, as a topology file."""
    doc = load_preset("trinity").to_dict()
    doc["name"] = "trinity-100kb"
    for device in doc["devices"]:
        device["memory_bytes"] = CAPACITY_BYTES
    path = tmp_path_factory.mktemp("topology") / "trinity-100kb.json"
    path.write_text(json.dumps(doc))
    return path


def _run(argv: list[str]) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(argv) == 0
    return buffer.getvalue()


def _plan_argv(topology: Path, out: Path) -> list[str]:
    methods = "dp,single,expert,layerwise,ft"
    return ["plan", "--model", "lenet", "--batch-size", "32", "--topology", str(topology), "--methods", methods]


def test_plan_says_no_method_fits_and_what_would(tiny_memory: Path, tmp_path: Path) -> None:
    text = _run([*_plan_argv(tiny_memory, tmp_path), "--out-dir", str(tmp_path / "text")])
    assert "best (fits in memory" not in text
    assert "no method found a plan that fits in memory (5 plans); the least-memory plan is " in text
    assert " over on m0/gpu" in text and "of 97.66 KiB" in text  # per-device peak vs capacity
    assert "what would fit:" in text and "more devices: a training step needs " in text
    assert "--precision fp16-mixed" in text  # the P100 has no bf16 peak: fp16-mixed is the lower precision
    assert "sharded data parallelism (ZeRO, FSDP) and activation recomputation (--methods megatron,zero)" in text
    assert "placement_rl.plan.megatron, zero, fsdp, recompute and pipeline" in text
    assert (tmp_path / "text" / "least_memory_plan.json").is_file()
    assert not (tmp_path / "text" / "best_plan.json").exists()  # a plan that does not fit is not "best"
    # said once: FT's own "none of FT's plans fits" note is left to the JSON row when nothing fits at all
    assert text.count("fits in memory") == 1 and "ft: none of FT's" not in text

    report = _strict(_run([*_plan_argv(tiny_memory, tmp_path), "--out-dir", str(tmp_path / "json"), "--json"]))
    rows = report["methods"]
    assert report["fits"] is False and report["best"] is None and all(r["oom"] for r in rows)
    assert next(r for r in rows if r["method"] == "ft")["note"].startswith("none of FT's")
    least = min(rows, key=lambda r: r["memory_over_bytes"])
    assert report["least_memory"] == least["method"] == report["no_fit"]["least_memory"]["method"]
    over = report["no_fit"]["least_memory"]["devices_over"]
    assert over and all(d["capacity_bytes"] == CAPACITY_BYTES < d["peak_bytes"] for d in over.values())
    assert max(d["peak_bytes"] for d in over.values()) - CAPACITY_BYTES == least["memory_over_bytes"]
    kinds = [s["kind"] for s in report["no_fit"]["suggestions"]]
    assert kinds == ["more_devices", "split", "precision", "shard"]
    assert report["no_fit"]["suggestions"][3]["methods"] == ["megatron", "zero"]
    more = report["no_fit"]["suggestions"][0]
    step_bytes = report["no_fit"]["step_bytes"]
    assert more["devices_needed"] == -(-step_bytes // CAPACITY_BYTES) > more["devices_of_type"] == 4
    precision = report["no_fit"]["suggestions"][2]
    assert precision["precision"] == "fp16-mixed" and precision["step_bytes"] < step_bytes


def test_compare_writes_every_cell_and_standard_json_when_nothing_fits(tiny_memory: Path, tmp_path: Path) -> None:
    doc = {
        "name": "nothing-fits",
        "models": [{"model": "lenet", "batch_size": 32}],
        "topologies": [str(tiny_memory)],
        # MCTS's anytime trace has no finite best cost while nothing fits: it was written as Infinity.
        "methods": ["data_parallel", "layerwise", {"method": "mcts", "budget": 20}, "ft"],
    }
    spec, out = tmp_path / "exp.yaml", tmp_path / "out"
    spec.write_text(yaml.safe_dump(doc))
    report = _strict(_run(["compare", str(spec), "--out", str(out), "--serial", "--json"]))
    lines = (out / "results.jsonl").read_text().splitlines()
    rows = [_strict(line) for line in lines]
    assert len(rows) == 4 and report["ran"] == 4 and all(r["status"] == "ok" and r["oom"] for r in rows)
    mcts = next(r for r in rows if r["method"] == "mcts")
    assert mcts["anytime"] and mcts["anytime"][0][1] is None
    assert read_rows(out / "results.jsonl") == rows
    [unfit] = report["no_fit"]
    assert next(r for r in rows if r["method"] == "ft")["note"].startswith("none of FT's")
    least = min(rows, key=lambda r: r["memory_over_bytes"])
    assert unfit["method"] == least["method"] and unfit["memory_over_bytes"] == least["memory_over_bytes"] > 0
    assert unfit["capacity_bytes"] == CAPACITY_BYTES and unfit["plans"] == 4
    for name in ("results.md", "summary.md"):
        assert "no method found a plan that fits in memory (4 plans)" in (out / name).read_text()
    assert all(s["instances_fit"] == 0 and s["geomean_speedup_over_data_parallel"] is None for s in report["summary"])


def test_ft_marks_a_plan_that_does_not_fit(tiny_memory: Path) -> None:
    graph = zoo.load("lenet", batch_size=32)
    topology = DeviceTopology.from_json(tiny_memory)
    [row] = compare_methods(graph, topology, ["ft"], options={"ft": {"max_configs": 2}})
    assert row.oom and row.plan.metadata["fits"] is False
    assert row.note.startswith("none of FT's ") and "fits in memory; this is the one that needs the least" in row.note
    pick = pick_over_device_counts(graph, topology, max_configs=2)
    assert not pick.fits and pick.point.plan.configs == row.plan.configs
    assert pick.points >= 2 and row.memory_over_bytes > 0
    frontier_overs = [  # every plan of FT's frontiers, at every device count, is at least as far over
        memory_over_bytes(simulate(graph, topology, point.plan))
        for n in pick.device_counts
        for point in run_ft(graph, topology, n, max_configs=2).points
    ]
    assert len(frontier_overs) == pick.points and row.memory_over_bytes == min(frontier_overs)
    assert best_over_device_counts(graph, topology, max_configs=2) is None
    # Where a plan fits, FT's answer is a plain fitting plan with no note.
    [fits] = compare_methods(graph, load_preset("trinity"), ["ft"], options={"ft": {"max_configs": 2}})
    assert not fits.oom and fits.note == "" and "fits" not in fits.plan.metadata


def test_best_result_is_the_least_memory_plan_when_none_fits(tiny_memory: Path) -> None:
    graph = zoo.load("lenet", batch_size=32)
    topology = DeviceTopology.from_json(tiny_memory)
    rows = compare_methods(graph, topology, ["data_parallel", "single_device", "layerwise"])
    assert all(r.oom for r in rows)
    best = best_result(rows)
    assert best is least_memory(rows)
    assert best.memory_over_bytes == min(r.memory_over_bytes for r in rows) > 0
    assert best.row()["memory_over_bytes"] == best.memory_over_bytes


def test_memory_saving_methods_say_they_do_not_fit(tiny_memory: Path) -> None:
    """``megatron`` and ``zero`` mark their least-memory plan when none fits, and once they are among the
    rows the explanation no longer suggests them."""
    from placement_rl.explain import explain_no_fit

    graph = zoo.load("lenet", batch_size=32)
    topology = DeviceTopology.from_json(tiny_memory)
    rows = compare_methods(graph, topology, ["data_parallel", "zero", "megatron"])
    assert all(r.oom for r in rows)
    for row in rows[1:]:
        assert row.plan.metadata["fits"] is False and "fits in memory; this is the one that needs the least" in row.note
    assert rows[1].plan.metadata["zero"] == 3  # ZeRO-1 did not fit either
    assert rows[2].plan.metadata["recompute"] == "full" and rows[2].plan.metadata["candidates"] >= 2
    words, document = explain_no_fit(graph, topology, rows)
    [shard] = [s for s in document["suggestions"] if s["kind"] == "shard"]
    assert shard["methods"] == [] and "--methods" not in shard["text"]
    partial = explain_no_fit(graph, topology, rows[:2])[1]
    assert [s["methods"] for s in partial["suggestions"] if s["kind"] == "shard"] == [["megatron"]]

"""The placement-rl command line: outputs, JSON modes and errors for unknown names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from placement_rl import zoo
from placement_rl.cli import main
from placement_rl.graph import OpGraph
from placement_rl.topology import DeviceTopology, preset_names


def test_models_lists_the_zoo(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in zoo.names())
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == zoo.names()
    assert {r["name"]: r["default_batch_size"] for r in rows}["inception_v3"] == 96


def test_topologies_lists_presets(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["topologies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == preset_names()
    assert {r["name"]: r["devices"] for r in rows}["flexflow-k80"] == 64


def test_show_graph_text_json_and_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["show-graph", "lenet", "--ops"]) == 0
    out = capsys.readouterr().out
    assert "graph lenet" in out and "conv2d" in out and "sample:s" in out
    path = tmp_path / "lenet.json"
    assert main(["show-graph", "lenet", "--batch-size", "8", "--json", "--out", str(path)]) == 0
    printed = OpGraph.from_dict(json.loads(capsys.readouterr().out))
    assert printed == OpGraph.from_json(path)
    assert printed.batch_size == 8
    # A graph file is accepted in place of a zoo name, and can be coarsened.
    assert main(["show-graph", str(path), "--coarsen", "4", "--json"]) == 0
    coarse = OpGraph.from_dict(json.loads(capsys.readouterr().out))
    assert coarse.num_ops == 4 and coarse.metadata["coarsened_from"] == "lenet"


def test_show_topology(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["show-topology", "tag-testbed"]) == 0
    assert "V100-SXM2-32GB" in capsys.readouterr().out
    path = tmp_path / "t.json"
    assert main(["show-topology", "random:5", "--out", str(path), "--json"]) == 0
    printed = DeviceTopology.from_dict(json.loads(capsys.readouterr().out))
    assert printed == DeviceTopology.from_json(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show-graph", "resnet9000"], "unknown model 'resnet9000'; expected one of: alexnet, bert_large"),
        (["show-topology", "dgx-9000"], "unknown topology 'dgx-9000'; expected one of:"),
        (["show-graph", "lenet", "--batch-size", "0"], "batch_size = 0"),
        (["show-graph", "missing.json"], "no such file: 'missing.json'"),
    ],
)
def test_bad_names_exit_2_with_valid_names(argv: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_malformed_graph_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "placement_rl.graph",', encoding="utf-8")
    assert main(["show-graph", str(bad)]) == 2
    assert "malformed JSON at line 1" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "placement-rl"  # installed by `pip install .` (README)
    done = subprocess.run([str(script), "show-graph", "nonexistent"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "expected one of" in done.stderr

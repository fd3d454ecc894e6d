"""Output paths: names from input files never choose where files go; bad output paths fail before work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placement_rl.cli import main
from placement_rl.paths import output_file, output_folder, safe_name
from placement_rl.topology import load_preset


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("x/../../somewhere", "x_.._.._somewhere"),
        ("..", "unnamed"),
        ("/etc/passwd", "_etc_passwd"),
        ("ok-1.2", "ok-1.2"),
    ],
)
def test_safe_name_is_one_harmless_component(name: str, expected: str) -> None:
    assert safe_name(name) == expected
    assert "/" not in safe_name(name) and not safe_name(name).startswith(".")


def test_a_topology_name_cannot_escape_the_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    document = load_preset("trinity").to_dict()
    document["name"] = "x/../../escaped"
    topology = tmp_path / "evil.json"
    topology.write_text(json.dumps(document))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = ["plan", "--model", "lenet", "--topology", str(topology), "--methods", "dp,single", "--json"]
    assert main(argv) == 0
    written = sorted(p.relative_to(work) for p in work.rglob("*") if p.is_file())
    assert written and all(p.parts[0] == "out" for p in written), written
    assert not (tmp_path / "escaped").exists() and not (work / "escaped").exists()


def test_output_paths_are_checked_before_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["search", "mcmc", "--model", "lenet", "--topology", "trinity", "--budget", "10", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "is a folder; expected a file path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no stray temporary file
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; expected a folder"):
        output_folder(tmp_path / "file")
    with pytest.raises(ValueError, match="is a file, so the folder cannot be created"):
        output_file(tmp_path / "file" / "plan.json")

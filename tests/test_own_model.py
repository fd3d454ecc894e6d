"""The docs page "Bring your own model and cluster" (docs/guide/own-model.md), run as written: its two
files are taken from the page, written to a fresh folder, and its commands run there in process."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from placement_rl.cli import main

PAGE = Path("docs") / "guide" / "own-model.md"


def _section(page: str) -> str:
    """The page up to its first second-level heading: the two files and the three commands."""
    end = page.find("\n## ")
    return page if end < 0 else page[:end]


def _block(text: str, after: str, language: str) -> str:
    """The first fenced ``language`` block after the line ``after``."""
    found = re.search(re.escape(after) + r".*?\n```" + language + r"\n(.*?)\n```", text, re.S)
    assert found, f"no {language} block after {after!r}"
    return found.group(1)


def test_own_model_section_runs_as_written(
    repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    section = _section((repo_root / PAGE).read_text(encoding="utf-8"))
    (tmp_path / "my_model.py").write_text(_block(section, "`my_model.py`:", "python") + "\n", encoding="utf-8")
    (tmp_path / "my_cluster.json").write_text(_block(section, "`my_cluster.json`", "json"), encoding="utf-8")
    commands = [
        line.split(" #", 1)[0].strip() for line in _block(section, "Then, in that folder:", "bash").splitlines()
    ]
    assert [c.split()[1] for c in commands] == ["import", "show-topology", "plan"]
    monkeypatch.chdir(tmp_path)  # the module is found in the current folder, as the section says
    for command in commands:
        assert main(shlex.split(command)[1:]) == 0, command
    out = capsys.readouterr().out
    graph = json.loads((tmp_path / "my_model.json").read_text(encoding="utf-8"))
    assert graph["format"] == "placement_rl.graph" and len(graph["ops"]) >= 5  # 3 linear + 2 relu (+ input)
    assert "my-cluster" in out and "best (fits in memory, lowest makespan)" in out
    for name in ("best_plan.json", "best_plan.gantt.png", "best_plan.trace.json"):
        assert (tmp_path / "out" / "mine" / name).is_file(), name

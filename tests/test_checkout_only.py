"""What the tests and the shipped calibration need lies in the repository (tests/checkout_guard.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import checkout_guard
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_beside_checkout_tells_siblings_from_the_checkout(tmp_path: Path) -> None:
    root = tmp_path / "work" / "main"  # two levels into the temporary folder: its siblings are checked
    assert checkout_guard.beside_checkout(root.parent / "shared" / "data" / "h200" / "x.json", root)
    assert checkout_guard.beside_checkout(root / ".." / "shared", root)
    assert not checkout_guard.beside_checkout(root / "benchmarks" / "data" / "h200" / "x.json", root)
    assert not checkout_guard.beside_checkout(tmp_path / "elsewhere" / "file", root)
    top = Path(root.anchor, "main")  # a checkout at the file system's root has nothing beside it
    assert not checkout_guard.beside_checkout(Path(root.anchor, "shared", "x"), top)


def test_a_read_beside_the_checkout_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "work" / "main"
    root.mkdir(parents=True)
    (root / "README.md").write_text("a checkout\n")
    monkeypatch.setattr(checkout_guard, "ROOT", root)  # the hook checks against this checkout now
    sibling = root.parent / "no-such-folder-beside-the-checkout" / "data.json"
    with pytest.raises(FileNotFoundError):
        sibling.read_text()
    assert checkout_guard.take() == [str(sibling)]  # taken here, so this test itself passes
    (root / "README.md").read_text()
    assert checkout_guard.take() == []


#: Spellings of a path beside the checkout in code, commands and docs: the sibling data folder reached
#: by a relative path, by ``parents[k] / "shared"`` climbing out, or by its data folder's name.
BESIDE = re.compile(r"[\"' ]\.\./shared/|/\s*\"shared\"\s*/|shared/data/")


def test_no_source_names_a_folder_beside_the_checkout() -> None:
    roots = ("placement_rl", "envs", "policies", "benchmarks", "tests", "tune_configs", "docs")
    files = [p for r in roots for p in (ROOT / r).rglob("*") if p.suffix in (".py", ".yaml", ".md", ".json")]
    files += [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    here = Path(__file__).resolve()
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        if p.resolve() != here and "data" not in p.relative_to(ROOT).parts[1:2]
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if BESIDE.search(line)
    ]
    assert found == []


def test_the_h200_measurements_are_in_the_repository() -> None:
    folder = ROOT / "benchmarks" / "data" / "h200"
    for name in ("iterations.jsonl", "iterations_shard_batches.jsonl", "iterations_cuda_graphs.jsonl"):
        rows = [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]
        assert rows and all("model" in r and "mode" in r for r in rows)
    topology = json.loads((folder / "topology_h200x1.json").read_text())
    assert topology["devices"][0]["device_type"] == "H200"
    assert "Provenance" in (folder / "README.md").read_text()

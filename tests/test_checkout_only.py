"""What the tests and the shipped calibration need lies in the repository (tests/checkout_guard.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import checkout_guard
import pytest

ROOT = checkout_guard.ROOT


def test_beside_checkout_tells_siblings_from_the_checkout() -> None:
    root = Path("/nowhere/work/main")
    assert checkout_guard.beside_checkout(root.parent / "shared" / "data" / "h200" / "x.json", root)
    assert checkout_guard.beside_checkout(root / ".." / "shared", root)
    assert not checkout_guard.beside_checkout(root / "benchmarks" / "data" / "h200" / "x.json", root)
    assert not checkout_guard.beside_checkout(Path("/elsewhere/file"), root)
    assert not checkout_guard.beside_checkout(Path("/shared/x"), Path("/main"))  # a checkout at / has no beside
    allowed = checkout_guard.ALLOWED[0]  # a checkout two levels into an allowed folder still has a beside
    assert checkout_guard.beside_checkout(Path(allowed, "ci", "shared", "x"), Path(allowed, "ci", "main"))
    assert not checkout_guard.beside_checkout(Path(allowed, "elsewhere", "x"), Path(allowed, "ci", "main"))


@pytest.mark.skipif(not checkout_guard.can_tell(), reason="a checkout at / or directly in /tmp or the home folder")
def test_a_read_beside_the_checkout_is_recorded() -> None:
    sibling = ROOT.parent / "no-such-folder-beside-the-checkout" / "data.json"
    with pytest.raises(FileNotFoundError):
        sibling.read_text()
    assert checkout_guard.take() == [str(sibling)]  # taken here, so this test itself passes
    (ROOT / "README.md").read_text()
    assert checkout_guard.take() == []


#: Spellings of a path beside the checkout in code, commands and docs: a quoted or bare ``../shared``
#: path, ``parents[k] / "shared"`` climbing out, or the shared data folder by name.
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

"""The `slow` list (tests/slow_tests.py) names tests that exist (a renamed test would silently lose its mark)."""

from __future__ import annotations

import ast
from pathlib import Path

from slow_tests import SLOW


def test_every_slow_entry_names_an_existing_test_function(repo_root: Path) -> None:
    for nodeid in SLOW:
        path, _, function = nodeid.partition("::")
        source = repo_root / path
        assert source.is_file(), f"SLOW names {nodeid!r}, but {path} does not exist"
        names = {n.name for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.FunctionDef)}
        assert function in names, f"SLOW names {nodeid!r}, but {path} defines no {function}()"

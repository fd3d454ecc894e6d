"""Load a benchmark script (``benchmarks/*.py``, not a package) as a module, for tests that call its
functions or its ``main``. Importable as ``scripts``: pytest puts this folder on ``sys.path``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """The script at ``path`` (relative to the repository root, or absolute), executed as a fresh
    module called ``name`` (default ``benchmark_<stem>``)."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(name or f"benchmark_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

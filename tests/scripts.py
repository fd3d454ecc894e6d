"""Load a benchmark script (``benchmarks/*.py``, not a package) as a module, for tests that call its
functions or its ``main``. Importable as ``scripts``: pytest puts this folder on ``sys.path``."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

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


def interrupt_once(argv: list[str], marker: bytes, **popen: Any) -> tuple[int, str, str]:
    """Run ``argv`` as a child process, send it SIGINT (Ctrl-C) once ``marker`` appears on its stderr, and
    return its exit status, stdout and all of its stderr; the child is killed if anything goes wrong."""
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    assert child.stderr is not None
    seen = b""
    try:
        while marker not in seen:
            chunk = os.read(child.stderr.fileno(), 4096)
            assert chunk, f"the command ended before it was interrupted: {seen.decode()[-2000:]}"
            seen += chunk
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    return child.returncode, stdout.decode(), (seen + stderr).decode()

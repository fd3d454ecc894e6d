"""Everything a test reads lies in the checkout (tests/conftest.py's ``outside_reads`` fixture).

An audit hook (:func:`sys.addaudithook`) sees every file the test process opens, lists or globs,
and keeps the paths that lie beside the checkout: in the checkout's parent folder but neither in
the checkout nor in the interpreter's, the temporary or the home folder. A developer's machine and
CI's may hold data in a folder next to the checkout that a user's fresh clone does not have; a test
that reads it passes there and fails for the user. Importable as ``checkout_guard``: pytest puts
this folder on ``sys.path`` for its conftest.py.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The checkout's root folder (where README.md and pyproject.toml live); read at each check, so that
#: a test may stand another checkout in for it.
ROOT = Path(__file__).resolve().parents[1]
#: Folders a test may read wherever the checkout lies: the interpreter's, the temporary folder's and
#: the home folder's (the kernels' and libraries' caches).
ALLOWED = tuple(
    sorted({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, tempfile.gettempdir(), Path.home())})
)
#: The audit events that name a path as their first argument.
PATH_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "glob.glob"})
#: Paths beside the checkout read since the last :func:`take`.
_seen: list[str] = []
_installed: list[Any] = []


def beside_checkout(path: str | os.PathLike[str], root: Path | None = None) -> bool:
    """Whether ``path`` lies beside the checkout ``root`` (default :data:`ROOT`): in ``root``'s parent
    folder, not in ``root`` and not in a folder :func:`exempt` keeps. A checkout directly under the
    file system's root has nothing beside it."""
    root = ROOT if root is None else root
    parent = os.path.dirname(str(root))
    if parent == os.path.dirname(parent):
        return False
    full = os.path.abspath(path)  # no system call: most paths are settled here
    if not full.startswith(parent + os.sep) or full.startswith(str(root) + os.sep):
        return False
    full = os.path.realpath(full) + os.sep
    return full.startswith(parent + os.sep) and not full.startswith((str(root) + os.sep, *exempt(parent)))


def exempt(parent: str) -> tuple[str, ...]:
    """The :data:`ALLOWED` folders that still exempt a path in ``parent``: not those that hold
    ``parent`` deeper down (a checkout two levels into the temporary folder has its siblings checked,
    though the temporary folder is allowed). A checkout directly in an allowed folder cannot tell what
    is beside it from that folder's own files, which stay allowed."""
    return tuple(d for d in ALLOWED if not (parent + os.sep).startswith(d) or d == parent + os.sep)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in PATH_EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if beside_checkout(path):
            _seen.append(path)


def install() -> None:
    """Start watching (once per process; an audit hook cannot be removed)."""
    if _audit not in _installed:
        sys.addaudithook(_audit)
        _installed.append(_audit)


def take() -> list[str]:
    """The paths beside the checkout read since the last call, sorted, without repeats; and forget them."""
    paths = sorted(set(_seen))
    _seen.clear()
    return paths

"""Everything a test reads lies in the checkout (tests/conftest.py's ``outside_reads`` fixture).

An audit hook (:func:`sys.addaudithook`) sees every file the test process opens, lists or globs,
and keeps the paths that lie beside the checkout: in the checkout's parent folder but neither in
the checkout nor in the interpreter's, the temporary or the home folder. A developer's machine and
CI's have a ``../shared`` folder there that a user's fresh clone does not; a test that reads it
passes here and fails for the user. Importable as ``checkout_guard``: pytest puts this folder on
``sys.path`` for its conftest.py.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The checkout's root folder (where README.md and pyproject.toml live).
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


def beside_checkout(path: str | os.PathLike[str], root: Path = ROOT) -> bool:
    """Whether ``path`` lies beside the checkout ``root``: in ``root``'s parent folder, not in ``root``
    and not in an :data:`ALLOWED` folder. A checkout directly under ``/`` has nothing beside it."""
    parent = os.path.dirname(str(root))
    if parent == os.sep:
        return False
    full = os.path.abspath(path)  # no system call: most paths are settled here
    if not full.startswith(parent + os.sep) or full.startswith(str(root) + os.sep):
        return False
    full = os.path.realpath(full) + os.sep
    return full.startswith(parent + os.sep) and not full.startswith((str(root) + os.sep, *exempt(parent)))


def exempt(parent: str) -> tuple[str, ...]:
    """The :data:`ALLOWED` folders that still exempt a path in ``parent``: not those that hold
    ``parent`` deeper down (a checkout at ``/tmp/ci/main`` has ``/tmp/ci/shared`` beside it, though
    ``/tmp`` is allowed). A checkout directly in an allowed folder (``/tmp/main``) cannot tell what
    is beside it from that folder's own files, which stay allowed."""
    return tuple(d for d in ALLOWED if not (parent + os.sep).startswith(d) or d == parent + os.sep)


def can_tell(root: Path = ROOT) -> bool:
    """Whether reads beside ``root`` can be told from the allowed folders' (see :func:`exempt`)."""
    parent = os.path.dirname(str(root))
    return parent != os.sep and parent + os.sep not in ALLOWED


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


_installed: list[Any] = []


def take() -> list[str]:
    """The paths beside the checkout read since the last call, sorted, without repeats; and forget them."""
    paths = sorted(set(_seen))
    _seen.clear()
    return paths

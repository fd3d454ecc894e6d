"""Where outputs go: file names derived from inputs are made safe, output paths are checked before work.

Names inside input files (a graph's or a topology's ``name``) end up in default output folders such
as ``out/plan-<model>-<topology>``. :func:`safe_name` reduces such a name to one harmless path
component, so that nothing is ever written outside the chosen output folder. :func:`output_file`
and :func:`output_folder` check a user's output path before any work starts (a search that runs for
minutes must not fail at its last step because ``--out`` names a folder): a file where a folder is
expected or the reverse, a dangling symlink, a parent that is a file, and a place that cannot be
written. Writability is checked by writing (a probe file, created and removed at once), because
``os.access`` answers yes to root for a read-only mount.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._+@=-]+")
#: Prefix of the probe files :func:`output_file` and :func:`output_folder` create and remove at once.
PROBE_PREFIX = ".placement-rl-probe-"


def safe_name(text: str, fallback: str = "unnamed") -> str:
    """``text`` as one path component: runs of characters outside ``[A-Za-z0-9._+@=-]`` become ``_``,
    leading dots are dropped (no ``..``, no hidden files), at most 100 characters.

    >>> safe_name("x/../../somewhere")
    'x_.._.._somewhere'
    >>> safe_name("../..")
    '_..'
    """
    name = _UNSAFE.sub("_", text).lstrip(".")[:100]
    return name if name and name not in (".", "..") else fallback


def _dangling(p: Path) -> str | None:
    """The target of ``p`` when ``p`` is a symlink to nothing, else ``None``."""
    if p.is_symlink() and not p.exists():
        return os.readlink(p)
    return None


def _existing_ancestor(p: Path, what: str, shown: str) -> Path:
    """The nearest existing folder above ``p`` (the folders between are created by the writer).

    Raises:
        ValueError: when that ancestor is a file, or a symlink to nothing, so no folder can be made there.
    """
    parent = p.parent
    while not parent.exists():
        target = _dangling(parent)
        if target is not None:
            raise ValueError(
                f"{what} {shown!r}: {str(parent)!r} is a symlink to {target!r}, which does not exist, so the "
                "folder cannot be created"
            )
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {shown!r}: {str(parent)!r} is a file, so the folder cannot be created")
    return parent


def _probe(folder: Path, what: str, shown: str) -> None:
    """Create and remove a file in ``folder``.

    Raises:
        ValueError: naming ``what``, the path and the operating system's reason, when it cannot be written.
    """
    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{what} {shown!r}: cannot write in {str(folder)!r} ({exc.strerror or exc})") from None


def _named_path(path: str | os.PathLike[str], what: str, expected: str) -> tuple[Path, str]:
    """``path`` and its text for messages; an empty path or a symlink to nothing is a ``ValueError``."""
    if not os.fspath(path):
        raise ValueError(f"{what} is empty; expected {expected}")
    p = Path(path)
    shown = str(p)
    target = _dangling(p)
    if target is not None:
        raise ValueError(
            f"{what} {shown!r} is a symlink to {target!r}, which does not exist; expected {expected} "
            "(remove the link, or make its target)"
        )
    return p, shown


def output_file(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """``path`` as a file the caller will write: not a folder, not a symlink to nothing, not a device or
    pipe, its nearest existing parent a folder this process can write in (checked by writing a probe
    file there); nothing is left behind.

    Raises:
        ValueError: naming ``what``, the path and what is wrong with it.
    """
    p, shown = _named_path(path, what, "a file path")
    if p.is_dir():
        raise ValueError(f"{what} {shown!r} is a folder; expected a file path")
    if p.exists() and not p.is_file():
        raise ValueError(f"{what} {shown!r} is not a regular file (a device, pipe or socket); expected a file path")
    # Writers replace the file atomically through a temporary file beside it: its folder must be writable.
    folder = p.parent if p.exists() else _existing_ancestor(p, what, shown)
    _probe(folder, what, shown)
    return p


def output_folder(path: str | os.PathLike[str], what: str = "--out-dir") -> Path:
    """``path`` as a folder the caller will write into (created now, and checked by writing a probe file
    in it).

    Raises:
        ValueError: when it names a file (or a symlink to one, or to nothing), has a file as a parent, or
            cannot be created or written.
    """
    p, shown = _named_path(path, what, "a folder")
    if p.exists() and not p.is_dir():
        link = f" (a symlink to {os.readlink(p)!r})" if p.is_symlink() else ""
        raise ValueError(f"{what} {shown!r} is a file{link}; expected a folder")
    if not p.exists():
        _existing_ancestor(p, what, shown)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{what} {shown!r}: cannot create the folder ({exc.strerror or exc})") from None
    _probe(p, what, shown)
    return p

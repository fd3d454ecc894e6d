"""Where outputs go: file names derived from inputs are made safe, output paths are checked before work.

Names inside input files (a graph's or a topology's ``name``) end up in default output folders such
as ``out/plan-<model>-<topology>``. :func:`safe_name` reduces such a name to one harmless path
component, so that nothing is ever written outside the chosen output folder. :func:`output_file`
and :func:`output_folder` check a user's output path before any work starts (a search that runs for
minutes must not fail at its last step because ``--out`` names a folder).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._+@=-]+")


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


def output_file(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """``path`` as a file the caller will write: not an existing folder, its parent creatable.

    Raises:
        ValueError: naming ``what`` and the path.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{what} {str(p)!r} is a folder; expected a file path")
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {str(p)!r}: {str(parent)!r} is a file, so the folder cannot be created")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{what} {str(p)!r}: cannot write under {str(parent)!r}")
    return p


def output_folder(path: str | os.PathLike[str], what: str = "--out-dir") -> Path:
    """``path`` as a folder the caller will write into (created now).

    Raises:
        ValueError: when it names an existing file or cannot be created.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what} {str(p)!r} is a file; expected a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{what} {str(p)!r}: cannot create the folder ({exc.strerror})") from None
    return p

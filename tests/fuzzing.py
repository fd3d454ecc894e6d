"""Helpers of the fuzz tests: walking a JSON-like document and changing one place in a copy of it.

Importable as ``fuzzing``: pytest puts this folder on ``sys.path`` for its conftest.py.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

#: A path of keys and indices into a document.
KeyPath = tuple[Any, ...]


def leaves(doc: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every leaf (neither dict nor list) of ``doc`` with its path."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from leaves(v, (*path, i))
    else:
        yield path, doc


def set_at(doc: Any, path: KeyPath, value: Any) -> Any:
    """A deep copy of ``doc`` with ``value`` at ``path``."""
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def delete_at(doc: Any, path: KeyPath) -> Any:
    """A deep copy of ``doc`` without the entry at ``path``."""
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


def dumps(doc: Any) -> str:
    """JSON text; the marker ``"INF"`` becomes the number ``1e400`` (infinite when read)."""
    return json.dumps(doc).replace('"INF"', "1e400")

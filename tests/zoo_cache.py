"""The session's zoo imports: :func:`load` is ``zoo.load`` through a per-process cache.

Importable as ``zoo_cache``: pytest puts this folder on ``sys.path`` for its conftest.py. The
``zoo_graph`` fixture (tests/conftest.py) hands this function out; a test module may also call it
while it is being collected (to generate its cases from a model) and so share the import with its
tests. Graphs are immutable, so sharing them is safe; a failed import is not cached (it raises again).
"""

from __future__ import annotations

from placement_rl import zoo
from placement_rl.graph import OpGraph

_CACHE: dict[tuple[str, tuple[tuple[str, object], ...]], OpGraph] = {}
_ZOO_LOAD = zoo.load  # the importer itself, even while a test stands `load` in for `zoo.load`


def load(name: str, **options: object) -> OpGraph:
    """``zoo.load(name, **options)``, imported once per session (``batch_size=None`` is the default)."""
    if options.get("batch_size", 0) is None:
        del options["batch_size"]
    key = (name, tuple(sorted(options.items())))
    if key not in _CACHE:
        _CACHE[key] = _ZOO_LOAD(name, **options)  # type: ignore[arg-type]
    return _CACHE[key]

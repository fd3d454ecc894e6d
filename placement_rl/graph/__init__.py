"""The computation graph: the IR (:mod:`.ir`), the PyTorch importer (:mod:`.importer`) and METIS
op groups (:mod:`.coarsen`).

``from_torch`` is imported lazily (it imports torch); everything else here is numpy only.
``register_leaf`` (:mod:`.leaves`) makes a layer class of one's own one op in both importers.
"""

from typing import Any

from placement_rl.graph.ir import (
    DIM_KINDS,
    GRAPH_FORMAT,
    GRAPH_SCHEMA_VERSION,
    GRAPH_SCHEMA_VERSIONS,
    SPLIT_CLASSES,
    DimKind,
    GraphArrays,
    Op,
    OpGraph,
    ParallelDim,
    Shape,
    SplitClass,
    Tensor,
)
from placement_rl.graph.leaves import register_leaf


def from_torch(*args: Any, **kwargs: Any) -> OpGraph:
    """Trace a ``torch.nn.Module`` into an :class:`OpGraph`; see :func:`placement_rl.graph.importer.from_torch`.

    Imported on first call: it imports torch, and nothing else in this package does.
    """
    from placement_rl.graph.importer import from_torch as _from_torch

    return _from_torch(*args, **kwargs)


__all__ = [
    "DIM_KINDS",
    "GRAPH_FORMAT",
    "GRAPH_SCHEMA_VERSION",
    "GRAPH_SCHEMA_VERSIONS",
    "SPLIT_CLASSES",
    "DimKind",
    "GraphArrays",
    "Op",
    "OpGraph",
    "ParallelDim",
    "Shape",
    "SplitClass",
    "Tensor",
    "from_torch",
    "register_leaf",
]

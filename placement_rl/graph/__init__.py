"""The computation graph: the IR (:mod:`.ir`), the PyTorch importer (:mod:`.importer`) and METIS
op groups (:mod:`.coarsen`).

``from_torch`` is imported lazily (it imports torch); everything else here is numpy only.
``register_leaf`` (:mod:`.leaves`) makes a layer class of one's own one op in both importers.
"""

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
    from_torch,
)
from placement_rl.graph.leaves import register_leaf

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

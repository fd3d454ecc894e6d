"""placement-rl: place and shard deep-learning training graphs on GPU clusters.

The core (graph, zoo, topology, plan, coarsening, simulator, search) imports neither Ray nor RLlib.
"""

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.simulator import simulate

__version__ = "0.1.0"

__all__ = ["Op", "OpGraph", "ParallelDim", "Tensor", "__version__", "simulate"]

"""placement-rl: place and shard deep-learning training graphs on GPU clusters.

The core (graph, zoo, topology, plan, coarsening, simulator, search) imports neither Ray nor RLlib.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
from placement_rl.sim import simulate

__version__ = "0.1.0"

__all__ = ["Op", "OpGraph", "ParallelDim", "Tensor", "__version__", "simulate"]

#: Sub-packages that live beside this folder in a source checkout (``envs/``, ``policies/``) and are
#: installed inside it (see ``package-dir`` in pyproject.toml).
_SIBLINGS = ("envs", "policies")


class _CheckoutSiblings(importlib.abc.MetaPathFinder):
    """Find ``placement_rl.envs`` / ``placement_rl.policies`` in a source checkout.

    An installed package has them inside; a checkout has them beside ``placement_rl/``. When the
    checkout's copy is the one imported (``python -m pytest`` from the repository root, or a
    ``ray job submit --working-dir .`` job, whose working directory is on the Python path), this
    finder maps the two names, and only them, to the sibling folders.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        head, _, rest = fullname.partition(".")
        if head != "placement_rl" or not rest:
            return None
        top, _, _ = rest.partition(".")
        if top not in _SIBLINGS:
            return None
        location = self.root / Path(*rest.split("."))
        init = location / "__init__.py"
        if init.is_file():
            return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(location)])
        module = location.with_suffix(".py")
        if module.is_file():
            return importlib.util.spec_from_file_location(fullname, module)
        return None


_here = Path(__file__).resolve().parent
if not (_here / "envs").is_dir() and (_here.parent / "envs" / "__init__.py").is_file():
    sys.meta_path.append(_CheckoutSiblings(_here.parent))

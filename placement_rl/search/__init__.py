"""Deterministic search baselines over the shared simulator (no Ray import here).

* :func:`mcmc`: FlexFlow's Metropolis-Hastings search with delta simulation, with the proposal
  kinds of :mod:`placement_rl.search.proposals`, an adaptive temperature and parallel tempering.
* :func:`exhaustive`: branch-and-bound over the same configuration space, for exact optima of
  small instances (FlexFlow sec. 8.3).
* :class:`SearchSpace`: the SOAP configuration sets both search over.
* :mod:`placement_rl.search.ft`: TensorOpt's Frontier-Tracking (the memory vs time cost frontier),
  built on :mod:`placement_rl.search.ft.configs` (meshes and tensor maps),
  :mod:`placement_rl.search.ft.rescheduling` (layout changes), :mod:`placement_rl.search.ft.costs`
  (additive cost tables) and :mod:`placement_rl.search.ft.frontier` (frontier algebra,
  eliminations, Linear DP).

Work that splits into independent calls (MCMC chains, FT chunks) goes through an injected
:class:`placement_rl.parallel.TaskMap`.
"""

from placement_rl.search.exhaustive import ExhaustiveResult, exhaustive
from placement_rl.search.mcmc import Budget, MCMCResult, mcmc
from placement_rl.search.space import SearchSpace

__all__ = ["Budget", "ExhaustiveResult", "MCMCResult", "SearchSpace", "exhaustive", "mcmc"]

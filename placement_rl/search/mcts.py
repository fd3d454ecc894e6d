"""TAG's Monte-Carlo tree search (seed 001, sec. 4.2.2) over :class:`~placement_rl.search.tag.TagProblem`.

The tree has one level per op group, in the problem's decision order; an edge is an action (a
device-group subset x a replication option). Each iteration walks down by PUCT,

    a* = argmax_a  Q(a) + c * P(a) * sqrt(sum_b N(b)) / (1 + N(a)),

with ``Q`` the mean leaf value below the edge (0, the data-parallel level, before any visit), ``P``
the prior and ``N`` the visit counts; ``c`` is the configured constant or, by default, TAG's public
code's ``sqrt(#valid children / 10)``. The walk stops at the first edge without a child; that
leaf's partial plan is completed by the problem's completion rule and scored on the original op
graph by :meth:`TagProblem.evaluate` (cached: plans seen before cost nothing); its
:func:`~placement_rl.search.tag.leaf_value` is backed up. By default (``completion="best"``,
:mod:`placement_rl.search.tag`) a leaf scores as the best of TAG's rule (undecided groups take the
strategy of the first decided one), data parallelism over the device groups decided so far and a
one-pass rollout, so a good first move is not hidden behind a completion that undoes it; with
``completion="tag"`` it is TAG's rule alone. There is no value network.

**Prior.** ``prior(decision_prefixes) -> (B, A)`` probabilities, called once per batch of new
leaves (``leaf_batch`` leaves are selected with a virtual loss, so one batch holds different
leaves); ``None`` is the uniform prior over the valid actions (pure MCTS). Invalid actions (the
memory mask of :meth:`TagProblem.action_mask`) are never chosen.

**Result.** The best completed plan seen (the fastest that fits; else the fastest; the root's own
completion counts), as the full decision list that reproduces it, with the iteration at which a
plan first beat data parallelism (TAG's Table 7 metric) and an anytime trace.

**Tree reuse.** :meth:`MCTS.commit` moves the root to a child and keeps its subtree (self-play).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from placement_rl.search.tag import TagEval, TagProblem, better

#: ``prior(prefixes) -> (B, num_actions)`` probabilities for the groups after each decision prefix.
PriorFn = Callable[[Sequence[tuple[int, ...]]], np.ndarray]


@dataclass(frozen=True)
class MCTSConfig:
    """Tree-search options.

    Attributes:
        c_puct: the exploration constant; None: ``sqrt(#valid children / 10)`` per vertex (TAG's code).
        leaf_batch: leaves selected (with a virtual loss) per prior call.
        virtual_loss: the value subtracted from an edge while its leaf waits in a batch.
    """

    c_puct: float | None = None
    leaf_batch: int = 8
    virtual_loss: float = 1.0

    def __post_init__(self) -> None:
        if self.c_puct is not None and not (math.isfinite(self.c_puct) and self.c_puct > 0):
            raise ValueError(f"c_puct = {self.c_puct!r}; expected a finite number > 0 or None")
        if self.leaf_batch < 1:
            raise ValueError(f"leaf_batch = {self.leaf_batch!r}; expected an integer >= 1")
        if not (math.isfinite(self.virtual_loss) and self.virtual_loss >= 0):
            raise ValueError(f"virtual_loss = {self.virtual_loss!r}; expected a finite number >= 0")


class _Vertex:
    """A tree vertex: the state after ``decisions``; per-action statistics of its outgoing edges."""

    __slots__ = ("children", "decisions", "expanded", "n", "prior", "used", "valid", "w")

    def __init__(self, decisions: tuple[int, ...], num_actions: int) -> None:
        self.decisions = decisions
        self.n = np.zeros(num_actions)
        self.w = np.zeros(num_actions)
        self.prior = np.zeros(num_actions)
        self.valid = np.zeros(num_actions, np.bool_)
        self.children: dict[int, _Vertex] = {}
        self.expanded = False
        self.used: np.ndarray | None = None


@dataclass
class SearchResult:
    """What a search found.

    Attributes:
        decisions: the best plan's actions (a full decision list, in the problem's decision order).
        evaluation: its simulation.
        iterations: leaf evaluations done.
        elapsed_s: the search's wall-clock seconds.
        first_beat_dp: the first iteration (1-based) whose leaf was faster than data parallelism
            and fit in memory; None if none did.
        anytime: ``(seconds, iteration, best speedup over data parallelism)`` at each improvement.
        simulations: leaf plans simulated (the rest came from the cache).
    """

    decisions: tuple[int, ...]
    evaluation: TagEval
    iterations: int
    elapsed_s: float
    first_beat_dp: int | None
    anytime: list[tuple[float, int, float]] = field(default_factory=list)
    simulations: int = 0

    @property
    def speedup(self) -> float:
        return self.evaluation.speedup


class MCTS:
    """The tree search of the module docstring, on one :class:`TagProblem`.

    Args:
        problem: the instance.
        prior: the prior (None: uniform over valid actions).
        config: the search options.
    """

    def __init__(self, problem: TagProblem, prior: PriorFn | None = None, config: MCTSConfig | None = None) -> None:
        self.problem = problem
        self.prior = prior
        self.config = config or MCTSConfig()
        self.A = problem.num_actions
        self.root = _Vertex((), self.A)
        self._expand([self.root])
        start = problem.evaluate(())
        self.best_decisions: tuple[int, ...] = start.decisions
        self.best: TagEval = start
        self.iterations = 0
        self.elapsed_s = 0.0
        self.first_beat_dp: int | None = None
        self.anytime: list[tuple[float, int, float]] = [(0.0, 0, start.speedup if not start.oom else 0.0)]
        self._simulations0 = problem.evaluations

    # ---------------------------------------------------------------- expansion
    def _expand(self, vertices: Sequence[_Vertex]) -> None:
        """Give each vertex its valid actions and prior (one prior call for all of them)."""
        todo = [v for v in vertices if not v.expanded and len(v.decisions) < self.problem.num_groups]
        if not todo:
            return
        for v in todo:
            parent_used = v.used if v.used is not None else self.problem.used(v.decisions)
            v.used = parent_used
            v.valid = self.problem.action_mask(v.decisions, parent_used).astype(np.bool_)
        if self.prior is None:
            for v in todo:
                v.prior = v.valid / v.valid.sum()
        else:
            probs = np.asarray(self.prior([v.decisions for v in todo]), dtype=np.float64)
            if probs.shape != (len(todo), self.A):
                raise ValueError(f"prior returned shape {probs.shape}; expected ({len(todo)}, {self.A})")
            for v, p in zip(todo, probs, strict=True):
                p = np.where(v.valid, np.clip(p, 0.0, None), 0.0)
                total = p.sum()
                v.prior = p / total if total > 0 and np.isfinite(total) else v.valid / v.valid.sum()
        for v in todo:
            v.expanded = True

    def _select(self, v: _Vertex) -> int:
        c = self.config.c_puct
        if c is None:
            c = math.sqrt(int(v.valid.sum()) / 10.0)
        n = v.n
        q = np.divide(v.w, n, out=np.zeros_like(v.w), where=n > 0)
        u = q + c * v.prior * math.sqrt(max(n.sum(), 1.0)) / (1.0 + n)
        u = np.where(v.valid, u, -np.inf)
        return int(np.argmax(u))

    def _child(self, v: _Vertex, a: int) -> _Vertex:
        child = v.children.get(a)
        if child is None:
            child = _Vertex((*v.decisions, a), self.A)
            assert v.used is not None
            k = len(v.decisions)
            child.used = v.used + self.problem.need(int(self.problem.order[k]), a)
            v.children[a] = child
        return child

    # ------------------------------------------------------------------- search
    def run(
        self,
        iterations: int | None = None,
        time_s: float | None = None,
        *,
        until_beats_dp: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> SearchResult:
        """Search for ``iterations`` leaf evaluations and/or ``time_s`` seconds (whichever ends first;
        at least one must be given), or until a leaf beats data parallelism with ``until_beats_dp``.
        ``progress(done, total)`` is called after each batch (``total`` 0 for a time budget).
        Returns :meth:`result`."""
        if iterations is None and time_s is None:
            raise ValueError("run() needs iterations or time_s")
        G, vl = self.problem.num_groups, self.config.virtual_loss
        start = time.perf_counter()
        done = 0
        while True:
            if iterations is not None and done >= iterations:
                break
            if time_s is not None and time.perf_counter() - start >= time_s:
                break
            if until_beats_dp and self.first_beat_dp is not None:
                break
            batch = self.config.leaf_batch if iterations is None else min(self.config.leaf_batch, iterations - done)
            paths: list[tuple[list[tuple[_Vertex, int]], _Vertex]] = []
            for _ in range(batch):
                v, path = self.root, []
                while len(v.decisions) < G and v.expanded:
                    a = self._select(v)
                    path.append((v, a))
                    if vl:
                        v.n[a] += 1.0
                        v.w[a] -= vl
                    v = self._child(v, a)
                paths.append((path, v))
            self._expand([leaf for _, leaf in paths])
            for path, leaf in paths:
                evaluation = self.problem.evaluate(leaf.decisions)
                self.iterations += 1
                for v, a in path:  # undo the virtual loss, add the leaf's value
                    if vl:
                        v.n[a] -= 1.0
                        v.w[a] += vl
                    v.n[a] += 1.0
                    v.w[a] += evaluation.value
                if better(evaluation, self.best):
                    self.best, self.best_decisions = evaluation, evaluation.decisions
                    elapsed = self.elapsed_s + time.perf_counter() - start
                    self.anytime.append((elapsed, self.iterations, evaluation.speedup if not evaluation.oom else 0.0))
                if self.first_beat_dp is None and not evaluation.oom and evaluation.speedup > 1.0:
                    self.first_beat_dp = self.iterations
            done += batch
            if progress is not None:
                progress(done, iterations or 0)
        self.elapsed_s += time.perf_counter() - start
        return self.result()

    def result(self) -> SearchResult:
        """The best plan so far and the search's figures."""
        return SearchResult(
            self.best_decisions,
            self.best,
            self.iterations,
            self.elapsed_s,
            self.first_beat_dp,
            list(self.anytime),
            self.problem.evaluations - self._simulations0,
        )

    # ---------------------------------------------------------------- self-play
    def policy(self) -> np.ndarray:
        """(num_actions,) the root's visit distribution ``N / sum N`` (TAG's training target)."""
        n = self.root.n
        total = n.sum()
        return n / total if total > 0 else self.root.prior.copy()

    @property
    def root_visits(self) -> int:
        return int(self.root.n.sum())

    def commit(self, action: int) -> None:
        """Decide the root's group with ``action``: its child becomes the root, subtree kept.

        Raises:
            ValueError: for an action the root's mask forbids, or when every group is decided.
        """
        if len(self.root.decisions) >= self.problem.num_groups:
            raise ValueError("every group is decided; nothing to commit")
        if not 0 <= action < self.A or not self.root.valid[action]:
            raise ValueError(f"action {action} is not valid at the root (memory mask)")
        self.root = self._child(self.root, int(action))
        self._expand([self.root])


def mcts_search(
    problem: TagProblem,
    *,
    iterations: int | None = None,
    time_s: float | None = None,
    prior: PriorFn | None = None,
    config: MCTSConfig | None = None,
    until_beats_dp: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """One tree search from the empty plan (see :class:`MCTS`); the best plan seen."""
    tree = MCTS(problem, prior, config)
    return tree.run(iterations, time_s, until_beats_dp=until_beats_dp, progress=progress)


def self_play(
    problem: TagProblem,
    prior: PriorFn | None,
    rng: np.random.Generator,
    *,
    iterations_per_move: int,
    moves: int,
    min_visits: int = 1,
    config: MCTSConfig | None = None,
    temperature: float = 1.0,
) -> tuple[list[tuple[tuple[int, ...], np.ndarray]], SearchResult]:
    """TAG's self-play episode: search, record ``(decisions, pi)`` at the root, sample the move from
    ``pi`` (``temperature`` 0: the most visited), commit it keeping the tree; ``moves`` times (TAG's
    code commits a quarter of the groups per episode).

    Returns:
        The training samples (root decision prefix, ``pi`` of shape (num_actions,)) of roots with at
        least ``min_visits`` visits, and the search's result.
    """
    tree = MCTS(problem, prior, config)
    samples: list[tuple[tuple[int, ...], np.ndarray]] = []
    for _ in range(min(moves, problem.num_groups)):
        tree.run(iterations_per_move)
        pi = tree.policy()
        if tree.root_visits >= min_visits:
            samples.append((tree.root.decisions, pi))
        if temperature <= 0:
            action = int(np.argmax(pi))
        else:
            p = pi ** (1.0 / temperature)
            p = np.where(tree.root.valid, p, 0.0)
            action = int(rng.choice(len(p), p=p / p.sum())) if p.sum() > 0 else int(np.argmax(tree.root.valid))
        tree.commit(action)
    return samples, tree.result()

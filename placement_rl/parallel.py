"""How the core runs independent pieces of work: an injected *task map*, serial by default.

The searches never import Ray. Work that splits into independent calls (MCMC chains, the chunks
of one FT frontier product, the cells of a comparison) goes through a :class:`TaskMap`:
``task_map(fn, args) -> [fn(*a) for a in args]``, results in the order of ``args``. The default,
:func:`serial_map`, runs them one after the other in this process; the Ray edge provides
:class:`placement_rl.rl.parallel.RayMap`, which runs each call as a Ray task (the way
``concurrent.futures`` executors are injected). Both give the same results.

Progress: when ``report`` is given, each call gets a keyword argument ``report``, a callable taking
one picklable value (e.g. ``(proposals, best_cost_s)``); the map relays it to the caller as
``report(index_of_the_call, value)`` (at once for :func:`serial_map`, when the driver next polls
for Ray tasks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

Report = Callable[[int, Any], None]


class TaskMap(Protocol):
    """``task_map(fn, args, report=None) -> list``: ``fn(*a)`` for every ``a`` of ``args``, in order.

    A map may carry a ``chunk_points`` attribute: the most candidate points FT should put in one
    piece of work for it (smaller for distributed maps, so that large products spread out).
    """

    def __call__(
        self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], report: Report | None = None
    ) -> list[Any]: ...


def serial_map(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], report: Report | None = None) -> list[Any]:
    """The default :class:`TaskMap`: call ``fn(*a)`` for each ``a`` in order, in this process."""
    if report is None:
        return [fn(*a) for a in args]
    out = []
    for k, a in enumerate(args):

        def relay(value: Any, k: int = k) -> None:
            report(k, value)

        out.append(fn(*a, report=relay))
    return out

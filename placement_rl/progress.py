"""The one progress bar of the project: long work (searches, profiling, training, comparisons) reports
through :class:`Progress`, a thin layer over ``tqdm`` that is a no-op when disabled.

Work measured in units (ops, proposals, cells) moves the bar with :meth:`Progress.update_to`; work
with a time budget (``seconds=True``) moves it by the seconds of budget spent, as the work counts them
(a search's preparation is not budget), with the units done in the postfix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class Progress:
    """A progress bar over ``total`` units (``None``: unknown), or over ``total`` seconds.

    Args:
        total: units (or seconds, with ``seconds=True``) the work takes; ``None`` if unknown.
        desc: the bar's label.
        unit: what one unit is (``"op"``, ``"proposal"``).
        enabled: ``False`` makes every method a no-op (no tqdm import).
        seconds: the bar shows seconds of a budget against ``total`` seconds; :meth:`update_to` is given
            the seconds spent, as the work counts them.
        leave: keep the finished bar on screen.
    """

    def __init__(
        self,
        total: float | None,
        desc: str,
        unit: str = "it",
        *,
        enabled: bool = True,
        seconds: bool = False,
        leave: bool = True,
    ) -> None:
        self.enabled = enabled
        self.seconds = seconds
        self._bar: Any = None
        if not enabled:
            return
        from tqdm.auto import tqdm

        if seconds:
            self._bar = tqdm(
                total=total,
                desc=desc,
                dynamic_ncols=True,
                leave=leave,
                bar_format="{l_bar}{bar}| {n:.1f}/{total:g} s{postfix}",
            )
        else:
            self._bar = tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, leave=leave)

    def update_to(self, done: float, total: float | None = None, **postfix: Any) -> None:
        """Move the bar to ``done`` units (seconds of the budget for a time bar, at most its total)."""
        bar = self._bar
        if bar is None:
            return
        if total is not None:
            bar.total = total
        if self.seconds and bar.total is not None:
            done = min(done, bar.total)
        bar.update(done - bar.n)
        if postfix:
            bar.set_postfix(**postfix)

    def advance(self, n: float = 1, **postfix: Any) -> None:
        """Move the bar ``n`` units forward."""
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix(**postfix, refresh=False)

    def grow(self, n: float) -> None:
        """Add ``n`` units to the total (work whose size is learnt as it goes)."""
        if self._bar is not None:
            self._bar.total = (self._bar.total or 0) + n
            self._bar.refresh()

    def describe(self, desc: str) -> None:
        """Change the bar's label."""
        if self._bar is not None:
            self._bar.set_description(desc)

    def steps(self) -> Callable[[int, int], None] | None:
        """A ``report(done, total)`` callback moving this bar (``None`` when disabled)."""
        return (lambda done, total: self.update_to(done, total)) if self.enabled else None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def step_progress(
    total: int, desc: str, enabled: bool = True, unit: str = "op"
) -> Iterator[Callable[[int, int], None] | None]:
    """A bar over ``total`` steps that disappears when done; yields its ``report(done, total)`` callback
    (``None`` when disabled), the form the searches take."""
    with Progress(total, desc, unit, enabled=enabled, leave=False) as bar:
        yield bar.steps()

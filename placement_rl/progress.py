"""Progress bars for long searches, driven by ``report(done, total)`` callbacks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def step_progress(total: int, desc: str, enabled: bool = True) -> Iterator[Callable[[int, int], None] | None]:
    """A tqdm bar over ``total`` steps; yields the callback that moves it (None when disabled)."""
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="op", desc=desc, dynamic_ncols=True, leave=False)

    def report(done: int, new_total: int) -> None:
        bar.total = new_total
        bar.update(done - bar.n)

    try:
        yield report
    finally:
        bar.close()

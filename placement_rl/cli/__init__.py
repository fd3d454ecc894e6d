"""The ``placement-rl`` command line: one module per command family, each adding its commands.

* :mod:`.describe`: ``models``, ``topologies``, ``import``, ``show-graph``, ``show-topology``, ``profile``
* :mod:`.plan`: ``plan`` (every method side by side), ``simulate``
* :mod:`.compare`: ``compare`` (an experiment file: every method on every instance, as Ray tasks)
* :mod:`.search`: ``search mcmc``, ``frontier``
* :mod:`.rl`: ``train``, ``tune``, ``evaluate``
* :mod:`.emulate`: ``emulate`` (an emulated cluster against the network models)
* :mod:`.execute`: ``execute`` (a plan run for real on worker processes, against the simulator)
* :mod:`.fidelity`: ``fidelity`` (executed plans against the simulator; ``--cluster gpu`` measures a GPU machine)
* :mod:`.calibrate`: ``calibrate`` (fit the analytic GPU model to a GPU's measurements)

Every command prints a human-readable table by default and JSON with ``--json``. Bad input (an
unknown model, topology or option, a malformed file, an output path that cannot be written) prints
one ``error:`` line naming the bad value and what was expected, and exits with status 2. The
commands are thin: the work is done by library calls (:func:`placement_rl.methods.compare_methods`,
:func:`placement_rl.search.mcmc`, ...). The exit statuses are :data:`EXIT_STATUSES`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence

from placement_rl.cli import calibrate, compare, describe, emulate, execute, fidelity, plan, rl, search

#: What each exit status of ``placement-rl`` means (also shown by ``placement-rl --help``).
EXIT_STATUSES: dict[int, str] = {
    0: "success",
    1: "the operating system refused a read or write during the command ('error:' names the path and the reason)",
    2: "bad input: an unknown name, a bad option or file, an output path that cannot be written ('error:' says "
    "which and what was expected)",
    130: "interrupted (Ctrl-C); 'search mcmc' first writes the best plan found so far",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="placement-rl",
        description="Place and shard deep-learning training graphs on GPU clusters.",
        epilog="exit status: " + "; ".join(f"{k} {v}" for k, v in EXIT_STATUSES.items()),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in (plan, compare, search, describe, rl, emulate, execute, fidelity, calibrate):
        family.add_commands(sub)
    return parser


@functools.cache
def _shared_parser() -> argparse.ArgumentParser:
    """The parser :func:`main` uses: built once per process (about 5 ms, argparse's help formatting and
    translations) and reused, since parsing leaves a parser as it was; the tests run ``main`` in-process
    hundreds of times."""
    return build_parser()


def os_error_line(exc: OSError) -> str:
    """One line for an operating-system error: the path(s) it names and the system's reason."""
    reason = exc.strerror or str(exc)
    paths = [repr(os.fsdecode(f)) for f in (exc.filename, exc.filename2) if f is not None]
    return f"{' -> '.join(paths)}: {reason}" if paths else reason


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``placement-rl`` console script; returns the exit status (:data:`EXIT_STATUSES`).

    A command returns ``None`` (status 0) or its own status (``search mcmc`` interrupted: 130).
    """
    try:
        args = _shared_parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a bad argument (2, message already printed)
        return int(exc.code or 0)
    func: Callable[[argparse.Namespace], int | None] = args.func
    try:
        status = func(args)
    except (ValueError, FileNotFoundError) as exc:  # UnknownNameError and SchemaError are ValueErrors
        # A FileNotFoundError of the system's (not one of our messages) says its path and reason as one line.
        message = os_error_line(exc) if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `placement-rl ... | head`
        return 0
    except OSError as exc:  # the last resort: an output that passed the checks of placement_rl.paths, a full disk
        print(f"error: {os_error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())

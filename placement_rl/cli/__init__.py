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
unknown model, topology or option, a malformed file) prints one ``error:`` line naming the bad value
and what was expected, and exits with status 2. The commands are thin: the work is done by library
calls (:func:`placement_rl.methods.compare_methods`, :func:`placement_rl.search.mcmc`, ...).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from placement_rl.cli import calibrate, compare, describe, emulate, execute, fidelity, plan, rl, search


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="placement-rl", description="Place and shard deep-learning training graphs on GPU clusters."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in (plan, compare, search, describe, rl, emulate, execute, fidelity, calibrate):
        family.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``placement-rl`` console script; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a bad argument (2, message already printed)
        return int(exc.code or 0)
    func: Callable[[argparse.Namespace], None] = args.func
    try:
        func(args)
    except (ValueError, FileNotFoundError) as exc:  # UnknownNameError and SchemaError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `placement-rl ... | head`
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

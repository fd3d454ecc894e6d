"""Every search method on the planted suite, from data parallelism alone, against the planted plan.

    python benchmarks/planted.py [--budget 60s] [--methods mcmc,mcts,ft] [--instances slow_links_fc,zero_fit]
                                 [--variant 0] [--policy CHECKPOINT ...] [--policy-env max_groups=60]
                                 [--set ft.stage_meshes=1] [--plan-defaults] [--json]

The instances are :mod:`placement_rl.planted`'s (one per kind; ``--variant N`` builds the held-out
variant ``N`` of every kind instead of the designed one). Every method runs through
:func:`placement_rl.methods.compare_methods`, judged by the default cost model, with ``--budget``
(seconds such as ``60s``, or a number of proposals) given to every method that takes a budget, and
started from data parallelism only: MCMC's initial candidates are ``data_parallel`` alone (not the
subset-DP start, which contains the planted plan of ``mixed_gpus`` and ``straggler``); the tree search
(``mcts``) starts from the empty plan with data parallelism as its reference. FT, ``megatron``, ``zero``
and ``subset_data_parallel`` take no budget and no start: they are constructors or exhaustive over
their own space, and the planted plans of some kinds lie in those spaces (``fits_only_split`` and
``pipeline_deep`` in ``megatron``'s, ``zero_fit`` in ``zero``'s, ``mixed_gpus`` and ``straggler`` in
``subset_data_parallel``'s). ``--policy`` adds a trained agent (a checkpoint folder, loaded through the
Ray edge, :func:`placement_rl.rl.policy.policy_method`), planning zero-shot; ``--policy-env`` changes
the env options it plans with from its training's (``max_groups=60``: a finer grouping than it
trained at; :func:`placement_rl.rl.policy.with_env`). ``--methods none`` runs only the baselines and
the policies. ``--plan-defaults`` adds a ``plan`` column: what ``placement-rl plan`` gives with no
flags (its default methods, each search with the budget it scales to the instance, MCMC from its
default candidates; the best plan that fits), whatever ``--budget`` says.

The table has one row per instance: the planted plan's and the bound's iteration time (ms), then for
every baseline and method its speed relative to the planted plan, ``planted_makespan / makespan``
(1.00: as fast as the planted plan; ``OOM``: its plan does not fit; ``-``: the method refused the
instance or failed, said on stderr). The last line counts, per method, the instances where it reached
at least 0.9 of the planted plan's speed. Progress lines go to stderr. Budgets are wall-clock time,
so on a shared machine the figures move between runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from placement_rl.cli.common import PROPOSALS_HELP, env_overrides, proposal_kinds
from placement_rl.methods import (
    BASELINES,
    Method,
    best_result,
    check_budget,
    compare_methods,
    get_method,
    mcmc_starts,
    method_names,
)
from placement_rl.methods import default_methods as plan_defaults
from placement_rl.models import parse_overrides
from placement_rl.planted import KINDS, PlantedInstance, build_suite

#: A method reaches the planted plan when its speed is at least this share of the planted plan's.
REACHED = 0.9
#: Methods not run unless asked for: ``exhaustive`` refuses every instance of the suite (its space is
#: far above its limit).
NOT_BY_DEFAULT = ("exhaustive",)


def default_methods() -> list[str]:
    """Every registered method that is not a baseline (baselines are the instance's own columns)."""
    return [m for m in method_names() if m not in BASELINES and m not in NOT_BY_DEFAULT]


def method_options(
    method: Method, budget: str, mcmc_proposals: str | Mapping[str, float] = "coordinated"
) -> dict[str, Any]:
    """The options that run ``method`` from data parallelism alone with ``budget`` (only those it takes);
    MCMC proposes from the ``mcmc_proposals`` mix (default ``coordinated``: FlexFlow's moves and the
    coordinated ones)."""
    options: dict[str, Any] = {}
    if method.name == "mcmc":
        options["proposals"] = mcmc_proposals
    if "budget" in method.options:
        options["budget"] = budget
    if "initial" in method.options:
        options["initial"] = ["data_parallel"]
    if "seed" in method.options:
        options["seed"] = 0
    if "time_limit" in method.options and not budget.strip().isdigit():
        options["time_limit"] = budget
    return options


class Cell(NamedTuple):
    """One method's result on one instance (a named tuple: the script runs unregistered as a module too).

    Attributes:
        makespan_s: its plan's iteration time (``nan`` when it did not run).
        oom: its plan does not fit in memory.
        search_s: wall-clock seconds the method took.
        note: why it did not run, or the method's remark on its plan.
    """

    makespan_s: float = math.nan
    oom: bool = False
    search_s: float = 0.0
    note: str = ""

    def ratio(self, instance: PlantedInstance) -> float | None:
        """Its speed relative to the planted plan's; ``None`` when it did not run or does not fit."""
        if math.isnan(self.makespan_s) or self.oom:
            return None
        return instance.speed_ratio(self.makespan_s)


class Row(NamedTuple):
    """One instance: the planted figures and a :class:`Cell` per baseline and method."""

    instance: PlantedInstance
    cells: dict[str, Cell]


def _progress(text: str) -> None:
    print(f"[planted] {text}", file=sys.stderr, flush=True)


def run_method(instance: PlantedInstance, method: Method, options: Mapping[str, Any]) -> Cell:
    """``method`` on ``instance`` through :func:`compare_methods`; a refusal or failure is a cell with a note."""
    try:
        if method.check is not None:
            method.check(options, None, None)
            method.check(options, instance.graph, instance.topology)
        [row] = compare_methods(instance.graph, instance.topology, [method], options={method.name: options})
    except Exception as exc:  # one method failing must not lose the others' figures
        return Cell(note=f"{type(exc).__name__}: {exc}")
    return Cell(row.makespan_s, row.oom, row.search_s, row.note)


def run(
    instances: Sequence[PlantedInstance],
    methods: Sequence[Method],
    budget: str,
    mcmc_proposals: str | Mapping[str, float] = "coordinated",
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    with_plan: bool = False,
) -> list[Row]:
    """Every baseline and method on every instance (progress on stderr); ``extra``: per method name,
    options added to :func:`method_options`' (``{"ft": {"stage_meshes": 1}}``); ``with_plan``: a
    :data:`PLAN` column first (:func:`run_plan_defaults`)."""
    rows: list[Row] = []
    for instance in instances:
        row = Row(instance, {})
        for b, makespan_s in instance.baseline_makespans_s.items():
            row.cells[b] = Cell(makespan_s, b in instance.baseline_oom)
        if with_plan:
            _progress(f"{instance.name}: plan's default methods ...")
            cell = run_plan_defaults(instance)
            ratio = cell.ratio(instance)
            said = f"{ratio:.2f} of the planted plan's speed" if ratio is not None else "OOM"
            _progress(f"{instance.name}: plan {said} ({cell.search_s:.1f} s; {cell.note})")
            row.cells[PLAN] = cell
        for method in methods:
            options = {**method_options(method, budget, mcmc_proposals), **(extra or {}).get(method.name, {})}
            _progress(f"{instance.name}: {method.name} {options} ...")
            start = time.perf_counter()
            cell = run_method(instance, method, options)
            ratio = cell.ratio(instance)
            said = f"{ratio:.2f} of the planted plan's speed" if ratio is not None else ("OOM" if cell.oom else "-")
            _progress(f"{instance.name}: {method.name} {said} ({time.perf_counter() - start:.1f} s){_note(cell)}")
            row.cells[method.name] = cell
        rows.append(row)
    return rows


#: The column of ``--plan-defaults``: the best plan of ``placement-rl plan``'s default methods.
PLAN = "plan"


def run_plan_defaults(instance: PlantedInstance) -> Cell:
    """What ``placement-rl plan`` gives with no flags: its default methods with their budgets scaled to
    the instance (:func:`placement_rl.methods.default_methods`, MCMC from its default candidates), the
    best plan that fits; the note names the method that found it."""
    defaults = plan_defaults(instance.graph, instance.topology)
    budgets = {"budget": defaults.budget}
    start = time.perf_counter()
    rows: list[Any] = []
    for name in defaults.methods:  # one at a time, as plan runs them: MCMC last, from the best so far too
        options = {"mcts": budgets, "mcmc": {**budgets, "initial": mcmc_starts(rows)}}.get(name, {})
        rows += compare_methods(instance.graph, instance.topology, [name], options={name: options} if options else None)
    best = best_result(rows)
    note = f"{best.method}; {defaults.budget} per search"
    return Cell(best.makespan_s, best.oom, time.perf_counter() - start, note)


def _note(cell: Cell) -> str:
    return f"; {cell.note}" if cell.note else ""


def _cell_text(cell: Cell, instance: PlantedInstance) -> str:
    if cell.oom:
        return "OOM"
    ratio = cell.ratio(instance)
    return "-" if ratio is None else f"{ratio:.2f}"


def reached(rows: Sequence[Row], name: str) -> int:
    """On how many instances ``name`` reached at least :data:`REACHED` of the planted plan's speed."""
    return sum((r.cells[name].ratio(r.instance) or 0.0) >= REACHED for r in rows)


def print_table(rows: Sequence[Row], columns: Sequence[str], budget: str) -> None:
    """The Markdown table (see the module docstring) and the count of instances reached."""
    searched = [c for c in columns if c not in BASELINES and c != PLAN]
    said = [f"{budget} per method, from data parallelism"] if searched else []
    if PLAN in columns:
        said.append("plan: placement-rl plan's default methods and budgets")
    print(f"speed relative to the planted plan (planted ms / method ms); {'; '.join(said) or 'the baselines'}")
    print("| instance | kind | planted ms | bound ms | " + " | ".join(columns) + " |")
    print("|---|---|---|---|" + "---|" * len(columns))
    for r in rows:
        inst = r.instance
        cells = " | ".join(_cell_text(r.cells[c], inst) for c in columns)
        print(
            f"| {inst.name} | {inst.kind} | {inst.planted_makespan_s * 1e3:,.1f} | {inst.lower_bound_s * 1e3:,.1f} | "
            f"{cells} |"
        )
    counts = ", ".join(f"{c} {reached(rows, c)}/{len(rows)}" for c in columns)
    print(f"reached >= {REACHED} of the planted plan's speed: {counts}")


def rows_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """One JSON object per instance: the planted figures and every cell (``ratio`` null when none)."""
    out = []
    for r in rows:
        inst = r.instance
        out.append(
            {
                "instance": inst.name,
                "kind": inst.kind,
                "variant": inst.variant,
                "description": inst.description,
                "planted_makespan_s": inst.planted_makespan_s,
                "lower_bound_s": inst.lower_bound_s,
                "methods": {
                    name: {
                        "makespan_s": None if math.isnan(c.makespan_s) else c.makespan_s,
                        "ratio": c.ratio(inst),
                        "oom": c.oom,
                        "search_s": c.search_s,
                        "note": c.note,
                    }
                    for name, c in r.cells.items()
                },
            }
        )
    return out


def _names(text: str, allowed: Sequence[str], what: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        parser.error(f"--{what}: unknown {bad or text!r}; expected a comma-separated list of {list(allowed)}")
    return names


def _method_sets(
    items: Sequence[str], methods: Sequence[Method], parser: argparse.ArgumentParser
) -> dict[str, dict[str, Any]]:
    """``--set METHOD.OPTION=VALUE`` items as per-method options (values read as JSON, else strings)."""
    out: dict[str, dict[str, Any]] = {}
    by_name = {m.name: m for m in methods}
    for item in items:
        key, equals, _ = item.partition("=")
        name, dot, option = key.partition(".")
        if not equals or not dot or not option:
            parser.error(f"--set {item!r}: expected METHOD.OPTION=VALUE, e.g. ft.stage_meshes=1")
        if name not in by_name:
            parser.error(f"--set {item!r}: method {name!r} is not run; the methods are {sorted(by_name)}")
        if option not in by_name[name].options:
            parser.error(
                f"--set {item!r}: {name} has no option {option!r}; its options are {sorted(by_name[name].options)}"
            )
        out.setdefault(name, {}).update(parse_overrides(f"{option}={item.partition('=')[2]}"))
    return out


def check_options(
    methods: Sequence[Method],
    budget: str,
    mcmc_proposals: str | Mapping[str, float],
    extra: Mapping[str, Mapping[str, Any]],
    parser: argparse.ArgumentParser,
) -> None:
    """Every method's options (the benchmark's and ``--set``'s) through the method's own check, before
    any method runs: a bad value is an error here, not a ``-`` cell after the others' searches."""
    for method in methods:
        if method.check is None:
            continue
        options = {**method_options(method, budget, mcmc_proposals), **extra.get(method.name, {})}
        try:
            method.check(options, None, None)
        except ValueError as exc:
            given = sorted(k for k in extra.get(method.name, {}))
            parser.error(
                f"{method.name}: {exc}"
                + (f" (--set {', '.join(f'{method.name}.{k}' for k in given)})" if given else "")
            )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="60s", help="per method: seconds ('60s') or a number of proposals")
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated methods (default: every non-baseline one; none: only the baselines and --policy)",
    )
    parser.add_argument("--instances", default=None, help=f"comma-separated kinds (default: all of {list(KINDS)})")
    parser.add_argument("--variant", type=int, default=0, help="0: the designed instances; N: held-out variant N")
    parser.add_argument("--policy", action="append", default=[], help="a trained agent's checkpoint (repeatable)")
    parser.add_argument(
        "--policy-env",
        type=env_overrides,
        default={},
        metavar="KEY=VALUE,...",
        help="plan with these env options changed from the policies' training (max_groups=60: a finer grouping)",
    )
    parser.add_argument(
        "--mcmc-proposals",
        type=proposal_kinds,
        default="coordinated",
        help=f"MCMC's proposal mix (default coordinated; flexflow: FlexFlow's moves only): {PROPOSALS_HELP}",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="METHOD.OPTION=VALUE",
        help="an option for one method (repeatable), e.g. ft.stage_meshes=1",
    )
    parser.add_argument(
        "--plan-defaults",
        action="store_true",
        help="add a 'plan' column: the best plan of placement-rl plan's default methods and budgets (its own "
        "budgets, scaled to the instance; MCMC from its default candidates, not data parallelism alone)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    args = parser.parse_args(argv)
    try:
        check_budget(args.budget)
    except ValueError as exc:
        parser.error(f"--budget: {exc}")
    if args.variant < 0:
        parser.error(f"--variant = {args.variant}; expected an integer >= 0")
    if args.methods is None:
        names = default_methods()
    else:
        names = [] if args.methods == "none" else _names(args.methods, method_names(), "methods", parser)
    methods = [get_method(n) for n in names if n not in BASELINES]  # the baselines run anyway
    for path in args.policy:  # before the Ray edge is imported
        if not os.path.isdir(path):
            parser.error(f"--policy {path!r}: no such checkpoint folder; expected a checkpoint_* folder of a run")
    if args.policy:
        # the Ray edge, imported only when an agent is asked for (by name: the core's type check stays off it)
        policy = importlib.import_module("placement_rl.rl.policy")
        for path in args.policy:
            try:
                loaded = policy.load_policy(path)
            except (ValueError, OSError) as exc:
                parser.error(f"--policy {path!r}: {exc}")
            try:
                methods.append(policy.policy_method(loaded, env=args.policy_env))
            except ValueError as exc:
                parser.error(f"--policy-env: {exc}")
    extra = _method_sets(args.set, methods, parser)
    check_options(methods, args.budget, args.mcmc_proposals, extra, parser)
    kinds = None if args.instances is None else _names(args.instances, list(KINDS), "instances", parser)
    _progress(f"building {len(kinds or KINDS)} instance(s), variant {args.variant} ...")
    start = time.perf_counter()
    instances = build_suite(kinds, variant=args.variant)
    _progress(f"built in {time.perf_counter() - start:.1f} s")
    rows = run(instances, methods, args.budget, args.mcmc_proposals, extra, args.plan_defaults)
    if args.json:
        print(json.dumps(rows_json(rows), indent=1))
    else:
        plan = [PLAN] if args.plan_defaults else []
        print_table(rows, [*BASELINES, *plan, *(m.name for m in methods)], args.budget)


if __name__ == "__main__":
    main()

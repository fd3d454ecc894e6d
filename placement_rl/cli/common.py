"""What every command shares: parent parsers, ``type=`` converters, loaders and printers.

Converters turn a command-line string into a checked value or raise ``argparse.ArgumentTypeError``
with a message naming the value and what was expected; argparse prints it as ``error: argument
--flag: ...`` and exits with status 2, before any work starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from placement_rl.errors import UnknownNameError

#: Short names the command line accepts for the baselines (the library knows only the long ones).
METHOD_ALIASES: dict[str, str] = {"dp": "data_parallel", "single": "single_device"}

_BYTE_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}


# ----------------------------------------------------------------------------------- converters
def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return value


def finite_float(text: str) -> float:
    """A finite number (``nan`` and ``inf`` are refused)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return value


def byte_size(text: str) -> float:
    """A memory size: GiB as a plain number (``16``) or with a unit (``16GiB``, ``512MiB``, ``8GB``)."""
    import math

    lowered = text.strip().lower()
    unit = next((u for u in sorted(_BYTE_UNITS, key=len, reverse=True) if lowered.endswith(u)), None)
    number = lowered[: -len(unit)] if unit else lowered
    try:
        value = float(number) * (_BYTE_UNITS[unit] if unit else 2**30)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected GiB as a number or with a unit, e.g. 16, 16GiB, 512MiB"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive amount")
    return value


#: A time budget longer than this is echoed in words on stderr when it is parsed.
ECHO_BUDGET_S = 3600.0


def budget(text: str) -> Any:
    """A search budget: seconds (``30s``, ``2m``, ``1.5h``, at most 30 days) or a number of proposals
    (``100000``, at most a billion); one over an hour is echoed in words on stderr (``note: budget
    '72h' is 3 days``), so that a typo in the unit is seen before the search starts."""
    from placement_rl.search import Budget

    try:
        value = Budget.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value.seconds is not None and value.seconds > ECHO_BUDGET_S:
        print(f"note: budget {text.strip()!r} is {value.describe()}", file=sys.stderr)
    return value


#: What ``--mcmc-budget`` and ``--mcts-budget`` of ``plan`` take to mean "scaled to the instance".
AUTO = "auto"


def budget_or_auto(text: str) -> Any:
    """:func:`budget`, or ``auto`` (:data:`AUTO`): the budget :func:`placement_rl.methods.default_methods`
    scales to the instance."""
    return AUTO if text.strip() == AUTO else budget(text)


#: The help of ``--proposals`` / ``--mcmc-proposals`` (names kept in step with
#: :data:`placement_rl.search.proposals.PROPOSAL_KINDS` and ``MIXES`` by a test; not imported, so
#: ``--help`` stays fast).
PROPOSALS_HELP = (
    "MCMC's proposal kinds: flexflow (FlexFlow's one-op move alone, as in the paper); neighbour, group, sync, "
    "replicas, micro_batches, schedule, recompute, zero; the coordinated param_group, block, stage_shift, "
    "device_subset; restage (the whole plan as a pipeline over machines); "
    "a mix: mixed, soap, memory, coordinated (every kind; the default), adaptive (weights follow what improves); "
    "or weights like 'flexflow=2,block=1'"
)


def proposal_kinds(text: str) -> Any:
    """MCMC proposal kinds: a kind or mix name (``mixed``), or weights ``flexflow=2,group=1``."""
    from placement_rl.search.proposals import parse_proposals

    value: Any = text.strip()
    if "=" in value:
        value = {}
        for part in text.split(","):
            name, _, weight = part.partition("=")
            try:
                value[name.strip()] = float(weight)
            except ValueError:
                return _fail(text, "a proposal kind, 'mixed', or weights like 'flexflow=2,group=1'")
    try:
        parse_proposals(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def optional_budget(text: str) -> Any:
    """A budget, or ``none`` / ``0`` to skip."""
    return None if text.strip().lower() in ("none", "0") else budget(text)


def int_list(text: str) -> list[int]:
    """Comma-separated positive integers (``1,2,4``)."""
    return [positive_int(part) for part in text.split(",") if part.strip()] or _fail(
        text, "a comma-separated list of counts"
    )


def name_list(text: str) -> list[str]:
    """Comma-separated names (``lenet,resnet50``)."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        return _fail(text, "a comma-separated list of names, none empty")
    return names


def env_overrides(text: str) -> dict[str, Any]:
    """Comma-separated env options (``max_groups=60,tag_completion=best``; values read as JSON)."""
    from placement_rl.models import parse_overrides

    try:
        return parse_overrides(text)
    except ValueError as exc:
        return _fail(text, f"KEY=VALUE pairs separated by commas ({exc})")


def method_list(text: str) -> list[str]:
    """Comma-separated method names; the aliases ``dp`` and ``single`` are accepted."""
    from placement_rl.methods import method_names

    names = [METHOD_ALIASES.get(n, n) for n in name_list(text)]
    valid = method_names()
    for n in names:
        if n not in valid:
            raise argparse.ArgumentTypeError(f"unknown method {n!r}; expected some of: {', '.join(valid)}")
    return names


def path(text: str) -> str:
    """A file or folder path: not empty (an empty ``--out ''`` would otherwise be taken for no option at all)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def _fail(text: str, what: str) -> Any:
    raise argparse.ArgumentTypeError(f"{text!r}: expected {what}")


# ------------------------------------------------------------------------------- parent parsers
def json_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def instance_parser(model: str | None = None, topology: str | None = None) -> argparse.ArgumentParser:
    """``--model`` / ``--topology`` / ``--batch-size`` (required when no default is given)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--model",
        default=model,
        required=model is None,
        help="zoo model (see 'placement-rl models'), a graph .json, hf:ClassName[:key=value,...], "
        "hf:config.json or package.module:factory" + (f" (default {model})" if model else ""),
    )
    p.add_argument(
        "--topology",
        default=topology,
        required=topology is None,
        help="preset (see 'placement-rl topologies'), random:SEED or a topology .json"
        + (f" (default {topology})" if topology else ""),
    )
    p.add_argument("--batch-size", type=positive_int, default=None, help="global batch size (default: the paper's)")
    p.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sample of an hf: model (default 512)")
    return p


def precision(text: str) -> str:
    """A training precision name (a key of :data:`placement_rl.sim.cost.PRECISIONS`)."""
    from placement_rl.sim.cost import PRECISIONS

    if text not in PRECISIONS:
        raise argparse.ArgumentTypeError(str(UnknownNameError("precision", text, PRECISIONS)))
    return text


def schedule_name(text: str) -> str:
    """A pipeline schedule name (:data:`placement_rl.plan.SCHEDULES`)."""
    from placement_rl.plan import SCHEDULES

    if text not in SCHEDULES:
        raise argparse.ArgumentTypeError(str(UnknownNameError("schedule", text, SCHEDULES)))
    return text


def zero_stage(text: str) -> int:
    """A ZeRO stage, 0 to 3."""
    if text not in ("0", "1", "2", "3"):
        raise argparse.ArgumentTypeError(f"ZeRO stage {text!r}; expected 0, 1, 2 or 3")
    return int(text)


def cost_parser() -> argparse.ArgumentParser:
    """The cost model's options."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--optimizer", default="adam", help="optimizer whose state counts in memory (default adam)")
    p.add_argument(
        "--precision",
        type=precision,
        default="fp32",
        help="training precision: fp32 (default), tf32, bf16-mixed or fp16-mixed; sets bytes per activation "
        "and parameter element and the compute dtype's peak (docs/concepts/cost-model.md, 'Precision')",
    )
    p.add_argument("--profile", default=None, help="profiled op times (placement-rl profile --out FILE)")
    p.add_argument(
        "--execution-mode",
        type=execution_mode,
        default="eager",
        help="how the host drives the GPUs: eager (default: a host lane per device issues every op) or "
        "cuda_graphs (a captured iteration replayed at near-zero host cost)",
    )
    p.add_argument("--calibration", default="default", help=CALIBRATION_HELP)
    p.add_argument("--comm-table", default=None, help="profiled bandwidth table (JSON, see docs/formats.md)")
    p.add_argument(
        "--network",
        type=network_model_name,
        default="flow",
        help="how transfers share links: flow (max-min fair flows, default), circuit (a transfer holds its "
        "whole route) or pairwise (a dedicated connection per device pair) (docs/concepts/network.md)",
    )
    p.add_argument(
        "--bucket-bytes",
        type=bucket_bytes,
        default=25 * 2**20,
        help="gradient bucket for all-reduce, bytes or with a unit (default 25MiB as PyTorch DDP; 0: one "
        "all-reduce per tensor)",
    )
    return p


def execution_mode(text: str) -> str:
    """An execution mode name (:data:`placement_rl.sim.cost.EXECUTION_MODES`)."""
    from placement_rl.sim.cost import EXECUTION_MODES

    if text not in EXECUTION_MODES:
        raise argparse.ArgumentTypeError(str(UnknownNameError("execution mode", text, EXECUTION_MODES)))
    return text


def calibration(spec: str) -> Any:
    """``default``, ``roofline`` (None: the flat roofline) or a calibration JSON file."""
    from placement_rl.experiments import calibration_named

    return calibration_named(spec, "--calibration")


#: ``--calibration``'s help, for the command line and the benchmark scripts.
CALIBRATION_HELP = (
    "the analytic GPU model: default (fitted to an H200, carried to other GPUs by their datasheet peaks), "
    "roofline (the papers' flat efficiency per op type, no host; the model of the tables measured before the "
    "fit), or a calibration .json (placement-rl calibrate --out FILE)"
)


def calibration_spec(text: str) -> str:
    """A ``--calibration`` value, checked (a file must read as a calibration); the text itself."""
    try:
        calibration(text)
    except (ValueError, FileNotFoundError) as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--calibration: ")) from None
    return text


def calibrated_cost_model(spec: str | None) -> Any:
    """The default :class:`~placement_rl.sim.CostModel` with the ``--calibration`` ``spec``'s GPU
    model; ``None`` for ``spec=None`` (a script's "as configured": whoever takes it uses its default)."""
    if spec is None:
        return None
    from placement_rl.sim import CostModel

    return CostModel(calibration=calibration(spec))


def env_with_calibration(env: Any, spec: str | None) -> dict[str, Any]:
    """An env config (a training config's ``env`` section) whose ``cost_model`` has the
    ``--calibration`` ``spec``, its other fields as configured (none: the default model with that
    calibration); ``spec=None`` leaves the config as it is. A copy."""
    out = dict(env)
    if spec is None:
        return out
    cost = out.get("cost_model")
    if cost is None:
        out["cost_model"] = {"calibration": spec}
    elif isinstance(cost, Mapping):
        out["cost_model"] = {**cost, "calibration": spec}
    else:  # a CostModel object
        out["cost_model"] = dataclasses.replace(cost, calibration=calibration(spec))
    return out


def policy_with_calibration(policy: Any, spec: str | None) -> Any:
    """A trained :class:`~placement_rl.rl.policy.Policy` whose env (the one it plans and, for TAG,
    searches in) simulates under the ``--calibration`` ``spec`` (:func:`env_with_calibration`); the
    policy itself for ``spec=None``. Its module is unchanged: it reads features simulated under a
    model it may not have been trained under."""
    if spec is None:
        return policy
    config = policy.config.replace(env=env_with_calibration(policy.config.env, spec))
    return dataclasses.replace(policy, config=config)


def network_model_name(text: str) -> str:
    """A network model name (a key of :data:`placement_rl.sim.network.NETWORK_MODELS`)."""
    from placement_rl.sim.network import NETWORK_MODELS

    if text not in NETWORK_MODELS:
        raise argparse.ArgumentTypeError(str(UnknownNameError("network model", text, NETWORK_MODELS)))
    return text


def bucket_bytes(text: str) -> int:
    """A gradient bucket size: bytes (``26214400``), with a unit (``25MiB``, ``4MB``), or ``0`` for none."""
    lowered = text.strip().lower()
    unit = next((u for u in sorted(_BYTE_UNITS, key=len, reverse=True) if lowered.endswith(u)), None)
    number = lowered[: -len(unit)] if unit else lowered
    try:
        value = float(number) * (_BYTE_UNITS[unit] if unit else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bucket size {text!r}: expected bytes >= 0, e.g. 26214400, 25MiB or 0 (one all-reduce per tensor)"
        ) from None
    if not value >= 0 or value != value or value == float("inf") or value != int(value):
        raise argparse.ArgumentTypeError(
            f"bucket size {text!r}: expected a whole number of bytes >= 0, e.g. 26214400, 25MiB or 0"
        )
    return int(value)


# ------------------------------------------------------------------------------------- loaders
def starting(args: argparse.Namespace, what: str) -> None:
    """Say on stderr what a command is about to do before its first slow step (importing the
    simulator and PyTorch, tracing a model: seconds before any bar); nothing with ``--json``."""
    if not getattr(args, "json", False):
        print(f"{what}: loading {args.model} and the simulator ...", file=sys.stderr, flush=True)


def load_graph(spec: str, batch_size: int | None = None, seq_len: int | None = None) -> Any:
    """A model string (:mod:`placement_rl.models`): zoo name, graph JSON, ``hf:...`` or ``package.module:factory``."""
    from placement_rl.models import load_model

    return load_model(spec, batch_size, seq_len)


def load_instance(args: argparse.Namespace) -> tuple[Any, Any]:
    """The graph and topology of ``--model`` / ``--topology`` / ``--batch-size``."""
    from placement_rl.topology import resolve_topology

    return load_graph(args.model, args.batch_size, getattr(args, "seq_len", None)), resolve_topology(args.topology)


def cost_model(args: argparse.Namespace, topology: Any = None, graph: Any = None) -> Any:
    """The cost model of :func:`cost_parser`'s options; with ``topology``, its profile is checked against it
    (and with ``graph``, stderr says how many of its ops the profile does not time).

    Raises:
        ValueError: when ``--profile`` has no entry for a device type of ``topology``, or was measured in
            another precision than ``--precision``.
    """
    from placement_rl.sim import CommTable, CostModel, ProfileTable

    profile = ProfileTable.from_json(args.profile) if args.profile else None
    if profile is not None:
        profile.check_precision(args.precision, f"--profile {args.profile}")
    if profile is not None and topology is not None:
        check_profile(profile, topology, args.profile)
        if graph is not None:
            report_profile_coverage(profile, graph, topology, args.profile)
    return CostModel(
        optimizer=args.optimizer,
        precision=args.precision,
        profile=profile,
        comm_table=CommTable.from_json(args.comm_table) if args.comm_table else None,
        network=args.network,
        bucket_bytes=args.bucket_bytes,
        execution_mode=getattr(args, "execution_mode", "eager"),
        calibration=calibration(getattr(args, "calibration", "default")),
    )


def check_profile(profile: Any, topology: Any, path: str) -> None:
    """Refuse a profile (a :class:`~placement_rl.sim.ProfileTable` read from ``path``) that has no
    entry for a device type of ``topology`` (every lookup would miss it); else say on stderr how
    many of its entries apply (the others are for GPUs the topology does not have)."""
    types = {d.device_type for d in topology.devices}
    matched = profile.check_matches(types, f"--profile {path}", f"topology {topology.name!r}")
    print(
        f"--profile {path}: {matched} of {len(profile.entries)} entries are for device types of "
        f"topology {topology.name!r}; ops without a matching entry use the analytic model",
        file=sys.stderr,
    )


#: How many unprofiled ops :func:`report_profile_coverage` names.
PROFILE_MISSES_SHOWN = 5


def report_profile_coverage(profile: Any, graph: Any, topology: Any, path: str) -> None:
    """Say on stderr, in one line, how many of ``graph``'s ops that do work have no entry in ``profile`` for
    their whole batch on a device type of ``topology`` (by name or by shape key), naming the first few
    with their op types: the analytic model times those (unless the profile has a task's exact shape),
    while every other op is timed from the profile at every partitioning and micro-batch count
    (:meth:`~placement_rl.sim.cost.CostModel.profile_entry`). After a simulation the cost model's
    ``analytic_ops`` lists the ops it did time analytically."""
    from placement_rl.sim.cost import NO_WORK_OPS

    costed = [op for op in graph.ops if op.op_type not in NO_WORK_OPS]
    missing = profile.missing_ops(costed, {d.device_type for d in topology.devices})
    if missing:
        shown = ", ".join(f"{op.name} ({op.op_type})" for op in missing[:PROFILE_MISSES_SHOWN])
        more = f", and {len(missing) - PROFILE_MISSES_SHOWN} more" if len(missing) > PROFILE_MISSES_SHOWN else ""
        print(
            f"warning: --profile {path}: {len(missing)} of {len(costed)} ops of {graph.name!r} have no entry for "
            f"their whole batch, so the analytic model (FLOPs and bytes) times them: {shown}{more}",
            file=sys.stderr,
        )


def plan_for(spec: str, graph: Any, topology: Any) -> Any:
    """A baseline's plan (``data_parallel``, ``dp``, ``expert``, ...) or a plan JSON file for ``graph``."""
    from placement_rl.methods import BASELINES, baseline_plan
    from placement_rl.plan import Plan

    name = METHOD_ALIASES.get(spec, spec)
    if name in BASELINES:
        return baseline_plan(name, graph, topology)
    if spec.endswith(".json") or Path(spec).is_file():
        plan = Plan.from_json(spec)
        if plan.graph_name != graph.name:
            raise ValueError(f"plan {spec!r} was made for graph {plan.graph_name!r}, not {graph.name!r}")
        return plan
    raise UnknownNameError("plan", spec, [*BASELINES, *METHOD_ALIASES, "FILE.json"])


def chain_map(chains: int, budget: Any) -> Any:
    """The task map for ``chains`` MCMC chains: ``None`` (in process) for one chain, else Ray tasks.

    Raises:
        ValueError: when a time budget is given for more chains than the Ray cluster has CPUs (the
            extra chains would wait for a CPU, each still getting its full time budget).
    """
    if chains <= 1:
        return None
    from placement_rl.rl.parallel import RayMap
    from placement_rl.rl.runtime import cluster_cpus
    from placement_rl.search import Budget

    budget = budget if isinstance(budget, Budget) else Budget.parse(budget)
    cpus = cluster_cpus()
    if budget.seconds is not None and chains > cpus:
        raise ValueError(
            f"--chains {chains} with a time budget on a Ray cluster of {cpus} CPUs: at most {cpus} chains run at "
            f"once; expected --chains <= {cpus}, or a budget in proposals"
        )
    return RayMap()


def write_plan_outputs(out_dir: Path, stem: str, plan: Any, result: Any, title: str) -> list[Path]:
    """The plan (JSON), its Gantt chart (PNG) and its Chrome trace, as ``out_dir/stem.*``."""
    from placement_rl.sim.trace import gantt_png, write_chrome_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.gantt.png", out_dir / f"{stem}.trace.json"]
    plan.to_json(paths[0])
    gantt_png(result, paths[1], title=title)
    write_chrome_trace(result, paths[2], title=title)
    return paths


# ------------------------------------------------------------------------------------ printing
#: Out-of-memory devices a table cell names before it counts the rest.
_OOM_NAMED = 3


def _oom_cell(devices: Sequence[str]) -> str:
    """``m0/gpu0,m0/gpu1`` or, for many, ``64: m0/gpu0,m0/gpu1,m0/gpu2,...``."""
    if len(devices) <= _OOM_NAMED:
        return ",".join(devices)
    return f"{len(devices)}: {','.join(devices[:_OOM_NAMED])},..."


def print_json(obj: Any) -> None:
    from placement_rl.io import dumps_json

    sys.stdout.write(dumps_json(obj) + "\n")


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for k, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.2f}"


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def method_rows_table(rows: list[Any]) -> None:
    """The comparison table of :class:`~placement_rl.methods.MethodResult` rows, then the instance's
    compute lower bound (``1 / sum_d 1 / T_d``, ``T_d`` the whole graph's compute on one device of
    ``d``'s type) next to data parallelism."""

    def per_tensor(r: Any) -> str:
        speedup = r.speedups.get("data_parallel_per_tensor")
        return times(speedup)

    def times(speedup: float | None) -> str:  # "-" where the reference could not be simulated
        return "-" if speedup is None or math.isnan(speedup) else f"{speedup:.2f}x"

    def headroom(r: Any) -> str:
        share = r.headroom_captured
        return "-" if share is None else f"{share:.0%}"

    print_table(
        [
            "method",
            "ms/iter",
            "samples/s",
            "vs DP",
            "vs DP per tensor",
            "headroom",
            "peak mem GiB",
            "comm GB",
            "GPUs",
            "OOM",
            "search s",
        ],
        [
            [
                r.method,
                f"{r.makespan_s * 1e3:,.2f}",
                f"{r.result.samples_per_s(r.batch_size):,.0f}",
                times(r.speedup_over_dp),
                per_tensor(r),
                headroom(r),
                f"{r.max_peak_memory_bytes / 2**30:.2f}",
                f"{r.result.comm_bytes / 1e9:.3f}",
                r.devices_used,
                _oom_cell(r.result.oom_devices) if r.oom else "no",
                f"{r.search_s:.2f}",
            ]
            for r in rows
        ],
    )
    if rows and rows[0].lower_bound_s > 0:
        first = rows[0]
        dp = (
            "data parallelism was too large to simulate here"
            if math.isnan(first.dp_makespan_s)
            else f"data parallelism is {first.dp_makespan_s / first.lower_bound_s:.2f}x from it"
        )
        print(
            f"compute lower bound {first.lower_bound_s * 1e3:,.2f} ms (1 / sum over devices of 1 / the whole "
            f"graph's compute on one device of its type): {dp}; headroom = the share of that distance a plan closed"
        )

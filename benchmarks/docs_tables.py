"""The docs' generated tables: each is the output of a command that takes seconds, written into its page.

    python benchmarks/docs_tables.py                  # run every table's command, rewrite the pages
    python benchmarks/docs_tables.py precision sfb    # only these tables
    python benchmarks/docs_tables.py --check          # rewrite nothing; name the stale regions (exit 1)
    python benchmarks/docs_tables.py --slow           # also the tables whose commands take a minute or more
    python benchmarks/docs_tables.py --list           # every table, its page and its command

A generated region of a page under ``docs/`` is the lines between ``<!-- generated: NAME -->`` and
``<!-- end generated -->``; NAME is a key of :data:`TABLES`, whose entry runs the command the page
shows next to the region (``placement-rl ...`` in process, a benchmark script's ``main``, or the
page's own Python snippet) and formats what it prints. ``tests/test_docs.py`` renders every table
again and fails when a page's region differs, so a figure in a generated table cannot go stale.

A *slow* table (``Table.slow``) has a deterministic command that takes a minute or more (FT over every
device set, importing models through torch.export): its region is still exactly what the command
prints, rewritten by ``--slow`` or by naming it, but the suite checks only that the region and the
command are on the page, not the figures (the whole suite stays within its time). Tables whose figures
depend on wall-clock budgets, training or a GPU are not generated: their pages give the command and
say when and under which cost model they were measured.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REGION = re.compile(r"(<!-- generated: ([\w.-]+) -->\n)(.*?)(<!-- end generated -->)", re.DOTALL)

#: Graphs imported once per process (graphs are immutable), so the tables' commands share imports.
_GRAPHS: dict[tuple[str, int | None], Any] = {}
#: Results of the pages' Python snippets, by code: the namespace after running it and what it printed.
_SNIPPETS: dict[str, tuple[dict[str, Any], str]] = {}


class Table(NamedTuple):
    """A generated region: the page that holds it, the command the page shows for it, how to render it."""

    page: str
    command: str
    render: Callable[[], str]
    #: a minute or more: rendered by ``--slow`` or by name; the suite does not re-run it
    slow: bool = False


# --------------------------------------------------------------------------------------- running
@contextlib.contextmanager
def cached_zoo() -> Iterator[None]:
    """``placement_rl.zoo.load`` through a per-process cache while the block runs."""
    from placement_rl import zoo

    load = zoo.load

    def cached(name: str, batch_size: int | None = None, **options: Any) -> Any:
        if options:
            return load(name, batch_size, **options)
        key = (name, batch_size)
        if key not in _GRAPHS:
            _GRAPHS[key] = load(name, batch_size)
        return _GRAPHS[key]

    zoo.load = cached  # type: ignore[assignment]
    try:
        yield
    finally:
        zoo.load = load  # type: ignore[assignment]


def cli(*argv: str) -> str:
    """``placement-rl ARGV`` in this process; its stdout (a non-zero exit status raises)."""
    from placement_rl.cli import main

    out = io.StringIO()
    with cached_zoo(), contextlib.redirect_stdout(out):
        status = main(list(argv))
    if status != 0:
        raise RuntimeError(f"placement-rl {' '.join(argv)} exited with status {status}")
    return out.getvalue()


def cli_json(*argv: str) -> Any:
    """``placement-rl ARGV --json``, parsed."""
    return json.loads(cli(*argv, "--json"))


def benchmark(script: str, *argv: str) -> str:
    """``python benchmarks/SCRIPT.py ARGV`` (its ``main``) in this process; its stdout."""
    spec = importlib.util.spec_from_file_location(f"docs_benchmark_{script}", ROOT / "benchmarks" / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with cached_zoo(), contextlib.redirect_stdout(out):
        module.main(list(argv))
    return out.getvalue()


def snippet(page: str, after: str) -> tuple[dict[str, Any], str]:
    """Run the first ``python`` block of docs/PAGE after the line starting with ``after``: its namespace, stdout."""
    text = (DOCS / page).read_text(encoding="utf-8")
    start = next((m.end() for m in re.finditer(rf"^{re.escape(after)}.*$", text, re.MULTILINE)), None)
    if start is None:
        raise ValueError(f"docs/{page} has no line starting with {after!r}")
    block = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL).search(text, start)
    if block is None:
        raise ValueError(f"docs/{page} has no ```python block after {after!r}")
    code = block.group(1)
    if code not in _SNIPPETS:
        namespace: dict[str, Any] = {"__name__": "docs_snippet"}
        out = io.StringIO()
        with cached_zoo(), contextlib.redirect_stdout(out):
            exec(compile(code, f"docs/{page}", "exec"), namespace)
        _SNIPPETS[code] = namespace, out.getvalue()
    return _SNIPPETS[code]


# ------------------------------------------------------------------------------------ formatting
def markdown(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def gib(num_bytes: float, digits: int = 2) -> str:
    return f"{num_bytes / 2**30:,.{digits}f}"


# ---------------------------------------------------------------------------------------- tables
def topologies() -> str:
    rows = [(t["name"], t["machines_x_gpus"], t["interconnect"], t["source"]) for t in cli_json("topologies")]
    return markdown(("topology", "machines x GPUs", "interconnect (per direction)", "source"), rows)


LLAMA = ("--model", "llama_7b", "--topology", "h100-2x8")
PRECISION_PAGE = "results/large-models.md"


def _tensor_parallel() -> tuple[dict[str, Any], str]:
    return snippet(PRECISION_PAGE, "split the batch over all 16 GPUs")


def precision() -> str:
    """Llama-7B on h100-2x8: data parallelism (the command line) and the page's tensor-parallel plan."""
    from placement_rl import simulate, zoo
    from placement_rl.sim import CostModel

    rows = []
    for precision_name in ("fp32", "bf16-mixed"):
        command = ("simulate", *LLAMA, "--plan", "dp", "--precision", precision_name)
        now, before = cli_json(*command), cli_json(*command, "--calibration", "roofline")
        peak = gib(now["max_peak_memory_bytes"])
        if precision_name != "fp32":
            with cached_zoo():
                graph = zoo.load("llama_7b")
            state = CostModel(precision=precision_name).state_bytes_per_param_byte * graph.param_bytes
            peak += f" ({gib(state)} of parameter state)"
        fits = "no" if now["oom"] else "yes"
        rows.append(("data_parallel", precision_name, ms(now["makespan_s"]), ms(before["makespan_s"]), peak, fits))
    namespace, _ = _tensor_parallel()
    graph, cluster, plan = namespace["graph"], namespace["cluster"], namespace["plan"]
    for precision_name in ("fp32", "bf16-mixed"):
        now = simulate(graph, cluster, plan, CostModel(precision=precision_name))
        before = simulate(graph, cluster, plan, CostModel(precision=precision_name, calibration=None))
        fits = "no" if now.oom else "yes"
        peak = gib(now.peak_memory_bytes.max())
        rows.append(("tensor_parallel (below)", precision_name, ms(now.makespan_s), ms(before.makespan_s), peak, fits))
    header = ("plan", "precision", "ms/iter", "before: ms/iter (`--calibration roofline`)", "peak GiB per GPU", "fits")
    return markdown(header, rows)


def tensor_parallel_output() -> str:
    """What the page's tensor-parallel snippet prints."""
    _, printed = _tensor_parallel()
    return "```text\n" + printed + "```\n"


GPT = ("--model", "gpt_1.7b", "--batch-size", "16", "--topology", "dgx-a100-x1", "--precision", "bf16-mixed")
PIPELINE_PLANS = {
    "layerwise stages, 1 micro-batch": ("--plan", "layerwise"),
    "the same, GPipe, 16 micro-batches": ("--plan", "layerwise", "--micro-batches", "16", "--schedule", "gpipe"),
    "the same, 1F1B, 16 micro-batches": ("--plan", "layerwise", "--micro-batches", "16", "--schedule", "1f1b"),
    "data parallel": ("--plan", "dp"),
    "data parallel, ZeRO-1": ("--plan", "dp", "--zero", "1"),
    "data parallel, ZeRO-3": ("--plan", "dp", "--zero", "3"),
    "data parallel, recomputing every op": ("--plan", "dp", "--recompute", "all"),
}


def pipeline() -> str:
    """GPT-1.7B on one DGX A100 under each large-model option."""
    rows = []
    for label, plan in PIPELINE_PLANS.items():
        result = cli_json("simulate", *GPT, *plan)
        rows.append((label, ms(result["makespan_s"]), gib(result["max_peak_memory_bytes"], 1)))
    return markdown(("plan", "ms/iter", "peak GiB"), rows)


def sfb() -> str:
    """TAG Table 5: ``python benchmarks/sfb.py``'s table."""
    return table_lines(benchmark("sfb"))


TRINITY_MODELS = {
    "default (calibrated, flows, 25 MiB buckets)": (),
    "`--calibration roofline`": ("--calibration", "roofline"),
    "`--calibration roofline --network circuit --bucket-bytes 0` (the model of the run)": (
        "--calibration",
        "roofline",
        "--network",
        "circuit",
        "--bucket-bytes",
        "0",
    ),
}


def trinity_single_gpu() -> str:
    """vgg19 on tag-testbed: the single fastest GPU against data parallelism under each cost model."""
    rows = []
    for label, options in TRINITY_MODELS.items():
        dp = cli_json("simulate", "--model", "vgg19", "--topology", "tag-testbed", "--plan", "dp", *options)
        single = cli_json("simulate", "--model", "vgg19", "--topology", "tag-testbed", "--plan", "single", *options)
        speedup = dp["makespan_s"] / single["makespan_s"]
        rows.append((label, ms(dp["makespan_s"]), ms(single["makespan_s"]), f"{speedup:.2f}x"))
    return markdown(("cost model", "data parallel ms", "single GPU ms", "single GPU vs DP"), rows)


def table_lines(printed: str) -> str:
    """The Markdown table rows of a command's output (its other lines are progress and titles)."""
    return "".join(line + "\n" for line in printed.splitlines() if line.startswith("|"))


def without_columns(table: str, dropped: Sequence[str]) -> str:
    """A Markdown table (:func:`table_lines`) without the columns named ``dropped``: wall-clock seconds,
    which a command prints beside its figures but does not reproduce."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()]
    header, body = rows[0], rows[2:]
    keep = [i for i, name in enumerate(header) if name not in dropped]
    return markdown([header[i] for i in keep], [[row[i] for i in keep] for row in body])


def ft_devices() -> str:
    """FT's pick per listing of each cluster: the first devices as listed, device sets, a mesh per stage
    (FT's running time left out)."""
    return without_columns(table_lines(benchmark("ft", "devices", "--max-configs", "8")), ("FT s",))


def env_agents() -> str:
    """The random and greedy reference agents on both action spaces (each row's seconds left out)."""
    return without_columns(table_lines(benchmark("envs", "agents", "--seeds", "10")), ("s",))


def ft_estimate() -> str:
    """TensorOpt Table 2: FT's estimate against the simulator, ``python benchmarks/ft.py estimate``'s table."""
    return table_lines(benchmark("ft", "estimate", "--models", "rnnlm,transformer,vgg16,wideresnet"))


#: A calibration table's column: (precision group, execution mode, batch groups in one cell, header).
Column = tuple[str, str, tuple[str, ...], str]
#: Its row: (the report's key, cost model, label).
Row = tuple[str, str, str]

H100_COLUMNS: tuple[Column, ...] = (
    ("fp32", "eager", ("full",), "fp32, zoo batch"),
    ("fp32", "eager", ("shards",), "fp32, shards"),
    ("bf16-mixed", "eager", ("full",), "bf16-mixed, zoo batch"),
    ("bf16-mixed", "eager", ("shards",), "bf16-mixed, shards"),
)
H100_ROWS: tuple[Row, ...] = (
    ("errors", "roofline", "`roofline`"),
    ("errors", "calibrated", "`calibrated` (fitted to the H200 only)"),
)
H200_COLUMNS: tuple[Column, ...] = (
    *H100_COLUMNS,
    ("bf16-mixed", "cuda_graphs", ("full", "shards"), "bf16 CUDA graphs, zoo batch / shards"),
    ("fp32 no-TF32", "eager", ("full",), "fp32, TF32 off"),
)
H200_ROWS: tuple[Row, ...] = (
    ("errors", "roofline", "before: `roofline`"),
    ("errors", "calibrated", "`calibrated` (default)"),
    ("cross_validation", "calibrated", "`calibrated`, each model left out of its fit"),
    ("errors", "profiled", "`profiled` (`--profile profile_*.json`)"),
)


def calibration_report(*argv: str) -> dict[str, Any]:
    """``python benchmarks/calibration.py ARGV --json OUT``'s report (errors per group, cross-validation)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report.json"
        benchmark("calibration", *argv, "--json", str(out))
        return dict(json.loads(out.read_text()))


def calibration_table(report: dict[str, Any], columns: Sequence[Column], rows: Sequence[Row]) -> str:
    """Median / worst error per row and column of a calibration report (a cell is empty where the report
    has no rows for it: no profile without TF32)."""
    cells: dict[tuple[str, str, str, str, str], str] = {}
    for key in {key for key, _, _ in rows}:
        for e in report[key]:
            cells[(key, e["cost_model"], e["precision"], e["execution_mode"], e["batch"])] = (
                f"{e['median_error']:.0%} / {e['worst_error']:.0%}"
            )
    body = [
        [label]
        + [
            ", ".join(c for b in batches if (c := cells.get((key, model, precision, mode, b), "")))
            for precision, mode, batches, _ in columns
        ]
        for key, model, label in rows
    ]
    return markdown(["cost model", *(header for *_, header in columns)], body)


def h100_calibration() -> str:
    """The shipped calibration against the H100's eager iterations: median / worst error per cost model
    (``python benchmarks/calibration.py --data benchmarks/data/h100``'s table, one column per group)."""
    report = calibration_report("--data", str(ROOT / "benchmarks" / "data" / "h100"))
    return calibration_table(report, H100_COLUMNS, H100_ROWS)


def h200_calibration() -> str:
    """The shipped calibration against the H200's iterations, with each model left out of its fit in turn
    (``python benchmarks/calibration.py --cross-validate``, about 15 minutes)."""
    return calibration_table(calibration_report("--cross-validate"), H200_COLUMNS, H200_ROWS)


def megatron() -> str:
    """Megatron-LM's Table 1 simulated: ``python benchmarks/megatron.py --json``'s rows as the page's table
    (about two minutes)."""
    rows = []
    for line in benchmark("megatron", "--json").splitlines():
        r = json.loads(line)
        size = r["params_b"]
        label = f"{size / 1000:.0f}T" if size >= 1000 else f"{size:g}B"  # 1,008B: the paper's "1T"
        sim = r["simulated_tflops_per_gpu"]
        simulated = "-" if sim is None else f"{sim:.1f}" + (" (out of memory)" if r.get("oom") else "")
        ratio = "-" if sim is None else f"{r['ratio']:.2f}"
        rows.append(
            [
                label,
                f"{r['gpus']:,}",
                r["tensor_parallel"],
                r["pipeline_parallel"],
                r["data_parallel"],
                r["micro_batches"],
                r["published_tflops_per_gpu"],
                simulated,
                ratio,
            ]
        )
    header = ["params", "GPUs", "t", "p", "d", "micro-batches", "published TFLOP/s", "simulated", "ratio"]
    return markdown(header, rows)


def mcmc_exact() -> str:
    """MCMC against the exhaustive optimum: ``python benchmarks/search.py exact --proposals 6000
    --proposals-kind soap``'s table (a few minutes)."""
    return table_lines(benchmark("search", "exact", "--proposals", "6000", "--proposals-kind", "soap"))


def importer_accuracy() -> str:
    """Graph FLOPs over ``FlopCounterMode``: ``python benchmarks/importer.py --accuracy``'s table."""
    return table_lines(benchmark("importer", "--accuracy"))


TABLES: dict[str, Table] = {
    "topologies": Table("concepts/topology.md", "placement-rl topologies", topologies),
    "precision": Table(
        PRECISION_PAGE, "placement-rl simulate --model llama_7b --topology h100-2x8 --plan dp", precision
    ),
    "tensor-parallel-output": Table(PRECISION_PAGE, "print(result.oom", tensor_parallel_output),
    "pipeline": Table(
        PRECISION_PAGE,
        "placement-rl simulate --model gpt_1.7b --batch-size 16 --topology dgx-a100-x1 --precision bf16-mixed",
        pipeline,
    ),
    "sfb": Table("results/tag.md", "python benchmarks/sfb.py", sfb),
    "trinity-single-gpu": Table(
        "results/trinity.md",
        "placement-rl simulate --model vgg19 --topology tag-testbed --plan single",
        trinity_single_gpu,
    ),
    "ft-devices": Table("results/tensoropt.md", "python benchmarks/ft.py devices --max-configs 8", ft_devices, True),
    "ft-estimate": Table(
        "results/tensoropt.md",
        "python benchmarks/ft.py estimate --models rnnlm,transformer,vgg16,wideresnet",
        ft_estimate,
        True,
    ),
    "h100-calibration": Table(
        "results/simulator.md",
        "python benchmarks/calibration.py --data benchmarks/data/h100",
        h100_calibration,
        True,
    ),
    "h200-calibration": Table(
        "results/simulator.md", "python benchmarks/calibration.py --cross-validate", h200_calibration, True
    ),
    "mcmc-exact": Table(
        "results/flexflow.md",
        "python benchmarks/search.py exact --proposals 6000 --proposals-kind soap",
        mcmc_exact,
        True,
    ),
    "megatron": Table("results/large-models.md", "python benchmarks/megatron.py", megatron, True),
    "env-agents": Table("results/environments.md", "python benchmarks/envs.py agents --seeds 10", env_agents, True),
    "importer-accuracy": Table(
        "results/importer.md", "python benchmarks/importer.py --accuracy", importer_accuracy, True
    ),
}


# ----------------------------------------------------------------------------------------- pages
def regions(text: str) -> dict[str, str]:
    """The generated regions of a page's text: name -> content."""
    found: dict[str, str] = {}
    for match in REGION.finditer(text):
        if match.group(2) in found:
            raise ValueError(f"generated region {match.group(2)!r} appears twice")
        found[match.group(2)] = match.group(3)
    return found


def page_regions() -> dict[str, tuple[str, str]]:
    """Every generated region under docs/: name -> (page relative to docs/, content)."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(DOCS.rglob("*.md")):
        page = path.relative_to(DOCS).as_posix()
        for name, content in regions(path.read_text(encoding="utf-8")).items():
            if name in found:
                raise ValueError(f"generated region {name!r} is in docs/{found[name][0]} and docs/{page}")
            found[name] = (page, content)
    return found


def render(name: str) -> str:
    """The content region ``name`` should have now (runs its command)."""
    return TABLES[name].render()


def replace(text: str, name: str, content: str) -> str:
    """``text`` with region ``name``'s content replaced."""

    def swap(match: re.Match[str]) -> str:
        return match.group(1) + content + match.group(4) if match.group(2) == name else match.group(0)

    return REGION.sub(swap, text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"tables to render (default: all): {', '.join(TABLES)}")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a region differs")
    parser.add_argument(
        "--slow", action="store_true", help="with no names: the slow tables too (a minute or more each)"
    )
    parser.add_argument("--list", action="store_true", help="list the tables, their pages and commands")
    args = parser.parse_args(argv)
    if args.list:
        for name, table in TABLES.items():
            print(f"{name}: docs/{table.page}: {table.command}" + (" (slow)" if table.slow else ""))
        return 0
    unknown = sorted(set(args.names) - set(TABLES))
    if unknown:
        parser.error(f"unknown table(s) {', '.join(unknown)}; expected: {', '.join(TABLES)}")
    stale = []
    for name in args.names or [name for name, table in TABLES.items() if args.slow or not table.slow]:
        path = DOCS / TABLES[name].page
        text = path.read_text(encoding="utf-8")
        if name not in regions(text):
            raise SystemExit(f"error: docs/{TABLES[name].page} has no '<!-- generated: {name} -->' region")
        content = render(name)
        if regions(text)[name] == content:
            print(f"{name}: docs/{TABLES[name].page} is up to date")
            continue
        stale.append(name)
        if args.check:
            print(f"{name}: docs/{TABLES[name].page} differs from what its command prints now:\n{content}")
        else:
            path.write_text(replace(text, name, content), encoding="utf-8")
            print(f"{name}: docs/{TABLES[name].page} rewritten")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

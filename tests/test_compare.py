"""``placement-rl compare`` at tiny budgets, in process (no Ray): outputs, resume, interrupts, bad input.

The Ray runner has its own tests in tests/rl/test_compare_ray.py.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from placement_rl import zoo
from placement_rl.cli import main
from placement_rl.experiments import (
    FINISHED,
    parse_experiment,
    prepare,
    read_rows,
    run_experiment,
    serial_cells,
)
from placement_rl.methods import compare_methods, compute_lower_bound_s
from placement_rl.paths import safe_name
from placement_rl.plan import Plan, data_parallel, single_device
from placement_rl.sim import SimContext, simulate
from placement_rl.topology import load_preset, resolve_topology

ROOT = Path(__file__).resolve().parents[1]

#: 2 models x 2 topologies x 3 methods; MCMC (seeded) runs for 2 seeds: 4 instances x 4 cells = 16 cells.
TINY: dict[str, Any] = {
    "name": "tiny",
    "models": [{"model": "lenet", "batch_size": 32}, {"model": "alexnet", "batch_size": 32}],
    "topologies": ["trinity", "random:3"],
    "methods": ["data_parallel", "expert", {"method": "mcmc", "budget": 30}],
    "seeds": [0, 1],
}
CELLS = 16


def write_yaml(folder: Path, doc: dict[str, Any], name: str = "exp.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The tiny experiment run once through the command line (serial), with its JSON report."""
    folder = tmp_path_factory.mktemp("compare")
    out = folder / "out"
    argv = ["compare", str(write_yaml(folder, TINY)), "--out", str(out), "--serial", "--json"]
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(argv) == 0
    return out, json.loads(buffer.getvalue())


def test_a_2x2x3_experiment_writes_every_output(tiny_run: tuple[Path, dict[str, Any]]) -> None:
    out, report = tiny_run
    assert report["ran"] == CELLS and report["skipped"] == 0
    rows = read_rows(out / "results.jsonl")
    assert len(rows) == CELLS and len({r["cell"] for r in rows}) == CELLS
    assert all(r["status"] == "ok" for r in rows)
    by_method: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_method.setdefault(r["method"], []).append(r)
    assert {m: len(v) for m, v in by_method.items()} == {"data_parallel": 4, "expert": 4, "mcmc": 8}
    assert sorted({r["seed"] for r in by_method["mcmc"]}) == [0, 1]
    assert {r["seed"] for r in by_method["data_parallel"]} == {None}
    for r in rows:
        # The lower bound and the headroom share, as defined.
        assert 0 < r["lower_bound_s"] <= r["dp_makespan_s"]
        headroom = (r["dp_makespan_s"] - r["makespan_s"]) / (r["dp_makespan_s"] - r["lower_bound_s"])
        assert r["headroom_captured"] == pytest.approx(headroom)
        assert r["speedup_over"]["data_parallel"] == pytest.approx(r["dp_makespan_s"] / r["makespan_s"])
        # Every plan is a plan JSON that simulate accepts, and reproduces the row's makespan.
        plan = Plan.from_json(out / r["plan_file"])
        graph = zoo.load(r["graph"], batch_size=r["batch_size"])
        assert simulate(graph, resolve_topology(_spec(r["topology"])), plan).makespan_s == pytest.approx(
            r["makespan_s"]
        )
    for r in by_method["data_parallel"]:
        assert r["speedup_over_dp"] == 1.0 and r["headroom_captured"] == 0.0
    for r in by_method["mcmc"]:  # MCMC reports its anytime trace: best cost, never rising, ending at its plan
        trace = r["anytime"]
        assert trace and all(b[1] <= a[1] for a, b in zip(trace, trace[1:], strict=False))
        assert trace[-1][1] == pytest.approx(r["makespan_s"]) or r["oom"]
    # results.csv: one line per row, the speedups flattened.
    with open(out / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == CELLS and "speedup_over_data_parallel" in table[0] and "headroom_captured" in table[0]
    assert (out / "results.md").read_text().startswith("# tiny")
    # The summary: geometric-mean speedup, wins and OOM count per method.
    summary = {s["method"]: s for s in report["summary"]}
    assert summary["data_parallel"]["geomean_speedup_over_data_parallel"] == pytest.approx(1.0)
    assert sum(s["wins"] for s in summary.values()) >= 4  # every instance has a winner (ties shared)
    assert all(s["oom_cells"] == 0 for s in summary.values())
    assert summary["mcmc"]["geomean_speedup_over_data_parallel"] >= 1.0 - 1e-9  # MCMC starts from data parallelism
    for name in ("summary.csv", "summary.md"):
        assert "mcmc" in (out / name).read_text()
    for name in ("speedup.png", "anytime.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    # One anytime PNG per instance besides the all-in-one.
    per_instance = sorted(p.name for p in (out / "anytime").iterdir())
    assert per_instance == sorted(f"{safe_name(i)}.png" for i in {r["instance"] for r in rows})
    assert all((out / "anytime" / n).read_bytes()[:4] == b"\x89PNG" for n in per_instance)
    assert json.loads((out / "experiment.json").read_text())["name"] == "tiny"


def _spec(topology_name: str) -> str:
    return topology_name.replace("random-", "random:")


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from placement_rl.experiments import parse_experiment, prepare, run_experiment, serial_cells
    import yaml

    def killing(fn, args):
        for done, item in enumerate(serial_cells(fn, args)):
            if done == {after}:  # the driver has recorded {after} cells: die as a killed process would
                os.kill(os.getpid(), signal.SIGKILL)
            yield item

    exp = parse_experiment(yaml.safe_load(open(sys.argv[1])), name="tiny")
    run_experiment(prepare(exp), sys.argv[2], runner=killing, progress=False)
    """
)


def test_resume_after_the_runner_is_killed_midway(tmp_path: Path) -> None:
    spec, out = write_yaml(tmp_path, TINY), tmp_path / "out"
    script = tmp_path / "killer.py"
    script.write_text(KILLER.format(after=5))
    done = subprocess.run([sys.executable, str(script), str(spec), str(out)], capture_output=True, timeout=600)
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    finished = read_rows(out / "results.jsonl")
    assert len(finished) == 5
    # A torn line (a crash while writing) is dropped, not an error.
    with open(out / "results.jsonl", "ab") as f:
        f.write(b'{"cell": "lenet-b32@trinity|mcmc|1", "status": "o')
    asked: list[str] = []

    def counting(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
        asked.extend(a[1].key for a in args)
        yield from serial_cells(fn, args)

    exp = parse_experiment(TINY, name="tiny")
    prepared = prepare(exp)
    with pytest.raises(ValueError, match="pass --resume"):
        run_experiment(prepared, out, progress=False)  # never overwrites finished results
    report = run_experiment(prepared, out, resume=True, runner=counting, progress=False)
    assert report.skipped == 5 and report.ran == CELLS - 5
    assert sorted(asked) == sorted({c.key for c in prepared.cells} - {r["cell"] for r in finished})
    rows = read_rows(out / "results.jsonl")
    assert len(rows) == CELLS and len({r["cell"] for r in rows}) == CELLS
    assert rows[:5] == finished  # the finished rows are kept as they were
    assert len(list(csv.DictReader(open(out / "results.csv")))) == CELLS


def test_ctrl_c_keeps_the_finished_cells_and_writes_the_outputs(tmp_path: Path, capsys: Any) -> None:
    def interrupted(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
        for done, item in enumerate(serial_cells(fn, args)):
            if done == 3:
                raise KeyboardInterrupt
            yield item

    doc = {**TINY, "models": TINY["models"][:1], "topologies": ["trinity"]}
    prepared = prepare(parse_experiment(doc, name="tiny"))
    with pytest.raises(KeyboardInterrupt):
        run_experiment(prepared, tmp_path, runner=interrupted, progress=False)
    assert "run again with --resume" in capsys.readouterr().out
    rows = read_rows(tmp_path / "results.jsonl")
    assert len(rows) == 3 and all(r["status"] in FINISHED for r in rows)
    assert len(list(csv.DictReader(open(tmp_path / "results.csv")))) == 3
    report = run_experiment(prepared, tmp_path, resume=True, progress=False)
    assert report.ran == 1 and len(report.rows) == 4


def _checkpoint(folder: Path, agent: str, model: str) -> Path:
    """A run folder with only the train_config.json the checks read (no policy)."""
    (folder / "checkpoint_final").mkdir(parents=True)
    config = {"name": "run", "agent": agent, "env": {"generator": {"kind": "fixed", "model": model}}}
    (folder / "train_config.json").write_text(json.dumps(config))
    return folder / "checkpoint_final"


BAD: list[tuple[dict[str, Any], str]] = [
    ({**TINY, "modles": []}, "unknown key(s) ['modles']; expected some of"),
    ({k: v for k, v in TINY.items() if k != "methods"}, "missing key 'methods'"),
    ({**TINY, "methods": ["mcmcc"]}, "unknown method 'mcmcc'; expected one of"),
    ({**TINY, "models": ["lenett"]}, "models[0] (lenett): unknown model 'lenett'"),
    ({**TINY, "models": [{"model": "lenet", "batch": 3}]}, "models[0]: unknown key(s) ['batch']"),
    ({**TINY, "models": [{"model": "lenet", "batch_size": 0}]}, "batch_size = 0; expected an integer >= 1"),
    ({**TINY, "topologies": ["trinityy"]}, "topologies: unknown topology 'trinityy'"),
    ({**TINY, "topologies": ["test:0"]}, "'test:0'; expected 'test:N' with a positive N"),
    ({**TINY, "methods": [{"method": "mcmc", "budget": "10 sec"}]}, "budget = '10 sec'"),
    ({**TINY, "methods": [{"method": "mcmc", "budget": 2.5}]}, "budget = 2.5"),
    ({**TINY, "methods": [{"method": "mcmc", "budgte": "1s"}]}, "unknown key(s) ['budgte']; expected some of"),
    ({**TINY, "methods": [{"method": "mcmc", "chains": 0}]}, "chains = 0; expected an integer >= 1"),
    ({**TINY, "methods": [{"method": "exhaustive", "time_limit": 30}]}, "time_limit = 30; expected a duration"),
    ({**TINY, "methods": ["exhaustive"]}, "plans, more than max_plans = 1e+06"),
    ({**TINY, "methods": [{"method": "ft", "device_counts": [64]}]}, "'trinity' has only 4 devices"),
    ({**TINY, "methods": ["expert", {"method": "expert"}]}, "two entries are named 'expert'"),
    ({**TINY, "methods": ["trinity"]}, "the learned agent 'trinity' needs a checkpoint_* folder"),
    ({**TINY, "methods": [{"method": "expert", "checkpoint": "x"}]}, "unknown key(s) ['checkpoint']"),
    ({**TINY, "seeds": [-1]}, "seed -1; expected integers >= 0"),
    ({**TINY, "seeds": 0}, "seeds: 0; expected a count >= 1"),
    ({**TINY, "cost": {"optimizer": "sgdd"}}, "unknown optimizer 'sgdd'"),
    ({**TINY, "cost": {"optimiser": "adam"}}, "cost: unknown key(s) ['optimiser']"),
    ({**TINY, "concurrency": 0}, "concurrency = 0"),
]


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_experiment_files_fail_naming_the_key(tmp_path: Path, capsys: Any, doc: dict, message: str) -> None:
    out = tmp_path / "out"
    assert main(["compare", str(write_yaml(tmp_path, doc)), "--out", str(out), "--serial"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(tmp_path / "exp.yaml") in err
    assert not out.exists()  # refused before any cell ran


def test_learned_methods_are_checked_before_any_cell(tmp_path: Path, capsys: Any) -> None:
    other = _checkpoint(tmp_path / "tag-run", "tag", "lenet")
    seen = _checkpoint(tmp_path / "trinity-run", "trinity", "lenet")
    cases = [
        ({"method": "trinity", "checkpoint": str(other)}, "holds a 'tag' policy, not a 'trinity' one"),
        (
            {"method": "trinity", "checkpoint": str(seen), "held_out": ["lenet"]},
            "was trained on ['lenet'], which the entry holds out",
        ),
        ({"method": "trinity", "checkpoint": str(tmp_path / "nowhere")}, "does not exist"),
        ({"method": "trinity", "checkpoint": str(seen)}, "has no policy export"),
        ({"method": "trinity", "checkpoint": {"lenet": str(seen)}}, "no checkpoint for model(s) ['alexnet']"),
        ({"method": "trinity", "checkpoint": str(seen), "env": [60]}, "env = [60]; expected a mapping of env options"),
    ]
    for entry, message in cases:
        doc = {**TINY, "methods": ["data_parallel", entry]}
        assert main(["compare", str(write_yaml(tmp_path, doc)), "--out", str(tmp_path / "out"), "--serial"]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "out").exists()


def test_optional_methods_that_do_not_exist_yet_get_rows_saying_so(tmp_path: Path) -> None:
    doc = {
        "models": [{"model": "lenet", "batch_size": 32}],
        "topologies": ["trinity"],
        "methods": [
            "data_parallel",
            {"method": "hap", "checkpoint": "out/hap/checkpoint_final", "optional": True},
            {"method": "pipedream", "budget": "10s", "optional": True},
            {"method": "trinity", "name": "later", "checkpoint": str(tmp_path / "not-yet"), "optional": True},
        ],
    }
    report = run_experiment(prepare(parse_experiment(doc, agents=["trinity"])), tmp_path, progress=False)
    rows = {r["method"]: r for r in report.rows}
    # a registered agent whose checkpoint is not trained yet: its row says so instead of failing
    assert rows["later"]["status"] == "unavailable"
    assert f"checkpoint {str(tmp_path / 'not-yet')!r} does not exist yet" in rows["later"]["note"]
    assert rows["hap"]["status"] == "unavailable" and "agent 'hap' does not exist yet" in rows["hap"]["note"]
    assert rows["pipedream"]["status"] == "unavailable" and rows["pipedream"]["makespan_s"] is None
    assert "unavailable: agent 'hap' does not exist yet" in (tmp_path / "results.md").read_text()
    summary = {s["method"]: s for s in report.summary}
    assert summary["hap"]["unavailable"] == 1 and summary["hap"]["instances"] == 0


def test_exhaustive_runs_on_a_small_space(tmp_path: Path) -> None:
    doc = {
        "models": [{"model": "lenet", "batch_size": 32, "coarsen": 3}],
        "topologies": ["trinity"],
        "methods": ["data_parallel", {"method": "exhaustive", "devices": 2, "time_limit": "2m"}],
    }
    report = run_experiment(prepare(parse_experiment(doc)), tmp_path, progress=False)
    rows = {r["method"]: r for r in report.rows}
    assert rows["exhaustive"]["status"] == "ok" and rows["exhaustive"]["devices_used"] <= 2
    graph_file = next((tmp_path / "graphs").glob("*.json"))  # the coarsened graph, for `simulate --model`
    plan_file = tmp_path / rows["exhaustive"]["plan_file"]
    assert main(["simulate", "--model", str(graph_file), "--topology", "trinity", "--plan", str(plan_file)]) == 0


def test_plan_rows_are_compare_rows(tmp_path: Path, capsys: Any) -> None:
    argv = ["plan", "--model", "lenet", "--batch-size", "32", "--topology", "trinity", "--methods", "dp,expert"]
    assert main([*argv, "--out-dir", str(tmp_path / "plan"), "--json"]) == 0
    plan_rows = json.loads(capsys.readouterr().out)["methods"]
    doc = {
        "models": [{"model": "lenet", "batch_size": 32}],
        "topologies": ["trinity"],
        "methods": ["data_parallel", "expert"],
    }
    report = run_experiment(prepare(parse_experiment(doc)), tmp_path / "cmp", progress=False)
    for mine, theirs in zip(plan_rows, report.rows, strict=True):
        assert set(mine) == set(theirs)
        assert mine["cell"] == theirs["cell"] and mine["makespan_s"] == pytest.approx(theirs["makespan_s"])


def test_compute_lower_bound_and_headroom(zoo_graph: Callable[..., Any]) -> None:
    graph, topo = zoo_graph("alexnet"), load_preset("trinity")
    single = simulate(graph, topo, single_device(graph, topo))
    bound = compute_lower_bound_s(SimContext(graph, topo))
    assert bound == single.busy_s.sum() / 4  # one device type: the earlier bound, exactly
    [dp, one] = compare_methods(graph, topo, ["data_parallel", "single_device"])
    assert dp.lower_bound_s == bound and dp.headroom_captured == 0.0
    assert dp.makespan_s == simulate(graph, topo, data_parallel(graph, topo)).makespan_s
    assert one.headroom_captured == pytest.approx((dp.makespan_s - one.makespan_s) / (dp.makespan_s - bound))


def _mixed_cluster() -> Any:
    """Two V100s and three K80s (peaks 15.7 and 4.37 TFLOP/s) on two machines over 10 Gb/s."""
    from placement_rl.topology.builder import TopologyBuilder, switched_machine
    from placement_rl.topology.devices import gbit_to_bytes_per_s

    b = TopologyBuilder()
    uplink = (b.switch("eth"), gbit_to_bytes_per_s(10), "ethernet")
    switched_machine(b, "V100-SXM2-16GB", 2, uplink)  # type: ignore[arg-type]
    switched_machine(b, "K80", 3, uplink)  # type: ignore[arg-type]
    return b.build("mixed-2v100-3k80")


def test_compute_lower_bound_counts_each_device_at_its_own_speed(zoo_graph: Callable[..., Any]) -> None:
    graph, topo = zoo_graph("lenet", batch_size=64), _mixed_cluster()
    fast = simulate(graph, topo, single_device(graph, topo, "m0/gpu0")).busy_s.sum()
    slow = simulate(graph, topo, single_device(graph, topo, "m1/gpu0")).busy_s.sum()
    assert fast < slow
    ctx = SimContext(graph, topo)
    bound = compute_lower_bound_s(ctx)
    assert bound == pytest.approx(1 / (2 / fast + 3 / slow), rel=1e-12)
    assert bound > fast / 5  # the earlier bound counted all five as V100s
    # a device subset counts only its devices; a subset of one type is T / n exactly
    assert compute_lower_bound_s(ctx, ["m1/gpu0", "m1/gpu1", "m1/gpu2"]) == slow / 3
    assert compute_lower_bound_s(ctx, ["m0/gpu1", "m1/gpu2"]) == pytest.approx(1 / (1 / fast + 1 / slow), rel=1e-12)
    [dp] = compare_methods(graph, topo, ["data_parallel"])
    assert dp.lower_bound_s == pytest.approx(bound, rel=1e-12)
    with pytest.raises(ValueError, match="no devices"):
        compute_lower_bound_s(ctx, [])


def test_shipped_experiment_files_are_valid() -> None:
    from placement_rl.rl.compare import load_experiment

    files = sorted((ROOT / "benchmarks" / "experiments").glob("*.yaml"))
    assert len(files) >= 5
    for path in files:
        exp = load_experiment(path)
        assert exp.models and exp.topologies and exp.methods


def test_a_search_never_returns_a_plan_slower_than_data_parallelism(zoo_graph: Callable[..., Any]) -> None:
    from placement_rl.methods import Method

    graph, topo = zoo_graph("lenet", batch_size=4096), load_preset("trinity")
    slow = Method("slow_search", lambda p: single_device(p.graph, p.topology, p.topology.devices[-1].name))
    fixed = Method("fixed", slow.run, search=False)
    [dp, kept, baseline] = compare_methods(graph, topo, ["data_parallel", slow, fixed])
    assert not dp.oom and baseline.makespan_s > dp.makespan_s  # the plan the search found is slower
    assert kept.makespan_s == dp.makespan_s and kept.plan.metadata["kept_data_parallel"]
    assert "nothing it found beat data parallelism" in kept.note and f"{baseline.makespan_s * 1e3:,.1f} ms" in kept.note
    assert baseline.plan.name != dp.plan.name and not baseline.note  # a fixed baseline is shown as it is

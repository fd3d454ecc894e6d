"""The placement-rl command line: outputs, JSON modes and errors for unknown names."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from placement_rl import zoo
from placement_rl.cli import main
from placement_rl.graph import OpGraph
from placement_rl.methods import DEFAULT_METHODS, SIMULATION_BOUND
from placement_rl.plan import Plan, data_parallel, single_device
from placement_rl.sim.cost import CostModel, ProfileEntry, ProfileTable
from placement_rl.sim.simulator import simulate
from placement_rl.topology import Device, DeviceTopology, load_preset, preset_names


def test_models_lists_the_zoo(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in zoo.names())
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == zoo.names()
    assert {r["name"]: r["default_batch_size"] for r in rows}["inception_v3"] == 96


def test_topologies_lists_presets(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["topologies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == preset_names()
    assert {r["name"]: r["devices"] for r in rows}["flexflow-k80"] == 64


def test_show_graph_text_json_and_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["show-graph", "lenet", "--ops"]) == 0
    out = capsys.readouterr().out
    assert "graph lenet" in out and "conv2d" in out and "sample:s" in out
    path = tmp_path / "lenet.json"
    assert main(["show-graph", "lenet", "--batch-size", "8", "--json", "--out", str(path)]) == 0
    printed = OpGraph.from_dict(json.loads(capsys.readouterr().out))
    assert printed == OpGraph.from_json(path)
    assert printed.batch_size == 8
    # A graph file is accepted in place of a zoo name, and can be coarsened.
    assert main(["show-graph", str(path), "--coarsen", "4", "--json"]) == 0
    coarse = OpGraph.from_dict(json.loads(capsys.readouterr().out))
    assert coarse.num_ops == 4 and coarse.metadata["coarsened_from"] == "lenet"


def test_show_topology(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["show-topology", "tag-testbed"]) == 0
    assert "V100-SXM2-32GB" in capsys.readouterr().out
    path = tmp_path / "t.json"
    assert main(["show-topology", "random:5", "--out", str(path), "--json"]) == 0
    printed = DeviceTopology.from_dict(json.loads(capsys.readouterr().out))
    assert printed == DeviceTopology.from_json(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show-graph", "resnet9000"], "unknown model 'resnet9000'; expected one of: alexnet, bert_large"),
        (["show-topology", "dgx-9000"], "unknown topology 'dgx-9000'; expected one of:"),
        (["show-graph", "lenet", "--batch-size", "0"], "argument --batch-size: '0': expected a positive integer"),
        (["show-graph", "missing.json"], "no such file: 'missing.json'"),
    ],
)
def test_bad_names_exit_2_with_valid_names(argv: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: " in err and message in err


def test_malformed_graph_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "placement_rl.graph",', encoding="utf-8")
    assert main(["show-graph", str(bad)]) == 2
    assert "malformed JSON at line 1" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "placement-rl"  # installed by `pip install .` (README)
    done = subprocess.run([str(script), "show-graph", "nonexistent"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "expected one of" in done.stderr


def test_plan_leaves_the_simulation_bound_methods_out_where_a_simulation_is_slow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import placement_rl.methods as methods

    monkeypatch.setattr(methods, "SEARCH_TASKS", 0)  # every instance counts as a large one
    argv = ["plan", "--model", "lenet", "--topology", "trinity", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    for name in SIMULATION_BOUND:
        assert f"{name}: left out: data parallelism's simulation has " in out
    rows = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in DEFAULT_METHODS]
    assert rows == [m for m in DEFAULT_METHODS if m not in SIMULATION_BOUND]
    assert "search budgets" not in err  # no search runs
    assert main([*argv, "--methods", "dp,mcts", "--mcts-budget", "5", "--json"]) == 0  # named: it runs
    report = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in report["methods"]] == ["data_parallel", "mcts"] and report["left_out"] == {}


def test_the_default_budget_is_simulations_time_within_bounds() -> None:
    from placement_rl.methods import AUTO_BUDGET_BOUNDS_S, AUTO_BUDGET_SIMULATIONS, auto_budget_s

    low, high = AUTO_BUDGET_BOUNDS_S
    assert auto_budget_s(1e-3) == low  # lenet: a millisecond a simulation, the floor
    assert auto_budget_s(0.05) == math.ceil(AUTO_BUDGET_SIMULATIONS * 0.05) and low < auto_budget_s(0.05) < high
    assert auto_budget_s(1.0) == auto_budget_s(math.inf) == high


def test_plan_scales_the_search_budgets_to_the_instance(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import placement_rl.methods as methods

    monkeypatch.setattr(methods, "AUTO_BUDGET_BOUNDS_S", (0.5, 0.5))  # the floor, made short for the test
    argv = ["plan", "--model", "lenet", "--topology", "trinity", "--methods", "dp,mcts,mcmc"]
    argv += ["--out-dir", str(tmp_path)]
    assert main([*argv, "--mcmc-budget", "40"]) == 0
    err = capsys.readouterr().err
    assert "search budgets: mcts 0.5s, mcmc 40" in err  # auto where not given, as given where given


def test_plan_runs_every_method_and_writes_the_best(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    # lenet on the 7 machines of tag-testbed: every method in seconds (the search methods' own tests
    # run them on larger models)
    out = tmp_path / "plan"
    argv = [
        "plan",
        "--model",
        "lenet",
        "--topology",
        "tag-testbed",
        "--out-dir",
        str(out),
        "--mcmc-budget",
        "150",
        "--mcts-budget",
        "30",
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    methods = {r["method"]: r for r in report["methods"]}
    assert set(methods) == set(DEFAULT_METHODS) and report["left_out"] == {}
    assert all(methods[m]["makespan_s"] <= methods["data_parallel"]["makespan_s"] for m in ("ft", "mcts", "mcmc"))
    assert methods["ft"]["makespan_s"] > 0 and methods["ft"]["search_s"] > 0
    assert methods["mcmc"]["makespan_s"] <= methods["data_parallel"]["makespan_s"]  # MCMC starts from data parallelism
    assert methods["data_parallel"]["speedup_over_dp"] == 1.0
    best = min((r for r in report["methods"] if not r["oom"]), key=lambda r: r["makespan_s"])
    assert report["best"] == best["method"]
    plan = Plan.from_json(out / "best_plan.json")
    assert plan.name == best["method"]
    assert (out / "best_plan.gantt.png").read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((out / "best_plan.trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    # Re-simulating the written plan reproduces the reported makespan.
    graph = zoo.load("lenet")
    result = simulate(graph, load_preset("tag-testbed"), plan)
    assert result.makespan_s == pytest.approx(best["makespan_s"])


def test_plan_says_what_it_is_loading_before_the_first_slow_step(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["plan", "--model", "lenet", "--topology", "trinity", "--methods", "dp", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.startswith("planning lenet on trinity: loading lenet and the simulator ...\n")


def test_plan_reports_oom_instead_of_crashing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = [
        "plan",
        "--model",
        "vgg16",
        "--topology",
        "trinity",
        "--methods",
        "single,dp",
        "--out-dir",
        str(tmp_path),
        "--json",
    ]
    assert main(argv) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["methods"]}
    assert rows["single_device"]["oom"] and rows["single_device"]["oom_devices"] == ["m0/gpu0"]


def test_simulate_a_plan_file_with_trace_and_gantt(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    graph = zoo.load("lenet")
    topo = load_preset("trinity")
    path = tmp_path / "dp.json"
    data_parallel(graph, topo).to_json(path)
    trace, gantt = tmp_path / "t.json", tmp_path / "g.png"
    argv = [
        "simulate",
        "--model",
        "lenet",
        "--topology",
        "trinity",
        "--plan",
        str(path),
        "--trace",
        str(trace),
        "--gantt",
        str(gantt),
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["makespan_s"] == pytest.approx(simulate(graph, topo, data_parallel(graph, topo)).makespan_s)
    assert json.loads(trace.read_text())["traceEvents"] and gantt.read_bytes()[:4] == b"\x89PNG"
    # A plan for another graph, or an unknown plan name, is an error that says so.
    assert main(["simulate", "--model", "alexnet", "--topology", "trinity", "--plan", str(path)]) == 2
    assert "was made for graph 'lenet', not 'alexnet'" in capsys.readouterr().err
    assert main(["simulate", "--model", "lenet", "--topology", "trinity", "--plan", "greedy"]) == 2
    assert "unknown plan 'greedy'; expected one of:" in capsys.readouterr().err


def test_simulate_runs_a_plan_with_micro_batches_recomputation_and_zero(capsys) -> None:  # type: ignore[no-untyped-def]
    from placement_rl.plan import layerwise, recompute, zero

    graph, topo = zoo.load("gpt"), load_preset("h100-2x8")
    base = ["simulate", "--model", "gpt", "--topology", "h100-2x8", "--json"]
    assert main([*base, "--plan", "layerwise", "--micro-batches", "4", "--schedule", "gpipe"]) == 0
    summary = json.loads(capsys.readouterr().out)
    expected = simulate(graph, topo, layerwise(graph, topo).with_schedule(4, "gpipe"))
    assert summary["makespan_s"] == pytest.approx(expected.makespan_s)
    assert main([*base, "--plan", "dp", "--recompute", "attention,linear", "--zero", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    plan = zero(graph, recompute(graph, data_parallel(graph, topo), ["attention", "linear"]), 1)
    assert summary["makespan_s"] == pytest.approx(simulate(graph, topo, plan).makespan_s)
    # bad values name themselves and what is allowed
    assert main([*base, "--plan", "dp", "--micro-batches", "3"]) == 2  # a usage error
    assert "3 micro-batches do not divide" in capsys.readouterr().err
    assert main([*base, "--plan", "dp", "--zero", "4"]) == 2
    assert "ZeRO stage '4'; expected 0, 1, 2 or 3" in capsys.readouterr().err


def test_profile_writes_a_table_the_simulator_uses(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "profile.json"
    argv = ["profile", "--out", str(out), "--models", "lenet", "--batch-size", "8", "--repeats", "1", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    table = ProfileTable.from_json(out)
    assert report["entries"] == len(table) > 0 and report["device_types"] == ["CPU"]
    # A topology of one "CPU" device: profiled ops take their measured time in the simulation.
    graph = zoo.load("lenet", batch_size=8)
    cpu = DeviceTopology("cpu", [Device("cpu0", "CPU", "host", 1e11, 2**33, 1e10)], [])
    plan = single_device(graph, cpu)
    measured = simulate(graph, cpu, plan, CostModel(profile=table))
    conv = next(op for op in graph.ops if op.op_type == "conv2d")
    entry = table.lookup("CPU", "conv2d", conv.output_shapes[0], conv.param_bytes)
    k = graph.index(conv.name)
    assert entry is not None and measured.tasks.end_s[k] - measured.tasks.start_s[k] == pytest.approx(entry.forward_s)


def test_profile_for_other_gpus_is_an_error_naming_both(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "v100.json"
    ProfileTable({("V100-SXM2-32GB", "relu", (8, 4), 0): ProfileEntry(1e-4, 1e-4)}).to_json(path)
    common = ["--model", "lenet", "--topology", "trinity", "--profile", str(path)]
    simulate = ["simulate", *common, "--plan", "data_parallel"]
    for argv in (simulate, ["plan", *common, "--methods", "data_parallel", "--out-dir", str(tmp_path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"--profile {path}: none of its 1 entries" in err, err
        assert "['V100-SXM2-32GB']" in err and "topology 'trinity' has ['P100-PCIE-12GB']" in err
    assert not list(tmp_path.glob("*.png"))  # refused before any method ran


def test_search_mcmc_writes_the_best_plan(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "mcmc.json"
    argv = [
        "search",
        "mcmc",
        "--model",
        "rnnlm",
        "--topology",
        "trinity",
        "--budget",
        "200",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    plan = Plan.from_json(out)
    graph = zoo.load("rnnlm")
    result = simulate(graph, load_preset("trinity"), plan)
    assert result.makespan_s == pytest.approx(summary["makespan_s"])
    assert summary["speedup_over_dp"] >= 1.0 and 0 < summary["proposals"] <= 200
    assert 0 <= summary["acceptance_rate"] <= 1 and summary["proposals_per_s"] > 0
    assert main(["search", "mcmc", "--model", "rnnlm", "--topology", "trinity", "--budget", "soon"]) == 2
    assert "budget 'soon'" in capsys.readouterr().err


def test_help_documents_the_exit_statuses(capsys) -> None:  # type: ignore[no-untyped-def]
    from placement_rl.cli import EXIT_STATUSES

    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert set(EXIT_STATUSES) == {0, 1, 2, 130}
    for status, meaning in EXIT_STATUSES.items():
        assert f"{status} {' '.join(meaning.split())}" in text


def test_the_tree_search_is_left_out_where_its_action_space_cannot_hold_the_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import placement_rl.search.tag as tag
    from placement_rl.methods import default_methods

    graph, topology = zoo.load("lenet"), load_preset("tag-testbed")  # 7 machines: 8 subsets at least
    assert "mcts" in default_methods(graph, topology).methods
    monkeypatch.setattr(tag, "DEFAULT_MAX_SUBSETS", 7)
    defaults = default_methods(graph, topology)
    assert "mcts" not in defaults.methods and "mcmc" in defaults.methods
    assert "holds 7 device-group subsets and 'tag-testbed' has 7 machines" in defaults.skipped["mcts"]

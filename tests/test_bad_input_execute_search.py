"""Bad input to ``execute``, ``search mcmc``, the plan constructors' ``recompute``, proposal mixes, the
planted suite and its benchmark: one ``error:`` line (status 2) or a ``ValueError`` naming the value and
what is allowed, before any work starts; and Ctrl-C in a search whose chains run as Ray tasks keeps the
best plan the chains reported."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from scripts import interrupt_once, load_script

from placement_rl import planted
from placement_rl.cli import main
from placement_rl.execute.local import MAX_ITERATIONS, MAX_WARMUP, RunOptions, available_backends, check_backend
from placement_rl.graph import OpGraph
from placement_rl.plan import Plan
from placement_rl.plan.constructors import data_parallel, megatron, recompute, zero
from placement_rl.search import mcmc
from placement_rl.search import proposals as proposals_module
from placement_rl.search.mcmc import partial_outcome
from placement_rl.search.proposals import parse_proposals
from placement_rl.topology import load_preset

EXECUTE = ["execute", "--model", "lenet", "--topology", "1x2"]
SEARCH = ["search", "mcmc", "--model", "lenet", "--topology", "trinity"]
#: Initial candidates of the driver tests: chain 0 data_parallel and random, chain 1 expert and random.
CANDIDATES = ("data_parallel", "expert", "random", "random")


def last_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------ execute
def test_execute_refuses_a_backend_this_torch_lacks_before_tracing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """This machine's torch is a CPU build: NCCL would fail inside a worker with a RuntimeError."""
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)

    def no_tracing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was traced before the backend was checked")

    monkeypatch.setattr("placement_rl.cli.execute.model_source", no_tracing)
    for launcher in ("local", "ray"):
        assert main([*EXECUTE, "--backend", "nccl", "--launcher", launcher]) == 2
        assert last_line(capsys) == (
            f"error: --backend nccl: backend 'nccl' is not available: this machine's torch {torch.__version__} was "
            "built without it; expected one of the backends available here: gloo"
        )
    assert available_backends() == ["gloo"]


def test_execute_refuses_nccl_without_a_gpu_for_local_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert available_backends() == ["gloo", "nccl"]
    check_backend("nccl")  # Ray workers may have the GPUs this machine lacks
    with pytest.raises(ValueError, match="backend 'nccl' runs one worker per CUDA GPU, and this machine has none"):
        check_backend("nccl", local=True)
    check_backend("gloo", local=True)


def test_execute_bounds_iterations_and_warmup(capsys: pytest.CaptureFixture[str]) -> None:
    prefix = "placement-rl execute: error: argument"
    for flag, value, low, high in (
        ("--iterations", "1000000000000", 1, MAX_ITERATIONS),
        ("--iterations", "0", 1, MAX_ITERATIONS),
        ("--warmup", "10001", 0, MAX_WARMUP),
        ("--warmup", "x", 0, MAX_WARMUP),
    ):
        assert main([*EXECUTE, flag, value]) == 2
        assert last_line(capsys) == f"{prefix} {flag}: {value!r}: expected an integer from {low} to {high:,}"
    for key, value in (("iterations", 10**12), ("warmup", MAX_WARMUP + 1), ("iterations", True)):
        with pytest.raises(ValueError, match=f"{key} = {value!r}; expected an integer from"):
            RunOptions(**{key: value})
    RunOptions(iterations=MAX_ITERATIONS, warmup=MAX_WARMUP)


def test_execute_help_states_the_bounds_the_library_holds(capsys: pytest.CaptureFixture[str]) -> None:
    from placement_rl.cli import execute as cli_execute

    assert (cli_execute.MAX_ITERATIONS, cli_execute.MAX_WARMUP) == (MAX_ITERATIONS, MAX_WARMUP)
    assert main(["execute", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"measured iterations, 1 to {MAX_ITERATIONS:,}" in out and f"0 to {MAX_WARMUP:,}" in out


# ------------------------------------------------------------------------------ plan constructors
@pytest.fixture
def lenet(zoo_graph: Callable[..., OpGraph]) -> OpGraph:
    return zoo_graph("lenet")


@pytest.mark.parametrize(
    ("op_types", "message"),
    [
        (5, "op_types = 5; expected an op type or a collection of op type names, or None for every op"),
        (True, "op_types = True; expected an op type"),
        ({"attention": 1}, r"op_types = \{'attention': 1\}; expected an op type"),
        (b"conv2d", "op_types = b'conv2d'; expected an op type"),
        ([1, "conv2d"], r"op_types = \[1, 'conv2d'\]: 1 is not an op type name"),
        ([["conv2d"]], r"\['conv2d'\] is not an op type name"),
        ("bogus", "unknown op type \\(recompute\\) 'bogus'"),
        ([], "op_types is empty"),
    ],
)
def test_recompute_refuses_op_types_of_the_wrong_type(lenet: OpGraph, op_types: Any, message: str) -> None:
    plan = data_parallel(lenet, load_preset("trinity"))
    with pytest.raises(ValueError, match=message):
        recompute(lenet, plan, op_types)


def test_recompute_still_takes_one_op_type_or_several(lenet: OpGraph) -> None:
    plan = data_parallel(lenet, load_preset("trinity"))
    assert recompute(lenet, plan, "conv2d").metadata["recompute"] == ["conv2d"]
    assert recompute(lenet, plan, ("relu", "conv2d")).metadata["recompute"] == ["conv2d", "relu"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"recompute": 5}, "recompute = 5; expected a collection of op type names, or None or one of"),
        ({"recompute": {"attention": 1}}, r"recompute = \{'attention': 1\}; expected a collection"),
        ({"recompute": [1]}, r"recompute = \[1\]: 1 is not an op type name"),
        ({"recompute": "conv2d"}, r"one of \['full', 'selective'\], or a collection of op types \(one op type"),
        ({"zero_stage": 1.0}, r"zero_stage = 1.0; expected one of \[0, 1, 2, 3\]"),
        ({"devices": "m0/gpu0"}, r"devices = 'm0/gpu0'; expected a list of device names \(one device: \['m0/gpu0'\]\)"),
    ],
)
def test_megatron_refuses_arguments_of_the_wrong_type(lenet: OpGraph, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        megatron(lenet, load_preset("trinity"), **options)


def test_zero_refuses_a_stage_that_is_not_an_integer(lenet: OpGraph) -> None:
    plan = data_parallel(lenet, load_preset("trinity"))
    for stage in (1.0, "1", [1]):
        with pytest.raises(ValueError, match=r"ZeRO stage .*; expected one of \[0, 1, 2, 3\]"):
            zero(lenet, plan, stage)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- proposal mixes
def test_a_mix_that_names_itself_is_refused_naming_the_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    mixes = proposals_module.MIXES
    monkeypatch.setitem(mixes, "loop", {"loop": 1.0, "flexflow": 1.0})
    monkeypatch.setitem(mixes, "ping", {"pong": 1.0})
    monkeypatch.setitem(mixes, "pong", {"block": 1.0, "ping": 1.0})
    with pytest.raises(ValueError, match=r"proposal mix 'loop' names itself \(loop -> loop\)"):
        parse_proposals("loop")
    with pytest.raises(ValueError, match=r"proposal mix 'ping' names itself \(ping -> pong -> ping\)"):
        parse_proposals({"ping": 1.0, "group": 1.0})
    with pytest.raises(ValueError, match=r"proposal mix 'pong' names itself \(pong -> ping -> pong\)"):
        parse_proposals("pong")


def test_a_mix_of_mixes_expands_to_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(proposals_module.MIXES, "half_soap", {"soap": 1.0, "block": 1.0})
    expected = {"flexflow": 0.25, "neighbour": 0.125, "group": 0.125, "block": 0.5}
    assert parse_proposals("half_soap") == pytest.approx(expected)
    assert parse_proposals({"soap": 2.0, "block": 2.0}) == pytest.approx(expected)
    assert parse_proposals("mixed") == pytest.approx(proposals_module.MIXES["mixed"])


# ------------------------------------------------------------------------------------ search mcmc
def test_search_bounds_tempering_and_chains_as_the_method_does(capsys: pytest.CaptureFixture[str]) -> None:
    from placement_rl.cli import search as cli_search
    from placement_rl.methods import MAX_CHAINS, MAX_TEMPERING

    assert (cli_search.MAX_TEMPERING, cli_search.MAX_CHAINS) == (MAX_TEMPERING, MAX_CHAINS)
    prefix = "placement-rl search: error: argument"
    for value in ("10000", "1000000", "65"):
        assert main([*SEARCH, "--tempering", value]) == 2
        assert last_line(capsys) == (
            f"{prefix} --tempering: {value!r}: expected an integer from 1 to 64 (parallel-tempering replicas per chain)"
        )
    assert main([*SEARCH, "--chains", "1025"]) == 2
    assert last_line(capsys) == f"{prefix} --chains: '1025': expected an integer from 1 to 1,024 (chains)"


def test_ctrl_c_in_the_driver_keeps_the_best_plan_remote_chains_reported(
    zoo_graph: Callable[..., OpGraph],
) -> None:
    """Chains run by a task map other than the default (as Ray tasks) report their best plans; Ctrl-C in
    the driver, as the second chain reports its first plan, returns the best of what the chains reported."""
    graph, topology = zoo_graph("lenet"), load_preset("trinity")
    reports: dict[int, tuple[Any, ...]] = {}

    def interrupted_map(fn: Callable[..., Any], args: list[tuple[Any, ...]], report: Any = None) -> list[Any]:
        assert report is not None  # asked for even without a progress bar
        out = []
        for k, a in enumerate(args):

            def relay(value: Any, k: int = k) -> None:
                reports[k] = value
                report(k, value)
                if k == 1:
                    raise KeyboardInterrupt

            out.append(fn(*a, report=relay))
        return out

    found = mcmc(graph, topology, budget=4, chains=2, initial=CANDIDATES, interruptible=True, task_map=interrupted_map)
    assert found.interrupted and found.chains == 2
    assert reports[1][0] == 0 and found.proposals == reports[0][0] > 0  # chain 1 had made no proposal
    assert found.cost_s == pytest.approx(min(reports[0][1], reports[1][1]))
    assert found.plan.graph_name == graph.name and len(found.costs_s) == 0
    # chain 0 searched from data_parallel and random; chain 1 had evaluated its first candidate only
    assert set(found.initial_costs_s) == {"data_parallel", "random", "expert"}


def test_ctrl_c_in_the_driver_of_a_search_that_is_not_interruptible_is_an_interrupt(
    zoo_graph: Callable[..., OpGraph],
) -> None:
    def ctrl_c(fn: Callable[..., Any], args: list[tuple[Any, ...]], report: Any = None) -> list[Any]:
        assert report is None
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # a caller that records results must not get a cut-short search
        mcmc(zoo_graph("lenet"), load_preset("trinity"), budget=40, chains=2, task_map=ctrl_c)


def test_a_chain_that_reported_no_plan_gives_no_outcome() -> None:
    assert partial_outcome((0, float("inf"), 0.0, None))["configs"] == []


@pytest.mark.slow
def test_sigint_to_a_search_with_ray_chains_writes_the_best_plan(ray_local: Any, tmp_path: Path) -> None:
    """The real signal, in a child process on the session's Ray: sent once the chains reported a best cost."""
    out = tmp_path / "best.json"
    argv = [sys.executable, "-m", "placement_rl.cli", *SEARCH, "--budget", "100000000", "--chains", "2"]
    env = {**os.environ, "RAY_ADDRESS": ray_local.get_runtime_context().gcs_address}
    # sent once the driver relayed a chain's report: it holds a best plan
    status, stdout, err = interrupt_once([*argv, "--out", str(out)], b"best_ms=", cwd=tmp_path, env=env)
    assert "Ctrl-C stops them and keeps the best plan they reported" in err.split("best_ms=")[0]
    assert status == 130, err[-2000:]
    assert f"best plan so far written to {out}" in err and "Traceback" not in err
    assert Plan.from_json(out).graph_name == "lenet"
    assert f"wrote {out}" in stdout  # the chains that had reported a plan by then: one or both


# ---------------------------------------------------------------------------------- planted suite
def test_build_suite_takes_one_kind_name_as_a_string(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    monkeypatch.setattr(planted, "build_instance", lambda kind, variant, **kwargs: built.append(kind) or kind)
    assert planted.build_suite("straggler") == ["straggler"]
    assert planted.build_suite(["straggler", "zero_fit"]) == ["straggler", "zero_fit"] and len(built) == 3
    for names, message in (
        (5, "names = 5; expected a kind name or a list of them"),
        (b"straggler", "names = b'straggler'; expected a kind name"),
        ([5], "names: 5 is not a kind name"),
        ("s", "unknown planted kind 's'"),
    ):
        with pytest.raises(ValueError, match=message):
            planted.build_suite(names)  # type: ignore[arg-type]
    assert len(built) == 3  # nothing built for a bad name


def test_planted_benchmark_checks_its_arguments_before_any_method_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bench = load_script("benchmarks/planted.py")

    def nothing_runs(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an instance was built before the arguments were checked")

    monkeypatch.setattr(bench, "build_suite", nothing_runs)
    missing = tmp_path / "no_checkpoint"
    cases = {
        ("--policy", str(missing)): f"--policy {str(missing)!r}: no such checkpoint folder",
        ("--policy", str(tmp_path)): f"--policy {str(tmp_path)!r}: ",
        ("--methods", "mcmc", "--set", "mcmc.budget=-5"): (
            "mcmc: budget = -5; expected at least 1 proposal (--set mcmc.budget)"
        ),
        ("--methods", "mcmc", "--set", "mcmc.tempering=1000"): "mcmc: tempering = 1000; expected an integer >= 1",
        ("--mcmc-proposals", "bogus"): "argument --mcmc-proposals: proposals = 'bogus'; expected one of",
        ("--mcmc-proposals", "flexflow=-1"): "argument --mcmc-proposals: proposal weight flexflow = -1.0",
    }
    for argv, message in cases.items():
        with pytest.raises(SystemExit) as exit_:
            bench.main(list(argv))
        assert exit_.value.code == 2
        line = last_line(capsys)
        assert ": error: " in line and message in line, line

"""Ctrl-C: ``search mcmc`` keeps the best plan found so far; every other command stops with status 130
and one ``interrupted`` line, never a traceback; an operating-system error is one ``error:`` line."""

from __future__ import annotations

import errno
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from scripts import interrupt_once

from placement_rl import zoo
from placement_rl.cli import main
from placement_rl.plan import Plan
from placement_rl.search import mcmc
from placement_rl.search.proposals import Proposer
from placement_rl.topology import load_preset

ARGV = ["search", "mcmc", "--model", "lenet", "--topology", "trinity", "--budget", "200"]


@pytest.fixture
def ctrl_c_at(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``ctrl_c_at(n)``: the ``n``-th proposal drawn from now on raises ``KeyboardInterrupt`` (as Ctrl-C would)."""

    def arm(n: int) -> None:
        draw = Proposer.draw
        calls = [0]

        def interrupted_draw(self: Proposer, *args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == n:
                raise KeyboardInterrupt
            return draw(self, *args, **kwargs)

        monkeypatch.setattr(Proposer, "draw", interrupted_draw)

    return arm


def test_an_interruptible_search_returns_its_best_plan_so_far(ctrl_c_at: Any) -> None:
    graph, topology = zoo.load("lenet"), load_preset("trinity")
    ctrl_c_at(31)
    found = mcmc(graph, topology, budget=1000, chains=2, interruptible=True)
    assert found.interrupted
    assert found.proposals == 30  # the 31st was never made; the second chain never started
    assert found.chains == 1 and len(found.costs_s) == len(found.best_costs_s) == len(found.times_s) == 30
    assert found.plan.graph_name == graph.name and found.result.makespan_s > 0
    assert found.summary()["interrupted"] is True


def test_a_search_is_not_interruptible_by_default(ctrl_c_at: Any) -> None:
    """A caller that records results (``compare``) must not take a cut-short search for a finished one."""
    ctrl_c_at(5)
    with pytest.raises(KeyboardInterrupt):
        mcmc(zoo.load("lenet"), load_preset("trinity"), budget=100)


def test_ctrl_c_before_any_plan_was_evaluated_is_still_an_interrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_plan(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module("placement_rl.search.mcmc"), "initial_plan", no_plan)
    with pytest.raises(KeyboardInterrupt):
        mcmc(zoo.load("lenet"), load_preset("trinity"), budget=100, interruptible=True)


def test_search_mcmc_writes_the_best_plan_on_ctrl_c(
    ctrl_c_at: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "best.json"
    ctrl_c_at(11)
    assert main([*ARGV, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert f"interrupted after 10 proposals; best plan so far written to {out}" in err
    assert Plan.from_json(out).graph_name == "lenet"


def test_search_mcmc_without_out_writes_to_a_default_file_on_ctrl_c(
    ctrl_c_at: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    ctrl_c_at(2)
    assert main([*ARGV, "--json"]) == 130
    captured = capsys.readouterr()
    default = Path("out") / "mcmc-lenet-trinity" / "best_plan.json"
    assert f"interrupted after 1 proposal; best plan so far written to {default}" in captured.err
    assert '"interrupted": true' in captured.out
    assert Plan.from_json(tmp_path / default).graph_name == "lenet"


def test_ctrl_c_in_any_other_command_is_status_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr("placement_rl.search.ft.run_ft", interrupted)
    argv = ["frontier", "--model", "lenet", "--topology", "trinity", "--mcmc-budget", "none"]
    assert main([*argv, "--out-dir", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err


def test_an_os_error_during_a_command_is_one_error_line_naming_the_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past the checks of placement_rl.paths (a disk that fills up while writing): status 1, the path and why."""
    out = tmp_path / "topology.json"

    def full_disk(self: Any, path: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr("placement_rl.topology.DeviceTopology.to_json", full_disk)
    assert main(["show-topology", "trinity", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"error: '{out}': No space left on device"


@pytest.mark.slow
def test_sigint_to_a_running_search_keeps_the_best_plan(tmp_path: Path) -> None:
    """The real signal, in a child process: sent once the search has reported its first best cost."""
    out = tmp_path / "best.json"
    argv = [sys.executable, "-m", "placement_rl.cli", *ARGV[:-1], "10m", "--out", str(out)]
    # sent at the progress bar's first report: the search loop is running
    status, stdout, err = interrupt_once(argv, b"best_ms=", cwd=tmp_path)
    assert status == 130, err[-2000:]
    assert f"best plan so far written to {out}" in err and "Traceback" not in err
    assert Plan.from_json(out).graph_name == "lenet"
    assert f"wrote {out}" in stdout

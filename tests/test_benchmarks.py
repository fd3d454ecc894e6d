"""Every benchmark script runs at a tiny budget and prints a table of sane numbers.

The scripts' ``main(argv)`` runs in this process (their imports are shared with the rest of the
session); ``benchmarks/ft.py time`` still starts its own FT processes, and ``benchmarks/trinity.py``
runs through its command line, since it starts Ray. Runs over about 5 s are marked ``slow``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from scripts import load_script

Run = Callable[..., str]


def _load(path: Path) -> ModuleType:
    return load_script(path)


@pytest.fixture()
def run(repo_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    """``run("search", "delta", ...)``: ``benchmarks/search.py``'s ``main`` with those arguments; its stdout."""
    # The scripts set these with setdefault for their own process; keep them out of this one's environment.
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))

    def main(script: str, *argv: str) -> str:
        _load(repo_root / "benchmarks" / f"{script}.py").main(list(argv))
        return capsys.readouterr().out

    return main


def _table(text: str) -> list[dict[str, str]]:
    """The Markdown table in ``text`` as one dict per row (header -> cell)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) >= 3, text
    header, rule, *rows = ([cell.strip() for cell in line.strip("|").split("|")] for line in lines)
    assert all(set(cell) == {"-"} for cell in rule), lines[1]
    assert all(len(row) == len(header) for row in rows), text
    return [dict(zip(header, row, strict=True)) for row in rows]


def _number(cell: str) -> float:
    """``"1,234.5"``, ``"3.20x"``, ``"+4%"``, ``"12.0 (OOM)"`` -> float (``-`` and other text fail)."""
    value = float(re.sub(r"[,x%+]|\s*\(OOM\)$", "", cell))
    assert math.isfinite(value), cell
    return value


def test_foundation(run: Run) -> None:
    rows = _table(run("foundation", "--repeats", "1", "--models", "lenet", "--coarsen-from", "lenet", "--groups", "4"))
    assert [r["what"] for r in rows] == ["import lenet", "coarsen lenet to 4 groups"]
    for row in rows:
        assert _number(row["ops"]) == 15
        assert 0 <= _number(row["median (s)"]) < 60 and 0 <= _number(row["cold (s)"]) < 120


@pytest.mark.slow
def test_importer(run: Run) -> None:
    (row,) = _table(run("importer", "--models", "tiny", "--batch-size", "2", "--seq-len", "16"))
    assert row["model"] == "llama-tiny" and _number(row["ops"]) > 20
    assert 0 < _number(row["import (s)"]) < 120 and 0 < _number(row["peak memory (MiB)"]) < 4096


def test_simulator(run: Run) -> None:
    rows = _table(run("simulator", "--repeats", "1", "--model", "lenet", "--groups", "4"))
    assert [r["case"] for r in rows] == [
        "lenet data parallel, tensoropt (16 GPUs)",
        "lenet data parallel, flexflow-p100 (16 GPUs)",
        "lenet 4 groups, random single-device placements, tag-testbed",
        "lenet 4 groups, data parallel, tag-testbed",
    ]
    for row in rows:
        assert _number(row["tasks"]) >= 2 * 4 and _number(row["median ms"]) > 0 and _number(row["tasks/s"]) > 0
    # Data parallelism on 16 GPUs: forward + backward per op and device, plus transfers and syncs.
    assert _number(rows[0]["tasks"]) >= 2 * 15 * 16 and _number(rows[0]["memory MiB"]) > 0
    assert rows[2]["memory MiB"] == "-"


def test_scale(run: Run) -> None:
    argv = ["--machines", "4", "--gpus-per-machine", "2", "--plan-gpus", "2", "--model", "lenet"]
    rows = _table(run("scale", *argv, "--batch-per-gpu", "2", "--repeats", "1", "--same-process"))
    assert [r["case"] for r in rows] == [
        "lenet data parallel on 2 GPUs, batch 4",
        "lenet data parallel on all 8 GPUs, batch 16",
    ]
    # routes are built from the plan's devices only: 2 of the 8 sources, then all 8
    assert [_number(r["routes from"]) for r in rows] == [2, 8]
    for row in rows:
        assert _number(row["tasks"]) > 0 and _number(row["ms/iter"]) > 0 and _number(row["peak RSS MiB"]) > 0
        assert _number(row["wall s"]) >= 0 and _number(row["cpu s"]) >= 0


def test_search_delta_and_speedup(run: Run) -> None:
    (delta,) = _table(run("search", "delta", "--models", "lenet", "--gpus", "4", "--proposals", "5"))
    assert (delta["model"], delta["GPUs"]) == ("lenet", "4") and _number(delta["tasks (DP)"]) > 0
    assert _number(delta["full ms/proposal"]) > 0 and _number(delta["delta ms/proposal"]) > 0
    rows = _table(run("search", "speedup", "--models", "lenet", "--budget", "5"))
    assert [r["cluster"] for r in rows] == ["flexflow-p100", "flexflow-k80", "tag-testbed"]
    for row in rows:
        assert _number(row["DP ms"]) > 0 and _number(row["expert ms"]) > 0
        assert 0 < _number(row["MCMC ms (5)"]) <= _number(row["DP ms"])  # MCMC starts from data parallelism
        assert _number(row["vs DP"]) >= 1.0 and 1 <= _number(row["proposals"]) <= 5


@pytest.mark.slow
def test_search_reach(run: Run) -> None:
    rows = _table(run("search", "reach", "--warm", "20", "--proposals", "3"))
    values = {r["figure"]: r["value"] for r in rows}
    assert _number(values["tasks"].split(" [")[0]) > 20_000  # inception_v3 on 16 GPUs
    kept = _number(values["kept by delta simulation (ready before the change can matter)"].split(" [")[0])
    timed = _number(values["timed again"].split(" [")[0])
    assert 0 <= kept <= 100 and 0 <= timed <= 100 and 99 <= kept + timed <= 101  # medians of shares summing to 1
    assert 0 <= _number(values["cut off above the rejection limit"]) <= 100


@pytest.mark.slow
def test_search_headroom(run: Run) -> None:
    out = run("search", "headroom", "--models", "alexnet", "--presets", "tag-testbed", "--budget", "5")
    assert "MCMC-new: proposals mixed; budget 5 per search" in out
    (row,) = _table(out)
    dp, bound = _number(row["DP ms"]), _number(row["bound ms"])
    assert row["cluster"] == "tag-testbed" and 0 < bound < dp
    for found, share in (("MCMC-flexflow ms", "flexflow captured"), ("MCMC-new ms", "new captured")):
        rounding = 100 * 0.1 / (dp - bound) + 0.5  # cells are rounded to 0.1 ms and whole percents
        assert _number(row[share]) == pytest.approx(100 * (dp - _number(row[found])) / (dp - bound), abs=rounding)


@pytest.mark.slow
def test_search_hand(run: Run) -> None:
    out = run("search", "hand", "--budget", "3", "--proposals-kind", "flexflow,adaptive", "--restart", "2")
    assert "MCMC from data parallelism alone, budget 3, seed 0, one chain, restart 2" in out
    rows = _table(out)
    assert [(r["instance"][:3], r["proposals"]) for r in rows] == [
        ("(a)", "flexflow"), ("(a)", "adaptive"), ("(b)", "flexflow"), ("(b)", "adaptive")
    ]  # fmt: skip
    for row in rows:
        dp, hand, found = _number(row["DP ms"]), _number(row["hand ms"]), _number(row["found ms"])
        assert 0 < hand < dp / 1.5 and found <= dp  # the hand plans are much faster; MCMC starts from DP
        assert _number(row["found / hand"]) == pytest.approx(found / hand, abs=0.006)
        assert 1 <= _number(row["proposals made"]) <= 3


@pytest.mark.slow
def test_search_goal(run: Run) -> None:
    out = run("search", "goal", "--proposals", "4")
    match = re.search(r"\(16 GPUs\): (\d+) proposals in ([\d.]+) s .*projected for 4: (\d+) s", out)
    assert match, out
    assert 1 <= int(match.group(1)) <= 4 and float(match.group(2)) > 0


@pytest.mark.slow
def test_ft_time(run: Run) -> None:
    (row,) = _table(run("ft", "time", "--models", "lenet", "--max-configs", "2", "--timeout", "300"))
    assert row["model"] == "lenet" and _number(row["ops"]) == 15 and row["K median / max"] == "2 / 2"
    assert _number(row["FT-LDP s"]) > 0 and _number(row["FT-Elimination s"]) > 0  # not "> 300": both finished
    assert _number(row["points"]) >= 1 and _number(row["path nodes"]) >= 1


def test_ft_devices(run: Run) -> None:
    rows = _table(run("ft", "devices", "--instances", "lenet:mixed-10g", "--max-configs", "2", "--stage-meshes", "0"))
    assert [(r["model"], r["cluster"], r["listing"]) for r in rows] == [
        ("lenet", "mixed-10g", "as built"),
        ("lenet", "mixed-10g", "reversed"),
    ]
    built, reversed_ = rows
    assert built["device sets ms"] == reversed_["device sets ms"] and built["device set"] == reversed_["device set"]
    assert "V100-SXM2-32GB" in built["device set"] and reversed_["first n set"].startswith("first ")
    assert 0 < _number(built["device sets ms"]) == _number(built["first n ms"])  # the fast machine listed first
    assert _number(reversed_["device sets ms"]) < _number(reversed_["first n ms"])  # ... and last
    assert all(_number(r["sets"]) == 6 and "stage meshes 1 ms" not in r for r in rows)  # see test_ft_devices.py


def test_ft_estimate(run: Run) -> None:
    # Under FT's own assumptions (a transfer holds its route, one all-reduce per tensor, the flat roofline
    # with no host lane) the estimate and the simulation of the same plan agree closely; DDP's buckets
    # under flows and the calibrated model's host lanes make the simulated iteration differ from FT's
    # additive estimate (latency-bound lenet).
    circuit = ["--network", "circuit", "--bucket-bytes", "0", "--calibration", "roofline"]
    for argv, worst_error in ((circuit, 10), ([], None)):
        rows = _table(run("ft", "estimate", "--models", "lenet", "--max-configs", "2", *argv))
        plans = [r["plan"] for r in rows]
        assert plans[0] == "data parallel" and any(p.startswith("FT mini-time") for p in plans), plans
        for row in rows:
            assert _number(row["FT estimate ms"]) > 0 and _number(row["simulated ms"]) > 0
            assert 0 < _number(row["vs DP (simulated)"]) < 100 and _number(row["simulated peak GiB"]) >= 0
            if worst_error is not None:
                assert abs(_number(row["error"])) <= worst_error, row
            else:
                assert _number(row["simulated ms"]) < _number(row["FT estimate ms"]), row


def test_envs_steps_and_agents(run: Run) -> None:
    rows = _table(run("envs", "steps", "--episodes", "1", "--models", "lenet"))
    assert len(rows) == 4 and rows[-1]["env"] == "Sharding-v0"
    for row in rows:
        assert _number(row["steps/episode"]) >= 1 and _number(row["median steps/s"]) > 0
    rows = _table(run("envs", "agents", "--seeds", "1", "--models", "lenet"))
    assert [(r["env"], r["agent"]) for r in rows] == [
        (env, agent) for env in ("sequential/device", "sequential/tag") for agent in ("random", "greedy")
    ]
    for row in rows:
        assert _number(row["mean speedup over DP"]) > 0 and re.fullmatch(r"\d/1", row["OOM episodes"])


def _speedups(row: dict[str, str]) -> list[float]:
    """The row's ``1.23x`` cells (speedups over data parallelism), each within sane bounds."""
    speedups = [_number(cell) for cell in row.values() if cell.endswith("x")]
    assert speedups and all(0 < s < 1000 for s in speedups), row
    return speedups


@pytest.mark.slow
def test_trinity_table(ray_local: object, run: Run, tiny_yaml: Path, tmp_path: Path) -> None:
    """One training iteration of the tiny RL config on lenet x trinity, then the learned plan next to the
    baselines, in this process on the session's Ray. ``zero-shot`` is left out: its evaluation is
    tests/rl's ``evaluate`` command test."""
    argv = [
        "table",
        "--cases",
        "lenet@trinity",
        "--iterations",
        "1",
        "--config",
        str(tiny_yaml),
        "--out",
        str(tmp_path),
    ]
    rows = _table(run("trinity", *argv))
    methods = [row["method"] for row in rows]
    assert methods[:3] == ["single GPU", "data parallel", "expert"] and methods[-1] == "Trinity (learned)", methods
    assert all(row["model"] == "lenet" and row["cluster"] == "trinity" for row in rows)
    for row in rows:
        _speedups(row)
    assert _number(next(r for r in rows if r["method"] == "data parallel")["vs DP"]) == 1.0


@pytest.mark.slow
def test_sfb(run: Run) -> None:
    rows = _table(run("sfb", "--models", "lenet", "--plan-method", "data_parallel", "--bandwidth-gbps", "1"))
    assert [(r["model"], r["plan"]) for r in rows] == [("lenet", "DP-NCCL"), ("lenet", "data_parallel")]
    for row in rows:
        used, total = (int(x) for x in row["SFB gradients"].split("/"))
        assert 0 < used <= total == 5  # lenet's 2 convolutions and 3 linear layers; the linear ones pay at 1 Gb/s
        assert 0 < _number(row["with SFB (ms)"]) < _number(row["without SFB (ms)"])
        assert 0 < _number(row["MiB with"]) < _number(row["MiB without"])
        assert row["paper without (ms)"] == ""  # lenet is not in TAG's Table 5


@pytest.mark.slow
def test_tag_throughput(run: Run) -> None:  # 7 s: an untrained GNN and RLlib's module classes
    rows = _table(run("tag", "throughput", "--model", "lenet", "--topology", "trinity", "--iterations", "12"))
    assert [r["prior"] for r in rows] == ["uniform", "GNN"]
    for row in rows:
        assert row["groups"] == "15" and row["actions"] == "4"  # lenet's ops; one machine x 4 options
        assert _number(row["cold it/s"]) > 0 and _number(row["warm it/s"]) > 0
        assert 0 < int(row["simulations (cold)"]) <= 3 * 12  # up to three completions per new leaf (the best of)


@pytest.mark.slow
def test_tag_rank(run: Run) -> None:  # 6 s under load: 8 plans simulated three ways
    text = run("tag", "rank", "--model", "lenet", "--topology", "tag-testbed", "--plans", "8")
    rows = _table(text)
    assert _number(rows[0]["Spearman with the final simulation"]) == 1.0  # the leaf score is the final simulation
    assert -1.0 <= _number(rows[1]["Spearman with the final simulation"]) <= 1.0


@pytest.mark.slow
def test_anytime(ray_local: object, run: Run, tiny_yaml: Path, tmp_path: Path) -> None:
    """MCMC and one PPO iteration of the tiny config on lenet x trinity at a 1 s budget: the table, one PNG
    per instance and the curves."""
    argv = ["--instances", "lenet@trinity", "--budget", "1s", "--methods", "mcmc,ppo"]
    rows = _table(run("anytime", *argv, "--ppo-config", str(tiny_yaml), "--out", str(tmp_path)))
    assert [(r["instance"], r["method"]) for r in rows] == [
        ("lenet@trinity", "MCMC"),
        ("lenet@trinity", "PPO (trinity)"),
    ]
    for row in rows:
        assert _number(row["best ms"]) > 0 and _number(row["vs DP"]) > 0
    assert (tmp_path / "lenet@trinity.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "anytime.json").is_file() and (tmp_path / "anytime.csv").is_file()


@pytest.mark.slow
def test_megatron_rows_print_json_with_the_published_and_simulated_figures(run: Run) -> None:
    import json

    out = run("megatron", "--rows", "1.7,1008.0", "--json", "--max-tasks", "1000000")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["params_b"] for r in rows] == [1.7, 1008.0]
    small, large = rows
    assert small["gpus"] == 32 and small["published_tflops_per_gpu"] == 137
    # a plausible share of an A100's 312 TFLOP/s, from the ordinary cost model
    assert 30 < small["simulated_tflops_per_gpu"] < 312 and not small["oom"]
    assert large["simulated_tflops_per_gpu"] is None and "tasks" in large["skipped"]


# ------------------------------------------------------------------------------------ --calibration
#: Each script (and subcommand) with --calibration, and the other arguments its parser needs.
CALIBRATED = [
    ("scale", ()),
    ("anytime", ()),
    ("trinity", ("table",)),
    ("trinity", ("zero-shot",)),
    *(("tag", (command,)) for command in ("throughput", "rank", "completion")),
    *(("tag", (command, "--checkpoint", "ckpt")) for command in ("table7", "table8")),
]


@pytest.mark.parametrize(("script", "argv"), CALIBRATED, ids=["-".join((s, *a[:1])) for s, a in CALIBRATED])
def test_a_bad_calibration_is_a_parser_error(
    repo_root: Path, capsys: pytest.CaptureFixture[str], script: str, argv: tuple[str, ...]
) -> None:
    module = _load(repo_root / "benchmarks" / f"{script}.py")
    with pytest.raises(SystemExit) as exit_info:
        module.main([*argv, "--calibration", "bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --calibration" in err and "'bogus'" in err, err


def test_scale_calibration(run: Run) -> None:
    """The roofline has no host lane: fewer tasks and another iteration time than the default model."""
    argv = ["--machines", "2", "--gpus-per-machine", "2", "--plan-gpus", "2", "--model", "lenet"]
    argv += ["--batch-per-gpu", "2", "--repeats", "1", "--skip-all", "--same-process"]
    (plain,) = _table(run("scale", *argv))
    (default,) = _table(run("scale", *argv, "--calibration", "default"))
    (roofline,) = _table(run("scale", *argv, "--calibration", "roofline"))
    assert (plain["tasks"], plain["ms/iter"]) == (default["tasks"], default["ms/iter"])
    assert _number(roofline["tasks"]) < _number(default["tasks"])
    assert _number(roofline["ms/iter"]) != _number(default["ms/iter"])


def test_tag_completion_calibration(run: Run) -> None:
    """The hand plan and the searches are simulated under the chosen GPU model."""

    def hand_ms(*extra: str) -> float:
        text = run("tag", "completion", "--model", "lenet", "--machines", "2", "--budget", "2", *extra)
        found = re.search(r"hand plan ([\d.,]+) ms", text)
        assert found, text
        return float(found.group(1).replace(",", ""))

    assert hand_ms() == hand_ms("--calibration", "default") != hand_ms("--calibration", "roofline")


def test_env_with_calibration_keeps_the_env_cost_models_other_settings() -> None:
    from placement_rl.cli.common import calibrated_cost_model, env_with_calibration
    from placement_rl.experiments import build_cost_model
    from placement_rl.sim import CostModel

    env = {"max_groups": 8, "cost_model": {"precision": "bf16-mixed"}}
    assert env_with_calibration(env, None) == env  # as configured
    given = env_with_calibration(env, "roofline")
    assert given == {"max_groups": 8, "cost_model": {"precision": "bf16-mixed", "calibration": "roofline"}}
    assert build_cost_model(given["cost_model"], "env") == CostModel(precision="bf16-mixed", calibration=None)
    assert env == {"max_groups": 8, "cost_model": {"precision": "bf16-mixed"}}  # a copy
    assert env_with_calibration({}, "roofline") == {"cost_model": {"calibration": "roofline"}}
    built = env_with_calibration({"cost_model": CostModel(precision="bf16-mixed")}, "roofline")["cost_model"]
    assert built == CostModel(precision="bf16-mixed", calibration=None)
    assert calibrated_cost_model(None) is None and calibrated_cost_model("default") == CostModel()


def _fake_policy(env: dict[str, Any] | None = None) -> Any:
    """A policy record (no module) whose training env is ``env`` (default: a fixed generator only)."""
    from placement_rl.rl.config import TrainConfig
    from placement_rl.rl.policy import Policy

    config = TrainConfig.from_dict({"agent": "tag", "env": env or {"generator": {"kind": "fixed"}}})
    return Policy(None, config, None, Path("ckpt"))  # type: ignore[arg-type]


class _Reached(Exception):
    """Raised by a patched step once the benchmark got that far: nothing slow runs."""


@pytest.mark.parametrize("command", ["throughput", "table7", "table8"])
def test_tag_calibration_reaches_the_checkpoints_env(
    repo_root: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """``throughput``, ``table7`` and ``table8`` search in the policy's env: ``--calibration`` sets its cost
    model's calibration, keeping its other settings; without it the env is as trained."""
    import placement_rl.rl.policy

    module = _load(repo_root / "benchmarks" / "tag.py")
    trained = {"generator": {"kind": "fixed"}, "cost_model": {"precision": "bf16-mixed"}}
    monkeypatch.setattr(placement_rl.rl.policy, "load_policy", lambda checkpoint: _fake_policy(trained))
    monkeypatch.setattr(module, "_untrained_policy", lambda: _fake_policy(trained))
    seen: list[Any] = []

    def searcher(graph: object, topology: object, policy: Any, env_options: object) -> None:
        seen.append(policy.config.env["cost_model"])
        raise _Reached

    monkeypatch.setattr(module, "Searcher", searcher)
    argv = [command, "--model" if command == "throughput" else "--models", "lenet"]
    argv += ["--topology", "trinity"] if command == "throughput" else ["--checkpoint", "ckpt"]
    argv += {"table7": ["--topologies", "1"], "table8": ["--topologies", "trinity"]}.get(command, [])
    for extra in ([], ["--calibration", "roofline"]):
        with pytest.raises(_Reached):
            module.main([*argv, *extra])
    assert seen == [{"precision": "bf16-mixed"}, {"precision": "bf16-mixed", "calibration": "roofline"}]


def test_anytime_calibration(repo_root: Path, monkeypatch: pytest.MonkeyPatch, tiny_yaml: Path, tmp_path: Path) -> None:
    """``--calibration`` gives the benchmark its judging cost model and sets the calibration of PPO's env
    and of the GNN-prior search's env (the tiny config's is the roofline; the checkpoint's env has none);
    without it, nothing changes (no cost model: the default; the envs as configured)."""
    import placement_rl.rl.anytime
    import placement_rl.rl.policy
    from placement_rl.sim.calibration import DEFAULT_CALIBRATION

    module = _load(repo_root / "benchmarks" / "anytime.py")
    monkeypatch.setattr(placement_rl.rl.policy, "load_policy", lambda checkpoint: _fake_policy())
    calls: list[dict[str, Any]] = []

    def benchmark(instances: object, budget: object, out: object, **kwargs: Any) -> list[object]:
        calls.append(kwargs)
        return []

    monkeypatch.setattr(placement_rl.rl.anytime, "anytime_benchmark", benchmark)
    argv = ["--instances", "lenet@trinity", "--methods", "mcmc,ppo", "--ppo-config", str(tiny_yaml)]
    argv += ["--tag-checkpoint", "ckpt", "--out", str(tmp_path)]
    module.main(argv)
    module.main([*argv, "--calibration", "default"])
    plain, given = calls
    assert plain["cost_model"] is None and plain["tag_checkpoint"] == "ckpt"
    assert plain["ppo"].env["cost_model"] == {"calibration": "roofline"}
    assert given["cost_model"].calibration is DEFAULT_CALIBRATION
    assert given["ppo"].env["cost_model"] == {"calibration": "default"}
    assert given["tag_checkpoint"].config.env["cost_model"] == {"calibration": "default"}


def test_trinity_calibration(repo_root: Path, monkeypatch: pytest.MonkeyPatch, tiny_yaml: Path, tmp_path: Path) -> None:
    """``table`` trains under the chosen calibration (the tiny config's is the roofline) and simulates every
    plan under it; ``zero-shot`` with a checkpoint evaluates under it; without the option, the YAML's env
    and the default model."""
    import placement_rl.rl.evaluate
    from placement_rl.sim.calibration import DEFAULT_CALIBRATION

    module = _load(repo_root / "benchmarks" / "trinity.py")
    trained: list[Any] = []
    judged: list[Any] = []

    def train(cfg: Any, out_dir: Path, progress: object) -> Path:
        trained.append(cfg.env["cost_model"])
        return out_dir

    def compare_methods(graph: object, topology: object, methods: object, **kwargs: Any) -> list[object]:
        judged.append(kwargs["cost_model"])
        return []

    def evaluate(checkpoint: str, topologies: object, models: object, **kwargs: Any) -> None:
        judged.append(kwargs["cost_model"])
        raise _Reached

    monkeypatch.setattr(module, "train", train)
    monkeypatch.setattr(module, "policy_method", lambda checkpoint: "learned")
    monkeypatch.setattr(module, "compare_methods", compare_methods)
    monkeypatch.setattr(placement_rl.rl.evaluate, "evaluate", evaluate)
    argv = ["table", "--cases", "lenet@trinity", "--config", str(tiny_yaml), "--out", str(tmp_path)]
    module.main(argv)
    module.main([*argv, "--calibration", "default"])
    assert trained == [{"calibration": "roofline"}, {"calibration": "default"}]
    assert judged[0] is None and judged[1].calibration is DEFAULT_CALIBRATION
    judged.clear()
    for extra in ([], ["--calibration", "roofline"]):
        with pytest.raises(_Reached):
            module.main(["zero-shot", "--checkpoint", "ckpt", "--topologies", "1", *extra])
    assert judged[0] is None and judged[1].calibration is None  # the flat roofline

"""Agent-agnostic training and Tune sweeps on RLlib.

``placement-rl train FILE.yaml`` and ``placement-rl tune FILE.yaml`` call :func:`train` and
:func:`sweep`. The config names its agent (:mod:`placement_rl.rl.agents`), which builds the RLlib
algorithm; everything else (the loop, checkpoints, ``progress.csv``, TensorBoard, the learning
curve, Tune's trials and the results table) is the same for every agent. Inside ``ray job submit``
they attach to the job's cluster (:func:`placement_rl.rl.runtime.ensure_ray`).

:func:`train_on_instance` is Trinity's own setting: train on one instance for a wall-clock budget and
keep the best plan sampled on the way, with its anytime trace (best plan found vs seconds).
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placement_rl.io import write_json
from placement_rl.paths import output_folder
from placement_rl.rl.agents import CONFIG_FILE
from placement_rl.rl.config import SweepConfig, TrainConfig, set_dotted
from placement_rl.rl.policy import export_policy
from placement_rl.rl.runtime import ensure_ray, output_dir, quiet_ray_logs

if TYPE_CHECKING:
    from placement_rl.graph import OpGraph
    from placement_rl.plan import Plan
    from placement_rl.sim import CostModel, SimResult
    from placement_rl.topology import DeviceTopology


def summarize(result: Mapping[str, Any], learner_metrics: tuple[str, ...] = ()) -> dict[str, float]:
    """The figures of one training iteration that the CSV, TensorBoard and progress line show."""
    runners = result.get("env_runners", {})
    learner = result.get("learners", {}).get("default_policy", {})

    def num(value: Any) -> float:
        try:
            return float(value)
        except (TypeError, ValueError):
            return float("nan")

    row = {
        "iteration": num(result.get("training_iteration")),
        "env_steps": num(result.get("num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime"))),
        "episode_return_mean": num(runners.get("episode_return_mean")),
        "speedup_mean": num(runners.get("speedup_mean")),
        "best_speedup": num(runners.get("best_speedup")),
        "oom_fraction": num(runners.get("oom_fraction")),
    }
    row.update({key: num(learner.get(key)) for key in learner_metrics})
    row["time_s"] = num(result.get("time_total_s"))
    return row


def build_algorithm(cfg: TrainConfig) -> Any:
    """The agent's RLlib algorithm for ``cfg``, built."""
    config = cfg.agent_spec.algorithm(cfg)
    quiet_ray_logs()  # RLlib's loggers exist now
    return config.build_algo()


def save_checkpoint(algo: Any, cfg: TrainConfig, folder: Path) -> Path:
    """RLlib's checkpoint (for ``--resume``) plus the safe policy export (for everything else)."""
    algo.save_to_path(str(folder))
    return export_policy(algo.get_module(), cfg, folder)


def train(
    cfg: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    resume: str | Path | None = None,
    progress: Callable[[str], None] | None = print,
) -> Path:
    """Train ``cfg``'s agent; returns the run directory.

    The run directory holds ``train_config.json`` (the resolved config, naming the agent),
    ``progress.csv`` (one row per iteration), TensorBoard events (``tb/``), ``checkpoint_NNNNNN/``
    every ``run.checkpoint_every`` iterations and ``checkpoint_final/`` (each with RLlib's state and
    the safe policy export, :func:`placement_rl.rl.policy.export_policy`), and ``learning_curve.png``.

    Args:
        cfg: the training config.
        out_dir: the run directory (default ``cfg.run.output_dir``), made absolute.
        resume: an RLlib checkpoint folder to continue from. It holds pickled state, which runs code
            when loaded: pass only a folder from a trusted place (your own earlier run).
        progress: called with one line per iteration (``None``: silent).
    """
    import torch
    from tensorboardX import SummaryWriter

    from placement_rl.plots import learning_curve_png

    # The output folder and the checkpoint to resume are checked before Ray starts, not after.
    output_folder(out_dir or cfg.run.output_dir, "--out-dir" if out_dir else "run.output_dir")
    if resume is not None and not Path(resume).is_dir():
        raise FileNotFoundError(f"--resume {str(resume)!r}: no such checkpoint folder")
    ensure_ray()
    torch.manual_seed(cfg.run.seed)
    run_dir, warning = output_dir(out_dir or cfg.run.output_dir)
    if progress is not None:
        progress(f"[{cfg.name}] writing to {run_dir}" + (f"\nwarning: {warning}" if warning else ""))
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / CONFIG_FILE, cfg.to_dict())
    metrics = cfg.agent_spec.learner_metrics
    algo = build_algorithm(cfg)
    if resume is not None:
        algo.restore_from_path(str(Path(resume).resolve()))
    rows: list[dict[str, float]] = []
    writer = SummaryWriter(str(run_dir / "tb"))
    try:
        with open(run_dir / "progress.csv", "w", newline="") as f:
            table: csv.DictWriter[str] | None = None
            for it in range(1, cfg.run.iterations + 1):
                row = summarize(algo.train(), metrics)
                rows.append(row)
                if table is None:
                    table = csv.DictWriter(f, fieldnames=list(row))
                    table.writeheader()
                table.writerow(row)
                f.flush()
                for key, value in row.items():
                    if key != "iteration" and math.isfinite(value):
                        writer.add_scalar(key, value, it)
                if progress is not None:
                    # a loss the config turns off (TAG's value loss at coefficient 0) is not reported: not "nan"
                    extra = "  ".join(f"{k} {row[k]:.3f}" for k in metrics if math.isfinite(row[k]))
                    progress(
                        f"[{cfg.name}] iter {it}/{cfg.run.iterations}  steps {row['env_steps']:.0f}  "
                        f"return {row['episode_return_mean']:.3f}  speedup {row['speedup_mean']:.2f}x "
                        f"(best {row['best_speedup']:.2f}x)  {extra}  {row['time_s']:.0f}s"
                    )
                if it % cfg.run.checkpoint_every == 0:
                    save_checkpoint(algo, cfg, run_dir / f"checkpoint_{it:06d}")
        save_checkpoint(algo, cfg, run_dir / "checkpoint_final")
    finally:
        writer.close()
        algo.stop()
    learning_curve_png(rows, run_dir / "learning_curve.png", title=cfg.name)
    return run_dir


# ------------------------------------------------------------------------- training on one instance
#: Attributes the plan recorder keeps on each EnvRunner: its best (oom, makespan) so far, and the
#: plans that improved it since the driver last collected them, as ``(time.time(), plan)``.
_BEST_KEY, _FOUND = "_placement_best_key", "_placement_found"
#: The cost multiplier of a plan that does not fit (MCMC's default, so the traces compare).
OOM_PENALTY = 10.0


def record_plan(*, episode: Any, env_runner: Any, **kwargs: Any) -> None:
    """RLlib ``on_episode_end`` callable: keep the episode's final plan on its EnvRunner when it beats the
    runner's best so far (fitting first, then by makespan). Episodes that end without a plan (an
    invalid action) are skipped."""
    infos = episode.get_infos()
    info = infos[-1] if len(infos) else {}
    plan = info.get("plan") if isinstance(info, Mapping) else None
    if plan is None or "makespan_s" not in info:
        return
    key = (bool(info.get("oom", False)), float(info["makespan_s"]))
    best = getattr(env_runner, _BEST_KEY, None)
    if best is None or key < best:
        setattr(env_runner, _BEST_KEY, key)
        found = getattr(env_runner, _FOUND, None)
        if found is None:
            found = []
            setattr(env_runner, _FOUND, found)
        found.append((time.time(), plan))


def _take_found(runner: Any) -> list[tuple[float, Any]]:
    """The plans a runner recorded since the last call (and forget them there)."""
    found = list(getattr(runner, _FOUND, None) or ())
    setattr(runner, _FOUND, [])
    return found


@dataclass(frozen=True)
class InstanceTraining:
    """What :func:`train_on_instance` found.

    Attributes:
        plan: the best plan sampled while training (the least cost).
        result: its simulation (the caller's cost model).
        anytime: ``(seconds since the call began, best cost so far in seconds)`` at each improvement
            and at the end; the cost is the makespan, penalized as MCMC's for a plan that does not fit
            (:data:`OOM_PENALTY`). Seconds include building the algorithm (its EnvRunners).
        iterations: training iterations run.
        env_steps: env steps sampled.
        elapsed_s: wall-clock seconds from the call to the end of the last iteration.
    """

    plan: Plan
    result: SimResult
    anytime: tuple[tuple[float, float], ...]
    iterations: int
    env_steps: int
    elapsed_s: float


def train_on_instance(
    cfg: TrainConfig,
    graph: OpGraph,
    topology: DeviceTopology,
    budget: str | int = "60s",
    *,
    cost_model: CostModel | None = None,
    progress: Callable[[str], None] | None = None,
) -> InstanceTraining:
    """Train ``cfg``'s agent on ``graph`` x ``topology`` alone and keep the best plan sampled on the way.

    Trinity's setting: the policy is trained per instance and the answer is the best plan among all
    sampled episodes. Every EnvRunner records the final plan of each episode that beats its own best
    (:func:`record_plan`, added to the agent's callbacks); after each iteration the driver collects
    them, simulates each with one :class:`~placement_rl.sim.SimContext` and extends the trace. The
    agent must act in episodes whose last ``info`` holds ``plan`` and ``makespan_s`` (the Placement
    env does); nothing is written to disk.

    Args:
        cfg: the training config; its generator is replaced by the instance, ``run.iterations`` and
            checkpoints are ignored.
        graph: the op graph.
        topology: the cluster.
        budget: wall-clock seconds (``"60s"``, ``"2m"``: iterations run until the time is spent, the
            last one finishing past it) or a number of training iterations (``5`` or ``"5"``).
        cost_model: the cost model that judges the plans (default: the simulator's).
        progress: called with one line per iteration (``None``: silent).

    Raises:
        ValueError: for a budget that is neither a duration nor a count.
        RuntimeError: when no sampled episode ended with a plan.
    """
    from placement_rl.rl.policy import GivenInstance
    from placement_rl.search import Budget
    from placement_rl.search.mcmc import plan_cost
    from placement_rl.sim import SimContext

    limit = Budget.parse(budget)
    ensure_ray()
    ctx = SimContext(graph, topology, cost_model)
    cfg = cfg.replace(env={**cfg.env, "generator": GivenInstance(graph, topology)})
    start_wall, start = time.time(), time.perf_counter()
    config = cfg.agent_spec.algorithm(cfg)
    previous = config.callbacks_on_episode_end
    previous = [] if previous is None else list(previous) if isinstance(previous, (list, tuple)) else [previous]
    config.callbacks(on_episode_end=[*previous, record_plan])
    quiet_ray_logs()
    algo = config.build_algo()
    best: tuple[float, Any, Any] | None = None  # (cost s, plan, result)
    trace: list[tuple[float, float]] = []
    iterations = env_steps = 0
    try:
        while True:
            row = summarize(algo.train())
            iterations += 1
            env_steps = int(row["env_steps"]) if math.isfinite(row["env_steps"]) else env_steps
            remote = algo.env_runner_group.num_remote_workers() > 0
            batches = algo.env_runner_group.foreach_env_runner(_take_found, local_env_runner=not remote)
            for stamp, plan in sorted((f for batch in batches for f in batch), key=lambda f: f[0]):
                result = ctx.simulate(plan)
                cost = plan_cost(result, OOM_PENALTY)
                if best is None or cost < best[0]:
                    best = (cost, plan, result)
                    at = min(max(stamp - start_wall, trace[-1][0] if trace else 0.0), time.perf_counter() - start)
                    trace.append((at, cost))
            elapsed = time.perf_counter() - start
            if progress is not None:
                text = f"best {best[0] * 1e3:,.2f} ms" if best is not None else "no plan yet"
                progress(f"[{cfg.name}] iter {iterations}  steps {env_steps}  {elapsed:.1f}s  {text}")
            if limit.seconds is not None and elapsed >= limit.seconds:
                break
            if limit.proposals is not None and iterations >= limit.proposals:
                break
    finally:
        algo.stop()
    if best is None:
        raise RuntimeError(
            f"training {cfg.agent!r} on {graph.name}@{topology.name}: no sampled episode ended with a plan in "
            f"{iterations} iterations; expected an agent whose episodes end with info['plan']"
        )
    trace.append((elapsed, best[0]))
    return InstanceTraining(best[1], best[2], tuple(trace), iterations, env_steps, elapsed)


def sweep(cfg: SweepConfig, *, progress: Callable[[str], None] | None = print) -> Path:
    """Run a Tune sweep; writes ``results.csv`` (a row per trial) and ``best_config.yaml``; returns the folder."""
    import ray
    import yaml
    from ray import tune

    output_folder(cfg.output_dir, "output_dir")  # before Ray starts, not after
    ensure_ray()
    out, warning = output_dir(cfg.output_dir)
    if progress is not None:
        progress(f"sweep writing to {out}" + (f"\nwarning: {warning}" if warning else ""))
    out.mkdir(parents=True, exist_ok=True)
    cpus = int(ray.cluster_resources().get("CPU", os.cpu_count() or 1))
    if cfg.cpus_per_trial > cpus:
        raise ValueError(
            f"cpus_per_trial = {cfg.cpus_per_trial}, but the Ray cluster has {cpus} CPUs; expected at most {cpus}"
        )
    base = cfg.base
    metrics = base.agent_spec.learner_metrics
    concurrent = max(1, cpus // cfg.cpus_per_trial)
    runners = max(0, cfg.cpus_per_trial - 1)
    domains: dict[str, Callable[[list[Any]], Any]] = {
        "choice": tune.choice,
        "grid": tune.grid_search,
        "uniform": lambda v: tune.uniform(*v),
        "loguniform": lambda v: tune.loguniform(*v),
        "randint": lambda v: tune.randint(*v),
    }
    space = {key: domains[kind](list(values)) for key, (kind, values) in cfg.search.items()}

    def trial(config: dict[str, Any]) -> None:
        resolved = base.to_dict()
        for key, value in config.items():
            set_dotted(resolved, key, value)
        resolved["run"]["num_env_runners"] = runners
        trial_cfg = TrainConfig.from_dict(resolved, where="trial")
        algo = build_algorithm(trial_cfg)
        try:
            for _ in range(trial_cfg.run.iterations):
                tune.report(summarize(algo.train(), metrics))
        finally:
            algo.stop()

    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": cfg.cpus_per_trial}),
        param_space=space,
        tune_config=tune.TuneConfig(
            num_samples=cfg.num_samples, metric=cfg.metric, mode=cfg.mode, max_concurrent_trials=concurrent
        ),
        run_config=tune.RunConfig(
            name="trials", storage_path=str(out), verbose=0, callbacks=[_progress_callback(progress)]
        ),
    )
    results = tuner.fit()
    rows = []
    for r in results:
        if r.metrics is None:
            continue
        rows.append(
            {
                **{f"config/{k}": v for k, v in r.config.items()},
                **{k: r.metrics.get(k) for k in ("episode_return_mean", "speedup_mean", "best_speedup", "iteration")},
                "error": str(r.error) if r.error else "",
            }
        )
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted({k for row in rows for k in row}))
        w.writeheader()
        w.writerows(rows)
    best = _best_trial([r for r in results if r.metrics is not None and not r.error], cfg.metric, cfg.mode)
    resolved = base.to_dict()
    for key, value in best.config.items():
        set_dotted(resolved, key, value)
    resolved["run"]["num_env_runners"] = runners  # what the trials ran with
    resolved["run"]["output_dir"] = str(out / "best")  # training the winner must not overwrite the base run
    (out / "best_config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    if progress is not None:
        progress(
            f"best trial: {cfg.metric} = {_best_value(best, cfg.metric, cfg.mode)} (its best iteration); config "
            f"written to {out / 'best_config.yaml'}"
        )
    return out


def _best_trial(trials: list[Any], metric: str, mode: str) -> Any:
    """The trial whose ``metric`` was best at any of its iterations (not only its last: a trial that
    peaked and then drifted still found that policy); ties (``best_speedup`` often ties) go to the
    higher final mean return, then to the first trial."""
    if not trials:
        raise ValueError("the sweep finished no trial; see the trials' errors in results.csv")

    def key(trial: Any) -> tuple[float, float]:
        value = _best_value(trial, metric, mode)
        ret = float(trial.metrics.get("episode_return_mean", float("nan")))
        value = value if math.isfinite(value) else -math.inf if mode == "max" else math.inf
        return (value if mode == "max" else -value, ret if math.isfinite(ret) else -math.inf)

    return max(trials, key=key)


def _best_value(trial: Any, metric: str, mode: str) -> float:
    """A trial's best ``metric`` over its reported iterations (its last result where no history is kept)."""
    frame = getattr(trial, "metrics_dataframe", None)
    values: list[float] = []
    if frame is not None and metric in getattr(frame, "columns", ()):
        values = [float(v) for v in frame[metric].tolist() if v is not None and math.isfinite(float(v))]
    if not values:
        return float(trial.metrics.get(metric, float("nan")))
    return max(values) if mode == "max" else min(values)


def _progress_callback(progress: Callable[[str], None] | None) -> Any:
    """A Tune callback printing one line per trial result (Tune's own table is off)."""
    from ray.tune import Callback

    class Progress(Callback):  # type: ignore[misc]
        def on_trial_result(
            self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
        ) -> None:
            if progress is not None:
                progress(
                    f"[{trial.trial_id}] iter {result.get('iteration', 0):.0f}  return "
                    f"{result.get('episode_return_mean', float('nan')):.3f}  "
                    f"speedup {result.get('speedup_mean', float('nan')):.2f}x"
                )

    return Progress()

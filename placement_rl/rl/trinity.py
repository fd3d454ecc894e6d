"""Trinity training on RLlib: build the PPO config, train, sweep with Tune, load trained policies.

This is the Ray edge of the project (the core never imports Ray). ``placement-rl train FILE.yaml``
and ``placement-rl tune FILE.yaml`` call :func:`train` and :func:`sweep`; inside ``ray job submit``
they attach to the job's cluster with a plain ``ray.init()``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from placement_rl.rl.config import SweepConfig, TrainConfig, set_dotted

ENV_ID = "placement_rl/Placement-v0"
CONFIG_FILE = "train_config.json"


def _ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(log_to_driver=False)  # plain init: a local Ray, or the cluster of a `ray job submit`


def _metrics_callback() -> type:
    """An RLlib callback that logs the final plan's speedup and makespan of every episode."""
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class PlacementMetrics(RLlibCallback):
        def on_episode_end(self, *, episode: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
            infos = episode.get_infos()
            info = infos[-1] if len(infos) else {}
            if metrics_logger is not None and "speedup" in info:
                metrics_logger.log_value("speedup_mean", float(info["speedup"]), reduce="mean", window=1000)
                metrics_logger.log_value(
                    "best_speedup", float(info["speedup"]) if not info["oom"] else 0.0, reduce="max"
                )
                metrics_logger.log_value("oom_fraction", float(info["oom"]), reduce="mean", window=1000)

    return PlacementMetrics


def algorithm_config(cfg: TrainConfig, env_overrides: Mapping[str, Any] | None = None) -> Any:
    """The RLlib ``PPOConfig`` of a training config (new API stack, Trinity RLModule)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from placement_rl.envs import register_rllib_envs
    from placement_rl.policies.trinity import TrinityRLModule

    register_rllib_envs()
    ppo = cfg.ppo
    env = {**cfg.env, **(env_overrides or {}), "mode": "one_shot"}
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(ENV_ID, env_config=env)
        .env_runners(num_env_runners=cfg.run.num_env_runners, num_envs_per_env_runner=1, batch_mode="complete_episodes")
        .learners(num_learners=0)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=TrinityRLModule, model_config=cfg.model.model_config()))
        .training(
            lr=ppo.lr,
            clip_param=ppo.clip_param,
            entropy_coeff=ppo.entropy_coeff,
            grad_clip=ppo.grad_clip,
            grad_clip_by="global_norm",
            train_batch_size_per_learner=ppo.train_batch_size,
            minibatch_size=ppo.minibatch_size,
            num_epochs=ppo.num_epochs,
            vf_loss_coeff=ppo.vf_loss_coeff,
            gamma=ppo.gamma,
            lambda_=ppo.lambda_,
            use_kl_loss=False,
        )
        .callbacks(_metrics_callback())
        .debugging(seed=cfg.run.seed)
        .reporting(metrics_num_episodes_for_smoothing=ppo.train_batch_size)
    )


def summarize(result: Mapping[str, Any]) -> dict[str, float]:
    """The figures of one training iteration that the CSV, TensorBoard and progress line show."""
    runners = result.get("env_runners", {})
    learner = result.get("learners", {}).get("default_policy", {})

    def num(value: Any) -> float:
        try:
            return float(value)
        except (TypeError, ValueError):
            return float("nan")

    return {
        "iteration": num(result.get("training_iteration")),
        "env_steps": num(result.get("num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime"))),
        "episode_return_mean": num(runners.get("episode_return_mean")),
        "speedup_mean": num(runners.get("speedup_mean")),
        "best_speedup": num(runners.get("best_speedup")),
        "oom_fraction": num(runners.get("oom_fraction")),
        "policy_loss": num(learner.get("policy_loss")),
        "vf_loss": num(learner.get("vf_loss")),
        "entropy": num(learner.get("entropy")),
        "time_s": num(result.get("time_total_s")),
    }


def train(
    cfg: TrainConfig, *, out_dir: str | Path | None = None, progress: Callable[[str], None] | None = print
) -> Path:
    """Train Trinity; returns the run directory.

    The run directory holds ``train_config.json`` (the resolved config), ``progress.csv`` (one row
    per iteration), TensorBoard events (``tb/``), ``checkpoint_NNNNNN/`` every
    ``run.checkpoint_every`` iterations and ``checkpoint_final/``, and ``learning_curve.png``.
    """
    import torch
    from tensorboardX import SummaryWriter

    from placement_rl.rl.plots import learning_curve_png

    _ensure_ray()
    torch.manual_seed(cfg.run.seed)
    run_dir = Path(out_dir or cfg.run.output_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
    algo = algorithm_config(cfg).build_algo()
    rows: list[dict[str, float]] = []
    writer = SummaryWriter(str(run_dir / "tb"))
    try:
        with open(run_dir / "progress.csv", "w", newline="") as f:
            table: csv.DictWriter[str] | None = None
            for it in range(1, cfg.run.iterations + 1):
                row = summarize(algo.train())
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
                    progress(
                        f"[{cfg.name}] iter {it}/{cfg.run.iterations}  steps {row['env_steps']:.0f}  "
                        f"return {row['episode_return_mean']:.3f}  speedup {row['speedup_mean']:.2f}x "
                        f"(best {row['best_speedup']:.2f}x)  entropy {row['entropy']:.2f}  {row['time_s']:.0f}s"
                    )
                if it % cfg.run.checkpoint_every == 0:
                    algo.save_to_path(str(run_dir / f"checkpoint_{it:06d}"))
        algo.save_to_path(str(run_dir / "checkpoint_final"))
    finally:
        writer.close()
        algo.stop()
    learning_curve_png(rows, run_dir / "learning_curve.png", title=cfg.name)
    return run_dir


def module_checkpoint(path: str | Path) -> Path:
    """The RLModule folder inside an algorithm checkpoint (or ``path`` if it already is one)."""
    p = Path(path)
    for candidate in (p / "learner_group" / "learner" / "rl_module" / "default_policy", p):
        if (
            (candidate / "module_state.pt").is_file()
            or (candidate / "module_state.pkl").is_file()
            or (candidate / "class_and_ctor_args.pkl").is_file()
        ):
            return candidate
    raise FileNotFoundError(
        f"{str(p)!r} is not a Trinity checkpoint: expected learner_group/learner/rl_module/default_policy inside it"
    )


def load_policy(checkpoint: str | Path) -> tuple[Any, TrainConfig]:
    """The trained RLModule and the training config of a checkpoint (``checkpoint_*`` of a run dir)."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    from placement_rl.envs import register_envs

    register_envs()
    ckpt = Path(checkpoint)
    config_path = next((d / CONFIG_FILE for d in (ckpt, *ckpt.parents) if (d / CONFIG_FILE).is_file()), None)
    if config_path is None:
        raise FileNotFoundError(f"no {CONFIG_FILE} in {str(ckpt)!r} or its parents; is it a placement-rl run?")
    cfg = TrainConfig.from_dict(json.loads(config_path.read_text()), where=str(config_path))
    module = RLModule.from_checkpoint(module_checkpoint(ckpt))
    module.eval()
    return module, cfg


def policy_plan(module: Any, env: Any, seed: int = 0) -> dict[str, Any]:
    """Run the policy deterministically (greedy decoding) for one episode of ``env``; the final info."""
    import torch
    from ray.rllib.core import Columns

    obs, _ = env.reset(seed=seed)
    batch = {Columns.OBS: {k: torch.as_tensor(v).unsqueeze(0) for k, v in obs.items()}}
    start = time.perf_counter()
    with torch.no_grad():
        out = module.forward_inference(batch)
    action = out[Columns.ACTIONS][0].numpy().astype(np.int64)
    _, reward, _, _, info = env.step(action)
    return {**info, "reward": float(reward), "search_s": time.perf_counter() - start}


def sweep(cfg: SweepConfig, *, progress: Callable[[str], None] | None = print) -> Path:
    """Run a Tune sweep; writes ``results.csv`` (a row per trial) and ``best_config.yaml``; returns the folder."""
    import ray
    import yaml
    from ray import tune

    _ensure_ray()
    out = Path(cfg.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cpus = int(ray.available_resources().get("CPU", os.cpu_count() or 1))
    base = cfg.base
    concurrent = max(1, cpus // cfg.cpus_per_trial)
    runners = max(0, cfg.cpus_per_trial - 1)
    space: dict[str, Any] = {}
    for key, (kind, values) in cfg.search.items():
        domain = {
            "choice": tune.choice,
            "grid": tune.grid_search,
            "uniform": lambda v: tune.uniform(*v),
            "loguniform": lambda v: tune.loguniform(*v),
            "randint": lambda v: tune.randint(*v),
        }[kind]
        space[key] = domain(list(values))

    def trial(config: dict[str, Any]) -> None:
        resolved = base.to_dict()
        for key, value in config.items():
            set_dotted(resolved, key, value)
        resolved["run"]["num_env_runners"] = runners
        trial_cfg = TrainConfig.from_dict(resolved, where="trial")
        algo = algorithm_config(trial_cfg).build_algo()
        try:
            for _ in range(trial_cfg.run.iterations):
                tune.report(summarize(algo.train()))
        finally:
            algo.stop()

    reporter = _ProgressCallback(progress)
    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": cfg.cpus_per_trial}),
        param_space=space,
        tune_config=tune.TuneConfig(
            num_samples=cfg.num_samples, metric=cfg.metric, mode=cfg.mode, max_concurrent_trials=concurrent
        ),
        run_config=tune.RunConfig(name="trials", storage_path=str(out), verbose=0, callbacks=[reporter]),
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
    best = results.get_best_result(metric=cfg.metric, mode=cfg.mode)
    resolved = base.to_dict()
    for key, value in best.config.items():
        set_dotted(resolved, key, value)
    (out / "best_config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    if progress is not None:
        progress(
            f"best trial: {cfg.metric} = {best.metrics.get(cfg.metric)}; config written to {out / 'best_config.yaml'}"
        )
    return out


class _ProgressCallback:
    """A Tune callback printing one line per trial result (Tune's own table is off)."""

    def __new__(cls, progress: Callable[[str], None] | None) -> Any:
        from ray.tune import Callback

        class Progress(Callback):  # type: ignore[misc]
            def on_trial_result(
                self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
            ) -> None:
                if progress is not None:
                    progress(
                        f"[{trial.trial_id}] iter {result.get('iteration', 0):.0f}  return "
                        f"{result.get('episode_return_mean', float('nan')):.3f}  speedup {result.get('speedup_mean', float('nan')):.2f}x"
                    )

        return Progress()

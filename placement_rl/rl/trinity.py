"""The Trinity agent (seed 004): RLlib PPO training the partition + schedule RLModule
(:class:`placement_rl.policies.trinity.TrinityRLModule`) in ``Placement-v0``'s one-shot mode.

Importing this module registers the agent ``trinity`` (:mod:`placement_rl.rl.agents`). Its YAML
sections are ``model`` (:class:`ModelSection`) and ``ppo`` (:class:`PPOSection`); the trainer,
Tune and evaluation are agent-agnostic (:mod:`placement_rl.rl.train`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from placement_rl.config import Rule, integer, number, option
from placement_rl.errors import SchemaError
from placement_rl.rl.agents import Agent, register_agent
from placement_rl.rl.config import TrainConfig

ENV_ID = "placement_rl/Placement-v0"

_TWO_SIZES = Rule(
    lambda v: (
        isinstance(v, tuple)
        and len(v) == 2
        and all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in v)
    ),
    "two positive integer sizes",
)


@dataclass(frozen=True)
class ModelSection:
    """The Trinity RLModule (``placement_rl.policies.trinity.TrinityRLModule``)."""

    hidden: int = option(256, rule=integer(1))
    """Hidden size of the schedule network's encoder and decoder LSTMs."""
    hidden_partition: tuple[int, int] = option((64, 128), rule=_TWO_SIZES)
    """Hidden sizes of the partition network."""
    dropout: float = option(0.3, rule=number(0, 0.95))
    """Dropout of the partition network (training pass only)."""
    c: float = option(5.0, rule=number(0, low_open=True))
    """Logit range: logits are ``c * tanh(u / temperature)``."""
    temperature: float = option(10.0, rule=number(0, low_open=True))
    """Softness of the ``tanh`` squashing."""
    logit_noise: float = option(0.1, rule=number(0))
    """Largest uniform noise added to the logits while exploring early."""
    noise_steps: int = option(500, rule=integer(0))
    """Sampled actions (per EnvRunner) that get the noise."""

    def __post_init__(self) -> None:
        if isinstance(self.hidden_partition, list):  # YAML lists
            object.__setattr__(self, "hidden_partition", tuple(self.hidden_partition))

    def model_config(self) -> dict[str, Any]:
        return {**asdict(self), "hidden_partition": list(self.hidden_partition)}


@dataclass(frozen=True)
class PPOSection:
    """RLlib PPO's training options."""

    lr: float = option(1e-3, rule=number(0, low_open=True))
    """Adam learning rate (Trinity reports 0.1 for its own scale of logits; 1e-3 suits this module)."""
    clip_param: float = option(0.2, rule=number(0, low_open=True))
    """PPO's clip range epsilon."""
    entropy_coeff: float = option(0.01, rule=number(0))
    """Entropy bonus."""
    grad_clip: float = option(1.0, rule=number(0, low_open=True))
    """Gradient-norm clipping (Trinity: 1.0)."""
    train_batch_size: int = option(64, rule=integer(1))
    """Env steps (= sampled plans in one-shot mode) per training iteration."""
    minibatch_size: int = option(32, rule=integer(1))
    """SGD minibatch size."""
    num_epochs: int = option(4, rule=integer(1))
    """SGD passes over each batch."""
    vf_loss_coeff: float = option(0.5, rule=number(0))
    """Weight of the value loss (the value head is the moving reward baseline)."""
    vf_clip_param: float = option(10.0, rule=number(0, low_open=True))
    """Clip of the value loss (RLlib's default)."""
    gamma: float = option(1.0, rule=number(0, 1))
    """Discount (one-step episodes in one-shot mode)."""
    lambda_: float = option(1.0, rule=number(0, 1))
    """GAE lambda (YAML key ``lambda_``)."""

    def validate(self, where: str) -> None:
        if self.minibatch_size > self.train_batch_size:
            raise SchemaError(
                f"{where}: minibatch_size = {self.minibatch_size}; "
                f"expected <= train_batch_size ({self.train_batch_size})"
            )


def _metrics_callback() -> type:
    """An RLlib callback that logs the final plan's speedup and out-of-memory rate of every episode."""
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


def algorithm_config(cfg: TrainConfig) -> Any:
    """The RLlib ``PPOConfig`` of a training config (new API stack, Trinity RLModule)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from placement_rl.policies.trinity import TrinityRLModule

    spec = RLModuleSpec(module_class=TrinityRLModule, model_config=cfg.model.model_config())
    return ppo_algorithm_config(cfg, spec, smoothing_episodes=cfg.ppo.train_batch_size)


def ppo_algorithm_config(cfg: TrainConfig, module_spec: Any, smoothing_episodes: int) -> Any:
    """RLlib PPO on the new API stack for ``cfg``'s env and ``ppo`` section (a :class:`PPOSection`),
    with ``module_spec`` (an ``RLModuleSpec``): the setup the PPO agents share."""
    from ray.rllib.algorithms.ppo import PPOConfig

    from placement_rl.envs import register_rllib_envs

    register_rllib_envs()
    ppo: PPOSection = cfg.ppo
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(ENV_ID, env_config=dict(cfg.env))
        .env_runners(num_env_runners=cfg.run.num_env_runners, num_envs_per_env_runner=1, batch_mode="complete_episodes")
        .learners(num_learners=0)
        # Restarting a failed EnvRunner needs its constructor arguments kept in the object store, which
        # Ray reports as an error line at every start; a failed runner fails the run instead.
        .fault_tolerance(restart_failed_env_runners=False)
        .rl_module(rl_module_spec=module_spec)
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
            vf_clip_param=ppo.vf_clip_param,
            gamma=ppo.gamma,
            lambda_=ppo.lambda_,
            use_kl_loss=False,
        )
        .callbacks(_metrics_callback())
        .debugging(seed=cfg.run.seed)
        .reporting(metrics_num_episodes_for_smoothing=smoothing_episodes)
    )


def build_module(cfg: TrainConfig) -> Any:
    """The Trinity RLModule of ``cfg`` with fresh weights; its spaces are the configured env's."""
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    import placement_rl.envs  # noqa: F401  (registers the ids)
    from placement_rl.policies.trinity import TrinityRLModule

    env = gym.make(ENV_ID, config=dict(cfg.env))
    spec = RLModuleSpec(
        module_class=TrinityRLModule,
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config=cfg.model.model_config(),
    )
    return spec.build()


def act(module: Any, env: Any, seed: int = 0) -> dict[str, Any]:
    """Run the policy deterministically (greedy decoding) for the one step of a one-shot episode."""
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


TRINITY = register_agent(
    Agent(
        name="trinity",
        description="Trinity: PPO with a partition network and a seq2seq schedule network",
        env_id=ENV_ID,
        env_options={"mode": "one_shot"},
        sections={"model": ModelSection, "ppo": PPOSection},
        algorithm=algorithm_config,
        build_module=build_module,
        act=act,
        searchable_env=frozenset(
            {
                "one_shot_groups",
                "reward_options.alpha",
                "reward_options.beta",
                "reward_options.gamma",
                "reward_options.c_hat_gb",
                "reward_options.m_hat_gib",
            }
        ),
        learner_metrics=("policy_loss", "vf_loss", "entropy"),
    )
)

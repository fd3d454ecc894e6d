"""The TAG agent (seed 001, sec. 4.2): AlphaZero-style training of the GNN prior
(:class:`placement_rl.policies.tag.TagRLModule`) by tree-search self-play in ``Placement-v0``'s
sequential mode with the TAG action space.

RLlib has no tree-search algorithm, so this module writes one on the new API stack:

* :class:`TagSelfPlayRunner` (an EnvRunner; ``run.num_env_runners`` Ray actors, or the driver with
  0) plays ``training.episodes_per_runner`` self-play episodes per iteration: it resets its env (the
  generator draws an instance), runs :func:`placement_rl.search.mcts.self_play` with the prior of its
  current weights (the uniform prior during ``mcts.warm_start_iterations``, TAG's warm start) and
  returns one sample per recorded root: the root's observation, the visit distribution ``pi``
  (padded to the env's action count) and the episode's best leaf value (the value head's target).
* :class:`TagLearner` (a TorchLearner) minimizes the cross-entropy between the prior and ``pi``
  (TAG's loss) plus ``training.value_loss_coeff`` times the value MSE, with Adam and clip-norm.
* :class:`TagMCTS` (the Algorithm) samples, updates and syncs the weights back to the runners
  every iteration; checkpoints, ``--resume`` and the policy export are RLlib's / the trainer's.

Importing this module registers the agent ``tag`` (:mod:`placement_rl.rl.agents`). Its YAML
sections are ``model`` (:class:`ModelSection`), ``mcts`` (:class:`MCTSSection`) and ``training``
(:class:`TrainingSection`). :func:`act` plans with a search of ``mcts.eval_iterations`` leaves
guided by the trained prior.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placement_rl.config import choice, integer, number, option
from placement_rl.rl.agents import PADDED_SIZES, Agent, register_agent
from placement_rl.rl.config import TrainConfig

ENV_ID = "placement_rl/Placement-v0"
#: The env options the agent needs.
ENV_OPTIONS: Mapping[str, Any] = {"mode": "sequential", "action_space": "tag"}
#: Sample columns besides the observation's fields.
PI, VALUE_TARGET = "pi", "value_target"


@dataclass(frozen=True)
class ModelSection:
    """The GNN prior (:class:`placement_rl.policies.tag.TagGNNConfig`). ``preset: paper`` gives TAG's
    size (hidden 256, 4 heads, 4 layers); the fields below, when set, override the preset's."""

    preset: str = option("default", rule=choice(("default", "paper")))
    """Named sizes: ``default`` (hidden 64, 2 heads, 4 layers; CPU) or ``paper`` (TAG's)."""
    hidden: int | None = option(None, rule=integer(4, null=True))
    """Embedding width (a multiple of ``heads``); null: the preset's."""
    heads: int | None = option(None, rule=integer(1, null=True))
    """Attention heads; null: the preset's."""
    layers: int | None = option(None, rule=integer(0, null=True))
    """Message-passing layers; null: the preset's (4, as the paper)."""
    relation_aggr: str | None = option(None, rule=choice(("gamma", "mean"), null=True))
    """``gamma`` (the paper's weighting of relations) or ``mean`` (TAG's code); null: the preset's."""
    dropout: float = option(0.0, rule=number(0, 0.9))
    """Dropout on relation outputs while training."""

    def model_config(self, value_head: bool) -> dict[str, Any]:
        """The ``model_config`` of :class:`~placement_rl.policies.tag.TagRLModule`."""
        sizes = {"hidden": self.hidden, "heads": self.heads, "layers": self.layers, "relation_aggr": self.relation_aggr}
        return {
            "preset": self.preset,
            **{k: v for k, v in sizes.items() if v is not None},
            "dropout": self.dropout,
            "value_head": value_head,
        }


@dataclass(frozen=True)
class MCTSSection:
    """The tree search of self-play and of :func:`act` (:mod:`placement_rl.search.mcts`)."""

    iterations_per_move: int = option(32, rule=integer(1))
    """Leaf evaluations before each committed move of a self-play episode."""
    moves_fraction: float = option(0.25, rule=number(0, 1, low_open=True))
    """Moves per episode as a fraction of the instance's op groups, rounded up (TAG's code: a quarter)."""
    c_puct: float | None = option(None, rule=number(0, low_open=True, null=True))
    """PUCT exploration constant; null: TAG's ``sqrt(#valid children / 10)`` per vertex."""
    leaf_batch: int = option(8, rule=integer(1))
    """Leaves per prior call (selected with a virtual loss)."""
    min_visits: int = option(8, rule=integer(1))
    """Root visits before the root is a training target (the paper: 800; small for CPU)."""
    temperature: float = option(1.0, rule=number(0))
    """Self-play moves are drawn from ``pi ** (1 / temperature)``; 0: the most visited."""
    eval_iterations: int = option(200, rule=integer(1))
    """Leaf evaluations of the search :func:`act` runs (evaluation, ``plan --checkpoint``)."""
    warm_start_iterations: int = option(1, rule=integer(0))
    """Training iterations whose self-play uses the uniform prior (TAG's warm start)."""

    def search_config(self) -> Any:
        from placement_rl.search.mcts import MCTSConfig

        return MCTSConfig(c_puct=self.c_puct, leaf_batch=self.leaf_batch)


@dataclass(frozen=True)
class TrainingSection:
    """The learner: Adam on the cross-entropy to the search's visit distributions (TAG's code)."""

    lr: float = option(1e-4, rule=number(0, low_open=True))
    """Adam learning rate (TAG's code: 1e-4)."""
    grad_clip: float = option(0.6, rule=number(0, low_open=True))
    """Gradient clipping by global norm (TAG's code: 0.6)."""
    episodes_per_runner: int = option(2, rule=integer(1))
    """Self-play episodes each EnvRunner plays per training iteration."""
    num_epochs: int = option(4, rule=integer(1))
    """SGD passes over each iteration's samples."""
    minibatch_size: int = option(32, rule=integer(1))
    """SGD minibatch size (samples; fewer samples make one minibatch that cycles)."""
    value_loss_coeff: float = option(0.0, rule=number(0))
    """Weight of the value head's MSE to the episode's best leaf value; 0: no value head (TAG has
    none; the head is our extension and the search does not use it yet)."""


# ------------------------------------------------------------------------------------------ helpers
def base_env(env: Any) -> Any:
    """The Placement-v0 instance under a (vectorized, wrapped) env."""
    for attr in ("envs",):
        inner = getattr(env, attr, None) or getattr(getattr(env, "unwrapped", None), attr, None)
        if inner:
            return base_env(inner[0])
    return env.unwrapped


def prior_fn(module: Any, env: Any, num_actions: int) -> Any:
    """A :data:`~placement_rl.search.mcts.PriorFn` of ``module`` on the episode of ``env`` (the base
    env): each prefix's observation via ``env.observe``, one batched forward pass, probabilities cut
    to the instance's ``num_actions``. The env's actions and the module's logits share the layout
    ``s * O + o`` (``O``: the env's ``tag_options``, which the module was built for), so the cut
    keeps the instance's subsets whatever ``O`` is."""
    from placement_rl.policies.tag import prior_probs

    def prior(prefixes: Sequence[tuple[int, ...]]) -> np.ndarray:
        probs = prior_probs(module, [env.observe(p) for p in prefixes])
        return probs[:, :num_actions]

    return prior


def moves_per_episode(num_groups: int, fraction: float) -> int:
    """Committed moves of a self-play episode: ``ceil(fraction * groups)``, at least 1."""
    return max(1, math.ceil(fraction * num_groups))


def play_episode(
    env: Any, module: Any, mcts: MCTSSection, rng: np.random.Generator, *, uniform: bool, seed: int | None = None
) -> tuple[list[dict[str, Any]], Any]:
    """One self-play episode on a fresh instance of ``env`` (the base env, reset here).

    Returns:
        The samples (observation fields, ``pi`` (A_env,) float32, ``value_target``) and the search's
        :class:`~placement_rl.search.mcts.SearchResult`.
    """
    from placement_rl.search.mcts import self_play

    env.reset(seed=seed)
    problem = env.tag_problem()
    prior = None if uniform else prior_fn(module, env, problem.num_actions)
    samples, result = self_play(
        problem,
        prior,
        rng,
        iterations_per_move=mcts.iterations_per_move,
        moves=moves_per_episode(problem.num_groups, mcts.moves_fraction),
        min_visits=mcts.min_visits,
        config=mcts.search_config(),
        temperature=mcts.temperature,
    )
    A = int(env.action_space.n)
    out = []
    for prefix, pi in samples:
        padded = np.zeros(A, np.float32)
        padded[: len(pi)] = pi
        out.append({"obs": env.observe(prefix), PI: padded, VALUE_TARGET: np.float32(result.evaluation.value)})
    return out, result


# ------------------------------------------------------------------------------ the RLlib classes
def _classes() -> dict[str, type]:
    """The Algorithm, its config, the EnvRunner and the Learner (built on first use: RLlib is heavy)."""
    if _CLASSES:
        return _CLASSES
    import torch
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core import DEFAULT_MODULE_ID, Columns
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        LEARNER_RESULTS,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
    )

    from placement_rl.policies.tag import TagRLModule

    class TagMCTSConfig(AlgorithmConfig):  # type: ignore[misc]
        """RLlib config of :class:`TagMCTS`; ``tag_mcts`` holds the :class:`MCTSSection`, ``tag_training``
        the :class:`TrainingSection`."""

        def __init__(self, algo_class: Any = None) -> None:
            super().__init__(algo_class=algo_class or TagMCTS)
            self.tag_mcts = MCTSSection()
            self.tag_training = TrainingSection()

        def get_default_rl_module_spec(self) -> Any:
            return RLModuleSpec(module_class=TagRLModule)

        def get_default_learner_class(self) -> Any:
            return TagLearner

    class TagSelfPlayRunner(SingleAgentEnvRunner):  # type: ignore[misc]
        """An EnvRunner whose ``sample`` plays self-play episodes (see the module docstring)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seed = self.config.seed or 0
            self._rng = np.random.default_rng([seed, self.worker_index])
            self._episodes = 0

        def sample(self, *args: Any, num_episodes: int | None = None, uniform: bool = False, **kwargs: Any) -> Any:
            """Play ``num_episodes`` self-play episodes; returns their samples (a list of dicts)."""
            mcts: MCTSSection = self.config.tag_mcts
            env = base_env(self.env)
            episodes = num_episodes or self.config.tag_training.episodes_per_runner
            samples: list[dict[str, Any]] = []
            for _ in range(episodes):
                seed = int(self._rng.integers(2**31)) if self._episodes else (self.config.seed or 0) + self.worker_index
                self._episodes += 1
                found, result = play_episode(env, self.module, mcts, self._rng, uniform=uniform, seed=seed)
                samples.extend(found)
                evaluation = result.evaluation
                speedup = float(evaluation.speedup)
                self.metrics.log_value("speedup_mean", speedup, reduce="mean", window=100)
                self.metrics.log_value("episode_return_mean", speedup, reduce="mean", window=100)
                self.metrics.log_value("best_speedup", 0.0 if evaluation.oom else speedup, reduce="max")
                self.metrics.log_value("oom_fraction", float(evaluation.oom), reduce="mean", window=100)
                self.metrics.log_value("mcts_iterations", float(result.iterations), reduce="mean", window=100)
                self.metrics.log_value("num_samples", len(found), reduce="sum")
                self.metrics.log_value(
                    NUM_ENV_STEPS_SAMPLED_LIFETIME,
                    moves_per_episode(env.tag_problem().num_groups, mcts.moves_fraction),
                    reduce="lifetime_sum",
                )
            return samples

    class TagLearner(TorchLearner):  # type: ignore[misc]
        """Cross-entropy of the prior to ``pi`` plus ``value_loss_coeff`` x value MSE (Adam, clip-norm:
        RLlib's defaults from ``lr``, ``grad_clip`` and ``grad_clip_by``)."""

        def compute_loss_for_module(
            self, *, module_id: str, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
        ) -> Any:
            logits = fwd_out[Columns.ACTION_DIST_INPUTS]
            mask = batch[Columns.OBS]["action_mask"] > 0
            logp = torch.log_softmax(logits, dim=-1)
            pi = batch[PI].to(logp.dtype)
            ce = -torch.where(mask, pi * logp, torch.zeros_like(logp)).sum(-1).mean()
            loss = ce
            coeff = config.tag_training.value_loss_coeff
            if coeff > 0:
                module = self.module[module_id]
                values = module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS))
                value_loss = torch.mean((values - batch[VALUE_TARGET].to(values.dtype)) ** 2)
                loss = ce + coeff * value_loss
                self.metrics.log_value((module_id, "value_loss"), value_loss.detach(), window=1)
            self.metrics.log_value((module_id, "cross_entropy"), ce.detach(), window=1)
            return loss

    class TagMCTS(Algorithm):  # type: ignore[misc]
        """AlphaZero-style self-play training of TAG's prior (see the module docstring)."""

        @classmethod
        def get_default_config(cls) -> Any:
            return TagMCTSConfig()

        def training_step(self) -> None:
            cfg = self.config
            uniform = self.iteration < cfg.tag_mcts.warm_start_iterations
            episodes = cfg.tag_training.episodes_per_runner
            results = self.env_runner_group.foreach_env_runner(
                lambda runner: (runner.sample(num_episodes=episodes, uniform=uniform), runner.get_metrics()),
                local_env_runner=self.env_runner_group.num_remote_workers() <= 0,
            )
            samples = [s for found, _ in results for s in found]
            self.metrics.aggregate([m for _, m in results], key=ENV_RUNNER_RESULTS)
            if not samples:  # no root reached min_visits: nothing to learn from this time
                return
            keys = list(samples[0]["obs"])
            columns = {
                Columns.OBS: {k: np.stack([s["obs"][k] for s in samples]) for k in keys},
                PI: np.stack([s[PI] for s in samples]),
                VALUE_TARGET: np.asarray([s[VALUE_TARGET] for s in samples], np.float32),
            }
            batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=len(samples))
            learner_results = self.learner_group.update(
                batch=batch,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
                    )
                },
                num_epochs=cfg.tag_training.num_epochs,
                minibatch_size=min(cfg.tag_training.minibatch_size, len(samples)),
                shuffle_batch_per_epoch=True,
            )
            self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
            self.env_runner_group.sync_weights(from_worker_or_learner_group=self.learner_group, inference_only=True)

    _CLASSES.update(
        config=TagMCTSConfig, algorithm=TagMCTS, runner=TagSelfPlayRunner, learner=TagLearner, module=TagRLModule
    )
    return _CLASSES


_CLASSES: dict[str, type] = {}


def algorithm_config(cfg: TrainConfig) -> Any:
    """The RLlib config of :class:`TagMCTS` for a training config (new API stack, TagRLModule)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from placement_rl.envs import register_rllib_envs

    register_rllib_envs()
    classes = _classes()
    training: TrainingSection = cfg.training
    config = (
        classes["config"]()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .framework("torch")
        .environment(ENV_ID, env_config=dict(cfg.env))
        .env_runners(
            env_runner_cls=classes["runner"], num_env_runners=cfg.run.num_env_runners, num_envs_per_env_runner=1
        )
        .learners(num_learners=0)
        # As Trinity: a failed runner fails the run (restarts keep constructor arguments in the object store).
        .fault_tolerance(restart_failed_env_runners=False)
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=classes["module"],
                model_config=cfg.model.model_config(training.value_loss_coeff > 0),
            )
        )
        .training(lr=training.lr, grad_clip=training.grad_clip, grad_clip_by="global_norm")
        .debugging(seed=cfg.run.seed)
    )
    config.tag_mcts = cfg.mcts
    config.tag_training = training
    return config


def build_module(cfg: TrainConfig) -> Any:
    """The TagRLModule of ``cfg`` with fresh weights; its spaces are the configured env's. The module
    carries ``cfg.mcts`` as ``tag_mcts`` (the search :func:`act` runs)."""
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    import placement_rl.envs  # noqa: F401  (registers the ids)
    from placement_rl.policies.tag import TagRLModule

    env = gym.make(ENV_ID, config={**dict(cfg.env), **ENV_OPTIONS})
    spec = RLModuleSpec(
        module_class=TagRLModule,
        observation_space=env.observation_space,
        action_space=env.action_space,
        model_config=cfg.model.model_config(cfg.training.value_loss_coeff > 0),
    )
    module = spec.build()
    module.tag_mcts = cfg.mcts
    return module


def act(module: Any, env: Any, seed: int = 0) -> dict[str, Any]:
    """Plan with a tree search of ``mcts.eval_iterations`` leaves guided by ``module``'s prior on the
    instance of ``env`` (reset with ``seed``), then step the env through the best decisions found.

    Returns:
        The final step's info (``plan``, ``makespan_s``, ...) with ``reward`` (the episode's total),
        ``search_s``, ``mcts_iterations`` and ``first_beat_dp``.
    """
    from placement_rl.search.mcts import MCTS

    mcts: MCTSSection = getattr(module, "tag_mcts", None) or MCTSSection()
    env.reset(seed=seed)
    base = base_env(env)
    problem = base.tag_problem()
    tree = MCTS(problem, prior_fn(module, base, problem.num_actions), mcts.search_config())
    result = tree.run(mcts.eval_iterations)
    # The best plan is a full decision list, or () when no leaf beat the start (data parallelism).
    decisions = problem.check_actions(result.decisions) if result.decisions else _data_parallel(problem)
    total, info = replay(env, decisions, seed)
    return {
        **info,
        "reward": total,
        "search_s": result.elapsed_s,
        "mcts_iterations": result.iterations,
        "first_beat_dp": result.first_beat_dp,
    }


def replay(env: Any, decisions: tuple[int, ...], seed: int = 0) -> tuple[float, dict[str, Any]]:
    """Step ``env`` (reset with ``seed``) through ``decisions``: the return and the last info (with
    ``actions``, the decisions stepped)."""
    env.reset(seed=seed)
    total, info = 0.0, {}
    for action in decisions:
        _, reward, terminated, truncated, info = env.step(int(action))
        total += float(reward)
        if terminated or truncated:
            break
    return total, {**info, "actions": tuple(int(a) for a in decisions)}


def _data_parallel(problem: Any) -> tuple[int, ...]:
    """The empty plan's completion (every group on the subset of all device groups, ``all_reduce``,
    in either option set) as explicit actions (:meth:`~placement_rl.search.tag.TagProblem.complete`)."""
    everything = problem.subsets.index(tuple(range(len(problem.device_groups))))
    return (problem.action(everything, "all_reduce"),) * problem.num_groups


TAG = register_agent(
    Agent(
        name="tag",
        description="TAG: tree search guided by a heterogeneous GNN prior trained by self-play",
        env_id=ENV_ID,
        env_options=ENV_OPTIONS,
        sections={"model": ModelSection, "mcts": MCTSSection, "training": TrainingSection},
        algorithm=algorithm_config,
        build_module=build_module,
        act=act,
        searchable_env=frozenset({"max_groups", "tag_options"}),
        learner_metrics=("cross_entropy", "value_loss"),
        # TagRLModule's weights do not depend on the padding: plan on instances larger than the training ones
        padded_env=frozenset(PADDED_SIZES),
    )
)

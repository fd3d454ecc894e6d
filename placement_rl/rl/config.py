"""Training and sweep configuration: YAML -> validated frozen dataclasses.

A training file (``tune_configs/trinity_ppo.yaml``) has the sections ``env``, ``model``, ``ppo`` and
``run`` plus a ``name``. ``env`` holds ``placement_rl/Placement-v0`` options (validated by
:class:`placement_rl.envs.PlacementConfig`); the other sections are the dataclasses below, one
docstring per field. A sweep file (``tune_configs/trinity_sweep.yaml``) names a training file as its
``base``, may override its values, and gives a search space over dotted keys
(``ppo.lr: {loguniform: [1e-4, 1e-2]}``).

Unknown keys are errors that list the valid keys; malformed YAML is an error that names the file
and line. This module reads files; the algorithms and envs never do.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from placement_rl.errors import SchemaError


def _check(section: str, data: Any, cls: type) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SchemaError(f"{section}: expected a mapping, got {type(data).__name__} {data!r}")
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise SchemaError(f"{section}: unknown key(s) {unknown}; valid keys: {valid}")
    return dict(data)


def _number(
    section: str,
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    integer: bool = False,
    low_open: bool = False,
) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise SchemaError(f"{section}.{name} = {value!r}; expected {'an integer' if integer else 'a number'}")
    if low is not None and (value <= low if low_open else value < low):
        raise SchemaError(f"{section}.{name} = {value!r}; expected {'>' if low_open else '>='} {low}")
    if high is not None and value > high:
        raise SchemaError(f"{section}.{name} = {value!r}; expected <= {high}")


@dataclass(frozen=True)
class ModelSection:
    """The Trinity RLModule (``placement_rl.policies.trinity.TrinityRLModule``)."""

    hidden: int = 256
    """Hidden size of the schedule network's encoder and decoder LSTMs."""
    hidden_partition: tuple[int, int] = (64, 128)
    """Hidden sizes of the partition network."""
    dropout: float = 0.3
    """Dropout of the partition network (training pass only)."""
    c: float = 5.0
    """Logit range: logits are ``c * tanh(u / temperature)``."""
    temperature: float = 10.0
    """Softness of the ``tanh`` squashing."""
    logit_noise: float = 0.1
    """Largest uniform noise added to the logits while exploring early."""
    noise_steps: int = 500
    """Sampled actions (per EnvRunner) that get the noise."""

    def validate(self) -> None:
        _number("model", "hidden", self.hidden, low=1, integer=True)
        if len(self.hidden_partition) != 2:
            raise SchemaError(f"model.hidden_partition = {list(self.hidden_partition)}; expected two sizes")
        for h in self.hidden_partition:
            _number("model", "hidden_partition", h, low=1, integer=True)
        _number("model", "dropout", self.dropout, low=0, high=0.95)
        _number("model", "c", self.c, low=0, low_open=True)
        _number("model", "temperature", self.temperature, low=0, low_open=True)
        _number("model", "logit_noise", self.logit_noise, low=0)
        _number("model", "noise_steps", self.noise_steps, low=0, integer=True)

    def model_config(self) -> dict[str, Any]:
        return {**asdict(self), "hidden_partition": list(self.hidden_partition)}


@dataclass(frozen=True)
class PPOSection:
    """RLlib PPO's training options."""

    lr: float = 1e-3
    """Adam learning rate (Trinity reports 0.1 for its own scale of logits; 1e-3 suits this module)."""
    clip_param: float = 0.2
    """PPO's clip range epsilon."""
    entropy_coeff: float = 0.01
    """Entropy bonus."""
    grad_clip: float = 1.0
    """Gradient-norm clipping (Trinity: 1.0)."""
    train_batch_size: int = 64
    """Env steps (= sampled plans in one-shot mode) per training iteration."""
    minibatch_size: int = 32
    """SGD minibatch size."""
    num_epochs: int = 4
    """SGD passes over each batch."""
    vf_loss_coeff: float = 0.5
    """Weight of the value loss (the value head is the moving reward baseline)."""
    gamma: float = 1.0
    """Discount (one-step episodes in one-shot mode)."""
    lambda_: float = 1.0
    """GAE lambda (YAML key ``lambda_``)."""

    def validate(self) -> None:
        _number("ppo", "lr", self.lr, low=0, low_open=True)
        _number("ppo", "clip_param", self.clip_param, low=0, low_open=True)
        _number("ppo", "entropy_coeff", self.entropy_coeff, low=0)
        _number("ppo", "grad_clip", self.grad_clip, low=0, low_open=True)
        _number("ppo", "train_batch_size", self.train_batch_size, low=1, integer=True)
        _number("ppo", "minibatch_size", self.minibatch_size, low=1, integer=True)
        if self.minibatch_size > self.train_batch_size:
            raise SchemaError(
                f"ppo.minibatch_size = {self.minibatch_size}; expected <= train_batch_size ({self.train_batch_size})"
            )
        _number("ppo", "num_epochs", self.num_epochs, low=1, integer=True)
        _number("ppo", "vf_loss_coeff", self.vf_loss_coeff, low=0)
        _number("ppo", "gamma", self.gamma, low=0, high=1)
        _number("ppo", "lambda_", self.lambda_, low=0, high=1)


@dataclass(frozen=True)
class RunSection:
    """How long, where and on how many workers to train."""

    iterations: int = 50
    """Training iterations."""
    num_env_runners: int = 1
    """EnvRunner actors sampling in parallel (0: sample in the driver)."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (and always at the end)."""
    output_dir: str = "out/trinity"
    """Run directory: checkpoints, ``progress.csv``, TensorBoard events, the resolved config."""
    seed: int = 0
    """Seed of the env runners' envs and of torch."""

    def validate(self) -> None:
        _number("run", "iterations", self.iterations, low=1, integer=True)
        _number("run", "num_env_runners", self.num_env_runners, low=0, integer=True)
        _number("run", "checkpoint_every", self.checkpoint_every, low=1, integer=True)
        _number("run", "seed", self.seed, low=0, integer=True)
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise SchemaError(f"run.output_dir = {self.output_dir!r}; expected a directory path")


@dataclass(frozen=True)
class TrainConfig:
    """One training run (see the module docstring)."""

    name: str = "trinity"
    """Run name (also the default output folder name)."""
    env: Mapping[str, Any] = field(default_factory=dict)
    """``placement_rl/Placement-v0`` options; ``mode`` is forced to ``one_shot``."""
    model: ModelSection = field(default_factory=ModelSection)
    ppo: PPOSection = field(default_factory=PPOSection)
    run: RunSection = field(default_factory=RunSection)

    @classmethod
    def from_dict(cls, data: Any, where: str = "config") -> TrainConfig:
        top = _check(where, data, cls)
        env = top.get("env") or {}
        if not isinstance(env, Mapping):
            raise SchemaError(f"{where}.env: expected a mapping, got {env!r}")
        env = dict(env)
        if env.get("mode", "one_shot") != "one_shot":
            raise SchemaError(f"{where}.env.mode = {env['mode']!r}; Trinity trains in 'one_shot' mode")
        env["mode"] = "one_shot"
        from placement_rl.envs import PlacementConfig, make_generator, make_reward

        try:
            parsed = PlacementConfig.parse(env)
            make_generator(parsed.generator)  # unknown models / topologies fail here, not in a worker
            make_reward(parsed.reward, parsed.reward_options)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"{where}.env: {exc}") from None
        model = _check(f"{where}.model", top.get("model"), ModelSection)
        if "hidden_partition" in model:
            model["hidden_partition"] = tuple(model["hidden_partition"])
        cfg = cls(
            name=str(top.get("name", "trinity")),
            env=env,
            model=ModelSection(**model),
            ppo=PPOSection(**_check(f"{where}.ppo", top.get("ppo"), PPOSection)),
            run=RunSection(**_check(f"{where}.run", top.get("run"), RunSection)),
        )
        cfg.model.validate()
        cfg.ppo.validate()
        cfg.run.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["env"] = copy.deepcopy(dict(self.env))
        d["model"]["hidden_partition"] = list(self.model.hidden_partition)
        return d


SEARCH_KINDS = ("choice", "grid", "uniform", "loguniform", "randint")


@dataclass(frozen=True)
class SweepConfig:
    """A Tune sweep over a training config."""

    base: TrainConfig
    """The training config the trials start from (``base:`` path plus ``overrides:``)."""
    search: Mapping[str, tuple[str, tuple[Any, ...]]]
    """Dotted key -> (kind, values): ``{"ppo.lr": ("loguniform", (1e-4, 1e-2))}``."""
    num_samples: int = 4
    """Trials to sample (each grid point is repeated this many times)."""
    metric: str = "episode_return_mean"
    """The result to rank trials by (``episode_return_mean`` or ``best_speedup``)."""
    mode: str = "max"
    """``max`` or ``min``."""
    cpus_per_trial: int = 1
    """CPUs each trial reserves (the driver plus its env runners); trials never oversubscribe."""
    output_dir: str = "out/trinity_sweep"
    """Where Tune writes trials, the results table and the best config."""


_SWEEP_KEYS = ("base", "overrides", "search", "num_samples", "metric", "mode", "cpus_per_trial", "output_dir")
_SEARCHABLE = {
    "ppo": {f.name for f in fields(PPOSection)},
    "model": {f.name for f in fields(ModelSection)},
    "env": {
        "one_shot_groups",
        "reward_options.alpha",
        "reward_options.beta",
        "reward_options.gamma",
        "reward_options.c_hat_gb",
        "reward_options.m_hat_gib",
    },
}


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def set_dotted(config: dict[str, Any], key: str, value: Any) -> None:
    """Set ``config["a"]["b"] = value`` for ``key = "a.b"`` (creating mappings on the way)."""
    *path, last = key.split(".")
    node = config
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; errors name the file and position."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file {str(p)!r} does not exist")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise SchemaError(f"{p}: malformed YAML: {exc}") from None


def load_train_config(path: str | Path) -> TrainConfig:
    """Read and validate a training YAML file."""
    return TrainConfig.from_dict(read_yaml(path), where=str(path))


def load_sweep_config(path: str | Path) -> SweepConfig:
    """Read and validate a sweep YAML file (its ``base`` is resolved relative to it)."""
    data = read_yaml(path)
    where = str(path)
    if not isinstance(data, Mapping):
        raise SchemaError(f"{where}: expected a mapping at the top level")
    unknown = sorted(set(data) - set(_SWEEP_KEYS))
    if unknown:
        raise SchemaError(f"{where}: unknown key(s) {unknown}; valid keys: {list(_SWEEP_KEYS)}")
    if "base" not in data:
        raise SchemaError(f"{where}: missing 'base' (the training config file the sweep starts from)")
    base_path = Path(path).parent / str(data["base"])
    base_raw = read_yaml(base_path)
    overrides = data.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise SchemaError(f"{where}.overrides: expected a mapping")
    base = TrainConfig.from_dict(_merge(base_raw or {}, overrides), where=f"{base_path} + {where}.overrides")
    search_raw = data.get("search") or {}
    if not isinstance(search_raw, Mapping) or not search_raw:
        raise SchemaError(f"{where}.search: expected a non-empty mapping of dotted keys to search domains")
    search: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for key, domain in search_raw.items():
        section, _, rest = str(key).partition(".")
        if section not in _SEARCHABLE or rest not in _SEARCHABLE[section]:
            valid = sorted(f"{s}.{k}" for s, ks in _SEARCHABLE.items() for k in ks)
            raise SchemaError(f"{where}.search: unknown key {key!r}; searchable keys: {valid}")
        if not isinstance(domain, Mapping) or len(domain) != 1:
            raise SchemaError(
                f"{where}.search.{key}: expected one of {{kind: values}} with kind in {list(SEARCH_KINDS)}"
            )
        ((kind, values),) = domain.items()
        if kind not in SEARCH_KINDS:
            raise SchemaError(f"{where}.search.{key}: unknown kind {kind!r}; expected one of {list(SEARCH_KINDS)}")
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{where}.search.{key}.{kind}: expected a non-empty list, got {values!r}")
        if kind in ("uniform", "loguniform", "randint") and len(values) != 2:
            raise SchemaError(f"{where}.search.{key}.{kind}: expected [low, high], got {values!r}")
        search[str(key)] = (kind, tuple(values))
    cfg = SweepConfig(
        base=base,
        search=search,
        num_samples=data.get("num_samples", 4),
        metric=data.get("metric", "episode_return_mean"),
        mode=data.get("mode", "max"),
        cpus_per_trial=data.get("cpus_per_trial", 1),
        output_dir=data.get("output_dir", "out/trinity_sweep"),
    )
    _number(where, "num_samples", cfg.num_samples, low=1, integer=True)
    _number(where, "cpus_per_trial", cfg.cpus_per_trial, low=1, integer=True)
    if cfg.mode not in ("max", "min"):
        raise SchemaError(f"{where}.mode = {cfg.mode!r}; expected 'max' or 'min'")
    if cfg.metric not in ("episode_return_mean", "best_speedup"):
        raise SchemaError(f"{where}.metric = {cfg.metric!r}; expected 'episode_return_mean' or 'best_speedup'")
    return cfg

"""Training and sweep configuration: YAML -> validated frozen dataclasses, for any registered agent.

A training file (``tune_configs/trinity_ppo.yaml``) has ``name``, ``agent`` (a registered agent,
:mod:`placement_rl.rl.agents`; ``trinity`` when absent), ``env`` (options of the agent's environment,
validated by the environment's own config), ``run`` (:class:`RunSection`), and the agent's own
sections (Trinity: ``model`` and ``ppo``), each a config dataclass with a docstring per field.

A sweep file (``tune_configs/trinity_sweep.yaml``) names a training file as its ``base``, may
override its values, and gives a search space over dotted keys (``ppo.lr: {loguniform: [1e-4,
1e-2]}``): any field of the agent's sections, or one of the env keys the agent lists.

Every record goes through :func:`placement_rl.config.parse`: unknown keys are errors that list the
valid keys, values are checked (numbers must be finite), malformed YAML is an error that names the
file and line. This module reads files; the algorithms and envs never do.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement_rl.config import as_mapping, check_known, choice, integer, option, parse, text
from placement_rl.errors import SchemaError
from placement_rl.rl.agents import Agent, get_agent

#: Top-level keys every training file may have, besides its agent's sections.
COMMON_KEYS = ("name", "agent", "env", "run")


@dataclass(frozen=True)
class RunSection:
    """How long, where and on how many workers to train."""

    iterations: int = option(50, rule=integer(1))
    """Training iterations."""
    num_env_runners: int = option(1, rule=integer(0))
    """EnvRunner actors sampling in parallel (0: sample in the driver)."""
    checkpoint_every: int = option(10, rule=integer(1))
    """Save a checkpoint every this many iterations (and always at the end)."""
    output_dir: str = option("out/trinity", rule=text())
    """Run directory: checkpoints, ``progress.csv``, TensorBoard events, the resolved config."""
    seed: int = option(0, rule=integer(0))
    """Seed of the env runners' envs and of torch."""


def env_config_class(env_id: str) -> Any:
    """The config class of a registered environment (``placement_rl/Placement-v0`` -> PlacementConfig)."""
    from placement_rl.envs.registry import ENV_IDS
    from placement_rl.errors import UnknownNameError

    if env_id not in ENV_IDS:
        raise UnknownNameError("environment", env_id, ENV_IDS)
    module, cls = ENV_IDS[env_id].split(":")
    return getattr(importlib.import_module(module), cls).config_class


def check_env(agent: Agent, env: Any, where: str) -> dict[str, Any]:
    """The agent's env options: the YAML's, with the agent's required options, checked in full here
    (an unknown model or topology fails now, not inside a Ray worker)."""
    from placement_rl.envs import make_generator, make_reward

    options = as_mapping(env, where)
    for key, value in agent.env_options.items():
        if key in options and options[key] != value:
            raise SchemaError(f"{where}.{key} = {options[key]!r}; the {agent.name} agent needs {value!r}")
        options[key] = value
    try:
        parsed = env_config_class(agent.env_id).parse(options)
        make_generator(parsed.generator)
        make_reward(parsed.reward, parsed.reward_options)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{where}: {exc}") from None
    return options


@dataclass(frozen=True)
class TrainConfig:
    """One training run (see the module docstring).

    Attributes:
        name: run name (also the default output folder name).
        agent: the registered agent's name.
        env: the agent's environment options (its required options applied).
        run: how long and where to train.
        sections: the agent's own sections by name (``cfg.ppo`` reads ``sections["ppo"]``).
    """

    name: str = "trinity"
    agent: str = "trinity"
    env: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    run: RunSection = dataclasses.field(default_factory=RunSection)
    sections: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute or agent section {name!r}")

    @property
    def agent_spec(self) -> Agent:
        return get_agent(self.agent)

    @classmethod
    def from_dict(cls, data: Any, where: str = "config") -> TrainConfig:
        top = as_mapping(data, where)
        name = top.get("agent", "trinity")
        if not isinstance(name, str):
            raise SchemaError(f"{where}: agent = {name!r}; expected the name of a registered agent")
        agent = get_agent(name)
        check_known(top, [*COMMON_KEYS, *agent.sections], where)
        run_name = top.get("name", agent.name)
        if not isinstance(run_name, str) or not run_name:
            raise SchemaError(f"{where}: name = {run_name!r}; expected a non-empty string")
        return cls(
            name=run_name,
            agent=agent.name,
            env=check_env(agent, top.get("env"), f"{where}.env"),
            run=parse(RunSection, top.get("run"), f"{where}.run"),
            sections={key: parse(section, top.get(key), f"{where}.{key}") for key, section in agent.sections.items()},
        )

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as YAML/JSON data (what ``train_config.json`` holds)."""
        out: dict[str, Any] = {
            "name": self.name,
            "agent": self.agent,
            "env": copy.deepcopy(dict(self.env)),
            "run": dataclasses.asdict(self.run),
        }
        for key, section in self.sections.items():
            out[key] = _plain(dataclasses.asdict(section))
        return out

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with top-level fields or whole sections replaced (``run=...``, ``ppo=...``)."""
        sections = dict(self.sections)
        for key in [k for k in changes if k in sections]:
            sections[key] = changes.pop(key)
        return dataclasses.replace(self, sections=sections, **changes)


def _plain(value: Any) -> Any:
    """Tuples as lists, so the dict round-trips through YAML and JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ------------------------------------------------------------------------------------------ sweeps
SEARCH_KINDS = ("choice", "grid", "uniform", "loguniform", "randint")


@dataclass(frozen=True)
class SweepOptions:
    """The options of a sweep file besides ``base``, ``overrides`` and ``search``."""

    num_samples: int = option(4, rule=integer(1))
    """Trials to sample (each grid point is repeated this many times)."""
    metric: str = option("episode_return_mean", rule=choice(("episode_return_mean", "best_speedup")))
    """The result to rank trials by."""
    mode: str = option("max", rule=choice(("max", "min")))
    """``max`` or ``min``."""
    cpus_per_trial: int = option(1, rule=integer(1))
    """CPUs each trial reserves (the driver plus its env runners); trials never oversubscribe."""
    output_dir: str = option("out/sweep", rule=text())
    """Where Tune writes trials, the results table and the best config."""


@dataclass(frozen=True)
class SweepConfig:
    """A Tune sweep over a training config.

    Attributes:
        base: the training config the trials start from (``base:`` path plus ``overrides:``).
        search: dotted key -> (kind, values): ``{"ppo.lr": ("loguniform", (1e-4, 1e-2))}``.
        options: trials, metric, resources and output folder.
    """

    base: TrainConfig
    search: Mapping[str, tuple[str, tuple[Any, ...]]]
    options: SweepOptions = dataclasses.field(default_factory=SweepOptions)

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options")
        if options is not None and name in {f.name for f in dataclasses.fields(SweepOptions)}:
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")


def searchable_keys(cfg: TrainConfig) -> list[str]:
    """The dotted keys a sweep over ``cfg`` may vary."""
    agent = cfg.agent_spec
    keys = [f"{s}.{f.name}" for s, cls in agent.sections.items() for f in dataclasses.fields(cls)]
    return sorted([*keys, *(f"env.{k}" for k in agent.searchable_env)])


def _check_domain(where: str, kind: str, values: list[Any]) -> None:
    """A search domain's shape: ranges ``[low, high]`` with ``low < high`` (``low > 0`` for ``loguniform``,
    integers for ``randint``), finite numbers. Whether a trial can run with the values is
    :func:`check_search_values`'."""
    if kind not in ("uniform", "loguniform", "randint"):
        return
    if len(values) != 2:
        raise SchemaError(f"{where}: expected [low, high], got {values!r}")
    integer = kind == "randint"
    for v in values:
        ok = isinstance(v, int) if integer else isinstance(v, (int, float)) and math.isfinite(v)
        if isinstance(v, bool) or not ok:
            raise SchemaError(f"{where}: {v!r} is not {'an integer' if integer else 'a finite number'}")
    low, high = values
    if not low < high:
        raise SchemaError(f"{where}: expected low < high, got [{low}, {high}]")
    if kind == "loguniform" and low <= 0:
        raise SchemaError(f"{where}: expected 0 < low for a log-uniform domain, got [{low}, {high}]")


#: A value that fails the trial config's check with the base's values of the other searched keys is tried
#: with up to this many combinations of their candidate values (:func:`domain_candidates`) before it is refused
#: (a value may be valid only beside another key's value, e.g. a minibatch size beside a larger batch).
MAX_SWEEP_COMBINATIONS = 4096


def domain_candidates(kind: str, values: Sequence[Any]) -> list[tuple[str, Any]]:
    """The values of a search domain that stand for all its samples, each with what it is: every value of
    a ``choice`` or ``grid``; a range's ends (``uniform`` and ``loguniform`` sample floats in ``[low, high]``;
    ``randint`` integers in ``[low, high)``, so ``high - 1``). The fields' rules are ranges, so a range whose
    ends pass passes throughout."""
    if kind in ("choice", "grid"):
        return [("value", v) for v in values]
    low, high = values
    if kind == "randint":
        return [("low end", low), ("largest value (high - 1; randint excludes high)", high - 1)]
    return [("low end", float(low)), ("high end", float(high))]


def _trial_error(resolved: Mapping[str, Any], values: Mapping[str, Any]) -> str | None:
    """Why a trial with ``values`` (dotted key -> value) set in the ``resolved`` base config cannot run;
    ``None`` when its config passes :meth:`TrainConfig.from_dict`."""
    config = copy.deepcopy(dict(resolved))
    for key, value in values.items():
        set_dotted(config, key, copy.deepcopy(value))
    try:
        TrainConfig.from_dict(config, where="trial")
    except (SchemaError, ValueError, TypeError) as exc:
        return str(exc)
    return None


def check_search_values(base: TrainConfig, search: Mapping[str, tuple[str, Sequence[Any]]], where: str) -> None:
    """Refuse a sweep with a value no trial can run, before any trial starts: every value of a
    ``choice`` / ``grid`` and both ends of a range (:func:`domain_candidates`) must pass the field's own
    validation in the trial's config (:meth:`TrainConfig.from_dict`), beside the base's values of the
    other searched keys or, failing that, some combination of their candidate values.

    Raises:
        SchemaError: naming the searched key, the domain, the bad value and the field's complaint.
    """
    resolved = base.to_dict()
    candidates = {key: domain_candidates(kind, values) for key, (kind, values) in search.items()}
    for key, (kind, _) in search.items():
        others = [k for k in search if k != key]
        for what, value in candidates[key]:
            error = _trial_error(resolved, {key: value})
            if error is None:
                continue
            combos = itertools.islice(itertools.product(*(candidates[k] for k in others)), MAX_SWEEP_COMBINATIONS)
            if any(
                _trial_error(resolved, {key: value, **{k: v for k, (_, v) in zip(others, combo, strict=True)}}) is None
                for combo in combos
            ):
                continue
            hint = ""
            if kind in ("uniform", "loguniform") and float(value).is_integer():
                if _trial_error(resolved, {key: int(value)}) is None:
                    hint = f"; {kind} samples floats: for an integer field, expected randint or choice"
            raise SchemaError(
                f"{where}.search.{key}.{kind}: {what}: {value!r} is not a valid {key}, so no trial could run with "
                f"it ({error}){hint}"
            )


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
    from placement_rl.rl.yaml_files import read_yaml_file

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config file {str(p)!r} does not exist")
    return read_yaml_file(p)


def load_train_config(path: str | Path) -> TrainConfig:
    """Read and validate a training YAML file (an empty file is an error, not the default config)."""
    data = read_yaml(path)
    if data is None:
        raise SchemaError(
            f"{path}: the file is empty; expected a mapping with {list(COMMON_KEYS)} and the agent's sections"
        )
    return TrainConfig.from_dict(data, where=str(path))


def apply_sweep_sets(data: Mapping[str, Any], sets: Sequence[str], where: str) -> dict[str, Any]:
    """A sweep document with ``KEY=VALUE`` settings applied (``VALUE`` read as YAML).

    ``KEY`` is a sweep option (``num_samples``, ``metric``, ``mode``, ``cpus_per_trial``,
    ``output_dir``), ``search.<dotted key>`` (a search domain, ``search.ppo.lr={grid: [0.001]}``) or
    any other dotted key of the training config, which joins the file's ``overrides``
    (``run.iterations=2``): a smaller run of a shipped sweep without editing the file.
    """
    from placement_rl.rl.yaml_files import loads_yaml

    doc = copy.deepcopy(dict(data))
    options = [f.name for f in dataclasses.fields(SweepOptions)]
    for item in sets:
        key, equals, text = item.partition("=")
        if not equals or not key or key.startswith(".") or key.endswith(".") or key in ("base", "overrides", "search"):
            raise SchemaError(
                f"--set {item!r}; expected KEY=VALUE with KEY one of {options}, search.<key> or a dotted key of "
                "the training config (run.iterations=2)"
            )
        value = loads_yaml(text, f"--set {item!r}")
        if key in options:
            doc[key] = value
        elif key.startswith("search."):
            search = doc.get("search")
            doc["search"] = {**(dict(search) if isinstance(search, Mapping) else {}), key[len("search.") :]: value}
        else:
            overrides = doc.get("overrides")
            merged = copy.deepcopy(dict(overrides)) if isinstance(overrides, Mapping) else {}
            set_dotted(merged, key, value)
            doc["overrides"] = merged
    return doc


def load_sweep_config(path: str | Path, sets: Sequence[str] = ()) -> SweepConfig:
    """Read and validate a sweep YAML file (its ``base`` is resolved relative to it), with ``--set``
    settings (:func:`apply_sweep_sets`) applied first."""
    where = str(path) + (f" with --set {' '.join(sets)}" if sets else "")
    data = apply_sweep_sets(as_mapping(read_yaml(path), str(path)), sets, where)
    check_known(data, ["base", "overrides", "search", *(f.name for f in dataclasses.fields(SweepOptions))], where)
    if "base" not in data:
        raise SchemaError(f"{where}: missing 'base' (the training config file the sweep starts from)")
    base_path = Path(path).parent / str(data["base"])
    if base_path.suffix not in (".yaml", ".yml"):
        raise SchemaError(f"{where}: base = {data['base']!r}; expected a training YAML file (.yaml or .yml)")
    overrides = as_mapping(data.get("overrides"), f"{where}.overrides")
    base = TrainConfig.from_dict(
        _merge(read_yaml(base_path) or {}, overrides), where=f"{base_path} + {where}.overrides"
    )
    search_raw = data.get("search")
    if not isinstance(search_raw, Mapping) or not search_raw:
        raise SchemaError(f"{where}.search: expected a non-empty mapping of dotted keys to search domains")
    valid = searchable_keys(base)
    search: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for key, domain in search_raw.items():
        if key not in valid:
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
        _check_domain(f"{where}.search.{key}.{kind}", kind, values)
        search[str(key)] = (kind, tuple(values))
    check_search_values(base, search, where)
    options = parse(SweepOptions, {k: v for k, v in data.items() if k not in ("base", "overrides", "search")}, where)
    return SweepConfig(base=base, search=search, options=options)

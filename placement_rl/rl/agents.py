"""Learned agents, registered by name: the trainer, Tune, evaluation and ``plan --checkpoint`` look
them up here and never name one.

An :class:`Agent` says which environment it acts in (and the env options it needs), which YAML
sections configure it (each a config dataclass, :mod:`placement_rl.config`), how to build its RLlib
algorithm from a :class:`~placement_rl.rl.config.TrainConfig`, how to build its (untrained) module,
and how to make one plan with it. A run directory records its agent's name in
``train_config.json``, so a checkpoint finds its agent by itself.

**Trained policies are loaded from a safe export, never from RLlib's pickles.** Every checkpoint
the trainer writes holds, beside RLlib's own files, ``policy.pt`` (the module's weights: a state
dict of tensors, read with ``torch.load(..., weights_only=True)``, which runs no code) and
``policy.json`` (the agent's name and the module's config). :func:`load_policy` (``evaluate``,
``plan --checkpoint``, comparisons) reads only those two files and the run's
``train_config.json``; RLlib's pickled state (``class_and_ctor_args.pkl``, ...) is read only by
``placement-rl train --resume``, and only from a folder the user trusts.

Built-in agents are imported on first use (:data:`BUILTIN_AGENTS`); another agent registers with
:func:`register_agent` when its module is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from placement_rl.errors import UnknownNameError

if TYPE_CHECKING:
    from placement_rl.graph import OpGraph
    from placement_rl.methods import Method
    from placement_rl.plan import Plan
    from placement_rl.rl.config import TrainConfig
    from placement_rl.topology import DeviceTopology

#: name -> module that registers the agent when imported.
BUILTIN_AGENTS: dict[str, str] = {
    "trinity": "placement_rl.rl.trinity",
    "tag": "placement_rl.rl.tag",
    "ppo_tag": "placement_rl.rl.ppo_tag",
}

#: The file of a run directory that records its resolved training config (and so its agent).
CONFIG_FILE = "train_config.json"
#: The safe policy export inside every checkpoint folder: weights (tensors only) and their description.
POLICY_WEIGHTS, POLICY_INFO = "policy.pt", "policy.json"
POLICY_FORMAT = "placement_rl.policy"


@dataclass(frozen=True)
class Agent:
    """A learned placement agent.

    Attributes:
        name: the registry name (the ``agent:`` key of a training YAML).
        description: one line for listings.
        env_id: the Gymnasium id it acts in (``placement_rl/Placement-v0``).
        env_options: env options the agent requires (they override the YAML's ``env``).
        sections: YAML section name -> config dataclass (parsed with :func:`placement_rl.config.parse`).
        searchable_env: the ``env.*`` keys a Tune sweep may vary.
        algorithm: ``TrainConfig -> RLlib AlgorithmConfig`` (not yet built).
        learner_metrics: the learner's result keys reported per iteration (e.g. ``policy_loss``).
        build_module: ``TrainConfig -> module``: the agent's module with fresh weights, its spaces
            taken from the configured environment (the safe export's weights are loaded into it).
        act: ``(module, env) -> final info`` of one deterministic episode (``info["plan"]``).
        padded_env: env keys that only pad the observation (and TAG's subset count, which the
            module scores slice by slice): the module's weights do not depend on them, so
            :func:`policy_env` raises them to fit an instance larger than the training config
            (:data:`PADDED_SIZES`). Empty: the training config's sizes are the limit.
    """

    name: str
    description: str
    env_id: str
    env_options: Mapping[str, Any]
    sections: Mapping[str, type]
    algorithm: Callable[[TrainConfig], Any]
    build_module: Callable[[TrainConfig], Any]
    act: Callable[[Any, Any], dict[str, Any]]
    searchable_env: frozenset[str] = frozenset()
    learner_metrics: tuple[str, ...] = ()
    padded_env: frozenset[str] = frozenset()


_AGENTS: dict[str, Agent] = {}


def register_agent(agent: Agent) -> Agent:
    """Make ``agent`` known by its name."""
    _AGENTS[agent.name] = agent
    return agent


def agent_names() -> list[str]:
    """Every agent name, built-in ones included."""
    return sorted({*_AGENTS, *BUILTIN_AGENTS})


def get_agent(name: str) -> Agent:
    """The agent called ``name`` (importing a built-in one on first use)."""
    if name not in _AGENTS and name in BUILTIN_AGENTS:
        importlib.import_module(BUILTIN_AGENTS[name])
    if name not in _AGENTS:
        raise UnknownNameError("agent", name, agent_names())
    return _AGENTS[name]


# --------------------------------------------------------------------------- trained policies
@dataclass(frozen=True)
class Policy:
    """A trained module with its training config and agent."""

    agent: Agent
    config: TrainConfig
    module: Any
    checkpoint: Path


def run_config_path(checkpoint: str | Path) -> Path:
    """The ``train_config.json`` of the run a checkpoint folder belongs to (itself or a parent)."""
    ckpt = Path(checkpoint)
    if not ckpt.exists():
        raise FileNotFoundError(f"checkpoint {str(ckpt)!r} does not exist")
    found = next((d / CONFIG_FILE for d in (ckpt, *ckpt.parents) if (d / CONFIG_FILE).is_file()), None)
    if found is None:
        raise FileNotFoundError(f"no {CONFIG_FILE} in {str(ckpt)!r} or its parents; is it a placement-rl run?")
    return found


def export_policy(module: Any, config: TrainConfig, checkpoint: str | Path) -> Path:
    """Write the safe export of ``module`` into the checkpoint folder: ``policy.pt`` (its state dict,
    tensors only) and ``policy.json``. Returns the folder."""
    import torch

    from placement_rl.io import write_json

    folder = Path(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    tmp = folder / (POLICY_WEIGHTS + ".tmp")
    torch.save(state, tmp)
    tmp.replace(folder / POLICY_WEIGHTS)
    write_json(
        folder / POLICY_INFO,
        {
            "format": POLICY_FORMAT,
            "schema_version": 1,
            "agent": config.agent,
            "run": config.name,
            "tensors": len(state),
        },
    )
    return folder


def load_policy(checkpoint: str | Path) -> Policy:
    """The trained policy of a checkpoint folder (``checkpoint_*`` of a run directory), from its safe
    export (``policy.pt`` + ``policy.json``): no pickle is read, so a crafted folder runs no code.

    Raises:
        FileNotFoundError: when the folder, its run's ``train_config.json`` or the export is missing.
        ValueError: when the export does not match the run's agent or module.
    """
    import pickle

    import torch

    from placement_rl.io import check_header, read_json
    from placement_rl.rl.config import TrainConfig

    folder = Path(checkpoint)
    path = run_config_path(folder)
    config = TrainConfig.from_dict(read_json(path), where=str(path))
    weights, info = folder / POLICY_WEIGHTS, folder / POLICY_INFO
    if not (weights.is_file() and info.is_file()):
        raise FileNotFoundError(
            f"{str(folder)!r} has no policy export ({POLICY_WEIGHTS} and {POLICY_INFO}); policies are loaded only "
            "from that export, never from RLlib's pickled state (a checkpoint_* folder written by placement-rl train)"
        )
    document = read_json(info)
    check_header(document, POLICY_FORMAT, (1,))
    if document.get("agent") != config.agent:
        raise ValueError(f"{info}: agent {document.get('agent')!r}, but the run trained {config.agent!r}")
    agent = get_agent(config.agent)
    module = agent.build_module(config)
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        module.load_state_dict(state)
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, KeyError, TypeError) as exc:
        # weights_only=True refuses every global but tensors and containers: a crafted file stops here.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{weights}: not a state dict of the {agent.name} module of this run ({first})") from None
    module.eval()
    return Policy(agent, config, module, folder)


class GivenInstance:
    """An instance generator that always yields one graph on one topology (what a method is asked;
    training on one instance, :func:`placement_rl.rl.train.train_on_instance`)."""

    def __init__(self, graph: OpGraph, topology: DeviceTopology) -> None:
        self.graph = graph
        self.topology = topology
        self._instances: dict[int, Any] = {}

    def sample(self, rng: np.random.Generator, max_groups: int) -> Any:
        """The instance, the same object every episode: the env caches its features and baseline by
        identity, so a fresh instance per reset would rebuild them (node2vec, the DP simulation) each time."""
        from placement_rl.envs import make_instance

        if max_groups not in self._instances:
            self._instances[max_groups] = make_instance(self.graph, self.topology, max_groups)
        return self._instances[max_groups]


_GivenInstance = GivenInstance  # the name benchmarks/tag.py imports


#: The padded sizes :func:`policy_env` may raise (:attr:`Agent.padded_env`), in the order it sets them.
PADDED_SIZES: tuple[str, ...] = ("max_nodes", "max_edges", "max_devices", "max_device_groups", "max_subsets")


def sized_env_options(agent: Agent, options: Mapping[str, Any], instance: GivenInstance) -> dict[str, Any]:
    """``options`` (an env config without its generator) with the padded sizes of
    :attr:`Agent.padded_env` raised where ``instance`` needs more: node rows to its op groups, edge
    columns to its group graph's tensors, device rows to its GPUs, device-group rows to its device
    groups and TAG's subsets to at least every device group plus all of them together. Sizes the
    instance fits are kept (a checkpoint plans with the padding it was trained with)."""
    from placement_rl.rl.config import env_config_class
    from placement_rl.search.tag import DEVICE_GROUPINGS, device_groups

    out = dict(options)
    keys = [k for k in PADDED_SIZES if k in agent.padded_env]
    if not keys:
        return out
    cfg = env_config_class(agent.env_id).parse(out)
    groups = instance.sample(np.random.default_rng(0), cfg.groups_per_instance).groups
    grouping = getattr(cfg, "device_grouping", "machine")
    K = len(device_groups(instance.topology, grouping if grouping in DEVICE_GROUPINGS else "machine"))
    needs = {
        "max_nodes": (cfg.nodes, groups.num_ops),
        "max_edges": (cfg.edges, len(groups.tensors)),
        "max_devices": (cfg.max_devices, instance.topology.num_devices),
        "max_device_groups": (getattr(cfg, "max_device_groups", K), K),
        "max_subsets": (getattr(cfg, "max_subsets", K + 1), K + (K > 1)),
    }
    for key in keys:
        have, need = needs[key]
        if need > have:
            out[key] = need
            if key == "max_nodes" and "max_edges" not in out:  # keep the default edge room per node row
                out["max_edges"] = max(cfg.edges, 8 * need)
    return out


def policy_env(policy: Policy, graph: OpGraph, topology: DeviceTopology) -> Any:
    """The agent's environment, configured as in training, on ``graph`` x ``topology``; the sizes
    the agent lists as padding only (:attr:`Agent.padded_env`) raised to fit the instance."""
    import gymnasium as gym

    import placement_rl.envs  # noqa: F401  (registers the ids)

    options = {k: v for k, v in policy.config.env.items() if k != "generator"}
    instance = GivenInstance(graph, topology)
    options = sized_env_options(policy.agent, options, instance)
    return gym.make(policy.agent.env_id, config={**options, "generator": instance})


def policy_plan(policy: Policy, graph: OpGraph, topology: DeviceTopology) -> Plan:
    """The plan the trained policy makes for ``graph`` on ``topology`` (deterministic)."""
    info = policy.agent.act(policy.module, policy_env(policy, graph, topology))
    plan: Plan = info["plan"]
    return plan


def policy_method(checkpoint: Policy | str | Path, name: str | None = None) -> Method:
    """A :class:`~placement_rl.methods.Method` planning with a trained policy (named after its agent)."""
    from placement_rl.methods import Method

    policy = checkpoint if isinstance(checkpoint, Policy) else load_policy(checkpoint)
    return Method(
        name or policy.agent.name,
        lambda problem: policy_plan(policy, problem.graph, problem.topology),
        f"{policy.agent.description} ({policy.checkpoint})",
    )

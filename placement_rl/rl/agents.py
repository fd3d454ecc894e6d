"""Learned agents, registered by name: the trainer, Tune, evaluation and ``plan --checkpoint`` look
them up here and never name one.

An :class:`Agent` says which environment it acts in (and the env options it needs), which YAML
sections configure it (each a config dataclass, :mod:`placement_rl.config`), how to build its RLlib
algorithm from a :class:`~placement_rl.rl.config.TrainConfig`, how to build its (untrained) module,
and how to make one plan with it. A run directory records its agent's name in
``train_config.json``, so a checkpoint finds its agent by itself.

**Trained policies are loaded from a safe export, never from a pickle.** Every checkpoint the
trainer writes holds, beside RLlib's own files, ``policy.npz`` (the module's weights: numpy arrays
in a zip, read with ``numpy.load(..., allow_pickle=False)``, which refuses any object and runs no
code) and ``policy.json`` (the agent's name and the module's config).
:func:`placement_rl.rl.policy.load_policy` (``evaluate``, ``plan --checkpoint``, comparisons)
reads only those two files and the run's ``train_config.json``; RLlib's pickled state
(``class_and_ctor_args.pkl``, ...) is read only by ``placement-rl train --resume``, and only from a
folder the user trusts.

Built-in agents are imported on first use (:data:`BUILTIN_AGENTS`); another agent registers with
:func:`register_agent` when its module is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from placement_rl.errors import UnknownNameError

if TYPE_CHECKING:
    from placement_rl.rl.config import TrainConfig

#: name -> module that registers the agent when imported.
BUILTIN_AGENTS: dict[str, str] = {
    "trinity": "placement_rl.rl.trinity",
    "tag": "placement_rl.rl.tag",
    "ppo_tag": "placement_rl.rl.ppo_tag",
}

#: The file of a run directory that records its resolved training config (and so its agent).
CONFIG_FILE = "train_config.json"
#: The safe policy export inside every checkpoint folder: weights (tensors only) and their description.
POLICY_WEIGHTS, POLICY_INFO = "policy.npz", "policy.json"
#: The weights file of exports written before they were pickle-free (refused, with what to do).
OLD_POLICY_WEIGHTS = "policy.pt"
POLICY_FORMAT = "placement_rl.policy"
#: The padded sizes :func:`placement_rl.rl.policy.policy_env` may raise (:attr:`Agent.padded_env`), in
#: the order it sets them.
PADDED_SIZES: tuple[str, ...] = ("max_nodes", "max_edges", "max_devices", "max_device_groups", "max_subsets")


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

"""Trained policies: the safe export a checkpoint holds (``policy.npz`` weights and ``policy.json``),
loading it back without reading a pickle (:func:`load_policy`), and planning with it
(:func:`policy_env`, :func:`policy_plan`, :func:`policy_method`).

Agents themselves are registered in :mod:`placement_rl.rl.agents`; a policy also needs its run's
training config (:mod:`placement_rl.rl.config`), which needs the registry, so the two live apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from placement_rl.rl.agents import (
    CONFIG_FILE,
    OLD_POLICY_WEIGHTS,
    PADDED_SIZES,
    POLICY_FORMAT,
    POLICY_INFO,
    POLICY_WEIGHTS,
    Agent,
    get_agent,
)
from placement_rl.rl.config import TrainConfig, env_config_class

if TYPE_CHECKING:
    from placement_rl.graph import OpGraph
    from placement_rl.methods import Method
    from placement_rl.plan import Plan
    from placement_rl.topology import DeviceTopology


@dataclass(frozen=True)
class Policy:
    """A trained module with its training config and agent."""

    agent: Agent
    config: TrainConfig
    module: Any
    checkpoint: Path


#: Env options a trained policy may plan with other than its training values (:func:`with_env`): how
#: finely a model is cut into op groups (the agents' GNNs and priors are size-agnostic, so a policy
#: trained at 20 groups can plan at 60), how TAG's partial plans are completed, and the padded sizes.
PLANNING_ENV_KEYS = ("max_groups", "tag_completion", *PADDED_SIZES)


def with_env(policy: Policy, overrides: Mapping[str, Any]) -> Policy:
    """``policy`` planning with env options changed from its training config (``{"max_groups": 60}``).

    Only :data:`PLANNING_ENV_KEYS` may change: the others (the action space, the options, the
    reward, the features) shape what the module was trained to read.

    Raises:
        ValueError: for a key outside :data:`PLANNING_ENV_KEYS` (naming the allowed ones) or a value
            the agent's env config refuses (naming the key and what it expects).
    """
    if not overrides:
        return policy
    bad = sorted(k for k in overrides if k not in PLANNING_ENV_KEYS)
    if bad:
        raise ValueError(
            f"env option(s) {bad} cannot change for a trained policy: they shape what its module reads; "
            f"expected some of {list(PLANNING_ENV_KEYS)}"
        )
    env = {**policy.config.env, **overrides}
    env_config_class(policy.agent.env_id).parse({k: v for k, v in env.items() if k != "generator"})
    config = dataclasses.replace(policy.config, env=env)
    return dataclasses.replace(policy, config=config)


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
    """Write the safe export of ``module`` into the checkpoint folder: ``policy.npz`` (its state dict as
    numpy arrays, no pickle) and ``policy.json``. Returns the folder."""
    from placement_rl.io import write_json

    folder = Path(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
    tmp = folder / (POLICY_WEIGHTS + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **state)
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
    export (``policy.npz`` + ``policy.json``): no pickle is read, so a crafted folder runs no code.

    Raises:
        FileNotFoundError: when the folder, its run's ``train_config.json`` or the export is missing.
        ValueError: when the export does not match the run's agent or module.
    """
    import zipfile

    import torch

    from placement_rl.io import check_header, read_json
    from placement_rl.rl.config import TrainConfig

    folder = Path(checkpoint)
    path = run_config_path(folder)
    config = TrainConfig.from_dict(read_json(path), where=str(path))
    weights, info = folder / POLICY_WEIGHTS, folder / POLICY_INFO
    if not weights.exists() and (folder / OLD_POLICY_WEIGHTS).is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} holds {OLD_POLICY_WEIGHTS}, the weights format of earlier versions, which is a pickle "
            f"and is no longer read; train the policy again (placement-rl train) to get {POLICY_WEIGHTS}"
        )
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
        with np.load(weights, allow_pickle=False) as arrays:
            state = {k: torch.from_numpy(arrays[k].copy()) for k in arrays.files}
        module.load_state_dict(state)
    except (
        zipfile.BadZipFile,
        OSError,
        EOFError,
        RuntimeError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
    ) as exc:
        # allow_pickle=False refuses every object array: a crafted file stops here, and nothing runs.
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


def sized_env_options(agent: Agent, options: Mapping[str, Any], instance: GivenInstance) -> dict[str, Any]:
    """``options`` (an env config without its generator) with the padded sizes of
    :attr:`Agent.padded_env` raised where ``instance`` needs more: node rows to its op groups, edge
    columns to its group graph's tensors, device rows to its GPUs, device-group rows to its device
    groups and TAG's subsets to at least every device group plus all of them together. Sizes the
    instance fits are kept (a checkpoint plans with the padding it was trained with)."""
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


def policy_method(
    checkpoint: Policy | str | Path, name: str | None = None, env: Mapping[str, Any] | None = None
) -> Method:
    """A :class:`~placement_rl.methods.Method` planning with a trained policy (named after its agent),
    with the env options ``env`` changed from training (:func:`with_env`)."""
    from placement_rl.methods import Method

    policy = with_env(checkpoint if isinstance(checkpoint, Policy) else load_policy(checkpoint), env or {})
    return Method(
        name or policy.agent.name,
        lambda problem: policy_plan(policy, problem.graph, problem.topology),
        f"{policy.agent.description} ({policy.checkpoint})",
    )

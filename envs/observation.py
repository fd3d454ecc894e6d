"""The padded ``Dict`` observation both environments share (RLlib takes no ``spaces.Graph``).

Every field has a fixed shape set by the env config's maxima, so one policy serves instances of
any size up to them. Padding rows are all zeros and their mask entries are 0.

===================== ===================================== =========================================
field                 dtype, shape                          contents
===================== ===================================== =========================================
``node_features``     float32 ``(max_nodes, NODE_DIM)``     per op group, :data:`NODE_FEATURES`
``node_mask``         int8 ``(max_nodes,)``                 1 for real groups
``edge_index``        int64 ``(2, max_edges)``              producer and consumer group of a tensor
``edge_features``     float32 ``(max_edges, 1)``            tensor size, MiB
``edge_mask``         int8 ``(max_edges,)``                 1 for real edges
``device_features``   float32 ``(max_devices, DEVICE_DIM)`` per device, :data:`DEVICE_FEATURES`
``device_mask``       int8 ``(max_devices,)``               1 for real devices
``device_bandwidth``  float32 ``(max_devices, max_devices)`` widest-route bandwidth, GB/s (0 on the
                                                            diagonal and in padding)
``action_mask``       int8 ``(num_actions,)``               1 for allowed actions (see each env)
``node_structure``    float32 ``(max_nodes, node2vec_dim)`` Node2vec embedding of each group (only
                                                            when ``node2vec_dim > 0``; any sign)
``node_memory_gib``   float32 ``(max_nodes,)``              GiB the group needs on one device by the
                                                            env's estimate (only in one-shot mode
                                                            with ``memory_mask="hard"``)
===================== ===================================== =========================================

With the TAG action space (``action_space="tag"``) the observation also has TAG's Table 1 fields
over ``K = max_device_groups`` device groups, ``S = max_subsets`` device-group subsets and the
``O`` replication options of the env's ``tag_options`` (4, TAG's, by default; 7 with
``extended``): the action ``a = s * O + o`` puts the current group on subset ``s`` with option
``o``:

===================== ===================================== =========================================
field                 dtype, shape                          contents
===================== ===================================== =========================================
``node_option``       float32 ``(max_nodes, O)``            one-hot of each group's replication option
                                                            in the completed partial plan (the options'
                                                            action order)
``node_placement``    float32 ``(max_nodes, K)``            1 for each device group a group's plan uses
``group_features``    float32 ``(K, GROUP_DIM)``            per device group, :data:`GROUP_FEATURES`
``group_mask``        int8 ``(K,)``                         1 for real device groups
``group_bandwidth``   float32 ``(K, K)``                    slowest route between the two groups, GB/s
``slice_placement``   float32 ``(S, K)``                    1 for each device group of subset ``s``
``slice_mask``        int8 ``(S,)``                         1 for real subsets
``progress``          float32 ``(1,)``                      fraction of the groups decided
===================== ===================================== =========================================

Device-group features: ``gpu_count``, ``memory_per_gpu_gib``, ``intra_bandwidth_gbs`` (slowest
route inside the group; 0 for one GPU), ``peak_tflops`` (per GPU), ``peak_memory_fraction``
(simulated peak memory of the completed partial plan over capacity, the group's fullest GPU) and
``idle_fraction`` (share of the simulated iteration the group's GPUs do not compute).

Node features, in order: ``compute_ms`` (forward + backward on the topology's fastest device),
``param_mib``, ``output_mib``, the op-type histogram (fraction of the group's member ops in each
of :data:`OP_FAMILIES`, by the op taxonomy of :mod:`placement_rl.ops`), ``decided``, ``current``
(1 for the group this step decides), ``finish_ms`` (when the group's forward pass ends in the
simulation of the current partial plan) and ``idle_ms`` (how long its output then waits before its
first outgoing transfer starts).

Device features: ``peak_tflops``, ``memory_gib``, ``memory_used_gib`` (the env's estimate for the
decided groups, see the env) and ``idle_fraction`` (share of the simulated iteration the device
does not compute).

Code reads and writes the feature columns by name, never by position: :data:`NODE_COL` and
:data:`DEVICE_COL` map each name to its column, and the ``COL_*`` / ``DEV_COL_*`` constants (with
the slice :data:`COLS_OP_TYPE` for the op-type histogram) are the same columns as names.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from placement_rl.graph import OpGraph
from placement_rl.ops import OBSERVATION_FAMILIES, observation_family
from placement_rl.plan import TAG_OPTIONS
from placement_rl.search.tag import TagEval, TagProblem, group_compute_s
from placement_rl.sim.cost import CostModel
from placement_rl.topology import DeviceTopology

#: The op-type histogram's families, in column order: the project's op taxonomy
#: (:data:`placement_rl.ops.OBSERVATION_FAMILIES`; append-only, as trained policies read the columns).
OP_FAMILIES: tuple[str, ...] = OBSERVATION_FAMILIES
_FAMILY_INDEX: dict[str, int] = {family: i for i, family in enumerate(OP_FAMILIES)}
NODE_FEATURES: tuple[str, ...] = (
    "compute_ms",
    "param_mib",
    "output_mib",
    *(f"type_{f}" for f in OP_FAMILIES),
    "decided",
    "current",
    "finish_ms",
    "idle_ms",
)
DEVICE_FEATURES: tuple[str, ...] = ("peak_tflops", "memory_gib", "memory_used_gib", "idle_fraction")
NODE_DIM, DEVICE_DIM = len(NODE_FEATURES), len(DEVICE_FEATURES)

#: Column of each node feature in ``node_features``, by name.
NODE_COL: dict[str, int] = {name: i for i, name in enumerate(NODE_FEATURES)}
#: Column of each device feature in ``device_features``, by name.
DEVICE_COL: dict[str, int] = {name: i for i, name in enumerate(DEVICE_FEATURES)}

# Node feature columns (code indexes by these, never by position).
COL_COMPUTE_MS = NODE_COL["compute_ms"]
COL_PARAM_MIB = NODE_COL["param_mib"]
COL_OUTPUT_MIB = NODE_COL["output_mib"]
#: The op-type histogram: column ``COLS_OP_TYPE.start + i`` is family ``OP_FAMILIES[i]``.
COLS_OP_TYPE = slice(NODE_COL[f"type_{OP_FAMILIES[0]}"], NODE_COL[f"type_{OP_FAMILIES[-1]}"] + 1)
COL_DECIDED = NODE_COL["decided"]
COL_CURRENT = NODE_COL["current"]
COL_FINISH_MS = NODE_COL["finish_ms"]
COL_IDLE_MS = NODE_COL["idle_ms"]

# Device feature columns.
DEV_COL_PEAK_TFLOPS = DEVICE_COL["peak_tflops"]
DEV_COL_MEMORY_GIB = DEVICE_COL["memory_gib"]
DEV_COL_MEMORY_USED_GIB = DEVICE_COL["memory_used_gib"]
DEV_COL_IDLE_FRACTION = DEVICE_COL["idle_fraction"]

MIB, GIB = 2.0**20, 2.0**30

#: TAG's device-group node features (Table 1), in column order (``group_features``).
GROUP_FEATURES: tuple[str, ...] = (
    "gpu_count",
    "memory_per_gpu_gib",
    "intra_bandwidth_gbs",
    "peak_tflops",
    "peak_memory_fraction",
    "idle_fraction",
)
GROUP_DIM = len(GROUP_FEATURES)
#: Column of each device-group feature in ``group_features``, by name.
GROUP_COL: dict[str, int] = {name: i for i, name in enumerate(GROUP_FEATURES)}
#: Columns of ``node_option`` by default: TAG's replication options (:data:`placement_rl.plan.TAG_OPTIONS`
#: order). A layout's own count is :attr:`Layout.num_options` (the env's ``tag_options``).
NUM_TAG_OPTIONS = len(TAG_OPTIONS)


def op_family(op_type: str) -> int:
    """Index in :data:`OP_FAMILIES` of ``op_type``'s family in the op taxonomy.

    That is ``OP_FAMILIES.index(placement_rl.ops.observation_family(op_type))``: ``other`` for types
    the taxonomy does not know.
    """
    return _FAMILY_INDEX[observation_family(op_type)]


@dataclass(frozen=True)
class Layout:
    """The maxima that fix the observation's shapes."""

    max_nodes: int
    max_edges: int
    max_devices: int
    num_actions: int
    structure_dim: int = 0
    #: TAG fields (``action_space="tag"``): device groups ``K`` and device-group subsets ``S``; 0: none.
    max_device_groups: int = 0
    max_subsets: int = 0
    #: ``node_memory_gib`` (one-shot mode with the hard memory mask): each node's memory need.
    node_memory: bool = False
    #: TAG fields: the replication options ``O`` (columns of ``node_option``; actions ``S * O``).
    num_options: int = NUM_TAG_OPTIONS

    def space(self) -> gym.spaces.Dict:
        n, e, d = self.max_nodes, self.max_edges, self.max_devices
        f32, i8 = np.float32, np.int8

        def box(shape: tuple[int, ...]) -> gym.spaces.Box:
            return gym.spaces.Box(0.0, np.inf, shape, f32)

        def mask(shape: tuple[int, ...]) -> gym.spaces.Box:
            return gym.spaces.Box(0, 1, shape, i8)

        spaces = {
            "node_features": box((n, NODE_DIM)),
            "node_mask": mask((n,)),
            "edge_index": gym.spaces.Box(0, max(n - 1, 0), (2, e), np.int64),
            "edge_features": box((e, 1)),
            "edge_mask": mask((e,)),
            "device_features": box((d, DEVICE_DIM)),
            "device_mask": mask((d,)),
            "device_bandwidth": box((d, d)),
            "action_mask": mask((self.num_actions,)),
        }
        if self.structure_dim:
            spaces["node_structure"] = gym.spaces.Box(-np.inf, np.inf, (n, self.structure_dim), f32)
        if self.node_memory:
            spaces["node_memory_gib"] = box((n,))
        if self.max_device_groups:
            k, s = self.max_device_groups, self.max_subsets
            spaces.update(
                {
                    "node_option": box((n, self.num_options)),
                    "node_placement": box((n, k)),
                    "group_features": box((k, GROUP_DIM)),
                    "group_mask": mask((k,)),
                    "group_bandwidth": box((k, k)),
                    "slice_placement": box((s, k)),
                    "slice_mask": mask((s,)),
                    "progress": box((1,)),
                }
            )
        return gym.spaces.Dict(spaces)


def _raise_hint(key: str, needed: int) -> str:
    """What to do about an instance over a padded size: the key and the value to set."""
    return (
        f"set env.{key} >= {needed} in the env config (the training YAML's env section) and retrain a policy "
        f"trained with less (its observations are padded to {key}; the tag and ppo_tag agents size it from the "
        "instance when they plan)"
    )


def static_arrays(
    groups: OpGraph, fine: OpGraph, topology: DeviceTopology, cost: CostModel, layout: Layout
) -> dict[str, np.ndarray]:
    """The parts of the observation that do not change during an episode, padded to ``layout``.

    Raises:
        ValueError: if the instance has more groups, edges or devices than ``layout`` allows.
    """
    G, D = groups.num_ops, topology.num_devices
    tensors = groups.tensors
    for what, have, limit, key in (
        ("op groups", G, layout.max_nodes, "max_nodes"),
        ("edges", len(tensors), layout.max_edges, "max_edges"),
        ("devices", D, layout.max_devices, "max_devices"),
    ):
        if have > limit:
            raise ValueError(
                f"instance {groups.name!r} on {topology.name!r} has {have} {what}; the env config allows at most "
                f"{limit} ({key} = {limit}); {_raise_hint(key, have)}"
            )
    node = np.zeros((layout.max_nodes, NODE_DIM), np.float32)
    node[:G, COL_COMPUTE_MS] = group_compute_s(groups, fine, topology, cost) * 1e3
    node[:G, COL_PARAM_MIB] = [g.param_bytes / MIB for g in groups.ops]
    node[:G, COL_OUTPUT_MIB] = [g.output_bytes / MIB for g in groups.ops]
    for i, g in enumerate(groups.ops):
        members = g.members or (g.name,)
        for m in members:
            node[i, COLS_OP_TYPE.start + op_family(fine.op(m).op_type)] += 1.0 / len(members)
    node_mask = np.zeros(layout.max_nodes, np.int8)
    node_mask[:G] = 1
    index = {op.name: i for i, op in enumerate(groups.ops)}
    edge_index = np.zeros((2, layout.max_edges), np.int64)
    edge_features = np.zeros((layout.max_edges, 1), np.float32)
    edge_mask = np.zeros(layout.max_edges, np.int8)
    for k, t in enumerate(tensors):
        edge_index[:, k] = index[t.src], index[t.dst]
        edge_features[k, 0] = t.num_bytes / MIB
        edge_mask[k] = 1
    device = np.zeros((layout.max_devices, DEVICE_DIM), np.float32)
    device[:D, DEV_COL_PEAK_TFLOPS] = [d.peak_flops / 1e12 for d in topology.devices]
    device[:D, DEV_COL_MEMORY_GIB] = [d.memory_bytes / GIB for d in topology.devices]
    device_mask = np.zeros(layout.max_devices, np.int8)
    device_mask[:D] = 1
    bandwidth = np.zeros((layout.max_devices, layout.max_devices), np.float32)
    bw = topology.bandwidth_matrix() / 1e9
    np.fill_diagonal(bw, 0.0)
    bandwidth[:D, :D] = bw
    arrays = {
        "node_features": node,
        "node_mask": node_mask,
        "edge_index": edge_index,
        "edge_features": edge_features,
        "edge_mask": edge_mask,
        "device_features": device,
        "device_mask": device_mask,
        "device_bandwidth": bandwidth,
    }
    if layout.structure_dim:
        from placement_rl.graph.node2vec import node2vec_embedding

        structure = np.zeros((layout.max_nodes, layout.structure_dim), np.float32)
        structure[:G] = node2vec_embedding(G, edge_index[:, : len(tensors)], dim=layout.structure_dim, seed=0)
        arrays["node_structure"] = structure
    return arrays


def tag_static_arrays(problem: TagProblem, layout: Layout) -> dict[str, np.ndarray]:
    """The TAG fields that do not change during an episode (device groups, subsets), padded.

    Raises:
        ValueError: if the instance has more device groups or subsets than ``layout`` allows, or
            ``problem`` has another number of options than ``layout``.
    """
    K, S = len(problem.device_groups), len(problem.subsets)
    if problem.num_options != layout.num_options:
        raise ValueError(
            f"the TAG problem has {problem.num_options} options {list(problem.options)}; the observation layout "
            f"has {layout.num_options} (node_option columns)"
        )
    if K > layout.max_device_groups:
        raise ValueError(
            f"topology {problem.topology.name!r} has {K} device groups (by {problem.device_grouping}); the env "
            f"config allows at most {layout.max_device_groups} (max_device_groups = {layout.max_device_groups}); "
            f"{_raise_hint('max_device_groups', K)}"
        )
    topology = problem.topology
    index = {d.name: i for i, d in enumerate(topology.devices)}
    bw = topology.bandwidth_matrix() / 1e9
    group = np.zeros((layout.max_device_groups, GROUP_DIM), np.float32)
    between = np.zeros((layout.max_device_groups, layout.max_device_groups), np.float32)
    for k, dg in enumerate(problem.device_groups):
        ids = [index[n] for n in dg.devices]
        inner = bw[np.ix_(ids, ids)]
        off = inner[~np.eye(len(ids), dtype=bool)]
        group[k, GROUP_COL["gpu_count"]] = len(ids)
        group[k, GROUP_COL["memory_per_gpu_gib"]] = min(topology.devices[i].memory_bytes for i in ids) / GIB
        group[k, GROUP_COL["intra_bandwidth_gbs"]] = float(off.min()) if off.size else 0.0
        group[k, GROUP_COL["peak_tflops"]] = np.mean([topology.devices[i].peak_flops for i in ids]) / 1e12
        for j, other in enumerate(problem.device_groups):
            if j != k:
                between[k, j] = float(bw[np.ix_(ids, [index[n] for n in other.devices])].min())
    group_mask = np.zeros(layout.max_device_groups, np.int8)
    group_mask[:K] = 1
    placement = np.zeros((layout.max_subsets, layout.max_device_groups), np.float32)
    for s_, subset in enumerate(problem.subsets):
        placement[s_, list(subset)] = 1.0
    slice_mask = np.zeros(layout.max_subsets, np.int8)
    slice_mask[:S] = 1
    return {
        "group_features": group,
        "group_mask": group_mask,
        "group_bandwidth": between,
        "slice_placement": placement,
        "slice_mask": slice_mask,
    }


def tag_dynamic_arrays(
    obs: dict[str, np.ndarray], problem: TagProblem, decisions: tuple[int, ...], evaluation: TagEval, layout: Layout
) -> None:
    """Fill the TAG fields that follow the search state into ``obs`` (a copy of the static arrays):
    each group's completed option and placement, the device groups' simulated peak memory and idle
    share, and the search progress."""
    G = problem.num_groups
    choices = problem.complete(decisions)
    option = np.zeros((layout.max_nodes, layout.num_options), np.float32)
    placement = np.zeros((layout.max_nodes, layout.max_device_groups), np.float32)
    slices = obs["slice_placement"]
    for g, (s_, o, _) in enumerate(choices):
        option[g, o] = 1.0
        placement[g] = slices[s_]
    obs["node_option"], obs["node_placement"] = option, placement
    group = obs["group_features"]
    index = {d.name: i for i, d in enumerate(problem.topology.devices)}
    busy, peak, cap = evaluation.device_busy_s, evaluation.peak_memory_bytes, problem.capacity_bytes
    for k, dg in enumerate(problem.device_groups):
        ids = [index[n] for n in dg.devices]
        group[k, GROUP_COL["peak_memory_fraction"]] = float((peak[ids] / cap[ids]).max())
        if evaluation.makespan_s > 0:
            group[k, GROUP_COL["idle_fraction"]] = float(np.clip(1.0 - busy[ids].mean() / evaluation.makespan_s, 0, 1))
    obs["progress"] = np.array([len(decisions) / max(G, 1)], np.float32)

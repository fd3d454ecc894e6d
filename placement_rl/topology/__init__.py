"""Device topologies: the GPU clusters that training graphs are placed on.

* :mod:`~placement_rl.topology.core`: the data model (:class:`DeviceTopology`, :class:`Device`,
  :class:`Link`, :class:`Route`), validation, JSON and deterministic widest-path routing.
* :mod:`~placement_rl.topology.devices`: the device catalogue (:data:`DEVICE_TYPES`) and link latencies.
* :mod:`~placement_rl.topology.presets`: the papers' clusters and DGX A100 / H100 clusters of any size
  from 1 to 512 nodes (``dgx-h100-x384``) (:func:`load_preset`), and :func:`resolve_topology`, which
  turns a command-line string into a topology.
* :mod:`~placement_rl.topology.random_topologies`: TAG's random topology distribution, with disjoint
  train/test seed ranges ("unseen topologies" are drawn from :data:`TEST_SEEDS`).
"""

from placement_rl.topology.core import (
    COMPUTE_DTYPES,
    LINK_KINDS,
    MAX_TOPOLOGY_DEVICES,
    TOPOLOGY_FORMAT,
    TOPOLOGY_SCHEMA_VERSION,
    Device,
    DeviceTopology,
    Link,
    LinkKind,
    Route,
)
from placement_rl.topology.devices import (
    DEVICE_TYPE_ALIASES,
    DEVICE_TYPES,
    GIB,
    LINK_LATENCY_S,
    PCIE3_X16_BYTES_PER_S,
    DeviceSpec,
    gbit_to_bytes_per_s,
    make_device,
)
from placement_rl.topology.presets import (
    DGX_MAX_NODES,
    DGX_SYSTEMS,
    dgx_cluster,
    load_preset,
    preset_names,
    resolve_topology,
)
from placement_rl.topology.random_topologies import (
    RANDOM_DEVICE_TYPES,
    TEST_SEEDS,
    TRAIN_SEEDS,
    random_topology,
    topology_seeds,
)

__all__ = [
    "COMPUTE_DTYPES",
    "DEVICE_TYPES",
    "DEVICE_TYPE_ALIASES",
    "DGX_MAX_NODES",
    "DGX_SYSTEMS",
    "GIB",
    "LINK_KINDS",
    "LINK_LATENCY_S",
    "MAX_TOPOLOGY_DEVICES",
    "PCIE3_X16_BYTES_PER_S",
    "RANDOM_DEVICE_TYPES",
    "TEST_SEEDS",
    "TOPOLOGY_FORMAT",
    "TOPOLOGY_SCHEMA_VERSION",
    "TRAIN_SEEDS",
    "Device",
    "DeviceSpec",
    "DeviceTopology",
    "Link",
    "LinkKind",
    "Route",
    "dgx_cluster",
    "gbit_to_bytes_per_s",
    "load_preset",
    "make_device",
    "preset_names",
    "random_topology",
    "resolve_topology",
    "topology_seeds",
]

"""An emulated cluster on this machine, to check the simulator's network model against a real network.

* :mod:`.cluster`: the topology's shape and scale (:func:`layout`), network namespaces, bridges and
  ``tbf``-shaped veths (:class:`EmulatedCluster`), and the cleanup of crashed runs
  (:func:`cleanup_leftovers`).
* :mod:`.patterns`: communication patterns (point to point, fan-in, all-to-all, ring all-reduce, a
  pipeline, ...) and the same patterns as an op graph, plan and profile for the simulator.
* :mod:`.worker`: one ``torch.distributed`` gloo process per device, run inside its namespace.
* :mod:`.run`: :func:`emulate` (build, measure, clean up, simulate) and the comparison table.

It needs root, ``ip`` and ``tc`` (iproute2); it imports no Ray.
"""

from placement_rl.emulate.cluster import (
    EMULATOR_PREFIX,
    EmulatedCluster,
    EmulatorError,
    Layout,
    ShapedLink,
    cleanup_leftovers,
    find_tools,
    layout,
    resolve_emulation_topology,
    switched_cluster,
)
from placement_rl.emulate.patterns import (
    Message,
    Pattern,
    Sizes,
    Step,
    network_models,
    pattern_names,
    patterns_for,
    register_pattern,
    simulate_pattern,
    simulation_inputs,
)
from placement_rl.emulate.run import (
    EmulationReport,
    ModelSummary,
    PatternResult,
    disagreeing,
    emulate,
    report_json,
    summarize,
    summary_lines,
    table_rows,
)

__all__ = [
    "EMULATOR_PREFIX",
    "EmulatedCluster",
    "EmulationReport",
    "EmulatorError",
    "Layout",
    "Message",
    "ModelSummary",
    "Pattern",
    "PatternResult",
    "ShapedLink",
    "Sizes",
    "Step",
    "cleanup_leftovers",
    "disagreeing",
    "emulate",
    "find_tools",
    "layout",
    "network_models",
    "pattern_names",
    "patterns_for",
    "register_pattern",
    "report_json",
    "resolve_emulation_topology",
    "simulate_pattern",
    "simulation_inputs",
    "summarize",
    "summary_lines",
    "switched_cluster",
    "table_rows",
]

"""An experiment's instances and cells: models loaded on topologies, cells expanded and checked before
any runs (:func:`prepare`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from placement_rl.errors import SchemaError
from placement_rl.experiments.spec import MAX_BATCH_SIZE, Experiment, MethodEntry, ModelEntry, _plain
from placement_rl.graph import OpGraph
from placement_rl.methods import get_method
from placement_rl.sim import CostModel
from placement_rl.topology import DeviceTopology


# ------------------------------------------------------------------------------ instances and cells
def load_model(entry: ModelEntry, topology: DeviceTopology) -> OpGraph:
    """The graph of a model entry on ``topology`` (its batch size may depend on the device count).

    The one place a model string becomes a graph: a zoo name, a graph ``.json`` file, or a model
    string of :mod:`placement_rl.models` (``hf:...``, ``package.module:factory``; its one option is
    ``seq_len``, for ``hf:`` models).
    """
    from placement_rl import zoo

    batch = entry.batch_size
    if entry.batch_per_device is not None:
        batch = entry.batch_per_device * topology.num_devices
        if batch > MAX_BATCH_SIZE:
            raise SchemaError(
                f"batch_per_device = {entry.batch_per_device} on the {topology.num_devices} devices of "
                f"{topology.name!r}: a batch of {batch:,}; expected at most {MAX_BATCH_SIZE:,}"
            )
    if entry.model.endswith(".json") or (os.sep in entry.model and Path(entry.model).is_file()):
        graph = OpGraph.from_json(entry.model)
    elif ":" in entry.model:
        from placement_rl.models import load_model as load_model_string

        options = dict(entry.options)
        seq_len = options.pop("seq_len", None)
        if options:
            raise SchemaError(f"model {entry.model!r}: options {sorted(options)}; expected only seq_len")
        graph = load_model_string(entry.model, batch, seq_len)
    else:
        graph = zoo.load(entry.model, batch_size=batch, **dict(entry.options))
    if entry.coarsen is not None:
        from placement_rl.graph.coarsen import coarsen

        graph = coarsen(graph, entry.coarsen)
    return graph


@dataclass(frozen=True)
class Instance:
    """A model on a topology.

    Attributes:
        id: ``"<model label>@<topology name>"``, how rows name it.
        model: the model entry's label.
        topology_spec: the topology as the experiment gives it.
        graph: the op graph.
        topology: the cluster.
        source: the model as the experiment gives it (a zoo name: what learned methods' checkpoint
            maps and held-out lists name).
    """

    id: str
    model: str
    topology_spec: str
    graph: OpGraph
    topology: DeviceTopology
    source: str = ""


@dataclass(frozen=True)
class Cell:
    """One (instance, method, seed) of an experiment.

    Attributes:
        instance: the instance's id.
        method: the method entry's label.
        seed: the seed (``None`` for methods that take none).
        digest: a hash of everything the cell's result depends on (model entry, topology, method
            options, cost model): a finished row counts on ``resume`` only when its digest matches.
    """

    instance: str
    method: str
    seed: int | None
    digest: str

    @property
    def key(self) -> str:
        """The cell's id in ``results.jsonl``."""
        return f"{self.instance}|{self.method}|{'-' if self.seed is None else self.seed}"


@dataclass(frozen=True)
class Prepared:
    """An experiment with its instances loaded and its cells listed, every check passed."""

    experiment: Experiment
    instances: tuple[Instance, ...]
    cells: tuple[Cell, ...]
    cost_model: CostModel

    def instance(self, instance_id: str) -> Instance:
        return next(i for i in self.instances if i.id == instance_id)

    def entry(self, label: str) -> MethodEntry:
        return next(m for m in self.experiment.methods if m.name == label)


def _digest(*parts: Any) -> str:
    text = json.dumps(_plain(parts), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prepare(experiment: Experiment, where: str = "experiment", *, cost_model: CostModel | None = None) -> Prepared:
    """Load every instance and check every method on it; list the cells. Nothing runs yet.

    Args:
        experiment: the checked experiment.
        where: how errors name it (the file).
        cost_model: a cost model built by the caller (the CLI's flags), instead of the ``cost`` section.

    Raises:
        ValueError: naming the key and value of an unknown model or topology, a method option its
            method refuses, or an instance a method cannot run on (exhaustive on a space too large).
    """
    from placement_rl.topology import resolve_topology

    topologies: list[tuple[str, DeviceTopology]] = []
    for spec in experiment.topologies:
        try:
            topologies.append((spec, resolve_topology(spec)))
        except (ValueError, FileNotFoundError) as exc:
            raise SchemaError(f"{where}.topologies: {exc}") from None
    names = [t.name for _, t in topologies]
    for n in names:
        if names.count(n) > 1:
            raise SchemaError(f"{where}.topologies: two topologies are named {n!r}")
    instances: list[Instance] = []
    graphs: dict[tuple[str, int | None], OpGraph] = {}
    for k, model in enumerate(experiment.models):
        for spec, topo in topologies:
            per_device = model.batch_per_device * topo.num_devices if model.batch_per_device else None
            cache_key = (model.name, per_device)
            if cache_key not in graphs:
                try:
                    graphs[cache_key] = load_model(model, topo)
                except (ValueError, FileNotFoundError) as exc:
                    raise SchemaError(f"{where}.models[{k}] ({model.model}): {exc}") from None
            instances.append(
                Instance(f"{model.name}@{topo.name}", model.name, spec, graphs[cache_key], topo, model.model)
            )
    cost = cost_model or experiment.cost_model()
    return Prepared(experiment, tuple(instances), _cells(experiment, instances, where), cost)


def with_methods(prepared: Prepared, experiment: Experiment, where: str = "experiment") -> Prepared:
    """``prepared``'s instances (loaded once) with the method entries of ``experiment``, an experiment
    of the same models and topologies (``plan`` chooses its default methods and budgets once it knows
    the instance); every method is checked on every instance again, and the cells listed anew."""
    return dataclasses.replace(prepared, experiment=experiment, cells=_cells(experiment, prepared.instances, where))


def _cells(experiment: Experiment, instances: Sequence[Instance], where: str) -> tuple[Cell, ...]:
    """Every method entry checked on every instance, and the cells (one per seed of a seeded method)."""
    cells: list[Cell] = []
    models = {m.name: m for m in experiment.models}
    for inst in instances:
        for j, entry in enumerate(experiment.methods):
            if entry.kind == "registered":
                method = get_method(entry.method)
                if method.check is not None:
                    try:
                        method.check(entry.options, inst.graph, inst.topology)
                    except ValueError as exc:
                        raise SchemaError(f"{where}.methods[{j}] ({entry.name}) on {inst.id}: {exc}") from None
            digest = _digest(
                dataclasses.asdict(models[inst.model]), inst.topology_spec, entry.to_dict(), experiment.cost
            )
            for seed in experiment.seeds if entry.seeded else (None,):
                cells.append(Cell(inst.id, entry.name, seed, digest))
    return tuple(cells)

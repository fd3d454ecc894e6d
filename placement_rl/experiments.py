"""Experiments: every method side by side on a set of instances, cell by cell (``placement-rl compare``).

An *experiment* names models (with batch sizes), topologies, methods with their budgets, and seeds.
It expands into *cells*, one per (instance, method, seed): an instance is a model on a topology, and
a method that takes no seed (the baselines, FT, a trained policy) gets one cell per instance. Each
cell is one :func:`~placement_rl.methods.compare_methods` call, so every row of every command has
the same format (:func:`cell_row`): the :class:`~placement_rl.methods.MethodResult` row (makespan,
speedup over each data-parallel reference, the compute lower bound and the headroom captured,
memory, communication, search seconds) plus the cell's model, topology, seed, status and plan file.

The experiment file (YAML, read at the Ray edge: :func:`placement_rl.rl.compare.load_experiment`)::

    name: flexflow-fig6                   # default: the file's stem
    models:                               # zoo names, graph .json files, model strings or mappings:
      - alexnet                           #   the paper's batch size
      - {model: resnet101, batch_per_device: 64}   # 64 samples per GPU of each topology
      - {model: rnnlm, batch_size: 64, options: {steps: 2}, coarsen: 4, label: rnnlm2-g4}
      - {model: "hf:LlamaForCausalLM:num_hidden_layers=4", batch_size: 16, options: {seq_len: 1024}, label: llama4}
    topologies: [flexflow-p100, "test:10", random:3, my_cluster.json]   # test:N / train:N: random splits
    methods:
      - data_parallel
      - {method: mcmc, budget: 30s, chains: 1}          # options are checked against the method's
      - {method: trinity, checkpoint: out/trinity/checkpoint_final, held_out: [vgg19]}
      - {method: tag, checkpoint: out/tag/checkpoint_final, optional: true}   # rows say it is missing
    seeds: [0, 1, 2]                      # or a count: 3
    cost: {optimizer: adam}               # CostModel options; profile / comm_table are file paths
    concurrency: 4                        # cells at once (default: the Ray cluster's CPUs)

Every key is checked when the file is read (:func:`parse_experiment`: an unknown key lists the valid
ones), and every name, budget and instance before any cell runs (:func:`prepare`): unknown methods,
models and topologies, bad budgets, exhaustive search on a space too large. Sizes are bounded: at
most :data:`MAX_SEEDS` seeds, :data:`MAX_CELLS` cells and a global batch of :data:`MAX_BATCH_SIZE`
(search budgets: :class:`placement_rl.search.Budget`). Learned methods (a
registered agent with a ``checkpoint``) are resolved at the Ray edge, which checks their agent kind
and held-out models first.

The driver (:func:`run_experiment`) runs the cells through an injected :class:`CellRunner` (serial
here; Ray tasks with bounded concurrency at the edge, :class:`placement_rl.rl.compare.RayCells`),
writes each finished cell's plan JSON and appends its row to ``results.jsonl`` at once, so that
``resume`` skips finished cells and nothing finished is lost on a crash or Ctrl-C. A damaged line of
``results.jsonl`` (cut short by a crash, or edited: :func:`row_problem`) is skipped with a warning
naming its line, and its cell runs again; the file is only ever appended to. Then it writes
``results.csv``, ``results.md``, ``summary.csv``/``summary.md`` and the PNGs (:func:`write_outputs`).
Rows are standard JSON: a figure with no finite value (a search's best cost before any plan fits) is
``null``. Where no method's plan fits in memory, the Markdown files say so and name the plan that
needs the least (:func:`no_fit`).

Models: a zoo name or a graph ``.json`` file today. Model specs such as ``hf:...`` or
``package.module:factory`` join through :func:`load_model`, the one place a model string becomes a
graph.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from placement_rl.config import Rule, as_mapping, check_known, integer, option, parse, text
from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.io import dumps_json, finite_or_none, loads_json, write_json
from placement_rl.methods import DP_REFERENCES, Method, MethodResult, compare_methods, get_method, method_names
from placement_rl.plan import Plan
from placement_rl.sim import CostModel
from placement_rl.topology import DeviceTopology

#: Options a method entry never sets itself: the seed comes from ``seeds``, task maps from the runner.
RUNTIME_OPTIONS = ("seed", "task_map", "delta")
#: Keys of a method entry besides the method's own options.
ENTRY_KEYS = ("method", "name", "optional")
#: Keys only learned methods take.
LEARNED_KEYS = ("checkpoint", "held_out")
#: Row statuses: ``ok`` (ran), ``unavailable`` (an optional method that does not exist yet), ``error``.
FINISHED = ("ok", "unavailable")
RESULTS, CSV_FILE, MARKDOWN, SUMMARY_CSV, SUMMARY_MD = (
    "results.jsonl",
    "results.csv",
    "results.md",
    "summary.csv",
    "summary.md",
)
SPEEDUP_PNG, ANYTIME_PNG, EXPERIMENT_FILE = "speedup.png", "anytime.png", "experiment.json"
#: The folder of the per-instance anytime PNGs (``anytime/<instance>.png``).
ANYTIME_DIR = "anytime"
#: The most seeds an experiment may give (``seeds: N`` or a list).
MAX_SEEDS = 10_000
#: The largest seed (numpy's generators take any size; larger ones are typos).
MAX_SEED = 2**63 - 1
#: The largest global batch size a model entry may ask for (``batch_size``, or ``batch_per_device`` times
#: a topology's device count): the environments' generators take the same bound.
MAX_BATCH_SIZE = 1_000_000
#: The most cells an experiment may expand to (instances x method entries x seeds of seeded methods).
MAX_CELLS = 100_000


# --------------------------------------------------------------------------------- config records
_MAPPING = Rule(lambda v: isinstance(v, Mapping), "a mapping of model option -> value")
_LABEL = Rule(lambda v: v is None or (isinstance(v, str) and bool(v)), "a non-empty string or null")


def _write_text(path: Path, content: str) -> None:
    """Write ``content`` atomically (a crash leaves the old file, never half of the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(content, encoding="utf-8")
    os.replace(tmp, path)


@dataclass(frozen=True)
class ModelEntry:
    """One model of an experiment."""

    model: str = option(rule=text())
    """A zoo name (``placement-rl models``), a graph ``.json`` file, ``hf:...`` or ``package.module:factory``
    (:func:`load_model`)."""
    batch_size: int | None = option(None, rule=integer(1, MAX_BATCH_SIZE, null=True))
    """Global batch size (default: the paper's; a graph file keeps its own), at most :data:`MAX_BATCH_SIZE`."""
    batch_per_device: int | None = option(None, rule=integer(1, MAX_BATCH_SIZE, null=True))
    """Samples per device: the batch size is this times each topology's device count (FlexFlow)."""
    options: Mapping[str, Any] = option(default_factory=dict, rule=_MAPPING)
    """Architecture options of a zoo model (``{steps: 2}``)."""
    coarsen: int | None = option(None, rule=integer(1, null=True))
    """Coarsen the graph to at most this many op groups (METIS; small spaces for ``exhaustive``)."""
    label: str | None = option(None, rule=_LABEL)
    """How instances name the model (default: the model string, and the batch size when given)."""

    def validate(self, where: str) -> None:
        if self.batch_size is not None and self.batch_per_device is not None:
            raise SchemaError(f"{where}: batch_size and batch_per_device both given; expected at most one")
        if self.model.endswith(".json") and (self.options or self.batch_size or self.batch_per_device):
            raise SchemaError(f"{where}: a graph file {self.model!r} takes no batch size or options")

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.batch_size is not None:
            return f"{Path(self.model).stem}-b{self.batch_size}"
        if self.batch_per_device is not None:
            return f"{Path(self.model).stem}-{self.batch_per_device}pd"
        return Path(self.model).stem if self.model.endswith(".json") else self.model


@dataclass(frozen=True)
class MethodEntry:
    """One method of an experiment, with its options.

    Attributes:
        method: a registered method (:func:`~placement_rl.methods.method_names`) or agent name.
        name: the rows' label (default: ``method``); two entries of one method need distinct names.
        options: the method's own options (``budget``, ``chains``, ``max_configs``, ...).
        checkpoint: a learned method's ``checkpoint_*`` folder, or model -> folder (a policy per
            model, e.g. each trained without that model; keys as the ``models`` entries name them).
        held_out: zoo models the learned method must not have trained on (checked against its run's
            training config), or ``True``: each instance's own model (with a checkpoint per model,
            TAG's hold-out variant); the rows of held-out models say so in their note.
        optional: the method may not exist yet; its rows then say so instead of failing.
        kind: ``registered``, ``learned`` or ``unavailable``.
        note: why an unavailable method is unavailable.
    """

    method: str
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    checkpoint: str | Mapping[str, str] | None = None
    held_out: tuple[str, ...] | bool = ()
    optional: bool = False
    kind: str = "registered"
    note: str = ""

    @property
    def seeded(self) -> bool:
        return self.kind == "registered" and get_method(self.method).seeded

    def checkpoint_for(self, model: str) -> str:
        """The checkpoint folder of the policy that plans ``model``'s instances."""
        if isinstance(self.checkpoint, Mapping):
            if model not in self.checkpoint:
                raise SchemaError(f"method {self.name!r}: no checkpoint for model {model!r}")
            return self.checkpoint[model]
        if self.checkpoint is None:
            raise SchemaError(f"method {self.name!r}: no checkpoint")
        return self.checkpoint

    def held_out_for(self, model: str) -> set[str]:
        """The models the policy planning ``model``'s instances must not have trained on."""
        if isinstance(self.held_out, bool):
            return {model} if self.held_out else set()
        return set(self.held_out)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "name": self.name, **_plain(self.options)}
        if self.checkpoint is not None:
            out["checkpoint"] = _plain(self.checkpoint)
        if self.held_out:
            out["held_out"] = self.held_out if isinstance(self.held_out, bool) else list(self.held_out)
        if self.optional:
            out["optional"] = True
        return out


@dataclass(frozen=True)
class Experiment:
    """A validated experiment file (see the module docstring).

    Attributes:
        name: the experiment's name (default output folder ``out/compare-<name>``).
        models: the models.
        topologies: topology specs, ``test:N`` / ``train:N`` already expanded to ``random:SEED``.
        methods: the methods with their options.
        seeds: the seeds of seeded methods (MCMC).
        cost: :class:`~placement_rl.sim.CostModel` options (``profile`` / ``comm_table``: file paths).
        concurrency: cells at once (``None``: the runner's default, the cluster's CPUs).
        description: free text, printed at the top of ``results.md``.
    """

    name: str
    models: tuple[ModelEntry, ...]
    topologies: tuple[str, ...]
    methods: tuple[MethodEntry, ...]
    seeds: tuple[int, ...] = (0,)
    cost: Mapping[str, Any] = field(default_factory=dict)
    concurrency: int | None = None
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The resolved experiment (``experiment.json`` of an output folder)."""
        return {
            "name": self.name,
            "description": self.description,
            "models": [_plain({k: v for k, v in dataclasses.asdict(m).items() if v}) for m in self.models],
            "topologies": list(self.topologies),
            "methods": [m.to_dict() for m in self.methods],
            "seeds": list(self.seeds),
            "cost": _plain(self.cost),
            "concurrency": self.concurrency,
        }

    def cost_model(self) -> CostModel:
        """The cost model of the ``cost`` section."""
        return build_cost_model(self.cost, "experiment.cost")


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


TOP_KEYS = ("name", "description", "models", "topologies", "methods", "seeds", "cost", "concurrency")


def parse_experiment(
    data: Any, where: str = "experiment", *, agents: Collection[str] = (), name: str = ""
) -> Experiment:
    """Check an experiment mapping (parsed YAML) and build the :class:`Experiment`.

    Args:
        data: the mapping.
        where: how errors name the document (the file path).
        agents: the registered learned agents (a method with a ``checkpoint`` must be one of them).
        name: the default name (the file's stem).

    Raises:
        SchemaError: naming the key and the bad value (an unknown key lists the valid ones).
        UnknownNameError: for an unknown method, listing the registered methods and agents.
    """
    top = as_mapping(data, where)
    if not top:
        raise SchemaError(f"{where}: empty experiment; expected the keys models, topologies and methods")
    check_known(top, TOP_KEYS, where)
    for key in ("models", "topologies", "methods"):
        if key not in top:
            raise SchemaError(f"{where}: missing key {key!r}; an experiment names models, topologies and methods")
    exp_name = top.get("name", name or "experiment")
    if not isinstance(exp_name, str) or not exp_name:
        raise SchemaError(f"{where}: name = {exp_name!r}; expected a non-empty string")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise SchemaError(f"{where}: description = {description!r}; expected a string")
    models = tuple(
        _parse_model(item, f"{where}.models[{i}]") for i, item in enumerate(_list(top["models"], f"{where}.models"))
    )
    labels = [m.name for m in models]
    for label in labels:
        if labels.count(label) > 1:
            raise SchemaError(f"{where}.models: model {label!r} appears twice; give each a distinct 'label'")
    topologies = tuple(
        spec
        for i, item in enumerate(_list(top["topologies"], f"{where}.topologies"))
        for spec in expand_topology(item, f"{where}.topologies[{i}]")
    )
    if len(set(topologies)) != len(topologies):
        twice = sorted({t for t in topologies if topologies.count(t) > 1})
        raise SchemaError(f"{where}.topologies: {twice} listed more than once")
    methods = tuple(
        parse_method_entry(item, f"{where}.methods[{i}]", agents=agents, models=[m.model for m in models])
        for i, item in enumerate(_list(top["methods"], f"{where}.methods"))
    )
    names = [m.name for m in methods]
    for n in names:
        if names.count(n) > 1:
            raise SchemaError(f"{where}.methods: two entries are named {n!r}; give one a distinct 'name'")
    seeds = _parse_seeds(top.get("seeds", [0]), f"{where}.seeds")
    _check_cell_count(len(models), len(topologies), methods, seeds, where)
    cost = as_mapping(top.get("cost"), f"{where}.cost")
    build_cost_model(cost, f"{where}.cost")
    concurrency = top.get("concurrency")
    integer(1, null=True).check(concurrency, where, "concurrency")
    return Experiment(exp_name, models, topologies, methods, seeds, cost, concurrency, description)


def _check_cell_count(
    models: int, topologies: int, methods: Sequence[MethodEntry], seeds: Sequence[int], where: str
) -> None:
    """Refuse an experiment of more than :data:`MAX_CELLS` cells before anything is loaded."""
    per_instance = sum(len(seeds) if m.seeded else 1 for m in methods)
    cells = models * topologies * per_instance
    if cells > MAX_CELLS:
        raise SchemaError(
            f"{where}: {models} model(s) x {topologies} topologies x {per_instance} method runs per instance "
            f"({len(seeds)} seed(s) for each seeded method) = {cells:,} cells; expected at most {MAX_CELLS:,} "
            "(fewer seeds, models or topologies, or several experiments)"
        )


def _short(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (error messages quote what the user wrote)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, (list, tuple)) or not value:
        raise SchemaError(f"{where}: {_short(value)}; expected a non-empty list")
    return list(value)


def _parse_model(item: Any, where: str) -> ModelEntry:
    if isinstance(item, str):
        item = {"model": item}
    if not isinstance(item, Mapping):
        raise SchemaError(f"{where}: {item!r}; expected a model name or a mapping with a 'model' key")
    if "model" not in item:
        raise SchemaError(f"{where}: missing key 'model'")
    return parse(ModelEntry, item, where)


def expand_topology(spec: Any, where: str = "topology") -> list[str]:
    """``test:N`` / ``train:N`` -> the first N topologies of that split (``random:SEED``); others as given."""
    from placement_rl.topology import topology_seeds

    if not isinstance(spec, str) or not spec:
        raise SchemaError(f"{where}: {spec!r}; expected a topology: a preset, random:SEED, test:N, train:N or a file")
    split, colon, count = spec.partition(":")
    if colon and split in ("test", "train"):
        if not (count.isascii() and count.isdigit()) or int(count) < 1:
            raise SchemaError(f"{where}: {spec!r}; expected '{split}:N' with a positive N")
        return [f"random:{s}" for s in topology_seeds(split, int(count))]  # type: ignore[arg-type]
    return [spec]


def _parse_seeds(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_SEEDS:
            raise SchemaError(f"{where}: {value!r}; expected a count >= 1 and <= {MAX_SEEDS} or a list of seeds")
        return tuple(range(value))
    if not isinstance(value, (list, tuple)) or not value:
        raise SchemaError(f"{where}: {_short(value)}; expected a count >= 1 or a non-empty list of seeds")
    if len(value) > MAX_SEEDS:
        raise SchemaError(f"{where}: {len(value):,} seeds; expected at most {MAX_SEEDS:,}")
    for s in value:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED:
            raise SchemaError(f"{where}: seed {_short(s)}; expected integers >= 0 and < 2**63")
    if len(set(value)) != len(value):
        raise SchemaError(f"{where}: {list(value)} repeats a seed")
    return tuple(value)


def method_option_names(method: Method) -> list[str]:
    """The options an experiment may set for ``method`` (its own, less the runtime ones)."""
    return [o for o in method.options if o not in RUNTIME_OPTIONS]


def parse_method_entry(
    item: Any, where: str, *, agents: Collection[str] = (), models: Collection[str] = ()
) -> MethodEntry:
    """One entry of ``methods`` (a name or a mapping); see :class:`MethodEntry`."""
    if isinstance(item, str):
        item = {"method": item}
    if not isinstance(item, Mapping):
        raise SchemaError(f"{where}: {item!r}; expected a method name or a mapping with a 'method' key")
    entry = dict(item)
    name = entry.get("method")
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{where}: method = {name!r}; expected the name of a method or agent")
    label = entry.get("name", name)
    if not isinstance(label, str) or not label:
        raise SchemaError(f"{where}: name = {label!r}; expected a non-empty string")
    optional = entry.get("optional", False)
    if not isinstance(optional, bool):
        raise SchemaError(f"{where}: optional = {optional!r}; expected true or false")
    registered = method_names()
    if name in registered:
        method = get_method(name)
        valid = [*ENTRY_KEYS, *method_option_names(method)]
        check_known(entry, valid, f"{where} ({name})")
        options = {k: v for k, v in entry.items() if k not in ENTRY_KEYS}
        if method.check is not None:
            try:
                method.check(options, None, None)
            except ValueError as exc:
                raise SchemaError(f"{where} ({name}): {exc}") from None
        return MethodEntry(name, label, options, optional=optional)
    if name in agents:
        check_known(entry, [*ENTRY_KEYS, *LEARNED_KEYS], f"{where} ({name}, a learned agent)")
        checkpoint = entry.get("checkpoint")
        if isinstance(checkpoint, Mapping):
            for model, path in checkpoint.items():
                if model not in models:
                    raise SchemaError(f"{where}.checkpoint: model {model!r} is not among the models {sorted(models)}")
                if not isinstance(path, str) or not path:
                    raise SchemaError(f"{where}.checkpoint[{model!r}] = {path!r}; expected a checkpoint folder")
            missing = sorted(set(models) - set(checkpoint))
            if missing:
                raise SchemaError(f"{where}.checkpoint: no checkpoint for model(s) {missing}")
        elif not isinstance(checkpoint, str) or not checkpoint:
            raise SchemaError(
                f"{where}: checkpoint = {checkpoint!r}; the learned agent {name!r} needs a checkpoint_* folder "
                "(or a mapping of model -> folder)"
            )
        held_out = entry.get("held_out", [])
        if not isinstance(held_out, bool) and (
            not isinstance(held_out, (list, tuple)) or not all(isinstance(m, str) for m in held_out)
        ):
            raise SchemaError(
                f"{where}: held_out = {held_out!r}; expected a list of model names, or true (each instance's model)"
            )
        held = held_out if isinstance(held_out, bool) else tuple(held_out)
        return MethodEntry(name, label, {}, checkpoint, held, optional, kind="learned")
    if optional:
        what = "agent" if "checkpoint" in entry else "method"
        note = f"{what} {name!r} does not exist yet (registered: {', '.join([*registered, *sorted(agents)])})"
        options = {k: v for k, v in entry.items() if k not in (*ENTRY_KEYS, *LEARNED_KEYS)}
        return MethodEntry(name, label, options, entry.get("checkpoint"), (), True, kind="unavailable", note=note)
    raise SchemaError(f"{where}: {UnknownNameError('method', name, [*registered, *agents])}")


def calibration_named(value: Any, where: str) -> Any:
    """A cost section's ``calibration``: ``default``, ``roofline`` (None: the flat roofline) or a file path."""
    from placement_rl.sim.calibration import DEFAULT_CALIBRATION

    if value == "default":
        return DEFAULT_CALIBRATION
    if value == "roofline":
        return None
    if not isinstance(value, str) or not value.endswith(".json"):
        raise SchemaError(f"{where}: calibration = {value!r}; expected default, roofline or a calibration .json path")
    from placement_rl.calibrate import read_calibration

    return read_calibration(value)


def build_cost_model(cost: Mapping[str, Any], where: str) -> CostModel:
    """A :class:`CostModel` from an experiment's ``cost`` section (scalar fields such as ``precision``
    and ``execution_mode``; ``profile`` and ``comm_table`` are file paths; ``calibration`` is
    ``default``, ``roofline`` or a calibration file path)."""
    from placement_rl.sim import CommTable, ProfileTable

    fields = {f.name: f for f in dataclasses.fields(CostModel) if f.init}
    scalar = [n for n, f in fields.items() if isinstance(f.default, (str, int, float, bool))]
    files = [n for n in ("profile", "comm_table") if n in fields]
    check_known(cost, [*scalar, *files, "calibration"], where)
    kwargs: dict[str, Any] = {}
    for key, value in cost.items():
        if key == "calibration":
            kwargs[key] = calibration_named(value, where)
        elif key in files:
            if not isinstance(value, str):
                raise SchemaError(f"{where}: {key} = {value!r}; expected a JSON file path")
            table = ProfileTable if key == "profile" else CommTable
            kwargs[key] = table.from_json(value)
        else:
            default = fields[key].default
            expected = type(default)
            ok = isinstance(value, expected) or (expected is float and isinstance(value, int))
            if not ok or isinstance(value, bool) != isinstance(default, bool):
                raise SchemaError(f"{where}: {key} = {_short(value)}; expected a {expected.__name__}")
            if isinstance(value, float) and not math.isfinite(value):
                raise SchemaError(f"{where}: {key} = {value!r}; expected a finite number")
            kwargs[key] = value
    try:
        return CostModel(**kwargs)
    except ValueError as exc:
        raise SchemaError(f"{where}: {exc}") from None


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
    return Prepared(experiment, tuple(instances), tuple(cells), cost)


# ------------------------------------------------------------------------------------ running cells
#: ``resolve(entry, model_label) -> Method``: the method a cell runs (learned ones are resolved at the edge).
MethodResolver = Callable[[MethodEntry, str], Method]


def resolve_registered(entry: MethodEntry, model: str) -> Method:
    """The default :data:`MethodResolver`: registered methods only."""
    if entry.kind != "registered":
        raise ValueError(
            f"method {entry.name!r} ({entry.kind}) needs the Ray edge's resolver (placement_rl.rl.compare)"
        )
    return get_method(entry.method)


def measure_cell(
    instance: Instance,
    cell: Cell,
    entry: MethodEntry,
    cost_model: CostModel | None = None,
    *,
    resolve: MethodResolver = resolve_registered,
    extra_options: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> MethodResult:
    """Run one cell: its method on its instance through :func:`compare_methods`, named by its label."""
    method = dataclasses.replace(resolve(entry, instance.source), name=entry.name)
    options = {**entry.options, **(extra_options or {})}
    if cell.seed is not None:
        options["seed"] = cell.seed
    [result] = compare_methods(
        instance.graph,
        instance.topology,
        [method],
        cost_model=cost_model,
        options={entry.name: options} if options else None,
        progress=progress,
    )
    return result


@dataclass(frozen=True)
class Measured:
    """A cell run in this process: its row and the full :class:`MethodResult` (plan and simulation)."""

    cell: Cell
    row: dict[str, Any]
    result: MethodResult


def measure_cells(
    prepared: Prepared,
    *,
    resolve: MethodResolver = resolve_registered,
    extra_options: Callable[[MethodEntry], Mapping[str, Any]] | None = None,
    progress: bool = False,
    on_result: Callable[[Measured], None] | None = None,
) -> list[Measured]:
    """Run every cell one after the other in this process and keep the full results (``plan`` and
    ``evaluate``: the same cells and rows as ``compare``, no output folder). Errors propagate.

    Args:
        prepared: the experiment, checked.
        resolve: the methods of cells.
        extra_options: per method entry, runtime options (e.g. MCMC's ``task_map``).
        progress: let the methods show their progress bars.
        on_result: called with each cell as soon as it is done.
    """
    out = []
    for cell in prepared.cells:
        entry, inst = prepared.entry(cell.method), prepared.instance(cell.instance)
        if entry.kind == "unavailable":
            continue
        extra = extra_options(entry) if extra_options is not None else None
        result = measure_cell(
            inst, cell, entry, prepared.cost_model, resolve=resolve, extra_options=extra, progress=progress
        )
        row = cell_row(cell, inst, result, experiment=prepared.experiment.name, note=held_out_note(entry, inst))
        measured = Measured(cell, row, result)
        out.append(measured)
        if on_result is not None:
            on_result(measured)
    return out


def plan_file_name(cell: Cell) -> str:
    """Where a cell's plan goes inside the output folder (one safe path component per part)."""
    from placement_rl.paths import safe_name

    seed = "" if cell.seed is None else f"-seed{cell.seed}"
    return f"plans/{safe_name(cell.instance)}/{safe_name(cell.method)}{seed}.json"


def cell_row(
    cell: Cell,
    instance: Instance,
    result: MethodResult | None,
    *,
    experiment: str = "",
    status: str = "ok",
    note: str = "",
    plan_file: str | None = None,
) -> dict[str, Any]:
    """The one row format of ``compare``, ``plan`` and ``evaluate``: the cell, then
    :meth:`MethodResult.row` (``None`` fields for cells that did not run)."""
    head = {
        "cell": cell.key,
        "experiment": experiment,
        "instance": instance.id,
        "model": instance.model,
        "graph": instance.graph.name,
        "topology": instance.topology.name,
        "batch_size": instance.graph.batch_size,
        "devices": instance.topology.num_devices,
        "method": cell.method,
        "seed": cell.seed,
        "status": status,
        "note": note,
    }
    body: dict[str, Any]
    if result is not None:
        body = {k: v for k, v in result.row().items() if k not in ("instance", "method")}
        body["dp_makespan_s"] = result.dp_makespan_s
        body["anytime"] = [list(p) for p in result.anytime]  # an infinite best cost (nothing fits yet): null
        if result.note:
            head["note"] = f"{note}; {result.note}" if note else result.note
    else:
        body = dict.fromkeys(ROW_FIELDS)
        body["anytime"] = []
    return finite_or_none({**head, **body, "plan_file": plan_file, "digest": cell.digest})


#: The fields :meth:`MethodResult.row` contributes (``None`` in rows of cells that did not run).
ROW_FIELDS = (
    "makespan_s",
    "samples_per_s",
    "speedup_over_dp",
    "speedup_over",
    "lower_bound_s",
    "headroom_captured",
    "max_peak_memory_bytes",
    "peak_memory_bytes",
    "memory_capacity_bytes",
    "memory_over_bytes",
    "comm_bytes",
    "busiest_link_bytes",
    "oom",
    "oom_devices",
    "devices_used",
    "search_s",
    "dp_makespan_s",
)


@dataclass(frozen=True)
class CellOutcome:
    """What a cell task sends back: its row and its plan (``None`` on error)."""

    row: dict[str, Any]
    plan: Plan | None


def execute_cell(
    instance: Instance,
    cell: Cell,
    entry: MethodEntry,
    cost_model: CostModel | None,
    experiment: str,
    resolve: MethodResolver = resolve_registered,
    extra_options: Mapping[str, Any] | None = None,
) -> CellOutcome:
    """One cell as a task (module level, so Ray can ship it): errors become ``status: error`` rows."""
    note = held_out_note(entry, instance)
    try:
        result = measure_cell(instance, cell, entry, cost_model, resolve=resolve, extra_options=extra_options)
    except Exception as exc:  # a failed cell must not take the others down; its row says why
        first = str(exc).splitlines()[0] if str(exc) else ""
        note = f"{type(exc).__name__}: {first}"
        return CellOutcome(cell_row(cell, instance, None, experiment=experiment, status="error", note=note), None)
    row = cell_row(cell, instance, result, experiment=experiment, note=note, plan_file=plan_file_name(cell))
    return CellOutcome(row, result.plan)


def held_out_note(entry: MethodEntry, instance: Instance) -> str:
    """``held out`` for a learned method's instance whose model its training did not see."""
    return "held out from training" if instance.source in entry.held_out_for(instance.source) else ""


class CellRunner(Protocol):
    """``runner(fn, args) -> iterator of (index, fn(*args[index]))`` in the order the calls finish.

    A call that died outside ``fn`` (a crashed worker) comes back as its exception, and its cell's
    row says so. The driver consumes results as they arrive and may stop early (Ctrl-C): a runner
    that holds remote work cancels it when its iterator is closed.
    """

    def __call__(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]: ...


def serial_cells(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
    """The default :class:`CellRunner`: one cell after the other, in this process."""
    for k, a in enumerate(args):
        yield k, fn(*a)


# ------------------------------------------------------------------------------------- the driver
@dataclass(frozen=True)
class Report:
    """What :func:`run_experiment` did.

    Attributes:
        out_dir: the output folder.
        rows: the latest row of every cell of the experiment that has one, in cell order.
        summary: the per-method summary (:func:`summarize`).
        ran: cells computed by this call.
        skipped: cells already finished (``resume``).
        failed: rows of cells that failed (``status: error``).
        files: the outputs written.
        interrupted: whether the run stopped early (Ctrl-C).
    """

    out_dir: Path
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    ran: int
    skipped: int
    failed: list[dict[str, Any]]
    files: list[Path]
    interrupted: bool = False


def _is_number(value: Any, *, low: float = -math.inf, null: bool = False) -> bool:
    if value is None:
        return null
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= low


#: What every row holds, by key: (test, what is expected).
_ROW_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "cell": (lambda v: isinstance(v, str) and bool(v), "a cell id"),
    "instance": (lambda v: isinstance(v, str), "a string"),
    "method": (lambda v: isinstance(v, str), "a string"),
    "seed": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "an integer or null"),
    "status": (lambda v: v in ("ok", "unavailable", "error"), "ok, unavailable or error"),
    "note": (lambda v: isinstance(v, str), "a string"),
    "digest": (lambda v: isinstance(v, str), "a string"),
}
#: What the row of a cell that ran (``status: ok``) holds besides, by key.
_OK_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "makespan_s": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "speedup_over_dp": (lambda v: _is_number(v, low=0, null=True), "a number >= 0 or null"),
    "speedup_over": (
        lambda v: isinstance(v, dict) and all(_is_number(x, null=True) and (x is None or x > 0) for x in v.values()),
        "an object of speedups > 0",
    ),
    "lower_bound_s": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "headroom_captured": (lambda v: _is_number(v, null=True), "a number or null"),
    "max_peak_memory_bytes": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "comm_bytes": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "busiest_link_bytes": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "oom": (lambda v: isinstance(v, bool), "true or false"),
    "search_s": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "dp_makespan_s": (lambda v: _is_number(v, low=0), "a number >= 0"),
    "anytime": (
        lambda v: (
            isinstance(v, list)
            and all(isinstance(p, list) and len(p) == 2 and _is_number(p[0]) and _is_number(p[1], null=True) for p in v)
        ),
        "a list of [seconds, cost] pairs",
    ),
    "plan_file": (lambda v: v is None or isinstance(v, str), "a path or null"),
}


def row_problem(row: Any) -> str | None:
    """What is wrong with a ``results.jsonl`` row (``None``: nothing): it must be an object with the
    keys of :func:`cell_row`, of the right types, as every table and the summary read them."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    checks = {**_ROW_KEYS, **(_OK_KEYS if row.get("status") == "ok" else {})}
    missing = [k for k in checks if k not in row]
    if missing:
        return f"missing key(s) {missing}"
    for key, (test, expected) in checks.items():
        if not test(row[key]):
            return f"{key} = {_short(row[key], 80)}; expected {expected}"
    return None


def read_rows(path: Path, damaged: list[str] | None = None) -> list[dict[str, Any]]:
    """The good rows of a ``results.jsonl``, in file order.

    A damaged line (cut short by a crash while it was written, not JSON, not a row object, a key
    missing or of the wrong type: :func:`row_problem`) is skipped, its cell counts as not run, and a
    message naming the file, the line and what was expected goes to ``damaged``. The file itself is
    never changed here.
    """
    if not path.exists():
        return []
    if not path.is_file():
        raise SchemaError(f"{path} is not a file; expected the results.jsonl of an earlier run")
    rows: list[dict[str, Any]] = []
    lines = path.read_bytes().split(b"\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path}:{k + 1}"
        try:
            row = loads_json(line.decode("utf-8"), where)
        except SchemaError as exc:
            torn = " (a write cut short?)" if k == len(lines) - 1 else ""
            problem = str(exc).removeprefix(f"{where}: ") + torn
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        else:
            found = row_problem(row)
            if found is None:
                rows.append(row)
                continue
            problem = found
        if damaged is not None:
            damaged.append(f"{where}: skipped a damaged row: {problem}; expected one row object per line")
    return rows


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append one row as a JSON line and flush it to disk (what ``resume`` relies on). A file whose last
    line was cut short gets a line break first, so the new row stands on a line of its own."""
    line = (dumps_json(row, indent=None) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


#: The most damaged-row warnings ``run_experiment`` prints one by one.
MAX_DAMAGED_WARNINGS = 10


def run_experiment(
    prepared: Prepared,
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    runner: CellRunner = serial_cells,
    resolve: MethodResolver = resolve_registered,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> Report:
    """Run the cells that are not finished yet and write every output (see the module docstring).

    Args:
        prepared: the experiment, checked (:func:`prepare`).
        out_dir: the output folder.
        resume: skip the cells ``results.jsonl`` already has (same digest); without it an existing
            ``results.jsonl`` is an error, so that no result is overwritten.
        runner: runs the cells (:class:`CellRunner`; :func:`serial_cells` by default).
        resolve: the methods of cells (learned ones need the edge's resolver).
        progress: one progress bar over the cells.
        on_row: called with each new row.

    Returns:
        The report; on Ctrl-C the outputs are written for the finished cells and ``KeyboardInterrupt``
        propagates.
    """
    from placement_rl.paths import output_folder
    from placement_rl.progress import Progress

    exp = prepared.experiment
    out = output_folder(out_dir, "--out")
    log = out / RESULTS
    if log.exists() and log.stat().st_size > 0 and not resume:
        raise ValueError(f"{log} exists: pass --resume to finish that run, or choose another --out folder")
    damaged: list[str] = []
    previous = read_rows(log, damaged) if resume else []  # before anything is written
    write_json(out / EXPERIMENT_FILE, exp.to_dict())
    _write_graphs(out, prepared)
    for message in damaged[:MAX_DAMAGED_WARNINGS]:
        print(f"warning: {message}", file=sys.stderr, flush=True)
    if len(damaged) > MAX_DAMAGED_WARNINGS:
        print(f"warning: {len(damaged) - MAX_DAMAGED_WARNINGS} more damaged rows in {log}", file=sys.stderr)
    if damaged:
        print(
            f"warning: {log} is left as it is; the cells of its damaged rows run again unless another line has them",
            file=sys.stderr,
            flush=True,
        )
    wanted = {c.key: c for c in prepared.cells}
    latest: dict[str, dict[str, Any]] = {}
    for row in previous:
        cell = wanted.get(row["cell"])
        if cell is not None and row.get("digest") == cell.digest:
            latest[row["cell"]] = row
    done = {k for k, r in latest.items() if r.get("status") in FINISHED}
    todo = [c for c in prepared.cells if c.key not in done]
    ran = 0
    interrupted = False

    def record(row: dict[str, Any], plan: Plan | None) -> None:
        nonlocal ran
        if plan is not None and row.get("plan_file"):
            plan.to_json(out / row["plan_file"])
        append_row(log, row)
        latest[row["cell"]] = row
        ran += 1
        if on_row is not None:
            on_row(row)

    bar = Progress(len(prepared.cells), f"compare {exp.name}", "cell", enabled=progress)
    bar.update_to(len(done))
    tasks, cells = [], []
    for cell in todo:
        entry, inst = prepared.entry(cell.method), prepared.instance(cell.instance)
        if entry.kind == "unavailable":
            record(cell_row(cell, inst, None, experiment=exp.name, status="unavailable", note=entry.note), None)
            bar.advance()
            continue
        tasks.append((inst, cell, entry, prepared.cost_model, exp.name, resolve))
        cells.append((cell, inst))
    results = runner(execute_cell, tasks)
    try:
        for k, outcome in results:
            if isinstance(outcome, BaseException):  # the task died outside the cell (a crashed worker)
                cell, inst = cells[k]
                note = f"{type(outcome).__name__}: {str(outcome).splitlines()[0] if str(outcome) else ''}"
                outcome = CellOutcome(cell_row(cell, inst, None, experiment=exp.name, status="error", note=note), None)
            record(outcome.row, outcome.plan)
            bar.advance(last=f"{outcome.row['method']} on {outcome.row['instance']}")
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        close = getattr(results, "close", None)
        if callable(close):
            close()
        bar.close()
        rows = [latest[c.key] for c in prepared.cells if c.key in latest]
        files = write_outputs(out, exp, rows)
        if interrupted:
            print(
                f"interrupted: {sum(r['status'] in FINISHED for r in rows)} of {len(prepared.cells)} cells "
                f"finished, kept in {log}; run again with --resume to finish",
                flush=True,
            )
    failed = [r for r in rows if r["status"] == "error"]
    return Report(out, rows, summarize(rows), ran, len(done), failed, [log, *files], interrupted)


def _write_graphs(out: Path, prepared: Prepared) -> None:
    """The graph of every instance whose plans ``simulate --model`` could not rebuild from a zoo name
    and a batch size (coarsened graphs, model options), as ``graphs/<graph name>.json``."""
    seen: set[str] = set()
    models = {m.name: m for m in prepared.experiment.models}
    for inst in prepared.instances:
        entry = models[inst.model]
        if (entry.coarsen or entry.options) and inst.graph.name not in seen:
            from placement_rl.paths import safe_name

            seen.add(inst.graph.name)
            path = out / "graphs" / f"{safe_name(inst.model)}-b{inst.graph.batch_size}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            inst.graph.to_json(path)


# -------------------------------------------------------------------------------------- outputs
def reference_names(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The data-parallel references the rows have speedups over, in :data:`DP_REFERENCES` order."""
    found = {name for r in rows for name in (r.get("speedup_over") or {})}
    return [n for n in DP_REFERENCES if n in found] + sorted(found - set(DP_REFERENCES))


def csv_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    refs = reference_names(rows)
    return [
        "instance",
        "model",
        "topology",
        "batch_size",
        "devices",
        "method",
        "seed",
        "status",
        "makespan_s",
        "samples_per_s",
        *[f"speedup_over_{n}" for n in refs],
        "lower_bound_s",
        "headroom_captured",
        "max_peak_memory_bytes",
        "memory_over_bytes",
        "oom",
        "comm_bytes",
        "busiest_link_bytes",
        "devices_used",
        "search_s",
        "plan_file",
        "note",
    ]


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """``results.csv``: one line per row, speedups flattened to ``speedup_over_<reference>``."""
    columns = csv_columns(rows)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        flat = {**r, **{f"speedup_over_{n}": v for n, v in (r.get("speedup_over") or {}).items()}}
        writer.writerow({k: ("" if flat.get(k) is None else flat.get(k)) for k in columns})
    return buffer.getvalue()


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a Markdown table (milliseconds, speedups, GiB, GB, seconds)."""
    refs = reference_names(rows)
    labels = {"data_parallel": "vs DP", "data_parallel_per_tensor": "vs DP per-tensor"}
    head = ["instance", "method", "seed", "ms/iter", *[labels.get(n, f"vs {n}") for n in refs]]
    head += ["bound ms", "headroom", "peak GiB", "busiest link GB", "comm GB", "OOM", "search s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            cells = [r["instance"], r["method"], _fmt(r["seed"], "d"), f"{r['status']}: {r['note']}"]
            cells += [""] * (len(head) - len(cells))
        else:
            speedups = r.get("speedup_over") or {}
            cells = [
                r["instance"],
                r["method"],
                _fmt(r["seed"], "d"),
                f"{r['makespan_s'] * 1e3:,.2f}",
                *[_fmt(speedups.get(n), ".2f", "x") for n in refs],
                f"{r['lower_bound_s'] * 1e3:,.2f}",
                _fmt(r["headroom_captured"], ".0%"),
                f"{r['max_peak_memory_bytes'] / 2**30:.2f}",
                f"{r['busiest_link_bytes'] / 1e9:.2f}",
                f"{r['comm_bytes'] / 1e9:.2f}",
                "yes" if r["oom"] else "no",
                f"{r['search_s']:.1f}",
            ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _per_instance(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Mapping[str, Any]]]:
    """instance -> method -> the median-makespan row over its seeds (ok rows only)."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault((r["instance"], r["method"]), []).append(r)
    out: dict[str, dict[str, Mapping[str, Any]]] = {}
    for (inst, method), group in groups.items():
        ordered = sorted(group, key=lambda r: r["makespan_s"])
        out.setdefault(inst, {})[method] = ordered[(len(ordered) - 1) // 2]
    return out


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per method: cells, instances, the geometric-mean speedup over each data-parallel reference
    (over instances where its plan fits; a seeded method counts its median seed), wins (instances
    where its fitting plan is the fastest, ties shared), OOM count (cells), median headroom captured
    and median search seconds."""
    by_instance = _per_instance(rows)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    refs = reference_names(rows)
    wins = dict.fromkeys(methods, 0)
    for per_method in by_instance.values():
        fitting = {m: r["makespan_s"] for m, r in per_method.items() if not r["oom"]}
        if fitting:
            best = min(fitting.values())
            for m, makespan in fitting.items():
                if makespan <= best * (1 + 1e-9):
                    wins[m] += 1
    summary = []
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        medians = [per[m] for per in by_instance.values() if m in per]
        fits = [r for r in medians if not r["oom"]]
        entry: dict[str, Any] = {
            "method": m,
            "cells": len(mine),
            "ok": sum(r["status"] == "ok" for r in mine),
            "unavailable": sum(r["status"] == "unavailable" for r in mine),
            "errors": sum(r["status"] == "error" for r in mine),
            "instances": len(medians),
            "instances_fit": len(fits),
        }
        for n in refs:
            values = [r["speedup_over"][n] for r in fits if n in (r.get("speedup_over") or {})]
            entry[f"geomean_speedup_over_{n}"] = (
                math.exp(statistics.fmean(math.log(v) for v in values)) if values else None
            )
        headrooms = [r["headroom_captured"] for r in fits if r["headroom_captured"] is not None]
        entry["wins"] = wins[m]
        entry["oom_cells"] = sum(bool(r["oom"]) for r in mine if r["status"] == "ok")
        entry["median_headroom_captured"] = statistics.median(headrooms) if headrooms else None
        searches = [r["search_s"] for r in mine if r["status"] == "ok"]
        entry["median_search_s"] = statistics.median(searches) if searches else None
        summary.append(entry)
    return summary


def no_fit(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The instances where no method found a plan that fits in memory, each with the plan that needs
    the least: ``instance``, ``method`` (and ``seed``), ``memory_over_bytes`` (how far its fullest
    device is over), that ``device`` with its ``peak_bytes`` and ``capacity_bytes`` (``None`` in rows
    of earlier versions, which lack the capacities), and ``plans`` (the rows that ran)."""
    out = []
    for inst, group in _group(r for r in rows if r["status"] == "ok").items():
        if any(not r["oom"] for r in group):
            continue
        best = min(group, key=lambda r: (_over(r)[0], r["max_peak_memory_bytes"], r["makespan_s"]))
        over, device, peak, capacity = _over(best)
        out.append(
            {
                "instance": inst,
                "method": best["method"],
                "seed": best["seed"],
                "memory_over_bytes": over,
                "device": device,
                "peak_bytes": peak,
                "capacity_bytes": capacity,
                "plans": len(group),
            }
        )
    return out


def _group(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["instance"], []).append(r)
    return groups


def _over(row: Mapping[str, Any]) -> tuple[float, str | None, float | None, float | None]:
    """(bytes over memory on the fullest device, that device, its peak, its capacity) of a row."""
    peaks = row.get("peak_memory_bytes") or {}
    capacities = row.get("memory_capacity_bytes") or {}
    shared = [d for d in peaks if isinstance(capacities.get(d), (int, float)) and isinstance(peaks[d], (int, float))]
    if not shared:
        return float(row.get("memory_over_bytes") or 0), None, None, None
    device = max(shared, key=lambda d: peaks[d] - capacities[d])
    return max(peaks[device] - capacities[device], 0), device, peaks[device], capacities[device]


def no_fit_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One sentence per instance where no plan fits in memory (:func:`no_fit`)."""
    from placement_rl.plots import format_bytes

    lines = []
    for n in no_fit(rows):
        seed = "" if n["seed"] is None else f" (seed {n['seed']})"
        where = (
            f" on {n['device']} (peak {format_bytes(n['peak_bytes'])} of {format_bytes(n['capacity_bytes'])})"
            if n["device"] is not None
            else ""
        )
        lines.append(
            f"{n['instance']}: no method found a plan that fits in memory ({n['plans']} plans); the least-memory "
            f"plan is {n['method']}{seed}, {format_bytes(n['memory_over_bytes'])} over{where}; "
            "`placement-rl plan` on this instance suggests what would fit"
        )
    return lines


def summary_markdown(summary: Sequence[Mapping[str, Any]]) -> str:
    """The per-method summary as a Markdown table."""
    refs = [k[len("geomean_speedup_over_") :] for k in (summary[0] if summary else {}) if k.startswith("geomean_")]
    labels = {"data_parallel": "geomean vs DP", "data_parallel_per_tensor": "geomean vs DP per-tensor"}
    head = ["method", "instances (fit)", *[labels.get(n, f"geomean vs {n}") for n in refs]]
    head += ["wins", "OOM cells", "median headroom", "median search s", "not run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        not_run = []
        if s["unavailable"]:
            not_run.append(f"{s['unavailable']} unavailable")
        if s["errors"]:
            not_run.append(f"{s['errors']} errors")
        cells = [
            s["method"],
            f"{s['instances']} ({s['instances_fit']})",
            *[_fmt(s[f"geomean_speedup_over_{n}"], ".2f", "x") for n in refs],
            s["wins"],
            s["oom_cells"],
            _fmt(s["median_headroom_captured"], ".0%"),
            _fmt(s["median_search_s"], ".1f"),
            ", ".join(not_run) or "-",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, experiment: Experiment, rows: Sequence[Mapping[str, Any]]) -> list[Path]:
    """Write ``results.csv``, ``results.md``, ``summary.csv``, ``summary.md`` and the PNGs from ``rows``."""
    summary = summarize(rows)
    files = [out / CSV_FILE, out / MARKDOWN, out / SUMMARY_CSV, out / SUMMARY_MD]
    _write_text(files[0], csv_text(rows))
    title = f"# {experiment.name}\n\n" + (f"{experiment.description.strip()}\n\n" if experiment.description else "")
    unfit = "".join(f"\n- {line}\n" for line in no_fit_lines(rows))
    _write_text(files[1], title + markdown_table(rows) + "\n" + summary_markdown(summary) + unfit)
    buffer = io.StringIO()
    if summary:
        writer = csv.DictWriter(buffer, list(summary[0]), lineterminator="\n")
        writer.writeheader()
        for s in summary:
            writer.writerow({k: ("" if v is None else v) for k, v in s.items()})
    _write_text(files[2], buffer.getvalue())
    _write_text(files[3], summary_markdown(summary) + unfit)
    ok = [r for r in rows if r["status"] == "ok"]
    if ok:
        files.append(speedup_png(ok, out / SPEEDUP_PNG, title=f"{experiment.name}: speedup over data parallelism"))
        files.append(anytime_png(ok, out / ANYTIME_PNG, title=f"{experiment.name}: best makespan vs search time"))
        per_instance = list(dict.fromkeys(r["instance"] for r in ok))[:MAX_ANYTIME_FILES]
        files.extend(
            anytime_pngs([r for r in ok if r["instance"] in per_instance], out / ANYTIME_DIR, f"{experiment.name}: ")
        )
    return files


#: The most instances the PNGs draw one by one (bars, anytime panels); more become a heat map / the first ones.
MAX_BAR_INSTANCES, MAX_ANYTIME_PANELS = 24, 12
#: The most instances that get their own anytime PNG (the first ones; a file takes ~0.3 s to draw).
MAX_ANYTIME_FILES = 48


def speedup_png(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Speedup over data parallelism per instance and method: grouped bars (hatched: does not fit),
    or a heat map for many instances. A seeded method shows its median seed."""
    import numpy as np

    from placement_rl.plots import pyplot, save_png

    plt = pyplot()
    by_instance = _per_instance(rows)
    instances = list(by_instance)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    values = np.full((len(instances), len(methods)), np.nan)
    oom = np.zeros_like(values, dtype=bool)
    for i, inst in enumerate(instances):
        for j, m in enumerate(methods):
            r = by_instance[inst].get(m)
            if r is not None:
                values[i, j], oom[i, j] = r["speedup_over_dp"], r["oom"]
    if len(instances) <= MAX_BAR_INSTANCES:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(instances) * max(1, len(methods)) / 3 + 2), 4.5))
        width = 0.8 / max(len(methods), 1)
        x = np.arange(len(instances))
        for j, m in enumerate(methods):
            bars = ax.bar(x + (j - (len(methods) - 1) / 2) * width, np.nan_to_num(values[:, j]), width, label=m)
            for bar, bad in zip(bars, oom[:, j], strict=True):
                if bad:
                    bar.set_hatch("//")
                    bar.set_alpha(0.5)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xticks(
            x, instances, rotation=30 if len(instances) > 3 else 0, ha="right" if len(instances) > 3 else "center"
        )
        ax.set_ylabel("speedup over data parallelism (x)")
        ax.legend(fontsize="small", ncols=min(len(methods), 4))
    else:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(methods) + 2), max(4.0, 0.2 * len(instances) + 1.5)))
        logv = np.log2(np.where(values > 0, values, np.nan))
        limit = float(np.nanmax(np.abs(logv))) if np.isfinite(logv).any() else 1.0
        image = ax.imshow(logv, aspect="auto", cmap="RdBu", vmin=-limit, vmax=limit)
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax.set_yticks(range(len(instances)), instances, fontsize="x-small")
        bar = fig.colorbar(image, ax=ax)
        bar.set_label("log2 speedup over data parallelism")
    return save_png(fig, path, title)


def anytime_png(rows: Sequence[Mapping[str, Any]], path: Path, title: str = "") -> Path:
    """Best-found makespan against search time per method, one panel per instance (the first
    :data:`MAX_ANYTIME_PANELS`): a search's trace as a step line per seed, a method without a trace
    as a point at (search seconds, makespan); dashed: data parallelism, dotted: the compute bound."""
    from placement_rl.plots import pyplot, save_png

    plt = pyplot()
    instances = list(dict.fromkeys(r["instance"] for r in rows))[:MAX_ANYTIME_PANELS]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = {m: f"C{k % 10}" for k, m in enumerate(methods)}
    cols = min(len(instances), 3)
    nrows = math.ceil(len(instances) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.4 * nrows), squeeze=False)
    for ax, inst in zip(axes.flat, instances, strict=False):
        draw_anytime(ax, [r for r in rows if r["instance"] == inst], colors)
        ax.set_title(inst, fontsize="small")
    for ax in list(axes.flat)[len(instances) :]:
        ax.set_visible(False)
    return save_png(fig, path, title)


def draw_anytime(
    ax: Any,
    rows: Sequence[Mapping[str, Any]],
    colors: Mapping[str, str] | None = None,
    ylim_ms: tuple[float, float] | None = None,
) -> None:
    """One instance's anytime chart on ``ax`` (see :func:`anytime_png`); x is logarithmic, since the
    searches improve fastest early, and so is y where the makespans span more than a decade. ``rows``
    are :func:`cell_row` dicts (``anytime``, ``search_s``, ``makespan_s``, ``oom``, ``dp_makespan_s``,
    ``lower_bound_s``). ``ylim_ms``: a linear y range (a zoom) instead."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = colors or {m: f"C{k % 10}" for k, m in enumerate(methods)}
    labelled: set[str] = set()
    for r in rows:
        label = None if r["method"] in labelled else r["method"]
        labelled.add(r["method"])
        trace = [(t, c) for t, c in r.get("anytime") or [] if c is not None and math.isfinite(c)]
        if trace:
            xs = [max(t, 1e-3) for t, _ in trace]
            ys = [c * 1e3 for _, c in trace]
            ax.step(xs, ys, where="post", color=colors[r["method"]], label=label, alpha=0.8)
        else:
            ax.plot(
                [max(r["search_s"], 1e-3)],
                [r["makespan_s"] * 1e3],
                marker="x" if r["oom"] else "o",
                linestyle="none",
                color=colors[r["method"]],
                label=label,
            )
    ax.axhline(rows[0]["dp_makespan_s"] * 1e3, color="black", linestyle="--", linewidth=0.8, label="data parallel")
    ax.axhline(rows[0]["lower_bound_s"] * 1e3, color="grey", linestyle=":", linewidth=0.8, label="compute bound")
    ax.set_xscale("log")
    shown = [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y) and y > 0]
    if ylim_ms is not None:
        ax.set_ylim(*ylim_ms)
    elif shown and max(shown) > 10 * min(shown):  # a log axis only where the makespans span a decade
        ax.set_yscale("log")
    ax.set_xlabel("search s")
    ax.set_ylabel("best makespan ms")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="x-small")


def anytime_pngs(rows: Sequence[Mapping[str, Any]], folder: Path, title: str = "") -> list[Path]:
    """One anytime PNG per instance (:func:`draw_anytime`), ``folder/<instance>.png``; the colours of the
    methods are the same in every file. ``title`` is prefixed to each instance's name. Where a curve
    ends above 1.5x data parallelism (a learner far from the searches), a second panel zooms in on the
    plans near data parallelism."""
    from placement_rl.paths import safe_name
    from placement_rl.plots import pyplot, save_png

    plt = pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    colors = {m: f"C{k % 10}" for k, m in enumerate(methods)}
    files = []
    for inst in dict.fromkeys(r["instance"] for r in rows):
        mine = [r for r in rows if r["instance"] == inst]
        dp_ms = mine[0]["dp_makespan_s"] * 1e3
        zoom = any(r["makespan_s"] * 1e3 > 1.5 * dp_ms for r in mine)
        if not zoom:
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            draw_anytime(ax, mine, colors)
            files.append(save_png(fig, folder / f"{safe_name(inst)}.png", f"{title}{inst}"))
            continue
        fig, (ax, near) = plt.subplots(1, 2, figsize=(11.5, 4.2))
        draw_anytime(ax, mine, colors)
        best_ms = min(min(r["makespan_s"] * 1e3 for r in mine), dp_ms)
        draw_anytime(near, mine, colors, ylim_ms=(best_ms - 0.03 * dp_ms, 1.03 * dp_ms))
        ax.set_title("all methods", fontsize="small")
        near.set_title("near data parallelism (linear)", fontsize="small")
        near.get_legend().remove()
        files.append(save_png(fig, folder / f"{safe_name(inst)}.png", f"{title}{inst}"))
    return files

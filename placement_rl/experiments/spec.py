"""Experiment files: the records an experiment file becomes and their checks
(:func:`parse_experiment`), the cost model it names.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placement_rl.config import Rule, as_mapping, check_known, integer, option, parse, text
from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.methods import Method, get_method, method_names
from placement_rl.sim import CostModel

#: Options a method entry never sets itself: the seed comes from ``seeds``, task maps from the runner.
RUNTIME_OPTIONS = ("seed", "task_map", "delta")
#: Keys of a method entry besides the method's own options.
ENTRY_KEYS = ("method", "name", "optional")
#: Keys only learned methods take.
LEARNED_KEYS = ("checkpoint", "held_out", "env")
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
        env: a learned method's env options it plans with other than its training's
            (``{"max_groups": 60}``: a finer grouping; :func:`placement_rl.rl.policy.with_env`).
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
    env: Mapping[str, Any] = field(default_factory=dict)

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
        if self.env:
            out["env"] = _plain(self.env)
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
        folders = list(checkpoint.values()) if isinstance(checkpoint, Mapping) else [checkpoint]
        absent = [f for f in folders if not Path(f).exists()]
        if optional and absent:
            note = (
                f"agent {name!r}: checkpoint {absent[0]!r} does not exist yet (a checkpoint_* folder of "
                "`placement-rl train`)"
            )
            return MethodEntry(name, label, {}, checkpoint, held, True, kind="unavailable", note=note)
        env = entry.get("env", {})
        if not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
            raise SchemaError(
                f"{where}: env = {env!r}; expected a mapping of env options to plan with (e.g. {{max_groups: 60}})"
            )
        return MethodEntry(name, label, {}, checkpoint, held, optional, kind="learned", env=dict(env))
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

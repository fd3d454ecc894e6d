"""Problem instances for the environments: a model graph, its op groups and a cluster.

An :class:`Instance` is what one episode optimizes. Generators produce instances from the env's
random generator (``sample(rng)``), so an env's randomness stays in ``self.np_random``:

* :class:`FixedGenerator`: always the same zoo model (or graph) on the same topology.
* :class:`RandomGenerator`: a zoo model drawn from a list, on ``random_topology(seed)`` with the
  seed drawn from the train or test split (``placement_rl.topology.TRAIN_SEEDS`` /
  ``TEST_SEEDS``, disjoint), so evaluation runs on topologies never seen in training.
  ``held_out_models`` names models kept out of training: with ``model_split="train"`` they are
  never drawn, with ``model_split="test"`` only they are.
* :class:`PlantedGenerator`: a random variant of a planted kind (:mod:`placement_rl.planted`: slow
  links under parameter-heavy layers, mixed GPU types, recurrent layers sharing weights, models that
  fit only when split, ...), from variants the planted benchmarks do not evaluate (``first_variant``
  and up), so agents train on the kinds and are judged zero-shot on other instances of them.
* :class:`MixGenerator` (``{"kind": "mix", "generators": [...], "weights": [...]}``): each episode
  one of several generators, drawn by weight.

Graphs are imported and coarsened once per process and cached; instances are cheap to draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, Protocol

import numpy as np

from placement_rl import zoo
from placement_rl.config import check_fields, choice, integer, option, parse, sequence_of, text
from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.graph import OpGraph
from placement_rl.graph.coarsen import coarsen
from placement_rl.topology import (
    TEST_SEEDS,
    TRAIN_SEEDS,
    DeviceTopology,
    resolve_topology,
)

#: The largest global batch a generator takes (the op graphs' tensor sizes scale with it).
MAX_BATCH_SIZE = 1_000_000


def _brief(value: Any) -> str:
    """``repr(value)`` for an error message, cut at 120 characters."""
    text = repr(value)
    return text if len(text) <= 120 else f"{text[:120]}... ({len(text)} characters)"


@dataclass(frozen=True, eq=False)
class Instance:
    """One problem: place ``graph`` (the model's op graph) on ``topology``.

    Attributes:
        name: ``"<model>@<topology>"``.
        graph: the original op graph (final plans and rewards are simulated on it).
        topology: the cluster.
        groups: ``graph`` coarsened into op groups (the env's decision units), a valid ``OpGraph``
            whose ops list their ``members``; it is ``graph`` itself when no coarsening applies.
    """

    name: str
    graph: OpGraph
    topology: DeviceTopology
    groups: OpGraph
    cache: dict[str, Any] = field(default_factory=dict, repr=False)  # per-instance results the env reuses


@lru_cache(maxsize=32)
def _zoo_graph(model: str, batch_size: int | None) -> OpGraph:
    return zoo.load(model, batch_size=batch_size)


def _grouped(graph: OpGraph, max_groups: int, seed: int) -> OpGraph:
    """``graph`` itself when it is small enough, else its (cached) METIS coarsening.

    The small case bypasses the cache on purpose: the cache compares graphs by value, and the env
    tells "no coarsening" by identity (``groups is graph``).
    """
    if graph.num_ops <= max_groups:
        return graph
    return _coarsened(graph, max_groups, seed)


@lru_cache(maxsize=64)
def _coarsened(graph: OpGraph, max_groups: int, seed: int) -> OpGraph:
    return coarsen(graph, max_groups=max_groups, seed=seed)


@lru_cache(maxsize=64)
def _instance(model: str, batch_size: int | None, topology_spec: str, max_groups: int, seed: int) -> Instance:
    graph = _zoo_graph(model, batch_size)
    topology = resolve_topology(topology_spec)
    return Instance(f"{model}@{topology.name}", graph, topology, _grouped(graph, max_groups, seed))


def make_instance(graph: OpGraph, topology: DeviceTopology, max_groups: int, seed: int = 0) -> Instance:
    """An instance for a graph and topology you already hold (groups by METIS, at most ``max_groups``)."""
    return Instance(f"{graph.name}@{topology.name}", graph, topology, _grouped(graph, max_groups, seed))


class InstanceGenerator(Protocol):
    """Draws the instance of each episode."""

    def sample(self, rng: np.random.Generator, max_groups: int) -> Instance: ...


@dataclass(frozen=True)
class FixedGenerator:
    """The same model and topology every episode.

    Built by :func:`make_generator` (through :func:`placement_rl.config.parse`) or directly; either
    way its fields are checked, and unknown model or topology names fail here, naming the valid ones.

    Attributes:
        model: a zoo model name.
        topology: a preset name, ``random:SEED`` or a topology JSON file.
        batch_size: the global batch (default: the zoo's, the papers' setting); at most
            :data:`MAX_BATCH_SIZE`.
    """

    model: str = option("inception_v3", rule=text())
    topology: str = option("tag-testbed", rule=text())
    batch_size: int | None = option(None, rule=integer(low=1, high=MAX_BATCH_SIZE, null=True))

    def __post_init__(self) -> None:
        check_fields(self, "generator 'fixed'")

    def validate(self, where: str) -> None:
        """The model and topology exist (:class:`UnknownNameError` names the valid ones).

        Raises:
            UnknownNameError: for an unknown model or topology name.
            SchemaError: for a topology file that does not exist, cannot be read or is not a topology.
        """
        zoo.spec(self.model)
        try:
            resolve_topology(self.topology)
        except OSError as exc:  # a missing or unreadable file: a config error like any other
            raise SchemaError(f"{where}: topology = {_brief(self.topology)}: {exc}") from None
        except ValueError as exc:
            if type(exc) is not ValueError:  # SchemaError, UnknownNameError: they name the spec or file
                raise
            # A bare ValueError (Python's int() on a seed of thousands of digits) does not name it.
            raise SchemaError(f"{where}: topology = {_brief(self.topology)}: {exc}") from None

    def sample(self, rng: np.random.Generator, max_groups: int) -> Instance:
        return _instance(self.model, self.batch_size, self.topology, max_groups, 0)


#: The values of :attr:`RandomGenerator.topology_split` and :attr:`RandomGenerator.model_split`.
SPLITS: tuple[str, ...] = ("train", "test")


@dataclass(frozen=True)
class RandomGenerator:
    """A random zoo model on a random TAG-style topology each episode.

    Built by :func:`make_generator` (through :func:`placement_rl.config.parse`) or directly; either
    way its fields are checked, and unknown model names fail here, naming the valid ones.

    Attributes:
        models: the zoo models to draw from (uniformly).
        topology_split: ``"train"`` draws seeds from ``TRAIN_SEEDS``, ``"test"`` from ``TEST_SEEDS``.
        num_topologies: draw from the first ``num_topologies`` seeds of the split (a fixed pool,
            so instances repeat and their cached baselines pay off), or from the whole split if None;
            at most the split's size.
        held_out_models: models reserved for testing (see ``model_split``).
        model_split: ``"train"`` never draws ``held_out_models``; ``"test"`` draws only them.
        batch_size: the global batch (default: each model's zoo default); at most :data:`MAX_BATCH_SIZE`.
    """

    models: Sequence[str] = option(
        ("inception_v3", "resnet101", "vgg19", "transformer", "bert_small"), rule=sequence_of(text())
    )
    topology_split: Literal["train", "test"] = option("train", rule=choice(SPLITS))
    num_topologies: int | None = option(
        1000, rule=integer(low=1, high=min(len(TRAIN_SEEDS), len(TEST_SEEDS)), null=True)
    )
    held_out_models: Sequence[str] = option((), rule=sequence_of(text()))
    model_split: Literal["train", "test"] = option("train", rule=choice(SPLITS))
    batch_size: int | None = option(None, rule=integer(low=1, high=MAX_BATCH_SIZE, null=True))

    def __post_init__(self) -> None:
        check_fields(self, "generator 'random'")

    def validate(self, where: str) -> None:
        """The models exist (:class:`UnknownNameError` names the valid ones) and the split leaves one to draw."""
        for m in (*self.models, *self.held_out_models):
            zoo.spec(m)
        if not self.pool:
            raise SchemaError(
                f"{where}: no model to draw: models {list(self.models)} minus held_out_models "
                f"{list(self.held_out_models)} is empty for model_split={self.model_split!r}"
            )

    @property
    def pool(self) -> tuple[str, ...]:
        """The models this generator draws from."""
        if self.model_split == "test":
            return tuple(self.held_out_models)
        return tuple(m for m in self.models if m not in set(self.held_out_models))

    def sample(self, rng: np.random.Generator, max_groups: int) -> Instance:
        pool = self.pool
        model = pool[int(rng.integers(len(pool)))]
        seeds = TRAIN_SEEDS if self.topology_split == "train" else TEST_SEEDS
        count = len(seeds) if self.num_topologies is None else min(self.num_topologies, len(seeds))
        seed = seeds.start + int(rng.integers(count))
        return _instance(model, self.batch_size, f"random:{seed}", max_groups, 0)


def _planted_kinds() -> tuple[str, ...]:
    from placement_rl.planted import kind_names

    return tuple(kind_names())


@lru_cache(maxsize=256)
def _planted_instance(kind: str, variant: int, max_groups: int) -> Instance:
    from placement_rl.planted import draw, instance_name

    # The kind's graph and cluster as drawn for the variant; the planted plan and its margin check are
    # the benchmarks' business (a variant whose plan misses the margin is still a fair training instance).
    made = draw(kind, variant)
    graph = made.graph
    return Instance(instance_name(kind, variant), graph, made.topology, _grouped(graph, max_groups, 0))


#: The first planted variant :class:`PlantedGenerator` draws by default: far above the variants the
#: planted benchmarks and tests evaluate (0: designed, 1, 2, ...).
PLANTED_TRAIN_VARIANT = 1000


@dataclass(frozen=True)
class PlantedGenerator:
    """A random variant of a planted kind each episode (:mod:`placement_rl.planted`).

    Each kind is a way data parallelism goes wrong by construction (slow links under parameter-heavy
    layers, mixed GPU types, weights shared across steps, a model that fits only when split, deep
    models over slow links, a straggler GPU, a huge embedding table, optimizer state that does not
    fit); a variant draws the kind's sizes, link speeds and device counts from its ranges, seeded by
    ``(kind, variant)``.

    Attributes:
        kinds: the planted kinds to draw from (uniformly); default every kind.
        first_variant: the first variant drawn; the default, :data:`PLANTED_TRAIN_VARIANT`, keeps
            training away from the variants the planted benchmarks evaluate.
        num_variants: how many variants per kind, from ``first_variant`` on (a fixed pool).
    """

    kinds: Sequence[str] = option((), rule=sequence_of(text()))
    first_variant: int = option(PLANTED_TRAIN_VARIANT, rule=integer(low=1, high=10**9))
    num_variants: int = option(16, rule=integer(low=1, high=10**6))

    def __post_init__(self) -> None:
        check_fields(self, "generator 'planted'")

    def validate(self, where: str) -> None:
        """The kinds exist (:class:`UnknownNameError` names the valid ones)."""
        known = _planted_kinds()
        for kind in self.kinds:
            if kind not in known:
                raise UnknownNameError(f"{where}: planted kind", kind, known)

    @property
    def pool(self) -> tuple[str, ...]:
        """The kinds this generator draws from."""
        return tuple(self.kinds) or _planted_kinds()

    def sample(self, rng: np.random.Generator, max_groups: int) -> Instance:
        pool = self.pool
        kind = pool[int(rng.integers(len(pool)))]
        variant = self.first_variant + int(rng.integers(self.num_variants))
        return _planted_instance(kind, variant, max_groups)


@dataclass(frozen=True)
class MixGenerator:
    """Each episode, one of ``generators`` drawn with probability proportional to ``weights``.

    Built by :func:`make_generator` from ``{"kind": "mix", "generators": [<generator>, ...],
    "weights": [...]}``; each entry is a generator mapping of its own (``mix`` included).

    Attributes:
        generators: the generators, at least one.
        weights: one positive weight per generator (default: equal).
    """

    generators: tuple[InstanceGenerator, ...]
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not self.generators:
            raise SchemaError("generator 'mix': generators = []; expected at least one generator")
        if self.weights is not None:
            weights = list(self.weights)
            if len(weights) != len(self.generators) or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and 0 < w < float("inf") for w in weights
            ):
                raise SchemaError(
                    f"generator 'mix': weights = {_brief(weights)}; expected one positive number per generator "
                    f"({len(self.generators)})"
                )

    def sample(self, rng: np.random.Generator, max_groups: int) -> Instance:
        if self.weights is None:
            pick = int(rng.integers(len(self.generators)))
        else:
            w = np.asarray(self.weights, dtype=np.float64)
            pick = int(rng.choice(len(w), p=w / w.sum()))
        return self.generators[pick].sample(rng, max_groups)


GENERATORS: dict[str, Any] = {
    "fixed": FixedGenerator,
    "random": RandomGenerator,
    "planted": PlantedGenerator,
    "mix": MixGenerator,
}


def make_generator(spec: InstanceGenerator | Mapping[str, Any] | None) -> InstanceGenerator:
    """A generator from an env config value: an object with ``sample``, or a mapping with ``kind``.

    ``{"kind": "fixed", "model": "vgg19", "topology": "tag-testbed"}`` or ``{"kind": "random",
    "models": [...], "topology_split": "test"}``; other keys are the generator's fields, checked by
    :func:`placement_rl.config.parse`.

    Raises:
        UnknownNameError: for an unknown kind, model or topology, naming the valid ones.
        SchemaError: (a ``ValueError``) for a value that is neither a mapping nor a generator, an
            unknown key, naming the valid ones, or a value its field's rule refuses.
    """
    if spec is None:
        return FixedGenerator()
    if hasattr(spec, "sample"):
        return spec  # type: ignore[return-value]
    if not isinstance(spec, Mapping):
        raise SchemaError(f"generator = {_brief(spec)}; expected a mapping with 'kind' or a generator object")
    options = dict(spec)
    kind = options.pop("kind", "fixed")
    if not isinstance(kind, str) or kind not in GENERATORS:
        raise UnknownNameError("generator kind", kind, GENERATORS)
    if kind == "mix":
        return _mix(options)
    for key in ("models", "held_out_models", "kinds"):  # lists from YAML; the generator is frozen and hashable
        if isinstance(options.get(key), list):
            options[key] = tuple(options[key])
    return parse(GENERATORS[kind], options, f"generator {kind!r}")


def _mix(options: Mapping[str, Any]) -> MixGenerator:
    """``{"generators": [...], "weights": [...]}`` (the rest of a ``mix`` generator mapping), checked."""
    unknown = sorted(set(options) - {"generators", "weights"})
    if unknown:
        raise SchemaError(f"generator 'mix': unknown key(s) {unknown}; expected 'generators' and 'weights'")
    entries = options.get("generators")
    if not isinstance(entries, (list, tuple)) or not entries:
        raise SchemaError(
            f"generator 'mix': generators = {_brief(entries)}; expected a non-empty list of generator mappings"
        )
    weights = options.get("weights")
    if weights is not None and not isinstance(weights, (list, tuple)):
        raise SchemaError(f"generator 'mix': weights = {_brief(weights)}; expected a list of positive numbers")
    return MixGenerator(tuple(make_generator(entry) for entry in entries), None if weights is None else tuple(weights))

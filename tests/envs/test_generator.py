"""Instance generators: fixed instances, train/test topology splits, held-out models, errors."""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from placement_rl.envs import FixedGenerator, Instance, RandomGenerator, make_generator, make_instance
from placement_rl.errors import UnknownNameError
from placement_rl.topology import TEST_SEEDS, TRAIN_SEEDS, load_preset, random_topology


def topology_seed(instance: Instance) -> int:
    """The seed of a random topology: ``random_topology(seed)`` is named ``random-{seed}``."""
    prefix = "random-"
    assert instance.topology.name.startswith(prefix), instance.topology.name
    return int(instance.topology.name[len(prefix) :])


def draw(generator: Any, count: int, seed: int = 0, max_groups: int = 8) -> list[Instance]:
    rng = np.random.default_rng(seed)
    return [generator.sample(rng, max_groups) for _ in range(count)]


def test_fixed_generator_returns_the_same_instance() -> None:
    gen = FixedGenerator(model="alexnet", topology="trinity", batch_size=32)
    first, *rest = draw(gen, 3) + draw(gen, 2, seed=9)
    assert all(inst is first for inst in rest)
    assert first.name == "alexnet@trinity"
    assert first.topology == load_preset("trinity")
    assert first.graph.num_ops == 25 and first.groups.num_ops <= 8
    assert {m for op in first.groups.ops for m in op.members} == {op.name for op in first.graph.ops}
    # small graphs are their own groups
    assert gen.sample(np.random.default_rng(0), 64).groups is gen.sample(np.random.default_rng(0), 64).graph


def test_fixed_generator_in_env_keeps_the_instance() -> None:
    generator = {"kind": "fixed", "model": "lenet", "topology": "trinity", "batch_size": 32}
    env = gym.make("placement_rl/Placement-v0", config={"generator": generator, "max_groups": 8})
    instances = []
    for seed in (0, 1, None):
        env.reset(seed=seed)
        instances.append(env.unwrapped.data.instance)
    assert all(inst is instances[0] for inst in instances)


def test_make_generator_defaults_and_objects() -> None:
    assert make_generator(None) == FixedGenerator("inception_v3", "tag-testbed", None)
    gen = RandomGenerator(models=("lenet",))
    assert make_generator(gen) is gen
    made = make_generator({"kind": "random", "models": ["lenet", "alexnet"], "held_out_models": ["vgg19"]})
    assert made == RandomGenerator(models=("lenet", "alexnet"), held_out_models=("vgg19",))
    assert make_generator({"model": "lenet"}) == FixedGenerator(model="lenet")  # kind defaults to fixed


def test_make_instance_names_graph_and_topology(zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("alexnet", batch_size=32)
    inst = make_instance(graph, load_preset("trinity"), max_groups=6)
    assert inst.name == f"{graph.name}@trinity"
    assert inst.graph is graph and inst.groups.num_ops <= 6


# ----------------------------------------------------------------------------- random
SMALL_MODELS = ("lenet", "alexnet")


def test_topology_splits_draw_disjoint_seed_ranges() -> None:
    seeds = {}
    for split in ("train", "test"):
        gen = RandomGenerator(models=SMALL_MODELS, topology_split=split, num_topologies=None, batch_size=32)
        instances = draw(gen, 60, seed=3)
        seeds[split] = [topology_seed(inst) for inst in instances]
        allowed = TRAIN_SEEDS if split == "train" else TEST_SEEDS
        assert all(s in allowed for s in seeds[split]), (split, seeds[split])
        assert len(set(seeds[split])) > 50  # drawn over the whole split
        inst = instances[0]
        assert inst.topology == random_topology(seeds[split][0])
        assert inst.name == f"{inst.graph.name}@random-{seeds[split][0]}"
    assert TRAIN_SEEDS.stop <= TEST_SEEDS.start
    assert not set(seeds["train"]) & set(seeds["test"])
    assert min(seeds["test"]) >= TEST_SEEDS.start > max(seeds["train"])


def test_num_topologies_is_a_fixed_pool_at_the_start_of_the_split() -> None:
    for split, start in (("train", TRAIN_SEEDS.start), ("test", TEST_SEEDS.start)):
        gen = RandomGenerator(models=SMALL_MODELS, topology_split=split, num_topologies=3, batch_size=32)
        seeds = {topology_seed(inst) for inst in draw(gen, 40)}
        assert seeds == {start, start + 1, start + 2}


def test_random_generator_is_driven_by_the_rng() -> None:
    gen = RandomGenerator(models=SMALL_MODELS, batch_size=32)
    a, b, c = ([i.name for i in draw(gen, 10, seed=s)] for s in (4, 4, 5))
    assert a == b
    assert a != c
    assert {n.split("@")[0] for n in a} == set(SMALL_MODELS)


def test_held_out_models() -> None:
    common = {"models": ("lenet", "alexnet", "vgg19"), "held_out_models": ("vgg19",), "batch_size": 32}
    train = RandomGenerator(**common, model_split="train")
    test = RandomGenerator(**common, model_split="test")
    assert train.pool == ("lenet", "alexnet") and test.pool == ("vgg19",)
    train_models = {inst.graph.name for inst in draw(train, 30)}
    test_models = {inst.graph.name for inst in draw(test, 10)}
    assert "vgg19" not in train_models and train_models == {"lenet", "alexnet"}
    assert test_models == {"vgg19"}
    # held-out models need not be listed in models
    only_held = RandomGenerator(models=("lenet",), held_out_models=("alexnet",), model_split="test", batch_size=32)
    assert {inst.graph.name for inst in draw(only_held, 5)} == {"alexnet"}


def test_random_generator_in_env_uses_the_split() -> None:
    config = {
        "generator": {"kind": "random", "models": list(SMALL_MODELS), "topology_split": "test", "batch_size": 32},
        "max_groups": 8,
    }
    env = gym.make("placement_rl/Sharding-v0", config=config)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        inst = env.unwrapped.data.instance
        assert info["instance"] == inst.name
        assert topology_seed(inst) in TEST_SEEDS


# ----------------------------------------------------------------------------- errors
def test_unknown_kind_names_the_valid_ones() -> None:
    with pytest.raises(
        UnknownNameError, match=r"unknown generator kind 'grid'; expected one of: fixed, mix, planted, random"
    ):
        make_generator({"kind": "grid"})


def test_unknown_keys_name_the_valid_ones() -> None:
    with pytest.raises(
        ValueError,
        match=r"generator 'fixed': unknown key\(s\) \['seed'\]; expected some of "
        r"\['batch_size', 'model', 'topology'\]",
    ):
        make_generator({"kind": "fixed", "model": "lenet", "seed": 3})
    with pytest.raises(ValueError, match=r"generator 'random': unknown key\(s\) \['topology'\]") as err:
        make_generator({"kind": "random", "topology": "trinity"})
    for valid in ("models", "topology_split", "num_topologies", "held_out_models", "model_split", "batch_size"):
        assert valid in str(err.value)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['topology'\]"):  # through the env config
        gym.make("placement_rl/Placement-v0", config={"generator": {"kind": "random", "topology": "trinity"}})


def test_bad_values() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown model 'resnet9000'; expected one of: .*lenet"):
        make_generator({"kind": "fixed", "model": "resnet9000"})
    with pytest.raises(UnknownNameError, match=r"unknown model 'gpt5'"):
        make_generator({"kind": "random", "held_out_models": ["gpt5"]})
    with pytest.raises(UnknownNameError, match=r"unknown topology 'nowhere'; expected one of: .*random:SEED"):
        make_generator({"kind": "fixed", "topology": "nowhere"})
    split_error = r"generator 'random': topology_split = 'val'; expected one of \['train', 'test'\]"
    with pytest.raises(ValueError, match=split_error):
        make_generator({"kind": "random", "topology_split": "val"})
    with pytest.raises(
        ValueError, match=r"generator 'random': model_split = 'val'; expected one of \['train', 'test'\]"
    ):
        make_generator({"kind": "random", "model_split": "val"})
    with pytest.raises(
        ValueError, match=r"generator 'random': num_topologies = 0; expected an integer >= 1 and <= 1e\+06 or null"
    ):
        make_generator({"kind": "random", "num_topologies": 0})
    with pytest.raises(ValueError, match=r"no model to draw: models \['lenet'\] minus held_out_models \['lenet'\]"):
        make_generator({"kind": "random", "models": ["lenet"], "held_out_models": ["lenet"]})
    with pytest.raises(ValueError, match=r"is empty for model_split='test'"):
        make_generator({"kind": "random", "model_split": "test"})
    for spec in ("fixed", 5, ["fixed"]):
        expected = rf"generator = {re.escape(repr(spec))}; expected a mapping with 'kind' or a generator object"
        with pytest.raises(ValueError, match=expected):
            make_generator(spec)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"unknown generator kind \['fixed'\]; expected one of: fixed, mix, planted, random"
    ):
        make_generator({"kind": ["fixed"]})
    with pytest.raises(
        ValueError,
        match=r"generator 'fixed': batch_size = 10{30}; expected an integer >= 1 and <= 1e\+06".replace(
            "10{30}", str(10**30)
        ),
    ):
        make_generator({"kind": "fixed", "batch_size": 10**30})  # torch would overflow importing it
    with pytest.raises(ValueError, match=r"generator 'random': num_topologies = 1000001; expected an integer >= 1 and"):
        make_generator({"kind": "random", "num_topologies": 1_000_001})  # more than the split holds
    missing = r"generator 'fixed': topology = '/no/such/topology.json': no such file: '/no/such/topology.json'"
    with pytest.raises(ValueError, match=missing):
        make_generator({"kind": "fixed", "topology": "/no/such/topology.json"})


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"kind": "random", "num_topologies": float("nan")},
            r"num_topologies = nan; expected an integer >= 1 and <= 1e\+06 or null",
        ),
        (
            {"kind": "random", "num_topologies": float("inf")},
            r"num_topologies = inf; expected an integer >= 1 and <= 1e\+06 or null",
        ),
        (
            {"kind": "random", "num_topologies": 2.5},
            r"num_topologies = 2.5; expected an integer >= 1 and <= 1e\+06 or null",
        ),
        ({"kind": "random", "models": "lenet"}, r"models = 'lenet'; expected a list whose every item is a non-empty"),
        ({"kind": "random", "held_out_models": [""]}, r"held_out_models = \(''.\); expected a list whose every item"),
        (
            {"kind": "random", "batch_size": 0},
            r"generator 'random': batch_size = 0; expected an integer >= 1 and <= 1e\+06 or null",
        ),
        ({"kind": "fixed", "batch_size": float("nan")}, r"generator 'fixed': batch_size = nan; expected an integer"),
        ({"kind": "fixed", "model": 7}, r"generator 'fixed': model = 7; expected a non-empty string"),
        ({"kind": "fixed", "topology": None}, r"generator 'fixed': topology = None; expected a non-empty string"),
    ],
)
def test_bad_field_values_name_the_field(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        make_generator(spec)


def test_generators_built_directly_are_checked_too() -> None:
    with pytest.raises(ValueError, match=r"generator 'random': topology_split = 'val'; expected one of"):
        RandomGenerator(models=("lenet",), topology_split="val")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"generator 'fixed': batch_size = -3; expected an integer >= 1 and <= 1e\+06 or null"
    ):
        FixedGenerator(model="lenet", batch_size=-3)
    with pytest.raises(UnknownNameError, match=r"unknown model 'gpt5'"):
        FixedGenerator(model="gpt5")


def test_planted_generator_draws_training_variants_of_the_kinds() -> None:
    from placement_rl.envs import PlantedGenerator
    from placement_rl.envs.generator import PLANTED_TRAIN_VARIANT
    from placement_rl.planted import kind_names

    gen = make_generator({"kind": "planted", "kinds": ["slow_links_fc", "embedding_heavy"], "num_variants": 2})
    assert isinstance(gen, PlantedGenerator)
    instances = draw(gen, 12)
    names = {inst.name for inst in instances}
    allowed = {f"{k}/v{PLANTED_TRAIN_VARIANT + i}" for k in ("slow_links_fc", "embedding_heavy") for i in range(2)}
    assert names <= allowed and len(names) >= 3
    assert all(inst.groups.num_ops <= 8 for inst in instances)
    assert [i.name for i in draw(gen, 5, seed=3)] == [i.name for i in draw(gen, 5, seed=3)]  # the rng drives it
    # every kind by default, from variants the planted benchmarks do not evaluate
    assert PlantedGenerator().pool == tuple(kind_names()) and PLANTED_TRAIN_VARIANT > 2


def test_mix_generator_draws_by_weight() -> None:
    from placement_rl.envs import MixGenerator

    gen = make_generator(
        {
            "kind": "mix",
            "generators": [
                {"kind": "fixed", "model": "alexnet", "topology": "trinity"},
                {"kind": "planted", "kinds": ["embedding_heavy"], "num_variants": 1},
            ],
            "weights": [1, 3],
        }
    )
    assert isinstance(gen, MixGenerator)
    names = [inst.name for inst in draw(gen, 40)]
    fixed = names.count("alexnet@trinity")
    assert 3 <= fixed <= 20 and set(names) == {"alexnet@trinity", "embedding_heavy/v1000"}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"kind": "planted", "kinds": ["nope"]}, "planted kind 'nope'; expected one of: embedding_heavy"),
        ({"kind": "planted", "first_variant": 0}, "first_variant = 0"),
        ({"kind": "mix", "generators": []}, "generators = []; expected a non-empty list"),
        ({"kind": "mix", "generators": [{"kind": "fixed"}], "weights": [0]}, "weights = [0]; expected one positive"),
        ({"kind": "mix", "generator": [{"kind": "fixed"}]}, "unknown key(s) ['generator']"),
        ({"kind": "mix", "generators": [{"kind": "nope"}]}, "generator kind 'nope'"),
    ],
)
def test_bad_planted_and_mix_generators_name_the_value(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValueError, match=re.escape(expected)):
        make_generator(spec)

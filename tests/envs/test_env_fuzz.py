"""Fuzzing the environments' API with malformed configs and actions, generated from fixed seeds.

Every case either works or raises ``ValueError`` (the ``placement_rl.errors`` types are
ValueErrors) whose message names the bad value. Never another exception type (``TypeError``,
``IndexError``, ``OverflowError``, ``MemoryError``, ...), never a hang (each case runs under a
deadline and a cap on the memory it may add), and never a silently accepted NaN, negative or
out-of-range number: a value outside its documented range must be refused.

* A config case sets one field of a tiny config (lenet at batch 32 on the 4-GPU ``trinity``
  preset, 8 op groups) to a generated value: huge, negative, fractional, NaN and infinite
  numbers, bools, strings, lists, mappings, the limits and one past them. If the env accepts it,
  an episode is played and its observations must stay in the observation space.
* An action case steps a freshly reset env (every mode, padded maxima) with a generated action:
  wrong types, shapes and dtypes, floats, huge and negative integers, None, strings, nested and
  ragged lists, and actions inside the space, masked or not. An action inside the space must
  work (a masked one ends the episode, or raises with ``invalid_action="raise"``).
* A few cases feed the other entry points: ``reset(seed=...)``, ``evaluate_action``,
  ``configs(index)`` and ``restore``.

Whether a value is bad is decided here from the documented limits (``placement_rl.envs.base``'s
``MAX_*``, the generator's and the rewards' ranges), not by asking the env.
"""

from __future__ import annotations

import math
import re
import resource
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from env_cases import PLACEMENT, SHARDING, small

from placement_rl.envs import RandomAgent
from placement_rl.envs.base import MAX_DEVICES, MAX_EDGES, MAX_NODES, MAX_STRUCTURE_DIM
from placement_rl.envs.generator import MAX_BATCH_SIZE
from placement_rl.envs.placement.types import MAX_ONE_SHOT_GROUPS
from placement_rl.envs.reward import REWARD_LIMIT
from placement_rl.envs.sharding.types import MAX_CONFIGS
from placement_rl.topology import TEST_SEEDS, TRAIN_SEEDS

#: Seconds one case may take (a working case plays a whole episode on a loaded machine).
DEADLINE_S = 60.0
#: Address space one case may add (the largest accepted maxima need a few tens of MiB).
MEMORY_BYTES = 4 * 2**30
BASE: dict[str, Any] = {"generator": small(), "max_groups": 8}
MISSING = object()  # "this case changes no field"


class Hang(BaseException):
    """A case ran past its deadline (a BaseException, so no ``except Exception`` in the env swallows it)."""


def virtual_memory_bytes() -> int | None:
    """This process's virtual memory size (Linux), or None where /proc does not tell."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextmanager
def bounded(seconds: float = DEADLINE_S, memory_bytes: int = MEMORY_BYTES) -> Iterator[None]:
    """Run a case under a deadline and, on Linux, with at most ``memory_bytes`` more address space,
    so that a regression (an uncapped maximum allocating tens of GiB) fails the case with a
    ``MemoryError`` instead of exhausting the machine."""

    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"the case was still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    used = virtual_memory_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if used is not None and soft == resource.RLIM_INFINITY:
        limit = used + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def one_line(text: str) -> str:
    """``text`` with its line breaks (and the indentation after them) as single spaces, as the envs print values."""
    return re.sub(r"\s*\n\s*", " ", text)


def names(message: str, value: Any) -> bool:
    """Whether an error message names ``value``: the start of its repr (long values are cut), or of
    the string itself (a file name)."""
    shown = [one_line(repr(value))[:40], *([value[:40]] if isinstance(value, str) else [])]
    return any(s in one_line(message) for s in shown)


# ------------------------------------------------------------------------------ value rules
@dataclass(frozen=True)
class Ints:
    """An integer option in ``[low, high]`` (or null)."""

    low: int
    high: int
    null: bool = False

    def bad(self, v: Any) -> bool:
        """Whether the documentation says ``v`` must be refused. Numpy integers in range may go either way."""
        if v is None:
            return not self.null
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            return True  # floats (8.0 included), NaN, inf, strings, lists, ...
        return not self.low <= int(v) <= self.high


@dataclass(frozen=True)
class Floats:
    """A finite number in ``[low, high]``."""

    low: float
    high: float

    def bad(self, v: Any) -> bool:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float)):
            return True
        return not (math.isfinite(v) and self.low <= v <= self.high)


@dataclass(frozen=True)
class OneOf:
    """One of a few strings."""

    values: tuple[str, ...]

    def bad(self, v: Any) -> bool:
        return not (isinstance(v, str) and v in self.values)


Rule = Ints | Floats | OneOf


@dataclass(frozen=True)
class Field:
    """Where a fuzzed value goes: ``path`` in the config of ``env_id`` (plus ``extra`` settings)."""

    env_id: str
    path: tuple[str, ...]
    rule: Rule
    extra: tuple[tuple[str, Any], ...] = ()

    def config(self, value: Any) -> dict[str, Any]:
        config: dict[str, Any] = {**BASE, **dict(self.extra)}
        config["generator"] = dict(config["generator"])
        if self.path[0] == "reward_options":
            config["reward_options"] = {}
        target = config
        for key in self.path[:-1]:
            target = target[key]
        target[self.path[-1]] = value
        return config


ONE_SHOT = (("mode", "one_shot"),)
RANDOM_GENERATOR = (("generator", {"kind": "random", "models": ["lenet"], "batch_size": 32}),)
SPLIT = min(len(TRAIN_SEEDS), len(TEST_SEEDS))

FIELDS: list[Field] = [
    Field(PLACEMENT, ("max_groups",), Ints(1, MAX_NODES)),
    Field(PLACEMENT, ("max_nodes",), Ints(1, MAX_NODES, null=True)),
    Field(PLACEMENT, ("max_edges",), Ints(1, MAX_EDGES, null=True)),
    Field(PLACEMENT, ("max_devices",), Ints(1, MAX_DEVICES)),
    Field(PLACEMENT, ("node2vec_dim",), Ints(0, MAX_STRUCTURE_DIM)),
    Field(PLACEMENT, ("one_shot_ops",), Ints(1, MAX_NODES), ONE_SHOT),
    Field(PLACEMENT, ("one_shot_groups",), Ints(1, MAX_ONE_SHOT_GROUPS), ONE_SHOT),
    Field(SHARDING, ("max_configs",), Ints(1, MAX_CONFIGS)),
    Field(SHARDING, ("max_partitions",), Ints(1, MAX_DEVICES, null=True)),
    Field(SHARDING, ("max_devices",), Ints(1, MAX_DEVICES)),
    Field(PLACEMENT, ("generator", "batch_size"), Ints(1, MAX_BATCH_SIZE, null=True)),
    Field(SHARDING, ("generator", "num_topologies"), Ints(1, SPLIT, null=True), RANDOM_GENERATOR),
    Field(PLACEMENT, ("reward_options", "alpha"), Floats(1e-6, 1e6), (("reward", "mdpe"),)),
    Field(PLACEMENT, ("reward_options", "oom_penalty"), Floats(0, 1e6), (("reward", "mdpe"),)),
    Field(SHARDING, ("reward_options", "c_hat_gb"), Floats(1e-6, 1e6), (("reward", "mdpe"),)),
    Field(PLACEMENT, ("reward_options", "oom_reward"), Floats(-REWARD_LIMIT, REWARD_LIMIT)),
    Field(SHARDING, ("reward_options", "invalid_reward"), Floats(-REWARD_LIMIT, REWARD_LIMIT), (("reward", "dense"),)),
    Field(PLACEMENT, ("mode",), OneOf(("sequential", "one_shot"))),
    Field(PLACEMENT, ("action_space",), OneOf(("device", "tag"))),
    Field(PLACEMENT, ("tag_completion",), OneOf(("best", "tag")), (("action_space", "tag"),)),
    Field(SHARDING, ("invalid_action",), OneOf(("end", "raise"))),
    Field(PLACEMENT, ("reward",), OneOf(("speedup", "mdpe", "dense"))),
    Field(PLACEMENT, ("generator", "kind"), OneOf(("fixed",))),
    Field(PLACEMENT, ("generator", "model"), OneOf(("lenet", "alexnet"))),
    Field(SHARDING, ("generator", "topology"), OneOf(("trinity", "random:0", "random:12"))),
    Field(SHARDING, ("generator", "topology_split"), OneOf(("train", "test")), RANDOM_GENERATOR),
    # appended, so the fields above keep their seeds (the values drawn for them)
    Field(PLACEMENT, ("tag_options",), OneOf(("tag", "extended")), (("action_space", "tag"),)),
]

NAN, INF = float("nan"), float("inf")


def int_values(rule: Ints, rng: np.random.Generator) -> list[Any]:
    """The limits and one past them, numbers too big for any machine integer, wrong types, and a few random draws."""
    edges = [rule.low, rule.high, rule.low - 1, rule.high + 1]
    wild = [-1, 10**9, 2**63, 10**30, -(10**30), 1.5, float(rule.low), NAN, INF, -INF, True, "8", None, [8], {"v": 8}]
    drawn = [int(rng.integers(-(2**40), 2**40)), int(10 ** rng.uniform(0, 18)), np.int64(rule.low)]
    picked = rng.choice(len(wild), size=8, replace=False)
    return edges + [wild[i] for i in sorted(picked)] + drawn


def float_values(rule: Floats, rng: np.random.Generator) -> list[Any]:
    wild = [NAN, INF, -INF, 1e300, -1e300, 5e-324, -1.0, 0.0, "0.5", None, True, [0.5]]
    drawn = [float(rng.uniform(rule.low, rule.high)), float(10 ** rng.uniform(-12, 12))]
    return [rule.low, rule.high, *wild, *drawn]


def choice_values(rule: OneOf, rng: np.random.Generator) -> list[Any]:
    wild = ["", rule.values[0].upper(), f" {rule.values[0]}", 0, None, [rule.values[0]], {"kind": rule.values[0]}, b"x"]
    return [*rule.values, *wild, "x" * 300]


def values(field: Field, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    if isinstance(field.rule, Ints):
        return int_values(field.rule, rng)
    if isinstance(field.rule, Floats):
        return float_values(field.rule, rng)
    return choice_values(field.rule, rng)


def case_id(value: Any) -> str:
    text = one_line(repr(value))
    return text if len(text) <= 24 else f"{text[:20]}..."


CONFIG_CASES = [
    pytest.param(field, value, id=f"{'.'.join(field.path)}={case_id(value)}")
    for seed, field in enumerate(FIELDS)
    for value in values(field, seed)
]

#: Whole values that are not what their key takes: (key, value, what the error must name); all
#: must be refused. ``config`` replaces the whole config; ``generator.topology`` is a topology spec.
WHOLE_CASES: list[tuple[str, Any, Any]] = [
    ("config", 5, 5),
    ("config", "placement", "placement"),
    ("config", [("max_groups", 8)], [("max_groups", 8)]),
    ("generator", 5, 5),
    ("generator", "fixed", "fixed"),
    ("generator", ["fixed"], ["fixed"]),
    ("generator", {"kind": ["fixed"]}, ["fixed"]),
    ("generator", {"kind": "random", "models": "lenet"}, "lenet"),
    ("generator", {"kind": "random", "models": []}, []),
    ("generator.topology", "/no/such/topology.json", "/no/such/topology.json"),
    ("generator.topology", "/etc/passwd", "/etc/passwd"),
    ("generator.topology", "/tmp", "/tmp"),
    ("generator.topology", "random:-1", "random:-1"),
    ("generator.topology", "random:" + "9" * 5000, "random:" + "9" * 5000),
    ("reward", ["speedup"], ["speedup"]),
    ("reward", {"name": "speedup"}, {"name": "speedup"}),
    ("reward_options", [("alpha", 0.5)], [("alpha", 0.5)]),
    ("reward_options", {"alpha": 0.5}, "alpha"),  # an option the speedup reward does not have
    ("cost_model", "fast", "fast"),
    ("dim_kinds", "sample", "sample"),
    ("dim_kinds", 5, 5),
    ("dim_kinds", ["sample", "pipeline"], ["sample", "pipeline"]),
    ("max_groups", {"value": 8}, {"value": 8}),
    ("unknown_key", 1, "unknown_key"),
]


def check_config_outcome(env_id: str, config: Any, bad: bool, value: Any) -> None:
    """Build and play: a bad value must be refused with a ValueError naming it; nothing else may raise
    but ValueError; an accepted config must give observations inside the observation space."""
    with bounded():
        try:
            env = gym.make(env_id, config=config)
            obs, _ = env.reset(seed=0)
            space = env.observation_space
            done, steps = False, 0
            while not done:
                assert space.contains(obs), [k for k in space.spaces if not space[k].contains(obs[k])]
                obs, reward, done, truncated, _ = env.step(RandomAgent(0).act(env, obs))
                assert math.isfinite(reward) and truncated is False
                steps += 1
            assert space.contains(obs)
        except ValueError as exc:
            message = str(exc)
            assert message, "an empty error message"
            if bad:
                assert names(message, value), f"the message does not name {value!r}: {message}"
            return
    assert not bad, f"{value!r} was accepted; it is outside its documented range or type"


@pytest.mark.filterwarnings("ignore:.*infinity:UserWarning")
@pytest.mark.parametrize(("field", "value"), CONFIG_CASES)
def test_config_field(field: Field, value: Any) -> None:
    check_config_outcome(field.env_id, field.config(value), field.rule.bad(value), value)


@pytest.mark.parametrize(("key", "value", "named"), WHOLE_CASES, ids=[f"{k}={case_id(v)}" for k, v, _ in WHOLE_CASES])
def test_config_whole_values(key: str, value: Any, named: Any) -> None:
    env_id = SHARDING if key == "dim_kinds" else PLACEMENT
    if key == "config":
        config = value
    elif key == "generator.topology":
        config = {**BASE, "generator": {**BASE["generator"], "topology": value}}
    else:
        config = {**BASE, key: value}
    check_config_outcome(env_id, config, True, named)


# ------------------------------------------------------------------------------ actions
#: Every mode on lenet x trinity with padded maxima (64 device slots for 4 GPUs, 8 groups of 60 rows).
MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "device": (PLACEMENT, {}),
    "tag": (PLACEMENT, {"action_space": "tag"}),
    "one_shot": (PLACEMENT, {"mode": "one_shot", "max_nodes": 20, "one_shot_groups": 4, "max_devices": 8}),
    "sharding": (SHARDING, {"max_configs": 32}),
}


@pytest.fixture(scope="module")
def envs() -> dict[tuple[str, str], gym.Env[Any, Any]]:
    """One env per (mode, invalid_action); each case resets it."""
    return {
        (mode, invalid): gym.make(env_id, config={**BASE, **extra, "invalid_action": invalid})
        for mode, (env_id, extra) in MODES.items()
        for invalid in ("end", "raise")
    }


def discrete_actions(n: int, rng: np.random.Generator) -> list[Any]:
    wild: list[Any] = [
        None, "0", b"0", 0.0, 1.5, NAN, INF, -1, -(2**63), 2**63, 10**30, n, True, False, np.bool_(True),
        [0], [[0]], (0,), {0: 1}, 1 + 0j, np.float32(1), np.array([0]), np.array(0.0), np.uint64(2**64 - 1),
        np.int8(-1),
    ]  # fmt: skip
    inside = [0, np.int64(1), np.array(2), np.int32(3), n - 1]  # n - 1: a padded slot, masked
    drawn = [int(rng.integers(-(10**6), 10**6)) for _ in range(3)] + [int(rng.integers(n))]
    return wild + inside + drawn


def multi_actions(nvec: np.ndarray, rng: np.random.Generator) -> list[Any]:
    L = len(nvec)
    zeros = np.zeros(L, np.int64)
    huge = [0] * L
    huge[3] = 10**30
    negative = zeros.copy()
    negative[L - 1] = -1
    wild: list[Any] = [
        None, "x", 0, [0], np.zeros(L - 1, np.int64), np.zeros((2, L), np.int64), np.zeros(L, np.float64),
        np.full(L, NAN), np.zeros(L, bool), [None] * L, ["0"] * L, [[0, 1], [2]], negative, huge,
        np.full(L, 2**64 - 1, np.uint64), np.full(L, 2**63, dtype=object), [0.5] * L, {"groups": zeros},
    ]  # fmt: skip
    padded_device = zeros.copy()
    padded_device[L - 1] = int(nvec[-1]) - 1  # the last group on the last (padded) device slot
    padded_slot = zeros.copy()
    padded_slot[L - 5] = 1  # a padded op slot (lenet has 15 ops, 20 rows) in group 1
    inside = [zeros, zeros.astype(np.int8), zeros.tolist(), padded_device, padded_slot]
    drawn = [np.array([rng.integers(n) for n in nvec]) for _ in range(3)]
    drawn.append(rng.integers(-5, 30, size=L))
    return wild + inside + drawn


def action_bad(space: gym.Space[Any], action: Any) -> bool:
    """Whether ``action`` is outside the action space (so ``step`` must refuse it)."""
    if isinstance(space, gym.spaces.Discrete):
        if isinstance(action, np.ndarray) and action.shape == () and np.issubdtype(action.dtype, np.integer):
            action = action.item()
        if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
            return True
        return not 0 <= int(action) < int(space.n)
    assert isinstance(space, gym.spaces.MultiDiscrete)
    try:
        arr = np.asarray(action)
    except (ValueError, TypeError):
        return True
    if not np.issubdtype(arr.dtype, np.integer) or arr.shape != space.shape:
        return True
    return any(not 0 <= v < n for v, n in zip(arr.tolist(), space.nvec.tolist(), strict=True))


def masked(space: gym.Space[Any], mask: np.ndarray, action: Any) -> bool:
    """Whether an action inside the space is one the mask forbids."""
    if isinstance(space, gym.spaces.Discrete):
        return not mask[int(np.asarray(action))]
    offsets = np.concatenate([[0], np.cumsum(space.nvec)])
    return any(not mask[offsets[i] + int(v)] for i, v in enumerate(np.asarray(action).tolist()))


ACTION_CASES = [
    pytest.param(mode, invalid, i, id=f"{mode}-{invalid}-{i}")
    for mode in MODES
    for invalid in ("end", "raise")
    for i in range(30 if mode == "one_shot" else 33)
    if invalid == "end" or i % 3 == 0
]


def generated_action(env: gym.Env[Any, Any], mode: str, index: int) -> Any:
    space = env.action_space
    rng = np.random.default_rng(1000 + list(MODES).index(mode))
    pool = (
        discrete_actions(int(space.n), rng)
        if isinstance(space, gym.spaces.Discrete)
        else multi_actions(space.nvec, rng)
    )
    return pool[index % len(pool)]


@pytest.mark.filterwarnings("ignore:.*infinity:UserWarning")
@pytest.mark.parametrize(("mode", "invalid", "index"), ACTION_CASES)
def test_step_with_generated_action(
    envs: dict[tuple[str, str], gym.Env[Any, Any]], mode: str, invalid: str, index: int
) -> None:
    env = envs[mode, invalid]
    action = generated_action(env, mode, index)
    with bounded():
        obs, _ = env.reset(seed=index)
        bad = action_bad(env.action_space, action)
        forbidden = not bad and masked(env.action_space, obs["action_mask"], action)
        try:
            last, reward, terminated, truncated, info = env.step(action)
        except ValueError as exc:
            assert bad or (forbidden and invalid == "raise"), f"a valid action {action!r} was refused: {exc}"
            # Refused: the message names the action; masked: the action, or (one-shot) its masked entry.
            masked_entry = r"action (\d+ is masked|places group \d+ on device index \d+|assigns padded op slot \d+)"
            assert names(str(exc), action) if bad else re.match(masked_entry, str(exc)), str(exc)
            # A refused action changes nothing: the episode goes on with an allowed action.
            env.step(RandomAgent(index).act(env, obs))
            return
    assert not bad, f"{action!r} was accepted; it is outside the action space {env.action_space}"
    assert not (forbidden and invalid == "raise"), f"the masked action {action!r} did not raise"
    assert info["invalid_action"] is forbidden
    assert math.isfinite(reward) and truncated is False
    assert env.observation_space.contains(last)
    if forbidden:  # the speedup reward's invalid-action reward; the reason names the action
        assert terminated and reward == -1.0
        assert mode == "one_shot" or info["invalid_action_reason"].startswith(f"action {int(np.asarray(action))} ")


# -------------------------------------------------------------------- other entry points
ENTRY_CASES: list[tuple[str, str, Any, bool]] = [
    # (what, mode, argument, bad)
    *(("seed", "device", s, True) for s in (-1, 1.5, "0", [1], NAN, -(2**70))),
    *(("seed", "sharding", s, False) for s in (None, 0, 2**70)),
    *(
        ("evaluate_action", m, a, True)
        for m in ("device", "tag", "sharding")
        for a in (-1, 64 * 4, None, 2.0, "1", 2**64)
    ),
    *(("evaluate_action", m, a, False) for m in ("device", "tag", "sharding") for a in (0, np.int64(1))),
    *(("evaluate_action", m, 63, True) for m in ("device", "sharding")),  # padded: no device or configuration
    *(("configs", "sharding", i, True) for i in (-1, 8, 10**30, 1.0, None, True)),
    *(("configs", "sharding", i, False) for i in (0, 7, np.int64(3))),
    *(("restore", m, s, True) for m in ("device", "one_shot") for s in (None, {}, "snapshot", 0)),
]


@pytest.mark.parametrize(
    ("what", "mode", "argument", "bad"), ENTRY_CASES, ids=[f"{w}-{m}-{case_id(a)}" for w, m, a, _ in ENTRY_CASES]
)
def test_entry_points(
    envs: dict[tuple[str, str], gym.Env[Any, Any]], what: str, mode: str, argument: Any, bad: bool
) -> None:
    env = envs[mode, "end"].unwrapped
    calls: dict[str, Callable[[], Any]] = {
        "seed": lambda: env.reset(seed=argument),
        "evaluate_action": lambda: env.evaluate_action(argument),
        "configs": lambda: env.configs(argument),
        "restore": lambda: env.restore(argument),
    }
    with bounded():
        env.reset(seed=0)
        try:
            calls[what]()
        except ValueError as exc:
            assert bad, f"{what}({argument!r}) was refused: {exc}"
            assert names(str(exc), argument), f"the message does not name {argument!r}: {exc}"
            return
    assert not bad, f"{what}({argument!r}) was accepted"


def test_enough_cases() -> None:
    assert len(CONFIG_CASES) + len(WHOLE_CASES) >= 80
    assert len(ACTION_CASES) >= 80
    refused = [p for p in CONFIG_CASES if p.values[0].rule.bad(p.values[1])]  # type: ignore[union-attr]
    assert len(refused) >= 80  # most generated values are outside their documented range or type

"""Malformed input through the command line: files, flags and YAML, generated from valid documents.

Every case runs ``placement-rl`` in process (:func:`placement_rl.cli.main`) and must end with exit
status 2 and one ``error:`` line naming what was wrong: no traceback (``main`` lets any exception
other than a ``ValueError`` or ``FileNotFoundError`` through, which fails the test), no hang (every
command here is a few milliseconds of work on lenet x trinity), and no silently accepted negative,
infinite or mistyped number. Structural cases that may be valid (a deleted optional key, a string
or null in place of a string) must not crash, whatever their status.

The generators are seeded, so a failing case id names the file kind, the mutation and the path.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from placement_rl import zoo
from placement_rl.cli import main
from placement_rl.plan import data_parallel
from placement_rl.topology import load_preset

Path_ = tuple[Any, ...]  # a path of keys and indices into a document

#: Values a number in a file may never take: each must be refused (exit 2).
BAD_NUMBERS: tuple[tuple[str, Any], ...] = (
    ("negative", -1),
    ("very-negative", -1e30),
    ("infinite", "INF"),  # written as the JSON number 1e400, which Python reads as inf
    ("string", "abc"),
    ("list", [1]),
    ("object", {"a": 1}),
    ("bool", True),
)
#: Replacements of a string leaf: may be valid or not; must not crash.
ODD_STRINGS: tuple[tuple[str, Any], ...] = (("empty", ""), ("number", 123), ("null", None), ("list", ["x"]))

MODEL, TOPOLOGY = "lenet", "trinity"


def _leaves(doc: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))
    else:
        yield path, doc


def _set(doc: Any, path: Path_, value: Any) -> Any:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _delete(doc: Any, path: Path_) -> Any:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


def _dumps(doc: Any) -> str:
    """JSON text; the marker ``"INF"`` becomes the number ``1e400`` (infinite when read)."""
    return json.dumps(doc).replace('"INF"', "1e400")


def _numeric(doc: Any, skip: tuple[str, ...] = ()) -> list[Path_]:
    return [
        p
        for p, v in _leaves(doc)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not any(s in map(str, p) for s in skip)
    ]


def _strings(doc: Any, skip: tuple[str, ...] = ("format",)) -> list[Path_]:
    return [p for p, v in _leaves(doc) if isinstance(v, str) and not any(s in map(str, p) for s in skip)]


def _documents() -> dict[str, tuple[dict[str, Any], list[str], tuple[str, ...]]]:
    """Per file kind: a valid document, the argv that reads it (``FILE`` for its path), and the keys
    whose numbers are not quantities (versions, where any integer other than the one expected is
    refused anyway)."""
    graph = zoo.load(MODEL)
    topology = load_preset(TOPOLOGY)
    plan = data_parallel(graph, topology)
    conv = next(op for op in graph.ops if op.param_bytes)
    device_type = topology.devices[0].device_type
    profile = {
        "format": "placement_rl.profile",
        "schema_version": 1,
        "device": "fuzz",
        "entries": [
            {
                "device_type": device_type,
                "op_type": conv.op_type,
                "output_shape": list(conv.output_shapes[0]),
                "param_bytes": conv.param_bytes,
                "forward_s": 1e-4,
                "backward_s": 2e-4,
            }
        ],
    }
    comm = {
        "format": "placement_rl.comm_table",
        "schema_version": 1,
        "curves": {"p2p/pcie": [[1024, 1e9], [2**20, 1e10]]},
    }
    simulate = ["simulate", "--model", MODEL, "--topology", TOPOLOGY, "--json"]
    return {
        "graph": (graph.to_dict(), ["show-graph", "FILE", "--json"], ()),
        "topology": (topology.to_dict(), ["show-topology", "FILE", "--json"], ()),
        "plan": (plan.to_dict(), [*simulate, "--plan", "FILE"], ()),
        "profile": (profile, [*simulate, "--plan", "dp", "--profile", "FILE"], ()),
        "comm_table": (comm, [*simulate, "--plan", "dp", "--comm-table", "FILE"], ()),
    }


def _cases() -> list[Any]:
    rng = random.Random(20261123)
    cases: list[Any] = []
    for kind, (doc, argv, skip) in _documents().items():
        numeric = _numeric(doc, ("schema_version", *skip))
        for path in rng.sample(numeric, min(len(numeric), 5)):
            for name, value in rng.sample(BAD_NUMBERS, 2):
                text = _dumps(_set(doc, path, value))
                cases.append(pytest.param(kind, argv, text, True, id=f"{kind}-{name}-{'.'.join(map(str, path))}"))
        strings = _strings(doc)
        for path in rng.sample(strings, min(len(strings), 3)):
            name, value = rng.choice(ODD_STRINGS)
            text = _dumps(_set(doc, path, value))
            cases.append(pytest.param(kind, argv, text, False, id=f"{kind}-string-{name}-{'.'.join(map(str, path))}"))
        for key in doc:
            must_fail = key in ("format", "schema_version")
            cases.append(pytest.param(kind, argv, _dumps(_delete(doc, (key,))), must_fail, id=f"{kind}-delete-{key}"))
        whole = json.dumps(doc)
        for name, text in (
            ("empty", ""),
            ("truncated", whole[: len(whole) // 2]),
            ("list", json.dumps([doc])),
            ("null", "null"),
            ("nan", whole.replace("1", "NaN", 1) if "1" in whole else "NaN"),
            ("deep", "[" * 100_000 + "]" * 100_000),
            ("unknown-key", json.dumps({**doc, "surprise": 1})),
            ("other-format", json.dumps({**doc, "format": "placement_rl.something_else"})),
            ("future-version", json.dumps({**doc, "schema_version": 99})),
        ):
            cases.append(pytest.param(kind, argv, text, True, id=f"{kind}-{name}"))
        cases.append(pytest.param(kind, argv, b"\xff\xfe\x00not utf-8", True, id=f"{kind}-not-utf8"))
    return cases


CASES = _cases()


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(argv)
    return status, capsys.readouterr().err


@pytest.mark.parametrize(("kind", "argv", "text", "must_fail"), CASES)
def test_malformed_file(
    kind: str, argv: list[str], text: str | bytes, must_fail: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"{kind}.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    status, err = _run([str(path) if a == "FILE" else a for a in argv], capsys)
    if must_fail:
        assert status == 2, f"accepted: {text[:300]!r}"
    if status != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert status == 2 and lines and lines[-1].startswith("error: "), err
        assert "Traceback" not in err


#: (flag, value) pairs that must be refused before any work starts.
BAD_FLAGS: tuple[tuple[list[str], str], ...] = tuple(
    (argv, value)
    for argv, values in (
        (
            ["simulate", "--model", MODEL, "--topology", TOPOLOGY, "--plan", "dp", "--batch-size"],
            ("0", "-1", "nan", "1e400", "abc", "1.5"),
        ),
        (
            ["simulate", "--model", MODEL, "--topology", TOPOLOGY, "--plan", "dp", "--bucket-bytes"],
            ("-1", "nan", "inf", "25XB", "1.5"),
        ),
        (["simulate", "--model", MODEL, "--topology", TOPOLOGY, "--plan", "dp", "--network"], ("fluid", "", "FLOW")),
        (["simulate", "--model", MODEL, "--topology", TOPOLOGY, "--plan", "dp", "--precision"], ("fp8", "", "bf16")),
        (["simulate", "--model", MODEL, "--topology", TOPOLOGY, "--plan"], ("nonexistent", "dpp", "")),
        (["simulate", "--topology", TOPOLOGY, "--plan", "dp", "--model"], ("resnet9000", "", "../../etc/passwd")),
        (["simulate", "--model", MODEL, "--plan", "dp", "--topology"], ("random:-1", "random:abc", "mars", "")),
        (
            ["search", "mcmc", "--model", MODEL, "--topology", TOPOLOGY, "--budget"],
            ("-5s", "0", "nan", "1e999s", "5x", ""),
        ),
        (
            ["search", "mcmc", "--model", MODEL, "--topology", TOPOLOGY, "--budget", "5", "--chains"],
            ("0", "-1", "nan", "two"),
        ),
        (["plan", "--model", MODEL, "--topology", TOPOLOGY, "--methods"], ("mcmcc", "", "dp,,ft")),
        (["plan", "--model", MODEL, "--topology", TOPOLOGY, "--mcmc-budget"], ("-1", "inf", "soon")),
        (
            ["frontier", "--model", MODEL, "--topology", TOPOLOGY, "--max-configs"],
            ("-1", "-3", "many"),
        ),  # 0 = every configuration
        (["show-graph", MODEL, "--coarsen"], ("-1", "-2", "nan")),  # 0 = not coarsened
        (["models", "--batch-size"], ("0", "-1")),
    )
    for value in values
)


@pytest.mark.parametrize(("argv", "value"), BAD_FLAGS, ids=[f"{a[0]}-{a[-1]}={v}" for a, v in BAD_FLAGS])
def test_bad_flag_value(argv: list[str], value: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _run([*argv, value], capsys)
    assert status == 2, f"accepted {argv[-1]} {value!r}"
    assert "error:" in err and "Traceback" not in err


def _experiment() -> dict[str, Any]:
    return {"models": [MODEL], "topologies": [TOPOLOGY], "methods": ["data_parallel", {"method": "mcmc", "budget": 5}]}


#: Experiment files that must be refused before any cell runs (the key or value is named).
BAD_EXPERIMENTS: tuple[tuple[str, str], ...] = (
    ("empty", ""),
    ("not-a-mapping", "[1, 2]"),
    ("syntax", "models: [lenet\ntopologies: trinity"),
    ("tab", "models:\n\t- lenet"),
    ("python-tag", "!!python/object/apply:os.system ['echo pwned']"),
    ("unknown-key", yaml.safe_dump({**_experiment(), "modles": [MODEL]})),
    ("missing-methods", yaml.safe_dump({k: v for k, v in _experiment().items() if k != "methods"})),
    ("unknown-method", yaml.safe_dump({**_experiment(), "methods": ["mcmcc"]})),
    ("unknown-model", yaml.safe_dump({**_experiment(), "models": ["resnet9000"]})),
    ("unknown-topology", yaml.safe_dump({**_experiment(), "topologies": ["mars"]})),
    ("negative-budget", yaml.safe_dump({**_experiment(), "methods": [{"method": "mcmc", "budget": -5}]})),
    ("nan-budget", yaml.safe_dump({**_experiment(), "methods": [{"method": "mcmc", "budget": float("nan")}]})),
    ("text-budget", yaml.safe_dump({**_experiment(), "methods": [{"method": "mcmc", "budget": "soon"}]})),
    ("zero-chains", yaml.safe_dump({**_experiment(), "methods": [{"method": "mcmc", "budget": 5, "chains": 0}]})),
    ("unknown-option", yaml.safe_dump({**_experiment(), "methods": [{"method": "mcmc", "budgett": 5}]})),
    ("negative-batch", yaml.safe_dump({**_experiment(), "models": [{"model": MODEL, "batch_size": -8}]})),
    ("float-batch", yaml.safe_dump({**_experiment(), "models": [{"model": MODEL, "batch_size": 8.5}]})),
    ("inf-seeds", yaml.safe_dump({**_experiment(), "seeds": float("inf")})),
    ("negative-seeds", yaml.safe_dump({**_experiment(), "seeds": -1})),
    ("bad-split", yaml.safe_dump({**_experiment(), "topologies": ["test:-3"]})),
    ("bad-cost", yaml.safe_dump({**_experiment(), "cost": {"network": "fluid"}})),
    ("negative-bucket", yaml.safe_dump({**_experiment(), "cost": {"bucket_bytes": -1}})),
    ("zero-concurrency", yaml.safe_dump({**_experiment(), "concurrency": 0})),
    ("learned-without-checkpoint", yaml.safe_dump({**_experiment(), "methods": [{"method": "trinity"}]})),
)


@pytest.mark.parametrize(("name", "text"), BAD_EXPERIMENTS, ids=[n for n, _ in BAD_EXPERIMENTS])
def test_malformed_experiment_file(name: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "experiment.yaml"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    status, err = _run(["compare", str(path), "--serial", "--out", str(out)], capsys)
    assert status == 2, f"accepted {name}"
    assert err.startswith("error: ") and "Traceback" not in err  # YAML errors quote the line below
    assert not (out / "results.jsonl").exists()  # refused before any cell ran


#: Training and sweep files: each mutation of the shipped configs must be refused before Ray starts.
def _training_cases() -> list[Any]:
    root = Path(__file__).resolve().parents[1] / "tune_configs"
    rng = random.Random(7)
    cases = []
    for name in ("trinity_ppo.yaml", "trinity_sweep.yaml", "tag_mcts.yaml", "tag_sweep.yaml"):
        doc = yaml.safe_load((root / name).read_text(encoding="utf-8"))
        numeric = [p for p in _numeric(doc) if "search" not in map(str, p)]
        for path in rng.sample(numeric, min(len(numeric), 4)):
            for label, value in rng.sample([("nan", math.nan), ("inf", math.inf), ("text", "abc"), ("list", [1])], 3):
                cases.append(
                    pytest.param(
                        name, yaml.safe_dump(_set(doc, path, value)), id=f"{name}-{label}-{'.'.join(map(str, path))}"
                    )
                )
        for section in (k for k, v in doc.items() if isinstance(v, dict)):
            cases.append(
                pytest.param(
                    name, yaml.safe_dump(_set(doc, (section, "surprise_key"), 1)), id=f"{name}-unknown-{section}"
                )
            )
    return cases


TRAINING_CASES = _training_cases()


@pytest.mark.parametrize(("name", "text"), TRAINING_CASES)
def test_malformed_training_file(name: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    argv = ["tune", str(path)] if "sweep" in name else ["train", str(path), "--out-dir", str(tmp_path / "out")]
    status, err = _run(argv, capsys)
    assert status == 2, f"accepted: {text[:300]}"
    assert err.startswith("error: ") and "Traceback" not in err


def test_enough_generated_inputs() -> None:
    """At least 150 malformed inputs across files, flags and YAML (plus the envs' own)."""
    assert len(CASES) + len(BAD_FLAGS) + len(BAD_EXPERIMENTS) + len(TRAINING_CASES) >= 150

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

import json
import math
import random
import re
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
import zoo_cache
from fuzzing import delete_at as _delete
from fuzzing import dumps as _dumps
from fuzzing import leaves as _leaves
from fuzzing import set_at as _set

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

# The commands import lenet through the session's cache (the importer is tested elsewhere), the one
# import that generates the cases below.
pytestmark = pytest.mark.usefixtures("cached_zoo")


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
    graph = zoo_cache.load(MODEL)
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
            ("nan", re.sub(r"(?<=: )-?\d+(\.\d+)?", "NaN", whole, count=1)),  # the first number
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
    """At least 150 malformed inputs across files, flags and YAML (plus the envs' own), and at least 100
    output paths, model strings and checkpoints."""
    assert len(CASES) + len(BAD_FLAGS) + len(BAD_EXPERIMENTS) + len(TRAINING_CASES) >= 150
    assert len(OUTPUT_CASES) + len(MODEL_CASES) + len(CHECKPOINT_CASES) >= 100


# ------------------------------------------------------------------------------------ output paths
@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting Ray fails the test: bad input must be refused before Ray starts."""
    import ray

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started before the bad input was refused")

    monkeypatch.setattr(ray, "init", refuse)


def _sweep_yaml(output_dir: str) -> str:
    base = Path(__file__).resolve().parents[1] / "tune_configs" / "trinity_ppo.yaml"
    search = {"ppo.lr": {"choice": [0.001, 0.003]}}
    return yaml.safe_dump({"base": str(base), "search": search, "num_samples": 1, "output_dir": output_dir})


#: Commands that write a file, ``OUT`` standing for the path.
FILE_OUTPUTS: dict[str, list[str]] = {
    "search-mcmc--out": ["search", "mcmc", "--model", MODEL, "--topology", TOPOLOGY, "--budget", "5", "--out", "OUT"],
    "import--out": ["import", MODEL, "--out", "OUT"],
    "show-graph--out": ["show-graph", MODEL, "--out", "OUT"],
    "show-topology--out": ["show-topology", TOPOLOGY, "--out", "OUT"],
    "profile--out": ["profile", "--models", MODEL, "--repeats", "1", "--out", "OUT"],
    "calibrate--out": ["calibrate", "--data", "EMPTY", "--out", "OUT"],
    "simulate--trace": ["simulate", "--model", MODEL, "--topology", TOPOLOGY, "--plan", "dp", "--trace", "OUT"],
    "simulate--gantt": ["simulate", "--model", MODEL, "--topology", TOPOLOGY, "--plan", "dp", "--gantt", "OUT"],
    "execute--trace": ["execute", "--model", MODEL, "--topology", TOPOLOGY, "--plan", "dp", "--trace", "OUT"],
    "execute--sim-trace": ["execute", "--model", MODEL, "--topology", TOPOLOGY, "--plan", "dp", "--sim-trace", "OUT"],
}
#: Commands that write into a folder.
FOLDER_OUTPUTS: dict[str, list[str]] = {
    "plan--out-dir": ["plan", "--model", MODEL, "--topology", TOPOLOGY, "--methods", "dp", "--out-dir", "OUT"],
    "compare--out": ["compare", "EXPERIMENT", "--serial", "--out", "OUT"],
    "frontier--out-dir": [
        "frontier",
        "--model",
        MODEL,
        "--topology",
        TOPOLOGY,
        "--mcmc-budget",
        "none",
        "--out-dir",
        "OUT",
    ],
    "train--out-dir": ["train", "TRAIN", "--iterations", "1", "--out-dir", "OUT"],
    "tune-output_dir": ["tune", "SWEEP"],
    "fidelity--out": ["fidelity", "--cases", f"{MODEL}/data_parallel", "--iterations", "1", "--out", "OUT"],
}
#: Bad output paths, relative to a scratch folder (``/sys`` is a place nobody may write, root included).
BAD_FILE_PATHS = {
    "folder": "folder",
    "dangling-symlink": "dangling",
    "parent-is-a-file": "file/x.json",
    "parent-is-a-symlink-to-a-file": "link-to-file/x.json",
    "unwritable": "/sys/placement-rl-fuzz/x.json",
    "socket": "socket",  # not a regular file; never /dev/null: as root, a writer's atomic replace would replace it
    "empty": "",
}
BAD_FOLDER_PATHS = {
    "file": "file",
    "dangling-symlink": "dangling",
    "symlink-to-a-file": "link-to-file",
    "parent-is-a-file": "file/sub",
    "unwritable": "/sys/placement-rl-fuzz",
    "empty": "",
}


def _output_cases() -> list[Any]:
    cases = []
    for table, paths in ((FILE_OUTPUTS, BAD_FILE_PATHS), (FOLDER_OUTPUTS, BAD_FOLDER_PATHS)):
        for command, argv in table.items():
            for kind, path in paths.items():
                cases.append(pytest.param(argv, path, id=f"{command}-{kind}"))
    return cases


OUTPUT_CASES = _output_cases()


def _is_error_line(line: str) -> bool:
    """Our ``error: ...`` line, or argparse's ``placement-rl COMMAND: error: argument --flag: ...``."""
    return re.match(r"(placement-rl[\w -]*: )?error: ", line) is not None


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize(("argv", "path"), OUTPUT_CASES)
def test_bad_output_path(
    argv: list[str], path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command refuses a bad output path before any work: status 2, one ``error:`` line naming the
    path, nothing written anywhere."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "folder").mkdir()
    (work / "empty").mkdir()
    (work / "file").write_text("x")
    (work / "dangling").symlink_to(work / "missing" / "target")
    (work / "link-to-file").symlink_to(work / "file")
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(work / "socket"))
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    target = path if path.startswith("/") or not path else str(work / path)
    (inputs / "experiment.yaml").write_text(yaml.safe_dump(_experiment()))
    train = yaml.safe_load((Path(__file__).resolve().parents[1] / "tune_configs" / "trinity_ppo.yaml").read_text())
    (inputs / "train.yaml").write_text(yaml.safe_dump(train))
    (inputs / "sweep.yaml").write_text(_sweep_yaml(target))
    files = {
        "OUT": target,
        "EMPTY": str(work / "empty"),
        "EXPERIMENT": str(inputs / "experiment.yaml"),
        "TRAIN": str(inputs / "train.yaml"),
        "SWEEP": str(inputs / "sweep.yaml"),
    }
    monkeypatch.chdir(work)
    before = _listing(work)
    status, err = _run([files.get(a, a) for a in argv], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err[-2000:]
    assert _is_error_line(lines[-1]) and "Traceback" not in err
    if target:
        assert repr(target) in lines[-1] or repr(target.rsplit("/", 1)[0]) in lines[-1], lines[-1]
    assert _listing(work) == before  # nothing written, not even the target of the dangling link


# ----------------------------------------------------------------------------------- model strings
#: ``--model`` values that must be refused with one ``error:`` line, by ``plan`` and ``simulate``.
ODD_MODELS: dict[str, str] = {
    "empty": "",
    "colon": ":",
    "module-only": "a:",
    "factory-only": ":b",
    "stdlib-os-system": "os:system",
    "stdlib-sys-exit": "sys:exit",
    "builtin-print": "builtins:print",
    "folder": "FOLDER",
    "not-json.json": "NOT_JSON.json",
    "not-json.txt": "NOT_JSON.txt",
    "empty-file": "EMPTY.json",
    "parent-path": "../../etc/passwd",
}
#: ``hf:`` strings: each imports transformers (seconds), so they run with the slow tests.
ODD_HF_MODELS: dict[str, str] = {
    "hf-empty": "hf:",
    "hf-colons": "hf::",
    "hf-not-a-model-class": "hf:GPT2Config",
    "hf-override-without-value": "hf:GPT2LMHeadModel:n_layer",
    "hf-override-empty": "hf:GPT2LMHeadModel:=",
    "hf-negative-layers": "hf:GPT2LMHeadModel:n_layer=-1",
    "hf-text-layers": "hf:GPT2LMHeadModel:n_layer=abc",
    "hf-infinite-layers": "hf:GPT2LMHeadModel:n_layer=1e400",
    "hf-unknown-key": "hf:GPT2LMHeadModel:no_such_key=1",
    "hf-inconsistent": "hf:GPT2LMHeadModel:n_embd=7",
    "hf-missing-config-file": "hf:missing_config.json",
}


def _model_cases(models: dict[str, str], marks: tuple[Any, ...] = ()) -> list[Any]:
    commands = {
        "plan": ["plan", "--model", "MODEL", "--topology", TOPOLOGY, "--methods", "dp", "--out-dir", "OUT"],
        "simulate": ["simulate", "--model", "MODEL", "--topology", TOPOLOGY, "--plan", "dp"],
    }
    return [
        pytest.param(argv, model, marks=marks, id=f"{command}-{name}")
        for name, model in models.items()
        for command, argv in commands.items()
    ]


MODEL_CASES = _model_cases(ODD_MODELS) + _model_cases(ODD_HF_MODELS, (pytest.mark.slow,))


@pytest.mark.parametrize(("argv", "model"), MODEL_CASES)
def test_odd_model_string(
    argv: list[str], model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "NOT_JSON.json").write_text("not json {")
    (tmp_path / "NOT_JSON.txt").write_text("not json {")
    (tmp_path / "EMPTY.json").write_text("")
    monkeypatch.chdir(tmp_path)
    status, err = _run([model if a == "MODEL" else str(tmp_path / "out") if a == "OUT" else a for a in argv], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, f"accepted --model {model!r}"
    assert lines[-1].startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ damaged checkpoints
def _policy_info(agent: str = "trinity", fmt: str = "placement_rl.policy") -> str:
    return json.dumps({"format": fmt, "schema_version": 1, "agent": agent, "run": "fuzz", "tensors": 1})


def _train_config(**changes: Any) -> dict[str, Any]:
    from placement_rl.rl.config import load_train_config

    doc = load_train_config(Path(__file__).resolve().parents[1] / "tune_configs" / "trinity_ppo.yaml").to_dict()
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        doc[section][key] = value
    return doc


#: A damaged checkpoint: ``train_config.json`` of the run (text, ``None``: absent, ``"GOOD"``: a valid
#: one), ``policy.json`` and ``policy.npz`` of ``checkpoint_final`` (``"DIR"``: a folder there).
CHECKPOINTS: dict[str, tuple[Any, Any, Any]] = {
    "no-train-config": (None, None, None),
    "garbled-train-config": ("{not json", None, None),
    "empty-train-config": ("", None, None),
    "train-config-a-list": ("[1, 2]", None, None),
    "train-config-a-folder": ("DIR", None, None),
    "unknown-agent": (json.dumps({"agent": "nope"}), None, None),
    "invalid-train-config": ("BAD", _policy_info(), b"x"),
    "no-policy-export": ("GOOD", None, None),
    "garbled-policy-info": ("GOOD", "{nope", b"x"),
    "policy-of-another-agent": ("GOOD", _policy_info("tag"), b"x"),
    "policy-info-of-another-format": ("GOOD", _policy_info(fmt="placement_rl.plan"), b"x"),
    "policy-info-a-folder": ("GOOD", "DIR", b"x"),
    "policy-weights-a-folder": ("GOOD", _policy_info(), "DIR"),
}
#: Checkpoints that get as far as building the agent's module (RLlib's import takes seconds).
SLOW_CHECKPOINTS: dict[str, tuple[Any, Any, Any]] = {
    "garbage-policy-weights": ("GOOD", _policy_info(), b"\x80\x02garbage"),
    "empty-policy-weights": ("GOOD", _policy_info(), b""),
}
#: ``--checkpoint`` values that are not a checkpoint folder at all.
CHECKPOINT_PATHS = {"a-file": "file", "missing": "missing", "dangling-symlink": "dangling", "empty": ""}


def _make_checkpoint(root: Path, spec: tuple[Any, Any, Any]) -> str:
    config, info, weights = spec
    folder = root / "run" / "checkpoint_final"
    folder.mkdir(parents=True)
    config_path = root / "run" / "train_config.json"
    if config == "DIR":
        config_path.mkdir()
    elif config is not None:
        doc = {"GOOD": _train_config(), "BAD": _train_config(ppo__lr=-1)}.get(config)
        config_path.write_text(json.dumps(doc) if doc is not None else config)
    for name, content in (("policy.json", info), ("policy.npz", weights)):
        if content == "DIR":
            (folder / name).mkdir()
        elif isinstance(content, bytes):
            (folder / name).write_bytes(content)
        elif content is not None:
            (folder / name).write_text(content)
    return str(folder)


def _checkpoint_cases() -> list[Any]:
    instance = ["--model", MODEL, "--topology", TOPOLOGY]
    commands = {
        "evaluate": [
            "evaluate",
            "--checkpoint",
            "CKPT",
            "--topologies",
            TOPOLOGY,
            "--models",
            MODEL,
            "--mcmc-budget",
            "0",
        ],
        "plan": ["plan", *instance, "--methods", "dp", "--checkpoint", "CKPT", "--out-dir", "OUT"],
    }
    cases = []
    for command, argv in commands.items():
        for name, spec in {**CHECKPOINTS, **SLOW_CHECKPOINTS}.items():
            marks = (pytest.mark.slow,) if name in SLOW_CHECKPOINTS else ()
            cases.append(pytest.param(argv, spec, marks=marks, id=f"{command}-{name}"))
        for name, path in CHECKPOINT_PATHS.items():
            cases.append(pytest.param(argv, path, id=f"{command}-{name}"))
    return cases


CHECKPOINT_CASES = _checkpoint_cases()


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize(("argv", "checkpoint"), CHECKPOINT_CASES)
def test_damaged_checkpoint(
    argv: list[str], checkpoint: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``evaluate --checkpoint`` and ``plan --checkpoint`` refuse a damaged checkpoint before Ray starts
    and before any cell runs."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing-target")
    if isinstance(checkpoint, tuple):
        path = _make_checkpoint(tmp_path, checkpoint)
    else:
        path = str(tmp_path / checkpoint) if checkpoint else ""
    out = tmp_path / "out"
    status, err = _run([path if a == "CKPT" else str(out) if a == "OUT" else a for a in argv], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, f"accepted --checkpoint {path!r}"
    assert _is_error_line(lines[-1]) and "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())  # no cell ran (plan makes its folder first)


# ------------------------------------------------------------------------------------------ budgets
@pytest.mark.parametrize(
    "value", ["99999999999h", "720.5h", "100000000000000000000", "1000000001", "9" * 5000, "9" * 400 + "s"]
)
def test_unbounded_budget_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _run(["search", "mcmc", "--model", MODEL, "--topology", TOPOLOGY, "--budget", value], capsys)
    assert status == 2 and "expected at most" in err and "Traceback" not in err
    assert len(err.strip().splitlines()[-1]) < 300  # a huge value is cut short in the message


def test_a_long_budget_is_echoed_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    from placement_rl.cli.common import budget

    assert budget("72h").seconds == 72 * 3600
    assert "budget '72h' is 3 days" in capsys.readouterr().err
    budget("59m")
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------------- Ctrl-C, for real
#: Long commands and the text on stderr that says their work has begun.
_INSTANCE = ["--model", MODEL, "--topology", TOPOLOGY]
LONG_COMMANDS: dict[str, tuple[list[str], bytes]] = {
    "plan": (["plan", *_INSTANCE, "--methods", "dp,mcmc", "--mcmc-budget", "10m"], b"best_ms="),
    "compare": (["compare", "EXPERIMENT", "--serial"], b"1/2"),
    "frontier": (["frontier", *_INSTANCE, "--mcmc-budget", "10m"], b"best_ms="),
}


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "started"), LONG_COMMANDS.values(), ids=list(LONG_COMMANDS))
def test_sigint_during_a_long_command(argv: list[str], started: bytes, tmp_path: Path) -> None:
    """SIGINT once the work has begun: status 130 within seconds, no traceback."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time

    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(
        yaml.safe_dump({**_experiment(), "methods": ["data_parallel", {"method": "mcmc", "budget": "10m"}]})
    )
    argv = [str(experiment) if a == "EXPERIMENT" else a for a in argv]
    child = subprocess.Popen(
        [sys.executable, "-m", "placement_rl.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert child.stderr is not None
    seen, deadline = b"", time.monotonic() + 120
    try:
        while started not in seen:
            assert time.monotonic() < deadline, f"no {started!r} on stderr: {seen.decode()[-2000:]}"
            if select.select([child.stderr], [], [], 1.0)[0]:
                chunk = os.read(child.stderr.fileno(), 4096)
                assert chunk, f"ended before it was interrupted: {seen.decode()[-2000:]}"
                seen += chunk
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=60)  # a hang fails here
    finally:
        if child.poll() is None:
            child.kill()
    err = (seen + stderr).decode()
    assert child.returncode == 130, err[-2000:]
    assert "Traceback" not in err

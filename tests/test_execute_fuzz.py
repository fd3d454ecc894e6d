"""Malformed input to ``execute`` and ``fidelity``, generated from valid plans and flags.

Every case runs ``placement-rl`` in process (:func:`placement_rl.cli.main`) and must end with exit
status 2 and one ``error:`` line: no traceback, no hang, nothing silently accepted. All of it is refused
before any worker starts or anything is measured: the launchers and the profiler are replaced by stubs
that fail the test if they are reached (a plan that happens to stay valid reaches the launcher stub,
which ends the run with status 1). Plans are mutated as in ``tests/test_cli_fuzz.py``: numbers replaced
by bad ones, strings by odd ones, keys deleted; the generator is seeded, so a case id names the
plan, the mutation and the path.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from fuzzing import delete_at as _delete
from fuzzing import dumps as _dumps
from fuzzing import leaves as _leaves
from fuzzing import set_at as _set

from placement_rl.cli import main
from placement_rl.emulate.cluster import switched_cluster
from placement_rl.execute import ExecutionError
from placement_rl.execute.runtime import ModelSource
from placement_rl.graph import OpGraph
from placement_rl.plan import constructors as pc

PathT = tuple[Any, ...]

#: Values a number in a plan may never take.
BAD_NUMBERS: tuple[tuple[str, Any], ...] = (
    ("negative", -1),
    ("zero", 0),
    ("huge", 10**30),
    ("infinite", "INF"),  # the JSON number 1e400, read as inf
    ("string", "abc"),
    ("list", [1]),
    ("bool", True),
    ("null", None),
)
#: Replacements of a string leaf: may be valid or not; must not crash.
ODD_STRINGS: tuple[tuple[str, Any], ...] = (("empty", ""), ("number", 123), ("null", None), ("other", "m9/gpu9"))

BASE = ["execute", "--model", "lenet", "--batch-size", "8", "--iterations", "1", "--warmup", "0"]
TOPOLOGY = "1x2"

_GRAPHS: dict[tuple[str, int | None, tuple[tuple[str, Any], ...]], OpGraph] = {}
_TRACE = ModelSource.graph


def _graph(source: ModelSource) -> OpGraph:
    """``source``'s graph, traced once per session."""
    key = (source.spec, source.batch_size, tuple(source.options))
    if key not in _GRAPHS:
        _GRAPHS[key] = _TRACE(source)
    return _GRAPHS[key]


def _lenet() -> OpGraph:
    return _graph(ModelSource("lenet", 8))


@pytest.fixture
def stubs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No worker starts and nothing is measured; the traced lenet is reused (a trace per case is slow)."""

    def launch(*args: object, **kwargs: object) -> Any:
        raise ExecutionError("stub launcher: the plan was accepted")

    def measured(*args: object, **kwargs: object) -> Any:
        raise AssertionError("fidelity measured something before refusing its input")

    monkeypatch.setattr("placement_rl.execute.run_local", launch)
    monkeypatch.setattr("placement_rl.execute.fidelity.profile_cases", measured)
    monkeypatch.setattr(ModelSource, "graph", _graph)


def _plans() -> dict[str, dict[str, Any]]:
    graph, topology = _lenet(), switched_cluster(1, 2)
    return {
        "dp": pc.data_parallel(graph, topology).to_dict(),
        "layerwise": pc.layerwise(graph, topology).to_dict(),
    }


def _plan_cases() -> list[Any]:
    rng = random.Random(20260611)
    cases: list[Any] = []
    for kind, doc in _plans().items():
        numeric = [
            p
            for p, v in _leaves(doc)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and "schema_version" not in p
        ]
        for path in rng.sample(numeric, min(len(numeric), 6)):
            for name, value in BAD_NUMBERS:
                cases.append(
                    pytest.param(_dumps(_set(doc, path, value)), True, id=f"{kind}-{name}-{'.'.join(map(str, path))}")
                )
        strings = [p for p, v in _leaves(doc) if isinstance(v, str) and p[0] not in ("format",)]
        for path in rng.sample(strings, min(len(strings), 8)):
            name, value = rng.choice(ODD_STRINGS)
            cases.append(
                pytest.param(
                    _dumps(_set(doc, path, value)), False, id=f"{kind}-string-{name}-{'.'.join(map(str, path))}"
                )
            )
        for key in doc:
            must_fail = key in ("format", "schema_version", "configs", "graph")
            cases.append(pytest.param(_dumps(_delete(doc, (key,))), must_fail, id=f"{kind}-delete-{key}"))
        first = next(iter(doc["configs"]))
        whole = json.dumps(doc)
        for name, text in (
            ("empty", ""),
            ("truncated", whole[: len(whole) // 2]),
            ("null", "null"),
            ("list", json.dumps([doc])),
            ("nan", whole.replace("2", "NaN", 1)),
            ("deep", "[" * 100_000 + "]" * 100_000),
            ("unknown-key", json.dumps({**doc, "surprise": 1})),
            ("no-configs", json.dumps({**doc, "configs": {}})),
            ("unknown-op", json.dumps({**doc, "configs": {**doc["configs"], "no_such_op": doc["configs"][first]}})),
            ("no-devices", json.dumps(_set(doc, ("configs", first, "devices"), []))),
            ("unknown-device", json.dumps(_set(doc, ("configs", first, "devices"), ["m7/gpu0", "m0/gpu1"]))),
            ("degree-3", json.dumps(_set(doc, ("configs", first, "degrees"), {"sample": 3}))),
            ("unknown-dim", json.dumps(_set(doc, ("configs", first, "degrees"), {"width": 2}))),
            ("other-graph", json.dumps({**doc, "graph": "alexnet"})),
        ):
            cases.append(pytest.param(text, True, id=f"{kind}-{name}"))
        cases.append(pytest.param(b"\xff\xfe\x00not utf-8", True, id=f"{kind}-not-utf8"))
        # two partitions on one device is a valid placement: it must not crash, whatever its status
        repeated = _set(doc, ("configs", first, "devices"), ["m0/gpu0", "m0/gpu0"])
        cases.append(pytest.param(json.dumps(repeated), False, id=f"{kind}-repeated-device"))
    return cases


PLAN_CASES = _plan_cases()


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exc:  # the launcher stub's ExecutionError: status 1
        status = int(exc.code or 0)
    return status, capsys.readouterr().err


def _one_error(err: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


@pytest.mark.parametrize(("text", "must_fail"), PLAN_CASES)
def test_malformed_plan(
    text: str | bytes, must_fail: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], stubs: None
) -> None:
    path = tmp_path / "plan.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    status, err = _run([*BASE, "--topology", TOPOLOGY, "--launcher", "local", "--plan", str(path)], capsys)
    if must_fail:
        assert status == 2, f"accepted: {text[:300]!r}\n{err}"
    assert status in (1, 2), err  # 1: the stub launcher reached by a plan that stayed valid
    if status == 2:
        _one_error(err)


#: ``execute`` flags refused before any worker starts.
BAD_EXECUTE: tuple[tuple[str, list[str]], ...] = (
    *(
        (f"topology={t}", ["--topology", t, "--launcher", "local"])
        for t in (
            "1x0",
            "0x1",
            "1x2@0",
            "1x2@nan",
            "1x2@inf",
            "1x2@1e400",
            "1x2@-1",
            "1x2@fast",
            "x2",
            "1x",
            "1x2x3",
            "100000x100000",
            "99999999999999999999x1",
            "1x²",
            "",
        )
    ),
    ("workers=65", ["--topology", "1x65", "--batch-size", "130", "--launcher", "local"]),
    ("threads=0", ["--topology", TOPOLOGY, "--threads", "0"]),
    ("iterations=0", ["--topology", TOPOLOGY, "--iterations", "0"]),
    ("warmup=-1", ["--topology", TOPOLOGY, "--warmup", "-1"]),
    ("lr=nan", ["--topology", TOPOLOGY, "--lr", "nan"]),
    ("lr=-1", ["--topology", TOPOLOGY, "--lr", "-1"]),
    ("batch=0", ["--topology", TOPOLOGY, "--batch-size", "0"]),
    ("backend", ["--topology", TOPOLOGY, "--backend", "mpi"]),
    ("launcher", ["--topology", TOPOLOGY, "--launcher", "slurm"]),
    ("master-addr-local", ["--topology", TOPOLOGY, "--launcher", "local", "--master-addr", "0.0.0.0"]),
    ("plan-missing", ["--topology", TOPOLOGY, "--launcher", "local", "--plan", "no_such_plan.json"]),
    ("plan-unknown", ["--topology", TOPOLOGY, "--launcher", "local", "--plan", "dpp"]),
)


@pytest.mark.parametrize("argv", [a for _, a in BAD_EXECUTE], ids=[n for n, _ in BAD_EXECUTE])
def test_bad_execute_flags(argv: list[str], capsys: pytest.CaptureFixture[str], stubs: None) -> None:
    status, err = _run([*BASE, *argv], capsys)
    assert status == 2, f"accepted {argv}: {err}"
    assert "error:" in err and "Traceback" not in err


#: ``fidelity`` flags refused before anything is measured.
BAD_FIDELITY: tuple[tuple[str, list[str]], ...] = (
    *(
        (f"cluster={c}", ["--cluster", c])
        for c in (
            "emulated:100000x100000@1",
            "emulated:4x5@1",
            "emulated:2x2@nan",
            "emulated:2x2@inf",
            "emulated:2x2@1e400",
            "emulated:2x2@0",
            "emulated:-1x2@1",
            "emulated:1e3x1@1",
            "emulated:",
            "emulated:1x1@1",
            "local:4",
            "",
        )
    ),
    ("workers=0", ["--workers", "0"]),
    ("workers=1", ["--workers", "1"]),
    ("workers=100000", ["--workers", "100000"]),
    ("workers-emulated", ["--cluster", "emulated:2x1@1", "--workers", "3"]),
    ("cases-empty-name", ["--cases", "lenet/"]),
    ("cases-unknown", ["--cases", "lenet/pipeline"]),
    ("iterations=0", ["--iterations", "0"]),
    ("warmup=-1", ["--warmup", "-1"]),
    ("models-on-cpu", ["--models", "lenet"]),
    ("resume-without-out", ["--resume"]),
)


@pytest.mark.parametrize("argv", [a for _, a in BAD_FIDELITY], ids=[n for n, _ in BAD_FIDELITY])
def test_bad_fidelity_flags(argv: list[str], capsys: pytest.CaptureFixture[str], stubs: None) -> None:
    status, err = _run(["fidelity", *argv], capsys)
    assert status == 2, f"accepted {argv}: {err}"
    assert "error:" in err and "Traceback" not in err


def test_fidelity_out_that_is_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stubs: None
) -> None:
    file = tmp_path / "results"
    file.write_text("keep me")
    status, err = _run(["fidelity", "--out", str(file)], capsys)
    assert status == 2 and "is a file; expected a folder" in err
    assert file.read_text() == "keep me"


def test_enough_generated_inputs() -> None:
    assert len(PLAN_CASES) + len(BAD_EXECUTE) + len(BAD_FIDELITY) >= 150

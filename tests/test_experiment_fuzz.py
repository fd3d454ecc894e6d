"""Malformed experiment files and damaged ``results.jsonl`` files through ``placement-rl compare``.

Every case runs the command in process (:func:`placement_rl.cli.main`). A file that is refused must
end with exit status 2 and one ``error:`` line naming the file (no traceback: ``main`` lets any
exception but ``ValueError`` and ``FileNotFoundError`` through, which fails the test). A file that
is accepted never runs its cells here: the driver is replaced by a stub once every check has passed
(the checks all run before the first cell), so a case takes milliseconds.

* Every number of a valid experiment is replaced by a negative, a very negative, an infinite or NaN
  number, a string, a list, an object and a bool: each must be refused.
* Every key is deleted and every value replaced by null, a string, a number and a list: none may
  crash, whatever the status.
* Bounds: seeds, cells, budgets, chains, batch sizes; YAML alias bombs, recursive aliases, deep
  nesting and repeated keys (the edge's loader, :mod:`placement_rl.rl.yaml_files`).
* ``--resume`` over a ``results.jsonl`` with a damaged row (cut short, not JSON, not an object, a key
  missing or mistyped): a warning names the file and line, the file keeps every byte, the damaged
  cell runs again.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzzing import delete_at as _delete
from fuzzing import set_at as _set

from placement_rl.cli import main
from placement_rl.errors import SchemaError
from placement_rl.experiments import MAX_CELLS, MAX_SEEDS, read_rows

KeyPath = tuple[Any, ...]

# The checks import lenet through the session's cache (the importer is tested elsewhere).
pytestmark = pytest.mark.usefixtures("cached_zoo")

#: A valid experiment that sets every option its methods take a number for.
BASE: dict[str, Any] = {
    "name": "fuzz",
    "description": "every option set",
    "models": [{"model": "lenet", "batch_size": 32, "coarsen": 8, "label": "lenet-g8"}, "lenet"],
    "topologies": ["trinity"],
    "methods": [
        "data_parallel",
        {
            "method": "mcmc",
            "budget": 30,
            "chains": 2,
            "beta": 50.0,
            "tempering": 2,
            "beta_ratio": 3.0,
            "adaptive": 0.1,
            "initial": ["data_parallel"],
        },
        {"method": "ft", "max_configs": 2, "device_counts": [1, 2]},
        {"method": "mcts", "budget": 10, "max_groups": 4, "max_subsets": 4, "leaf_batch": 2, "c_puct": 1.0},
        {"method": "exhaustive", "devices": 1, "max_plans": 1000, "time_limit": "10s"},
    ],
    "seeds": [0, 1],
    "cost": {"optimizer": "adam", "launch_overhead_s": 0.0, "default_efficiency": 0.5, "bucket_bytes": 1000},
    "concurrency": 2,
}
#: What replaces a number: each must be refused.
BAD_NUMBERS: tuple[tuple[str, Any], ...] = (
    ("negative", -1),
    ("very-negative", -1e30),
    ("inf", float("inf")),
    ("nan", float("nan")),
    ("string", "abc"),
    ("list", [1]),
    ("object", {"a": 1}),
    ("bool", True),
)
#: What replaces any value in the structural cases: may be valid or not; must not crash.
ODD_VALUES: tuple[tuple[str, Any], ...] = (("null", None), ("empty", ""), ("number", 7), ("list", ["x"]))


class Accepted(Exception):
    """Raised by the stub driver: every check passed."""


@pytest.fixture(autouse=True)
def no_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace the driver: an accepted experiment stops before its first cell."""

    def stub(*args: Any, **kwargs: Any) -> Any:
        raise Accepted

    monkeypatch.setattr("placement_rl.rl.compare.run_experiment", stub)


def _leaves(doc: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))
    else:
        yield path, doc


def _nodes(doc: Any, path: KeyPath = ()) -> Iterator[KeyPath]:
    """Every key path below the top (containers and leaves)."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield (*path, k)
        yield from _nodes(v, (*path, k))


def _compare(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, str]:
    """(``accepted``, ``""``) or (exit status, stderr) of ``compare`` on an experiment file."""
    spec = tmp_path / "exp.yaml"
    spec.write_text(text)
    try:
        status = main(["compare", str(spec), "--out", str(tmp_path / "out"), "--serial", *extra])
    except Accepted:
        capsys.readouterr()
        return "accepted", ""
    err = capsys.readouterr().err
    return str(status), err


def _refused(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    status, err = _compare(tmp_path, text, capsys, *extra)
    assert status == "2", f"accepted or crashed ({status}): {text[:300]}"
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_the_base_experiment_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _compare(tmp_path, yaml.safe_dump(BASE), capsys)[0] == "accepted"


#: Generated cases the fast subset runs (a seeded sample); the rest are marked slow.
FAST_SAMPLE = 12


def _split(cases: list[Any], ids: list[str]) -> list[Any]:
    """``cases`` as pytest params: a seeded sample of :data:`FAST_SAMPLE` fast, the others ``slow``."""
    fast = set(random.Random(0).sample(range(len(cases)), min(FAST_SAMPLE, len(cases))))
    return [
        pytest.param(*case, id=name, marks=() if k in fast else pytest.mark.slow)
        for k, (case, name) in enumerate(zip(cases, ids, strict=True))
    ]


NUMBER_CASES = [
    (path, label, value)
    for path, leaf in _leaves(BASE)
    if isinstance(leaf, (int, float)) and not isinstance(leaf, bool)
    for label, value in BAD_NUMBERS
]


@pytest.mark.parametrize(
    ("path", "value"),
    _split([(p, v) for p, _, v in NUMBER_CASES], [f"{'.'.join(map(str, p))}={label}" for p, label, _ in NUMBER_CASES]),
)
def test_every_bad_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: KeyPath, value: Any
) -> None:
    err = _refused(tmp_path, yaml.safe_dump(_set(BASE, path, value)), capsys)
    assert str(tmp_path / "exp.yaml") in err


STRUCTURE_CASES = [("delete", path, None) for path in _nodes(BASE)] + [
    (label, path, value) for path in _nodes(BASE) for label, value in ODD_VALUES
]


@pytest.mark.parametrize(
    ("how", "path", "value"),
    _split(STRUCTURE_CASES, [f"{'.'.join(map(str, p))}:{how}" for how, p, _ in STRUCTURE_CASES]),
)
def test_structural_changes_never_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str, path: KeyPath, value: Any
) -> None:
    doc = _delete(BASE, path) if how == "delete" else _set(BASE, path, value)
    status, err = _compare(tmp_path, yaml.safe_dump(doc), capsys)
    assert status in ("accepted", "2"), status
    if status == "2":
        assert err.startswith("error: ") and err.count("\n") == 1, err


def _doc(**changes: Any) -> str:
    return yaml.safe_dump({**BASE, **changes})


def _entry(method: str, **options: Any) -> list[Any]:
    return ["data_parallel", {"method": method, **options}]


BOUND_CASES: list[tuple[str, str, str]] = [
    ("seeds-count", _doc(seeds=1_000_000_000_000), f"seeds: 1000000000000; expected a count >= 1 and <= {MAX_SEEDS}"),
    ("seed-value", _doc(seeds=[2**64]), "seed 18446744073709551616; expected integers >= 0 and < 2**63"),
    ("cells", _doc(seeds=MAX_SEEDS, topologies=["test:20"]), f"cells; expected at most {MAX_CELLS:,}"),
    ("budget-hours", _doc(methods=_entry("mcmc", budget="99999999999h")), "budget = '99999999999h'; expected"),
    ("budget-digits", _doc(methods=_entry("mcmc", budget="9" * 400 + "s")), "budget = '999999999999"),
    ("budget-proposals", _doc(methods=_entry("mcmc", budget=10**12)), "expected at most 1,000,000,000"),
    ("mcts-budget", _doc(methods=_entry("mcts", budget="1000000h")), "budget = '1000000h'; expected"),
    ("time-limit", _doc(methods=_entry("exhaustive", time_limit="99999h")), "time_limit = '99999h'; expected"),
    ("chains", _doc(methods=_entry("mcmc", chains=10**9)), "chains = 1000000000; expected an integer >= 1 and"),
    ("tempering", _doc(methods=_entry("mcmc", tempering=10**6)), "tempering = 1000000; expected an integer >= 1"),
    ("beta-ratio", _doc(methods=_entry("mcmc", beta_ratio=float("inf"))), "beta_ratio = inf; expected a finite"),
    ("initial", _doc(methods=_entry("mcmc", initial="data_parallel")), "initial = 'data_parallel'; expected a"),
    ("leaf-batch", _doc(methods=_entry("mcts", leaf_batch=10**12)), "leaf_batch = 1000000000000; expected"),
    ("batch-size", _doc(models=[{"model": "lenet", "batch_size": 10**30}]), "batch_size = 10000000000000000000"),
    ("batch-per-device", _doc(models=[{"model": "lenet", "batch_per_device": 900_000}]), "a batch of 3,600,000"),
    ("overhead-nan", _doc(cost={"launch_overhead_s": float("nan")}), "launch_overhead_s = nan; expected a finite"),
    ("overhead-inf", _doc(cost={"launch_overhead_s": float("inf")}), "launch_overhead_s = inf; expected a finite"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in BOUND_CASES], ids=[c[0] for c in BOUND_CASES])
def test_values_past_their_bounds_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    assert message in _refused(tmp_path, text, capsys)


def test_a_set_override_is_bounded_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(tmp_path, _doc(), capsys, "--set", "seeds=1000000000000")
    assert "seeds: 1000000000000; expected a count >= 1" in err


def _bomb(levels: int = 9) -> str:
    """The billion laughs: level k lists level k - 1 nine times (9**levels nodes from ~300 bytes)."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"


YAML_CASES: list[tuple[str, str, str]] = [
    ("alias-bomb", _bomb(), "expands to more than 1,000,000 nodes through its aliases"),
    ("recursive-alias", "models: &m [lenet, *m]\n", "a YAML alias refers to a node that contains it"),
    ("deep", "models: " + "[" * 200 + "]" * 200 + "\n", "YAML nested more than 100 levels deep"),
    ("repeated-key", "models: [lenet]\nmodels: [alexnet]\n", "line 2: key 'models' is given twice (first on line 1)"),
    ("python-object", "models: !!python/object/apply:os.system [echo]\n", "malformed YAML"),
    ("syntax", "models: [lenet\n", "malformed YAML"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES])
def test_the_yaml_loader_refuses_what_it_should(tmp_path: Path, text: str, message: str) -> None:
    from placement_rl.rl.yaml_files import read_yaml_file

    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(SchemaError, match=r"exp\.yaml") as info:
        read_yaml_file(path)
    assert message in str(info.value)


def test_the_yaml_loader_reads_plain_documents(tmp_path: Path) -> None:
    from placement_rl.rl.yaml_files import loads_yaml

    text = "base: &b {budget: 10s}\nmethods: [{method: mcmc, <<: *b}, {method: mcts, <<: *b}]\n"
    assert loads_yaml(text, "x") == {
        "base": {"budget": "10s"},
        "methods": [{"method": "mcmc", "budget": "10s"}, {"method": "mcts", "budget": "10s"}],
    }
    assert loads_yaml("", "x") is None
    assert loads_yaml(yaml.safe_dump(BASE), "x") == BASE


# ------------------------------------------------------------------------------ damaged results.jsonl
SMALL: dict[str, Any] = {
    "name": "small",
    "models": [{"model": "lenet", "batch_size": 32}],
    "topologies": ["trinity"],
    "methods": ["data_parallel", "expert", "layerwise"],
}


def _damage(row: dict[str, Any], how: str) -> str:
    """One damaged line made from a good row (``torn``: cut short, as by a crash while writing)."""
    line = json.dumps(row)
    damaged = {
        "torn": line[: len(line) // 2],
        "not-json": "{this is not json}",
        "nan": line.replace('"makespan_s": ', '"makespan_s": NaN, "was": ', 1),
        "list": json.dumps([row]),
        "number": "5",
        "null": "null",
        "cell-list": json.dumps({**row, "cell": [row["cell"]]}),
        "makespan-string": json.dumps({**row, "makespan_s": "fast"}),
        "speedup-zero": json.dumps({**row, "speedup_over": {"data_parallel": 0}}),
        "missing-status": json.dumps({k: v for k, v in row.items() if k != "status"}),
        "missing-makespan": json.dumps({k: v for k, v in row.items() if k != "makespan_s"}),
        "seed-string": json.dumps({**row, "seed": "zero"}),
        "status-odd": json.dumps({**row, "status": "done"}),
        "anytime-odd": json.dumps({**row, "anytime": [[1.0]]}),
    }
    return damaged[how]


#: The damage kinds, one line each; ``torn`` goes last (a crash while writing the last line).
DAMAGE = (
    "not-json",
    "nan",
    "list",
    "number",
    "null",
    "cell-list",
    "makespan-string",
    "speedup-zero",
    "missing-status",
    "missing-makespan",
    "seed-string",
    "status-odd",
    "anytime-odd",
    "torn",
)


def test_resume_over_damaged_rows_warns_keeps_the_file_and_reruns_their_cells(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One finished run of 16 cells (MCMC on 16 seeds); 14 of its rows damaged, one kind each."""
    from placement_rl.experiments import (
        MAX_DAMAGED_WARNINGS,
        CellOutcome,
        Prepared,
        execute_cell,
        parse_experiment,
        prepare,
        run_experiment,
        serial_cells,
    )

    monkeypatch.undo()  # the real driver
    doc = {
        "name": "damaged",
        "models": [{"model": "lenet", "batch_size": 32}],
        "topologies": ["trinity"],
        "methods": [{"method": "mcmc", "budget": 1}],
        "seeds": 16,
    }
    prepared: Prepared = prepare(parse_experiment(doc))
    template: dict[str, Any] = {}

    def quick(*args: Any) -> CellOutcome:
        """A cell without its search: the first cell's row under each cell's key (the plan is not needed)."""
        cell = args[1]
        if not template:
            template.update(execute_cell(*args).row)
        return CellOutcome({**template, "cell": cell.key, "seed": cell.seed, "digest": cell.digest}, None)

    def runner(fn: Any, args: Any) -> Any:
        return serial_cells(quick, args)

    out = tmp_path / "out"
    monkeypatch.setattr("placement_rl.experiments.driver.write_outputs", lambda *a: [])  # no PNGs: not under test
    run_experiment(prepared, out, runner=runner, progress=False)
    lines = (out / "results.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    damaged = {k: how for k, how in zip(range(1, 1 + len(DAMAGE)), DAMAGE, strict=True)}
    for k, how in damaged.items():
        lines[k] = _damage(rows[k], how)
    text = "\n".join(lines)  # the torn last line has no line break
    (out / "results.jsonl").write_text(text)
    asked: list[str] = []

    def counting(fn: Any, args: Any) -> Any:
        asked.extend(a[1].key for a in args)
        return serial_cells(quick, args)

    messages: list[str] = []
    assert len(read_rows(out / "results.jsonl", messages)) == 16 - len(DAMAGE)
    for message, (k, how) in zip(messages, damaged.items(), strict=True):
        assert message.startswith(f"{out / 'results.jsonl'}:{k + 1}: skipped a damaged row: "), how
    report = run_experiment(prepared, out, resume=True, runner=counting, progress=False)
    err = capsys.readouterr().err
    assert err.count("warning: ") == MAX_DAMAGED_WARNINGS + 2  # the first ten, how many more, the file is kept
    assert f"warning: {messages[0]}" in err and f"{len(DAMAGE) - MAX_DAMAGED_WARNINGS} more damaged rows" in err
    assert sorted(asked) == sorted(rows[k]["cell"] for k in damaged)
    assert report.ran == len(DAMAGE) and report.skipped == 16 - len(DAMAGE)
    after = (out / "results.jsonl").read_text()
    assert after.startswith(text + "\n")  # every byte kept; the new rows start on a line of their own
    good = read_rows(out / "results.jsonl")
    assert len(good) == 16 and {r["cell"] for r in good} == {c.key for c in prepared.cells}


def test_resume_through_the_command_line_after_a_torn_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()
    monkeypatch.setattr("placement_rl.experiments.driver.write_outputs", lambda *a: [])  # no PNGs: not under test
    doc = {"name": "torn", "models": [{"model": "lenet", "batch_size": 32}], "topologies": ["trinity"]}
    doc["methods"] = ["data_parallel", "expert"]
    spec, out = tmp_path / "exp.yaml", tmp_path / "out"
    spec.write_text(yaml.safe_dump(doc))
    assert main(["compare", str(spec), "--out", str(out), "--serial", "--json"]) == 0
    capsys.readouterr()
    lines = (out / "results.jsonl").read_text().splitlines()
    torn = "\n".join([*lines[:-1], lines[-1][:40]])
    (out / "results.jsonl").write_text(torn)
    assert main(["compare", str(spec), "--out", str(out), "--serial", "--json", "--resume"]) == 0
    captured = capsys.readouterr()
    assert f"{out / 'results.jsonl'}:2: skipped a damaged row: malformed JSON" in captured.err
    assert "(a write cut short?)" in captured.err
    report = json.loads(captured.out)
    assert report["ran"] == 1 and report["skipped"] == 1
    assert (out / "results.jsonl").read_text().startswith(torn + "\n")


def test_a_results_folder_in_place_of_the_file_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()
    out = tmp_path / "out"
    (out / "results.jsonl").mkdir(parents=True)
    (out / "results.jsonl" / "x").write_text("x")
    spec = tmp_path / "small.yaml"
    spec.write_text(yaml.safe_dump({"models": ["lenet"], "topologies": ["trinity"], "methods": ["data_parallel"]}))
    assert main(["compare", str(spec), "--out", str(out), "--serial", "--resume"]) == 2
    assert "results.jsonl is not a file; expected the results.jsonl of an earlier run" in capsys.readouterr().err

"""Strict JSON both ways: what the project reads and writes is standard JSON, and defects are clean errors."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from placement_rl.errors import SchemaError
from placement_rl.graph import OpGraph
from placement_rl.io import as_float, read_json, write_json
from placement_rl.topology import DeviceTopology


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"x": NaN}', "NaN is not a JSON number"),
        ('{"x": -Infinity}', "-Infinity is not a JSON number"),
        ('{"x": 1e999}', None),  # parses to inf: caught where the number is read (as_float below)
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"x": 1', "malformed JSON at line 1, column 8"),
    ],
)
def test_defects_name_the_file(tmp_path: Path, text: str, message: str | None) -> None:
    path = tmp_path / "doc.json"
    path.write_text(text)
    if message is None:
        assert read_json(path) == {"x": float("inf")}
        with pytest.raises(SchemaError, match=r"doc.x: expected a finite number, got inf"):
            as_float(read_json(path)["x"], "doc.x")
        return
    with pytest.raises(SchemaError, match=message) as err:
        read_json(path)
    assert str(path) in str(err.value)


def test_not_utf8_and_folders(tmp_path: Path) -> None:
    (tmp_path / "bin.json").write_bytes(b'{"x": "\xff\xfe"}')
    with pytest.raises(SchemaError, match="not UTF-8 text"):
        read_json(tmp_path / "bin.json")
    with pytest.raises(SchemaError, match="is a folder; expected a JSON file"):
        read_json(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_json(tmp_path / "missing.json")


def test_huge_integers_are_out_of_range() -> None:
    with pytest.raises(SchemaError, match=r"w: 1000+ is out of the range of a float"):
        as_float(10**400, "w")


def test_nan_bandwidth_in_a_topology_file_is_refused(tmp_path: Path) -> None:
    from placement_rl.topology import load_preset

    document = load_preset("trinity").to_dict()
    text = write_and_read(tmp_path, document).replace(
        '"bandwidth_bytes_per_s": 12000000000.0', '"bandwidth_bytes_per_s": NaN', 1
    )
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(SchemaError, match="NaN is not a JSON number"):
        DeviceTopology.from_json(tmp_path / "t.json")


def write_and_read(tmp_path: Path, document: object) -> str:
    write_json(tmp_path / "t.json", document)
    return (tmp_path / "t.json").read_text()


def test_writes_are_strict_and_atomic(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_json(target, {"a": 1})
    with pytest.raises(ValueError, match="refusing to write non-standard JSON"):
        write_json(target, {"a": float("nan")})
    assert target.read_text() == '{\n "a": 1\n}\n'  # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # and no temporary file is left
    with pytest.raises(ValueError, match="is a folder; expected a file path"):
        write_json(tmp_path, {"a": 1})


def test_graph_files_round_trip_strictly(tmp_path: Path, zoo_graph) -> None:  # type: ignore[no-untyped-def]
    graph = zoo_graph("lenet")
    graph.to_json(tmp_path / "g.json")
    assert "NaN" not in (tmp_path / "g.json").read_text()
    assert OpGraph.from_json(tmp_path / "g.json") == graph


def test_finite_or_none_turns_non_finite_figures_into_null() -> None:
    from placement_rl.io import dumps_json, finite_or_none

    doc = {"a": float("inf"), "b": [1.0, float("nan"), (2, -float("inf"))], "c": "x", "d": 3}
    assert finite_or_none(doc) == {"a": None, "b": [1.0, None, [2, None]], "c": "x", "d": 3}
    assert dumps_json(finite_or_none(doc), indent=None) == '{"a": null, "b": [1.0, null, [2, null]], "c": "x", "d": 3}'


def test_written_json_files_have_the_ordinary_mode_and_special_files_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    write_json(out, {"a": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        write_json(fifo, {"a": 1})
    assert stat.S_ISFIFO(fifo.stat().st_mode)

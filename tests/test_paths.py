"""Output paths: names from input files never choose where files go; bad output paths fail before work."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from placement_rl.cli import main
from placement_rl.paths import PROBE_PREFIX, output_file, output_folder, safe_name
from placement_rl.topology import load_preset


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("x/../../somewhere", "x_.._.._somewhere"),
        ("..", "unnamed"),
        ("/etc/passwd", "_etc_passwd"),
        ("ok-1.2", "ok-1.2"),
    ],
)
def test_safe_name_is_one_harmless_component(name: str, expected: str) -> None:
    assert safe_name(name) == expected
    assert "/" not in safe_name(name) and not safe_name(name).startswith(".")


def test_a_topology_name_cannot_escape_the_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    document = load_preset("trinity").to_dict()
    document["name"] = "x/../../escaped"
    topology = tmp_path / "evil.json"
    topology.write_text(json.dumps(document))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = ["plan", "--model", "lenet", "--topology", str(topology), "--methods", "dp,single", "--json"]
    assert main(argv) == 0
    written = sorted(p.relative_to(work) for p in work.rglob("*") if p.is_file())
    assert written and all(p.parts[0] == "out" for p in written), written
    assert not (tmp_path / "escaped").exists() and not (work / "escaped").exists()


def test_output_paths_are_checked_before_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["search", "mcmc", "--model", "lenet", "--topology", "trinity", "--budget", "10", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "is a folder; expected a file path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no stray temporary file
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; expected a folder"):
        output_folder(tmp_path / "file")
    with pytest.raises(ValueError, match="is a file, so the folder cannot be created"):
        output_file(tmp_path / "file" / "plan.json")


def _unwritable() -> Path:
    """A folder that exists and that no process may create files in (sysfs's root; even root is refused,
    although ``os.access`` says yes to root): stands in for a read-only mount."""
    folder = Path("/sys")
    try:
        (folder / "placement-rl-probe").touch()
    except OSError:
        return folder
    pytest.skip("no unwritable /sys on this system")


def _left_behind(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(PROBE_PREFIX))


def test_output_file_refuses_each_bad_path_naming_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing" / "target")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    with socket.socket(socket.AF_UNIX) as unix:
        unix.bind(str(tmp_path / "socket"))
    cases = {
        tmp_path: "is a folder; expected a file path",
        tmp_path / "dangling": "is a symlink to .*missing/target', which does not exist",
        tmp_path / "file" / "x.json": "'.*file' is a file, so the folder cannot be created",
        tmp_path / "link" / "x.json": "'.*link' is a file, so the folder cannot be created",
        tmp_path / "dangling" / "x.json": "'.*dangling' is a symlink to .*, which does not exist",
        _unwritable() / "sub" / "x.json": r"cannot write in '/sys' \(",
        tmp_path / "socket": "not a regular file",  # not /dev/null: the writer that follows may replace it
    }
    for path, message in cases.items():
        with pytest.raises(ValueError, match=message) as caught:
            output_file(path, "--trace")
        assert str(caught.value).startswith(f"--trace '{path}'")  # the flag and the path, as given
    with pytest.raises(ValueError, match="--out is empty"):
        output_file("")


def test_output_folder_refuses_each_bad_path_naming_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    cases = {
        tmp_path / "file": "is a file; expected a folder",
        tmp_path / "link": r"is a file \(a symlink to '.*file'\); expected a folder",
        tmp_path / "dangling": "is a symlink to .*missing', which does not exist; expected a folder",
        tmp_path / "file" / "sub": "'.*file' is a file, so the folder cannot be created",
        _unwritable(): r"cannot write in '/sys' \(",
        _unwritable() / "sub": r"cannot create the folder \(",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError, match=message) as caught:
            output_folder(path, "--out-dir")
        assert str(caught.value).startswith(f"--out-dir '{path}'")
    assert not (tmp_path / "missing").exists()  # a dangling link is not followed


def test_good_output_paths_pass_and_leave_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "to-old.json").symlink_to(tmp_path / "old.json")
    assert output_file(tmp_path / "a" / "b" / "plan.json") == tmp_path / "a" / "b" / "plan.json"
    assert not (tmp_path / "a").exists()  # the writer makes the folders
    output_file(tmp_path / "old.json")  # an existing file is replaced by the writer
    output_file(tmp_path / "to-old.json")  # so is a symlink to one
    assert output_folder(tmp_path / "c" / "d").is_dir()
    assert output_folder(tmp_path / "c" / "d").is_dir()  # an existing folder
    assert _left_behind(tmp_path) == []
    assert (tmp_path / "old.json").read_text() == "{}"

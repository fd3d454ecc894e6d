"""The command lines of the README and of every docs page match the command line: every
``placement-rl ...`` line in their code blocks parses (its command, flags and values exist and are
valid), every ``python benchmarks/SCRIPT.py ...`` line names a script whose parser accepts it, every
shipped file a command names exists, and the quick commands run as written.

Read from the pages at test time, so a command that changes breaks this test until the docs follow.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripts import load_script

from placement_rl.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
#: A benchmark's output under docs/, not a page of the site (mkdocs.yml excludes it).
NOT_PAGES = ("docs/anytime/results.md",)
#: The README and every page of the documentation site.
PAGES = ["README.md"] + sorted(
    page for page in (p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")) if page not in NOT_PAGES
)
#: Commands that run in a few seconds as written (the others are checked by parsing, and their
#: work is tested elsewhere at tiny budgets).
QUICK = ("topologies", "show-topology", "models")
#: Files that the "Bring your own model and cluster" page has the user write.
OWN_MODEL_FILES = ("my_cluster.json", "my_model")
#: Folders of shipped files that commands name (training configs, experiment files).
SHIPPED = ("tune_configs/", "benchmarks/experiments/")


def _shell_lines(text: str) -> Iterator[str]:
    """Every line of the page's bash, sh and text code blocks (continuations joined, comments cut)."""
    language, block = None, []
    for line in text.splitlines():
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and language is None:
            language, block = fence.group(1) or "text", []
        elif fence:
            if language in ("bash", "sh", "text"):
                for command in "\n".join(block).replace("\\\n", " ").splitlines():
                    yield command.split(" #", 1)[0].strip()
            language = None
        elif language is not None:
            block.append(line)


def _commands(readme: str) -> list[str]:
    """Every ``placement-rl ...`` command in the page's code blocks."""
    return [c[c.index("placement-rl ") :] for c in _shell_lines(readme) if "placement-rl " in c]


def _benchmarks(text: str) -> list[str]:
    """Every ``python benchmarks/SCRIPT.py ...`` command in the page's code blocks and inline code."""
    found = [c[c.index("python benchmarks/") :] for c in _shell_lines(text) if "python benchmarks/" in c]
    inline = re.findall(r"`((?:[A-Z_]+=\S+ )*python benchmarks/[^`]+)`", text.replace("\n", " "))
    return found + [c[c.index("python benchmarks/") :] for c in inline]


def _argv(command: str) -> list[str]:
    return shlex.split(command.replace('"$PWD', '"/tmp'))[1:]


def _text(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def test_the_pages_have_commands() -> None:
    commands = [c for page in PAGES for c in _commands(_text(page))]
    assert len(commands) >= 60, commands
    wanted = {"plan", "simulate", "search", "frontier", "compare", "train", "tune", "evaluate", "execute"}
    assert {_argv(c)[0] for c in commands} >= wanted | {"fidelity", "calibrate", "import", "profile", "emulate"}
    assert {_argv(c)[0] for c in _commands(_text("README.md"))} >= {"plan", "simulate"}


@pytest.mark.parametrize("page", PAGES)
def test_every_command_parses(page: str) -> None:
    parser = build_parser()
    bad = []
    for command in _commands(_text(page)):
        try:
            parser.parse_args(_argv(command))
        except SystemExit:
            bad.append(command)
    assert not bad, f"{page}: commands the command line refuses: {bad}"


@pytest.mark.parametrize("page", PAGES)
def test_every_shipped_file_a_command_names_exists(page: str) -> None:
    commands = _commands(_text(page)) + _benchmarks(_text(page))
    named = {arg for c in commands for arg in _argv(c) if arg.startswith(SHIPPED)}
    named |= {f"benchmarks/{m}" for c in commands for m in re.findall(r"python benchmarks/(\w+\.py)", c)}
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"{page} names files that do not exist: {missing}"


class _Parsed(Exception):
    """Raised by the patched parser once a benchmark's arguments parsed: nothing runs."""


def test_every_benchmark_command_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each script's own parser accepts the arguments the pages give it (its ``main`` stops right there)."""
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):  # the scripts setdefault these for their own process
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        parse(self, *args, **kwargs)  # type: ignore[arg-type]
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    by_script: dict[str, set[tuple[str, ...]]] = {}
    for page in PAGES:
        for command in _benchmarks(_text(page)):
            words = _argv(command)
            by_script.setdefault(words[0], set()).add(tuple(words[1:]))
    assert len(by_script) >= 12, sorted(by_script)
    bad = []
    for script, argvs in sorted(by_script.items()):
        module = load_script(script, f"docs_benchmark_{Path(script).stem}")
        for argv in sorted(argvs):
            try:
                module.main(list(argv))
            except _Parsed:
                continue
            except SystemExit:
                pass
            bad.append(f"python {script} {' '.join(argv)}")
    assert not bad, f"benchmark commands their scripts refuse: {bad}"


@pytest.mark.parametrize("name", QUICK)
def test_quick_commands_run(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    commands = sorted({c for page in PAGES for c in _commands(_text(page)) if _argv(c)[0] == name})
    assert commands, f"no page shows a '{name}' command"
    for command in commands:
        if any(name in command for name in OWN_MODEL_FILES):
            continue  # needs the page's files: tests/test_own_model.py runs that page as written
        argv = [a for a in _argv(command) if a != "--stats"]  # --stats imports the whole zoo: tested elsewhere
        assert main(argv) == 0, command
        assert capsys.readouterr().out.strip(), command

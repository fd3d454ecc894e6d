"""The README's command lines match the command line: every ``placement-rl ...`` line in the README's
code blocks parses (its command, flags and values exist and are valid), and the quick ones run as written.

Read from README.md at test time, so a command that changes breaks this test until the README follows.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from placement_rl.cli import build_parser, main

#: README commands that run in a few seconds as written (the others are checked by parsing, and their
#: work is tested elsewhere at tiny budgets).
QUICK = ("topologies", "show-topology", "models")
#: Files that the README's "Plan your own model on your own cluster" section has the user write.
OWN_MODEL_FILES = ("my_cluster.json", "my_model")


def _commands(readme: str) -> list[str]:
    """Every ``placement-rl ...`` command in the README's fenced code blocks (continuations joined)."""
    found, language, block = [], None, []
    for line in readme.splitlines():
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and language is None:
            language, block = fence.group(1) or "text", []
        elif fence:
            if language in ("bash", "sh", "text"):
                for command in "\n".join(block).replace("\\\n", " ").splitlines():
                    command = command.split(" #", 1)[0].strip()
                    if "placement-rl " in command:
                        found.append(command[command.index("placement-rl ") :])
            language = None
        elif language is not None:
            block.append(line)
    return found


def _argv(command: str) -> list[str]:
    return shlex.split(command.replace('"$PWD', '"/tmp'))[1:]


def test_the_readme_has_commands(repo_root: Path) -> None:
    commands = _commands((repo_root / "README.md").read_text())
    assert len(commands) >= 20, commands
    assert {_argv(c)[0] for c in commands} >= {"plan", "simulate", "search", "frontier", "train", "evaluate"}


def test_every_readme_command_parses(repo_root: Path) -> None:
    parser = build_parser()
    bad = []
    for command in _commands((repo_root / "README.md").read_text()):
        try:
            parser.parse_args(_argv(command))
        except SystemExit:
            bad.append(command)
    assert not bad, f"README commands the command line refuses: {bad}"


@pytest.mark.parametrize("name", QUICK)
def test_quick_readme_commands_run(
    repo_root: Path, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    commands = [c for c in _commands((repo_root / "README.md").read_text()) if _argv(c)[0] == name]
    assert commands, f"the README shows no '{name}' command"
    for command in commands:
        if any(name in command for name in OWN_MODEL_FILES):
            continue  # needs the section's files: tests/test_own_model.py runs that section as written
        argv = [a for a in _argv(command) if a != "--stats"]  # --stats imports the whole zoo: tested elsewhere
        assert main(argv) == 0, command
        assert capsys.readouterr().out.strip(), command

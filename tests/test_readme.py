"""The README's Python example runs as written: read from README.md at test time, so the test follows it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from placement_rl import zoo
from placement_rl.graph import OpGraph
from placement_rl.topology import TEST_SEEDS


def _example(readme: str) -> str:
    """The first fenced ``python`` block of the README's "What is here" section."""
    section = re.search(r"^## What is here\n(.*?)(?=^## )", readme, flags=re.MULTILINE | re.DOTALL)
    assert section, "README.md has no '## What is here' section"
    block = re.search(r"^```python\n(.*?)^```", section.group(1), flags=re.MULTILINE | re.DOTALL)
    assert block, "README.md's 'What is here' section has no ```python block"
    return block.group(1)


@pytest.fixture(scope="module")
def example(
    repo_root: Path, tmp_path_factory: pytest.TempPathFactory, zoo_graph: Callable[..., OpGraph]
) -> tuple[dict[str, Any], Path]:
    """The example's variables after running it in a fresh folder (it writes ``dp.json``), and that folder."""
    code = _example((repo_root / "README.md").read_text())
    assert "from placement_rl" in code
    folder = tmp_path_factory.mktemp("readme")
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(zoo, "load", zoo_graph)  # the session's cached imports (the importer is tested elsewhere)
        exec(compile(code, "README.md (What is here)", "exec"), namespace)
    return namespace, folder


def test_example_builds_a_valid_plan_and_simulates_it(example: tuple[dict[str, Any], Path]) -> None:
    ns, folder = example
    graph, cluster, plan, result = ns["graph"], ns["cluster"], ns["plan"], ns["result"]
    assert graph.num_ops > 100 and cluster.num_devices == 16
    plan.validate(graph, cluster)
    assert type(plan).from_json(folder / "dp.json") == plan
    assert 0 < result.makespan_s < 10 and not result.oom
    assert (result.peak_memory_bytes > 0).all()


def test_example_groups_and_unseen_topologies(example: tuple[dict[str, Any], Path]) -> None:
    ns, _ = example
    graph, groups, unseen = ns["graph"], ns["groups"], ns["unseen"]
    assert 1 < groups.num_ops <= 60 < graph.num_ops
    assert len(unseen) == 10 and len({t.name for t in unseen}) == 10
    for topology in unseen:
        seed = int(topology.name.rsplit("-", 1)[1])
        assert seed in TEST_SEEDS and topology.num_devices >= 1

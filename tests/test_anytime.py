"""The anytime benchmark's core: curve rows, the first time a curve beats data parallelism, the table,
the JSON/CSV files and the per-instance PNGs (no Ray: searches only; PPO is tested in tests/rl/)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from placement_rl.errors import SchemaError
from placement_rl.experiments import anytime_pngs
from placement_rl.methods import compare_methods
from placement_rl.rl.anytime import (
    anytime_benchmark,
    curve_row,
    first_below,
    prior_search_method,
    table_markdown,
    write_curves,
)
from placement_rl.sim import CostModel
from placement_rl.topology import load_preset


def test_first_below() -> None:
    trace = [(0.0, 5.0), (1.5, 4.0), (3.0, 2.0)]
    assert first_below(trace, 4.5) == 1.5
    assert first_below(trace, 2.0) is None  # strictly below
    assert first_below([], 1.0) is None


def test_table_and_files_of_hand_made_curves(tmp_path: Path) -> None:
    rows = [
        {
            "instance": "a@b",
            "method": m,
            "makespan_s": c[-1][1],
            "speedup_over_dp": 2e-3 / c[-1][1],
            "oom": False,
            "search_s": c[-1][0],
            "dp_makespan_s": 2e-3,
            "anytime": c,
            "first_beat_dp_s": first_below(c, 2e-3),
        }
        for m, c in (("fast", [[0.1, 3e-3], [0.5, 1e-3], [2.0, 1e-3]]), ("never", [[4.0, 2.5e-3]]))
    ]
    table = table_markdown(rows).splitlines()
    assert table[2] == "| a@b | fast | 1.00 | 2.00x | 0.5 | 2.0 | yes |"
    assert table[3] == "| a@b | never | 2.50 | 0.80x | - | 4.0 | yes |"
    json_file, csv_file = write_curves(rows, tmp_path / "out")
    assert json.loads(json_file.read_text())["rows"] == rows
    assert csv_file.read_text().splitlines() == [
        "instance,method,seconds,best_makespan_ms",
        "a@b,fast,0.1000,3",
        "a@b,fast,0.5000,1",
        "a@b,fast,2.0000,1",
        "a@b,never,4.0000,2.5",
    ]


@pytest.mark.slow  # MCMC and two PNGs: 2-16 s on the shared cores
def test_curves_tables_and_pngs(zoo_graph: Any, tmp_path: Path) -> None:
    graph, topology = zoo_graph("lenet", batch_size=32), load_preset("trinity")
    results = compare_methods(graph, topology, ["data_parallel", "mcmc"], options={"mcmc": {"budget": 300, "seed": 0}})
    rows = [curve_row(r) for r in results]
    dp, mcmc = rows
    assert dp["anytime"] == [[dp["search_s"], dp["makespan_s"]]]  # no trace: one point
    assert dp["first_beat_dp_s"] is None  # data parallelism does not beat itself
    assert mcmc["anytime"][-1][1] == pytest.approx(mcmc["makespan_s"])
    if mcmc["makespan_s"] < mcmc["dp_makespan_s"]:
        assert mcmc["first_beat_dp_s"] is not None and mcmc["first_beat_dp_s"] <= mcmc["anytime"][-1][0]
    files = write_curves(rows, tmp_path)
    assert json.loads(files[0].read_text())["rows"][1]["method"] == "mcmc"
    assert len(files[1].read_text().splitlines()) == 1 + len(dp["anytime"]) + len(mcmc["anytime"])
    table = table_markdown(rows).splitlines()
    assert len(table) == 4 and table[2].startswith("| lenet@trinity | data_parallel | ") and "| 1.00x | - |" in table[2]
    [png] = anytime_pngs(rows, tmp_path / "pngs")
    assert png.name == "lenet@trinity.png" and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("cost_model", [None, CostModel(calibration=None)], ids=["default", "roofline"])
def test_the_benchmark_judges_under_the_cost_model_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cost_model: CostModel | None
) -> None:
    import placement_rl.rl.anytime

    seen: list[Any] = []

    def compare(graph: object, topology: object, methods: object, **kwargs: Any) -> list[object]:
        seen.append(kwargs["cost_model"])
        return []

    monkeypatch.setattr(placement_rl.rl.anytime, "compare_methods", compare)
    instance = (SimpleNamespace(name="g"), SimpleNamespace(name="t"))
    rows = anytime_benchmark(
        [instance],  # type: ignore[list-item]
        "1s",
        tmp_path,
        ppo=None,
        searches=["mcmc"],
        progress=None,
        cost_model=cost_model,
    )
    assert rows == [] and seen == [cost_model]


def test_the_prior_search_takes_a_loaded_policy_and_names_its_checkpoint() -> None:
    """A policy already loaded (its env changed, e.g. by ``--calibration``) is checked as a checkpoint is."""
    from placement_rl.rl.config import TrainConfig
    from placement_rl.rl.policy import Policy

    config = TrainConfig.from_dict({"agent": "trinity", "env": {"generator": {"kind": "fixed"}}})
    policy = Policy(SimpleNamespace(name="trinity"), config, None, Path("out/ckpt"))  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match=r"checkpoint 'out/ckpt' holds a 'trinity' policy"):
        prior_search_method(policy)

"""Large instances are refused with one clear error, or fitted, never a MemoryError or a hang.

The simulator's memory bound (:mod:`placement_rl.sim.limits`) is monkeypatched down to a few bytes
so that small instances show the refusals that 3,072-GPU ones meet; FT's device limit is checked on
the real 3,072-GPU preset, which it refuses before any work.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

from placement_rl.cli import main
from placement_rl.experiments import measure_cells, parse_experiment, prepare
from placement_rl.methods import baseline_plan, compare_methods
from placement_rl.models import load_model
from placement_rl.search.ft import FT_MAX_DEVICES, candidate_device_sets, default_device_counts, run_ft
from placement_rl.sim import CostModel, limits
from placement_rl.sim.network import network
from placement_rl.sim.simulator import EdgeArrays, OpArrays, SimContext, simulate
from placement_rl.topology import load_preset


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Set the simulator's bound to ``bytes`` and check every estimate, however small."""

    def set_bound(num_bytes: int) -> None:
        monkeypatch.delenv(limits.BOUND_VARIABLE, raising=False)
        monkeypatch.setattr(limits, "MAX_SIMULATION_BYTES", num_bytes)  # checked however small the estimate

    return set_bound


def _tasks(graph, topology, plan) -> int:  # type: ignore[no-untyped-def]
    """The task count of ``plan``'s assembled task graph."""
    ctx = SimContext(graph, topology)
    ops = [ctx.compile(i, plan[op.name]) for i, op in enumerate(graph.ops)]
    arrays = ctx.with_shared(OpArrays.from_ops(ops), ops)
    return int(ctx.assemble(arrays, EdgeArrays.from_flat(*ctx.transfers(ops))).duration.shape[0])


@pytest.mark.parametrize("plan_name", ["data_parallel", "expert", "layerwise"])
def test_the_estimate_counts_the_tasks_the_simulator_builds(plan_name: str) -> None:
    graph, topology = load_model("lenet"), load_preset("flexflow-p100")
    plan = baseline_plan(plan_name, graph, topology)
    ctx = SimContext(graph, topology)
    ops = [ctx.compile(i, plan[op.name]) for i, op in enumerate(graph.ops)]
    arrays = ctx.with_shared(OpArrays.from_ops(ops), ops)
    edges = EdgeArrays.from_flat(*ctx.transfers(ops))
    estimate = ctx.size_estimate(arrays, int(edges.com_ptr[-1]))
    tasks = ctx.assemble(arrays, edges)
    # exact but for tensor-parallel partial sums, bounded by their groups (the expert plan splits a matmul)
    assert tasks.duration.shape[0] <= estimate.tasks <= tasks.duration.shape[0] * 1.01
    if plan_name != "expert":
        assert estimate.tasks == tasks.duration.shape[0]
    assert estimate.flows >= tasks.flows.num_bytes.shape[0]  # all-reduces: their largest algorithm
    if plan_name == "data_parallel":  # no transfers: every flow is a bucket's, each bucket its algorithm
        exact = ctx.size_estimate(arrays, int(edges.com_ptr[-1]), exact_all_reduces=True)
        assert (exact.flows, exact.directions) == (tasks.flows.num_bytes.shape[0], tasks.flows.dirs.shape[0])
    assert estimate.num_bytes >= estimate.tasks * limits.BYTES_PER_TASK


def test_a_plan_over_the_bound_is_refused_naming_tasks_bytes_and_what_to_do(bound) -> None:  # type: ignore[no-untyped-def]
    graph, topology = load_model("lenet"), load_preset("flexflow-p100")
    plan = baseline_plan("data_parallel", graph, topology)
    compute_tasks = 4 * sum(len(plan[op.name].devices) for op in graph.ops)  # forward, backward, two host tasks
    bound(1000)
    with pytest.raises(limits.SimulationTooLarge) as caught:
        simulate(graph, topology, plan)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    where = "plan 'data_parallel' of lenet on 16 of flexflow-p100's 16 devices"
    assert (
        f"simulating {where} needs at least {compute_tasks:,} tasks, at least {compute_tasks // 4} KiB, more" in message
    )
    assert "more than the simulator's bound of 1 KiB (placement_rl.sim.limits.MAX_SIMULATION_BYTES)" in message
    assert "use fewer devices" in message and "coarser plan" in message and limits.BOUND_VARIABLE in message
    assert caught.value.estimate.tasks == compute_tasks and caught.value.bound_bytes == 1000


def test_transfers_count_once_known(bound) -> None:  # type: ignore[no-untyped-def]
    """The expert plan's transfers are known only after matching producers with consumers: a bound
    between the compute tasks and the whole task graph lets the plan through the first check and
    refuses it at assembly, before any task array exists."""
    graph, topology = load_model("lenet"), load_preset("flexflow-p100")
    plan = baseline_plan("expert", graph, topology)
    ctx = SimContext(graph, topology)
    ops = [ctx.compile(i, plan[op.name]) for i, op in enumerate(graph.ops)]
    arrays = ctx.with_shared(OpArrays.from_ops(ops), ops)
    before = ctx.size_estimate(arrays)  # without the transfers
    whole = ctx.size_estimate(arrays, int(EdgeArrays.from_flat(*ctx.transfers(ops)).com_ptr[-1]))
    assert whole.tasks >= _tasks(graph, topology, plan) > before.tasks
    bound(before.num_bytes + 1)
    with pytest.raises(limits.SimulationTooLarge, match=r"^simulating a plan of lenet on \d+ of flexflow-p100's") as c:
        SimContext(graph, topology).simulate(plan)
    assert c.value.estimate.tasks == whole.tasks


def test_the_environment_variable_sets_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(limits.BOUND_VARIABLE, "2KiB")
    assert limits.check_above_bytes() == 2048  # a set bound is checked however small the estimate
    assert limits.memory_bound_bytes() == (2048, f"{limits.BOUND_VARIABLE}=2KiB")
    graph, topology = load_model("lenet"), load_preset("trinity")
    with pytest.raises(limits.SimulationTooLarge, match=f"bound of 2 KiB \\({limits.BOUND_VARIABLE}=2KiB\\)"):
        simulate(graph, topology, baseline_plan("data_parallel", graph, topology))
    monkeypatch.setenv(limits.BOUND_VARIABLE, "lots")
    with pytest.raises(ValueError, match=f"^{limits.BOUND_VARIABLE} = 'lots'; expected a positive size in bytes"):
        limits.memory_bound_bytes()


@pytest.mark.parametrize(
    ("text", "expected"), [("16GiB", 16 * 2**30), ("500 MB", 500 * 10**6), ("2e9", 2 * 10**9), ("1024", 1024)]
)
def test_sizes_parse(text: str, expected: int) -> None:
    assert limits.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-5GB", "3 parsecs", "nan", "inf GB"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected a positive size in bytes"):
        limits.parse_bytes(text)


def test_the_default_bound_is_half_of_what_the_process_can_allocate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(limits.BOUND_VARIABLE, raising=False)
    monkeypatch.setattr(limits, "MAX_SIMULATION_BYTES", None)
    monkeypatch.setattr(limits, "available_memory_bytes", lambda: 6 * 2**30)
    assert limits.memory_bound_bytes() == (3 * 2**30, "half of the 6.0 GiB this process can still allocate")


def test_available_memory_is_positive_and_under_the_address_space_limit() -> None:
    available = limits.available_memory_bytes()
    assert available > 0
    resource = pytest.importorskip("resource")
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        assert available <= soft


def test_simulate_refuses_with_one_error_line(bound, capsys) -> None:  # type: ignore[no-untyped-def]
    bound(1000)
    assert main(["simulate", "--model", "lenet", "--topology", "trinity", "--plan", "dp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: simulating plan 'data_parallel' of lenet on 4 of trinity's")
    assert "Traceback" not in capsys.readouterr().err


def test_a_refused_method_is_a_row_with_a_note_and_the_others_run(bound) -> None:  # type: ignore[no-untyped-def]
    """Data parallelism (the reference) and the expert plan need more than the bound; a single device's
    plan does not: its row has no reference (nan), the refused ones come back as rows that say why."""
    graph, topology = load_model("lenet"), load_preset("flexflow-p100")
    single = 4 * sum(len(baseline_plan("single_device", graph, topology)[op.name].devices) for op in graph.ops)
    bound(single * limits.BYTES_PER_TASK + 10_000)
    experiment = parse_experiment(
        {"models": ["lenet"], "topologies": ["flexflow-p100"], "methods": ["data_parallel", "single_device", "expert"]},
        "test",
    )
    refused: list[dict[str, object]] = []
    measured = measure_cells(prepare(experiment, "test"), on_refused=refused.append)
    assert [m.result.method for m in measured] == ["single_device"]
    assert np.isnan(measured[0].result.dp_makespan_s) and measured[0].row["dp_makespan_s"] is None
    assert [r["method"] for r in refused] == ["data_parallel", "expert"]
    for row in refused:
        assert row["status"] == "error" and row["makespan_s"] is None
        note = str(row["note"])
        assert re.match(r"refused: simulating plan '(data_parallel|expert)' of lenet on 16 of flexflow-p100's", note)
    with pytest.raises(limits.SimulationTooLarge):  # without on_refused, errors propagate as before
        measure_cells(prepare(experiment, "test"))


def test_compare_methods_without_a_reference_still_judges_the_plans(bound) -> None:  # type: ignore[no-untyped-def]
    graph, topology = load_model("lenet"), load_preset("flexflow-p100")
    single = 4 * sum(len(baseline_plan("single_device", graph, topology)[op.name].devices) for op in graph.ops)
    bound(single * limits.BYTES_PER_TASK + 10_000)
    [row] = compare_methods(graph, topology, ["single_device"], cost_model=CostModel())  # not a cached reference
    assert row.result.makespan_s > 0 and np.isnan(row.dp_makespan_s) and row.reference_makespans_s == {}


def test_plan_prints_the_refusals_and_the_methods_that_ran(bound, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    graph, topology = load_model("lenet"), load_preset("flexflow-p100")
    single = 4 * sum(len(baseline_plan("single_device", graph, topology)[op.name].devices) for op in graph.ops)
    bound(single * limits.BYTES_PER_TASK + 10_000)
    args = ["plan", "--model", "lenet", "--topology", "flexflow-p100", "--out-dir", str(tmp_path)]
    assert main([*args, "--methods", "single,expert", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"] == "single_device"
    rows = {r["method"]: r for r in out["methods"]}
    assert rows["single_device"]["status"] == "ok"
    assert rows["expert"]["status"] == "error"
    assert rows["expert"]["note"].startswith("refused: simulating plan 'expert' of lenet")
    assert main([*args, "--methods", "expert"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: every method refused lenet on flexflow-p100: expert: refused: simulating plan")


# -------------------------------------------------------------------------------------------- FT
def test_ft_refuses_more_devices_than_its_limit_before_any_work() -> None:
    big = load_preset("dgx-h100-x384")
    graph = load_model("lenet")
    with pytest.raises(ValueError, match=r"^FT over 3,072 devices of 'dgx-h100-x384': its cost graph grows as the"):
        run_ft(graph, big)
    assert network(big).sources_built == 0  # no route was built


def test_frontier_on_3072_gpus_is_one_error_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["frontier", "--model", "lenet", "--topology", "dgx-h100-x384"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: all 3,072 devices of 'dgx-h100-x384': FT's cost graph grows as the square of the device count (it "
        "prices every layout change over every pair of devices), 36x the work of 512 devices here; frontier runs on "
        "at most 512 devices: pass --devices 512 (the fastest) or fewer"
    ]
    assert main(["frontier", "--model", "lenet", "--topology", "dgx-h100-x384", "--devices", "1024"]) == 2
    assert capsys.readouterr().err.startswith("error: --devices 1024: FT's cost graph grows")
    argv = ["frontier", "--model", "lenet", "--topology", "dgx-h100-x384", "--mode", "profiling"]
    assert main([*argv, "--device-counts", "8,2048"]) == 2
    assert capsys.readouterr().err.startswith("error: --device-counts [2048]: FT runs on at most 512 devices")


def test_ft_device_sets_stop_at_the_limit_on_a_large_cluster() -> None:
    big = load_preset("dgx-h100-x384")
    assert default_device_counts(3072, FT_MAX_DEVICES) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert default_device_counts(3072) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072]
    assert default_device_counts(100, FT_MAX_DEVICES) == [1, 2, 4, 8, 16, 32, 64, 100]
    sets = candidate_device_sets(big)
    assert max(s.num_devices for s in sets) == FT_MAX_DEVICES
    assert [s.num_devices for s in candidate_device_sets(load_preset("tag-testbed"))][:5] == [1, 2, 4, 8, 16]


def test_ft_reports_progress_while_pricing_layout_changes() -> None:
    graph, topology = load_model("lenet"), load_preset("trinity")
    reports: list[tuple[int, int]] = []
    run_ft(graph, topology, max_configs=4, progress=lambda done, total: reports.append((done, total)))
    pricing = [r for r in reports if r[1] == len(graph.tensors)]
    assert pricing[0] == (1, len(graph.tensors)) and pricing[-1] == (len(graph.tensors), len(graph.tensors))
    assert reports[-1] == (graph.num_ops, graph.num_ops)


def test_an_mcmc_proposal_over_the_memory_bound_is_rejected_and_the_search_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from placement_rl import zoo
    from placement_rl.search import mcmc
    from placement_rl.sim.delta import DeltaSimulator
    from placement_rl.sim.limits import SimulationTooLarge
    from placement_rl.topology import load_preset

    calls = [0]
    propose, propose_many = DeltaSimulator.propose, DeltaSimulator.propose_many

    def every_third(original: Any) -> Any:
        def wrapped(self: DeltaSimulator, *args: Any, **kwargs: Any) -> float:
            calls[0] += 1
            if calls[0] % 3 == 0:  # as a proposal whose task graph would not fit in memory
                raise SimulationTooLarge("too large", None, 1)  # type: ignore[arg-type]
            return original(self, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(DeltaSimulator, "propose", every_third(propose))
    monkeypatch.setattr(DeltaSimulator, "propose_many", every_third(propose_many))
    graph, topology = zoo.load("lenet"), load_preset("trinity")
    found = mcmc(graph, topology, budget=60, seed=0, initial=["data_parallel"])
    assert found.proposals >= calls[0] and found.stats["too_large"] == calls[0] // 3 > 0  # counted, not raised
    assert found.result.makespan_s <= found.initial_costs_s["data_parallel"]

"""Chrome trace and Gantt PNG of a hand-built simulation result."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from placement_rl.sim import trace
from placement_rl.sim.result import TASK_KINDS, SimResult, TaskTable

GIB = 1 << 30
DEVICES = ("m0/gpu0", "m0/gpu1")
LINK_LANE = "link m0/gpu0 -> m0/gpu1"
OPS = ("conv1", "fc")

# (kind, op, lane, start_s, end_s, bytes, critical)
TASKS = [
    ("forward", "conv1", 0, 0.000, 0.002, 0.0, True),
    ("transfer", "conv1", 2, 0.002, 0.003, 4e6, True),
    ("forward", "fc", 0, 0.002, 0.0025, 0.0, False),
    ("forward", "fc", 1, 0.003, 0.005, 0.0, True),
    ("backward", "fc", 1, 0.005, 0.008, 0.0, True),
    ("gradient_transfer", "fc", 2, 0.008, 0.009, 4e6, True),
    ("backward", "conv1", 0, 0.009, 0.012, 0.0, True),
    ("all_reduce", "conv1", 2, 0.012, 0.012, 0.0, False),  # zero duration: left out of the trace
]
MAKESPAN_S = 0.012


def _result(
    tasks: list[tuple[str, str, int, float, float, float, bool]] = TASKS, makespan_s: float = MAKESPAN_S
) -> SimResult:
    lanes = (*DEVICES, LINK_LANE)
    table = TaskTable(
        kind=np.array([TASK_KINDS.index(t[0]) for t in tasks], dtype=np.int8),
        op=np.array([OPS.index(t[1]) for t in tasks], dtype=np.int32),
        lane=np.array([t[2] for t in tasks], dtype=np.int32),
        start_s=np.array([t[3] for t in tasks], dtype=np.float64),
        end_s=np.array([t[4] for t in tasks], dtype=np.float64),
        num_bytes=np.array([t[5] for t in tasks], dtype=np.float64),
        lanes=lanes,
    )
    critical = np.array([i for i, t in enumerate(tasks) if t[6]], dtype=np.int64)
    busy = np.array([0.0055, 0.005])
    return SimResult(
        makespan_s=makespan_s,
        device_names=DEVICES,
        busy_s=busy,
        idle_s=makespan_s - busy,
        peak_memory_bytes=np.array([3 * GIB, 20 * GIB], dtype=np.int64),
        memory_capacity_bytes=np.array([16 * GIB, 16 * GIB], dtype=np.int64),
        oom=True,
        oom_devices=("m0/gpu1",),
        comm_bytes=8e6,
        comm_time_s=0.002,
        link_names=("m0/gpu0 <-> m0/gpu1",),
        link_bytes=np.array([8e6]),
        link_busy_s=np.array([0.001]),
        op_names=OPS,
        op_start_s=np.array([0.0, 0.002]),
        op_forward_end_s=np.array([0.002, 0.005]),
        op_backward_start_s=np.array([0.009, 0.005]),
        op_end_s=np.array([0.012, 0.008]),
        critical_tasks=critical,
        tasks=table,
    )


def _x_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def _meta(doc: dict, name: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == name]


# ---------------------------------------------------------------------------------------------- chrome trace


def test_trace_is_strict_json() -> None:
    doc = trace.chrome_trace(_result(), title="tiny")
    text = json.dumps(doc, allow_nan=False)
    back = json.loads(text)
    assert back == doc
    assert back["displayTimeUnit"] == "ms"
    assert back["metadata"]["title"] == "tiny"
    assert isinstance(back["traceEvents"], list)


def test_non_finite_times_are_dropped_and_counted() -> None:
    tasks = [
        *TASKS,
        ("ps_push", "fc", 2, 0.009, float("inf"), 1e6, False),
        ("ps_pull", "fc", 2, float("nan"), 0.01, 1e6, False),
    ]
    doc = trace.chrome_trace(_result(tasks, makespan_s=float("inf")))
    json.dumps(doc, allow_nan=False)  # raises on NaN / inf
    assert doc["metadata"]["makespan_s"] is None
    assert doc["metadata"]["num_nonfinite_tasks"] == 2
    assert {e["cat"] for e in _x_events(doc)}.isdisjoint({"ps_push", "ps_pull"})


def test_every_positive_task_is_one_complete_event() -> None:
    doc = trace.chrome_trace(_result())
    events = _x_events(doc)
    positive = [t for t in TASKS if t[4] > t[3]]
    assert len(events) == len(positive) == 7
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in _meta(doc, "thread_name")}
    lanes = (*DEVICES, LINK_LANE)
    for kind, op, lane, start_s, end_s, num_bytes, critical in positive:
        matches = [
            e
            for e in events
            if e["cat"] == kind and e["args"]["op"] == op and e["tid"] == lane and e["args"]["start_s"] == start_s
        ]
        assert len(matches) == 1, (kind, op, lane, start_s)
        e = matches[0]
        assert e["name"] == f"{op} [{kind}]"
        assert e["ts"] == pytest.approx(start_s * 1e6, abs=1e-6)
        assert e["dur"] == pytest.approx((end_s - start_s) * 1e6, abs=1e-6)
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
        assert e["args"]["kind"] == kind
        assert e["args"]["end_s"] == end_s
        assert e["args"]["critical"] is critical
        assert thread_names[(e["pid"], e["tid"])] == lanes[lane]
        if kind in ("forward", "backward"):
            assert "bytes" not in e["args"]
        else:
            assert e["args"]["bytes"] == num_bytes


def test_zero_duration_tasks_are_left_out_but_counted() -> None:
    doc = trace.chrome_trace(_result())
    assert all(e["dur"] > 0 for e in _x_events(doc))
    assert not [e for e in _x_events(doc) if e["cat"] == "all_reduce"]
    assert doc["metadata"]["num_zero_duration_tasks"] == 1
    assert doc["metadata"]["num_tasks"] == len(TASKS)
    assert doc["metadata"]["num_events"] == len(TASKS) - 1


def test_processes_group_devices_by_machine_and_links_into_network() -> None:
    doc = trace.chrome_trace(_result())
    processes = {e["pid"]: e["args"]["name"] for e in _meta(doc, "process_name")}
    assert sorted(processes.values()) == ["m0", "network"]
    pid_of = {name: pid for pid, name in processes.items()}
    threads = {e["tid"]: e for e in _meta(doc, "thread_name")}
    assert {tid: e["args"]["name"] for tid, e in threads.items()} == {0: "m0/gpu0", 1: "m0/gpu1", 2: LINK_LANE}
    assert threads[0]["pid"] == threads[1]["pid"] == pid_of["m0"]
    assert threads[2]["pid"] == pid_of["network"]
    sort_index = {e["tid"]: e["args"]["sort_index"] for e in _meta(doc, "thread_sort_index")}
    assert sort_index == {0: 0, 1: 1, 2: 2}
    for e in _x_events(doc):  # each event lives in its lane's process
        assert e["pid"] == threads[e["tid"]]["pid"]


def test_devices_without_machine_prefix_share_one_process() -> None:
    r = _result()
    lanes = ("gpu0", "gpu1", "link gpu0 -> gpu1")
    r = dataclasses.replace(
        r,
        device_names=lanes[:2],
        oom_devices=("gpu1",),
        tasks=dataclasses.replace(r.tasks, lanes=lanes),
        critical_tasks=np.zeros(0, dtype=np.int64),
    )
    doc = trace.chrome_trace(r)
    assert sorted(e["args"]["name"] for e in _meta(doc, "process_name")) == ["devices", "network"]
    assert not any(e["args"]["critical"] for e in _x_events(doc))


def test_metadata_reports_memory_and_critical_path() -> None:
    meta = trace.chrome_trace(_result())["metadata"]
    assert meta["oom"] is True
    assert meta["oom_devices"] == ["m0/gpu1"]
    assert [d["oom"] for d in meta["devices"]] == [False, True]
    assert meta["devices"][1]["peak_memory_bytes"] == 20 * GIB
    assert meta["num_critical_tasks"] == meta["critical_path_length"] == sum(t[6] for t in TASKS)
    assert meta["makespan_s"] == MAKESPAN_S


def test_out_of_range_critical_ids_are_ignored() -> None:
    r = dataclasses.replace(_result(), critical_tasks=np.array([0, -1, len(TASKS), 3], dtype=np.int64))
    doc = trace.chrome_trace(r)
    assert sorted(e["args"]["start_s"] for e in _x_events(doc) if e["args"]["critical"]) == [0.0, 0.003]
    assert doc["metadata"]["num_critical_tasks"] == 2


def test_write_chrome_trace_writes_a_loadable_file(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "trace.json"
    trace.write_chrome_trace(_result(), path, title="written")
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc == json.loads(json.dumps(trace.chrome_trace(_result(), title="written")))
    assert len(_x_events(doc)) == 7


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_write_chrome_trace_streams_the_same_document_a_chunk_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(trace, "TRACE_CHUNK_TASKS", chunk)  # 7 events: one, several or a partial chunk
    path = tmp_path / "trace.json"
    trace.write_chrome_trace(_result(), path)
    assert json.loads(path.read_text(encoding="utf-8")) == json.loads(json.dumps(trace.chrome_trace(_result())))


def test_importing_trace_pulls_in_neither_matplotlib_nor_ray_nor_torch(repo_root: Path) -> None:
    code = (
        "import sys, placement_rl.sim.trace; "
        "bad = [m for m in ('matplotlib', 'ray', 'torch') if m in sys.modules]; "
        "assert not bad, bad"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------------------------- gantt


def test_gantt_png_writes_a_png(tmp_path: Path) -> None:
    import matplotlib.image

    had_pyplot = "matplotlib.pyplot" in sys.modules
    path = tmp_path / "out" / "gantt.png"
    trace.gantt_png(_result(), path, title="tiny")
    assert path.read_bytes()[:4] == b"\x89PNG"
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100
    if not had_pyplot:
        assert "matplotlib.pyplot" not in sys.modules


def test_lane_labels_mark_the_oom_device() -> None:
    labels = trace._lane_labels(_result())
    assert [lab.lane for lab in labels] == [0, 1, 2]
    assert labels[0].text == "m0/gpu0" and not labels[0].oom
    assert labels[1].oom and "OOM" in labels[1].text and labels[1].text.startswith("m0/gpu1")
    assert labels[2].text == LINK_LANE and not labels[2].oom and labels[2].memory_text == ""
    assert labels[0].memory_text.startswith("3.00 / 16.00 GiB")
    assert labels[1].memory_text.startswith("20.00 / 16.00 GiB")


def test_rows_skip_links_with_only_zero_duration_tasks_but_keep_oom_devices() -> None:
    tasks = [t for t in TASKS if t[2] == 0] + [("all_reduce", "conv1", 2, 0.012, 0.012, 0.0, False)]
    labels = trace._lane_labels(_result(tasks))
    assert [lab.lane for lab in labels] == [0, 1]  # gpu1 has no tasks but is OOM; the link row is empty
    assert labels[1].oom


def test_oom_detected_from_memory_even_if_not_listed() -> None:
    r = dataclasses.replace(_result(), oom_devices=())
    assert [lab.oom for lab in trace._lane_labels(r)] == [False, True, False]
    r = dataclasses.replace(
        _result(), oom=False, oom_devices=(), peak_memory_bytes=np.array([GIB, GIB], dtype=np.int64)
    )
    assert not any(lab.oom for lab in trace._lane_labels(r))


def test_gantt_figure_colours_oom_tick_red_and_marks_the_critical_path() -> None:
    from matplotlib.colors import to_rgba

    fig = trace._gantt_figure(_result())
    ax = fig.axes[0]
    ticks = ax.get_yticklabels()
    assert [t.get_text() for t in ticks] == [lab.text for lab in trace._lane_labels(_result())]
    assert to_rgba(ticks[1].get_color()) == to_rgba("red")
    assert to_rgba(ticks[0].get_color()) != to_rgba("red")
    assert "ms" in ax.get_xlabel()
    # the first row (lane 0) is on top
    assert ax.get_ylim()[0] > ax.get_ylim()[1]
    # critical tasks get a black strip along the top of their bar (no outline hides the bar's colour)
    strips = [
        c for c in ax.collections if len(c.get_facecolors()) and np.allclose(c.get_facecolors()[0], to_rgba("black"))
    ]
    assert sum(len(c.get_paths()) for c in strips) == sum(t[6] for t in TASKS)
    for c in strips:
        for p in c.get_paths():
            assert p.get_extents().height == pytest.approx(0.8 * trace._CRITICAL_STRIP)
    assert not [c for c in ax.collections if len(c.get_facecolors()) == 0]  # no outline-only bars
    legend_texts = {t.get_text() for t in fig.legends[0].get_texts()}
    assert {"forward", "backward", "transfer", "gradient_transfer", "critical path (black strip)"} <= legend_texts
    assert any(t.startswith("makespan") for t in legend_texts)


def test_gantt_draws_only_the_longest_tasks_beyond_max_tasks() -> None:
    from matplotlib.colors import to_rgba

    fig = trace._gantt_figure(_result(), max_tasks=2)
    ax = fig.axes[0]
    assert "showing the 2 longest of 8 tasks" in ax.get_title()
    black = to_rgba("black")
    filled = [
        c
        for c in ax.collections
        if len(c.get_facecolors()) and c.get_facecolors()[0, 3] > 0 and not np.allclose(c.get_facecolors()[0], black)
    ]  # the task bars, not the critical-path strips on them
    widths = sorted(float(p.get_extents().width) for c in filled for p in c.get_paths())
    assert len(widths) == 2
    assert widths == pytest.approx([3.0, 3.0])  # the two 3 ms backward tasks
    # every lane keeps its row
    assert len(ax.get_yticklabels()) == 3


def test_gantt_handles_an_empty_task_table(tmp_path: Path) -> None:
    r = _result([])
    path = tmp_path / "empty.png"
    trace.gantt_png(r, path)
    assert path.read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------ link directions (flows)


def _fan_out_result(network: str = "flow") -> SimResult:
    """A simulated plan whose three transfers leave g0 through one link direction at once."""
    from placement_rl.graph import Op, OpGraph, ParallelDim, Tensor
    from placement_rl.plan import OpConfig, Plan
    from placement_rl.sim import CostModel, simulate
    from placement_rl.topology import Device, DeviceTopology, Link

    names = ["g0", "g1", "g2", "g3"]
    topo = DeviceTopology(
        "star",
        [Device(n, "test-gpu", "m0", 1e12, 2**34, 1e12) for n in names],
        [Link(n, "sw", 10e9, 1e-5, "pcie") for n in names],
        ["sw"],
    )
    dims = (ParallelDim("sample", "sample", 0, 8),)
    ops = [Op(n, "relu", ((8, 16),), parallel_dims=dims) for n in ("src", "c1", "c2", "c3")]
    graph = OpGraph("fan", ops, [Tensor("src", f"c{k}", (8, 16), 10**8) for k in (1, 2, 3)])
    plan = Plan("fan", {"src": OpConfig.make("g0"), **{f"c{k}": OpConfig.make(f"g{k}") for k in (1, 2, 3)}})
    return simulate(graph, topo, plan, CostModel(network=network))


def test_overlapping_flows_get_their_own_threads_and_every_direction_a_utilization_track() -> None:
    r = _fan_out_result()
    doc = trace.chrome_trace(r)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in _meta(doc, "thread_name")}
    transfers = [e for e in _x_events(doc) if e["cat"] == "transfer"]
    assert len(transfers) == 3  # all three at once, so on three threads of g0's outgoing lane
    assert sorted(threads[(e["pid"], e["tid"])] for e in transfers) == [
        "link g0 -> sw",
        "link g0 -> sw #2",
        "link g0 -> sw #3",
    ]
    for (pid, tid), _ in threads.items():  # no two slices overlap on a thread
        mine = sorted((e["ts"], e["ts"] + e["dur"]) for e in _x_events(doc) if (e["pid"], e["tid"]) == (pid, tid))
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(mine))
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    names = {e["name"] for e in counters}
    # forward: g0 -> sw and sw -> g1..g3; backward: the gradients come back
    assert {"link g0 -> sw", "link sw -> g0", "link g1 -> sw", "link sw -> g1"} <= names
    up = [e["args"]["utilization"] for e in counters if e["name"] == "link g0 -> sw"]
    assert up[0] == 0.0 and max(up) == pytest.approx(1.0) and up[-1] == 0.0
    assert all(0.0 <= u <= 1.0 + 1e-9 for u in (e["args"]["utilization"] for e in counters))
    summary = {d["name"]: d for d in doc["metadata"]["link_directions"]}
    assert summary["link g0 -> sw"]["bytes"] == 3e8
    assert summary["link g0 -> sw"]["utilization"] == pytest.approx(3e8 / (10e9 * r.makespan_s))
    assert doc["metadata"]["network"] == "flow"
    json.dumps(doc, allow_nan=False)


def test_gantt_rows_show_each_link_directions_utilization(tmp_path: Path) -> None:
    r = _fan_out_result()
    labels = trace._lane_labels(r)
    links = {lab.text: lab.memory_text for lab in labels if lab.text.startswith("link")}
    assert len(links) == 8  # every direction of the four links carried bytes
    share = 3e8 / (10e9 * r.makespan_s)
    assert links["link g0 -> sw"] == f"{share:.0%} of 10 GB/s"
    fig = trace._gantt_figure(r)
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert "link utilization" in legend
    trace.gantt_png(r, tmp_path / "fan.png")
    assert (tmp_path / "fan.png").read_bytes()[:4] == b"\x89PNG"


def test_circuit_traces_keep_one_thread_per_lane() -> None:
    doc = trace.chrome_trace(_fan_out_result("circuit"))
    assert not [e for e in _meta(doc, "thread_name") if "#" in e["args"]["name"]]  # a circuit never overlaps


def test_idle_devices_are_empty_rows() -> None:
    from placement_rl.graph import Op, OpGraph
    from placement_rl.plan import OpConfig, Plan
    from placement_rl.sim import simulate
    from placement_rl.topology import load_preset

    topo = load_preset("trinity")  # 4 GPUs; the plan uses one
    graph = OpGraph("one", [Op("fc", "linear", ((8, 8),), forward_flops=1e6, backward_flops=2e6)], [])
    plan = Plan("one", {"fc": OpConfig.make(topo.devices[0].name)})
    result = simulate(graph, topo, plan)
    labels = trace._lane_labels(result)
    device_rows = [lab.text for lab in labels if lab.lane < topo.num_devices]
    assert device_rows == [topo.devices[0].name] + [f"{d.name} (idle)" for d in topo.devices[1:]]
    ticks = [t.get_text() for t in trace._gantt_figure(result).axes[0].get_yticklabels()]
    assert ticks[: topo.num_devices] == device_rows

"""The flow scheduler's incremental max-min rates (``kernels.schedule_flows``, ``kernels.drain``) against
a reference that recomputes the max-min rates of every flow in flight at every event.

The kernel recomputes rates only for the components (flows linked through shared link directions)
that the flows starting or ending touch; the reference, in plain Python, refills all flows each time
with :func:`placement_rl.sim.network.max_min_rates`. Instances mix groups of flows on disjoint
directions, flows that bridge two groups for a while (merging their components, then splitting them
again), caps and multi-phase tasks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from placement_rl.sim import kernels
from placement_rl.sim.network import drain_time_s, max_min_rates

#: One flow: (bytes, directions, cap in bytes/s).
Flow = tuple[float, list[int], float]
#: One flow task: (release time, phases of (latency, flows)).
FlowTask = tuple[float, list[tuple[float, list[Flow]]]]


def _read_only(capacity: np.ndarray) -> np.ndarray:
    """A read-only copy, as the simulator passes its network's capacities: the kernels are then called
    with the simulator's own argument types and reuse its compiled code instead of compiling another."""
    out = capacity.copy()
    out.setflags(write=False)
    return out


def _reference_ends(tasks: list[FlowTask], capacity: np.ndarray) -> list[float]:
    """End times of the flow tasks, all flows in flight re-rated (max-min, from scratch) at every event."""
    ends = [math.nan] * len(tasks)
    starts = [(release, i, 0) for i, (release, _) in enumerate(tasks)]
    remaining: dict[tuple[int, int, int], float] = {}
    left: dict[tuple[int, int], int] = {}
    now = 0.0
    while starts or remaining:
        keys = list(remaining)
        flows = [tasks[i][1][p][1][k] for i, p, k in keys]
        rates = max_min_rates([f[1] for f in flows], capacity, [f[2] for f in flows]) if keys else np.zeros(0)
        t = min((s[0] for s in starts), default=math.inf)
        t = min([t] + [now + remaining[key] / r for key, r in zip(keys, rates, strict=True)])
        for key, r in zip(keys, rates, strict=True):
            remaining[key] -= r * (t - now)
        now = t
        for key, flow in zip(keys, flows, strict=True):
            if remaining[key] > 1e-12 * flow[0]:
                continue
            del remaining[key]
            i, p, _ = key
            left[i, p] -= 1
            if left[i, p] == 0:
                latency = tasks[i][1][p][0]
                if p + 1 < len(tasks[i][1]):
                    starts.append((now + latency, i, p + 1))
                else:
                    ends[i] = now + latency
        for s in [s for s in starts if s[0] <= now]:
            starts.remove(s)
            _, i, p = s
            phase_flows = tasks[i][1][p][1]
            left[i, p] = len(phase_flows)
            for k, flow in enumerate(phase_flows):
                remaining[i, p, k] = flow[0]
    return ends


def _schedule(
    tasks: list[FlowTask],
    capacity: np.ndarray,
    record: bool = False,
    limit: float = math.inf,
    timeline_capacity: int = 1000,
) -> tuple[np.ndarray, ...]:
    """``kernels.schedule_flows`` on tasks ``0..m-1`` (compute, one device each, lasting the release
    time) feeding flow tasks ``m..2m-1`` (no resource)."""
    m = len(tasks)
    n = 2 * m
    duration = np.array([release for release, _ in tasks] + [0.0] * m)
    res_ptr = np.concatenate((np.arange(m + 1), np.full(m, m))).astype(np.int64)
    res = np.arange(m, dtype=np.int64)
    succ_ptr = np.concatenate((np.arange(m + 1), np.full(m, m))).astype(np.int64)
    succ = np.arange(m, n, dtype=np.int64)
    indegree = np.array([0] * m + [1] * m, dtype=np.int64)
    phase_ptr, latency, flow_ptr, nbytes, caps, dir_ptr, dirs = [0] * (m + 1), [], [0], [], [], [0], []
    for _, phases in tasks:
        phase_ptr.append(phase_ptr[-1] + len(phases))
        for lat, flows in phases:
            latency.append(lat)
            flow_ptr.append(flow_ptr[-1] + len(flows))
            for size, route, cap in flows:
                nbytes.append(size)
                caps.append(cap)
                dirs.extend(route)
                dir_ptr.append(len(dirs))
    rest = shortest = np.zeros(0)
    args = (
        np.array(phase_ptr, dtype=np.int64),
        np.array(latency, dtype=np.float64),
        np.array(flow_ptr, dtype=np.int64),
        np.array(nbytes, dtype=np.float64),
        np.array(caps, dtype=np.float64),
        np.array(dir_ptr, dtype=np.int64),
        np.array(dirs, dtype=np.int64),
        _read_only(capacity),
    )
    if limit < math.inf:
        rest, shortest = kernels.rest_bounds(duration, succ_ptr, succ, indegree, *args)
    zeros = np.zeros(n)
    return kernels.schedule_flows(
        duration, res_ptr, res, succ_ptr, succ, indegree, m, *args,
        np.zeros(n, np.bool_), zeros, zeros, zeros, record, limit, rest, shortest, timeline_capacity,
    )  # fmt: skip


def _two_groups() -> tuple[list[FlowTask], np.ndarray]:
    """Group A on directions 0-1, group B on 2-3; a bridge over 1 and 2 joins them from 0.3 s to its end;
    B's flows start and end while A's long flow is in flight; one capped flow; a two-phase task."""
    capacity = np.array([10.0, 4.0, 6.0, 8.0, 5.0])
    inf = math.inf
    tasks: list[FlowTask] = [
        (0.0, [(0.0, [(20.0, [0], inf), (6.0, [0, 1], inf)])]),  # A: a long flow, and one sharing 0 with 1
        (0.1, [(0.0, [(3.0, [2], inf)]), (0.05, [(4.0, [2, 3], inf), (2.0, [3], 1.5)])]),  # B: two phases, a cap
        (0.2, [(0.0, [(5.0, [3], inf)])]),  # B
        (0.3, [(0.0, [(2.0, [1, 2], inf)])]),  # the bridge: A and B become one component
        (0.7, [(0.0, [(1.0, [2, 3], inf), (1.0, [4], inf)])]),  # B again, and a lone direction
        (1.5, [(0.01, [(4.0, [1], inf)])]),  # A, after the bridge has ended
    ]
    return tasks, capacity


def _random_instance(seed: int) -> tuple[list[FlowTask], np.ndarray]:
    """Tasks on two clusters of directions (0-3 and 4-7); some flows cross both, a few are capped."""
    rng = np.random.default_rng(seed)
    capacity = rng.uniform(1.0, 10.0, size=8)
    tasks: list[FlowTask] = []
    for _ in range(int(rng.integers(4, 14))):
        phases = []
        for _ in range(int(rng.integers(1, 4))):
            flows: list[Flow] = []
            for _ in range(int(rng.integers(1, 4))):
                base = 4 * int(rng.integers(2))
                route = sorted({base + int(d) for d in rng.integers(0, 4, size=int(rng.integers(1, 3)))})
                if rng.random() < 0.15:  # a flow bridging the clusters
                    route.append(int(rng.integers(4, 8)) if base == 0 else int(rng.integers(0, 4)))
                cap = float(rng.uniform(0.5, 3.0)) if rng.random() < 0.2 else math.inf
                flows.append((float(rng.uniform(0.5, 5.0)), route, cap))
            phases.append((float(rng.choice([0.0, 0.02])), flows))
        tasks.append((float(rng.choice([0.0, rng.uniform(0.0, 2.0)])), phases))
    return tasks, capacity


def _check(tasks: list[FlowTask], capacity: np.ndarray) -> None:
    m = len(tasks)
    out = _schedule(tasks, capacity)
    assert not out[8]
    assert out[1][m:] == pytest.approx(_reference_ends(tasks, capacity), rel=1e-9)
    recorded = _schedule(tasks, capacity, record=True)
    for a, b in zip(out[:5], recorded[:5], strict=True):
        assert np.array_equal(a, b)
    entries = recorded[9]
    assert 0 < entries == len(recorded[5]) < 1000
    # a timeline capacity below the count: the same schedule, the first entries, and the full count
    short = _schedule(tasks, capacity, record=True, timeline_capacity=entries // 2)
    assert short[9] == entries
    for a, b in zip(short[:5], out[:5], strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(short[5:8], recorded[5:8], strict=True):
        assert np.array_equal(a, b[: entries // 2])
    # cut off: either certainly above the limit, or the very same schedule
    makespan = float(out[1].max())
    for factor in (0.5, 0.9, 0.999, 1.0 + 1e-6):
        bounded = _schedule(tasks, capacity, limit=makespan * factor)
        if bounded[8]:
            assert factor < 1.0
        else:
            assert np.array_equal(bounded[1], out[1])


def test_flows_on_disjoint_links_and_a_bridge_match_full_recomputation() -> None:
    tasks, capacity = _two_groups()
    _check(tasks, capacity)
    # the bridge slows B's first flow (direction 2) while it is in flight: A's and B's shares interact
    m = len(tasks)
    without_bridge = _schedule(tasks[:3] + tasks[4:], capacity)
    assert _schedule(tasks, capacity)[1][m + 1] > without_bridge[1][(m - 1) + 1] + 0.01


@pytest.mark.parametrize("seed", range(25))
def test_random_flow_tasks_match_full_recomputation(seed: int) -> None:
    tasks, capacity = _random_instance(seed)
    _check(tasks, capacity)


@pytest.mark.parametrize("seed", range(10))
def test_drain_matches_full_recomputation(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    capacity = rng.uniform(1.0, 10.0, size=8)
    sizes = rng.uniform(0.5, 5.0, size=int(rng.integers(2, 16)))
    routes = [sorted({4 * int(rng.integers(2)) + int(d) for d in rng.integers(0, 4, size=2)}) for _ in sizes]
    ptr = np.concatenate(([0], np.cumsum([len(r) for r in routes]))).astype(np.int64)
    dirs = np.array([d for r in routes for d in r], dtype=np.int64)
    expected = drain_time_s(sizes, routes, capacity)
    assert kernels.drain(sizes, ptr, dirs, _read_only(capacity)) == pytest.approx(expected, rel=1e-9)

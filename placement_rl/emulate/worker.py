"""One emulated device: a ``torch.distributed`` gloo process that times the patterns of a run.

Run as a script inside the device's network namespace (:class:`~placement_rl.emulate.cluster.EmulatedCluster`
starts it)::

    python worker.py SPEC.json RANK PARENT_PID

It imports only the standard library and torch: importing placement_rl would cost every worker
seconds of start-up. ``SPEC.json`` (written by :func:`placement_rl.emulate.run.emulate`) holds the
rendezvous (``master_addr``, ``master_port``, ``world_size``, ``ifname``), the run's ``warmup`` and
``repeats``, ``start_margin_s``, ``max_late_s``, ``timeout_s``, ``out_dir``, an optional injected ``fail`` (``{"rank",
"pattern"}``, for testing cleanup) and the ``patterns`` (:meth:`Pattern.worker_spec`).

Each run of a pattern starts at one instant on every rank: after a barrier, the ranks take the
latest of their clocks (``CLOCK_MONOTONIC``, shared by every process on this machine) plus
``start_margin_s`` and sleep until then. A rank's result is when it finished its own part (its last
step computed, every message to it received; sends count at their receiver); the pattern's time is
the latest rank's. A run in which some rank woke up more than ``max_late_s`` after the start is
run again (at most ``repeats`` times per pattern): the machine stalled, which says nothing about the
network. The worker writes ``out_dir/rank<RANK>.json``: ``{"rank", "realtime", "patterns": [{"name",
"runs": [{"end_s", "late_s"}, ...], "redone"}]}`` with the runs after the warm-up, ``late_s`` how
late the rank woke up.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Get SIGKILL when the coordinator dies (Linux), so that no worker outlives a killed run."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the coordinator died before prctl took effect
        os._exit(3)


def main(argv: list[str]) -> int:
    spec_path, rank, parent = argv[1], int(argv[2]), int(argv[3])
    _die_with_parent(parent)
    spec = json.loads(Path(spec_path).read_text())
    os.environ["GLOO_SOCKET_IFNAME"] = spec["ifname"]

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{spec['master_addr']}:{spec['master_port']}",
        rank=rank,
        world_size=spec["world_size"],
        timeout=datetime.timedelta(seconds=spec["timeout_s"]),
    )
    realtime = _realtime(spec.get("realtime_priority", 0))
    fail = spec.get("fail") or {}
    results = []
    for pattern in spec["patterns"]:
        if fail.get("rank") == rank and fail.get("pattern") == pattern["name"]:
            raise RuntimeError(f"injected failure on rank {rank} before pattern {pattern['name']!r}")
        runs: list[dict[str, float]] = []
        done = redone = 0
        while len(runs) < spec["repeats"]:
            start = _common_start(dist, torch, spec["start_margin_s"])
            late = time.perf_counter() - start
            if pattern["kind"] == "all_reduce":
                end = _all_reduce(dist, torch, pattern, rank)
            else:
                end = _dag(dist, torch, pattern, rank)
            done += 1
            worst = torch.tensor([late], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # every rank decides alike
            if done <= spec["warmup"]:
                continue
            if float(worst.item()) > spec["max_late_s"] and redone < spec["repeats"]:
                redone += 1  # some rank started late: the machine stalled, not the network
                continue
            runs.append({"end_s": end - start, "late_s": late})
        results.append({"name": pattern["name"], "runs": runs, "redone": redone})
    dist.barrier()
    dist.destroy_process_group()
    out = Path(spec["out_dir"]) / f"rank{rank}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rank": rank, "realtime": realtime, "patterns": results}))
    tmp.replace(out)
    return 0


def _realtime(priority: int) -> bool:
    """Move every thread of this process (gloo's included, all started by now) to ``SCHED_RR`` at
    ``priority``; 0 leaves them as they are. Where other work keeps the CPUs busy, a worker's wake-ups
    (after a compute sleep, on a message) would otherwise wait for a time slice, milliseconds that
    would be charged to the network."""
    if priority <= 0:
        return False
    try:
        param = os.sched_param(priority)
        for tid in os.listdir("/proc/self/task"):
            os.sched_setscheduler(int(tid), os.SCHED_RR, param)
    except (OSError, AttributeError):
        return False
    return True


def _common_start(dist: Any, torch: Any, margin_s: float) -> float:
    """One start instant for every rank: the latest clock after a barrier, plus ``margin_s``."""
    dist.barrier()
    now = torch.tensor([time.perf_counter()], dtype=torch.float64)
    dist.all_reduce(now, op=dist.ReduceOp.MAX)
    start = float(now.item()) + margin_s
    delay = start - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    return start


def _all_reduce(dist: Any, torch: Any, pattern: dict[str, Any], rank: int) -> float:
    if rank not in pattern["ranks"]:
        return time.perf_counter()
    if sorted(pattern["ranks"]) != list(range(dist.get_world_size())):
        raise ValueError(f"pattern {pattern['name']!r}: an all-reduce over every rank in order is supported")
    data = torch.ones(pattern["num_bytes"] // 4, dtype=torch.float32)
    dist.all_reduce(data)
    return time.perf_counter()


def _dag(dist: Any, torch: Any, pattern: dict[str, Any], rank: int) -> float:
    """Post every receive of this rank, run its steps in order, send after each; the end of its part."""
    steps, messages = pattern["steps"], pattern["messages"]
    incoming: dict[int, list[int]] = {}
    outgoing: dict[int, list[int]] = {}
    receives: dict[int, Any] = {}
    buffers: dict[int, Any] = {}
    for m, message in enumerate(messages):
        src, dst = message["src"], message["dst"]
        if steps[dst]["rank"] == rank:
            incoming.setdefault(dst, []).append(m)
            buffers[m] = torch.empty(message["num_bytes"] // 4, dtype=torch.float32)
            receives[m] = dist.irecv(buffers[m], src=steps[src]["rank"], tag=m + 1)
        if steps[src]["rank"] == rank:
            outgoing.setdefault(src, []).append(m)
            buffers[m] = torch.zeros(message["num_bytes"] // 4, dtype=torch.float32)
    sends = []
    for i, step in enumerate(steps):
        if step["rank"] != rank:
            continue
        for m in incoming.get(i, ()):
            receives[m].wait()
        if step["compute_s"] > 0:
            time.sleep(step["compute_s"])
        for m in outgoing.get(i, ()):
            sends.append(dist.isend(buffers[m], dst=steps[messages[m]["dst"]]["rank"], tag=m + 1))
    end = time.perf_counter()
    for work in sends:
        work.wait()
    return end


if __name__ == "__main__":
    sys.exit(main(sys.argv))

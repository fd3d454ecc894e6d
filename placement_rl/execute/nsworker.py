"""One worker process started by :class:`~placement_rl.execute.processes.ProcessLauncher`: a plan's rank
or one end of a link measurement, in its own process (inside a network namespace on the emulated cluster).

Run as::

    python -m placement_rl.execute.nsworker SPEC.json RANK PARENT_PID

``SPEC.json`` is written by the launcher itself (never a file a user gave; it is parsed as JSON, nothing
is unpickled). Common keys: ``mode`` (``"program"`` or ``"ping_pong"``), ``world_size``, ``master_addr``,
``master_port``, ``init_method`` (a ``file://`` rendezvous on one machine; ``null``: ``tcp://`` at
``master_addr:master_port``, in the emulated cluster's namespaces), ``ifname`` (the interface gloo uses;
``null`` for the default), ``timeout_s``,
``out_dir`` and ``realtime_priority`` (``SCHED_RR`` priority of the worker's threads, 0 to leave them as
they are: other work on the machine then delays the worker's compute and wake-ups). The worker joins a
gloo group at ``init_method`` and writes ``out_dir/rank<RANK>.json``:

* ``program``: the spec holds the model (``{"spec", "batch_size", "options"}``), the plan, the topology
  and the cost model (:func:`cost_model_to_dict`) as JSON, the run options and ``digest``, the
  :func:`program_digest` of the launcher's lowering. The worker traces the model, lowers the plan again
  (deterministic: the same simulation orders the same instructions), checks the digest, runs
  :func:`~placement_rl.execute.local.worker_main` and writes its :class:`WorkerResult` without the
  parameters (:func:`result_to_dict`).
* ``ping_pong``: ranks 0 and ``peer`` bounce messages of each of ``sizes`` bytes ``repeats`` times (after
  ``warmup`` untimed ones); rank 0 writes ``{"samples": [[bytes, one_way_s], ...]}``, half of each
  round trip. The other ranks only join the group.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from placement_rl.execute.lower import Program
from placement_rl.execute.runtime import Event, IterationResult, WorkerResult
from placement_rl.sim.calibration import Calibration
from placement_rl.sim.cost import CommTable, CostModel, ProfileTable


def program_digest(program: Program) -> str:
    """A hash of a program's devices and every rank's instruction list (kinds and refs): two lowerings
    with the same digest run the same instructions in the same order."""
    body = json.dumps([list(program.devices), [[(i.kind, i.ref) for i in ins] for ins in program.instructions]])
    return hashlib.sha256(body.encode()).hexdigest()


def cost_model_to_dict(cost_model: CostModel) -> dict[str, Any]:
    """The cost model's fields as JSON-ready data (profile and comm table included)."""
    return {
        "efficiency": dict(cost_model.efficiency),
        "default_efficiency": cost_model.default_efficiency,
        "launch_overhead_s": cost_model.launch_overhead_s,
        "optimizer": cost_model.optimizer,
        "precision": cost_model.precision,
        "profile": None if cost_model.profile is None else cost_model.profile.to_dict(),
        "comm_table": None if cost_model.comm_table is None else cost_model.comm_table.to_dict(),
        "network": cost_model.network,
        "bucket_bytes": cost_model.bucket_bytes,
        "execution_mode": cost_model.execution_mode,
        "calibration": None if cost_model.calibration is None else cost_model.calibration.to_dict(),
    }


def cost_model_from_dict(document: dict[str, Any]) -> CostModel:
    """Inverse of :func:`cost_model_to_dict`."""
    fields = dict(document)
    profile, comm = fields.pop("profile"), fields.pop("comm_table")
    calibration = fields.pop("calibration", None)
    return CostModel(
        **fields,
        profile=None if profile is None else ProfileTable.from_dict(profile),
        comm_table=None if comm is None else CommTable.from_dict(comm),
        calibration=None if calibration is None else Calibration.from_dict(calibration),
    )


def result_to_dict(result: WorkerResult) -> dict[str, Any]:
    """A worker's result as JSON-ready data: per iteration its time, loss, sent bytes and events
    (``[kind, ref, start_s, end_s]``); the parameters are left out."""
    return {
        "rank": result.rank,
        "device": result.device,
        "iterations": [
            {
                "time_s": it.time_s,
                "loss": it.loss,
                "sent_bytes": it.sent_bytes,
                "events": [[e.kind, e.ref, e.start_s, e.end_s] for e in it.events],
            }
            for it in result.iterations
        ],
    }


def result_from_dict(document: dict[str, Any]) -> WorkerResult:
    """Inverse of :func:`result_to_dict` (no parameters)."""
    iterations = [
        IterationResult(
            float(it["time_s"]),
            float(it["loss"]),
            [Event(str(k), int(r), float(s), float(e)) for k, r, s, e in it["events"]],
            int(it["sent_bytes"]),
        )
        for it in document["iterations"]
    ]
    return WorkerResult(int(document["rank"]), str(document["device"]), iterations)


def _run_program(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    from placement_rl.execute.local import RunOptions, worker_main
    from placement_rl.execute.lower import lower
    from placement_rl.execute.runtime import ModelSource
    from placement_rl.plan.core import Plan
    from placement_rl.topology import DeviceTopology

    model = spec["model"]
    source = ModelSource(model["spec"], model["batch_size"], tuple((str(k), v) for k, v in model["options"]))
    graph = source.graph()
    topology = DeviceTopology.from_dict(spec["topology"])
    plan = Plan.from_dict(spec["plan"])
    program = lower(graph, topology, plan, cost_model_from_dict(spec["cost_model"]))
    digest = program_digest(program)
    if digest != spec["digest"]:
        raise RuntimeError(
            f"rank {rank}: lowering plan {plan.name!r} here gave other instructions than the launcher's "
            f"(digest {digest[:12]} vs {spec['digest'][:12]}); the lowering is not deterministic"
        )
    result = worker_main(program, graph, source, RunOptions(**spec["run"]), rank, rank)
    return result_to_dict(result)


def _ping_pong(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    peer = int(spec["peer"])
    samples: list[list[float]] = []
    if rank in (0, peer):
        other = peer if rank == 0 else 0
        for size in spec["sizes"]:
            buf = torch.zeros(max(1, int(size) // 4), dtype=torch.float32)
            for k in range(spec["warmup"] + spec["repeats"]):
                start = time.perf_counter()
                if rank == 0:
                    dist.send(buf, other)
                    dist.recv(buf, other)
                else:
                    dist.recv(buf, other)
                    dist.send(buf, other)
                if rank == 0 and k >= spec["warmup"]:
                    samples.append([float(buf.numel() * 4), (time.perf_counter() - start) / 2])
    dist.barrier()
    return {"rank": rank, "samples": samples}


def _all_reduce(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    samples: list[list[float]] = []
    for size in spec["sizes"]:
        buf = torch.zeros(max(1, int(size) // 4), dtype=torch.float32)
        for k in range(spec["warmup"] + spec["repeats"]):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf, async_op=True).wait()  # as the executor runs its buckets
            if rank == 0 and k >= spec["warmup"]:
                samples.append([float(buf.numel() * 4), time.perf_counter() - start])
    return {"rank": rank, "samples": samples}


def main(argv: list[str]) -> int:
    spec_path, rank, parent = argv[1], int(argv[2]), int(argv[3])
    from placement_rl.emulate.worker import _die_with_parent, _realtime

    _die_with_parent(parent)
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("ifname"):
        os.environ["GLOO_SOCKET_IFNAME"] = spec["ifname"]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(spec.get("threads", 1)))
    init_method = spec.get("init_method") or f"tcp://{spec['master_addr']}:{spec['master_port']}"
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=spec["world_size"],
        timeout=datetime.timedelta(seconds=spec["timeout_s"]),
    )
    _realtime(int(spec.get("realtime_priority", 0)))  # gloo's threads exist now; later ones inherit it
    try:
        if spec["mode"] == "program":
            out = _run_program(spec, rank)
        elif spec["mode"] == "ping_pong":
            out = _ping_pong(spec, rank)
        elif spec["mode"] == "all_reduce":
            out = _all_reduce(spec, rank)
        else:
            raise ValueError(f"mode {spec['mode']!r}; expected 'program', 'ping_pong' or 'all_reduce'")
    finally:
        dist.destroy_process_group()
    path = Path(spec["out_dir"]) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

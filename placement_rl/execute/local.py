"""Run a :class:`~placement_rl.execute.lower.Program` on local processes (no Ray).

:func:`run_local` starts one process per worker (``spawn``), joins them into a gloo (or NCCL)
group (a ``file://`` rendezvous in a temporary folder, no socket; gloo's and NCCL's sockets on the loopback
interface: :mod:`~placement_rl.execute.rendezvous`) and collects every worker's :class:`WorkerResult`. The Ray Train
launcher (:mod:`placement_rl.rl.execute`) runs the same :func:`worker_main` inside
``TorchTrainer`` workers; the emulated cluster runs it inside network namespaces. A worker that
dies fails the run with its rank and exit code, and every other worker is stopped.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from placement_rl.execute.lower import Program
from placement_rl.execute.rendezvous import loopback_env
from placement_rl.execute.runtime import DEFAULT_LR, ModelSource, Worker, WorkerResult
from placement_rl.graph import OpGraph

#: The most workers a launcher starts as processes on this machine (:func:`run_local`, the process
#: launcher): each is a Python process with torch and its share of the model; more would measure the
#: machine's scheduler, not the plan, and a mistyped topology (``100000x100000``) must not fork a process
#: per device.
MAX_LOCAL_WORKERS = 64
#: The most measured iterations, and unmeasured warm-up iterations, one run takes: far above what a median
#: needs; a larger count (``--iterations 1000000000000``) is a typo that would run until it is killed.
MAX_ITERATIONS = 10_000
MAX_WARMUP = 10_000
#: The ``torch.distributed`` backends the executor runs on (:func:`available_backends` says which this
#: machine's torch has).
BACKENDS: tuple[str, ...] = ("gloo", "nccl")


class ExecutionError(RuntimeError):
    """A worker failed or died; the message names the rank and the cause."""


@dataclass(frozen=True)
class RunOptions:
    """How workers run: measured iterations after ``warmup`` unmeasured ones, the backend, the seed of
    the weights and the batch, the SGD learning rate and the threads each worker computes with."""

    iterations: int = 3
    warmup: int = 1
    backend: str = "gloo"
    seed: int = 0
    lr: float = DEFAULT_LR
    threads: int = 1

    def __post_init__(self) -> None:
        for key, value, low, high in (
            ("iterations", self.iterations, 1, MAX_ITERATIONS),
            ("warmup", self.warmup, 0, MAX_WARMUP),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{key} = {value!r}; expected an integer from {low} to {high:,}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend = {self.backend!r}; expected one of {list(BACKENDS)}")
        if self.threads < 1:
            raise ValueError(f"threads = {self.threads!r}; expected a positive integer")


def check_local_workers(world_size: int) -> None:
    """Refuse more than :data:`MAX_LOCAL_WORKERS` local worker processes.

    Raises:
        ValueError: naming the number of workers and the limit.
    """
    if world_size > MAX_LOCAL_WORKERS:
        raise ValueError(
            f"the plan runs on {world_size} devices: local workers are one process per device on this machine, "
            f"at most {MAX_LOCAL_WORKERS}; expected a plan on fewer devices (or --launcher ray on a cluster)"
        )


def available_backends() -> list[str]:
    """The backends of :data:`BACKENDS` this machine's torch was built with (a CPU build has no NCCL)."""
    if not dist.is_available():
        return []
    built = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available()}
    return [name for name in BACKENDS if built[name]]


def check_backend(backend: str, *, local: bool = False) -> None:
    """Refuse a backend this machine's torch lacks, before any worker starts (a worker would fail with a
    traceback when it joins the group); with ``local`` (workers on this machine), NCCL without a CUDA GPU too.

    Raises:
        ValueError: naming the backend and the backends available here.
    """
    available = available_backends()
    if backend not in available:
        raise ValueError(
            f"backend {backend!r} is not available: this machine's torch {torch.__version__} was built without "
            f"it; expected one of the backends available here: {', '.join(available) or 'none'}"
        )
    if local and backend == "nccl" and not torch.cuda.is_available():
        raise ValueError(
            "backend 'nccl' runs one worker per CUDA GPU, and this machine has none; expected 'gloo' (workers "
            "on CPUs) or a machine with GPUs"
        )


def worker_device(backend: str, local_rank: int) -> torch.device:
    """The device a worker computes on: its GPU under NCCL, else the CPU."""
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ExecutionError("backend 'nccl' needs CUDA GPUs; none is available on this worker")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def worker_main(
    program: Program, graph: OpGraph, source: ModelSource, options: RunOptions, rank: int, local_rank: int
) -> WorkerResult:
    """Build rank ``rank``'s worker and run it (``torch.distributed`` already initialized)."""
    torch.set_num_threads(options.threads)
    device = worker_device(options.backend, local_rank)
    worker = Worker(program, graph, source, rank, device, seed=options.seed, lr=options.lr)
    return worker.run(options.warmup + options.iterations)


def _entry(
    rank: int,
    world: int,
    init_method: str,
    jobs: Sequence[tuple[Program, OpGraph, ModelSource]],
    options: RunOptions,
    results: Any,
) -> None:
    try:
        os.environ.update(loopback_env())  # before the group exists: gloo and NCCL read it when they start
        dist.init_process_group(options.backend, init_method=init_method, rank=rank, world_size=world)
        for index, (program, graph, source) in enumerate(jobs):
            if rank >= program.world_size:  # a program on fewer workers: keep the collectives in step
                for ranks in program.groups:
                    dist.new_group(list(ranks))
                for _ in range(options.warmup + options.iterations):
                    dist.barrier()
                continue
            results.put(("ok", rank, index, worker_main(program, graph, source, options, rank, rank)))
    except BaseException as exc:  # reported to the parent with the traceback
        results.put(("error", rank, -1, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_local(
    program: Program, graph: OpGraph, source: ModelSource, options: RunOptions | None = None, timeout_s: float = 600.0
) -> list[WorkerResult]:
    """Run ``program`` on ``program.world_size`` local processes; results by rank.

    Raises:
        ValueError: more than :data:`MAX_LOCAL_WORKERS` workers (none is started).
        ExecutionError: a worker raised (its message and traceback) or died (its exit code), or the
            run passed ``timeout_s``; the other workers are terminated.
    """
    return run_local_jobs([(program, graph, source)], options, timeout_s)[0]


def run_local_jobs(
    jobs: Sequence[tuple[Program, OpGraph, ModelSource]],
    options: RunOptions | None = None,
    timeout_s: float = 600.0,
) -> list[list[WorkerResult]]:
    """Run several programs one after the other on the same local processes (one start-up for all of
    them; as many processes as the widest program has workers, the others wait at its barriers);
    per job, the results by rank. Raises as :func:`run_local`."""
    options = options or RunOptions()
    if not jobs:
        return []
    widest = max((program for program, _, _ in jobs), key=lambda p: p.world_size)
    world, devices = widest.world_size, widest.devices
    check_local_workers(world)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    folder = Path(tempfile.mkdtemp(prefix="placement-rl-rendezvous-"))
    init_method = (folder / "store").as_uri()  # a FileStore: the rendezvous opens no socket
    procs = [
        ctx.Process(target=_entry, args=(r, world, init_method, list(jobs), options, results), daemon=True)
        for r in range(world)
    ]
    out: dict[tuple[int, int], WorkerResult] = {}
    try:
        for p in procs:
            p.start()
        waited = 0.0
        while len(out) < sum(program.world_size for program, _, _ in jobs):
            try:
                status, rank, index, payload = results.get(timeout=1.0)
            except queue.Empty:
                waited += 1.0
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    rank, code = dead[0]
                    raise ExecutionError(f"worker {rank} ({devices[rank]}) died with exit code {code}") from None
                if waited > timeout_s:
                    raise ExecutionError(f"workers did not finish within {timeout_s:.0f} s") from None
                continue
            if status == "error":
                raise ExecutionError(f"worker {rank} ({devices[rank]}) failed: {payload}")
            out[(index, rank)] = payload
    finally:
        for p in procs:
            if p.pid is None:  # never started
                continue
            p.join(timeout=5.0)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, 9)
                p.join()
        shutil.rmtree(folder, ignore_errors=True)
    return [[out[(i, r)] for r in range(program.world_size)] for i, (program, _, _) in enumerate(jobs)]

"""The Ray Train launcher of executed plans: :func:`ray_train_launcher`.

Each rank of a :class:`~placement_rl.execute.Program` runs :func:`~placement_rl.execute.local.worker_main`
in one ``ray.train.torch.TorchTrainer`` worker (Ray Train v2, the default of Ray 2.60; Ray Train
sets up the ``torch.distributed`` group with the run's backend). Ray Train v2 hands results back to
the driver only as a checkpoint, so the workers gather their :class:`WorkerResult` on rank 0, which
writes them into a fresh temporary folder (JSON for the measurements, one ``.npy`` file per
parameter shard; nothing is pickled) and reports it with ``ray.train.report``; the driver reads
that checkpoint back from the run's storage, a temporary folder removed afterwards.

The workers' group is set up by :class:`LoopbackTorchConfig` instead of Ray Train's own (whose
``TCPStore`` listens on every interface): rank 0 serves the rendezvous on ``127.0.0.1`` and gloo's
sockets stay on the loopback interface, so every worker must run on rank 0's machine; on a cluster of
several machines name the address rank 0 listens on (``master_addr``, ``--master-addr``; ``"node"``: the
address Ray knows rank 0's machine by).

Before a worker starts, the launcher checks that the Ray cluster has a CPU per worker thread (and a
GPU per worker under NCCL): Ray Train would otherwise wait for the resources forever. A worker that
raises or dies fails the run (no retries) with :class:`~placement_rl.execute.ExecutionError`
naming the worker's error.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup
from ray.train.torch import TorchConfig
from ray.train.torch.config import _set_torch_distributed_env_vars, _TorchBackend

from placement_rl.execute import ExecutionError, Launcher, ModelSource, Program, RunOptions, WorkerResult
from placement_rl.execute.rendezvous import LOOPBACK, init_group, is_loopback, listen, loopback_env
from placement_rl.execute.runtime import Event, IterationResult
from placement_rl.graph import OpGraph
from placement_rl.rl.runtime import ensure_ray

#: The checkpoint's file of measurements (the parameter shards are ``rank<R>_<K>.npy`` beside it).
RESULTS_FILE = "worker_results.json"


def check_resources(world_size: int, options: RunOptions, resources: dict[str, float]) -> None:
    """Refuse a run the cluster's ``resources`` (``ray.cluster_resources()``) cannot hold at once.

    Raises:
        ValueError: naming the workers and the cluster's CPUs (``world_size * options.threads`` are
            needed) or GPUs (``world_size`` under NCCL).
    """
    cpus = int(resources.get("CPU", 0))
    needed = world_size * options.threads
    if needed > cpus:
        raise ValueError(
            f"{world_size} workers x {options.threads} thread(s) need {needed} CPUs; the Ray cluster has {cpus}: "
            f"expected a plan on at most {cpus // options.threads} devices (or fewer --threads)"
        )
    if options.backend == "nccl":
        gpus = int(resources.get("GPU", 0))
        if world_size > gpus:
            raise ValueError(
                f"{world_size} workers under backend 'nccl' need a GPU each; the Ray cluster has {gpus} GPU(s): "
                f"expected a plan on at most {gpus} devices, or backend 'gloo'"
            )


# ------------------------------------------------------------------------------ the group
#: Rank 0's listening socket between the backend's two calls (one per Ray Train worker process).
_LISTENER: list[Any] = []


def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


def _open_listener(host: str) -> tuple[str, int]:
    """On rank 0: listen on ``host`` (``"node"``: this machine's Ray address); the address and port."""
    address = _node_ip() if host == "node" else host
    _LISTENER[:] = [listen(address)]
    return address, int(_LISTENER[0].getsockname()[1])


def _join_group(backend: str, rank: int, world_size: int, host: str, port: int, timeout_s: float) -> None:
    import os

    if is_loopback(host):
        os.environ.update(loopback_env())
    listener = _LISTENER.pop() if rank == 0 and _LISTENER else None
    init_group(backend, rank, world_size, host, port, timeout_s, listener)


class _LoopbackTorchBackend(_TorchBackend):
    """Ray Train's torch backend with its group set up on the address of :class:`LoopbackTorchConfig`."""

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        import ray

        config: LoopbackTorchConfig = backend_config
        n = len(worker_group)
        if config.master_addr == LOOPBACK:
            nodes = sorted(set(worker_group.execute(_node_ip)))
            if len(nodes) > 1:
                raise ValueError(
                    f"the {n} workers run on {len(nodes)} machines ({', '.join(nodes)}); rank 0 listens on "
                    f"{LOOPBACK} only unless given an address: expected --master-addr (an address of rank 0's "
                    "machine the others reach, or 'node')"
                )
        host, port = worker_group.execute_single(0, _open_listener, config.master_addr)
        if not isinstance(worker_group, V1WorkerGroup):  # Ray Train v1 sets them at on_training_start
            worker_group.execute(_set_torch_distributed_env_vars)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank, _join_group, config.backend or "gloo", rank, n, host, port, float(config.timeout_s)
                )
                for rank in range(n)
            ]
        )


@dataclass
class LoopbackTorchConfig(TorchConfig):
    """:class:`ray.train.torch.TorchConfig` whose group listens on ``master_addr`` only (module docstring).

    Attributes:
        master_addr: where rank 0's rendezvous listens: ``127.0.0.1`` (default; every worker on rank 0's
            machine, gloo's sockets on loopback), an address of rank 0's machine, or ``"node"`` (the address
            Ray knows it by).
    """

    master_addr: str = LOOPBACK

    @property
    def backend_cls(self) -> type[_TorchBackend]:
        return _LoopbackTorchBackend


# --------------------------------------------------------------------------- results as files
def write_results(results: list[WorkerResult], folder: Path) -> None:
    """Write ``results`` into ``folder`` (:data:`RESULTS_FILE` and one ``.npy`` per parameter shard)."""
    doc: list[dict[str, Any]] = []
    for r in results:
        names = sorted(r.parameters)
        for k, name in enumerate(names):
            np.save(folder / f"rank{r.rank}_{k}.npy", np.ascontiguousarray(r.parameters[name]), allow_pickle=False)
        doc.append(
            {
                "rank": r.rank,
                "device": r.device,
                "parameters": names,
                "iterations": [
                    {
                        "time_s": it.time_s,
                        "loss": it.loss,
                        "sent_bytes": it.sent_bytes,
                        "events": [[e.kind, e.ref, e.start_s, e.end_s] for e in it.events],
                    }
                    for it in r.iterations
                ],
            }
        )
    (folder / RESULTS_FILE).write_text(json.dumps(doc))


def read_results(folder: Path) -> list[WorkerResult]:
    """The results :func:`write_results` wrote into ``folder``, by rank."""
    out = []
    for w in json.loads((folder / RESULTS_FILE).read_text()):
        iterations = [
            IterationResult(
                time_s=float(it["time_s"]),
                loss=float(it["loss"]),
                events=[Event(str(k), int(ref), float(s), float(e)) for k, ref, s, e in it["events"]],
                sent_bytes=int(it["sent_bytes"]),
            )
            for it in w["iterations"]
        ]
        parameters = {
            name: np.load(folder / f"rank{w['rank']}_{k}.npy", allow_pickle=False)
            for k, name in enumerate(w["parameters"])
        }
        out.append(WorkerResult(int(w["rank"]), str(w["device"]), iterations, parameters))
    return sorted(out, key=lambda r: r.rank)


# ------------------------------------------------------------------------------- the workers
def _train_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: its rank of the program, then the gather and rank 0's checkpoint."""
    import ray.train
    import torch.distributed as dist

    from placement_rl.execute.local import worker_main

    program: Program = config["program"]
    context = ray.train.get_context()
    rank, local_rank = context.get_world_rank(), context.get_local_rank()
    if context.get_world_size() != program.world_size:
        raise ExecutionError(
            f"Ray Train started {context.get_world_size()} workers; the program needs {program.world_size}"
        )
    result = worker_main(program, config["graph"], config["source"], config["options"], rank, local_rank)
    gathered: list[Any] | None = [None] * program.world_size if rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    metrics = {"loss": sum(it.loss for it in result.iterations[:1])}
    if rank != 0:
        ray.train.report(metrics, checkpoint=None)
        return
    with tempfile.TemporaryDirectory(prefix="placement-rl-results-") as folder:
        write_results([r for r in gathered or [] if r is not None], Path(folder))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))


def ray_train_launcher(storage_path: str | None = None, master_addr: str = LOOPBACK) -> Launcher:
    """A :data:`~placement_rl.execute.Launcher` running the workers as Ray Train workers.

    Joins or starts Ray (:func:`ensure_ray`) when called, after the plan has been lowered.

    Args:
        storage_path: where Ray Train keeps the run and its checkpoint (default: a temporary folder on
            this machine, removed after the run). On a cluster of several machines give a folder every
            machine can write (shared file system or a ``s3://`` URI); it is left as it is.
        master_addr: where rank 0's rendezvous listens (:class:`LoopbackTorchConfig`); the default,
            loopback, needs every worker on rank 0's machine.
    """

    def launch(program: Program, graph: OpGraph, source: ModelSource, options: RunOptions) -> list[WorkerResult]:
        import ray
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        try:
            from ray.train import TrainingFailedError
        except ImportError:  # Ray Train v1 (RAY_TRAIN_V2_ENABLED=0)
            from ray.train.base_trainer import TrainingFailedError

        ensure_ray()
        check_resources(program.world_size, options, ray.cluster_resources())
        gpu = options.backend == "nccl"
        resources: dict[str, float] = {"CPU": float(options.threads)}
        if gpu:
            resources["GPU"] = 1.0
        with tempfile.TemporaryDirectory(prefix="placement-rl-train-") as scratch:
            trainer = TorchTrainer(
                _train_loop,
                train_loop_config={"program": program, "graph": graph, "source": source, "options": options},
                scaling_config=ScalingConfig(
                    num_workers=program.world_size, use_gpu=gpu, resources_per_worker=resources
                ),
                torch_config=LoopbackTorchConfig(backend=options.backend, master_addr=master_addr),
                run_config=RunConfig(
                    name=f"execute-{program.graph_name}-{program.plan_name}-{uuid.uuid4().hex[:8]}".replace("/", "_"),
                    storage_path=_absolute(storage_path) if storage_path else scratch,
                    failure_config=FailureConfig(max_failures=0),
                    checkpoint_config=CheckpointConfig(num_to_keep=1),
                ),
            )
            try:
                result = trainer.fit()
            except TrainingFailedError as exc:
                raise ExecutionError(f"the Ray Train workers failed: {_worker_message(exc)}") from None
            if result.checkpoint is None:
                raise ExecutionError("the Ray Train run ended without rank 0's results (no checkpoint)")
            with result.checkpoint.as_directory() as folder:
                return read_results(Path(folder))

    return launch


def _absolute(path: str) -> str:
    """A local folder as an absolute path (Ray Train's requirement); a URI (``s3://...``) as it is."""
    return path if "://" in path else str(Path(path).expanduser().resolve())


def _worker_message(exc: BaseException) -> str:
    """The workers' errors by rank (Ray Train v2's ``WorkerGroupError``), else the error's text."""
    failures = getattr(exc, "worker_failures", None)
    if failures:
        return "; ".join(f"worker {rank}: {_short(err)}" for rank, err in sorted(failures.items()))
    return _short(exc)


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

"""Workers as separate processes started by a spawner: on this machine, or inside the network
namespaces of an :class:`~placement_rl.emulate.cluster.EmulatedCluster`.

:class:`ProcessLauncher` starts ``python -m placement_rl.execute.nsworker SPEC.json RANK PID`` once per
rank with a spawner (:func:`local_spawner`, or the cluster's :meth:`EmulatedCluster.spawn`), after
writing ``SPEC.json`` itself (:mod:`placement_rl.execute.nsworker` lists its keys), waits for every
worker and reads back the JSON each one wrote. :meth:`ProcessLauncher.bind` gives an
:data:`~placement_rl.execute.Launcher` for one plan (the workers lower it again from the plan, the
topology and the cost model, and check the digest of the instructions); :meth:`ProcessLauncher.ping_pong`
times messages between two ranks (:mod:`placement_rl.execute.fidelity` fits a link to them).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from placement_rl.emulate.cluster import _stop
from placement_rl.emulate.run import _tail
from placement_rl.execute.local import ExecutionError, RunOptions, check_local_workers
from placement_rl.execute.lower import Program
from placement_rl.execute.nsworker import cost_model_to_dict, program_digest, result_from_dict
from placement_rl.execute.rendezvous import is_loopback, loopback_ifname
from placement_rl.execute.runtime import ModelSource, WorkerResult
from placement_rl.graph import OpGraph
from placement_rl.plan.core import Plan
from placement_rl.sim.cost import CostModel
from placement_rl.topology import DeviceTopology

#: Starts ``argv`` for rank ``rank`` with ``env``, output to the given files; returns the process.
Spawner = Callable[[int, Sequence[str], Mapping[str, str], IO[Any], IO[Any]], "subprocess.Popen[bytes]"]

WorkerLauncher = Callable[[Program, OpGraph, ModelSource, RunOptions], list[WorkerResult]]


def local_spawner(
    rank: int, argv: Sequence[str], env: Mapping[str, str], stdout: IO[Any], stderr: IO[Any]
) -> subprocess.Popen[bytes]:
    """Start ``argv`` on this machine in a session of its own (``rank`` is unused)."""
    del rank
    return subprocess.Popen(list(argv), env=dict(env), stdout=stdout, stderr=stderr, start_new_session=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ProcessLauncher:
    """Runs the workers of one group as ``nsworker`` processes (module docstring).

    Args:
        spawner: starts rank ``k``'s process (:func:`local_spawner` or ``EmulatedCluster.spawn``).
        master_addr: the address rank 0 listens on, reachable by every rank (``127.0.0.1`` locally, the
            first device's address on the emulated cluster). A loopback address means one machine: the
            workers meet through a ``file://`` rendezvous in the run's folder (no socket) and gloo listens on
            the loopback interface (:mod:`placement_rl.execute.rendezvous`).
        ifname: the interface gloo uses (``eth0`` in a namespace); ``None`` for gloo's default (the loopback
            interface with a loopback ``master_addr``).
        port: first rendezvous port; each launch takes the next one. Default: a free local port per launch.
        timeout_s: a run that has not finished by then fails (and its processes are stopped).
        realtime_priority: ``SCHED_RR`` priority of the workers' threads (0: leave them as they are), so
            that other work on a shared machine does not delay their compute and wake-ups.
    """

    def __init__(
        self,
        spawner: Spawner = local_spawner,
        master_addr: str = "127.0.0.1",
        ifname: str | None = None,
        port: int | None = None,
        timeout_s: float = 600.0,
        realtime_priority: int = 0,
    ) -> None:
        self.spawner = spawner
        self.master_addr = master_addr
        self.ifname = ifname
        self.timeout_s = timeout_s
        self.realtime_priority = realtime_priority
        self._ports = itertools.count(port) if port is not None else None

    def _port(self) -> int:
        return next(self._ports) if self._ports is not None else free_port(self.master_addr)

    def launch(self, world_size: int, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Start ``world_size`` workers with ``spec`` (plus the rendezvous keys), wait, return what each wrote.

        Raises:
            ValueError: more than :data:`~placement_rl.execute.local.MAX_LOCAL_WORKERS` workers (none is started).
            ExecutionError: a worker exited with an error (the tail of its log in the message), or the
                run passed ``timeout_s``. Every process started is stopped whatever the outcome.
        """
        folder = Path(tempfile.mkdtemp(prefix="placement-rl-workers-"))
        logs: list[IO[bytes]] = []
        processes: list[subprocess.Popen[bytes]] = []
        try:
            check_local_workers(world_size)
            local = is_loopback(self.master_addr)
            full = {
                **spec,
                "world_size": world_size,
                "master_addr": self.master_addr,
                "master_port": 0 if local else self._port(),
                # one machine: a FileStore rendezvous (no socket) and gloo's sockets on loopback
                "init_method": (folder / "store").as_uri() if local else None,
                "ifname": self.ifname or (loopback_ifname() if local else None),
                "timeout_s": self.timeout_s,
                "realtime_priority": self.realtime_priority,
                "out_dir": str(folder),
            }
            (folder / "spec.json").write_text(json.dumps(full))
            env = {**os.environ, "OMP_NUM_THREADS": str(spec.get("threads", 1)), "PYTHONUNBUFFERED": "1"}
            for k in range(world_size):
                log = open(folder / f"rank{k}.log", "wb")  # closed below, after the process ends
                logs.append(log)
                argv = [
                    sys.executable,
                    "-m",
                    "placement_rl.execute.nsworker",
                    str(folder / "spec.json"),
                    str(k),
                    str(os.getpid()),
                ]
                processes.append(self.spawner(k, argv, env, log, log))
            deadline = time.monotonic() + self.timeout_s
            while True:
                codes = [p.poll() for p in processes]
                failed = [k for k, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    k = failed[0]
                    raise ExecutionError(f"worker {k} exited with status {codes[k]}:\n{_tail(folder / f'rank{k}.log')}")
                if all(c == 0 for c in codes):
                    break
                if time.monotonic() > deadline:
                    raise ExecutionError(f"the workers did not finish within {self.timeout_s:g} s")
                time.sleep(0.1)
            return [json.loads((folder / f"rank{k}.json").read_text()) for k in range(world_size)]
        finally:
            _stop(processes)
            for handle in logs:
                handle.close()
            shutil.rmtree(folder, ignore_errors=True)

    def bind(self, topology: DeviceTopology, plan: Plan, cost_model: CostModel) -> WorkerLauncher:
        """A launcher for :func:`placement_rl.execute.execute` of ``plan`` on ``topology`` under ``cost_model``
        (the workers lower the plan again from these and check that they get the same instructions)."""

        def run(program: Program, graph: OpGraph, source: ModelSource, options: RunOptions) -> list[WorkerResult]:
            del graph  # traced again by each worker from the model source
            if options.backend != "gloo":
                raise ExecutionError(f"backend {options.backend!r}: the process launcher runs gloo workers on CPUs")
            spec = {
                "mode": "program",
                "threads": options.threads,
                "model": {"spec": source.spec, "batch_size": source.batch_size, "options": list(source.options)},
                "plan": plan.to_dict(),
                "topology": topology.to_dict(),
                "cost_model": cost_model_to_dict(cost_model),
                "run": asdict(options),
                "digest": program_digest(program),
            }
            return [result_from_dict(d) for d in self.launch(program.world_size, spec)]

        return run

    def ping_pong(
        self, world_size: int, peer: int, sizes: Sequence[int], repeats: int = 5, warmup: int = 2
    ) -> list[tuple[float, float]]:
        """``(bytes, one-way seconds)`` of messages bounced between ranks 0 and ``peer`` (half of each round
        trip), ``repeats`` per size after ``warmup`` untimed ones."""
        if not 0 < peer < world_size:
            raise ValueError(f"peer {peer}: expected a rank in [1, {world_size})")
        spec = {"mode": "ping_pong", "peer": peer, "sizes": list(sizes), "repeats": repeats, "warmup": warmup}
        out = self.launch(world_size, spec)
        return [(float(s), float(t)) for s, t in out[0]["samples"]]

    def all_reduce_times(
        self, world_size: int, sizes: Sequence[int], repeats: int = 5, warmup: int = 2
    ) -> list[tuple[float, float]]:
        """``(bytes, seconds)`` of gloo all-reduces of every worker, ``repeats`` per size after ``warmup``
        untimed ones, each started after a barrier (rank 0's clock)."""
        spec = {"mode": "all_reduce", "sizes": list(sizes), "repeats": repeats, "warmup": warmup}
        out = self.launch(world_size, spec)
        return [(float(s), float(t)) for s, t in out[0]["samples"]]

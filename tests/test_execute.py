"""The executor: plans lowered with the simulator's compilation, run on real gloo workers.

Fast tests check the lowering against the simulator (no process starts). The slow matrix runs
lenet, a small ResNet and a 2-step rnnlm under data parallel, expert, layerwise, a random valid plan
and a plan mixing parameter splits, a parameter server and duplicated ops, on 2 and 4 CPU workers,
and checks one iteration against single-device training: the same loss and updated parameters
(relative 1e-4), and the bytes every worker sent equal to the simulator's for that plan.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from placement_rl.emulate.cluster import switched_cluster
from placement_rl.execute import ModelSource, NotExecutableError, RunOptions, lower, reference_step
from placement_rl.execute.local import run_local_jobs
from placement_rl.graph import OpGraph
from placement_rl.plan import OpConfig, Plan
from placement_rl.plan import constructors as pc
from placement_rl.topology import DeviceTopology

SOURCES = {
    "lenet": ModelSource("lenet", 8),
    "small_resnet": ModelSource("execute_models:small_resnet", 8),
    "rnnlm": ModelSource("rnnlm", 8, (("steps", 2), ("hidden", 32), ("vocab_size", 50), ("num_layers", 2))),
    "inplace_mlp": ModelSource("execute_models:inplace_mlp", 8),
}
PLANS = ("data_parallel", "expert", "layerwise", "random", "mixed")
_GRAPHS: dict[str, OpGraph] = {}


def _graph(name: str) -> OpGraph:
    if name not in _GRAPHS:
        _GRAPHS[name] = SOURCES[name].graph()
    return _GRAPHS[name]


def random_plan(graph: OpGraph, topology: DeviceTopology, seed: int) -> Plan:
    """A random executable plan: per op, one random device, a sample split over every device, or a
    parameter split of a linear/convolution/embedding layer; random sync modes."""
    rng = random.Random(seed)
    devices = [d.name for d in topology.devices]
    n = len(devices)
    configs: dict[str, OpConfig] = {}
    split_keys: dict[str, bool] = {}  # ops sharing parameters (an unrolled layer) split them alike
    for op in graph.ops:
        choices: list[OpConfig] = [OpConfig.make(rng.choice(devices))]
        sample = op.sample_dim
        if sample is not None and sample.size % n == 0:
            sync = rng.choice(["all_reduce", "all_reduce_per_tensor", "parameter_server"])
            choices.append(OpConfig.make(devices, {sample.name: n}, sync))  # type: ignore[arg-type]
        param = _splittable(op, n)
        if param is not None:
            choices.append(OpConfig.make(devices, {param: n}))
        if op.param_key in split_keys:
            choices = [
                c for c in choices if (c.num_partitions > 1 and param in c.degree_map) == split_keys[op.param_key]
            ]
        configs[op.name] = rng.choice(choices)
        if op.param_key is not None:
            split_keys.setdefault(op.param_key, param is not None and param in configs[op.name].degree_map)
    return Plan(graph.name, configs, name=f"random{seed}")


def mixed_plan(graph: OpGraph, topology: DeviceTopology) -> Plan:
    """Data parallel first third (embeddings split by columns); then parameter splits where the layer
    allows, else replicas synced by a parameter server; the last third duplicated on every device."""
    devices = [d.name for d in topology.devices]
    n = len(devices)
    count = len(graph.ops)
    configs: dict[str, OpConfig] = {}
    for i, op in enumerate(graph.ops):
        sample = op.sample_dim
        param = _splittable(op, n)
        if i < count // 3 and param is not None and op.op_type == "embedding":
            configs[op.name] = OpConfig.make(devices, {param: n})  # embedding columns
        elif i < count // 3 and sample is not None and sample.size % n == 0:
            configs[op.name] = OpConfig.make(devices, {sample.name: n})
        elif i < 2 * count // 3 or i < count // 3:
            if param is not None:
                configs[op.name] = OpConfig.make(devices, {param: n})
            else:
                configs[op.name] = OpConfig.make(devices, {}, "parameter_server")
        else:
            configs[op.name] = OpConfig.make(devices, {}, "duplicate")
    return Plan(graph.name, configs, name="mixed")


def _splittable(op: Any, n: int) -> str | None:
    """The parameter dimension of a layer whose weights the executor can split ``n`` ways, if any."""
    param = next((d for d in op.parallel_dims if d.kind == "parameter"), None)
    if param is None or param.size % n or op.op_type not in ("linear", "conv2d", "embedding"):
        return None
    return str(param.name)


def make_plan(kind: str, graph: OpGraph, topology: DeviceTopology) -> Plan:
    if kind == "random":
        return random_plan(graph, topology, seed=len(topology.devices))
    if kind == "mixed":
        return mixed_plan(graph, topology)
    return getattr(pc, kind)(graph, topology)  # type: ignore[no-any-return]


# ------------------------------------------------------------------ lowering (no processes)


@pytest.mark.parametrize("model", sorted(SOURCES))
@pytest.mark.parametrize("kind", PLANS)
def test_lowering_is_the_simulated_task_graph(model: str, kind: str) -> None:
    graph = _graph(model)
    topology = switched_cluster(1, 4)
    plan = make_plan(kind, graph, topology)
    program = lower(graph, topology, plan)
    sim = program.simulated
    table = sim.tasks
    # every simulated task is an instruction of each device it involves: compute once, p2p twice,
    # an all-reduce once per member
    counted = np.zeros(len(table), np.int64)
    for rank, instructions in enumerate(program.instructions):
        positions = {}
        for k, ins in enumerate(instructions):
            counted[ins.sim_task] += 1
            positions[(ins.kind, ins.ref)] = k
        for ins in instructions:  # a task's backward after its forward, on its own device
            if ins.kind == "forward":
                assert positions[("backward", ins.ref)] > positions[("forward", ins.ref)]
        starts = [ins.sim_start_s for ins in instructions]
        assert starts == sorted(starts), f"rank {rank}: instructions out of simulated order"
    F = len(program.task_order)
    C = len(program.comms)
    assert (counted[: 2 * F] == 1).all()
    assert (counted[2 * F : 2 * F + 2 * C] == 2).all()
    for b in program.buckets:
        assert counted[program.instructions[b.ranks[0]][0].sim_task] >= 1
    # the transfers' regions hold the simulator's bytes (fp32 activations; int64 token ids are 8 bytes)
    for c in program.comms:
        elements = math.prod(hi - lo for lo, hi in c.box)
        assert c.num_bytes in (4 * elements, 8 * elements)
    # payload accounting: transfers both ways, pushes and pulls, each bucket per member
    transfers = float(table.num_bytes[2 * F : 2 * F + 2 * C].sum())
    ps = sum(p.num_bytes for p in program.ps)
    buckets = sum(b.num_bytes * len(b.ranks) for b in program.buckets)
    assert program.sent_bytes().sum() == pytest.approx(transfers + ps + buckets)


@pytest.mark.parametrize("model", sorted(SOURCES))
def test_the_mixed_plan_mixes_every_kind_of_configuration(model: str) -> None:
    graph = _graph(model)
    for workers in (2, 4):
        plan = mixed_plan(graph, switched_cluster(1, workers))
        syncs = {cfg.sync for cfg in plan.configs.values()}
        assert {"all_reduce", "parameter_server", "duplicate"} <= syncs
        split = [op.name for op in graph.ops if _splittable(op, workers) in plan[op.name].degree_map]
        assert split, "no parameter split"
        assert any(cfg.degree_map.get("sample", 1) > 1 for cfg in plan.configs.values())


def test_attribute_split_is_refused_before_any_worker_starts() -> None:
    graph = _graph("lenet")
    topology = switched_cluster(1, 2)
    devices = [d.name for d in topology.devices]
    conv = next(op for op in graph.ops if op.op_type == "conv2d")
    height = next(d for d in conv.parallel_dims if d.kind == "attribute")
    plan = pc.single_device(graph, topology)
    configs = dict(plan.configs)
    configs[conv.name] = OpConfig.make(devices, {height.name: 2})
    with pytest.raises(NotExecutableError, match=f"op '{conv.name}'.*attribute dimension '{height.name}'"):
        lower(graph, topology, Plan(graph.name, configs))


def test_duplicate_needs_a_duplicated_tail() -> None:
    graph = _graph("lenet")
    topology = switched_cluster(1, 2)
    devices = [d.name for d in topology.devices]
    plan = pc.single_device(graph, topology, devices[0])
    configs = dict(plan.configs)
    configs["head_0"] = OpConfig.make(devices, {}, "duplicate")
    with pytest.raises(NotExecutableError, match="op 'head_0': sync 'duplicate'.*consumer 'head_1'"):
        lower(graph, topology, Plan(graph.name, configs))


def test_plan_for_another_graph_is_refused() -> None:
    topology = switched_cluster(1, 2)
    plan = pc.data_parallel(_graph("lenet"), topology)
    with pytest.raises(ValueError, match="made for graph 'lenet', not 'rnnlm'"):
        lower(_graph("rnnlm"), topology, plan)


# ------------------------------------------------------------------ running it (slow)

_RUNS: dict[int, dict[tuple[str, str], Any]] = {}


def _run_all(workers: int) -> dict[tuple[str, str], Any]:
    """Every (model, plan) on ``workers`` gloo processes, in one start-up: (program, results)."""
    if workers not in _RUNS:
        topology = switched_cluster(1, workers)
        jobs, keys = [], []
        for model in sorted(SOURCES):
            graph = _graph(model)
            for kind in PLANS:
                jobs.append((lower(graph, topology, make_plan(kind, graph, topology)), graph, SOURCES[model]))
                keys.append((model, kind))
        results = run_local_jobs(jobs, RunOptions(iterations=1, warmup=0))
        _RUNS[workers] = {key: (job[0], res) for key, job, res in zip(keys, jobs, results, strict=True)}
    return _RUNS[workers]


_REFERENCES: dict[str, tuple[float, dict[str, Any]]] = {}


def _reference(model: str) -> tuple[float, dict[str, Any]]:
    if model not in _REFERENCES:
        _REFERENCES[model] = reference_step(SOURCES[model])
    return _REFERENCES[model]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("model", sorted(SOURCES))
@pytest.mark.parametrize("kind", PLANS)
def test_one_iteration_equals_single_device_training(workers: int, model: str, kind: str) -> None:
    program, results = _run_all(workers)[(model, kind)]
    loss_ref, params_ref = _reference(model)
    loss = sum(r.iterations[0].loss for r in results)
    assert loss == pytest.approx(loss_ref, rel=1e-4)
    seen: set[str] = set()
    for r in results:
        for key, value in r.parameters.items():
            name, _, shard = key.partition("#")
            expected = params_ref[name].numpy()
            if shard:
                k, count = (int(x) for x in shard.split("/"))
                dim = 1 if "embedding" in name or name.endswith("embedding.weight") else 0
                size = expected.shape[dim] // count
                expected = np.take(expected, range(k * size, (k + 1) * size), axis=dim)
            np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-6, err_msg=f"{kind}: {key} on rank {r.rank}")
            seen.add(name)
    assert seen == set(params_ref), f"parameters no worker holds: {sorted(set(params_ref) - seen)}"
    # the bytes each worker sent are the simulator's bytes for this plan, exactly
    assert [r.iterations[0].sent_bytes for r in results] == [int(b) for b in program.sent_bytes()]


def test_a_worker_builds_only_the_parameters_it_needs_with_the_reference_values() -> None:
    import torch

    from placement_rl.execute.runtime import materialize

    source = SOURCES["lenet"]
    full, _ = source.build()
    materialize(full, source, 0, torch.device("cpu"))
    part, _ = source.build()
    materialize(part, source, 0, torch.device("cpu"), {"head.2"})
    built = {n for n, p in part.named_parameters() if not p.is_meta}
    assert built == {"head.2.weight", "head.2.bias"}
    reference = dict(full.named_parameters())
    for name in built:
        assert torch.equal(part.get_parameter(name), reference[name])


def test_tensors_without_an_initializer_come_from_a_real_build() -> None:
    import torch

    from placement_rl.execute.runtime import materialize

    options = (("num_layers", 1), ("hidden", 32), ("heads", 2), ("seq_len", 8), ("vocab_size", 50))
    source = ModelSource("transformer", 8, options)
    module, _ = source.build()
    materialize(module, source, 0, torch.device("cpu"))
    expected = torch.full((8, 8), float("-inf")).triu(1)  # the decoder's causal mask, a buffer of the root
    assert torch.equal(module.get_buffer("causal_mask"), expected)


# ------------------------------------------------------------------ where the workers' sockets listen
def _listening(pids: list[int]) -> set[tuple[str, int]]:
    """``(address, port)`` of every TCP socket the processes ``pids`` listen on."""
    import psutil

    out = set()
    for pid in pids:
        try:
            for c in psutil.Process(pid).net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.add((c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _listening_during(run: Any) -> set[tuple[str, int]]:
    """Every listening socket of this process's children seen while ``run()`` runs (polled every 20 ms)."""
    import threading
    import time

    import psutil

    seen: set[tuple[str, int]] = set()
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            seen.update(_listening([p.pid for p in psutil.Process().children(recursive=True)]))
            time.sleep(0.02)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        run()
    finally:
        done.set()
        thread.join()
    return seen


def _assert_loopback_only(seen: set[tuple[str, int]]) -> None:
    from placement_rl.execute.rendezvous import is_loopback

    assert seen, "no worker socket was seen listening"
    assert all(is_loopback(ip) for ip, _ in seen), f"listening beyond loopback: {sorted(seen)}"


@pytest.mark.slow
def test_local_workers_listen_on_loopback_only() -> None:
    topology = switched_cluster(1, 2)
    graph = _graph("lenet")
    program = lower(graph, topology, pc.data_parallel(graph, topology))
    options = RunOptions(iterations=3, warmup=1)
    seen = _listening_during(lambda: run_local_jobs([(program, graph, SOURCES["lenet"])], options, timeout_s=120.0))
    _assert_loopback_only(seen)


@pytest.mark.slow
def test_process_launcher_workers_listen_on_loopback_only() -> None:
    from placement_rl.execute.processes import ProcessLauncher

    launcher = ProcessLauncher(timeout_s=120.0)
    seen = _listening_during(lambda: launcher.ping_pong(2, 1, [4096, 2**20], repeats=20, warmup=1))
    _assert_loopback_only(seen)


def test_process_launcher_meets_through_a_file_on_this_machine(tmp_path: Any) -> None:
    """A loopback launcher gives its workers a ``file://`` rendezvous and gloo's loopback interface: no
    ``tcp://`` store, which would listen on every interface (no worker runs: the spawner answers)."""
    import json
    import subprocess
    import sys

    from placement_rl.execute.processes import ProcessLauncher
    from placement_rl.execute.rendezvous import loopback_ifname

    specs: list[dict[str, Any]] = []

    def spawner(rank: int, argv: Any, env: Any, stdout: Any, stderr: Any) -> subprocess.Popen[bytes]:
        spec = json.loads(open(argv[3]).read())
        specs.append(spec)
        with open(f"{spec['out_dir']}/rank{rank}.json", "w") as f:
            json.dump({"rank": rank, "samples": []}, f)
        return subprocess.Popen([sys.executable, "-c", "pass"])

    ProcessLauncher(spawner).ping_pong(2, 1, [4096])
    assert len(specs) == 2
    for spec in specs:
        assert spec["init_method"].startswith("file://"), spec
        assert spec["ifname"] == loopback_ifname()


def test_rank_zero_store_listens_where_its_socket_does() -> None:
    """The Ray launcher's rendezvous: rank 0's ``TCPStore`` serves the socket it was handed, on 127.0.0.1
    only (``torch.distributed``'s own would listen on every interface)."""
    import os

    import torch.distributed as dist

    from placement_rl.rl.execute import _join_group, _open_listener

    host, port = _open_listener("127.0.0.1")
    env = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    try:
        _join_group("gloo", 0, 1, host, port, 30.0)
        listening = _listening([os.getpid()])
        assert ("127.0.0.1", port) in listening
        assert not any(p == port and ip != "127.0.0.1" for ip, p in listening), listening
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_loopback_addresses_are_recognised_in_every_spelling() -> None:
    from placement_rl.execute.rendezvous import is_loopback

    for host in ("localhost", "127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "::ffff:10.0.0.1", "example.org", ""):
        assert not is_loopback(host), host

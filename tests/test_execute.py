"""The executor: plans lowered with the simulator's compilation, run on real gloo workers.

Fast tests check the lowering against the simulator (no process starts). The slow matrix runs
lenet, a small ResNet, a 2-step rnnlm and an MLP with in-place ops under data parallel, expert,
layerwise, a random valid plan, a plan mixing parameter splits, a parameter server and duplicated ops,
and the plans of schema version 2: a GPipe pipeline (one stage per worker, 2 micro-batches), a 1F1B
pipeline (two stages, data parallel inside each, 4 micro-batches), the same interleaved (two chunks
per device group), ZeRO-1 on data parallelism, ZeRO-2
on data parallelism with 2 accumulated micro-batches, an uneven data-parallel split and the expert
plan with every op recomputed; on 2 and 4 CPU workers. It checks one iteration against single-device
training of the whole batch: the same loss and updated parameters (relative 1e-4), and the bytes every
worker sent equal to the simulator's for that plan.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from placement_rl.emulate.cluster import switched_cluster
from placement_rl.execute import ModelSource, NotExecutableError, RunOptions, lower, reference_step, replay
from placement_rl.execute.local import run_local_jobs
from placement_rl.graph import OpGraph
from placement_rl.plan import OpConfig, Plan
from placement_rl.plan import constructors as pc
from placement_rl.plan.core import pipeline_stages
from placement_rl.sim.pipeline import schedule_slots
from placement_rl.sim.simulator import simulate
from placement_rl.topology import DeviceTopology

SOURCES = {
    "lenet": ModelSource("lenet", 8),
    "small_resnet": ModelSource("execute_models:small_resnet", 8),
    "rnnlm": ModelSource("rnnlm", 8, (("steps", 2), ("hidden", 32), ("vocab_size", 50), ("num_layers", 2))),
    "inplace_mlp": ModelSource("execute_models:inplace_mlp", 8),
}
PLANS = (
    "data_parallel",
    "expert",
    "layerwise",
    "random",
    "mixed",
    "gpipe",
    "1f1b",
    "interleaved",
    "zero1",
    "zero2",
    "uneven",
    "recompute",
)
#: Each worker's share of the batch in the uneven plan: whole samples of a batch of 8 (2 + 6; 1 + 3 + 2 + 2).
UNEVEN_WEIGHTS = {2: (0.25, 0.75), 4: (0.125, 0.375, 0.25, 0.25)}
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


def uneven_plan(graph: OpGraph, topology: DeviceTopology) -> Plan:
    """Data parallelism with :data:`UNEVEN_WEIGHTS`: every op split over all devices takes them."""
    devices = [d.name for d in topology.devices]
    weights = dict(zip(devices, UNEVEN_WEIGHTS[len(devices)], strict=True))
    plan = pc.data_parallel(graph, topology)
    configs = {}
    for op in graph.ops:
        cfg = plan[op.name]
        sample = op.sample_dim
        if sample is not None and cfg.degree_map.get(sample.name, 1) == len(devices):
            cfg = cfg.replace(weights=weights)
        configs[op.name] = cfg
    return plan.with_configs(configs, name="uneven")


def make_plan(kind: str, graph: OpGraph, topology: DeviceTopology) -> Plan:
    n = len(topology.devices)
    if kind == "random":
        return random_plan(graph, topology, seed=n)
    if kind == "mixed":
        return mixed_plan(graph, topology)
    if kind == "gpipe":
        return pc.pipeline(graph, topology, stages=n, micro_batches=2, schedule="gpipe")
    if kind == "1f1b":
        return pc.pipeline(graph, topology, stages=2, data_parallel=n // 2, micro_batches=4, schedule="1f1b")
    if kind == "interleaved":
        return pc.pipeline(
            graph, topology, stages=2, data_parallel=n // 2, micro_batches=4, schedule="interleaved", virtual_stages=2
        )
    if kind == "zero1":
        return pc.zero(graph, pc.data_parallel(graph, topology), stage=1)
    if kind == "zero2":
        return pc.zero(graph, pc.data_parallel(graph, topology).with_schedule(2, "1f1b"), stage=2)
    if kind == "uneven":
        return uneven_plan(graph, topology)
    if kind == "recompute":
        return pc.recompute(graph, pc.expert(graph, topology))
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
@pytest.mark.parametrize("workers", [2, 4])
def test_every_plan_lowers_to_what_simulate_returns(model: str, workers: int) -> None:
    graph = _graph(model)
    topology = switched_cluster(1, workers)
    for kind in PLANS:
        plan = make_plan(kind, graph, topology)
        program = lower(graph, topology, plan)
        expected = simulate(graph, topology, plan)
        assert program.simulated.makespan_s == expected.makespan_s, kind
        assert program.simulated.comm_bytes == expected.comm_bytes, kind
        np.testing.assert_array_equal(program.simulated.tasks.micro_batch, expected.tasks.micro_batch)
        assert program.micro_batches == plan.micro_batches
        # the loss's tasks seed one whole batch: over micro-batches, partitions and replicas, 1 in all
        loss = [s for s in program.tasks.values() if s.node == program.loss_op]
        assert sum(s.seed_gradient * s.partial_weight for s in loss) == pytest.approx(1.0, rel=1e-12), kind
        # every input op's partitions read every sample of the batch once (replica 0 of each)
        for op in graph.ops:
            if op.op_type != "input" or op.sample_dim is None:
                continue
            axis, size = op.plain_sample_axis, op.output_shapes[0][op.plain_sample_axis]
            rows: list[int] = []
            for spec in program.tasks.values():
                if spec.node == op.name and spec.replica == 0:
                    lo, hi = spec.output_boxes[0][axis]
                    rows += [spec.micro_batch * (size // plan.micro_batches) + r for r in range(lo, hi)]
            assert sorted(rows) == list(range(size)), f"{kind}: {op.name}"


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "interleaved"])
def test_each_worker_runs_its_compute_in_the_schedules_order(workers: int, kind: str) -> None:
    graph = _graph("lenet")
    topology = switched_cluster(1, workers)
    plan = make_plan(kind, graph, topology)
    program = lower(graph, topology, plan)
    stages = pipeline_stages(graph, plan)
    groups = list(dict.fromkeys(stage.devices for stage in stages))
    assert len(groups) == (workers if kind == "gpipe" else 2)
    assert len(stages) == len(groups) * plan.virtual_stages
    for rank, instructions in enumerate(program.instructions):
        device = program.devices[rank]
        group = next(g for g, devices in enumerate(groups) if device in devices)
        mine = [stage for stage in stages if device in stage.devices]  # chunk c: the device's c-th stage
        chunk_of = {graph.ops[i].name: c for c, stage in enumerate(mine) for i in stage.ops}
        slots: list[tuple[int, int, int]] = []  # (backward, micro-batch, chunk) of its compute, in program order
        for ins in instructions:
            if ins.kind in ("forward", "backward"):
                spec = program.tasks[program.task_order[ins.ref]]
                slot = (int(ins.kind == "backward"), spec.micro_batch, chunk_of[spec.node])
                if not slots or slots[-1] != slot:
                    slots.append(slot)
        expected = schedule_slots(plan.schedule, group, len(groups), plan.micro_batches, plan.virtual_stages)
        assert slots == expected, f"rank {rank}"


def test_micro_batch_tasks_run_their_op_with_its_parameters() -> None:
    graph = _graph("rnnlm")
    topology = switched_cluster(1, 2)
    plan = make_plan("1f1b", graph, topology)
    program = lower(graph, topology, plan)
    assert program.micro_batches == 4
    for (op, _), spec in program.tasks.items():
        assert op == f"{spec.node}@mb{spec.micro_batch}" and program.node_of[op] == spec.node
        for inp in spec.inputs:
            assert inp.src_op == f"{inp.src_node}@mb{spec.micro_batch}"  # a micro-batch reads its own
    # every parameter is held under its original op's name and synchronized once per iteration
    owners = {h.shard.owner for held in program.holdings for h in held}
    assert owners <= {op.name for op in graph.ops}
    ops_with_parameters = {op.param_key for op in graph.ops if op.param_bytes > 0}
    assert len(owners) == len(ops_with_parameters)


def test_zero_buckets_shard_the_update_and_move_what_an_all_reduce_moves() -> None:
    graph = _graph("lenet")
    topology = switched_cluster(1, 4)
    plain = lower(graph, topology, pc.data_parallel(graph, topology))
    for stage in (1, 2):
        program = lower(graph, topology, pc.zero(graph, pc.data_parallel(graph, topology), stage=stage))
        assert program.buckets and all(b.zero == (stage,) * len(b.members) for b in program.buckets)
        assert all(not b.plain and b.sharded == b.members for b in program.buckets)
        assert all(h.zero == stage for held in program.holdings for h in held)
        np.testing.assert_array_equal(program.sent_bytes(), plain.sent_bytes())
        assert program.simulated.comm_bytes == plain.simulated.comm_bytes


def test_zero_stage_3_is_refused_before_any_worker_starts() -> None:
    graph = _graph("lenet")
    topology = switched_cluster(1, 2)
    with pytest.raises(NotExecutableError, match="op 'features_0'.*ZeRO stage 3.*expected ZeRO stage 1 or 2"):
        lower(graph, topology, pc.fsdp(graph, pc.data_parallel(graph, topology)))


def test_uneven_weights_off_whole_samples_are_refused() -> None:
    graph = _graph("lenet")
    topology = switched_cluster(1, 2)
    plan = uneven_plan(graph, topology)
    weights = {d.name: w for d, w in zip(topology.devices, (0.3, 0.7), strict=True)}
    off = plan.with_configs({n: c.replace(weights=weights) if c.weights else c for n, c in plan.configs.items()})
    with pytest.raises(
        NotExecutableError,
        match=r"op 'features_0': weights .* its input from 'images' .* at 2\.4 of its 8 rows.*multiples of 1/8",
    ):
        lower(graph, topology, off)


def test_micro_batches_refuse_a_reduction_over_the_batch_before_the_loss() -> None:
    graph = ModelSource("execute_models:batch_centered", 8).graph()
    topology = switched_cluster(1, 2)
    plan = pc.data_parallel(graph, topology)
    lower(graph, topology, plan)  # one batch: each partition's mean is weighted and summed
    with pytest.raises(NotExecutableError, match="op 'mean' \\(mean\\) reduces over the batch"):
        lower(graph, topology, plan.with_schedule(2))


def test_accumulated_micro_batches_with_recomputation_equal_one_big_batch(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker in this process (a gloo group of one): four micro-batches, every op recomputed."""
    import torch
    import torch.distributed as dist

    from placement_rl.execute.rendezvous import loopback_env
    from placement_rl.execute.runtime import Worker

    source, graph = SOURCES["inplace_mlp"], _graph("inplace_mlp")
    topology = switched_cluster(1, 2)
    plan = pc.recompute(graph, pc.single_device(graph, topology).with_schedule(4, "gpipe"))
    program = lower(graph, topology, plan)
    for key, value in loopback_env().items():
        monkeypatch.setenv(key, value)
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        result = Worker(program, graph, source, 0, torch.device("cpu")).run(1)
    finally:
        dist.destroy_process_group()
    loss_ref, params_ref = _reference("inplace_mlp")
    assert result.iterations[0].loss == pytest.approx(loss_ref, rel=1e-5)
    assert set(result.parameters) == set(params_ref)
    for name, value in result.parameters.items():
        np.testing.assert_allclose(value, params_ref[name].numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    recomputed = [e for e in result.iterations[0].events if e.kind == "recompute"]
    assert len(recomputed) == len(program.task_order) == 4 * len(graph.ops)


@pytest.mark.parametrize("kind", ["data_parallel", "1f1b", "zero2", "recompute"])
def test_replaying_the_simulated_compute_times_is_the_simulation(kind: str) -> None:
    """The replay (measured compute times in the simulated task graph) runs the lowered task graph."""
    graph = _graph("lenet")
    topology = switched_cluster(1, 2)
    plan = make_plan(kind, graph, topology)
    program = lower(graph, topology, plan)
    F = len(program.task_order)
    spans = program.simulated.tasks.end_s - program.simulated.tasks.start_s
    replayed = replay(graph, topology, plan, spans[:F], spans[F : 2 * F])
    assert replayed.makespan_s == pytest.approx(program.simulated.makespan_s, rel=1e-9)
    assert replayed.micro_batches == plan.micro_batches
    with pytest.raises(ValueError, match=f"expected \\({F},\\) forward and backward times"):
        replay(graph, topology, plan, spans[: F - 1], spans[F : 2 * F - 1])


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
    assert [r.iterations[0].sent_bytes for r in results] == [round(b) for b in program.sent_bytes()]
    # ZeRO buckets were reduce-scattered and all-gathered, recomputed tasks ran their forward again
    for r in results:
        kinds = [e.kind for e in r.iterations[0].events]
        sharded = [b for b in program.buckets if b.sharded and r.rank in b.ranks]
        assert kinds.count("reduce_scatter_done") == kinds.count("all_gather_done") == len(sharded)
        assert kinds.count("recompute") == sum(s.recompute for s in program.tasks.values() if s.rank == r.rank)
    if kind in ("zero1", "zero2"):
        assert all(b.sharded for b in program.buckets)
    if kind == "recompute":
        assert all(s.recompute for s in program.tasks.values())


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

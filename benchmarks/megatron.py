"""Megatron-LM's published throughput (Narayanan et al. 2021, Table 1) against the simulator.

    python benchmarks/megatron.py                      # a table of every row
    python benchmarks/megatron.py --json               # one JSON object per row
    python benchmarks/megatron.py --rows 1.7,3.6 --max-tasks 3000000
    python benchmarks/megatron.py --calibration my_gpu.json   # another fit of the GPU figures

Each row of the paper's Table 1 (GPT from 1.7 B parameters on 32 A100s to 1 T on 3,072) is built as
the paper ran it and simulated with the project's ordinary cost model:

* the model: the zoo's ``gpt`` with the row's layers, hidden size and heads (vocabulary 51,200,
  sequence 2,048), imported on the meta device;
* the cluster: ``dgx-a100-xN``, DGX A100 nodes of eight 80 GB A100s on NVSwitch, each GPU with its
  own 200 Gb/s InfiniBand NIC (a rail-optimized SuperPOD);
* the plan: :func:`placement_rl.plan.megatron` with the row's tensor- and pipeline-parallel sizes,
  the rest data parallel; with a pipeline, micro-batches of ``--micro-batch-size`` sequences (1 by
  default: the paper's Table 1 does not list it; Megatron-LM's large-model scripts use 1), the
  1F1B schedule (``--virtual-stages`` > 1: interleaved); without one, each data-parallel rank's
  share of the batch in one step; full activation recomputation;
* the simulation: one data-parallel replica and one tensor-parallel rank of each group, every
  all-reduce spanning the devices it spans in the whole plan
  (:func:`placement_rl.sim.replicas.simulate_replica`, bit-exact against simulating them all on
  these rail-optimized clusters);
* the cost model: mixed precision (``bf16-mixed``: the A100's FP16 and BF16 peaks are equal), the
  shipped GPU calibration (fitted to an H200, carried to the A100 by its datasheet peaks), or
  ``--calibration FILE`` (``placement-rl calibrate --out FILE``; ``roofline``: the flat roofline);
  nothing is fitted to any row.

Throughput per GPU uses the paper's FLOP count (its Eq. 3, with recomputation:
:func:`placement_rl.zoo.gpt.paper_flops`) over the simulated iteration time, as the paper reports it.
A row whose simulation would exceed ``--max-tasks`` tasks is reported as skipped with its estimated
task count.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from placement_rl import zoo
from placement_rl.cli.common import CALIBRATION_HELP, calibration, calibration_spec
from placement_rl.plan import megatron
from placement_rl.sim.cost import CostModel
from placement_rl.sim.replicas import simulate_replica
from placement_rl.topology import load_preset
from placement_rl.zoo.gpt import MEGATRON_SEQ_LEN, MEGATRON_TABLE1, MEGATRON_VOCAB_SIZE, MegatronRow, paper_flops

#: Within this relative error of the published figure a row counts as reproduced.
TOLERANCE = 0.15
#: Rows above this many simulated tasks are skipped (override with ``--max-tasks``).
DEFAULT_MAX_TASKS = 8_000_000


def estimated_tasks(row: MegatronRow, num_ops: int, micro_batches: int) -> int:
    """Compute tasks (forward and backward, plus a host task each) of a row's simulation, roughly:
    every op runs once per micro-batch on one GPU of each stage (one data-parallel replica and one
    tensor-parallel rank are simulated: :func:`placement_rl.sim.replicas.simulate_replica`)."""
    return 4 * num_ops * micro_batches


def run_row(
    row: MegatronRow, micro_batch_size: int, virtual_stages: int, max_tasks: int, cost: CostModel | None = None
) -> dict[str, Any]:
    """Simulate one Table 1 row; the JSON-friendly figures."""
    tp, pp = row.tensor_parallel, row.pipeline_parallel
    dp = row.num_gpus // (tp * pp)
    # without a pipeline the micro-batch count changes no schedule (gradient accumulation only): one
    micro_batches = max(row.batch_size // (dp * micro_batch_size), 1) if pp > 1 else 1
    out: dict[str, Any] = {
        "params_b": row.params_b,
        "gpus": row.num_gpus,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "data_parallel": dp,
        "batch_size": row.batch_size,
        "micro_batches": micro_batches,
        "published_tflops_per_gpu": row.achieved_tflops_per_gpu,
    }
    start = time.process_time()
    graph = zoo.load("gpt", batch_size=row.batch_size, **row.options())
    tasks = estimated_tasks(row, graph.num_ops, micro_batches)
    if tasks > max_tasks:
        out.update(
            skipped=f"about {tasks:,} tasks (more than --max-tasks {max_tasks:,}): the simulator does not yet "
            "simulate identical pipeline stages once",
            estimated_tasks=tasks,
            simulated_tflops_per_gpu=None,
        )
        return out
    topology = load_preset(f"dgx-a100-x{row.num_gpus // 8}")
    v = virtual_stages if pp > 1 else 1
    share = row.batch_size // dp
    while True:
        plan = megatron(
            graph,
            topology,
            tp=tp,
            pp=pp,
            dp=dp,
            micro_batches=micro_batches,
            schedule="interleaved" if v > 1 else "1f1b",
            virtual_stages=v,
            recompute="full",
        )
        result = simulate_replica(graph, topology, plan, dp, cost or CostModel(precision="bf16-mixed"), tp=tp)
        # without a pipeline, a share that does not fit is accumulated in more micro-batches, as
        # Megatron-LM does (the iteration's work is the same)
        more = [d for d in range(micro_batches + 1, share + 1) if share % d == 0]
        if not result.oom or pp > 1 or not more or estimated_tasks(row, graph.num_ops, more[0]) > max_tasks:
            break
        micro_batches = more[0]
    out["micro_batches"] = micro_batches
    flops = paper_flops(
        batch_size=row.batch_size,
        num_layers=row.num_layers,
        hidden=row.hidden,
        vocab_size=MEGATRON_VOCAB_SIZE,
        seq_len=MEGATRON_SEQ_LEN,
        recompute=True,
    )
    tflops = flops / result.makespan_s / row.num_gpus / 1e12
    ratio = tflops / row.achieved_tflops_per_gpu
    out.update(
        simulated_tflops_per_gpu=round(tflops, 2),
        ratio=round(ratio, 4),
        within_tolerance=abs(ratio - 1.0) <= TOLERANCE,
        makespan_s=round(result.makespan_s, 4),
        peak_memory_gib=round(float(result.peak_memory_bytes.max()) / 2**30, 2),
        oom=result.oom,
        tasks=len(result.tasks),
        cpu_seconds=round(time.process_time() - start, 1),
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=None, help="comma-separated sizes in billions (default: every row)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per row")
    parser.add_argument("--micro-batch-size", type=int, default=1, help="sequences per micro-batch (default 1)")
    parser.add_argument("--virtual-stages", type=int, default=1, help="interleaved stages per GPU group (default 1)")
    parser.add_argument("--max-tasks", type=int, default=DEFAULT_MAX_TASKS, help="skip rows needing more tasks")
    parser.add_argument("--calibration", type=calibration_spec, default="default", help=CALIBRATION_HELP)
    args = parser.parse_args(argv)
    cost = CostModel(precision="bf16-mixed", calibration=calibration(args.calibration))
    rows = MEGATRON_TABLE1
    if args.rows:
        try:
            wanted = {float(x) for x in args.rows.split(",")}
        except ValueError:
            wanted = {math.nan}
        if not all(math.isfinite(x) for x in wanted):
            parser.error(f"--rows: {args.rows!r}; expected comma-separated sizes in billions of parameters, of "
                         f"{[r.params_b for r in MEGATRON_TABLE1]}")  # fmt: skip
        rows = tuple(r for r in rows if r.params_b in wanted)
        missing = wanted - {r.params_b for r in rows}
        if missing:
            parser.error(f"--rows: no Table 1 row of {sorted(missing)} billion parameters; rows: "
                         f"{[r.params_b for r in MEGATRON_TABLE1]}")  # fmt: skip
    if args.micro_batch_size < 1 or args.virtual_stages < 1:
        parser.error("--micro-batch-size and --virtual-stages must be positive integers")
    if args.max_tasks < 1:
        parser.error(f"--max-tasks {args.max_tasks}; expected a positive number of tasks")
    if not args.json:
        print(f"{'params':>8} {'GPUs':>5} {'t':>2} {'p':>3} {'d':>3} {'m':>5} {'published':>9} {'simulated':>9} "
              f"{'ratio':>6}  note")  # fmt: skip
    for row in rows:
        figures = run_row(row, args.micro_batch_size, args.virtual_stages, args.max_tasks, cost)
        if args.json:
            print(json.dumps(figures), flush=True)
            continue
        sim = figures["simulated_tflops_per_gpu"]
        simulated = "-" if sim is None else f"{sim:.1f}"
        ratio = "-" if sim is None else f"{figures['ratio']:.2f}"
        note = figures.get("skipped", "") or ("OUT OF MEMORY" if figures.get("oom") else "")
        print(
            f"{row.params_b:>7}B {row.num_gpus:>5} {figures['tensor_parallel']:>2} {figures['pipeline_parallel']:>3} "
            f"{figures['data_parallel']:>3} {figures['micro_batches']:>5} {row.achieved_tflops_per_gpu:>9} "
            f"{simulated:>9} {ratio:>6}  {note}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

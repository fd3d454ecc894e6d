"""TAG Table 5: per-iteration time without and with sufficient factor broadcasting (SFB).

Usage::

    python benchmarks/sfb.py                                   # the six models, DP-NCCL rows
    python benchmarks/sfb.py --models transformer,bert_small   # a subset
    python benchmarks/sfb.py --plan-method NAME                # also rows for a registered method's plan
    python benchmarks/sfb.py --checkpoint CKPT                 # also rows for a trained TAG policy's plan

TAG's setting (sec. 5.6): two machines with one GTX 1080Ti each, batch 4 for every model. Each GPU
sits on its machine's PCIe switch, and the two switches join an Ethernet switch at
``--bandwidth-gbps`` (100 Gb/s, TAG's testbed). DP-NCCL is data parallelism with every gradient
all-reduced on its own (``data_parallel_per_tensor``); "with SFB" is that plan after
:func:`placement_rl.search.sfb.apply_sfb` (the SFB program per gradient, sync ``sfb`` where it pays).
``--plan-method`` adds the same two rows for the plan of any method registered in
:mod:`placement_rl.methods` (e.g. the TAG agent once registered), obtained through
``compare_methods``; ``--checkpoint`` adds them for the plan of a trained agent (``tag``: MCTS
with the GNN prior). The paper's figures (Table 5, seconds) are printed beside ours.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from placement_rl import zoo
from placement_rl.methods import Method, compare_methods, get_method
from placement_rl.plan import Plan, data_parallel_per_tensor
from placement_rl.search.sfb import apply_sfb, sfb_decisions
from placement_rl.sim import CostModel
from placement_rl.sim.simulator import SimContext
from placement_rl.topology import DeviceTopology
from placement_rl.topology.builder import TopologyBuilder, switched_machine
from placement_rl.topology.devices import gbit_to_bytes_per_s

MODELS = ("inception_v3", "resnet101", "vgg19", "transformer", "bert_small", "bert_large")
#: TAG Table 5, seconds per iteration: (DP-NCCL without, with SFB, TAG without, with SFB).
PAPER_S: dict[str, tuple[float, float, float, float]] = {
    "inception_v3": (0.0898, 0.0452, 0.0775, 0.0420),
    "resnet101": (0.1122, 0.0854, 0.0508, 0.0490),
    "vgg19": (0.1195, 0.1192, 0.1167, 0.1169),
    "transformer": (0.1199, 0.0455, 0.0521, 0.0451),
    "bert_small": (0.0618, 0.0546, 0.0597, 0.0535),
    "bert_large": (0.4576, 0.4317, 0.4331, 0.4266),
}
BATCH_SIZE = 4


def table5_topology(bandwidth_gbps: float = 100.0) -> DeviceTopology:
    """Two machines with one GTX 1080Ti each, joined through an Ethernet switch at ``bandwidth_gbps``."""
    b = TopologyBuilder()
    eth = (b.switch("eth-switch"), gbit_to_bytes_per_s(bandwidth_gbps), "ethernet")
    for _ in range(2):
        switched_machine(b, "GTX-1080Ti", 1, eth)  # type: ignore[arg-type]
    return b.build(f"2x1-gtx1080ti-{bandwidth_gbps:g}gbps")


def rows_for(label: str, model: str, plan: Plan, ctx: SimContext, paper: tuple[float, float] | None) -> list[str]:
    """Two markdown rows (without, with SFB) for one plan."""
    graph, topo = ctx.graph, ctx.topology
    choices = sfb_decisions(graph, topo, plan, ctx.cost)
    with_sfb = apply_sfb(graph, topo, plan, ctx.cost, choices=choices)
    before, after = ctx.simulate(plan), ctx.simulate(with_sfb)
    speedup = before.makespan_s / after.makespan_s - 1.0
    used = sum(ch.uses_sfb for ch in choices)
    paper_cells = ["", ""] if paper is None else [f"{paper[0] * 1e3:.1f}", f"{paper[1] * 1e3:.1f}"]
    paper_speedup = "" if paper is None else f"{(paper[0] / paper[1] - 1) * 100:.1f}%"
    return [
        f"| {model} | {label} | {before.makespan_s * 1e3:.1f} | {after.makespan_s * 1e3:.1f} | {speedup * 100:.1f}% "
        f"| {used}/{len(choices)} | {before.comm_bytes / 2**20:.3f} | {after.comm_bytes / 2**20:.3f} "
        f"| {paper_cells[0]} | {paper_cells[1]} | {paper_speedup} |"
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo models")
    parser.add_argument("--bandwidth-gbps", type=float, default=100.0, help="inter-machine bandwidth (Gb/s)")
    parser.add_argument("--plan-method", default=None, help="also the rows of this registered method's plan")
    parser.add_argument("--checkpoint", default=None, help="also the rows of a trained agent's plan (its checkpoint)")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in zoo.names():
            parser.error(f"unknown model {m!r}; expected one of: {', '.join(zoo.names())}")
    methods: list[str | Method] = []
    if args.plan_method is not None:
        methods.append(get_method(args.plan_method))  # an unknown name fails here, before any work
    if args.checkpoint is not None:
        from placement_rl.rl.policy import policy_method

        methods.append(policy_method(args.checkpoint))
    topo = table5_topology(args.bandwidth_gbps)
    cost = CostModel()
    print(
        f"TAG Table 5 setting: {topo.name}, batch {BATCH_SIZE}; per-iteration ms (simulated) and MiB "
        "communicated per iteration; paper: TAG Table 5 (measured)\n"
    )
    print(
        "| model | plan | without SFB (ms) | with SFB (ms) | speedup | SFB gradients | MiB without | MiB with "
        "| paper without (ms) | paper with (ms) | paper speedup |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        graph = zoo.load(model, batch_size=BATCH_SIZE)
        ctx = SimContext(graph, topo, cost)
        paper = PAPER_S.get(model)
        for line in rows_for("DP-NCCL", model, data_parallel_per_tensor(graph, topo), ctx, paper and paper[:2]):
            print(line, flush=True)
        for method in methods:
            assert not isinstance(method, str)
            found = compare_methods(graph, topo, [method], cost_model=cost)[0]
            tag_paper = paper[2:] if paper and method.name.startswith(("tag", "mcts")) else None
            for line in rows_for(method.name, model, found.plan, ctx, tag_paper):
                print(line, flush=True)


if __name__ == "__main__":
    main()

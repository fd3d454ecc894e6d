"""Trinity results (mirrors Trinity Table 4) and zero-shot evaluation on unseen topologies.

    python benchmarks/trinity.py table [--iterations 30]   # per model x preset: train, then compare
    python benchmarks/trinity.py zero-shot [--iterations 20] [--topologies 10] [--model vgg19]

``table`` trains one policy per (model, preset) from ``tune_configs/trinity_ppo.yaml`` with the
generator fixed to that instance, then prints the learned plan next to single GPU, data parallel,
expert and MCMC. MCMC gets the same wall-clock time the training took ("search s" of the learned
plan). Runtime is the simulated iteration time; "comm" the bytes on the busiest link (Trinity's peak
communication); "memory" the largest device peak.

``zero-shot`` trains on random topologies of the train split (the shipped config's model) and
evaluates the policy, without further training, on the first topologies of the test split.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from placement_rl import simulate, zoo
from placement_rl.plan import data_parallel, expert, single_device
from placement_rl.rl.config import load_train_config
from placement_rl.rl.trinity import load_policy, policy_plan, train
from placement_rl.search import mcmc
from placement_rl.topology import load_preset

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    ("inception_v3", "trinity"),
    ("gnmt", "trinity"),
    ("vgg19", "trinity"),
    ("inception_v3", "tag-testbed"),
    ("gnmt", "tag-testbed"),
    ("vgg19", "tag-testbed"),
]


def _row(model: str, preset: str, method: str, result, dp_s: float, search_s: float) -> str:  # type: ignore[no-untyped-def]
    comm_gb = float(result.link_bytes.max()) / 1e9 if result.link_bytes.size else 0.0
    oom = " (OOM)" if result.oom else ""
    return (
        f"| {model} | {preset} | {method} | {result.makespan_s * 1e3:,.1f}{oom} | {dp_s / result.makespan_s:.2f}x | "
        f"{comm_gb:.2f} | {result.peak_memory_bytes.max() / 2**30:.2f} | {search_s:.1f} |"
    )


def table(iterations: int, out: Path) -> None:
    import gymnasium as gym

    base = load_train_config(ROOT / "tune_configs" / "trinity_ppo.yaml")
    print("| model | cluster | method | runtime ms | vs DP | peak comm GB | peak memory GiB | search s |")
    print("|---|---|---|---|---|---|---|---|")
    for model, preset in CASES:
        topo = load_preset(preset)
        env_cfg = {**base.env, "generator": {"kind": "fixed", "model": model, "topology": preset}}
        cfg = dataclasses.replace(
            base,
            name=f"trinity-{model}-{preset}",
            env=env_cfg,
            run=dataclasses.replace(base.run, iterations=iterations),
        )
        start = time.perf_counter()
        run_dir = train(cfg, out_dir=out / cfg.name, progress=None)
        train_s = time.perf_counter() - start
        module, _ = load_policy(run_dir / "checkpoint_final")
        env = gym.make("placement_rl/Placement-v0", config=env_cfg)
        info = policy_plan(module, env)
        graph = zoo.load(model)
        dp = simulate(graph, topo, data_parallel(graph, topo))
        rows = [
            ("single GPU", simulate(graph, topo, single_device(graph, topo)), 0.0),
            ("data parallel", dp, 0.0),
            ("expert", simulate(graph, topo, expert(graph, topo)), 0.0),
        ]
        t = time.perf_counter()
        found = mcmc(graph, topo, budget=f"{train_s:.0f}s", seed=0, progress=False)
        rows.append((f"MCMC ({train_s:.0f} s)", found.result, time.perf_counter() - t))
        rows.append(("Trinity (learned)", simulate(graph, topo, info["plan"]), train_s + info["search_s"]))
        for method, result, search_s in rows:
            print(_row(model, preset, method, result, dp.makespan_s, search_s), flush=True)


def zero_shot(iterations: int, count: int, out: Path, model: str | None) -> None:
    from placement_rl.rl.evaluate import evaluate

    base = load_train_config(ROOT / "tune_configs" / "trinity_ppo.yaml")
    model = model or base.env["generator"]["model"]
    env_cfg = {
        **base.env,
        "generator": {"kind": "random", "models": [model], "topology_split": "train", "num_topologies": 200},
    }
    cfg = dataclasses.replace(
        base, name=f"trinity-{model}-random", env=env_cfg, run=dataclasses.replace(base.run, iterations=iterations)
    )
    run_dir = train(cfg, out_dir=out / cfg.name, progress=print)
    from placement_rl.topology import topology_seeds

    topologies = [f"random:{s}" for s in topology_seeds("test", count)]
    rows = evaluate(str(run_dir / "checkpoint_final"), topologies, [model], mcmc_budget="5s")
    print("| instance | policy vs DP | expert vs DP | MCMC (5 s) vs DP | policy OOM |")
    print("|---|---|---|---|---|")
    wins = 0
    for inst in dict.fromkeys(r.instance for r in rows):
        by = {r.method: r for r in rows if r.instance == inst}
        p = by["policy"]
        wins += p.speedup > 1 and not p.oom
        print(
            f"| {inst} | {p.speedup:.2f}x | {by['expert'].speedup:.2f}x | {by['mcmc'].speedup:.2f}x | {'yes' if p.oom else 'no'} |"
        )
    print(f"policy beats data parallel on {wins}/{count} unseen topologies")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["table", "zero-shot"])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--topologies", type=int, default=10)
    parser.add_argument("--out", default="out/benchmarks")
    parser.add_argument("--model", default=None, help="zero-shot: the zoo model (default: the shipped config's)")
    args = parser.parse_args()
    if args.what == "table":
        table(args.iterations, Path(args.out))
    else:
        zero_shot(args.iterations, args.topologies, Path(args.out), args.model)


if __name__ == "__main__":
    main()

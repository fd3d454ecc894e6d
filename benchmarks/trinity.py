"""Trinity results (mirrors Trinity Table 4) and zero-shot evaluation on unseen topologies.

    python benchmarks/trinity.py table [--iterations 30] [--cases vgg19@trinity,...]   # train, then compare
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

from placement_rl import zoo
from placement_rl.methods import MethodResult, compare_methods
from placement_rl.rl.agents import policy_method
from placement_rl.rl.config import load_train_config
from placement_rl.rl.train import train
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
LABELS = {
    "single_device": "single GPU",
    "data_parallel": "data parallel",
    "expert": "expert",
    "trinity": "Trinity (learned)",
}


def _row(model: str, preset: str, r: MethodResult, label: str, search_s: float) -> str:
    oom = " (OOM)" if r.oom else ""
    return (
        f"| {model} | {preset} | {label} | {r.makespan_s * 1e3:,.1f}{oom} | {r.speedup_over_dp:.2f}x | "
        f"{r.busiest_link_bytes / 1e9:.2f} | {r.max_peak_memory_bytes / 2**30:.2f} | {search_s:.1f} |"
    )


DEFAULT_CONFIG = ROOT / "tune_configs" / "trinity_ppo.yaml"


def table(iterations: int, out: Path, cases: list[tuple[str, str]], config: Path = DEFAULT_CONFIG) -> None:
    base = load_train_config(config)
    print("| model | cluster | method | runtime ms | vs DP | peak comm GB | peak memory GiB | search s |")
    print("|---|---|---|---|---|---|---|---|")
    for model, preset in cases:
        env_cfg = {**base.env, "generator": {"kind": "fixed", "model": model, "topology": preset}}
        cfg = base.replace(
            name=f"trinity-{model}-{preset}", env=env_cfg, run=dataclasses.replace(base.run, iterations=iterations)
        )
        start = time.perf_counter()
        run_dir = train(cfg, out_dir=out / cfg.name, progress=None)
        train_s = time.perf_counter() - start
        methods = ["single_device", "data_parallel", "expert", "mcmc", policy_method(run_dir / "checkpoint_final")]
        options = {
            "mcmc": {"budget": f"{max(train_s, 1):.0f}s", "seed": 0, "initial": ("data_parallel", "expert", "random")}
        }
        for r in compare_methods(zoo.load(model), load_preset(preset), methods, options=options):
            label = f"MCMC ({max(train_s, 1):.0f} s)" if r.method == "mcmc" else LABELS[r.method]
            search_s = r.search_s + (train_s if r.method == "trinity" else 0.0)  # the policy's search is its training
            print(_row(model, preset, r, label, search_s), flush=True)


def zero_shot(iterations: int, count: int, out: Path, model: str | None, config: Path = DEFAULT_CONFIG) -> None:
    from placement_rl.rl.evaluate import evaluate

    base = load_train_config(config)
    model = model or base.env["generator"]["model"]
    env_cfg = {
        **base.env,
        "generator": {"kind": "random", "models": [model], "topology_split": "train", "num_topologies": 200},
    }
    cfg = base.replace(
        name=f"trinity-{model}-random", env=env_cfg, run=dataclasses.replace(base.run, iterations=iterations)
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
        p = by["trinity"]
        wins += p.speedup_over_dp > 1 and not p.oom
        print(
            f"| {inst} | {p.speedup_over_dp:.2f}x | {by['expert'].speedup_over_dp:.2f}x | "
            f"{by['mcmc'].speedup_over_dp:.2f}x | {'yes' if p.oom else 'no'} |"
        )
    print(f"policy beats data parallel on {wins}/{count} unseen topologies")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["table", "zero-shot"])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--topologies", type=int, default=10)
    parser.add_argument("--out", default="out/benchmarks")
    parser.add_argument("--model", default=None, help="zero-shot: the zoo model (default: the shipped config's)")
    parser.add_argument(
        "--cases",
        default=",".join(f"{m}@{t}" for m, t in CASES),
        help="table: comma-separated MODEL@PRESET instances (default: the six of Trinity Table 4's mirror)",
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the training YAML the runs start from")
    args = parser.parse_args(argv)
    if args.what == "table":
        cases = [tuple(c.split("@", 1)) for c in args.cases.split(",")]
        table(args.iterations, Path(args.out), cases, args.config)  # type: ignore[arg-type]
    else:
        zero_shot(args.iterations, args.topologies, Path(args.out), args.model, args.config)


if __name__ == "__main__":
    main()

"""Trinity results (mirrors Trinity Table 4) and zero-shot evaluation on unseen topologies.

    python benchmarks/trinity.py table [--iterations 30] [--cases vgg19@trinity,...]   # train, then compare
    python benchmarks/trinity.py zero-shot [--iterations 20] [--topologies 10] [--model vgg19]
    python benchmarks/trinity.py table --agent ppo_tag --checkpoint out/ppo-tag-zoo-random/checkpoint_final
    python benchmarks/trinity.py zero-shot --agent ppo_tag --checkpoint CKPT --models vgg19,resnet50 --topologies 20
    python benchmarks/trinity.py table --calibration roofline ...   # another GPU model (default: as configured)

``--agent`` picks the learned agent (its default training YAML: ``tune_configs/trinity_ppo.yaml``
or ``tune_configs/ppo_tag.yaml``). With ``--checkpoint`` nothing is trained: ``table`` plans each
case with that (zero-shot) policy and gives MCMC the policy's planning wall-clock (at least 1 s);
``zero-shot`` evaluates it on the first test-split topologies.

``table`` trains one policy per (model, preset) from ``tune_configs/trinity_ppo.yaml`` with the
generator fixed to that instance, then prints the learned plan next to single GPU, data parallel,
expert and MCMC. MCMC gets the same wall-clock time the training took ("search s" of the learned
plan). Runtime is the simulated iteration time; "comm" the bytes on the busiest link (Trinity's peak
communication); "memory" the largest device peak.

``zero-shot`` trains on random topologies of the train split (the shipped config's model) and
evaluates the policy, without further training, on the first topologies of the test split.

``--calibration`` (``default``, ``roofline`` for the tables measured before the shipped fit, or a
calibration file) picks the GPU model: a policy trained here trains under it (the training YAML's env
cost model takes that calibration, its other settings kept) and every plan of the tables is simulated
under it. A ``--checkpoint`` policy plans in its env as it was trained; its plans are simulated under
the chosen model. Without the option, the YAML's env is as it says (the shipped ones: the default
model) and the plans are simulated under the default model.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from placement_rl import zoo
from placement_rl.cli.common import CALIBRATION_HELP, calibrated_cost_model, calibration_spec, env_with_calibration
from placement_rl.methods import MethodResult, compare_methods
from placement_rl.rl.config import load_train_config
from placement_rl.rl.policy import policy_method
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
    "ppo_tag": "ppo_tag (learned)",
}
#: The training YAML each learned agent starts from by default.
AGENT_CONFIGS = {"trinity": "trinity_ppo.yaml", "ppo_tag": "ppo_tag.yaml"}


def _row(model: str, preset: str, r: MethodResult, label: str, search_s: float) -> str:
    oom = " (OOM)" if r.oom else ""
    return (
        f"| {model} | {preset} | {label} | {r.makespan_s * 1e3:,.1f}{oom} | {r.speedup_over_dp:.2f}x | "
        f"{r.busiest_link_bytes / 1e9:.2f} | {r.max_peak_memory_bytes / 2**30:.2f} | {search_s:.1f} |"
    )


DEFAULT_CONFIG = ROOT / "tune_configs" / "trinity_ppo.yaml"


def table_checkpoint(checkpoint: Path, cases: list[tuple[str, str]], gpu_model: str | None = None) -> None:
    """The cases planned by a trained policy, next to the baselines and MCMC at the policy's planning time;
    every plan simulated under the ``--calibration`` ``gpu_model`` (``None``: the default model)."""
    from placement_rl.rl.policy import load_policy

    policy = load_policy(checkpoint)
    method = policy_method(policy)
    cost = calibrated_cost_model(gpu_model)
    print("| model | cluster | method | runtime ms | vs DP | peak comm GB | peak memory GiB | search s |")
    print("|---|---|---|---|---|---|---|---|")
    for model, preset in cases:
        graph, topology = zoo.load(model), load_preset(preset)
        (learned,) = compare_methods(graph, topology, [method], cost_model=cost)
        budget_s = max(learned.search_s, 1.0)
        options = {"mcmc": {"budget": f"{budget_s:.1f}s", "seed": 0, "initial": ("data_parallel", "expert", "random")}}
        baselines = ["single_device", "data_parallel", "expert", "mcmc"]
        rows = compare_methods(graph, topology, baselines, cost_model=cost, options=options)
        for r in [*rows, learned]:
            label = f"MCMC ({budget_s:.1f} s)" if r.method == "mcmc" else LABELS[r.method]
            print(_row(model, preset, r, label, r.search_s), flush=True)


def table(
    iterations: int,
    out: Path,
    cases: list[tuple[str, str]],
    config: Path = DEFAULT_CONFIG,
    gpu_model: str | None = None,
) -> None:
    base = load_train_config(config)
    if gpu_model is not None:
        base = base.replace(env=env_with_calibration(base.env, gpu_model))
    cost = calibrated_cost_model(gpu_model)
    print("| model | cluster | method | runtime ms | vs DP | peak comm GB | peak memory GiB | search s |")
    print("|---|---|---|---|---|---|---|---|")
    for model, preset in cases:
        env_cfg = {**base.env, "generator": {"kind": "fixed", "model": model, "topology": preset}}
        cfg = base.replace(
            name=f"{base.agent}-{model}-{preset}", env=env_cfg, run=dataclasses.replace(base.run, iterations=iterations)
        )
        start = time.perf_counter()
        run_dir = train(cfg, out_dir=out / cfg.name, progress=None)
        train_s = time.perf_counter() - start
        methods = ["single_device", "data_parallel", "expert", "mcmc", policy_method(run_dir / "checkpoint_final")]
        options = {
            "mcmc": {"budget": f"{max(train_s, 1):.0f}s", "seed": 0, "initial": ("data_parallel", "expert", "random")}
        }
        for r in compare_methods(zoo.load(model), load_preset(preset), methods, cost_model=cost, options=options):
            label = f"MCMC ({max(train_s, 1):.0f} s)" if r.method == "mcmc" else LABELS[r.method]
            search_s = r.search_s + (train_s if r.method == base.agent else 0.0)  # the policy's search is its training
            print(_row(model, preset, r, label, search_s), flush=True)


def zero_shot(
    iterations: int,
    count: int,
    out: Path,
    models: list[str] | None,
    config: Path = DEFAULT_CONFIG,
    checkpoint: Path | None = None,
    mcmc_budget: str | None = "5s",
    gpu_model: str | None = None,
) -> None:
    from placement_rl.rl.evaluate import evaluate
    from placement_rl.topology import topology_seeds

    base = load_train_config(config)
    if gpu_model is not None:
        base = base.replace(env=env_with_calibration(base.env, gpu_model))
    if checkpoint is None:
        models = models or [base.env["generator"]["model"]]
        env_cfg = {
            **base.env,
            "generator": {"kind": "random", "models": models, "topology_split": "train", "num_topologies": 200},
        }
        cfg = base.replace(
            name=f"{base.agent}-{'-'.join(models)}-random",
            env=env_cfg,
            run=dataclasses.replace(base.run, iterations=iterations),
        )
        checkpoint = train(cfg, out_dir=out / cfg.name, progress=print) / "checkpoint_final"
    topologies = [f"random:{s}" for s in topology_seeds("test", count)]
    rows = evaluate(
        str(checkpoint), topologies, models, mcmc_budget=mcmc_budget, cost_model=calibrated_cost_model(gpu_model)
    )
    agent = next(r.method for r in rows if r.method not in ("data_parallel", "expert", "mcmc"))
    mcmc = f"MCMC ({mcmc_budget}) vs DP" if mcmc_budget else None
    print(f"| instance | policy vs DP | expert vs DP | {mcmc + ' | ' if mcmc else ''}policy OOM |")
    print("|---|---|---|" + ("---|" if mcmc else "") + "---|")
    wins: dict[str, int] = {}
    ooms: dict[str, int] = {}
    for inst in dict.fromkeys(r.instance for r in rows):
        by = {r.method: r for r in rows if r.instance == inst}
        p = by[agent]
        model = inst.split("@")[0]
        wins[model] = wins.get(model, 0) + int(p.speedup_over_dp > 1 and not p.oom)
        ooms[model] = ooms.get(model, 0) + int(p.oom)
        cells = [f"{p.speedup_over_dp:.2f}x", f"{by['expert'].speedup_over_dp:.2f}x"]
        if mcmc:
            cells.append(f"{by['mcmc'].speedup_over_dp:.2f}x")
        print(f"| {inst} | " + " | ".join(cells) + f" | {'yes' if p.oom else 'no'} |")
    for model in wins:
        print(
            f"{model}: the policy beats data parallel on {wins[model]}/{count} unseen topologies; "
            f"{ooms[model]} plans out of memory"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["table", "zero-shot"])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--topologies", type=int, default=10)
    parser.add_argument("--out", default="out/benchmarks")
    parser.add_argument("--model", default=None, help="zero-shot: the zoo model (default: the shipped config's)")
    parser.add_argument("--models", default=None, help="zero-shot: comma-separated zoo models (instead of --model)")
    parser.add_argument("--agent", default="trinity", choices=sorted(AGENT_CONFIGS), help="the learned agent")
    parser.add_argument("--checkpoint", type=Path, default=None, help="a trained policy: evaluate it, train nothing")
    parser.add_argument("--mcmc-budget", default="5s", help="zero-shot: MCMC's budget per instance, or 'none'")
    parser.add_argument(
        "--cases",
        default=",".join(f"{m}@{t}" for m, t in CASES),
        help="table: comma-separated MODEL@PRESET instances (default: the six of Trinity Table 4's mirror)",
    )
    parser.add_argument("--config", type=Path, default=None, help="the training YAML (default: the agent's)")
    parser.add_argument(
        "--calibration",
        type=calibration_spec,
        default=None,
        help=f"{CALIBRATION_HELP}; default: the training YAML's env as it says, plans judged under the default "
        "model; a --checkpoint policy plans as trained, its plans simulated under the chosen model",
    )
    args = parser.parse_args(argv)
    config = args.config or ROOT / "tune_configs" / AGENT_CONFIGS[args.agent]
    if args.what == "table":
        cases = [tuple(c.split("@", 1)) for c in args.cases.split(",")]
        if args.checkpoint is not None:
            table_checkpoint(args.checkpoint, cases, args.calibration)  # type: ignore[arg-type]
        else:
            table(args.iterations, Path(args.out), cases, config, args.calibration)  # type: ignore[arg-type]
    else:
        models = args.models.split(",") if args.models else [args.model] if args.model else None
        budget = None if args.mcmc_budget == "none" else args.mcmc_budget
        zero_shot(
            args.iterations, args.topologies, Path(args.out), models, config, args.checkpoint, budget, args.calibration
        )


if __name__ == "__main__":
    main()

"""``placement-rl train`` / ``tune`` / ``evaluate``: learned agents on RLlib (any registered agent)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from placement_rl.cli.common import (
    env_overrides,
    json_parser,
    name_list,
    optional_budget,
    path,
    positive_int,
    print_json,
    print_table,
)


def cmd_train(args: argparse.Namespace) -> None:
    from placement_rl.rl.config import load_train_config
    from placement_rl.rl.train import train

    cfg = load_train_config(args.config)
    if args.iterations is not None:
        import dataclasses

        cfg = cfg.replace(run=dataclasses.replace(cfg.run, iterations=args.iterations))
    run_dir = train(cfg, out_dir=args.out_dir, resume=args.resume)
    print(f"wrote {run_dir} (checkpoint_final/, progress.csv, tb/, learning_curve.png)")


def cmd_tune(args: argparse.Namespace) -> None:
    from placement_rl.rl.config import load_sweep_config
    from placement_rl.rl.train import sweep

    out = sweep(load_sweep_config(args.config, args.set))
    print(f"wrote {out / 'results.csv'} and {out / 'best_config.yaml'}")


def topology_list(spec: str) -> list[str]:
    """``test`` / ``train`` (10 random topologies of that split), ``test:N`` / ``train:N``, or comma-separated specs."""
    from placement_rl.topology import topology_seeds

    if spec in ("test", "train"):
        return [f"random:{s}" for s in topology_seeds(spec, 10)]  # type: ignore[arg-type]
    if spec.startswith(("test:", "train:")):
        split, _, count = spec.partition(":")
        if not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"{spec!r}: expected '{split}:COUNT' with a positive COUNT")
        return [f"random:{s}" for s in topology_seeds(split, int(count))]  # type: ignore[arg-type]
    return name_list(spec)


#: A policy beats data parallelism on an instance only when it is faster by more than this share;
#: within it, the two are tied (simulated differences this small are noise of the plan's details).
WIN_TOLERANCE = 0.01


def cmd_evaluate(args: argparse.Namespace) -> None:
    from placement_rl.rl.evaluate import evaluate_cells

    cells = evaluate_cells(
        args.checkpoint,
        args.topologies,
        args.models,
        mcmc_budget=args.mcmc_budget,
        env=args.env,
        progress=None if args.json else lambda line: print(line, file=sys.stderr),
    )
    rows = [m.result for m in cells]
    policy = rows[0].method if rows else "policy"
    instances = list(dict.fromkeys(m.row["instance"] for m in cells))
    mine = [r for r in rows if r.method == policy]
    wins = sum(1 for r in mine if not r.oom and r.speedup_over_dp > 1.0 + WIN_TOLERANCE)
    ties = sum(1 for r in mine if not r.oom and abs(r.speedup_over_dp - 1.0) <= WIN_TOLERANCE)
    if args.json:
        print_json(
            {
                "rows": [m.row for m in cells],
                "instances": len(instances),
                "policy_beats_dp": wins,
                "policy_ties_dp": ties,
                "win_tolerance": WIN_TOLERANCE,
            }
        )
        return
    print_table(
        ["instance", "method", "ms/iter", "vs DP", "peak mem GiB", "comm GB", "OOM", "search s"],
        [
            [
                m.row["instance"],
                r.method,
                f"{r.makespan_s * 1e3:,.2f}",
                f"{r.speedup_over_dp:.2f}x",
                f"{r.max_peak_memory_bytes / 2**30:.2f}",
                f"{r.result.comm_bytes / 1e9:.3f}",
                "yes" if r.oom else "no",
                f"{r.search_s:.2f}",
            ]
            for m, r in zip(cells, rows, strict=True)
        ],
    )
    budget = args.mcmc_budget or "off"
    print(
        f"{policy} beats data parallel on {wins}/{len(instances)} instances by more than {WIN_TOLERANCE:.0%} and ties "
        f"(within {WIN_TOLERANCE:.0%}) on {ties} (MCMC budget {budget})"
    )


def add_commands(sub: Any) -> None:
    """Add this module's commands to the ``placement-rl`` sub-parsers."""
    p = sub.add_parser("train", help="train a learned agent (Trinity: PPO on RLlib) from a YAML config")
    p.add_argument("config", help="training YAML, e.g. tune_configs/trinity_ppo.yaml")
    p.add_argument("--iterations", type=positive_int, default=None, help="override run.iterations")
    p.add_argument("--out-dir", type=path, default=None, help="override run.output_dir")
    p.add_argument(
        "--resume",
        type=path,
        default=None,
        metavar="CHECKPOINT",
        help="continue from an RLlib checkpoint folder; it holds pickled state that runs code when loaded, "
        "so it must come from a trusted place (your own earlier run)",
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("tune", help="sweep an agent's hyperparameters with Ray Tune from a YAML config")
    p.add_argument("config", help="sweep YAML, e.g. tune_configs/trinity_sweep.yaml")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change the file's settings for this run (repeatable): a sweep option (num_samples=1), "
        "search.KEY={grid: [...]}, or a dotted key of the training config (run.iterations=2)",
    )
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser(
        "evaluate",
        parents=[json_parser()],
        help="run a trained policy on (unseen) topologies and models next to the baselines",
    )
    p.add_argument(
        "--checkpoint",
        type=path,
        required=True,
        help="a checkpoint_* folder of a training run (it must come from a trusted place)",
    )
    p.add_argument(
        "--topologies",
        type=topology_list,
        default="test",
        help="'test' / 'train' (10 random topologies of that split), 'test:N', or comma-separated specs",
    )
    p.add_argument(
        "--models", type=name_list, default=None, help="comma-separated zoo models (default: the training model)"
    )
    p.add_argument(
        "--mcmc-budget",
        type=optional_budget,
        default="2s",
        help="MCMC budget per instance ('2s', proposals, or 'none')",
    )
    p.add_argument(
        "--env",
        type=env_overrides,
        default={},
        metavar="KEY=VALUE,...",
        help="plan with these env options changed from training, e.g. max_groups=60 (a finer grouping than "
        "the policy trained at)",
    )
    p.set_defaults(func=cmd_evaluate)

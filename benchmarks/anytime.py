"""Anytime curves: the best plan found against wall-clock seconds, MCMC, PPO and TAG on the same instances.

    python benchmarks/anytime.py --instances vgg19@tag-testbed,inception_v3@tag-testbed --budget 120s --out docs/anytime
    python benchmarks/anytime.py --ppo-agent ppo_tag --ppo-config my_ppo_tag.yaml ...   # another PPO agent
    python benchmarks/anytime.py --tag-checkpoint out/tag/checkpoint_final ...          # adds TAG's GNN prior
    python benchmarks/anytime.py --calibration roofline ...                             # another GPU model

Every method gets the same wall-clock budget on each instance, one after the other:

* MCMC (FlexFlow, the registered ``mcmc`` method, one chain from data parallelism);
* TAG's tree search with the uniform prior (the ``mcts`` method) and, with ``--tag-checkpoint``,
  guided by the trained GNN prior;
* PPO trained on the instance alone (RLlib; ``--ppo-agent``, default ``trinity``; the config is
  ``--ppo-config``, default ``tune_configs/trinity_ppo.yaml`` for ``trinity``), keeping the best plan
  sampled: Trinity's own setting. Its clock includes building the algorithm. It samples in the driver
  (``--ppo-runners 0``) on one torch thread: one process on one core, like the searches.

Writes ``<instance>.png`` (best makespan ms against seconds, log x; data parallelism and the compute
bound as horizontal lines), ``anytime.json`` / ``anytime.csv`` (the curves) and ``results.md`` (the
table printed at the end: best ms, speedup over data parallelism, seconds to first beat it).

``--calibration`` (``default``, ``roofline`` for the tables measured before the shipped fit, or a
calibration file) sets the GPU model of every simulation: the one that judges every plan and that
MCMC and the uniform-prior search use, and the calibration of PPO's env and of the GNN-prior search's
env (their configs' cost models, other settings kept). Without it, plans are judged under the default
model and those two envs simulate as their configs say.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# Every method on one core: the searches are single-threaded, and torch's threads spin badly when the
# cores are shared (a PPO iteration went from 3 s to 60 s with two threads on two busy cores).
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from placement_rl.cli.common import CALIBRATION_HELP, calibration_spec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = {"trinity": ROOT / "tune_configs" / "trinity_ppo.yaml"}


def ppo_config(agent: str, path: Path | None, runners: int | None, gpu_model: str | None = None) -> object:
    """The training config of the PPO curve: ``path``, the agent's shipped config, or its defaults; its
    env's cost model with the ``--calibration`` ``gpu_model`` (``None``: as the config says)."""
    from placement_rl.cli.common import env_with_calibration
    from placement_rl.rl.config import TrainConfig, load_train_config

    path = path or DEFAULT_CONFIGS.get(agent)
    if path is not None:
        cfg = load_train_config(path)
        if cfg.agent != agent:
            raise SystemExit(f"--ppo-config {path}: it trains {cfg.agent!r}, but --ppo-agent is {agent!r}")
    else:
        cfg = TrainConfig.from_dict({"agent": agent, "name": f"{agent}-anytime"})
    if runners is not None:
        cfg = cfg.replace(run=dataclasses.replace(cfg.run, num_env_runners=runners))
    if gpu_model is not None:
        cfg = cfg.replace(env=env_with_calibration(cfg.env, gpu_model))
    return cfg


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", default="vgg19@tag-testbed,inception_v3@tag-testbed", help="MODEL@TOPOLOGY,...")
    parser.add_argument("--budget", default="120s", help="wall-clock seconds per method and instance")
    parser.add_argument("--out", type=Path, default=Path("out/anytime"))
    parser.add_argument("--methods", default="mcmc,mcts,ppo", help="any of mcmc, mcts, ppo (comma-separated)")
    parser.add_argument("--ppo-agent", default="trinity", help="a registered agent (trinity, ppo_tag, ...)")
    parser.add_argument("--ppo-config", type=Path, default=None, help="its training YAML")
    parser.add_argument(
        "--ppo-runners",
        type=int,
        default=0,
        help="EnvRunners (default 0: PPO samples in its one process, as the searches run)",
    )
    parser.add_argument("--tag-checkpoint", default=None, help="a tag checkpoint: adds the GNN-prior search")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--calibration",
        type=calibration_spec,
        default=None,
        help=f"{CALIBRATION_HELP}; default: plans judged under the default model, PPO's and the GNN-prior "
        "search's envs as their configs say",
    )
    args = parser.parse_args(argv)

    import torch

    from placement_rl import zoo
    from placement_rl.cli.common import calibrated_cost_model, policy_with_calibration
    from placement_rl.rl.anytime import anytime_benchmark, table_markdown
    from placement_rl.topology import resolve_topology

    wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(wanted) - {"mcmc", "mcts", "ppo"})
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; expected any of mcmc, mcts, ppo")
    instances = []
    for item in args.instances.split(","):
        model, at, topology = item.partition("@")
        if not at or not model or not topology:
            raise SystemExit(f"--instances: {item!r}; expected MODEL@TOPOLOGY, e.g. vgg19@tag-testbed")
        instances.append((zoo.load(model), resolve_topology(topology)))
    torch.set_num_threads(1)
    cfg = ppo_config(args.ppo_agent, args.ppo_config, args.ppo_runners, args.calibration) if "ppo" in wanted else None
    tag = args.tag_checkpoint
    if tag is not None and args.calibration is not None:
        from placement_rl.rl.policy import load_policy

        tag = policy_with_calibration(load_policy(tag), args.calibration)
    start = time.perf_counter()
    rows = anytime_benchmark(
        instances,
        args.budget,
        args.out,
        ppo=cfg,  # type: ignore[arg-type]
        tag_checkpoint=tag,
        searches=[m for m in ("mcmc", "mcts") if m in wanted],
        seed=args.seed,
        progress=lambda line: print(line, flush=True),
        cost_model=calibrated_cost_model(args.calibration),
    )
    print()
    print(table_markdown(rows), end="")
    print(f"\n{len(rows)} curves in {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

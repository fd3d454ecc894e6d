"""Environment benchmarks: steps per second and the reference agents' results.

    python benchmarks/envs.py steps [--episodes 20]    # steps/s, 60 groups x 16 devices, one core
    python benchmarks/envs.py agents [--seeds 5]       # random and greedy on inception_v3 and vgg19 x tag-testbed

``--models`` replaces the models (steps uses the first); a tiny run: ``steps --episodes 1 --models lenet``,
``agents --seeds 1 --models lenet``. ``--calibration roofline`` (or a calibration file) simulates
with another GPU model than the default (the env config's ``cost_model``).

``agents`` plays the random agent once per seed and the greedy agent once, on the ``device`` and the
``tag`` action space; the last column is the row's wall-clock seconds. On ``tag`` the greedy agent
previews the actions on the first ``--greedy-subsets`` device-group subsets only (default ``ranked``,
2 K - 1 of them for K machines: on tag-testbed 13, its 7 machines alone, all 7 together and the 5
fastest-``j`` prefixes, 52 of the 256 actions; ``all``: every allowed action, about 5x longer: a
preview is a simulation of up to three completed plans on the original ops).

``steps`` plays episodes with a random agent on inception_v3 x tag-testbed (60 op groups, 16 GPUs),
every step including the partial plan's simulation, after one warm-up episode; it prints the median
steps/s over episodes (the final simulation on the original graph included). Run it with
``NUMBA_NUM_THREADS=1`` for one core.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np

import placement_rl.envs  # noqa: F401  (registers the ids)
from placement_rl.cli.common import CALIBRATION_HELP, calibration_spec
from placement_rl.envs import GreedyAgent, RandomAgent, run_episode

CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("Placement-v0 sequential/device", "placement_rl/Placement-v0", {"mode": "sequential", "action_space": "device"}),
    ("Placement-v0 sequential/tag", "placement_rl/Placement-v0", {"mode": "sequential", "action_space": "tag"}),
    ("Placement-v0 one_shot (every op in one step)", "placement_rl/Placement-v0", {"mode": "one_shot"}),
    ("Sharding-v0", "placement_rl/Sharding-v0", {}),
]
MODELS = ("inception_v3", "vgg19")


def steps(episodes: int, model: str = "inception_v3", cost: dict[str, Any] | None = None) -> None:
    generator = {"kind": "fixed", "model": model, "topology": "tag-testbed"}
    print(f"{model} x tag-testbed")
    print("| env | steps/episode | median steps/s | median ms/step |")
    print("|---|---|---|---|")
    for label, env_id, options in CASES:
        env = gym.make(env_id, config={"generator": generator, "cost_model": cost, **options})
        agent = RandomAgent(0)
        run_episode(env, agent, seed=0)  # warm-up: imports, coarsening, baselines, compiled configs
        rates = []
        n = 0
        for episode in range(episodes):
            start = time.perf_counter()
            n = run_episode(env, agent, seed=episode + 1)["steps"]
            rates.append(n / (time.perf_counter() - start))
        rate = statistics.median(rates)
        print(f"| {label} | {n} | {rate:,.0f} | {1e3 / rate:.2f} |", flush=True)


#: The greedy agent's device-group subsets on ``tag`` (``--greedy-subsets``): each device group alone,
#: all together and the fastest-j prefixes, 2 K - 1 of K groups (13 of tag-testbed's 7 machines).
GREEDY_SUBSETS: Literal["ranked"] = "ranked"


def agents(
    seeds: int,
    models: Sequence[str] = MODELS,
    cost: dict[str, Any] | None = None,
    greedy_subsets: int | Literal["ranked"] | None = GREEDY_SUBSETS,
) -> None:
    print("| model | env | agent | mean reward | mean speedup over DP | best speedup | OOM episodes | s |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        generator = {"kind": "fixed", "model": model, "topology": "tag-testbed"}
        for label, options in (("device", {"action_space": "device"}), ("tag", {"action_space": "tag"})):
            config = {"generator": generator, "reward": "speedup", "cost_model": cost, **options}
            env = gym.make("placement_rl/Placement-v0", config=config)
            for name, make in (
                ("random", lambda s: RandomAgent(s)),
                ("greedy", lambda s: GreedyAgent(subsets=greedy_subsets)),
            ):
                start = time.perf_counter()
                runs = [run_episode(env, make(s), seed=s) for s in range(seeds if name == "random" else 1)]
                seconds = time.perf_counter() - start
                rewards = [r["reward"] for r in runs]
                speedups = [r["speedup"] for r in runs]
                ooms = sum(r["oom"] for r in runs)
                print(
                    f"| {model} | sequential/{label} | {name} | {np.mean(rewards):.3f} | {np.mean(speedups):.2f}x | "
                    f"{max(speedups):.2f}x | {ooms}/{len(runs)} | {seconds:.0f} |",
                    flush=True,
                )


def _subsets(text: str) -> int | Literal["ranked"] | None:
    """``--greedy-subsets``: a positive count, ``ranked`` or ``all`` (None)."""
    if text == "all":
        return None
    if text == "ranked":
        return "ranked"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of subsets, 'ranked' or 'all'")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; ``argv`` defaults to the command line (tests pass a tiny budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["steps", "agents"])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--models", default=None, help="comma-separated zoo models (steps: inception_v3; agents: inception_v3,vgg19)"
    )
    parser.add_argument("--calibration", type=calibration_spec, default="default", help=CALIBRATION_HELP)
    parser.add_argument(
        "--greedy-subsets",
        type=_subsets,
        default=GREEDY_SUBSETS,
        help="agents, tag action space: the greedy agent previews the actions on the first N device-group "
        "subsets, 'ranked' (the default: each machine alone, all of them and the fastest-j prefixes, 2 K - 1 "
        "of K machines) or 'all'",
    )
    args = parser.parse_args(argv)
    models = args.models.split(",") if args.models else None
    cost = None if args.calibration == "default" else {"calibration": args.calibration}
    if args.what == "steps":
        steps(args.episodes, models[0] if models else "inception_v3", cost)
    else:
        agents(args.seeds, models or MODELS, cost, args.greedy_subsets)


if __name__ == "__main__":
    main()

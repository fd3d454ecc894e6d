"""Rewards as named objects, chosen in the env config by ``reward: <name>``.

Each reward sees an :class:`Outcome` after every step and returns a float. The final plan is
always simulated on the model's original graph; the per-step partial plans on the op-group graph
(see the envs).

* ``speedup`` (TAG): 0 until the last step, then the simulated speedup of the final plan over data
  parallelism (all-reduce over every device), or -1 if the plan does not fit in memory.
  An invalid action (one the action mask forbids; it ends the episode, see the envs'
  ``invalid_action`` option) gets -1 too: the reward of a plan that does not fit.
* ``mdpe`` (Trinity, eq. 8): 0 until the last step, then ``-log(alpha * f + beta * q_comm +
  gamma * q_mem)`` with ``f`` the final makespan over data parallelism's (times the search's OOM
  multiplier ``1 + 10 * (1 + overflow)`` when a device overflows), ``q_comm = max(0, C / C_hat -
  1)`` for the busiest link's bytes ``C`` in GB and ``q_mem = max(0, M / M_hat - 1)`` for the
  largest device peak ``M`` in GiB. Defaults: alpha 0.5, beta 0.3, gamma 0.2, C_hat = M_hat = 8.
  An invalid action gets ``-log(alpha * (1 + oom_penalty))`` (-1.705 by default): the reward of a
  plan as fast as data parallelism that overflows a device, with no link or memory excess.
* ``dense``: every step, the drop of the partial plan's simulated makespan over data
  parallelism's (``(T_prev - T_now) / T_dp``, partial plans on the group graph), plus -1 at the
  end if the final plan does not fit. Summed over an episode it is ``1 - T_final / T_dp`` minus
  the OOM penalty. An invalid action gets -1 (nothing changed, so no makespan term), after the
  steps' rewards so far.

Every option is a finite number within a documented range (rewards within +-1e6, which RLlib's
float32 batches hold exactly enough; MDPE's weights and scales positive and at most 1e6), so a
reward is always finite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from placement_rl.config import check_fields, number, option, parse
from placement_rl.errors import SchemaError, UnknownNameError
from placement_rl.sim.delta import oom_cost
from placement_rl.sim.result import SimResult


@dataclass(frozen=True)
class Outcome:
    """What a reward may look at after one step.

    Attributes:
        previous_partial_s: the partial plan's simulated makespan before this step.
        partial_s: after this step (the group graph; ``nan`` in one-shot mode).
        baseline_partial_s: data parallelism's makespan on the group graph.
        final: the final plan's simulation on the original graph (last step only).
        baseline: data parallelism's simulation on the original graph.
    """

    previous_partial_s: float
    partial_s: float
    baseline_partial_s: float
    final: SimResult | None
    baseline: SimResult


class Reward:
    """Base class: ``reward(outcome) -> float``.

    The built-in rewards are frozen dataclasses whose fields are their options, each with a rule
    (:func:`placement_rl.config.option`): :func:`make_reward` builds them with
    :func:`placement_rl.config.parse`, and a dataclass reward built directly checks its fields too.
    """

    name: ClassVar[str]

    def __post_init__(self) -> None:
        check_fields(self, f"reward {self.name!r}")

    def __call__(self, outcome: Outcome) -> float:
        raise NotImplementedError

    def invalid_action_reward(self) -> float:
        """The reward of a step whose action the mask forbids (the episode ends there). Default: -1."""
        return -1.0


#: Rewards (per step, OOM and invalid-action rewards) stay within +-REWARD_LIMIT.
REWARD_LIMIT = 1e6


@dataclass(frozen=True)
class SpeedupReward(Reward):
    """TAG's reward: final speedup over data parallelism, -1 on out-of-memory or an invalid action."""

    name: ClassVar[str] = "speedup"
    oom_reward: float = option(-1.0, rule=number(-REWARD_LIMIT, REWARD_LIMIT))
    invalid_reward: float = option(-1.0, rule=number(-REWARD_LIMIT, REWARD_LIMIT))

    def invalid_action_reward(self) -> float:
        return self.invalid_reward

    def __call__(self, outcome: Outcome) -> float:
        if outcome.final is None:
            return 0.0
        if outcome.final.oom:
            return self.oom_reward
        return outcome.baseline.makespan_s / outcome.final.makespan_s


@dataclass(frozen=True)
class MDPEReward(Reward):
    """Trinity's multi-dimensional performance evaluation (see the module docstring)."""

    name: ClassVar[str] = "mdpe"
    # Lower bounds keep alpha * f from underflowing to 0 (log(0)); upper bounds keep it finite.
    alpha: float = option(0.5, rule=number(1e-6, 1e6))
    beta: float = option(0.3, rule=number(0, 1e6))
    gamma: float = option(0.2, rule=number(0, 1e6))
    c_hat_gb: float = option(8.0, rule=number(1e-6, 1e6))
    m_hat_gib: float = option(8.0, rule=number(1e-6, 1e6))
    oom_penalty: float = option(10.0, rule=number(0, 1e6))

    def invalid_action_reward(self) -> float:
        """``-log(alpha * (1 + oom_penalty))``: a plan as fast as data parallelism that overflows memory."""
        return -math.log(self.alpha * (1.0 + self.oom_penalty))

    def terms(self, final: SimResult, baseline: SimResult) -> tuple[float, float, float]:
        """``(f, q_comm, q_mem)`` of a final plan."""
        f = oom_cost(final.makespan_s, final.peak_memory_bytes, final.memory_capacity_bytes, self.oom_penalty)
        f /= baseline.makespan_s
        busiest_gb = float(final.link_bytes.max()) / 1e9 if final.link_bytes.size else 0.0
        peak_gib = float(final.peak_memory_bytes.max()) / 2**30 if final.peak_memory_bytes.size else 0.0
        return f, max(0.0, busiest_gb / self.c_hat_gb - 1.0), max(0.0, peak_gib / self.m_hat_gib - 1.0)

    def __call__(self, outcome: Outcome) -> float:
        if outcome.final is None:
            return 0.0
        f, q_comm, q_mem = self.terms(outcome.final, outcome.baseline)
        return -math.log(self.alpha * f + self.beta * q_comm + self.gamma * q_mem)


@dataclass(frozen=True)
class DenseReward(Reward):
    """Per-step drop of the partial plan's makespan, relative to data parallelism."""

    name: ClassVar[str] = "dense"
    oom_reward: float = option(-1.0, rule=number(-REWARD_LIMIT, REWARD_LIMIT))
    invalid_reward: float = option(-1.0, rule=number(-REWARD_LIMIT, REWARD_LIMIT))

    def invalid_action_reward(self) -> float:
        return self.invalid_reward

    def __call__(self, outcome: Outcome) -> float:
        reward = 0.0
        if not math.isnan(outcome.partial_s):
            reward = (outcome.previous_partial_s - outcome.partial_s) / outcome.baseline_partial_s
        elif outcome.final is not None:  # one-shot: no partial plans, the whole change at once
            reward = 1.0 - outcome.final.makespan_s / outcome.baseline.makespan_s
        if outcome.final is not None and outcome.final.oom:
            reward += self.oom_reward
        return reward


REWARDS: dict[str, type[Reward]] = {r.name: r for r in (SpeedupReward, MDPEReward, DenseReward)}


def make_reward(name: str | Reward, options: Mapping[str, Any] | None = None) -> Reward:
    """A reward by name with its options (``{"alpha": 0.6}`` for ``mdpe``), or a Reward object as is.

    The options are checked by :func:`placement_rl.config.parse` against the reward's fields.

    Raises:
        UnknownNameError: for an unknown name, naming the valid ones.
        SchemaError: (a ``ValueError``) for an unknown option, naming the valid ones, or a value
            its rule refuses (``NaN`` and ``inf`` included).
    """
    if isinstance(name, Reward):
        if options:
            raise SchemaError(f"reward_options {options!r} given with a Reward object; set them on the object")
        return name
    if not isinstance(name, str) or name not in REWARDS:
        raise UnknownNameError("reward", name, REWARDS)
    return parse(REWARDS[name], options, f"reward {name!r}")

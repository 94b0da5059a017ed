"""Trajectory-level (group) estimators: one scalar return per trajectory.

A trajectory is one agent's rows in one episode (``batch.traj``); in turn layout it has
several rows that share its return, and statistics count it once. Each estimator reads
``R_i = batch.returns`` per trajectory i, computes ``A_i`` with statistics over i's
segment g = (group, agent), and broadcasts ``A_i`` to the action tokens of the
trajectory's rows: ``[n_rows, T]``, zero outside ``batch.action_mask``.

Statistics never mix agents (seats): a seat's return is compared with the same seat's
returns only (agent-specific normalisation, MARS / AT-GRPO), so zero-sum seats do not
cancel. With one agent (``TurnBatch.from_scalars`` without ``agent``) g is the group.
"Batch" statistics (``std_over="batch"``, ``reinforce_pp``) are per agent too. Statistics
run in float64; a segment whose returns are all equal gets exactly 0 (no NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from sparring.advantages import estimator
from sparring.advantages.common import check_choice, to_tokens, whiten
from sparring.data import TurnBatch
from sparring.segments import (
    compact_ids,
    has_spread,
    segment_count,
    segment_first,
    segment_mean,
    segment_median,
    segment_order,
    segment_std,
    segment_sum,
)

FAMILY = "group"
STD_OVER = ("group", "batch")


@dataclass
class Trajectories:
    """Per-trajectory vectors ``[n]`` of a batch."""

    row: Tensor  # long [n_rows]: row -> its trajectory 0..n-1
    n: int
    R: Tensor  # float64 [n]: the trajectory's return
    seg: Tensor  # long [n]: (group, agent) segment, 0..n_seg-1
    n_seg: int
    agent: Tensor  # long [n]: agent segment (batch-wide statistics), 0..n_agent-1
    n_agent: int

    def count(self) -> Tensor:
        """Trajectories per segment ``[n_seg]``, float64."""
        return segment_count(self.seg, self.n_seg, torch.float64)

    def tokens(self, batch: TurnBatch, a: Tensor) -> Tensor:
        """Per-trajectory ``a [n]`` on the action tokens of its rows ``[n_rows, T]``."""
        return to_tokens(batch, a[self.row])


def trajectories(batch: TurnBatch) -> Trajectories:
    """Collapse rows to trajectories (read at each trajectory's first row)."""
    row, n = compact_ids(batch.traj)
    first = segment_first(row, n)
    seg, n_seg = compact_ids(batch.group[first], batch.agent[first])
    agent, n_agent = compact_ids(batch.agent[first])
    R = batch.returns[first].double()
    if not torch.isfinite(R).all():
        raise ValueError("batch.returns has non-finite values")
    return Trajectories(row, n, R, seg, n_seg, agent, n_agent)


def centred(v: Trajectories, baseline: Tensor | None = None) -> Tensor:
    """``R_i - b_g`` (b_g the segment mean unless given ``[n_seg]``); exactly 0 in flat
    segments."""
    b = segment_mean(v.R, v.seg, v.n_seg) if baseline is None else baseline
    return torch.where(has_spread(v.R, v.seg, v.n_seg)[v.seg], v.R - b[v.seg], 0.0)


def _check_eps(eps: float) -> None:
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")


def grpo_advantage(v: Trajectories, scale: bool, std_over: str, unbiased: bool,
                   eps: float) -> Tensor:
    """Per-trajectory GRPO advantage ``[n]`` (shared by grpo and a_grae)."""
    check_choice("std_over", std_over, STD_OVER)
    _check_eps(eps)
    c = centred(v)
    if not scale:
        return c
    if std_over == "group":
        std = segment_std(v.R, v.seg, v.n_seg, unbiased)[v.seg]
    else:
        std = segment_std(v.R, v.agent, v.n_agent, unbiased)[v.agent]
    return c / (std + eps)


@estimator("reinforce", family=FAMILY, needs=(), source="Williams 1992, Simple statistical "
           "gradient-following algorithms for connectionist reinforcement learning")
def reinforce(batch: TurnBatch, *, baseline: float = 0.0) -> Tensor:
    """A_i = R_i - b with a constant b (default 0). Shapes: [n_rows, T].
    Source: Williams (1992)."""
    v = trajectories(batch)
    return v.tokens(batch, v.R - float(baseline))


@estimator("rloo", family=FAMILY, needs=("group",),
           source="Back to Basics: Revisiting REINFORCE Style Optimization (RLOO), 2024")
def rloo(batch: TurnBatch) -> Tensor:
    """A_i = R_i - mean_{j != i, j in g} R_j = G/(G-1) (R_i - mean_g R); 0 when G = 1.
    Shapes: [n_rows, T]. Source: Ahmadian et al. (2024), REINFORCE leave-one-out."""
    v = trajectories(batch)
    G = v.count()[v.seg]
    return v.tokens(batch, torch.where(G > 1, centred(v) * G / (G - 1).clamp(min=1), 0.0))


@estimator("grpo", family=FAMILY, needs=("group",), source="DeepSeekMath: Pushing the Limits "
           "of Mathematical Reasoning in Open Language Models (2024)")
def grpo(batch: TurnBatch, *, scale: bool = True, std_over: str = "group", unbiased: bool = True,
         eps: float = 1e-6) -> Tensor:
    """A_i = (R_i - mean_g R) / (std R + eps).

    ``scale=False`` drops the division; ``std_over="batch"`` takes the std of R over the
    agent's trajectories in the whole batch instead of over g; ``unbiased`` (default True,
    as ``torch.std``) divides the squared deviations by G-1 (by G if False; a group of one
    has std 0). Shapes: [n_rows, T]. Source: DeepSeekMath (2024)."""
    v = trajectories(batch)
    return v.tokens(batch, grpo_advantage(v, scale, std_over, unbiased, eps))


@estimator("dr_grpo", family=FAMILY, needs=("group",),
           source="Understanding R1-Zero-Like Training: A Critical Perspective (Dr. GRPO)")
def dr_grpo(batch: TurnBatch) -> Tensor:
    """A_i = R_i - mean_g R (no std). Pair with aggregation ``seq-mean-token-sum-norm``.
    Shapes: [n_rows, T]. Source: Understanding R1-Zero-Like Training (Dr. GRPO)."""
    v = trajectories(batch)
    return v.tokens(batch, centred(v))


def _mc_pivot(v: Trajectories) -> Tensor:
    """Bool [n]: the middle trajectory, in (R, index) order, of each odd-sized segment."""
    order, _, start, cnt = segment_order(v.R, v.seg, v.n_seg)
    odd = cnt % 2 == 1
    pivot = torch.zeros(v.n, dtype=torch.bool, device=v.R.device)
    pivot[order[(start + (cnt - 1) // 2)[odd]]] = True
    return pivot


def mc_grpo_keep(batch: TurnBatch, **_: object) -> Tensor:
    """Bool [n_rows]: False on the rows of each odd-sized group's pivot (median) rollout."""
    v = trajectories(batch)
    return ~_mc_pivot(v)[v.row]


@estimator("mc_grpo", family=FAMILY, needs=("group",), keep=mc_grpo_keep,
           source="MC-GRPO: Median-Centered Group Relative Policy Optimization for "
           "Small-Rollout Reinforcement Learning")
def mc_grpo(batch: TurnBatch, *, scale: bool = False, unbiased: bool = True,
            eps: float = 1e-6) -> Tensor:
    """A_i = R_i - median_g R (optionally / (std_g R + eps) with ``scale=True``, our reading).

    Sample G+1 rollouts per group: in an odd-sized group exactly one rollout, the pivot
    (the middle one in (R, index) order), sits at the median; the registered ``keep``
    function excludes its rows from the loss (``compute`` returns the mask, ``estimate``
    zeroes them). Even-sized groups use the mean of the two middle values and keep all.
    Shapes: [n_rows, T]. Source: MC-GRPO (median-centred GRPO)."""
    _check_eps(eps)
    v = trajectories(batch)
    a = centred(v, segment_median(v.R, v.seg, v.n_seg))
    if scale:
        a = a / (segment_std(v.R, v.seg, v.n_seg, unbiased)[v.seg] + eps)
    return v.tokens(batch, a)


def beta_params(p: Tensor, alpha: float | None, beta: float | None) -> tuple[float, float]:
    """BNPO's (a, b) = (1 + alpha/3, 1 + beta/3), with (alpha, beta) the Beta parameters of
    the success rates ``p`` fitted by the method of moments unless given. When they cannot
    be fitted (one group, zero variance), (a, b) = (1.5, 1.5): GRPO's sqrt(p(1-p))."""
    if (alpha is None) != (beta is None):
        raise ValueError("bnpo: give both alpha and beta, or neither")
    if alpha is None:
        m = float(p.mean()) if p.numel() else 0.5
        var = float(p.var(unbiased=False)) if p.numel() > 1 else 0.0
        if var <= 0 or m * (1 - m) <= var:
            return 1.5, 1.5
        common = m * (1 - m) / var - 1
        alpha, beta = m * common, (1 - m) * common
    if alpha <= 0 or beta <= 0:
        raise ValueError(f"bnpo: alpha and beta must be > 0, got {alpha}, {beta}")
    return 1 + alpha / 3, 1 + beta / 3


@estimator("bnpo", family=FAMILY, needs=("group",),
           source="BNPO: Beta Normalization Policy Optimization")
def bnpo(batch: TurnBatch, *, alpha: float | None = None, beta: float | None = None,
         eps: float = 1e-6) -> Tensor:
    """A_i = (R_i - p_g) / max(f(p_g; a, b), eps), f the Beta(a, b) density (our reading).

    Rewards must lie in [0, 1] (binary success); p_g = mean_g R is the group's success
    rate; (a, b) from `beta_params`. (a, b) = (1, 1) gives REINFORCE with baseline p,
    (1.5, 1.5) gives GRPO up to a constant. Shapes: [n_rows, T].
    Source: BNPO: Beta Normalization Policy Optimization."""
    _check_eps(eps)
    v = trajectories(batch)
    if ((v.R < 0) | (v.R > 1)).any():
        raise ValueError("bnpo needs returns in [0, 1] (binary success rewards)")
    p = segment_mean(v.R, v.seg, v.n_seg)
    a, b = beta_params(p, alpha, beta)
    log_beta_fn = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    pc = p.clamp(1e-12, 1 - 1e-12)
    density = torch.exp((a - 1) * pc.log() + (b - 1) * (1 - pc).log() - log_beta_fn)
    return v.tokens(batch, centred(v, p) / density.clamp(min=eps)[v.seg])


@estimator("ngrpo", family=FAMILY, needs=("group",),
           source="NGRPO: Negative-enhanced Group Relative Policy Optimization")
def ngrpo(batch: TurnBatch, *, max_reward: float | None = 1.0, unbiased: bool = True,
          eps: float = 1e-6) -> Tensor:
    """Advantage calibration: a virtual sample with reward r_max joins each group.

    mu = (sum_g R + r_max) / (G+1);  s^2 = (sum_g (R-mu)^2 + (r_max-mu)^2) / (G or G+1)
    (``unbiased``);  A_i = (R_i - mu) / (s + eps). All-wrong groups get negative
    advantages; groups at r_max get 0. ``max_reward=None`` uses the batch maximum.
    Shapes: [n_rows, T]. Source: NGRPO (pair with asymmetric clipping in ppo_clip)."""
    _check_eps(eps)
    v = trajectories(batch)
    r_max = float(v.R.max()) if max_reward is None else float(max_reward)
    if v.n and float(v.R.max()) > r_max:
        raise ValueError(f"ngrpo: a return exceeds max_reward={r_max}")
    G = v.count()
    mu = (segment_sum(v.R, v.seg, v.n_seg) + r_max) / (G + 1)
    ss = segment_sum((v.R - mu[v.seg]) ** 2, v.seg, v.n_seg) + (r_max - mu) ** 2
    std = (ss / (G if unbiased else G + 1)).sqrt()
    at_max = ~has_spread(v.R, v.seg, v.n_seg) & (segment_mean(v.R, v.seg, v.n_seg) == r_max)
    a = (v.R - mu[v.seg]) / (std[v.seg] + eps)
    return v.tokens(batch, torch.where(at_max[v.seg], 0.0, a))


def schedule_factor(factor: float | None, step: int | None, total_steps: int | None,
                    factor_start: float, factor_end: float) -> float:
    """A fixed ``factor``, or linear from ``factor_start`` to ``factor_end`` over
    ``step / total_steps`` (clamped to [0, 1]); 0.5 when neither is given."""
    if factor is not None and step is not None:
        raise ValueError("a_grae: give factor or step/total_steps, not both")
    if step is not None:
        if not total_steps or total_steps <= 0:
            raise ValueError("a_grae: step needs total_steps > 0")
        frac = min(max(step / total_steps, 0.0), 1.0)
        factor = factor_start + (factor_end - factor_start) * frac
    factor = 0.5 if factor is None else float(factor)
    if not 0.0 <= factor <= 1.0:
        raise ValueError(f"a_grae: the suppression factor must be in [0, 1], got {factor}")
    return factor


@estimator("a_grae", family=FAMILY, needs=("group",),
           source="Unveiling Implicit Advantage Symmetry: Why GRPO Struggles with "
           "Exploration and Difficulty Adaptation (A-GRAE)")
def a_grae(batch: TurnBatch, *, factor: float | None = None, step: int | None = None,
           total_steps: int | None = None, factor_start: float = 1.0, factor_end: float = 0.5,
           scale: bool = True, std_over: str = "group", unbiased: bool = True,
           eps: float = 1e-6) -> Tensor:
    """A_i = lam * A_i^grpo if A_i^grpo > 0 else A_i^grpo, lam in [0, 1] (our reading).

    lam is ``factor`` or follows `schedule_factor` (step/total_steps). Only the asymmetric
    suppression of correct trajectories is implemented; the paper's difficulty curriculum
    is not. Defaults are ours. Shapes: [n_rows, T]. Source: A-GRAE."""
    lam = schedule_factor(factor, step, total_steps, factor_start, factor_end)
    v = trajectories(batch)
    a = grpo_advantage(v, scale, std_over, unbiased, eps)
    return v.tokens(batch, torch.where(a > 0, a * lam, a))


@estimator("opo", family=FAMILY, needs=("group", "lengths"),
           source="On-Policy RL with Optimal Reward Baseline (OPO)")
def opo(batch: TurnBatch) -> Tensor:
    """A_i = R_i - b_g, b_g = sum_g len_i R_i / sum_g len_i, len_i the trajectory's action
    tokens (``batch.length`` summed over its rows); plain mean if a group has no tokens.
    Shapes: [n_rows, T]. Source: On-Policy RL with Optimal Reward Baseline (OPO)."""
    v = trajectories(batch)
    length = segment_sum(batch.length.double(), v.row, v.n)
    num = segment_sum(length * v.R, v.seg, v.n_seg)
    den = segment_sum(length, v.seg, v.n_seg)
    b = torch.where(den > 0, num / den.clamp(min=1), segment_mean(v.R, v.seg, v.n_seg))
    return v.tokens(batch, centred(v, b))


@estimator("reinforce_pp", family=FAMILY, needs=(),
           source="REINFORCE++: A Simple and Efficient Approach for Aligning LLMs")
def reinforce_pp(batch: TurnBatch, *, eps: float = 1e-6) -> Tensor:
    """A_i = (R_i - mean_B R) / (std_B R + eps) over the agent's trajectories in the batch B
    (std unbiased). Whitening is over trajectories, not tokens (our choice).
    Shapes: [n_rows, T]. Source: REINFORCE++."""
    _check_eps(eps)
    v = trajectories(batch)
    return v.tokens(batch, whiten(v.R, eps, v.agent, v.n_agent))


@estimator("reinforce_pp_baseline", family=FAMILY, needs=("group",),
           source="REINFORCE++: A Simple and Efficient Approach for Aligning LLMs")
def reinforce_pp_baseline(batch: TurnBatch, *, eps: float = 1e-6) -> Tensor:
    """c_i = R_i - mean_g R, then A_i = (c_i - mean_B c) / (std_B c + eps) over the agent's
    trajectories in the batch (std unbiased; mean_B c = 0 when every group is whole).
    Shapes: [n_rows, T]. Source: REINFORCE++ (the group-baseline variant)."""
    _check_eps(eps)
    v = trajectories(batch)
    return v.tokens(batch, whiten(centred(v), eps, v.agent, v.n_agent))


@estimator("gpg", family=FAMILY, needs=("group",),
           source="GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning")
def gpg(batch: TurnBatch) -> Tensor:
    """A_i = (R_i - mean_g R) / f, f = (segments with non-zero reward variance) / (segments);
    no std. Shapes: [n_rows, T]. Source: GPG (Group Policy Gradient)."""
    v = trajectories(batch)
    f = has_spread(v.R, v.seg, v.n_seg).double().mean() if v.n_seg else v.R.new_ones(())
    return v.tokens(batch, centred(v) / f.clamp(min=1.0 / max(v.n_seg, 1)))


@estimator("remax", family=FAMILY, needs=("greedy_reward",),
           source="ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method "
           "for Aligning Large Language Models")
def remax(batch: TurnBatch, *, baseline: Tensor | None = None) -> Tensor:
    """A_i = R_i - b_i, b_i the reward of the greedy rollout of i's prompt: option
    ``baseline`` [n_rows] or ``batch.extras["greedy_reward"]`` (read at the trajectory's
    first row). Shapes: [n_rows, T]. Source: ReMax."""
    if baseline is None:
        if "greedy_reward" not in batch.extras:
            raise ValueError("remax needs baseline=Tensor[n_rows] or "
                             "batch.extras['greedy_reward']")
        baseline = batch.extras["greedy_reward"]
    b = torch.as_tensor(baseline, device=batch.device).double()
    if b.shape != (batch.n_rows,):
        raise ValueError(f"remax: baseline must have shape [{batch.n_rows}], got {tuple(b.shape)}")
    v = trajectories(batch)
    b = b[segment_first(v.row, v.n)]
    if not torch.isfinite(b).all():
        raise ValueError("remax: the greedy-rollout baseline is missing (NaN) for some rows")
    return v.tokens(batch, v.R - b)

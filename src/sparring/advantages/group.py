"""Trajectory-level (group) estimators: one scalar return per trajectory.

Each estimator reads ``R_i = batch.returns`` once per trajectory (``batch.traj``), so it
works in both layouts, computes ``A_i`` [n_traj] with segment statistics over the
trajectory's group g (or its (group, agent) pair with ``by_agent=True``: MARS /
AT-GRPO agent-specific normalisation) and broadcasts ``A_i`` to the action tokens of
every row of the trajectory: output ``[n_rows, T]``, zero outside ``batch.action_mask``.
Statistics run in float64. Groups whose returns are all equal get exactly 0 (no NaN).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sparring.advantages import estimator
from sparring.advantages.traj import TrajView, segment_order, to_tokens, traj_view
from sparring.data import TurnBatch
from sparring.segments import segment_mean, segment_median, segment_std, segment_sum

FAMILY = "group"
STD_OVER = ("group", "batch")


def has_spread(x: Tensor, seg: Tensor, n_seg: int) -> Tensor:
    """Bool [n_seg]: the segment's values are not all equal."""
    lo = torch.full((n_seg,), math.inf, dtype=x.dtype, device=x.device)
    hi = torch.full((n_seg,), -math.inf, dtype=x.dtype, device=x.device)
    lo = lo.scatter_reduce(0, seg, x, reduce="amin")
    hi = hi.scatter_reduce(0, seg, x, reduce="amax")
    return hi > lo


def centred(v: TrajView, baseline: Tensor | None = None) -> Tensor:
    """``R_i - b_g`` (b_g = group mean unless given, [n_seg]); exactly 0 in flat groups."""
    b = segment_mean(v.R, v.seg, v.n_seg) if baseline is None else baseline
    spread = has_spread(v.R, v.seg, v.n_seg)[v.seg]
    return torch.where(spread, v.R - b[v.seg], torch.zeros_like(v.R))


def _check_eps(eps: float) -> None:
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")


def grpo_advantage(v: TrajView, scale: bool, std_over: str, unbiased: bool, eps: float) -> Tensor:
    """Per-trajectory GRPO advantage (shared by grpo and a_grae)."""
    if std_over not in STD_OVER:
        raise ValueError(f"std_over must be one of {STD_OVER}, got {std_over!r}")
    _check_eps(eps)
    c = centred(v)
    if not scale:
        return c
    if std_over == "group":
        std = segment_std(v.R, v.seg, v.n_seg, unbiased)[v.seg]
    else:
        bseg, nb = v.batch_seg()
        std = segment_std(v.R, bseg, nb, unbiased)[bseg]
    return c / (std + eps)


@estimator("reinforce", family=FAMILY, needs=(), source="Williams 1992, Simple statistical "
           "gradient-following algorithms for connectionist reinforcement learning")
def reinforce(batch: TurnBatch, *, baseline: float = 0.0, by_agent: bool = False,
              out: Tensor | None = None) -> Tensor:
    """A_i = R_i - b with a constant b (default 0). No statistics, so ``by_agent`` has no
    effect. Shapes: [n_rows, T]. Source: Williams (1992)."""
    v = traj_view(batch, by_agent)
    return to_tokens(batch, v, v.R - float(baseline), out)


@estimator("rloo", family=FAMILY, needs=("group",),
           source="Back to Basics: Revisiting REINFORCE Style Optimization (RLOO), 2024")
def rloo(batch: TurnBatch, *, by_agent: bool = False,
         out: Tensor | None = None) -> Tensor:
    """A_i = R_i - mean_{j != i, j in g} R_j = G/(G-1) (R_i - mean_g R); 0 when G = 1.
    Shapes: [n_rows, T]. Source: Ahmadian et al. (2024), REINFORCE leave-one-out."""
    v = traj_view(batch, by_agent)
    G = v.count()[v.seg]
    a = torch.where(G > 1, centred(v) * G / (G - 1).clamp(min=1), torch.zeros_like(v.R))
    return to_tokens(batch, v, a, out)


@estimator("grpo", family=FAMILY, needs=("group",), source="DeepSeekMath: Pushing the Limits "
           "of Mathematical Reasoning in Open Language Models (2024)")
def grpo(batch: TurnBatch, *, scale: bool = True, std_over: str = "group", unbiased: bool = True,
         eps: float = 1e-6, by_agent: bool = False,
         out: Tensor | None = None) -> Tensor:
    """A_i = (R_i - mean_g R) / (std R + eps).

    ``scale=False`` drops the division; ``std_over="batch"`` takes the std of R over the
    whole batch (per agent with ``by_agent``) instead of over the group; ``unbiased``
    (default True, as ``torch.std``) divides the squared deviations by G-1 (by G if False;
    a group of one has std 0). Shapes: [n_rows, T]. Source: DeepSeekMath (2024)."""
    v = traj_view(batch, by_agent)
    return to_tokens(batch, v, grpo_advantage(v, scale, std_over, unbiased, eps), out)


@estimator("dr_grpo", family=FAMILY, needs=("group",),
           source="Understanding R1-Zero-Like Training: A Critical Perspective (Dr. GRPO)")
def dr_grpo(batch: TurnBatch, *, by_agent: bool = False,
            out: Tensor | None = None) -> Tensor:
    """A_i = R_i - mean_g R (no std). Pair with aggregation ``seq-mean-token-sum-norm``.
    Shapes: [n_rows, T]. Source: Understanding R1-Zero-Like Training (Dr. GRPO)."""
    v = traj_view(batch, by_agent)
    return to_tokens(batch, v, centred(v), out)


def _mc_pivot(batch: TurnBatch, by_agent: bool) -> tuple[TrajView, Tensor]:
    v = traj_view(batch, by_agent)
    order, _, start, cnt = segment_order(v.R, v.seg, v.n_seg)
    odd = cnt % 2 == 1
    pivot = torch.zeros(v.n, dtype=torch.bool, device=v.R.device)
    pivot[order[(start + (cnt - 1) // 2)[odd]]] = True
    return v, pivot


def mc_grpo_keep(batch: TurnBatch, *, by_agent: bool = False, **_: object) -> Tensor:
    """Bool [n_rows]: False on the rows of each odd-sized group's pivot (median) rollout."""
    v, pivot = _mc_pivot(batch, by_agent)
    return ~pivot[v.tid]


@estimator("mc_grpo", family=FAMILY, needs=("group",), keep=mc_grpo_keep,
           source="MC-GRPO: Median-Centered Group Relative Policy Optimization for "
           "Small-Rollout Reinforcement Learning")
def mc_grpo(batch: TurnBatch, *, scale: bool = False, unbiased: bool = True, eps: float = 1e-6,
            by_agent: bool = False,
            out: Tensor | None = None) -> Tensor:
    """A_i = R_i - median_g R (optionally / (std_g R + eps) with ``scale=True``, our reading).

    Sample G+1 rollouts per group: in an odd-sized group exactly one rollout, the pivot
    (the middle one in (R, index) order), sits at the median; the registered ``keep``
    function excludes its rows from the loss (``compute`` returns the mask, ``estimate``
    zeroes them). Even-sized groups use the mean of the two middle values and keep all.
    Shapes: [n_rows, T]. Source: MC-GRPO (median-centred GRPO)."""
    _check_eps(eps)
    v = traj_view(batch, by_agent)
    a = centred(v, segment_median(v.R, v.seg, v.n_seg))
    if scale:
        a = a / (segment_std(v.R, v.seg, v.n_seg, unbiased)[v.seg] + eps)
    return to_tokens(batch, v, a, out)


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
         eps: float = 1e-6, by_agent: bool = False,
         out: Tensor | None = None) -> Tensor:
    """A_i = (R_i - p_g) / max(f(p_g; a, b), eps), f the Beta(a, b) density (our reading).

    Rewards must lie in [0, 1] (binary success); p_g = mean_g R is the group's success
    rate; (a, b) from `beta_params`. (a, b) = (1, 1) gives REINFORCE with baseline p,
    (1.5, 1.5) gives GRPO up to a constant. Shapes: [n_rows, T].
    Source: BNPO: Beta Normalization Policy Optimization."""
    _check_eps(eps)
    v = traj_view(batch, by_agent)
    if ((v.R < 0) | (v.R > 1)).any():
        raise ValueError("bnpo needs returns in [0, 1] (binary success rewards)")
    p = segment_mean(v.R, v.seg, v.n_seg)
    a, b = beta_params(p, alpha, beta)
    log_b = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    pc = p.clamp(1e-12, 1 - 1e-12)
    dens = torch.exp((a - 1) * pc.log() + (b - 1) * (1 - pc).log() - log_b)
    return to_tokens(batch, v, centred(v, p) / dens.clamp(min=eps)[v.seg], out)


@estimator("ngrpo", family=FAMILY, needs=("group",),
           source="NGRPO: Negative-enhanced Group Relative Policy Optimization")
def ngrpo(batch: TurnBatch, *, max_reward: float | None = 1.0, unbiased: bool = True,
          eps: float = 1e-6, by_agent: bool = False,
          out: Tensor | None = None) -> Tensor:
    """Advantage calibration: a virtual sample with reward r_max joins each group.

    mu = (sum_g R + r_max) / (G+1);  s^2 = (sum_g (R-mu)^2 + (r_max-mu)^2) / (G or G+1)
    (``unbiased``);  A_i = (R_i - mu) / (s + eps). All-wrong groups get negative
    advantages; groups at r_max get 0. ``max_reward=None`` uses the batch maximum.
    Shapes: [n_rows, T]. Source: NGRPO (pair with asymmetric clipping in ppo_clip)."""
    _check_eps(eps)
    v = traj_view(batch, by_agent)
    r_max = float(v.R.max()) if max_reward is None else float(max_reward)
    if bool((v.R - r_max).max() > 0):
        raise ValueError(f"ngrpo: a return exceeds max_reward={r_max}")
    cnt = v.count()
    mu = (segment_sum(v.R, v.seg, v.n_seg) + r_max) / (cnt + 1)
    ss = segment_sum((v.R - mu[v.seg]) ** 2, v.seg, v.n_seg) + (r_max - mu) ** 2
    std = (ss / (cnt if unbiased else cnt + 1)).sqrt()
    at_max = ~has_spread(v.R, v.seg, v.n_seg) & (segment_mean(v.R, v.seg, v.n_seg) == r_max)
    a = (v.R - mu[v.seg]) / (std[v.seg] + eps)
    return to_tokens(batch, v, torch.where(at_max[v.seg], torch.zeros_like(a), a), out)


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
           eps: float = 1e-6, by_agent: bool = False,
           out: Tensor | None = None) -> Tensor:
    """A_i = lam * A_i^grpo if A_i^grpo > 0 else A_i^grpo, lam in [0, 1] (our reading).

    lam is ``factor`` or follows `schedule_factor` (step/total_steps). Only the asymmetric
    suppression of correct trajectories is implemented; the paper's difficulty curriculum
    is not. Defaults are ours. Shapes: [n_rows, T]. Source: A-GRAE."""
    lam = schedule_factor(factor, step, total_steps, factor_start, factor_end)
    v = traj_view(batch, by_agent)
    a = grpo_advantage(v, scale, std_over, unbiased, eps)
    return to_tokens(batch, v, torch.where(a > 0, a * lam, a), out)


@estimator("opo", family=FAMILY, needs=("group", "lengths"),
           source="On-Policy RL with Optimal Reward Baseline (OPO)")
def opo(batch: TurnBatch, *, by_agent: bool = False,
        out: Tensor | None = None) -> Tensor:
    """A_i = R_i - b_g, b_g = sum_g len_i R_i / sum_g len_i, len_i the trajectory's action
    tokens (``batch.length`` summed over its rows); plain mean if a group has no tokens.
    Shapes: [n_rows, T]. Source: On-Policy RL with Optimal Reward Baseline (OPO)."""
    v = traj_view(batch, by_agent)
    ln = v.length(batch)
    num = segment_sum(ln * v.R, v.seg, v.n_seg)
    den = segment_sum(ln, v.seg, v.n_seg)
    b = torch.where(den > 0, num / den.clamp(min=1), segment_mean(v.R, v.seg, v.n_seg))
    return to_tokens(batch, v, centred(v, b), out)


def _whiten(x: Tensor, v: TrajView, eps: float) -> Tensor:
    bseg, nb = v.batch_seg()
    mean = segment_mean(x, bseg, nb)[bseg]
    std = segment_std(x, bseg, nb)[bseg]
    spread = has_spread(x, bseg, nb)[bseg]
    return torch.where(spread, (x - mean) / (std + eps), torch.zeros_like(x))


@estimator("reinforce_pp", family=FAMILY, needs=(),
           source="REINFORCE++: A Simple and Efficient Approach for Aligning LLMs")
def reinforce_pp(batch: TurnBatch, *, eps: float = 1e-6, by_agent: bool = False,
                 out: Tensor | None = None) -> Tensor:
    """A_i = (R_i - mean_B R) / (std_B R + eps) over all trajectories of the batch B (per
    agent with ``by_agent``; std unbiased). Whitening is over trajectories, not tokens
    (our choice). Shapes: [n_rows, T]. Source: REINFORCE++."""
    _check_eps(eps)
    v = traj_view(batch, by_agent)
    return to_tokens(batch, v, _whiten(v.R, v, eps), out)


@estimator("reinforce_pp_baseline", family=FAMILY, needs=("group",),
           source="REINFORCE++: A Simple and Efficient Approach for Aligning LLMs")
def reinforce_pp_baseline(batch: TurnBatch, *, eps: float = 1e-6, by_agent: bool = False,
                          out: Tensor | None = None) -> Tensor:
    """c_i = R_i - mean_g R, then A_i = (c_i - mean_B c) / (std_B c + eps) over the batch
    (std unbiased; mean_B c = 0 when every group is whole). Shapes: [n_rows, T].
    Source: REINFORCE++ (the group-baseline variant)."""
    _check_eps(eps)
    v = traj_view(batch, by_agent)
    return to_tokens(batch, v, _whiten(centred(v), v, eps), out)


@estimator("gpg", family=FAMILY, needs=("group",),
           source="GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning")
def gpg(batch: TurnBatch, *, by_agent: bool = False,
        out: Tensor | None = None) -> Tensor:
    """A_i = (R_i - mean_g R) / f, f = (groups with non-zero reward variance) / (groups);
    no std. Shapes: [n_rows, T]. Source: GPG (Group Policy Gradient)."""
    v = traj_view(batch, by_agent)
    f = has_spread(v.R, v.seg, v.n_seg).double().mean() if v.n_seg else v.R.new_ones(())
    return to_tokens(batch, v, centred(v) / f.clamp(min=1.0 / max(v.n_seg, 1)), out)


@estimator("remax", family=FAMILY, needs=("greedy_reward",),
           source="ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method "
           "for Aligning Large Language Models")
def remax(batch: TurnBatch, *, baseline: Tensor | None = None, by_agent: bool = False,
          out: Tensor | None = None) -> Tensor:
    """A_i = R_i - b_i, b_i the reward of the greedy rollout of i's prompt: option
    ``baseline`` [n_rows] or ``batch.extras["greedy_reward"]`` (read at the trajectory's
    first row). ``by_agent`` has no effect. Shapes: [n_rows, T]. Source: ReMax."""
    v = traj_view(batch, by_agent)
    if baseline is None:
        if "greedy_reward" not in batch.extras:
            raise ValueError("remax needs baseline=Tensor[n_rows] or "
                             "batch.extras['greedy_reward']")
        baseline = batch.extras["greedy_reward"]
    b = torch.as_tensor(baseline, device=v.R.device).double()
    if b.shape != (batch.n_rows,):
        raise ValueError(f"remax: baseline must have shape [{batch.n_rows}], got {tuple(b.shape)}")
    b = b[v.first]
    if not torch.isfinite(b).all():
        raise ValueError("remax: the greedy-rollout baseline is missing (NaN) for some rows")
    return to_tokens(batch, v, v.R - b, out)

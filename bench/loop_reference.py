"""Straightforward Python-loop references for the trajectory-level estimators.

Written the way early open-source GRPO code was: a Python loop over rows collects each
group's scores, then a loop over groups computes the statistics with plain floats and
writes the group's advantages onto its rows' action tokens. Used by
bench/advantages.py for the speed-up figure and as an independent correctness check.
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import contextmanager

import torch
from torch import Tensor


def _collect(batch, by_agent=False):
    """Per-row loop: each trajectory's return, length and rows; each group's trajectories."""
    ret, length, rows, groups = {}, defaultdict(int), defaultdict(list), defaultdict(list)
    for i in range(batch.n_rows):
        t = int(batch.traj[i])
        rows[t].append(i)
        length[t] += int(batch.length[i])
        if t not in ret:
            ret[t] = float(batch.returns[i])
            key = (int(batch.group[i]), int(batch.agent[i])) if by_agent else int(batch.group[i])
            groups[key].append(t)
    return ret, length, rows, groups


_TARGETS: list[Tensor] = []  # buffers given by `writing_into`, innermost last


@contextmanager
def writing_into(buf: Tensor):
    """Inside, the references write their result into ``buf`` (zeroed first) instead of a
    fresh tensor: the loop side of bench/advantages.py's preallocated-output comparison."""
    _TARGETS.append(buf)
    try:
        yield buf
    finally:
        _TARGETS.pop()


def _finish(batch, adv_traj: dict, rows: dict) -> Tensor:
    """Per group of rows (here: per trajectory's group), write A onto the action tokens."""
    out = _TARGETS[-1].zero_() if _TARGETS else torch.zeros(batch.action_mask.shape)
    by_group = defaultdict(list)
    for t in adv_traj:
        by_group[int(batch.group[rows[t][0]])].append(t)
    for ts in by_group.values():
        idx = torch.tensor([i for t in ts for i in rows[t]])
        vals = torch.tensor([adv_traj[t] for t in ts for _ in rows[t]])
        out[idx] = vals[:, None] * batch.action_mask[idx]
    return out


def _mean(x):
    return sum(x) / len(x)


def _std(x, unbiased=True):
    if len(x) < 2:
        return 0.0
    m = _mean(x)
    return math.sqrt(sum((v - m) ** 2 for v in x) / (len(x) - 1 if unbiased else len(x)))


def _flat(x):
    return max(x) == min(x)


def _per_group(batch, fn, by_agent=False):
    """Apply ``fn(values, lengths) -> advantages`` to each group's trajectories."""
    ret, length, rows, groups = _collect(batch, by_agent)
    out = {}
    for ts in groups.values():
        for t, a in zip(ts, fn([ret[t] for t in ts], [length[t] for t in ts])):
            out[t] = a
    return _finish(batch, out, rows)


def reinforce(batch, baseline=0.0, **_):
    ret, _, rows, _ = _collect(batch)
    return _finish(batch, {t: r - baseline for t, r in ret.items()}, rows)


def rloo(batch, by_agent=False, **_):
    def fn(x, _):
        s = sum(x)
        return [0.0 if len(x) < 2 else v - (s - v) / (len(x) - 1) for v in x]
    return _per_group(batch, fn, by_agent)


def grpo(batch, eps=1e-6, scale=True, by_agent=False, **_):
    def fn(x, _):
        if _flat(x):
            return [0.0] * len(x)
        m, s = _mean(x), _std(x)
        return [(v - m) / (s + eps) if scale else v - m for v in x]
    return _per_group(batch, fn, by_agent)


def dr_grpo(batch, by_agent=False, **_):
    return grpo(batch, scale=False, by_agent=by_agent)


def mc_grpo(batch, by_agent=False, **_):
    def fn(x, _):
        s, k = sorted(x), len(x)
        med = (s[(k - 1) // 2] + s[k // 2]) / 2
        return [0.0 if _flat(x) else v - med for v in x]
    return _per_group(batch, fn, by_agent)


def ngrpo(batch, max_reward=1.0, eps=1e-6, by_agent=False, **_):
    def fn(x, _):
        if _flat(x) and x[0] == max_reward:
            return [0.0] * len(x)
        y = x + [max_reward]
        m, s = _mean(y), _std(y)
        return [(v - m) / (s + eps) for v in x]
    return _per_group(batch, fn, by_agent)


def a_grae(batch, factor=0.5, step=None, total_steps=None, factor_start=1.0, factor_end=0.5,
           eps=1e-6, by_agent=False, **_):
    if step is not None:
        factor = factor_start + (factor_end - factor_start) * min(max(step / total_steps, 0), 1)
    adv = grpo(batch, eps=eps, by_agent=by_agent)
    return torch.where(adv > 0, adv * factor, adv, out=adv if _TARGETS else None)


def opo(batch, by_agent=False, **_):
    def fn(x, lens):
        if _flat(x):
            return [0.0] * len(x)
        b = sum(v * n for v, n in zip(x, lens)) / sum(lens) if sum(lens) else _mean(x)
        return [v - b for v in x]
    return _per_group(batch, fn, by_agent)


def bnpo(batch, eps=1e-6, by_agent=False, **_):
    ret, _, rows, groups = _collect(batch, by_agent)
    p = {k: _mean([ret[t] for t in ts]) for k, ts in groups.items()}
    ps = list(p.values())
    m, var = _mean(ps), _std(ps, unbiased=False) ** 2
    if var <= 0 or m * (1 - m) <= var:
        a = b = 1.5
    else:
        c = m * (1 - m) / var - 1
        a, b = 1 + m * c / 3, 1 + (1 - m) * c / 3
    log_b = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    out = {}
    for k, ts in groups.items():
        q = min(max(p[k], 1e-12), 1 - 1e-12)
        f = max(math.exp((a - 1) * math.log(q) + (b - 1) * math.log(1 - q) - log_b), eps)
        flat = _flat([ret[t] for t in ts])
        for t in ts:
            out[t] = 0.0 if flat else (ret[t] - p[k]) / f
    return _finish(batch, out, rows)


def _whiten_all(batch, adv_traj, rows, eps):
    vals = list(adv_traj.values())
    if _flat(vals):
        return _finish(batch, dict.fromkeys(adv_traj, 0.0), rows)
    m, s = _mean(vals), _std(vals)
    return _finish(batch, {t: (v - m) / (s + eps) for t, v in adv_traj.items()}, rows)


def reinforce_pp(batch, eps=1e-6, **_):
    ret, _, rows, _ = _collect(batch)
    return _whiten_all(batch, ret, rows, eps)


def reinforce_pp_baseline(batch, eps=1e-6, **_):
    ret, _, rows, groups = _collect(batch)
    c = {}
    for ts in groups.values():
        x = [ret[t] for t in ts]
        m = _mean(x)
        for t in ts:
            c[t] = 0.0 if _flat(x) else ret[t] - m
    return _whiten_all(batch, c, rows, eps)


def gpg(batch, by_agent=False, **_):
    ret, _, rows, groups = _collect(batch, by_agent)
    frac = sum(not _flat([ret[t] for t in ts]) for ts in groups.values()) / len(groups)
    out = {}
    for ts in groups.values():
        x = [ret[t] for t in ts]
        m = _mean(x)
        for t in ts:
            out[t] = 0.0 if _flat(x) else (ret[t] - m) / frac
    return _finish(batch, out, rows)


def remax(batch, baseline=None, **_):
    b = batch.extras["greedy_reward"] if baseline is None else baseline
    ret, _, rows, _ = _collect(batch)
    return _finish(batch, {t: r - float(b[rows[t][0]]) for t, r in ret.items()}, rows)


LOOP_REFERENCES = {f.__name__: f for f in (
    reinforce, rloo, grpo, dr_grpo, mc_grpo, ngrpo, a_grae, opo, bnpo, reinforce_pp,
    reinforce_pp_baseline, gpg, remax)}

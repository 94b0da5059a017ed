"""An optimizer step that never leaves a weight or an optimizer moment non-finite.

`guarded_step(optimizer, grad_norm)` runs ``optimizer.step()`` and reports whether it was
kept. A step that would make a weight or an AdamW moment NaN or inf is undone, bit for bit,
and reported as not kept (the learner then counts a skipped update, `NonFiniteError` after
``train.max_skipped_updates`` in a row). The usual step costs no copy: `step_stays_finite`
proves it safe from a few maxima first.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from sparring.train.sharded_weights import local


class NonFiniteError(RuntimeError):
    """Too many consecutive updates had a non-finite loss, gradient or updated weight."""


def amax(ts: list[Tensor]) -> float:
    """``max |x|`` over all the tensors ``ts`` (NaN if one holds a NaN), one device sync;
    over this rank's shard of a sharded tensor (`sparring.train.sharded_weights`)."""
    if not ts:
        return 0.0
    ts = [local(t) for t in ts]
    if ts[0].is_cuda and hasattr(torch.nn.utils, "get_total_norm"):  # fused, torch >= 2.6
        return float(torch.nn.utils.get_total_norm(ts, math.inf))
    # on CPU the inf-norm is ~10x slower than aminmax
    return float(torch.stack([torch.stack(torch.aminmax(t.detach())).float() for t in ts])
                 .abs().max())


def step_stays_finite(optimizer: torch.optim.Optimizer, grad_norm: float) -> bool:
    """True when this AdamW step provably leaves every weight and moment finite, from
    maxima of the tensors it reads (no copies). With ``G = grad_norm >= max|g|`` (the
    gradients' norm before clipping), per parameter group: the new first moment is a
    convex mix of the old one and the gradient, ``|m'| <= M = max(max|m|, G)``; the step
    is ``p' = p (1 - lr wd) - lr / (1 - b1^t) m' / (sqrt(v'_hat) + eps)``, so
    ``|p'| <= max|p| |1 - lr wd| + lr M / ((1 - b1) eps)``; and ``v' <= max v + G^2``.
    These bounds and the step size ``lr / (1 - b1^t)`` must stay under a quarter of the
    weights' largest float (room for rounding); a NaN or inf anywhere fails the test.
    The same holds for `sparring.train.row_sparse_adamw.RowSparseAdamW`, whose rows that
    do not step keep their values. Any other optimizer: False (no proof)."""
    if not isinstance(optimizer, torch.optim.AdamW):
        return False
    for group in optimizer.param_groups:
        ps = [p for p in group["params"] if p.grad is not None]
        if not ps:
            continue
        lr, wd, (b1, _), eps = (float(group["lr"]), group["weight_decay"], group["betas"],
                                group["eps"])
        states = [optimizer.state.get(p, {}) for p in ps]
        p_max = amax(ps)
        m_max = amax([s["exp_avg"] for s in states if "exp_avg" in s])
        v_max = amax([s["exp_avg_sq"] for s in states if "exp_avg_sq" in s])
        if not (all(map(math.isfinite, (p_max, m_max, v_max, grad_norm, lr)))
                and eps > 0 and 0 <= b1 < 1):
            return False
        M = max(m_max, grad_norm)
        p_bound = p_max * abs(1 - lr * wd) + lr * M / ((1 - b1) * eps)
        v_bound = v_max + grad_norm**2
        limit = min(torch.finfo(p.dtype).max for p in ps) / 4
        if not (p_bound < limit and v_bound < limit and lr / (1 - b1) < limit):
            return False
    return True


def guarded_step(optimizer: torch.optim.Optimizer, grad_norm: float,
                 agree: Callable[[bool], bool] | None = None) -> bool:
    """``optimizer.step()``, unless it makes a weight or a moment non-finite: then the
    weights and the optimizer are put back bit for bit and the result is False. When
    `step_stays_finite` proves the step safe (any sane learning rate) no copy is made;
    otherwise the parameters and their optimizer state are copied first (and put back
    too if the step raises, e.g. torch's overflow error for a step size beyond float32).
    ``agree(ok)``: True when ``ok`` holds on every learner rank, where each rank steps
    its own share of the parameters (`sparring.train.sharded_optimizer`); the proof and
    the finiteness check are then agreed, so every rank keeps the step or none does (a
    rank whose step raised puts it back and raises after the others have agreed)."""
    agree = agree or (lambda ok: ok)
    if agree(step_stays_finite(optimizer, grad_norm)):
        optimizer.step()
        return True
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    saved = [(p, p.detach().clone(), {k: v.clone() if isinstance(v, Tensor) else v
                                      for k, v in optimizer.state.get(p, {}).items()})
             for p in params]

    def put_back() -> None:
        with torch.no_grad():
            for p, weights, state in saved:
                p.copy_(weights)
                if state:
                    optimizer.state[p] = state
                else:  # its first step: AdamW had no state for it
                    optimizer.state.pop(p, None)

    raised: Exception | None = None
    try:
        optimizer.step()
    except Exception as e:
        raised = e
    except BaseException:
        put_back()
        raise
    ok = raised is None and all(
        bool(torch.isfinite(local(t)).all()) for p in params
        for t in (p, *optimizer.state[p].values())
        if isinstance(t, Tensor) and t.is_floating_point())
    if agree(ok):
        return True
    put_back()
    if raised is not None:
        raise raised
    return False

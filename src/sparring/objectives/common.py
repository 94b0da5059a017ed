"""Helpers shared by the objectives: shape checks, per-sequence sums, the clamped log
ratio, the units of an importance ratio (token, turn, sequence) and its diagnostics."""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.segments import compact_ids, segment_mean

# |log rho| is clamped to this before exp (as verl does), so rho <= e^20 ~ 4.9e8 never
# overflows to inf (whose gradient would be NaN even where a clip zeroes the loss's).
LOG_RATIO_CLAMP = 20.0

RATIO_LEVELS = ("token", "turn", "sequence")


def check_same_shape(name: str, **tensors: Tensor | None) -> None:
    """All given tensors must have one 2-D shape ``[n, T]``."""
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if v is not None}
    if len(set(shapes.values())) > 1 or any(len(s) != 2 for s in shapes.values()):
        raise ValueError(f"{name}: expected tensors of one shape [n, T], got {shapes}")


def seq_sum(x: Tensor, mask: Tensor) -> Tensor:
    """``sum_t mask * x`` per row: [n, T] -> [n]."""
    return (x * mask).sum(1)


def seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over each row's masked tokens: [n, T] -> [n] (0 for empty rows)."""
    return (x * mask).sum(1) / mask.sum(1).clamp(min=1)


def group_inputs(name: str, n: int, group: Tensor | None, rewards: Tensor | None,
                 device: torch.device) -> tuple[Tensor, int, Tensor]:
    """Validate the ``group=Long[n]`` and ``rewards=Float[n]`` options; compact the groups."""
    if group is None or rewards is None:
        raise ValueError(f"{name} needs the options group=Long[n] and rewards=Float[n]")
    g = torch.as_tensor(group, device=device).long()
    r = torch.as_tensor(rewards, device=device, dtype=torch.float32)
    if g.shape != (n,) or r.shape != (n,):
        raise ValueError(f"{name}: group and rewards must have shape [{n}], "
                         f"got {tuple(g.shape)} and {tuple(r.shape)}")
    seg, n_seg = compact_ids(g)
    return seg, n_seg, r


def check_clip(name: str, **eps: float | None) -> None:
    for k, v in eps.items():
        if v is not None and not v >= 0:
            raise ValueError(f"{name}: {k} must be >= 0, got {v!r}")


def log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """log rho = logp - old_logp, clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]: every
    ratio-based objective (and the k3 KL estimator) takes exp of this, never of the raw
    difference. A clamped token has zero gradient (it is far outside any clip range)."""
    return (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def token_form(log_unit: Tensor, tok: Tensor) -> Tensor:
    """exp(sg(log_unit) + tok - sg(tok)): value exp(log_unit) on every token, gradient
    exp(log_unit) * d tok_t on token t (the GSPO-token form). ``log_unit`` is [n, T]
    (the unit's log ratio on each of its tokens) or [n] (one per row)."""
    if log_unit.dim() == 1:
        log_unit = log_unit[:, None]
    return torch.exp(log_unit.detach() + tok - tok.detach())


def unit_index(mask: Tensor, level: str) -> tuple[Tensor, int]:
    """The unit of every masked token at ``level`` (``ratio_level``), as ids ``Long[n, T]``
    in ``0..k-1`` (``k`` on tokens outside the mask), and ``k``.

    * ``token``: each masked token is a unit;
    * ``turn``: each maximal run of masked tokens within a row (in the trajectory layout
      observation tokens separate a row's turns; in the turn layout a row is one turn);
    * ``sequence``: the masked tokens of each row.
    """
    if level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level must be one of {', '.join(RATIO_LEVELS)}, got {level!r}")
    m = mask.bool()
    if level == "token":
        start = m
    elif level == "turn":
        start = m & ~torch.cat([m.new_zeros(m.shape[0], 1), m[:, :-1]], 1)
    else:
        start = m & (m.cumsum(1) == 1)
    k = int(start.sum())
    # row-major, a masked token's unit is the last start at or before it (always in its row)
    ids = start.flatten().cumsum(0).view_as(m) - 1
    return torch.where(m, ids, k), k


def unit_log_ratio(d: Tensor, mask: Tensor, level: str) -> tuple[Tensor, Tensor]:
    """Mean of the log ratio ``d`` over each unit's tokens (detached): ``(per_token [n, T],
    per_unit [k])``; ``per_token`` holds its unit's value on each masked token, 0 elsewhere."""
    unit, k = unit_index(mask, level)
    m = mask.bool()
    per_unit = segment_mean(d.detach()[m], unit[m], k)
    return torch.cat([per_unit, per_unit.new_zeros(1)])[unit], per_unit


def level_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, level: str
                ) -> tuple[Tensor, Tensor]:
    """The importance ratio at ``level`` in per-token form, and the units' ratios.

    d_t = `log_ratio`(logp_t, old_logp_t); unit u's ratio is rho_u = exp(mean_{t in u} d_t)
    (at token level rho_t = exp(d_t); at turn and sequence level the geometric mean of the
    token ratios). Returns ``ratio [n, T]`` = `token_form`: value rho_u on each token of u,
    gradient rho_u * d d_t on token t; and ``rho [k]`` (detached, for diagnostics)."""
    d = log_ratio(logp, old_logp)
    log_u, per_unit = unit_log_ratio(d, mask, level)
    return token_form(log_u, d), per_unit.exp()


def clipped_surrogate(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
                      ) -> Tensor:
    """PPO's pessimistic surrogate, max(-A rho, -A clip(rho, 1-eps_low, 1+eps_high))."""
    return torch.maximum(-advantages * ratio,
                         -advantages * ratio.clamp(1 - eps_low, 1 + eps_high))


def fraction(flags: Tensor) -> Tensor:
    """The fraction of True in ``flags`` as a 0-d float tensor (0 when empty)."""
    return flags.float().mean() if flags.numel() else flags.new_zeros((), dtype=torch.float32)


@torch.no_grad()
def ratio_diagnostics(rho: Tensor, low: Tensor, high: Tensor) -> dict[str, Tensor]:
    """An objective's diagnostics over its units in one call (0-d tensors, no grad):

    * ``clip_frac``, ``clip_frac_low``, ``clip_frac_high``: the fraction of units clipped
      (either side, below, above), from the flags ``low``, ``high`` ``Bool[k]``;
    * ``ratio``, ``ratio_max``: mean and max of the units' ratios ``rho [k']`` (1 when
      there is none).
    """
    one = rho.new_ones(())
    return dict(clip_frac=fraction(low | high), clip_frac_low=fraction(low),
                clip_frac_high=fraction(high),
                ratio=rho.mean() if rho.numel() else one,
                ratio_max=rho.max() if rho.numel() else one)

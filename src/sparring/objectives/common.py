"""Small helpers shared by the objectives: shape checks and per-sequence sums."""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.advantages.traj import compact


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
    seg, n_seg = compact(g)
    return seg, n_seg, r


def check_clip(name: str, **eps: float | None) -> None:
    for k, v in eps.items():
        if v is not None and not v >= 0:
            raise ValueError(f"{name}: {k} must be >= 0, got {v!r}")

"""AdamW that steps only the rows of a matrix that have ever had a gradient.

Without weight decay AdamW leaves a row whose gradient has always been zero exactly as it
is: its moments stay 0 and its step is ``0 / (0 + eps) = 0``. An output layer over a
49,152-token vocabulary of which a game's moves use a dozen tokens (the ``frozen_features``
head, `sparring.policy.heads`) is such a matrix, and torch's AdamW spends its passes over
all 28 M of its entries to move a few thousand. `RowSparseAdamW` keeps AdamW's own state
(the same keys and dense moments, so either optimizer reads the other's checkpoint) and the
rows touched so far (``rows``, a ``[V]`` mask, in the state too), and runs torch's AdamW
update on those rows only: the same operations on the same numbers, so the weights and
moments equal full AdamW's bit for bit, fused or not (tests/test_row_sparse_adamw.py). The
other parameters step as in AdamW.

Cost per step for a sparse matrix: one pass over its gradient to find the rows it touches,
then AdamW over the touched rows (gathered and written back).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim.adamw import adamw
from torch.optim.optimizer import _get_scalar_dtype


class RowSparseAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` whose ``sparse`` parameters (2-D, in groups without weight
    decay) step only on the rows that have had a nonzero gradient (module docstring)."""

    def __init__(self, params: Iterable[Any], sparse: Iterable[Tensor], **kwargs: Any):
        super().__init__(params, **kwargs)
        self.sparse = {id(p) for p in sparse}
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) not in self.sparse:
                    continue
                if p.dim() != 2:
                    raise ValueError(f"RowSparseAdamW: a sparse parameter must be a matrix; "
                                     f"got shape {tuple(p.shape)}")
                if group["weight_decay"] or group["amsgrad"] or group["maximize"]:
                    raise ValueError("RowSparseAdamW: a sparse parameter's group must have "
                                     "no weight decay, amsgrad or maximize (a row with no "
                                     "gradient would move under them)")

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        """AdamW's step; the sparse parameters on their touched rows only."""
        held = []
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) in self.sparse and p.grad is not None:
                    self._row_step(p, group)
                    held.append((p, p.grad))
                    p.grad = None  # AdamW's own step leaves it alone
        try:
            return super().step(closure)
        finally:
            for p, grad in held:
                p.grad = grad

    def _row_step(self, p: Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        fused = bool(group["fused"])
        if not state:  # AdamW's own initial state (its _init_group)
            state["step"] = (torch.zeros((), dtype=_get_scalar_dtype(is_fused=True),
                                         device=p.device) if fused
                             else torch.tensor(0.0, dtype=_get_scalar_dtype()))
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if "rows" not in state:  # fresh, or AdamW's state read from a checkpoint
            state["rows"] = (state["exp_avg"].ne(0).any(1) | state["exp_avg_sq"].ne(0).any(1))
        elif state["rows"].dtype != torch.bool:  # loading casts state to the weight's dtype
            state["rows"] = state["rows"].ne(0)
        grad = p.grad
        state["rows"] |= grad.ne(0).any(1)
        idx = state["rows"].nonzero().squeeze(1)
        if idx.numel() == 0:
            state["step"] += 1  # as AdamW counts a step of an all-zero gradient
            return
        sub = [t.index_select(0, idx) for t in (p, grad, state["exp_avg"], state["exp_avg_sq"])]
        beta1, beta2 = group["betas"]
        adamw([sub[0]], [sub[1]], [sub[2]], [sub[3]], [], [state["step"]], foreach=False,
              capturable=False, differentiable=False, fused=fused, amsgrad=False,
              beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=0.0, eps=group["eps"],
              maximize=False)
        p.index_copy_(0, idx, sub[0])
        state["exp_avg"].index_copy_(0, idx, sub[2])
        state["exp_avg_sq"].index_copy_(0, idx, sub[3])


FUSED_DEVICES = ("cpu", "cuda")
FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def can_fuse(params: Iterable[Tensor]) -> bool:
    """Whether torch's fused AdamW kernel takes every one of ``params``: plain dense
    floating-point tensors on a CPU or a CUDA device (not the DTensors of a model sharded
    over ranks). On a CPU one fused kernel a parameter replaces AdamW's dozen small ones
    (a quarter of the time on the default recipe's 20 matrices)."""
    return all(type(p) in (Tensor, torch.nn.Parameter) and p.device.type in FUSED_DEVICES
               and p.dtype in FUSED_DTYPES and p.layout == torch.strided for p in params)


__all__ = ["RowSparseAdamW", "can_fuse"]

"""Compute precision of a model: float32, or bf16 compute over float32 weights.

``model.precision`` (`sparring.config.ModelConfig`) takes:

- ``float32``: every product in the weights' dtype (``model.dtype``).
- ``bf16-mixed``: matrix products run in bfloat16 under ``torch.autocast``; the weights,
  their gradients and the optimizer state stay float32 (the master copy), so an update is
  applied at full precision. The LM head stays float32 (`Float32Head`): log-probs are
  differences of logits, and a logit of 20 has a bf16 resolution of 0.125. The residual
  stream stays float32 too (float32 embeddings plus bf16 block outputs promote), but each
  block's products are rounded to bf16, so log-probs differ from float32 ones by about
  0.02 nats a token on SmolLM2-135M (tests/test_precision.py bounds it on a small model);
  sampler and learner share the path, and ``algorithm.recompute_old_logp`` makes the PPO
  ratio's two sides one code path.
- ``auto`` (the default): ``bf16-mixed`` where the device computes bf16 natively (a CUDA
  device with bf16, a CPU with AVX-512 BF16 or AMX) and the model has at least
  `min_mixed_params` of that device's type; float32 otherwise. Emulated bf16 (an AVX2 CPU)
  is slower than float32, and on a small model autocast's casts (one per weight per
  forward) cost more than its products save. On a CPU that is below 10 M parameters
  (SmolLM2-135M's step is 2.3-2.9x faster in bf16-mixed there). On a GPU the products are
  so fast that the casts and kernel launches decide: on an H100, SmolLM2-135M's recipe
  steps were 1.2-3.2x slower in bf16-mixed than in float32 (docs/benchmarks.md, "GPU
  figures"), so CUDA needs 1 B parameters. That bound is our reading, not a measured
  crossover: nothing between 135 M and 1 B parameters has been timed in both modes.

Pure bfloat16 weights are ``model.dtype=bfloat16`` with ``precision=float32`` (no
autocast): half the memory, but every update is rounded to bf16's 8 bits of mantissa, so
steps smaller than 1/256 of a weight are lost.

The resolved mode travels with the model (``model.config.sparring_precision``, saved with
it), so every forward of that model (the sampler, the learner, its reference copy) runs
under the same `autocast_for` context.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PRECISIONS = ("auto", "float32", "bf16-mixed")
# below these sizes autocast's casts cost more than bf16 products save (see the docstring)
MIN_MIXED_PARAMS = {"cpu": 10_000_000, "cuda": 1_000_000_000}
_ATTR = "sparring_precision"


@dataclass(frozen=True)
class Resolved:
    """The mode a run uses and why (what the run's log prints)."""

    mode: str  # "float32" | "bf16-mixed"
    reason: str


def native_bf16(device: torch.device | str) -> tuple[bool, str]:
    """Whether ``device`` computes bf16 in hardware, and what was found."""
    device = torch.device(device)
    if device.type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "CUDA bf16" if ok else "this CUDA device has no bf16"
    if device.type == "cpu":
        cpu = torch.cpu
        amx = getattr(cpu, "_is_amx_tile_supported", lambda: False)()
        avx = getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
        if amx or avx:
            return True, "CPU with " + " and ".join(
                n for n, has in (("AMX", amx), ("AVX-512 BF16", avx)) if has)
        return False, "this CPU has no AVX-512 BF16 or AMX (bf16 would be emulated)"
    return False, f"no bf16 check for device type {device.type!r}"


def min_mixed_params(device: torch.device | str) -> int:
    """The smallest model for which ``auto`` picks bf16-mixed on ``device``'s type."""
    return MIN_MIXED_PARAMS.get(torch.device(device).type, MIN_MIXED_PARAMS["cpu"])


def resolve(precision: str, device: torch.device | str, n_params: int,
            weight_dtype: torch.dtype = torch.float32) -> Resolved:
    """The mode of ``precision`` for a model of ``n_params`` in ``weight_dtype``."""
    if precision not in PRECISIONS:
        raise ValueError(f"model.precision={precision!r}; allowed: {', '.join(PRECISIONS)}")
    if weight_dtype != torch.float32:
        if precision == "bf16-mixed":
            raise ValueError(f"model.precision=bf16-mixed keeps float32 master weights; "
                             f"model.dtype is {str(weight_dtype).removeprefix('torch.')} "
                             "(set model.dtype=float32, or precision=float32 for pure "
                             "low-precision weights)")
        return Resolved("float32", f"weights are {str(weight_dtype).removeprefix('torch.')}")
    if precision == "float32":
        return Resolved("float32", "model.precision=float32")
    native, found = native_bf16(device)
    if precision == "bf16-mixed":
        return Resolved("bf16-mixed", "model.precision=bf16-mixed" + (
            "" if native else f" ({found}: slower than float32)"))
    if not native:
        return Resolved("float32", f"auto: {found}")
    least = min_mixed_params(device)
    if n_params < least:
        return Resolved("float32", f"auto: {found}, but {n_params:,} parameters is below "
                        f"{least:,}, where autocast does not pay on this device type")
    return Resolved("bf16-mixed", f"auto: {found}, {n_params:,} parameters")


class Float32Head(nn.Linear):
    """An ``nn.Linear`` that computes in float32 even under autocast (the LM head)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), self.weight.float(), bias)


def apply(model: nn.Module, mode: str) -> None:
    """Record ``mode`` on ``model`` (its config) and, for bf16-mixed, keep its LM head
    float32. The head's class changes in place, so weights, ties and state dict keys stay."""
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("model.precision needs a Hugging Face model (one with a config)")
    setattr(config, _ATTR, mode)
    if mode == "bf16-mixed":
        _float32_head(model)


def _float32_head(model: nn.Module) -> None:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is nn.Linear:
        head.__class__ = Float32Head


def mode_of(model: Any) -> str:
    """The precision recorded on ``model`` (float32 when none was)."""
    return getattr(getattr(model, "config", None), _ATTR, None) or "float32"


def autocast_for(model: Any):
    """The context every forward of ``model`` runs in: bf16 autocast for a bf16-mixed
    model (its LM head made float32 first, e.g. after a reload), else nothing."""
    if mode_of(model) != "bf16-mixed":
        return nullcontext()
    _float32_head(model)
    device = next(model.parameters()).device
    return torch.autocast(device.type, dtype=torch.bfloat16)

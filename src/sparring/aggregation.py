"""Loss aggregation: per-token losses ``[n, T]`` -> one scalar, global-batch aware.

Each mode divides by counts of the *global* batch (``num_tokens``, ``num_seqs``), so the
sum of the micro-batch results equals the full-batch result and the accumulated
gradient does not depend on the micro-batch split. When the counts are not given they
are taken from ``mask`` (i.e. the given tensor is the whole batch).

* ``token-mean``:               sum_{i,t} m l / N_tok
* ``seq-mean-token-mean``:      sum_i (sum_t m l / |y_i|) / N_seq
* ``seq-mean-token-sum``:       sum_{i,t} m l / N_seq
* ``seq-mean-token-sum-norm``:  sum_{i,t} m l / (N_seq * C), C a constant (Dr. GRPO: the
  maximum generation length; default ``mask.shape[1]``, pass it for invariance)

Sequences with no action token count in none of the modes.
Source: Understanding R1-Zero-Like Training (Dr. GRPO) for the constant normaliser.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from sparring.registry import Registry

AGGREGATIONS = Registry("aggregation")


def _register(name: str, source: str) -> Callable[[Callable], Callable]:
    return AGGREGATIONS.register(name, family="aggregation", source=source)


def count_tokens(mask: Tensor) -> int:
    return int(mask.sum())


def count_seqs(mask: Tensor) -> int:
    return int((mask.sum(1) > 0).sum())


@_register("token-mean", "DAPO (token-level loss); verl token-mean")
def token_mean(loss: Tensor, mask: Tensor, *, num_tokens: int | None = None, **_: object) -> Tensor:
    n = count_tokens(mask) if num_tokens is None else num_tokens
    return (loss * mask).sum() / max(n, 1)


@_register("seq-mean-token-mean", "GRPO as written in DeepSeekMath (2024)")
def seq_mean_token_mean(loss: Tensor, mask: Tensor, *, num_seqs: int | None = None,
                        **_: object) -> Tensor:
    n = count_seqs(mask) if num_seqs is None else num_seqs
    per_seq = (loss * mask).sum(1) / mask.sum(1).clamp(min=1)
    return per_seq.sum() / max(n, 1)


@_register("seq-mean-token-sum", "sequence-sum losses (e.g. REINFORCE over whole responses)")
def seq_mean_token_sum(loss: Tensor, mask: Tensor, *, num_seqs: int | None = None,
                       **_: object) -> Tensor:
    n = count_seqs(mask) if num_seqs is None else num_seqs
    return (loss * mask).sum() / max(n, 1)


@_register("seq-mean-token-sum-norm", "Understanding R1-Zero-Like Training (Dr. GRPO)")
def seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, *, num_seqs: int | None = None,
                            norm: float | None = None, **_: object) -> Tensor:
    n = count_seqs(mask) if num_seqs is None else num_seqs
    c = float(mask.shape[1]) if norm is None else float(norm)
    return (loss * mask).sum() / (max(n, 1) * c)


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token-mean", *,
              num_tokens: int | None = None, num_seqs: int | None = None,
              norm: float | None = None) -> Tensor:
    """Reduce ``loss [n, T]`` under ``mask [n, T]`` to a scalar with global counts."""
    fn = AGGREGATIONS[mode]
    m = mask.to(loss.dtype)
    return fn(loss, m, num_tokens=num_tokens, num_seqs=num_seqs, norm=norm)

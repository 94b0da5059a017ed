"""KL estimators k1, k2, k3 and the entropy bonus.

With d_t = logp_t - ref_logp_t on tokens sampled from pi (Schulman, "Approximating KL
Divergence", 2020), each estimates KL(pi || pi_ref) per token:
k1 = d (unbiased, high variance), k2 = d^2 / 2 (biased, low variance),
k3 = exp(-d) - 1 + d (unbiased, low variance, >= 0).

As a loss term, the objectives ``kl_k1``, ``kl_k2``, ``kl_k3`` return ``coef * k``
per token; add it to a policy loss before aggregation::

    l = loss("ppo_clip", logp, old, adv, mask) + loss("kl_k3", logp, old, adv, mask,
                                                       ref_logp=ref, coef=0.01)

To fold KL into rewards instead, use the estimators on detached log-probs (issue 3's
``kl_in_reward`` shaping).
"""

from __future__ import annotations

from torch import Tensor

from sparring.objectives import objective
from sparring.objectives.common import check_same_shape

_SOURCE = "Schulman, Approximating KL Divergence (2020)"
LOG_RATIO_CLAMP = 20.0  # |d| is clamped before exp in k3 so it never overflows


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp - ref_logp. [n, T] -> [n, T]."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = (logp - ref_logp)^2 / 2. [n, T] -> [n, T]."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - 1 - (ref - logp), log-ratio clamped to +-20. [n, T]."""
    x = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return x.exp() - 1 - x


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(logp: Tensor, ref_logp: Tensor, mask: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(pi || pi_ref) estimate ``[n, T]``, zero outside ``mask``."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; known: {', '.join(KL_ESTIMATORS)}")
    check_same_shape("kl_estimate", logp=logp, ref_logp=ref_logp, mask=mask)
    return KL_ESTIMATORS[kind](logp, ref_logp) * mask


def _kl_objective(kind: str):
    def fn(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
           ref_logp: Tensor | None = None, coef: float = 1.0) -> Tensor:
        return coef * kl_estimate(logp, ref_logp, mask, kind)

    fn.__name__ = f"kl_{kind}"
    fn.__doc__ = (f"l_t = coef * {kind}(logp_t, ref_logp_t): a KL(pi || pi_ref) penalty to add "
                  f"to a policy loss. Shapes: [n, T] -> [n, T]. Source: {_SOURCE}.")
    return objective(f"kl_{kind}", family="kl", needs=("ref_logp",), source=_SOURCE)(fn)


for _kind in KL_ESTIMATORS:
    _kl_objective(_kind)


def entropy_bonus(entropy: Tensor, mask: Tensor, coef: float = 0.01) -> Tensor:
    """l_t = -coef * H_t: minimising it raises the policy's entropy. [n, T] -> [n, T]."""
    check_same_shape("entropy_bonus", entropy=entropy, mask=mask)
    return -coef * entropy * mask


@objective("entropy_bonus", family="kl", needs=("entropy",),
           source="Asynchronous Methods for Deep Reinforcement Learning (A3C), 2016")
def entropy_objective(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                      ref_logp: Tensor | None = None, entropy: Tensor | None = None,
                      coef: float = 0.01) -> Tensor:
    """l_t = -coef * H_t with ``entropy=[n, T]`` the current policy's per-token entropy
    (with gradient; `sparring.policy.forward.token_logprobs(..., with_entropy=True)`).
    Shapes: [n, T] -> [n, T]. Source: A3C (entropy regularisation)."""
    if entropy is None:
        raise ValueError("entropy_bonus needs the option entropy=Tensor[n, T]")
    return entropy_bonus(entropy, mask, coef)

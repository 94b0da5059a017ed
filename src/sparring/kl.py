"""KL estimators k1, k2, k3: the one implementation of KL(pi || pi_ref) per token.

With d_t = logp_t - ref_logp_t on tokens sampled from pi (Schulman, "Approximating KL
Divergence", 2020), each estimates KL(pi || pi_ref) per token:

* k1 = d                      (unbiased, high variance, can be negative);
* k2 = d^2 / 2                (biased, low variance, >= 0);
* k3 = exp(-d) - 1 + d        (unbiased, low variance, >= 0).

As loss terms their gradients differ (samples fixed, the gradient through log pi only;
exactly, over a categorical: tests/test_kl.py):

* E_pi[grad k1] = 0: k1 as a loss does not regularise at all;
* E_pi[grad k2] = E_pi[d grad log pi] = grad KL(pi || pi_ref): the reverse KL that a KL
  penalty, and magnetic mirror descent's magnet, ask for (on-policy; with old samples it
  is biased by the ratio pi / pi_old);
* E_pi[grad k3] = E_pi[(1 - pi_ref / pi) grad log pi] = grad KL(pi_ref || pi): the
  *forward* KL, with a weight pi_ref / pi that is unbounded on tokens pi has made rare
  (a heavy-tailed gradient: one such token can dominate an update).

So k3 is the better estimate of the KL's value and k2 the better gradient for it
(known: Tang and Munos 2025 on KL gradient estimation; "A Comedy of Estimators", 2025).

These are loss terms of the learner, not objectives: `sparring.train.learner.Learner`
adds ``algorithm.kl.coef * aggregate(kl_estimate(logp, ref_logp, mask, kind))`` to the
policy loss (and logs ``approx_kl``, the k3 estimate of KL(pi_old || pi)); the
``kl_in_reward`` reward shaper (`sparring.advantages.shaping`) folds ``-beta * k`` of
the sampling policy into the rewards instead.
"""

from __future__ import annotations

from torch import Tensor

from sparring.objectives.common import check_same_shape, log_ratio

SOURCE = "Schulman, Approximating KL Divergence (2020)"


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = logp - ref_logp. [n, T] -> [n, T]."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = (logp - ref_logp)^2 / 2. [n, T] -> [n, T]."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(x) - 1 - x, x = ref_logp - logp clamped by `log_ratio` (to +-20, so
    exp never overflows). [n, T] -> [n, T]."""
    x = log_ratio(ref_logp, logp)
    return x.exp() - 1 - x


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(logp: Tensor, ref_logp: Tensor, mask: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate ``[n, T]`` of KL(pi || pi_ref), zero outside ``mask``, for
    tokens sampled from pi (``logp``); ``kind`` in `KL_ESTIMATORS`."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; known: {', '.join(KL_ESTIMATORS)}")
    check_same_shape("kl_estimate", logp=logp, ref_logp=ref_logp, mask=mask)
    return KL_ESTIMATORS[kind](logp, ref_logp) * mask

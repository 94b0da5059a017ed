"""KL estimators k1, k2, k3 (`sparring.kl`) against hand values and exact expectations."""

import math

import pytest
import torch

from sparring.kl import KL_ESTIMATORS, kl_estimate


def tok(values, requires_grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)


def test_kl_estimators_hand_and_exact_expectation():
    d = math.log(2.0)
    lp, ref, m = tok([[d]]), tok([[0.0]]), torch.ones(1, 1)
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}
    assert abs(float(kl_estimate(lp, ref, m, "k1")) - d) < 1e-12
    assert abs(float(kl_estimate(lp, ref, m, "k2")) - d * d / 2) < 1e-12
    assert abs(float(kl_estimate(lp, ref, m, "k3")) - (0.5 - 1 + d)) < 1e-12
    # exact expectation under pi over a categorical: k1 and k3 are unbiased for KL(pi||ref)
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    kl = float((pi * (pi / q).log()).sum())
    ones = torch.ones(1, 3)
    for kind in ("k1", "k3"):
        k = kl_estimate(pi.log()[None], q.log()[None], ones, kind)
        assert abs(float((pi * k[0]).sum()) - kl) < 1e-12
    assert (kl_estimate(pi.log()[None], q.log()[None], ones, "k3") >= 0).all()
    # as a loss term: d/dlogp k3 = 1 - exp(ref - logp) = 1 - 1/2
    lpg = tok([[d]], requires_grad=True)
    kl_estimate(lpg, ref, m, "k3").sum().backward()
    assert abs(float(lpg.grad) - (1 - 0.5)) < 1e-12
    with pytest.raises(ValueError, match="unknown KL"):
        kl_estimate(lp, ref, m, "k4")


def test_k3_is_clamped_and_masked():
    # ref - logp = 1000 would overflow exp; it is clamped to 20: k3 = e^20 - 1 - 20, and
    # the clamped token has no gradient. The masked token contributes 0.
    lp = tok([[-1001.0, -1.0, -3.0]], requires_grad=True)
    ref = tok([[-1.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    k = kl_estimate(lp, ref, mask, "k3")
    assert torch.allclose(k, tok([[math.exp(20.0) - 21.0, 0.0, 0.0]]), rtol=1e-12)
    k.sum().backward()
    assert lp.grad.tolist() == [[0.0, 0.0, 0.0]]

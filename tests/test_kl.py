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


def test_as_loss_terms_k2_follows_the_reverse_kl_and_k3_the_forward_kl():
    # The learner adds mean_a~pi k(a) with the samples fixed and the gradient through
    # log pi(a) only. Its expected gradient, exactly over a categorical pi = softmax(theta):
    # sum_a pi(a) d k(a)/d theta. Closed forms: d KL(pi||ref)/d theta (reverse, what a KL
    # penalty and magnetic mirror descent ask for) and d KL(ref||pi)/d theta (forward).
    theta0 = torch.tensor([1.0, -0.5, 0.3, -2.0], dtype=torch.float64)
    ref = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64).log()

    def expected_grad(kind):
        theta = theta0.clone().requires_grad_(True)
        logp = torch.log_softmax(theta, 0)
        weights = logp.exp().detach()  # the sampling distribution, no gradient
        k = kl_estimate(logp[None], ref[None], torch.ones(1, 4), kind)[0]
        (weights * k).sum().backward()
        return theta.grad

    def closed_form(forward):
        theta = theta0.clone().requires_grad_(True)
        logp = torch.log_softmax(theta, 0)
        kl = (ref.exp() * (ref - logp)).sum() if forward else (logp.exp() * (logp - ref)).sum()
        kl.backward()
        return theta.grad

    reverse, forward = closed_form(False), closed_form(True)
    assert not torch.allclose(reverse, forward, atol=1e-3)  # they differ here
    torch.testing.assert_close(expected_grad("k2"), reverse, atol=1e-12, rtol=0)
    torch.testing.assert_close(expected_grad("k3"), forward, atol=1e-12, rtol=0)
    # k1's expected gradient is zero: sum_a pi(a) d log pi(a) = d sum_a pi(a) = 0
    torch.testing.assert_close(expected_grad("k1"), torch.zeros(4, dtype=torch.float64),
                               atol=1e-12, rtol=0)

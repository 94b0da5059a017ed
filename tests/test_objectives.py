"""Objectives, KL estimators, entropy bonus and ratio_stats against hand formulas."""

import math

import pytest
import torch
import torch.nn.functional as F

from sparring.aggregation import aggregate
from sparring.objectives import loss
from sparring.objectives.kl import kl_estimate
from sparring.objectives.stats import ratio_stats
from sparring.registry import UnknownNameError

L15, L05, L5 = math.log(1.5), math.log(0.5), math.log(5.0)


def tok(values, requires_grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)


def test_ppo_clip_hand_values_and_gradient():
    # one row, four tokens: (log ratio, A): (ln1.5, 1) (ln0.5, -1) (ln5, -1) (0.05, 1)
    logp = tok([[L15, L05, L5, 0.05]], requires_grad=True)
    old = torch.zeros(1, 4, dtype=torch.float64)
    adv = tok([[1.0, -1.0, -1.0, 1.0]])
    mask = torch.ones(1, 4)
    r4 = math.exp(0.05)
    got = loss("ppo_clip", logp, old, adv, mask)
    # max(-1.5, -1.2); max(0.5, 0.8); max(5, 1.2); unclipped -r4
    assert torch.allclose(got, tok([[-1.2, 0.8, 5.0, -r4]]))
    got.sum().backward()
    # gradient -A*rho on unclipped tokens, 0 on clipped ones
    assert torch.allclose(logp.grad, tok([[0.0, 0.0, 5.0, -r4]]))
    dual = loss("ppo_clip", logp, old, adv, mask, dual_clip=3.0)
    assert torch.allclose(dual, tok([[-1.2, 0.8, 3.0, -r4]]))
    higher = loss("ppo_clip", logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert abs(float(higher[0, 0].detach()) + 1.28) < 1e-9
    with pytest.raises(ValueError, match="dual_clip"):
        loss("ppo_clip", logp, old, adv, mask, dual_clip=0.5)
    # masked tokens are zero
    m2 = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    assert (loss("ppo_clip", logp, old, adv, m2)[m2 == 0] == 0).all()


def test_reinforce_and_cispo():
    logp = tok([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = tok([[-1.0 - L15, -2.0, -0.5 - L5]])  # ratios 1.5, 1, 5
    adv = tok([[2.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    assert torch.allclose(loss("reinforce", logp, old, adv, mask), tok([[2.0, -2.0, 0.5]]))
    got = loss("cispo", logp, old, adv, mask, eps_high=0.2)
    w = [1.2, 1.0, 1.2]  # clipped weights, stop-gradient
    assert torch.allclose(got, tok([[-w[0] * 2 * -1.0, -w[1] * -1 * -2.0, -w[2] * 1 * -0.5]]))
    got.sum().backward()
    assert torch.allclose(logp.grad, tok([[-2.4, 1.0, -1.2]]))  # every token keeps a gradient
    low = loss("cispo", logp.detach(), tok([[0.0, 0.0, 0.0]]), adv, mask, eps_low=0.1)
    # ratios exp(-1), exp(-2), exp(-.5) all below 0.9 -> weight 0.9
    assert torch.allclose(low, -0.9 * adv * logp.detach())


def _seq_objective_grad(name, logp0, old, adv, mask, **opts):
    logp = logp0.clone().requires_grad_(True)
    per_tok = loss(name, logp, old, adv, mask, **opts)
    aggregate(per_tok, mask, "seq-mean-token-mean").backward()
    return per_tok.detach(), logp.grad


def test_gspo_matches_sequence_formula():
    logp0 = tok([[-1.0, -2.0, -0.7], [-0.3, -0.4, 0.0]])
    old = tok([[-1.1, -2.3, -0.6], [-0.2, -0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = tok([[1.5] * 3, [-0.5] * 3])
    for eps in (0.5, 1e-3):
        per_tok, grad = _seq_objective_grad("gspo", logp0, old, adv, mask, eps_low=eps,
                                            eps_high=eps)
        # reference: L_i = -min(s_i A_i, clip(s_i) A_i), s_i = exp(mean log ratio); mean_i L_i
        lp = logp0.clone().requires_grad_(True)
        ref = []
        for i, n in enumerate((3, 2)):
            s = torch.exp(sum(lp[i, t] - old[i, t] for t in range(n)) / n)
            a = adv[i, 0]
            ref.append(-torch.min(s * a, s.clamp(1 - eps, 1 + eps) * a))
        (sum(ref) / 2).backward()
        assert torch.allclose(grad, lp.grad, atol=1e-10)
        for i, n in enumerate((3, 2)):
            assert torch.allclose(per_tok[i, :n], ref[i].detach().expand(n))


def test_gmpo_matches_sequence_formula():
    logp0 = tok([[-1.0, -2.0, -0.7], [-0.3, -0.4, -0.9]])
    old = tok([[-1.6, -2.1, -0.6], [-0.2, -0.9, -0.1]])  # log ratios .6 .1 -.1 / -.1 .5 -.8
    mask = torch.ones(2, 3)
    adv = tok([[2.0] * 3, [-1.0] * 3])
    per_tok, grad = _seq_objective_grad("gmpo", logp0, old, adv, mask, eps_low=0.4,
                                        eps_high=0.4)
    lp = logp0.clone().requires_grad_(True)
    ref = []
    for i in range(2):
        a = float(adv[i, 0])
        cs = []
        for t in range(3):
            d = lp[i, t] - old[i, t]
            dc = d.clamp(-0.4, 0.4)
            cs.append(torch.min(d, dc) if a > 0 else torch.max(d, dc))  # pessimistic
        ref.append(-a * torch.exp(sum(cs) / 3))
    (sum(ref) / 2).backward()
    assert torch.allclose(grad, lp.grad, atol=1e-10)
    assert torch.allclose(per_tok[:, 0], torch.stack(ref).detach())
    # hand: row 0 clipped log ratios [.4, .1, -.1] -> -2 exp(0.4/3)
    assert abs(float(per_tok[0, 0]) + 2 * math.exp(0.4 / 3)) < 1e-9


def _group_setup():
    logp0 = tok([[-1.0, -2.0], [-0.5, -0.5], [-3.0, -0.1], [-0.2, -0.4], [-1.0, -1.0]])
    ref = tok([[-1.2, -1.8], [-0.4, -0.9], [-2.0, -0.3], [-0.2, -0.1], [-0.7, -1.1]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    group = torch.tensor([0, 0, 0, 1, 1])
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 2.0])
    return logp0, ref, mask, group, rewards


def _seq(x, mask, i):
    return sum(x[i, t] for t in range(x.shape[1]) if mask[i, t] > 0)


def test_copg_equals_pairwise_loss():
    logp0, ref, mask, group, rewards = _group_setup()
    beta = 0.3
    lp = logp0.clone().requires_grad_(True)
    per_tok = loss("copg", lp, lp.detach(), torch.zeros_like(lp), mask, ref_logp=ref,
                   group=group, rewards=rewards, beta=beta)
    (aggregate(per_tok, mask, "seq-mean-token-mean") * 5).backward()  # = sum_i L_i
    # brute force over pairs: l_ij = -sg(Rt_i - Rt_j) (l_i - l_j), scaled by 1/(G-1)
    lp2 = logp0.clone().requires_grad_(True)
    total = 0.0
    for i in range(5):
        for j in range(i + 1, 5):
            if group[i] != group[j]:
                continue
            gsize = int((group == group[i]).sum())
            rt = [float(rewards[k]) - beta * float((_seq(lp2, mask, k) - _seq(ref, mask, k)).detach())
                  for k in (i, j)]
            total = total - (1 / (gsize - 1)) * (rt[0] - rt[1]) * (
                _seq(lp2, mask, i) - _seq(lp2, mask, j))
    total.backward()
    assert torch.allclose(lp.grad, lp2.grad, atol=1e-10)
    assert abs(float(per_tok.detach().sum(1).div(mask.sum(1)).sum()) - float(total.detach())) < 1e-9


def test_gvpo_hand_formula():
    logp0, ref, mask, group, rewards = _group_setup()
    beta = 0.5
    lp = logp0.clone().requires_grad_(True)
    per_tok = loss("gvpo", lp, lp.detach(), torch.zeros_like(lp), mask, ref_logp=ref,
                   group=group, rewards=rewards, beta=beta)
    (aggregate(per_tok, mask, "seq-mean-token-mean") * 5).backward()
    lp2 = logp0.clone().requires_grad_(True)
    total = 0.0
    for g in (0, 1):
        idx = [i for i in range(5) if group[i] == g]
        ell = {i: beta * (_seq(lp2, mask, i) - _seq(ref, mask, i)) for i in idx}
        me = sum(ell.values()) / len(idx)
        mr = sum(float(rewards[i]) for i in idx) / len(idx)
        for i in idx:
            total = total + ((ell[i] - me) - (float(rewards[i]) - mr)) ** 2
    total.backward()
    assert torch.allclose(lp.grad, lp2.grad, atol=1e-10)
    assert abs(float(per_tok.detach().sum(1).div(mask.sum(1)).sum()) - float(total.detach())) < 1e-9


def test_pairwise_dpo_pairs_and_two_rollout_case():
    logp0, ref, mask, group, rewards = _group_setup()
    beta = 0.2
    per_tok = loss("pairwise_dpo", logp0, logp0, torch.zeros_like(logp0), mask, ref_logp=ref,
                   group=group, rewards=rewards, beta=beta)
    per_seq = per_tok.sum(1) / mask.sum(1)
    h = [beta * float(_seq(logp0, mask, i) - _seq(ref, mask, i)) for i in range(5)]
    want = [0.0] * 5
    for i in range(5):
        for j in range(5):
            if group[i] == group[j] and rewards[i] > rewards[j]:
                lij = -math.log(1 / (1 + math.exp(-(h[i] - h[j]))))
                want[i] += lij / 2
                want[j] += lij / 2
    assert torch.allclose(per_seq, tok(want), atol=1e-10)
    assert per_seq[3] == 0 and per_seq[4] == 0  # tied rewards: no pair
    # 2-GRPO view: no reference -> old_logp anchors; winner row 0, loser row 1
    lp = tok([[-1.0], [-2.0]], requires_grad=True)
    old = tok([[-1.5], [-1.5]])
    out = loss("pairwise_dpo", lp, old, torch.zeros_like(lp), torch.ones(2, 1),
               group=torch.tensor([0, 0]), rewards=torch.tensor([1.0, 0.0]), beta=1.0)
    want = float(-F.logsigmoid(torch.tensor(0.5 - (-0.5))))
    assert torch.allclose(out[:, 0], tok([want / 2, want / 2]))


def test_contrastive_need_group_and_rewards():
    logp0, ref, mask, group, rewards = _group_setup()
    with pytest.raises(ValueError, match="group"):
        loss("copg", logp0, logp0, logp0, mask, ref_logp=ref)
    with pytest.raises(ValueError, match="ref_logp"):
        loss("gvpo", logp0, logp0, logp0, mask, group=group, rewards=rewards)
    with pytest.raises(ValueError, match="shape"):
        loss("gvpo", logp0, logp0, logp0, mask, ref_logp=ref, group=group[:3], rewards=rewards)
    with pytest.raises(UnknownNameError, match="known"):
        loss("nope", logp0, logp0, logp0, mask)


def test_kl_estimators_hand_and_exact_expectation():
    d = math.log(2.0)
    lp, ref, m = tok([[d]]), tok([[0.0]]), torch.ones(1, 1)
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
    # as a loss term: coef * k3, gradient d/dlogp k3 = 1 - exp(ref - logp)
    lpg = tok([[d]], requires_grad=True)
    loss("kl_k3", lpg, lpg.detach(), lpg.detach(), m, ref_logp=ref, coef=0.1).sum().backward()
    assert abs(float(lpg.grad) - 0.1 * (1 - 0.5)) < 1e-12
    with pytest.raises(ValueError, match="unknown KL"):
        kl_estimate(lp, ref, m, "k4")


def test_entropy_bonus_and_ratio_stats():
    ent = tok([[1.0, 2.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    z = torch.zeros(1, 3, dtype=torch.float64)
    out = loss("entropy_bonus", z, z, z, mask, entropy=ent, coef=0.1)
    assert torch.allclose(out, tok([[-0.1, -0.2, 0.0]]))
    with pytest.raises(ValueError, match="entropy"):
        loss("entropy_bonus", z, z, z, mask)
    logp = tok([[L15, L05, 0.1, 9.0]])
    s = ratio_stats(logp, torch.zeros_like(logp), torch.tensor([[1, 1, 1, 0]]))
    assert s["clip_frac_high"] == pytest.approx(1 / 3) and s["clip_frac_low"] == pytest.approx(1 / 3)
    assert s["clip_frac"] == pytest.approx(2 / 3)
    k3 = [(1.5 - 1 - L15), (0.5 - 1 - L05), (math.exp(0.1) - 1 - 0.1)]
    assert s["approx_kl"] == pytest.approx(sum(k3) / 3)
    assert s["ratio_max"] == pytest.approx(1.5)

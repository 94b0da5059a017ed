"""Objectives against hand formulas: losses, gradients, diagnostics, the clamped log ratio
and turn / sequence-level ratios."""

import math

import pytest
import torch
import torch.nn.functional as F

from sparring.aggregation import aggregate
from sparring.objectives import OBJECTIVES, compute, list_objectives, loss
from sparring.objectives.common import LOG_RATIO_CLAMP, unit_index
from sparring.registry import Entry, UnknownNameError

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


def test_kl_and_entropy_are_not_objectives():
    names = {e.name for e in list_objectives()}
    assert not names & {"kl_k1", "kl_k2", "kl_k3", "entropy_bonus"}
    assert {"ppo_clip", "cispo", "gspo", "gmpo", "reinforce"} <= names


# ---------------------------------------------------------------- diagnostics


def test_compute_returns_diagnostics_at_the_objectives_level():
    e05 = math.exp(0.05)
    # ppo_clip, tokens: ratios 1.5, 0.5, 5, e^.05 (as in the first test); A = 1, -1, -1, 1
    logp = tok([[L15, L05, L5, 0.05]])
    zeros = torch.zeros(1, 4, dtype=torch.float64)
    adv = tok([[1.0, -1.0, -1.0, 1.0]])
    per_tok, diag = compute("ppo_clip", logp, zeros, adv, torch.ones(1, 4), dual_clip=3.0)
    assert torch.allclose(per_tok, tok([[-1.2, 0.8, 3.0, -e05]]))
    assert float(diag["clip_frac"]) == pytest.approx(3 / 4)  # 1.5 and 5 above 1.2, 0.5 below 0.8
    assert float(diag["clip_frac_high"]) == pytest.approx(2 / 4)
    assert float(diag["clip_frac_low"]) == pytest.approx(1 / 4)
    assert float(diag["ratio"]) == pytest.approx((1.5 + 0.5 + 5 + e05) / 4)
    assert float(diag["ratio_max"]) == pytest.approx(5.0)
    assert float(diag["dual_clip_frac"]) == pytest.approx(1 / 4)  # only the token with loss 5 > 3
    assert all(v.dim() == 0 and not v.requires_grad for v in diag.values())
    # masked tokens are not units: only the first two count
    _, diag = compute("ppo_clip", logp, zeros, adv, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
    assert float(diag["clip_frac"]) == pytest.approx(1.0)
    assert float(diag["ratio"]) == pytest.approx(1.0)  # (1.5 + 0.5) / 2

    # cispo: ratios 1.5, 1, 5; weights truncated above 1.2 on two of three tokens
    lp = tok([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = tok([[-1.0 - L15, -2.0, -0.5 - L5]])
    _, diag = compute("cispo", lp, old, tok([[2.0, -1.0, 1.0]]), torch.ones(1, 3))
    assert float(diag["clip_frac"]) == pytest.approx(2 / 3)
    assert float(diag["clip_frac_low"]) == 0.0  # no lower bound by default
    assert float(diag["ratio"]) == pytest.approx((1.5 + 1 + 5) / 3)

    # gspo, sequences: row log ratios mean 0.1 and -0.05 -> only row 0 outside [1-.05, 1+.05]
    lp = tok([[0.2, 0.0], [-0.05, 0.0]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    _, diag = compute("gspo", lp, torch.zeros_like(lp), torch.ones_like(lp), m,
                      eps_low=0.05, eps_high=0.05)
    assert float(diag["clip_frac"]) == pytest.approx(1 / 2)
    assert float(diag["ratio"]) == pytest.approx((math.exp(0.1) + math.exp(-0.05)) / 2)
    assert float(diag["ratio_max"]) == pytest.approx(math.exp(0.1))

    # gmpo, tokens whose log ratio the pessimistic clip changed: row 0 (A > 0) log ratios
    # .6 .1 -.1: .6 lowered to .4; row 1 (A < 0) -.1 .5 -.8: -.8 raised to -.4
    lp = tok([[-1.0, -2.0, -0.7], [-0.3, -0.4, -0.9]])
    old = tok([[-1.6, -2.1, -0.6], [-0.2, -0.9, -0.1]])
    adv = tok([[2.0] * 3, [-1.0] * 3])
    _, diag = compute("gmpo", lp, old, adv, torch.ones(2, 3), eps_low=0.4, eps_high=0.4)
    assert float(diag["clip_frac"]) == pytest.approx(2 / 6)
    assert float(diag["clip_frac_high"]) == pytest.approx(1 / 6)
    assert float(diag["clip_frac_low"]) == pytest.approx(1 / 6)
    assert float(diag["ratio"]) == pytest.approx((math.exp(0.6 / 3) + math.exp(-0.4 / 3)) / 2)

    # no ratio, no diagnostics
    assert compute("reinforce", lp, old, adv, torch.ones(2, 3))[1] == {}
    logp0, ref, mask, group, rewards = _group_setup()
    for name in ("copg", "gvpo", "pairwise_dpo"):
        assert compute(name, logp0, logp0, logp0, mask, ref_logp=ref, group=group,
                       rewards=rewards)[1] == {}


def test_empty_mask_gives_finite_diagnostics():
    z = torch.zeros(2, 3)
    for name in ("ppo_clip", "cispo", "gspo", "gmpo"):
        per_tok, diag = compute(name, z, z, z, torch.zeros(2, 3, dtype=torch.bool))
        assert (per_tok == 0).all()
        assert all(torch.isfinite(v) for v in diag.values()), name
        assert float(diag["clip_frac"]) == 0.0


def test_an_objective_must_return_loss_and_diagnostics():
    OBJECTIVES.add(Entry("bare_tensor", lambda logp, *a, **k: -logp, family="test"))
    try:
        z = torch.zeros(1, 2)
        with pytest.raises(TypeError, match="must return"):
            compute("bare_tensor", z, z, z, torch.ones(1, 2))
    finally:
        OBJECTIVES._entries.pop("bare_tensor")


# ---------------------------------------------------------------- the clamped log ratio


def test_dual_clip_with_an_overflowing_ratio_has_a_finite_gradient():
    # token 0: log ratio 100 -> clamped to 20, rho = e^20; A = -1 so -A rho = e^20 and the
    # dual clip caps the loss at -c A = 3 (a constant: gradient 0). Token 1: rho = 1,
    # loss max(1, 1) = 1 < 3, gradient -A rho = 1. Unclamped, exp(100) = inf in float32
    # and the gradient of token 0 would be 0 * inf = NaN.
    old = torch.tensor([[-101.0, -1.0]])
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0]])
    per_tok, diag = compute("ppo_clip", logp, old, adv, torch.ones(1, 2), dual_clip=3)
    assert per_tok.tolist() == [[3.0, 1.0]]
    per_tok.sum().backward()
    assert logp.grad.tolist() == [[0.0, 1.0]]
    assert float(diag["dual_clip_frac"]) == 0.5 and float(diag["clip_frac"]) == 0.5
    assert float(diag["ratio_max"]) == pytest.approx(math.exp(LOG_RATIO_CLAMP), rel=1e-6)


def test_every_ratio_objective_is_finite_when_the_ratio_overflows():
    # log ratios 2000 (clamped to 20) and 0, A = -1: exp(2000), and even exp(2000 / 2), are
    # inf in float64. Turn / sequence ratio: exp((20 + 0) / 2) = e^10.
    e10, e20 = math.exp(10.0), math.exp(20.0)
    cases = {  # name, options: (per-token loss, gradient of their sum)
        ("ppo_clip", ()): ([e20, 1.0], [0.0, 1.0]),
        ("ppo_clip", (("ratio_level", "turn"),)): ([e10, e10], [0.0, e10]),
        ("gspo", ()): ([e10, e10], [0.0, e10]),
        ("gmpo", ()): ([e10, e10], [0.0, e10]),  # A < 0: c = max(d, clip(d)) = d = [20, 0]
        # cispo: weights min(e^20, 1.2) = 1.2 and 1; loss -w A logp, gradient -w A
        ("cispo", ()): ([-1.2, -1.0], [1.2, 1.0]),
    }
    for (name, opts), (want, want_grad) in cases.items():
        logp = tok([[-1.0, -1.0]], requires_grad=True)
        per_tok = loss(name, logp, tok([[-2001.0, -1.0]]), tok([[-1.0, -1.0]]),
                       torch.ones(1, 2), **dict(opts))
        per_tok.sum().backward()
        assert torch.allclose(per_tok, tok([want]), rtol=1e-12), name
        assert torch.allclose(logp.grad, tok([want_grad]), rtol=1e-12), name


# ---------------------------------------------------------------- turn / sequence ratios


def test_unit_index_turns_are_runs_of_the_mask():
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [0, 1, 0, 1, 1]])
    ids, k = unit_index(mask, "turn")
    assert k == 5
    assert ids.tolist() == [[0, 0, 5, 1, 5], [2, 2, 2, 5, 5], [5] * 5, [5, 3, 5, 4, 4]]
    ids, k = unit_index(mask, "sequence")
    assert k == 3
    assert ids.tolist() == [[0, 0, 3, 0, 3], [1, 1, 1, 3, 3], [3] * 5, [3, 2, 3, 2, 2]]
    ids, k = unit_index(mask, "token")
    assert k == 9 and ids[3].tolist() == [9, 6, 9, 7, 8]
    with pytest.raises(ValueError, match="ratio_level"):
        unit_index(mask, "episode")


def _two_turn_batch():
    """Trajectory layout: row 0 holds two turns (tokens 0-1 and 3) around an observation
    token 2; row 1 one turn of three tokens. d = logp - old_logp is chosen by hand; the
    observation token's d (0.9) must not enter any turn."""
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    logp = tok([[-1.0, -2.0, -0.4, -0.5, 0.0], [-0.7, -1.2, -0.3, 0.0, 0.0]])
    d = tok([[0.35, 0.05, 0.9, -0.1, 0.0], [0.1, -0.3, 0.05, 0.0, 0.0]])
    adv = tok([[1.0, 1.0, 0.0, -2.0, 0.0], [0.5, 0.5, 0.5, 0.0, 0.0]])
    return logp, logp - d, adv, mask


def _loss_and_grad(name, logp0, old, adv, mask, **opts):
    logp = logp0.clone().requires_grad_(True)
    per_tok, diag = compute(name, logp, old, adv, mask, **opts)
    per_tok.sum().backward()
    return per_tok.detach(), logp.grad, diag


def test_ppo_clip_turn_level_ratio_by_hand():
    logp, old, adv, mask = _two_turn_batch()
    per_tok, grad, diag = _loss_and_grad("ppo_clip", logp, old, adv, mask, ratio_level="turn")
    # turn a (row 0, tokens 0-1): r = exp((.35 + .05) / 2) = e^.2 = 1.2214 > 1.2 with A = 1:
    #   l = max(-r, -1.2) = -1.2 on both tokens, clipped: no gradient (token 1 alone,
    #   rho = e^.05, would be inside the range)
    # turn b (row 0, token 3): r = e^-.1, A = -2: l = max(2r, 2 * 0.9048) = 2r, gradient 2r
    # turn c (row 1): r = exp((.1 - .3 + .05) / 3) = e^-.05, A = .5: l = -.5 r, gradient
    #   -.5 r on each token (d/dlogp_t of |c| * L_c = 3 * (-.5) * r / 3)
    rb, rc = math.exp(-0.1), math.exp(-0.05)
    assert torch.allclose(per_tok, tok([[-1.2, -1.2, 0, 2 * rb, 0], [-0.5 * rc] * 3 + [0, 0]]))
    assert torch.allclose(grad, tok([[0, 0, 0, 2 * rb, 0], [-0.5 * rc] * 3 + [0, 0]]))
    ra = math.exp(0.2)
    assert float(diag["clip_frac"]) == pytest.approx(1 / 3)  # turn a of the three turns
    assert float(diag["clip_frac_high"]) == pytest.approx(1 / 3)
    assert float(diag["ratio"]) == pytest.approx((ra + rb + rc) / 3)
    assert float(diag["ratio_max"]) == pytest.approx(ra)
    # token level differs: token 1 of row 0 (rho = e^.05, A = 1) keeps its gradient -rho
    per_tok, grad, diag = _loss_and_grad("ppo_clip", logp, old, adv, mask)
    assert float(per_tok[0, 1]) == pytest.approx(-math.exp(0.05))
    assert float(grad[0, 1]) == pytest.approx(-math.exp(0.05))
    assert float(grad[0, 0]) == 0.0  # rho = e^.35 > 1.2 with A > 0: clipped
    # of the six action tokens, e^.35 is above 1.2 and e^-.3 = 0.741 below 0.8
    assert float(diag["clip_frac_high"]) == pytest.approx(1 / 6)
    assert float(diag["clip_frac_low"]) == pytest.approx(1 / 6)


def test_ppo_clip_sequence_level_ratio_by_hand():
    logp, old, adv, mask = _two_turn_batch()
    per_tok, grad, diag = _loss_and_grad("ppo_clip", logp, old, adv, mask,
                                         ratio_level="sequence")
    # row 0: s = exp((.35 + .05 - .1) / 3) = e^.1 = 1.1052, inside [.8, 1.2]; per token
    #   l = -A_t s (A = 1, 1, -2), gradient -A_t s (GSPO-token form); row 1 = turn c
    s, rc = math.exp(0.1), math.exp(-0.05)
    assert torch.allclose(per_tok, tok([[-s, -s, 0, 2 * s, 0], [-0.5 * rc] * 3 + [0, 0]]))
    assert torch.allclose(grad, tok([[-s, -s, 0, 2 * s, 0], [-0.5 * rc] * 3 + [0, 0]]))
    assert float(diag["clip_frac"]) == 0.0
    assert float(diag["ratio"]) == pytest.approx((s + rc) / 2)
    # in the turn layout (one turn per row) turn and sequence level agree
    row1 = (logp[1:], old[1:], adv[1:], mask[1:])
    turn = _loss_and_grad("ppo_clip", *row1, ratio_level="turn")
    seq = _loss_and_grad("ppo_clip", *row1, ratio_level="sequence")
    assert torch.equal(turn[0], seq[0]) and torch.equal(turn[1], seq[1])


def test_cispo_turn_level_weight_by_hand():
    logp, old, adv, mask = _two_turn_batch()
    per_tok, grad, diag = _loss_and_grad("cispo", logp, old, adv, mask, ratio_level="turn",
                                         eps_high=0.2)
    # weights sg(min(r_turn, 1.2)): turn a min(e^.2, 1.2) = 1.2, turn b e^-.1, turn c e^-.05;
    # l_t = -w A_t logp_t, gradient -w A_t
    wb, wc = math.exp(-0.1), math.exp(-0.05)
    want = [[-1.2 * 1 * -1.0, -1.2 * 1 * -2.0, 0, -wb * -2 * -0.5, 0],
            [-wc * 0.5 * -0.7, -wc * 0.5 * -1.2, -wc * 0.5 * -0.3, 0, 0]]
    assert torch.allclose(per_tok, tok(want))
    assert torch.allclose(grad, tok([[-1.2, -1.2, 0, 2 * wb, 0], [-0.5 * wc] * 3 + [0, 0]]))
    assert float(diag["clip_frac"]) == pytest.approx(1 / 3)

"""Shapers (reward- and advantage-level), their composition, and MatchTIR turn rewards."""

import math

import pytest
import torch

from sparring.advantages import compute, estimate
from sparring.advantages.shaping import SHAPERS, shaped, token_kl
from sparring.advantages.turn_dense import match_turn_rewards
from sparring.cli import main
from tests.test_turn_estimators import GA, group_norm, own_rtg, per_row
from tests.turn_batches import batch, rows

BASE = {"base": "turn_rtg", "base_options": {"std": False}}


def base_adv(b):
    return estimate("turn_rtg", b, std=False)


def test_ucas_reference():
    b = batch()
    A = base_adv(b)
    got = estimate("ucas", b, alpha=0.5, beta=0.2, **BASE)
    for i in range(b.n_rows):
        toks = b.action_mask[i].nonzero().squeeze(1).tolist()
        lps = [float(b.old_logp[i, t]) for t in toks]
        c = math.exp(sum(lps) / len(lps))
        for t, lp in zip(toks, lps):
            a = float(A[i, t])
            want = a * (1 + 0.5 * (1 - c)) if a > 0 else (
                a * (1 + 0.5 * c) - 0.2 * math.exp(lp) if a < 0 else 0.0)
            assert float(got[i, t]) == pytest.approx(want, abs=1e-5)
    assert got[~b.action_mask].abs().sum() == 0


@pytest.mark.parametrize("metric", ["length", "entropy"])
def test_canon_reference(metric):
    b, rs = batch(), rows()
    a = per_row(base_adv(b), b)
    if metric == "length":
        x = [float(v) for v in b.length]
    else:
        x = [float(b.entropy[i][b.action_mask[i]].mean()) for i in range(b.n_rows)]
    want = []
    for i, r in enumerate(rs):
        grp = [j for j, s in enumerate(rs) if s["g"] == r["g"]]
        xs = sorted(x[j] for j in grp)
        n = len(xs)
        med = (xs[(n - 1) // 2] + xs[n // 2]) / 2
        half = [j for j in grp if (x[j] > med) == (x[i] > med)]
        mh = sum(a[j] for j in half) / len(half)
        mg = sum(a[j] for j in grp) / len(grp)
        want.append((a[i] - mh) + 3.0 * (mh - mg))
    got = per_row(estimate("canon", b, metric=metric, weight=3.0, **BASE), b)
    assert got == pytest.approx(want, abs=1e-5)
    same = per_row(estimate("canon", b, metric=metric, weight=1.0, **BASE), b)
    assert same == pytest.approx(a, abs=1e-5)


def test_entropy_shaping_reference():
    b = batch()
    a = per_row(base_adv(b), b)
    H = [float(b.entropy[i][b.action_mask[i]].mean()) for i in range(b.n_rows)]
    ref = sum(H) / len(H)
    want = [ai * min(max(h / (ref + 1e-6), 0.8), 1.25) for ai, h in zip(a, H)]
    got = per_row(estimate("entropy_shaping", b, lo=0.8, hi=1.25, **BASE), b)
    assert got == pytest.approx(want, abs=1e-5)


def test_overlong_penalty_rewards_and_returns():
    b, rs = batch(), rows()
    out = SHAPERS["overlong_penalty"](b, max_length=3, cache=2)
    # L <= 1: 0; L = 2: (1 - 2) / 2 = -0.5; L = 3: -1.0; L > 3: -1
    pen = {1: 0.0, 2: -0.5, 3: -1.0}
    want_r = [x["r"] + pen[int(n)] for x, n in zip(rs, b.length)]
    assert out.reward.tolist() == pytest.approx(want_r)
    tot = {}
    for x, n in zip(rs, b.length):
        tot[(x["e"], x["a"])] = tot.get((x["e"], x["a"]), 0.0) + pen[int(n)]
    assert out.returns.tolist() == pytest.approx([x["ret"] + tot[(x["e"], x["a"])] for x in rs])
    assert b.reward.tolist() == pytest.approx([x["r"] for x in rs])  # input untouched
    with pytest.raises(ValueError, match="cache"):
        SHAPERS["overlong_penalty"](b, max_length=3, cache=5)


def test_kl_in_reward_and_composition_order():
    b, rs = batch(), rows()
    ref = torch.where(b.action_mask, b.old_logp - 0.1, torch.zeros_like(b.old_logp))
    b = b.with_fields(ref_logp=ref)
    # k1: d = old - ref = 0.1 on each action token -> row KL = 0.1 * length
    out = SHAPERS["kl_in_reward"](b, beta=0.5)
    assert out.reward.tolist() == pytest.approx(
        [x["r"] - 0.05 * int(n) for x, n in zip(rs, b.length)], abs=1e-6)
    k3 = token_kl(b, "k3")[b.action_mask]
    assert torch.allclose(k3, torch.full_like(k3, math.exp(-0.1) - 1 + 0.1), atol=1e-6)
    # composition: kl_in_reward (before) -> turn_rtg -> ucas (after), whatever the list order
    adv, keep = shaped(b, "turn_rtg", {"std": False},
                       [("ucas", {"alpha": 0.5, "beta": 0.0}), ("kl_in_reward", {"beta": 0.5})])
    rewards = {id(x): x["r"] - 0.05 * int(n) for x, n in zip(rs, b.length)}
    G = own_rtg(rs, 1.0, reward=lambda x: rewards[id(x)])
    a = group_norm(rs, G, GA, std=False)
    got = per_row(adv, b)
    for i, ai in enumerate(a):
        lps = b.old_logp[i][b.action_mask[i]]
        c = math.exp(float(lps.mean()))
        want = ai * (1 + 0.5 * (1 - c)) if ai > 0 else ai * (1 + 0.5 * c)
        assert got[i] == pytest.approx(want, abs=1e-5)
    assert keep.tolist() == (~b.truncated).tolist()
    with pytest.raises(KeyError, match="unknown shaper"):
        shaped(b, "turn_rtg", {}, ["bogus"])
    with pytest.raises(ValueError, match="ref_logp"):
        SHAPERS["kl_in_reward"](batch())


def test_match_turn_rewards_hard_and_soft():
    # predictions: p0 (turn 0), p1 (turn 1), p2 (turn 1); two reference calls
    sim = [[0.9, 0.1], [0.2, 0.4], [0.3, 0.35]]
    # best assignment: p0-r0 (0.9) + p1-r1 (0.4) = 1.3 > p0-r0 + p2-r1 (1.25); p2 unmatched
    assert match_turn_rewards(sim, [0, 1, 1], 3, strategy="soft") == pytest.approx(
        [0.9, 0.2, 0.0])
    assert match_turn_rewards(sim, [0, 1, 1], 3, strategy="hard", threshold=0.5) == [
        1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="strategy"):
        match_turn_rewards(sim, [0, 1, 1], 3, strategy="greedy")
    with pytest.raises(ValueError, match="pred_turn"):
        match_turn_rewards(sim, [0, 1, 5], 3)


def test_matchtir_reference():
    b, rs = batch(), rows()
    G = own_rtg(rs, 0.9, reward=lambda x: x["ex"]["match"])
    a_turn = group_norm(rs, G, GA)
    a_traj = group_norm(rs, [x["ret"] for x in rs], GA,
                        include=lambda x: x["last"] and not x["trunc"])
    want = [0.3 * t + 0.7 * j for t, j in zip(a_turn, a_traj)]
    got = per_row(estimate("matchtir", b, turn_weight=0.3, discount=0.9), b)
    assert got == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError, match="turn_weight"):
        estimate("matchtir", b, turn_weight=1.5)


def test_shaper_estimators_keep_base_rows_and_cli_lists(capsys):
    _, keep = compute("ucas", batch(), **BASE)
    assert keep.tolist() == (~batch().truncated).tolist()
    assert main(["list", "estimators", "shapers"]) == 0
    out = capsys.readouterr().out
    for name in ("turn_rtg", "trloo", "gigpo", "role_ema", "gae", "turn_gae", "archer_targets",
                 "igpo", "matchtir", "gated", "ucas", "canon", "entropy_shaping",
                 "overlong_penalty", "kl_in_reward"):
        assert name in out


@pytest.mark.parametrize("name", ["ucas", "canon", "entropy_shaping"])
def test_advantage_shapers_in_place_equal_out_of_place(name):
    """`shaped` writes shapers into the estimator's result (out=adv): same numbers as a
    fresh result, and a call without ``out`` leaves its input alone."""
    b = batch()
    A = base_adv(b)
    before = A.clone()
    fresh = SHAPERS[name](A, b)
    assert torch.equal(A, before)
    inplace = SHAPERS[name](A, b, out=A)  # out aliases the input, as in `shaped`
    assert inplace.data_ptr() == A.data_ptr()
    assert torch.allclose(inplace, fresh, atol=0, rtol=0)
    with pytest.raises(ValueError, match="out has shape"):
        SHAPERS[name](before, b, out=torch.empty(1, 1))

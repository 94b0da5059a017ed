"""Shapers (reward-level, advantage-level, keep filters) against hand references, their
composition through the AdvantageStage, and MatchTIR turn rewards."""

import math

import pytest
import torch

from sparring.advantages import estimate
from sparring.advantages.shaping import SHAPERS
from sparring.advantages.stage import AdvantageStage
from sparring.advantages.turn_dense import match_turn_rewards
from sparring.cli import main
from sparring.data import TurnBatch
from tests.test_turn_estimators import GA, group_norm, own_rtg, per_row
from tests.turn_batches import batch, rows


def base_adv(b):
    return estimate("turn_rtg", b, std=False)


def test_ucas_reference():
    b = batch()
    A = base_adv(b)
    got = SHAPERS["ucas"](A, b, alpha=0.5, beta=0.2)
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
    A = base_adv(b)
    a = per_row(A, b)
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
    got = per_row(SHAPERS["canon"](A, b, metric=metric, weight=3.0), b)
    assert got == pytest.approx(want, abs=1e-5)
    same = per_row(SHAPERS["canon"](A, b, metric=metric, weight=1.0), b)
    assert same == pytest.approx(a, abs=1e-5)


def test_entropy_shaping_reference():
    b = batch()
    A = base_adv(b)
    a = per_row(A, b)
    H = [float(b.entropy[i][b.action_mask[i]].mean()) for i in range(b.n_rows)]
    ref = sum(H) / len(H)
    want = [ai * min(max(h / (ref + 1e-6), 0.8), 1.25) for ai, h in zip(a, H)]
    got = per_row(SHAPERS["entropy_shaping"](A, b, lo=0.8, hi=1.25), b)
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


def test_loss_aversion_rewards_and_returns():
    b, rs = batch(), rows()
    assert any(x["r"] < 0 for x in rs) and any(x["r"] > 0 for x in rs)
    out = SHAPERS["loss_aversion"](b, weight=3.0)
    # a negative reward r becomes 3 r (r + 2 r), a positive or zero one stays
    delta = [2.0 * x["r"] if x["r"] < 0 else 0.0 for x in rs]
    assert out.reward.tolist() == pytest.approx([x["r"] + d for x, d in zip(rs, delta)])
    tot = {}
    for x, d in zip(rs, delta):
        tot[(x["e"], x["a"])] = tot.get((x["e"], x["a"]), 0.0) + d
    assert out.returns.tolist() == pytest.approx([x["ret"] + tot[(x["e"], x["a"])] for x in rs])
    same = SHAPERS["loss_aversion"](b, weight=1.0)
    assert same.reward.tolist() == pytest.approx([x["r"] for x in rs])
    with pytest.raises(ValueError, match="weight"):
        SHAPERS["loss_aversion"](b, weight=0.5)


def test_kl_in_reward_and_composition_order():
    b, rs = batch(), rows()
    ref = torch.where(b.action_mask, b.old_logp - 0.1, torch.zeros_like(b.old_logp))
    b = b.with_fields(ref_logp=ref)
    # k1: d = old - ref = 0.1 on each action token -> row KL = 0.1 * length
    out = SHAPERS["kl_in_reward"](b, beta=0.5)
    assert out.reward.tolist() == pytest.approx(
        [x["r"] - 0.05 * int(n) for x, n in zip(rs, b.length)], abs=1e-6)
    # k3 = exp(-d) - 1 + d per token
    out3 = SHAPERS["kl_in_reward"](b, beta=1.0, kind="k3")
    k3 = math.exp(-0.1) - 1 + 0.1
    assert out3.reward.tolist() == pytest.approx(
        [x["r"] - k3 * int(n) for x, n in zip(rs, b.length)], abs=1e-6)
    # composition: kl_in_reward (before) -> turn_rtg -> ucas (after), whatever the list order
    stage = AdvantageStage("turn_rtg", {"std": False}, shaping=[
        ("ucas", {"alpha": 0.5, "beta": 0.0}), {"name": "kl_in_reward", "options": {"beta": 0.5}}])
    adv, keep = stage(b)
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
        AdvantageStage("turn_rtg", shaping=["bogus"])
    with pytest.raises(ValueError, match="no option 'alpah'"):
        AdvantageStage("turn_rtg", shaping=[("ucas", {"alpah": 1.0})])
    with pytest.raises(ValueError, match="ref_logp"):
        SHAPERS["kl_in_reward"](batch())


def test_keep_filters_by_hand():
    # four single-turn trajectories per group; group 1's returns are all equal
    R = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    b = TurnBatch.from_scalars(R, group=[0, 0, 0, 0, 1, 1, 1, 1])
    assert SHAPERS["drop_zero_variance_groups"](None, b).tolist() == [True] * 4 + [False] * 4
    adv = torch.tensor([[0.5], [-2.0], [0.1], [2.0], [0.3], [-0.3], [0.0], [0.3]])
    # |A| in group 0: 0.5, 2.0, 0.1, 2.0 -> top 2: rows 1 and 3 (tie broken by index);
    # group 1: 0.3, 0.3, 0.0, 0.3 -> rows 4 and 5
    got = SHAPERS["top_abs_advantage"](adv, b, k=2)
    assert got.tolist() == [False, True, False, True, True, True, False, False]
    stage = AdvantageStage("dr_grpo", shaping=[{"name": "drop_zero_variance_groups"},
                                               {"name": "top_abs_advantage",
                                                "options": {"k": 1}}])
    a, keep = stage(b)
    # dr_grpo: R - 0.5 in group 0 -> |A| = 0.5 for all; top 1 is row 0; group 1 dropped
    assert a[:, 0].tolist() == [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]
    assert keep.tolist() == [True, False, False, False, False, False, False, False]


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


def test_positive_signalling_by_hand():
    """Four games of a two-seat signalling game: the speaker (seat 0) sends [5], [5], [6]
    and [5, 7]; p(m) = 2/4, 2/4, 1/4, 1/4 among the speaker's rows; the listener's rows are
    left alone with seats=[0] and get their own p(m) without it."""
    from sparring.data import Episode, Turn, collate

    sent = [([5], [-0.5]), ([5], [-0.25]), ([6], [-2.0]), ([5, 7], [-1.0, -0.5])]
    eps = [Episode(env="signalling", seed=i, group=i, num_agents=2, returns=[1.0, 1.0],
                   turns=[Turn(agent=0, prompt_ids=[1, 2], action_ids=a, logprobs=lp),
                          Turn(agent=1, prompt_ids=[3], action_ids=[9], logprobs=[-0.1],
                               reward=1.0)])
           for i, (a, lp) in enumerate(sent)]
    b = collate(eps)
    out = SHAPERS["positive_signalling"](b, beta=0.5, seats=[0])
    want_speaker = [0.5 * (-0.5 - math.log(0.5)), 0.5 * (-0.25 - math.log(0.5)),
                    0.5 * (-2.0 - math.log(0.25)), 0.5 * (-1.5 - math.log(0.25))]
    speaker, listener = b.agent == 0, b.agent == 1
    assert (out.reward - b.reward)[speaker].tolist() == pytest.approx(want_speaker)
    assert (out.reward - b.reward)[listener].tolist() == [0.0] * 4
    # a trajectory's return moves by its rows' bonus (one speaker row per game)
    assert (out.returns - b.returns)[speaker].tolist() == pytest.approx(want_speaker)
    # every seat: the listener always sends [9] (p = 1), so its bonus is beta * log pi
    both = SHAPERS["positive_signalling"](b, beta=0.5)
    assert (both.reward - b.reward)[listener].tolist() == pytest.approx([-0.05] * 4)
    # conditional=0: the messages' entropy alone, -beta * log p(m)
    marginal = SHAPERS["positive_signalling"](b, beta=0.5, conditional=0.0, seats=[0])
    assert (marginal.reward - b.reward)[speaker].tolist() == pytest.approx(
        [-0.5 * math.log(p) for p in (0.5, 0.5, 0.25, 0.25)])
    with pytest.raises(ValueError, match="beta"):
        SHAPERS["positive_signalling"](b, beta=-1.0)
    with pytest.raises(ValueError, match="conditional"):
        SHAPERS["positive_signalling"](b, conditional=2.0)


def test_cli_lists_estimators_and_shapers(capsys):
    assert main(["list", "estimators", "shapers"]) == 0
    out = capsys.readouterr().out
    for name in ("turn_rtg", "trloo", "gigpo", "role_ema", "gae", "turn_gae", "archer_targets",
                 "igpo", "matchtir", "gated", "ucas", "canon", "entropy_shaping",
                 "overlong_penalty", "kl_in_reward", "loss_aversion", "positive_signalling",
                 "drop_zero_variance_groups",
                 "top_abs_advantage"):
        assert name in out

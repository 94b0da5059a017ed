"""Turn-level estimators against plain-loop references on hand-built 3-seat batches."""

import difflib
import json
import math

import pytest
import torch

from sparring.advantages import compute, estimate
from sparring.advantages.turn import RoleEMA
from sparring.data import Episode, Turn, collate
from tests.turn_batches import batch, rows, rtg_list, zscore


def per_row(adv, b):
    """The single value on each row's action tokens; checks zeros on padding/observations."""
    assert adv.shape == b.action_mask.shape
    assert adv[~b.action_mask].abs().max() == 0
    vals = []
    for i in range(b.n_rows):
        v = adv[i][b.action_mask[i]]
        assert torch.allclose(v, v[0].expand_as(v)), f"row {i} not constant over its turn"
        vals.append(float(v[0]))
    return vals


def own_rtg(rs, gamma=1.0, reward=lambda r: r["r"]):
    """G per reference row: return-to-go over the same agent's turns of the same episode."""
    out = []
    for r in rs:
        mine = [x for x in rs if x["e"] == r["e"] and x["a"] == r["a"]]
        out.append(rtg_list([reward(x) for x in mine], gamma)[r["k"]])
    return out


def group_norm(rs, vals, key, std=True, include=lambda r: not r["trunc"]):
    """(v - mean) / (std + eps) with statistics over the included rows of the same key."""
    out = []
    for r, v in zip(rs, vals):
        if r["trunc"]:
            out.append(0.0)
            continue
        ws = [w for x, w in zip(rs, vals) if key(x) == key(r) and include(x)]
        m = sum(ws) / len(ws)
        sd = math.sqrt(sum((w - m) ** 2 for w in ws) / max(len(ws) - 1, 1))
        out.append((v - m) / (sd + 1e-6) if std else v - m)
    return out


GA = lambda r: (r["g"], r["a"])  # noqa: E731


def test_batch_shape_and_padding():
    b = batch()
    assert b.n_rows == 15 and b.input_ids.shape[1] == 5
    assert b.agent.tolist()[:5] == [0, 0, 1, 1, 2]
    assert int((~b.attention_mask).sum()) > 0  # padded rows exist


@pytest.mark.parametrize("gamma,std", [(1.0, True), (0.5, False)])
def test_turn_rtg_matches_reference(gamma, std):
    b, rs = batch(), rows()
    got = per_row(estimate("turn_rtg", b, discount=gamma, std=std), b)
    want = group_norm(rs, own_rtg(rs, gamma), GA, std=std)
    assert got == pytest.approx(want, abs=1e-5)


def test_turn_rtg_hand_values_group0_seat0():
    # seat 0 in group 0: E0 rewards (1, 3) -> G = (4, 3); E1 rewards (0, 1) -> G = (1, 1)
    # mean 2.25, unbiased std sqrt(6.75 / 3) = 1.5
    b = batch()
    got = per_row(estimate("turn_rtg", b), b)
    assert got[:2] == pytest.approx([1.75 / 1.5, 0.75 / 1.5], abs=1e-5)
    assert got[5:7] == pytest.approx([-1.25 / 1.5, -1.25 / 1.5], abs=1e-5)


def test_truncated_episodes_masked_not_terminal():
    b = batch()
    adv, keep = compute("turn_rtg", b)
    trunc_rows = b.truncated.nonzero().squeeze(1)
    assert keep.tolist() == (~b.truncated).tolist()
    assert adv[trunc_rows].abs().sum() == 0
    # masked rows are also out of the statistics: group 1 seat 0 holds only E3 -> A = 0
    e3_seat0 = int(((b.episode == 3) & (b.agent == 0)).nonzero())
    assert per_row(adv, b)[e3_seat0] == 0.0
    # treating truncation as terminal: E2's rows count and get advantages
    adv_t, keep_t = compute("turn_rtg", b, truncated="terminal", std=False)
    assert keep_t.all()
    assert per_row(adv_t, b)[int(trunc_rows[0])] == pytest.approx(0.5 - 0.75)
    with pytest.raises(ValueError, match="truncated"):
        compute("turn_rtg", b, truncated="drop")


def test_zero_sum_self_play_seats_do_not_cancel():
    """Two seats, one shared policy, zero-sum outcome; seat 0 moves twice, seat 1 once."""
    eps = []
    for e, w in enumerate([1.0, 1.0, 1.0, -1.0]):  # seat 0 (the first mover) wins 3 of 4
        turns = [Turn(agent=0, prompt_ids=[1], action_ids=[5], reward=0.0),
                 Turn(agent=1, prompt_ids=[2], action_ids=[5], reward=-w),
                 Turn(agent=0, prompt_ids=[3], action_ids=[5], reward=w, done=True)]
        eps.append(Episode(env="zs", seed=e, group=0, num_agents=2, turns=turns,
                           returns=[w, -w]))
    b = collate(eps)
    # crediting the episode's total reward (sum over seats) gives 0 everywhere: it cancels
    per_episode = torch.zeros(4).index_add_(0, b.episode[b.last], b.returns[b.last])
    assert per_episode.abs().max() == 0
    seat = b.agent
    # per-agent statistics (default): seat 0 rows G = (w, w), seat 1 rows G = -w
    got = torch.tensor(per_row(estimate("turn_rtg", b, std=False), b))
    # seat 0: mean over its 8 rows = 0.5; seat 1: mean over its 4 rows = -0.5
    want = torch.tensor([0.5, 0.5, -0.5] * 3 + [-1.5, -1.5, 1.5])
    assert torch.allclose(got, want)
    assert got[seat == 0].mean().abs() < 1e-6 and got[seat == 1].mean().abs() < 1e-6
    # the rarely-winning seat's win (E3 seat 1) is the strongest positive signal
    assert int(got.argmax()) == 11
    # joint normalisation over both seats: mean over 12 rows = (6 - 2 - 3 + 1) / 12 = 1/6;
    # seat 0's first-mover edge is credited to its moves and seat 1's win is diluted
    joint = torch.tensor(per_row(estimate("turn_rtg", b, std=False, scope="group"), b))
    assert torch.allclose(joint, torch.tensor([1 - 1 / 6, 1 - 1 / 6, -1 - 1 / 6] * 3 +
                                              [-1 - 1 / 6, -1 - 1 / 6, 1 - 1 / 6]))
    assert joint[seat == 0].mean() > 0.3 and joint[seat == 1].mean() < -0.6


def test_trloo_matches_reference():
    b, rs = batch(), rows()
    G = own_rtg(rs)
    want = []
    for r, g in zip(rs, G):
        others = [h for x, h in zip(rs, G) if x is not r and not x["trunc"] and
                  (x["g"], x["a"], x["k"]) == (r["g"], r["a"], r["k"])]
        want.append(0.0 if r["trunc"] else g - (sum(others) / len(others) if others else 0.0))
    assert per_row(estimate("trloo", b), b) == pytest.approx(want, abs=1e-5)
    # e.g. seat 0, turn 0 in group 0: G = 4 (E0) and 1 (E1) -> +3 and -3
    assert per_row(estimate("trloo", b), b)[0] == pytest.approx(3.0)


def _stop_or_go(outcome):
    """outcome: "stop" (reward 1, ends) | "ca" / "cb" (continue, then a: 2 or b: 0)."""
    turns = [Turn(agent=0, prompt_ids=[1], action_ids=[2 if outcome == "stop" else 3],
                  reward=1.0 if outcome == "stop" else 0.0, done=outcome == "stop")]
    if outcome != "stop":
        turns.append(Turn(agent=0, prompt_ids=[4], action_ids=[5 if outcome == "ca" else 6],
                          reward=2.0 if outcome == "ca" else 0.0, done=True))
    return turns


def test_per_turn_baseline_bias_enumerated():
    """The policy decides the episode length: p = P(continue), q = P(a | continued).

    J = (1 - p) + 2 p q; with logits (theta_c, theta_a): dJ = (p(1-p)(2q-1), 2 p q (1-q)).
    Enumerate both episodes of a group of G = 2 exactly. TRLOO (default, leave-one-out per
    turn index) gives E[sum_i sum_k A_ik grad log pi] = G * dJ. The self-inclusive per-turn
    mean halves turn 0 and, at turn 1, only counts pairs where *both* continued (the baseline
    depends on the sample's own action and on how many episodes reach the turn):
    (p(1-p)(2q-1), 2 p^2 q (1-q)) -- the wrong direction.
    """
    p, q = 0.6, 0.3
    prob = {"stop": 1 - p, "ca": p * q, "cb": p * (1 - q)}
    score = {"stop": [(-p, 0.0)], "ca": [(1 - p, 0.0), (0.0, 1 - q)],
             "cb": [(1 - p, 0.0), (0.0, -q)]}
    est = {True: torch.zeros(2, dtype=torch.float64), False: torch.zeros(2, dtype=torch.float64)}
    for o1 in prob:
        for o2 in prob:
            eps = [Episode(env="len", seed=i, group=0, num_agents=1, turns=_stop_or_go(o),
                           returns=[sum(t.reward for t in _stop_or_go(o))])
                   for i, o in enumerate((o1, o2))]
            b = collate(eps)
            for loo in (True, False):
                a = per_row(estimate("trloo", b, loo=loo), b)
                grads = score[o1] + score[o2]  # rows are in (episode, turn) order
                g = sum(torch.tensor(s, dtype=torch.float64) * ai for s, ai in zip(grads, a))
                est[loo] += prob[o1] * prob[o2] * g
    dJ = torch.tensor([p * (1 - p) * (2 * q - 1), 2 * p * q * (1 - q)], dtype=torch.float64)
    assert torch.allclose(est[True], 2 * dJ, atol=1e-6)
    biased = torch.tensor([p * (1 - p) * (2 * q - 1), 2 * p * p * q * (1 - q)],
                          dtype=torch.float64)
    assert torch.allclose(est[False], biased, atol=1e-6)
    cos = torch.nn.functional.cosine_similarity(est[False], dJ, dim=0)
    assert cos < 0.99


def test_gigpo_matches_reference():
    b, rs = batch(), rows()
    gamma, omega = 0.95, 0.7
    G = own_rtg(rs, gamma)
    ep = group_norm(rs, [r["ret"] for r in rs], GA, include=lambda r: r["last"] and not r["trunc"])
    want = []
    for r, g, a_e in zip(rs, G, ep):
        if r["trunc"]:
            want.append(0.0)
            continue
        anchor = [h for x, h in zip(rs, G) if not x["trunc"] and
                  (x["g"], x["a"], x["key"]) == (r["g"], r["a"], r["key"])]
        a_s = zscore(anchor)[anchor.index(g)] if len(anchor) > 1 else 0.0
        want.append(a_e + omega * a_s)
    got = per_row(estimate("gigpo", b, omega=omega, discount=gamma), b)
    assert got == pytest.approx(want, abs=1e-5)


def test_gigpo_step_advantage_opposes_episode_advantage():
    """E0 wins the episode but plays worse than E1 from the shared state "s"."""
    def ep(i, r0, r1, k0):
        return Episode(env="g", seed=i, group=0, num_agents=1, returns=[r0 + r1], turns=[
            Turn(agent=0, prompt_ids=[1], action_ids=[2], reward=r0, state_key=k0),
            Turn(agent=0, prompt_ids=[3], action_ids=[4], reward=r1, state_key="s", done=True)])
    b = collate([ep(0, 1.0, 0.0, "x"), ep(1, -1.0, 1.0, "y"), ep(2, 0.0, 0.5, "z")])
    a_e = per_row(estimate("gigpo", b, omega=0.0, std=False), b)
    full = per_row(estimate("gigpo", b, omega=1.0, std=False), b)
    a_s = [f - e for f, e in zip(full, a_e)]
    # returns (1, 0, 0.5): A_E = (0.5, -0.5, 0); rtg at "s": (0, 1, 0.5): A_S = (-0.5, 0.5, 0)
    assert a_e == pytest.approx([0.5, 0.5, -0.5, -0.5, 0.0, 0.0])
    assert a_s == pytest.approx([0.0, -0.5, 0.0, 0.5, 0.0, 0.0])  # singletons x, y, z: 0
    assert a_s[1] < 0 < a_e[1] and a_e[3] < 0 < a_s[3]


def test_gigpo_similarity_threshold_merges_close_states():
    b = collate([Episode(env="g", seed=i, group=0, num_agents=1, returns=[r], turns=[
        Turn(agent=0, prompt_ids=[1], action_ids=[2], reward=r, state_key=k, done=True)])
        for i, (k, r) in enumerate([("room 1 key", 1.0), ("room 1 kez", 0.0)])])
    exact = per_row(estimate("gigpo", b, omega=1.0, std=False, similarity=1.0), b)
    fuzzy = per_row(estimate("gigpo", b, omega=1.0, std=False, similarity=0.8), b)
    assert exact == pytest.approx([0.5, -0.5])  # episode part only
    assert fuzzy == pytest.approx([1.0, -1.0])  # plus the step part of one merged state
    with pytest.raises(ValueError, match="similarity"):
        estimate("gigpo", b, similarity=0.0)


def test_gigpo_similarity_clusters_within_each_group():
    """Keys X ~ Z (difflib ratio 0.91), Y ~ Z (0.83), X ~ Y (0.73); threshold 0.8.
    Group 0: two episodes in X, returns (1, 0); group 1: one in Y, one in Z, returns (1, 0).
    Clustered within group 1, Y and Z are one anchor state: A_S = +-0.5 / (sqrt(1/2) + eps)
    there as in group 0, on top of A_E, the same per group. (Clustered over the whole
    batch, Z would join X's cluster, leaving Y and Z alone in group 1 with A_S = 0.)"""
    X, Y, Z = "abcdefghij", "abcdefghklmn", "abcdefghijkl"
    ratio = lambda a, b: difflib.SequenceMatcher(None, a, b).ratio()  # noqa: E731
    assert ratio(X, Z) > 0.9 and 0.8 < ratio(Y, Z) < 0.9 and ratio(X, Y) < 0.8
    b = collate([Episode(env="g", seed=i, group=g, num_agents=1, returns=[r], turns=[
        Turn(agent=0, prompt_ids=[1], action_ids=[2], reward=r, state_key=k, done=True)])
        for i, (g, k, r) in enumerate([(0, X, 1.0), (0, X, 0.0), (1, Y, 1.0), (1, Z, 0.0)])])
    k = 0.5 / (math.sqrt(0.5) + 1e-6)  # A_E = A_S = +-k in both groups
    got = per_row(estimate("gigpo", b, similarity=0.8), b)
    assert got == pytest.approx([2 * k, -2 * k, 2 * k, -2 * k], abs=1e-6)
    assert 2 * k == pytest.approx(1.41421, abs=1e-5)


def test_gigpo_batch_anchors_pool_a_state_across_groups():
    """Every episode reaches state X after a start state of its own; from X group 0 gets
    1 and group 1 gets 0. Anchors per group: X's rtg is constant within each group, A_S = 0.
    Anchors over the batch: X's four turns have rtg (1, 1, 0, 0), A_S = +-0.5 (std off);
    the episode part, per group, is unchanged."""
    def ep(i, g, r_first, r_x):
        return Episode(env="g", seed=i, group=g, num_agents=1, returns=[r_first + r_x], turns=[
            Turn(agent=0, prompt_ids=[1], action_ids=[2], reward=r_first, state_key=f"s{i}"),
            Turn(agent=0, prompt_ids=[3], action_ids=[4], reward=r_x, state_key="X",
                 done=True)])
    b = collate([ep(0, 0, 3.0, 1.0), ep(1, 0, 1.0, 1.0), ep(2, 1, 1.0, 0.0),
                 ep(3, 1, 0.0, 0.0)])
    per_group = per_row(estimate("gigpo", b, std=False, discount=1.0), b)
    pooled = per_row(estimate("gigpo", b, std=False, discount=1.0, anchors="batch"), b)
    # returns (4, 2 | 1, 0): A_E = (1, -1 | 0.5, -0.5), one per episode's two turns
    a_e = [1.0, 1.0, -1.0, -1.0, 0.5, 0.5, -0.5, -0.5]
    # group anchors: X is shared within each group: rtg at X (1, 1 | 0, 0) -> A_S = 0
    assert per_group == pytest.approx(a_e)
    # batch anchors: X over 4 turns, rtg (1, 1, 0, 0), mean 0.5 -> +-0.5 at X turns only
    a_s = [0.0, 0.5, 0.0, 0.5, 0.0, -0.5, 0.0, -0.5]
    assert pooled == pytest.approx([e + s for e, s in zip(a_e, a_s)])
    with pytest.raises(ValueError, match="anchors"):
        estimate("gigpo", b, anchors="world")


def test_role_ema_reads_before_update_and_round_trips():
    b, rs = batch(), rows()
    state = RoleEMA()
    first = per_row(estimate("role_ema", b, state=state, decay=0.9), b)
    want1 = [0.0 if r["trunc"] else r["ret"] for r in rs]  # baseline 0 read before update
    assert first == pytest.approx(want1)
    # per (toy3, seat) mean over kept trajectories: seat0 (4+1+1)/3=2, seat1 (-1+2+0)/3=1/3,
    # seat2 (2+0-1)/3=1/3; b = 0.9*0 + 0.1*mean
    assert state.baselines == pytest.approx({"toy3/0": 0.2, "toy3/1": 0.1 / 3,
                                             "toy3/2": 0.1 / 3})
    clone = RoleEMA()
    clone.load_state_dict(json.loads(json.dumps(state.state_dict())))
    second = per_row(estimate("role_ema", b, state=clone, decay=0.9), b)
    base = {0: 0.2, 1: 0.1 / 3, 2: 0.1 / 3}
    assert second == pytest.approx([0.0 if r["trunc"] else r["ret"] - base[r["a"]] for r in rs])
    assert clone.baselines["toy3/0"] == pytest.approx(0.9 * 0.2 + 0.1 * 2)
    # without a state nothing is kept: every call starts at init (None: the batch mean)
    for _ in range(2):
        assert per_row(estimate("role_ema", b, init=0.5), b) == pytest.approx(
            [0.0 if r["trunc"] else r["ret"] - 0.5 for r in rs])
    mean = {0: 2.0, 1: 1 / 3, 2: 1 / 3}
    assert per_row(estimate("role_ema", b, init=None), b) == pytest.approx(
        [0.0 if r["trunc"] else r["ret"] - mean[r["a"]] for r in rs])
    with pytest.raises(ValueError, match="unknown RoleEMA state"):
        clone.load_state_dict({"bogus": 1})


def test_role_ema_non_finite_returns_never_enter_the_baselines():
    b, rs = batch(), rows()
    nan_rows = (b.episode == 0) & (b.agent == 0)  # E0 seat 0 (return 4) is lost: NaN
    bad = b.with_fields(returns=torch.where(nan_rows, torch.nan, b.returns))
    state = RoleEMA()
    first = per_row(estimate("role_ema", bad, state=state, decay=0.5), bad)
    assert first == pytest.approx([0.0 if r["trunc"] or (r["e"], r["a"]) == (0, 0)
                                   else r["ret"] for r in rs])
    # seat 0's kept, finite returns: E1 and E3, both 1 -> b = 0.5 * 0 + 0.5 * 1
    assert state.baselines["toy3/0"] == pytest.approx(0.5)
    second = per_row(estimate("role_ema", b, state=state, decay=0.5), b)  # a clean step
    assert second[0] == pytest.approx(4.0 - 0.5)
    assert state.baselines["toy3/0"] == pytest.approx(0.5 * 0.5 + 0.5 * 2.0)
    assert all(math.isfinite(v) for v in state.baselines.values())


def test_gated_matches_reference():
    b, rs = batch(), rows()
    thr = 1.0
    G = own_rtg(rs, 1.0, reward=lambda x: x["r"] * (x["ret"] >= thr) + x["ret"] * x["last"])
    want = group_norm(rs, G, GA)
    assert per_row(estimate("gated", b, threshold=thr), b) == pytest.approx(want, abs=1e-5)
    # seat 1 in E0 has outcome -1 < 1: its immediate rewards (0, -1) are gated out
    assert G[2:4] == [-1.0, -1.0]


def test_igpo_matches_reference():
    b, rs = batch(), rows()
    r = [x["ret"] if x["last"] else x["ex"]["p_after"] - x["ex"]["p_before"] for x in rs]
    z = group_norm(rs, r, lambda x: x["g"])
    for x, zi in zip(rs, z):
        x["z"] = zi
    want = [0.0 if x["trunc"] else v for x, v in zip(rs, own_rtg(rs, 0.9, lambda x: x["z"]))]
    assert per_row(estimate("igpo", b, discount=0.9), b) == pytest.approx(want, abs=1e-5)


def test_igpo_missing_extra_is_named():
    b = batch()
    with pytest.raises(ValueError, match="p_gain"):
        estimate("igpo", b, after="p_gain")


def test_archer_targets_min_of_twins():
    b, rs = batch(), rows()
    want = [0.0 if x["trunc"] else min(x["ex"]["q1"], x["ex"]["q2"]) -
            min(x["ex"]["v1"], x["ex"]["v2"]) for x in rs]
    assert per_row(estimate("archer_targets", b), b) == pytest.approx(want, abs=1e-6)


def test_unknown_scope_is_named():
    with pytest.raises(ValueError, match="scope"):
        estimate("turn_rtg", batch(), scope="team")


@pytest.mark.parametrize("scope,key", [("batch_agent", lambda r: r["a"]),
                                       ("batch", lambda r: 0), ("group", lambda r: r["g"])])
def test_turn_rtg_scopes_match_the_reference(scope, key):
    """Each scope's statistics over its own rows, value for value against the reference."""
    b, rs = batch(), rows()
    got = per_row(estimate("turn_rtg", b, scope=scope), b)
    assert got == pytest.approx(group_norm(rs, own_rtg(rs), key), abs=1e-5)

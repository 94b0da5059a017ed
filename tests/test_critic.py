"""Critic-based estimators against hand-computed numbers and per-token Python recursions
(written here, independently of the implementation), on collated multi-seat batches and on
batches with scattered (non-contiguous) action masks and garbage values off the mask."""

import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.advantages import compute, estimate
from sparring.advantages.gae import archer_q_target, archer_td_targets, archer_v_target
from sparring.advantages.scan import reverse_discounted_sum
from sparring.data import Episode, Turn, collate
from tests.helpers import two_seat_episode
from tests.turn_batches import batch, random_batch, rows


def token_sequences(b):
    """Per trajectory: list of (row, col) of its action tokens in order (brute force)."""
    seqs = {}
    order = sorted(range(b.n_rows), key=lambda i: (int(b.traj[i]), int(b.turn[i])))
    for i in order:
        for t in range(b.action_mask.shape[1]):
            if b.action_mask[i, t]:
                seqs.setdefault(int(b.traj[i]), []).append((i, t))
    return seqs


def last_token(b, i):
    return max(t for t in range(b.action_mask.shape[1]) if b.action_mask[i, t])


def reference_gae(b, gamma, lam, token_rewards=None, add_return=False, truncated="mask",
                  whiten=False):
    """A_t = r_t + gamma V_next - V_t + gamma lam A_next, walking each trajectory's action
    tokens backwards; then the kept rows, then whitening over their action tokens."""
    V = b.values
    A = torch.zeros(V.shape, dtype=torch.float64)
    for seq in token_sequences(b).values():
        nxt_v, nxt_a = 0.0, 0.0
        for i, t in reversed(seq):
            r = 0.0
            if t == last_token(b, i):
                r = float(b.reward[i]) + (float(b.returns[i]) if add_return and b.last[i] else 0.0)
            if token_rewards is not None:
                r += float(token_rewards[i, t])
            a = r + gamma * nxt_v - float(V[i, t]) + gamma * lam * nxt_a
            A[i, t] = a
            nxt_v, nxt_a = float(V[i, t]), a
    kept = [(i, t) for seq in token_sequences(b).values() for i, t in seq
            if truncated == "terminal" or not b.truncated[i]]
    out = torch.zeros_like(A)
    vals = [float(A[i, t]) for i, t in kept]
    for (i, t), a in zip(kept, vals):
        if whiten:
            m, sd = statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0
            a = (a - m) / (sd + 1e-8) if max(vals) > min(vals) else 0.0
        out[i, t] = a
    return out


def reference_turn_gae(b, gamma, lam, high_gamma, high_lam, truncated="mask", whiten=False):
    """Bi-level GAE by plain loops: over each agent's turns with turn-end values, then
    inside each turn over its action tokens."""
    V = b.values
    A = torch.zeros(V.shape, dtype=torch.float64)
    by_traj = {}
    for i in range(b.n_rows):
        by_traj.setdefault(int(b.traj[i]), []).append(i)
    for rows_ in by_traj.values():
        rows_.sort(key=lambda i: int(b.turn[i]))
        v_end = [float(V[i, last_token(b, i)]) for i in rows_]
        a_hi, acc = [0.0] * len(rows_), 0.0
        for k in reversed(range(len(rows_))):
            nv = v_end[k + 1] if k + 1 < len(rows_) else 0.0
            acc = float(b.reward[rows_[k]]) + high_gamma * nv - v_end[k] + high_gamma * high_lam * acc
            a_hi[k] = acc
        for k, i in enumerate(rows_):
            y = a_hi[k] + v_end[k]
            toks = [t for t in range(V.shape[1]) if b.action_mask[i, t]]
            a_n, v_n = 0.0, 0.0
            for t in reversed(toks):
                r = y if t == toks[-1] else 0.0
                a_n = r + gamma * v_n - float(V[i, t]) + gamma * lam * a_n
                v_n = float(V[i, t])
                A[i, t] = a_n
            assert abs(A[i, toks[-1]] - a_hi[k]) < 1e-9  # the last token's advantage is A^hi
    keep = torch.tensor([truncated == "terminal" or not bool(x) for x in b.truncated])
    m = b.action_mask & keep[:, None]
    A = torch.where(m, A, 0.0)
    if whiten:
        vals = A[m]
        A[m] = (vals - vals.mean()) / (vals.std() + 1e-8)
    return A


def scattered(b, seed):
    """The same rows with random, non-contiguous action masks (observation tokens between
    action tokens, as in trajectory layout), NaN values and garbage rewards off the mask."""
    g = torch.Generator().manual_seed(seed)
    n, T = b.action_mask.shape
    mask = torch.rand(n, T + 6, generator=g) < 0.55
    mask[:, -2:] = False  # padding
    mask[:, 0] = True  # every row acts (collate never makes a row without actions)
    V = torch.where(mask, torch.randn(mask.shape, generator=g), torch.nan)
    return b.with_fields(action_mask=mask, attention_mask=torch.ones_like(mask),
                         input_ids=torch.zeros(mask.shape, dtype=torch.long), values=V,
                         old_logp=torch.zeros(mask.shape), entropy=None, length=mask.sum(1))


def batches():
    out = {"three-seat": batch()}
    out["three-seat"] = out["three-seat"].with_fields(values=torch.randn(
        out["three-seat"].input_ids.shape, generator=torch.Generator().manual_seed(0)))
    for seed in range(2):
        out[f"random-{seed}"] = random_batch(seed)
        out[f"scattered-{seed}"] = scattered(random_batch(seed), seed)
        out[f"trajectory-{seed}"] = random_batch(seed + 5, layout="trajectory")
        out[f"scattered-trajectory-{seed}"] = scattered(random_batch(seed + 5,
                                                                     layout="trajectory"), seed)
    return out


BATCHES = batches()
GAE_OPTIONS = [dict(gamma=1.0, lam=0.95), dict(gamma=0.9, lam=0.7, truncated="terminal"),
               dict(gamma=0.99, lam=0.0), dict(gamma=0.0, lam=0.5), dict(gamma=1.0, lam=1.0),
               dict(gamma=0.95, lam=0.9, whiten=True), dict(gamma=0.8, lam=0.6, add_return=True)]


@pytest.mark.parametrize("name", BATCHES)
@pytest.mark.parametrize("opts", GAE_OPTIONS, ids=str)
def test_gae_equals_the_token_recursion(name, opts):
    b = BATCHES[name]
    got = estimate("gae", b, **opts)
    assert torch.allclose(got.double(), reference_gae(b, **opts), atol=1e-5)


@pytest.mark.parametrize("name", BATCHES)
def test_gae_token_rewards_equal_the_token_recursion(name):
    b = BATCHES[name]
    tr = torch.randn(b.action_mask.shape, generator=torch.Generator().manual_seed(3))
    tr = torch.where(b.action_mask, tr, torch.nan)  # read on action tokens only
    got = estimate("gae", b, gamma=0.97, lam=0.9, token_rewards=tr)
    assert torch.allclose(got.double(), reference_gae(b, 0.97, 0.9, token_rewards=tr), atol=1e-5)


def test_gae_and_turn_gae_hand_computed():
    """One agent, two turns. Turn 0: prompt, actions t1 (V 0.5), t2 (V 1.0), reward 0;
    turn 1: prompt, action t3 (V 2.0), reward 1. gamma = lam = 0.5.
    GAE: A3 = 1 - 2 = -1; A2 = 0.5 * 2 - 1 + 0.25 * (-1) = -0.25;
    A1 = 0.5 * 1 - 0.5 + 0.25 * (-0.25) = -0.0625.
    Bi-level (high_gamma 1, high_lam 0.5): delta_1 = 1 - 2 = -1, delta_0 = 2 - 1 = 1,
    A^hi = (1 + 0.5 * (-1), -1) = (0.5, -1), y = (1.5, 1); turn 0: t2 = 1.5 - 1 = 0.5,
    t1 = 0.5 - 0.5 + 0.25 * 0.5 = 0.125; turn 1: t3 = 1 - 2 = -1."""
    b = collate([Episode(env="h", seed=0, group=0, num_agents=1, returns=[1.0], turns=[
        Turn(agent=0, prompt_ids=[1], action_ids=[2, 3], reward=0.0),
        Turn(agent=0, prompt_ids=[4], action_ids=[5], reward=1.0, done=True)])])
    b = b.with_fields(values=torch.tensor([[9.0, 0.5, 1.0], [9.0, 2.0, 9.0]]))
    got = estimate("gae", b, gamma=0.5, lam=0.5)
    assert torch.allclose(got, torch.tensor([[0.0, -0.0625, -0.25], [0.0, -1.0, 0.0]]))
    got = estimate("turn_gae", b, gamma=0.5, lam=0.5, high_gamma=1.0, high_lam=0.5)
    assert torch.allclose(got, torch.tensor([[0.0, 0.125, 0.5], [0.0, -1.0, 0.0]]))


episode_spec = st.lists(  # one episode: list of (agent, prompt_len, action_len, reward)
    st.tuples(st.integers(0, 2), st.integers(1, 3), st.integers(1, 4),
              st.floats(-2, 2, allow_nan=False)), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None)
@given(st.lists(episode_spec, min_size=1, max_size=3), st.floats(0.0, 1.0), st.floats(0.0, 1.0),
       st.integers(0, 10_000))
def test_gae_equals_recursion(specs, gamma, lam, seed):
    eps = [Episode(env="h", seed=e, group=0, num_agents=3, returns=[0.0] * 3, turns=[
        Turn(agent=a, prompt_ids=[7] * lp, action_ids=[8] * la, reward=r)
        for a, lp, la, r in spec]) for e, spec in enumerate(specs)]
    b = collate(eps)
    V = torch.randn(b.input_ids.shape, generator=torch.Generator().manual_seed(seed))
    b = b.with_fields(values=V)
    got = estimate("gae", b, gamma=gamma, lam=lam, truncated="terminal")
    want = reference_gae(b, gamma, lam, truncated="terminal")
    assert torch.allclose(got.double(), want, atol=1e-4)
    assert got[~b.action_mask].abs().sum() == 0


def test_gae_ignores_observation_tokens_trajectory_layout():
    b = collate([two_seat_episode()], layout="trajectory")
    V = torch.linspace(-1, 1, b.input_ids.numel()).view(b.input_ids.shape)
    b = b.with_fields(values=V)
    base = estimate("gae", b, gamma=0.9, lam=0.8)
    obs = b.attention_mask & ~b.action_mask
    assert obs.any()
    noisy = b.with_fields(values=torch.where(obs, V + 100.0, V))
    tok_r = torch.where(obs, torch.full_like(V, 5.0), torch.zeros_like(V))
    assert torch.equal(estimate("gae", noisy, gamma=0.9, lam=0.8), base)
    assert torch.equal(estimate("gae", b, gamma=0.9, lam=0.8, token_rewards=tok_r), base)
    # seat 0's row: action tokens at 2, 3, 5, 6, 7 (4 is the observation); reward 1 at 7
    v = V[0]
    seq = [2, 3, 5, 6, 7]
    a_next, v_next, want = 0.0, 0.0, {}
    for t in reversed(seq):
        r = 1.0 if t == 7 else 0.0
        a_next = r + 0.9 * v_next - float(v[t]) + 0.72 * a_next
        v_next = float(v[t])
        want[t] = a_next
    assert [float(base[0, t]) for t in seq] == pytest.approx([want[t] for t in seq], abs=1e-5)


def test_gae_on_three_seat_batch_masks_truncated_and_whitens():
    b = batch()
    V = torch.randn(b.input_ids.shape, generator=torch.Generator().manual_seed(0))
    b = b.with_fields(values=V)
    adv, keep = compute("gae", b, gamma=0.9, lam=0.7)
    want = reference_gae(b, 0.9, 0.7).float()
    assert torch.allclose(adv[keep], want[keep], atol=1e-5)
    assert adv[~keep].abs().sum() == 0
    w = estimate("gae", b, gamma=0.9, lam=0.7, whiten=True)
    m = b.action_mask & keep[:, None]
    assert float(w[m].mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(w[m].std()) == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ValueError, match="values"):
        estimate("gae", batch())


@pytest.mark.parametrize("name", [k for k, b in BATCHES.items() if b.layout == "turn"])
@pytest.mark.parametrize("opts", [dict(), dict(high_lam=0.6, truncated="terminal"),
                                  dict(gamma=0.7, lam=0.0, whiten=True)], ids=str)
def test_turn_gae_matches_bilevel_recursion(name, opts):
    b = BATCHES[name]
    o = dict(gamma=0.9, lam=0.8, high_gamma=0.95) | opts
    want = reference_turn_gae(b, o["gamma"], o["lam"], o["high_gamma"],
                              o.get("high_lam", o["lam"]), o.get("truncated", "mask"),
                              o.get("whiten", False))
    assert torch.allclose(estimate("turn_gae", b, **o).double(), want, atol=1e-5)


def test_reverse_discounted_sum_hand_values():
    x = torch.tensor([[1.0, 2.0, 4.0], [0.0, 0.0, 8.0]])
    # G_2 = x_2; G_1 = x_1 + 0.5 G_2; G_0 = x_0 + 0.5 G_1
    assert reverse_discounted_sum(x, 0.5).tolist() == [[3.0, 4.0, 4.0], [2.0, 4.0, 8.0]]
    assert reverse_discounted_sum(x, 1.0).tolist() == [[7.0, 6.0, 4.0], [8.0, 8.0, 8.0]]
    with pytest.raises(ValueError, match="discount"):
        reverse_discounted_sum(x, -0.5)


def test_archer_targets_and_td_targets():
    b, rs = batch(), rows()
    assert archer_q_target(torch.tensor([1.0]), torch.tensor([False]), torch.tensor([2.0]),
                           0.5).item() == 2.0
    assert archer_v_target(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 0.5])).tolist() == [
        1.0, 0.5]
    vt = {}
    for x in rs:
        vt[(x["e"], x["a"], x["k"])] = 0.1 * x["step"] + x["a"]
    ex = dict(b.extras)
    ex["v_target"] = torch.tensor([vt[(x["e"], x["a"], x["k"])] for x in rs])
    q, valid = archer_td_targets(b.with_fields(extras=ex), gamma=0.5)
    want = [x["r"] + (0.0 if x["last"] else 0.5 * vt[(x["e"], x["a"], x["k"] + 1)]) for x in rs]
    assert q.tolist() == pytest.approx(want, abs=1e-6)
    assert valid.tolist() == [not (x["trunc"] and x["last"]) for x in rs]

"""Critic-based estimators against direct recursive computations."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.advantages import compute, estimate
from sparring.advantages.critic import archer_q_target, archer_td_targets, archer_v_target
from sparring.advantages.scan import reverse_scan
from sparring.data import Episode, Turn, collate
from tests.helpers import two_seat_episode
from tests.turn_batches import batch, rows


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


def recursive_gae(b, gamma, lam, V):
    """A_t = r_t + gamma V_next - V_t + gamma lam A_next, walking each trajectory backwards."""
    A = torch.zeros_like(V, dtype=torch.float64)
    for seq in token_sequences(b).values():
        nxt_v, nxt_a = 0.0, 0.0
        for i, t in reversed(seq):
            r = float(b.reward[i]) if t == last_token(b, i) else 0.0
            a = r + gamma * nxt_v - float(V[i, t]) + gamma * lam * nxt_a
            A[i, t] = a
            nxt_v, nxt_a = float(V[i, t]), a
    return A


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
    want = recursive_gae(b, gamma, lam, V)
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
    want = recursive_gae(b, 0.9, 0.7, V).float()
    assert torch.allclose(adv[keep], want[keep], atol=1e-5)
    assert adv[~keep].abs().sum() == 0
    w = estimate("gae", b, gamma=0.9, lam=0.7, whiten=True)
    m = b.action_mask & keep[:, None]
    assert float(w[m].mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(w[m].std()) == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ValueError, match="values"):
        estimate("gae", batch())


def test_turn_gae_matches_bilevel_recursion():
    b = batch()
    V = torch.randn(b.input_ids.shape, generator=torch.Generator().manual_seed(1))
    b = b.with_fields(values=V)
    g, lam, hg, hl = 0.9, 0.8, 0.95, 0.6
    got = estimate("turn_gae", b, gamma=g, lam=lam, high_gamma=hg, high_lam=hl,
                   truncated="terminal")
    want = torch.zeros_like(V)
    by_traj = {}
    for i in range(b.n_rows):
        by_traj.setdefault(int(b.traj[i]), []).append(i)
    for rows_ in by_traj.values():
        rows_.sort(key=lambda i: int(b.turn[i]))
        v_end = [float(V[i, last_token(b, i)]) for i in rows_]
        a_hi, acc = [0.0] * len(rows_), 0.0
        for k in reversed(range(len(rows_))):
            nv = v_end[k + 1] if k + 1 < len(rows_) else 0.0
            acc = float(b.reward[rows_[k]]) + hg * nv - v_end[k] + hg * hl * acc
            a_hi[k] = acc
        for k, i in enumerate(rows_):
            y = a_hi[k] + v_end[k]
            toks = [t for t in range(V.shape[1]) if b.action_mask[i, t]]
            a_n, v_n = 0.0, 0.0
            for t in reversed(toks):
                r = y if t == toks[-1] else 0.0
                a_n = r + g * v_n - float(V[i, t]) + g * lam * a_n
                v_n = float(V[i, t])
                want[i, t] = a_n
            assert float(got[i, toks[-1]]) == pytest.approx(a_hi[k], abs=1e-5)
    assert torch.allclose(got, want, atol=1e-5)


def test_reverse_scan_long_axis_uses_loop_and_agrees():
    a = torch.randn(3, 700, dtype=torch.float64)
    b = torch.rand(3, 700, dtype=torch.float64)
    want = torch.zeros_like(a)
    acc = torch.zeros(3, dtype=torch.float64)
    for k in range(699, -1, -1):
        acc = a[:, k] + b[:, k] * acc
        want[:, k] = acc
    assert torch.allclose(reverse_scan(a, b), want)
    short = torch.zeros(3, 40, dtype=torch.float64)
    acc = torch.zeros(3, dtype=torch.float64)
    for k in range(39, -1, -1):
        acc = a[:, k] + b[:, k] * acc
        short[:, k] = acc
    assert torch.allclose(reverse_scan(a[:, :40], b[:, :40]), short)
    with pytest.raises(ValueError, match="discount"):
        reverse_scan(a, -0.5)


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

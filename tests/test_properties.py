"""Hypothesis properties over random shapes and masks for group estimators, segment ids and
objectives."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.advantages import ESTIMATORS, compute, list_estimators
from sparring.data import TurnBatch
from sparring.objectives import list_objectives, loss
from sparring.segments import compact_ids, segment_count

list_estimators()
GROUP = [e.name for e in ESTIMATORS if e.family == "group"]
REWARDS = st.sampled_from([0.0, 0.25, 0.5, 1.0])


@st.composite
def traj_specs(draw):
    """Trajectories (group, agent, reward) and, per trajectory, 1-3 rows with lengths."""
    n = draw(st.integers(1, 12))
    T = draw(st.integers(1, 5))
    trajs = [(draw(st.integers(0, 3)), draw(st.integers(0, 1)), draw(REWARDS)) for _ in range(n)]
    rows = [[draw(st.integers(0, T)) for _ in range(draw(st.integers(1, 3)))] for _ in range(n)]
    rows[0][0] = T  # fixes the padded width
    greedy = [draw(REWARDS) for _ in range(n)]
    return trajs, rows, greedy


def build(trajs, rows, greedy, turn_layout):
    """One row per trajectory, or several rows per trajectory sharing its return."""
    reps = [len(r) for r in rows] if turn_layout else [1] * len(trajs)
    lens = [x for r in rows for x in r] if turn_layout else [sum(r) for r in rows]
    idx = torch.repeat_interleave(torch.arange(len(trajs)), torch.tensor(reps))
    g, a, r = (torch.tensor([t[k] for t in trajs])[idx] for k in range(3))
    b = TurnBatch.from_scalars(r.float(), g, a, torch.tensor(lens))
    b.extras["greedy_reward"] = torch.tensor(greedy, dtype=torch.float32)[idx]
    return b.with_fields(traj=idx, episode=idx.clone())


@settings(max_examples=40, deadline=None)
@given(traj_specs())
def test_group_estimators_finite_masked_and_layout_free(spec):
    trajs, rows, greedy = spec
    turn = build(trajs, rows, greedy, turn_layout=True)
    flat = build(trajs, rows, greedy, turn_layout=False)
    for name in GROUP:
        adv, keep = compute(name, turn)
        assert adv.shape == turn.action_mask.shape and keep.shape == (turn.n_rows,)
        assert torch.isfinite(adv).all(), name
        assert (adv[~turn.action_mask] == 0).all(), name
        # a trajectory's rows carry one value: the same as with one row per trajectory
        per_row = adv.sum(1) / turn.action_mask.sum(1).clamp(min=1)
        flat_adv, flat_keep = compute(name, flat)
        per_traj = flat_adv.sum(1) / flat.action_mask.sum(1).clamp(min=1)
        has = turn.action_mask.any(1) & flat.action_mask.any(1)[turn.traj]
        assert torch.allclose(per_row[has], per_traj[turn.traj][has], atol=1e-5), name
        assert torch.equal(keep, flat_keep[turn.traj]), name


@settings(max_examples=40, deadline=None)
@given(traj_specs())
def test_mc_grpo_drops_one_pivot_per_odd_group(spec):
    trajs, rows, greedy = spec
    flat = build(trajs, rows, greedy, turn_layout=False)
    _, keep = compute("mc_grpo", flat)
    seg, n = compact_ids(flat.group, flat.agent)  # statistics are per (group, agent)
    sizes = segment_count(seg, n, torch.long)
    assert int((~keep).sum()) == int((sizes % 2 == 1).sum())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 5), st.integers(0, 2 ** 40), st.integers(-2, 2)),
                min_size=1, max_size=30), st.integers(1, 3))
def test_compact_ids_number_key_tuples_in_lexicographic_order(tuples, k):
    tuples = [t[:k] for t in tuples]
    keys = [torch.tensor([t[j] for t in tuples]) for j in range(k)]
    rank = {t: i for i, t in enumerate(sorted(set(tuples)))}
    ids, n = compact_ids(*keys)
    assert n == len(rank) and ids.tolist() == [rank[t] for t in tuples]


OBJ_OPTS = {"entropy_bonus": lambda n, T, g: {"entropy": torch.rand(n, T, generator=g)}}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 10_000))
def test_objectives_finite_masked_shaped(n, T, seed):
    g = torch.Generator().manual_seed(seed)
    logp = -3 * torch.rand(n, T, generator=g)
    old = logp + 0.5 * torch.randn(n, T, generator=g)
    ref = logp + 0.5 * torch.randn(n, T, generator=g)
    adv = torch.randn(n, T, generator=g)
    mask = torch.rand(n, T, generator=g) < 0.7
    group = torch.randint(0, 3, (n,), generator=g)
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    for e in list_objectives():
        opts = OBJ_OPTS.get(e.name, lambda *_: {})(n, T, g)
        if "group" in e.needs:
            opts.update(group=group, rewards=rewards)
        out = loss(e.name, logp, old, adv, mask, ref_logp=ref, **opts)
        assert out.shape == (n, T), e.name
        assert torch.isfinite(out).all(), e.name
        assert (out[~mask] == 0).all(), e.name

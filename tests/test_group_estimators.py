"""Trajectory-level estimators and group filters against hand-computed numbers."""

import math
import statistics as st

import pytest
import torch

from sparring.advantages import compute, estimate
from sparring.advantages.filters import drop_zero_variance_groups, top_abs_advantage
from sparring.data import TurnBatch, collate
from tests.helpers import two_seat_episode

# group 0: R = [1, 0, 0, 1] (mean 0.5, unbiased std sqrt(1/3)); group 1: R = [3, 1, 2]
R = [1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0]
G = [0, 0, 0, 0, 1, 1, 1]
S3 = math.sqrt(1 / 3)

GROUP_ESTIMATORS = ["reinforce", "rloo", "grpo", "dr_grpo", "mc_grpo", "bnpo", "ngrpo",
                    "a_grae", "opo", "reinforce_pp", "reinforce_pp_baseline", "gpg", "remax"]


def close(got, want, tol=1e-5):
    got = [float(x) for x in got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert abs(g - w) < tol, (got, want)


def test_reinforce_constant_baseline():
    close(estimate("reinforce", R, group=G), R)
    close(estimate("reinforce", R, group=G, baseline=0.5), [r - 0.5 for r in R])


def test_rloo_hand_and_excludes_self():
    close(estimate("rloo", R, group=G), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.5, -1.5, 0.0])
    a = estimate("rloo", R, group=G)
    for i in range(len(R)):  # baseline = mean of the *other* members of the group
        others = [R[j] for j in range(len(R)) if G[j] == G[i] and j != i]
        assert abs(float(a[i]) - (R[i] - sum(others) / len(others))) < 1e-6
    assert float(estimate("rloo", [5.0], group=[0])[0]) == 0.0  # a group of one


def test_grpo_hand_std_options():
    k = 0.5 / S3
    close(estimate("grpo", R, group=G), [k, -k, -k, k, 1.0, -1.0, 0.0])
    close(estimate("grpo", R, group=G, unbiased=False),
          [1, -1, -1, 1, 1 / math.sqrt(2 / 3), -1 / math.sqrt(2 / 3), 0.0])
    close(estimate("grpo", R, group=G, scale=False), [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0])
    sb = st.stdev(R)  # std over the whole batch
    close(estimate("grpo", R, group=G, std_over="batch"),
          [0.5 / sb, -0.5 / sb, -0.5 / sb, 0.5 / sb, 1 / sb, -1 / sb, 0.0])
    with pytest.raises(ValueError, match="std_over"):
        estimate("grpo", R, group=G, std_over="token")
    with pytest.raises(TypeError):
        estimate("grpo", R, group=G, nonsense=1)


def test_grpo_invariance_shift_and_scale():
    g = torch.randint(0, 5, (40,), generator=torch.Generator().manual_seed(0))
    r = torch.randn(40, generator=torch.Generator().manual_seed(1))
    base = estimate("grpo", r, group=g, eps=1e-12)
    assert torch.allclose(estimate("grpo", r + 7.5, group=g, eps=1e-12), base, atol=1e-4)
    assert torch.allclose(estimate("grpo", r * 3.0, group=g, eps=1e-12), base, atol=1e-4)
    # without std scaling, scaling the rewards scales the advantages
    assert torch.allclose(estimate("grpo", r * 3.0, group=g, scale=False),
                          3 * estimate("grpo", r, group=g, scale=False), atol=1e-5)


def test_dr_grpo_and_gpg():
    close(estimate("dr_grpo", R, group=G), [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0])
    # a third, flat group: 2 of 3 groups have signal -> advantages scaled by 3/2
    r, g = R + [4.0, 4.0], G + [2, 2]
    close(estimate("gpg", r, group=g), [0.75, -0.75, -0.75, 0.75, 1.5, -1.5, 0.0, 0.0, 0.0])


def test_mc_grpo_median_and_pivot():
    batch = TurnBatch.from_scalars(R, G)
    adv, keep = compute("mc_grpo", batch)
    close(adv[:, 0], [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0])  # group 0: median 0.5
    assert keep.tolist() == [True] * 4 + [True, True, False]  # odd group: pivot R=2 dropped
    # ties: exactly one pivot per odd group, the middle one in (R, index) order
    _, keep = compute("mc_grpo", TurnBatch.from_scalars([1.0, 1.0, 1.0, 0.0, 5.0], [0] * 5))
    assert keep.tolist() == [True, False, True, True, True]
    close(estimate("mc_grpo", [0.0, 4.0, 1.0], group=[0, 0, 0]), [-1.0, 3.0, 0.0])


def test_opo_length_weighted_baseline():
    b = (1 * 1 + 2 * 1) / (1 + 2 + 3 + 2)  # sum len R / sum len
    close(estimate("opo", [1.0, 0.0, 0.0, 1.0], group=[0] * 4, lengths=[1, 3, 2, 2]),
          [1 - b, -b, -b, 1 - b])


def test_ngrpo_virtual_max_sample():
    r, g = [0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1, 2, 2]
    # group 0 + virtual 1: [0,0,0,1] mean .25 std .5; group 1 + 1: [1,0,1] mean 2/3 std sqrt(1/3)
    close(estimate("ngrpo", r, group=g, eps=1e-12),
          [-0.5, -0.5, -0.5, (1 / 3) / S3, -(2 / 3) / S3, 0.0, 0.0])
    with pytest.raises(ValueError, match="max_reward"):
        estimate("ngrpo", [2.0, 0.0], group=[0, 0])


def test_bnpo_fixed_and_fitted_beta():
    r = [1.0, 0.0, 0.0, 1.0]
    # alpha = beta = 1.5 -> a = b = 1.5, f(0.5) = 0.5 / B(1.5, 1.5) = 4 / pi -> A = +-pi / 8
    q = math.pi / 8
    close(estimate("bnpo", r, group=[0] * 4, alpha=1.5, beta=1.5), [q, -q, -q, q])
    # fitted: success rates p = [0.5, 0.25, 1.0] over three groups (method of moments)
    rr = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    gg = [0, 0, 1, 1, 1, 1, 1, 1, 2, 2]
    p = [0.5, 1 / 6, 1.0]
    m, v = st.mean(p), st.pvariance(p)
    c = m * (1 - m) / v - 1
    a, b = 1 + m * c / 3, 1 + (1 - m) * c / 3
    logB = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    f = [math.exp((a - 1) * math.log(x) + (b - 1) * math.log(1 - x) - logB) if 0 < x < 1 else 0
         for x in p]
    want = [0.0 if f[g] == 0 else (r_ - p[g]) / f[g] for r_, g in zip(rr, gg)]
    close(estimate("bnpo", rr, group=gg), want)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        estimate("bnpo", [2.0, 0.0], group=[0, 0])


def test_a_grae_suppresses_positive_advantages():
    k = 0.5 / S3
    close(estimate("a_grae", R, group=G, factor=0.5), [k / 2, -k, -k, k / 2, 0.5, -1.0, 0.0])
    # linear schedule 1.0 -> 0.5, halfway: 0.75
    close(estimate("a_grae", R, group=G, step=5, total_steps=10),
          [0.75 * k, -k, -k, 0.75 * k, 0.75, -1.0, 0.0])
    with pytest.raises(ValueError, match="not both"):
        estimate("a_grae", R, group=G, factor=0.5, step=1, total_steps=2)


def test_reinforce_pp_whitening():
    m, s = st.mean(R), st.stdev(R)
    close(estimate("reinforce_pp", R, group=G, eps=1e-12), [(r - m) / s for r in R])
    c = [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0]
    sc = st.stdev(c)
    close(estimate("reinforce_pp_baseline", R, group=G, eps=1e-12), [x / sc for x in c])


def test_remax_greedy_baseline():
    b = torch.tensor([0.5, 0.5, 0.5, 0.5, 2.0, 2.0, 2.0])
    close(estimate("remax", R, group=G, baseline=b), [r - float(x) for r, x in zip(R, b)])
    batch = TurnBatch.from_scalars(R, G)
    batch.extras["greedy_reward"] = b
    close(compute("remax", batch)[0][:, 0], [r - float(x) for r, x in zip(R, b)])
    with pytest.raises(ValueError, match="greedy"):
        estimate("remax", R, group=G)
    with pytest.raises(ValueError, match="shape"):
        estimate("remax", R, group=G, baseline=torch.zeros(3))


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
@pytest.mark.parametrize("value", [1.0, 0.3])
def test_all_equal_rewards_give_zero(name, value):
    if name == "ngrpo" and value != 1.0:
        pytest.skip("ngrpo gives all-wrong groups a signal by design (tested above)")
    opts = {"reinforce": {"baseline": value}, "remax": {"baseline": torch.full((6,), value)}}
    a = estimate(name, [value] * 6, group=[0, 0, 0, 1, 1, 1], **opts.get(name, {}))
    tol = 1e-7 if name == "reinforce" else 0.0  # float32 R minus a Python float baseline
    assert torch.isfinite(a).all() and (a.abs() <= tol).all(), a


def test_an_agent_key_means_per_group_agent_statistics():
    """rewards [1, 0, 1, 0], one group, agents [0, 0, 1, 1]: each (group, agent) holds
    {1, 0} (mean 0.5, unbiased std sqrt(1/2)), so A = +-0.5 / sqrt(1/2) = +-0.7071; pooled
    over the group (mean 0.5, std sqrt(1/3)) it would be +-0.866."""
    r, g, a = [1.0, 0.0, 1.0, 0.0], [0, 0, 0, 0], [0, 0, 1, 1]
    k = 0.5 / math.sqrt(0.5)
    close(estimate("grpo", r, group=g, agent=a), [k, -k, k, -k])
    close(estimate("grpo", r, group=g), [0.5 / S3, -0.5 / S3, 0.5 / S3, -0.5 / S3])
    # seat 1 always wins, seat 0 always loses: per seat there is nothing to learn
    close(estimate("rloo", [0.0, 0.0, 1.0, 1.0], group=g, agent=a), [0.0] * 4)
    close(estimate("dr_grpo", [0.0, 0.0, 1.0, 1.0], group=g), [-0.5, -0.5, 0.5, 0.5])
    # batch-wide statistics are per agent too: reinforce_pp whitens each seat's returns
    close(estimate("reinforce_pp", [1.0, 0.0, 5.0, 3.0], group=g, agent=a, eps=1e-12),
          [k, -k, k, -k])


def test_turn_layout_counts_trajectories_once_and_agent_keys():
    # three episodes of one group; seat 0 has two turn rows per episode, seat 1 one
    eps = [two_seat_episode(group=0, seed=i, returns=(r0, r1))
           for i, (r0, r1) in enumerate([(1.0, -1.0), (0.0, 0.0), (2.0, -2.0)])]
    b = collate(eps, layout="turn")
    assert b.n_rows == 9
    a = compute("dr_grpo", b)[0]
    per_row = (a.sum(1) / b.action_mask.sum(1)).tolist()
    # seat 0 [1, 0, 2] -> mean 1; seat 1 [-1, 0, -2] -> mean -1; each trajectory once,
    # although seat 0's trajectories have two rows each
    want = [float(r) - 1.0 if int(ag) == 0 else float(r) + 1.0
            for r, ag in zip(b.returns, b.agent)]
    close(per_row, want)
    a = compute("grpo", b)[0]  # std 1 in both seats
    close((a.sum(1) / b.action_mask.sum(1)).tolist(), want)
    assert (a[~b.action_mask] == 0).all()


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_agents_are_separate_problems(name):
    """With agent keys, each agent's advantages are those of its rows alone."""
    gen = torch.Generator().manual_seed(3)
    n = 30
    g = torch.randint(0, 3, (n,), generator=gen)
    ag = torch.randint(0, 2, (n,), generator=gen)
    r = torch.randint(0, 2, (n,), generator=gen).float()
    opts = {"remax": {"baseline": torch.rand(n, generator=gen)},
            "bnpo": {"alpha": 2.0, "beta": 3.0}}.get(name, {})
    full = estimate(name, r, group=g, agent=ag, **opts)
    for a in (0, 1):
        rows = (ag == a).nonzero().squeeze(1)
        sub_opts = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in opts.items()}
        sub = estimate(name, r[rows], group=g[rows], **sub_opts)
        if name == "gpg":  # the signal fraction is batch-wide: equal up to one factor
            k = full[rows].abs().sum() / sub.abs().sum()
            assert torch.allclose(full[rows], k * sub, atol=1e-5) and k > 0
        else:
            assert torch.allclose(full[rows], sub, atol=1e-5), name


def test_by_agent_is_gone():
    with pytest.raises(TypeError):
        estimate("grpo", R, group=G, by_agent=True)


def test_filters():
    r, g = [1.0, 0.0, 2.0, 2.0, 5.0], [0, 0, 1, 1, 2]
    b = TurnBatch.from_scalars(r, g)
    adv = torch.zeros(5, 1)
    assert drop_zero_variance_groups(adv, b).tolist() == [True, True, False, False, False]
    b2 = TurnBatch.from_scalars([0.0] * 6, [0, 0, 0, 1, 1, 1])
    adv = torch.tensor([0.1, -0.9, 0.5, -0.5, 0.0, 0.7])[:, None]
    assert top_abs_advantage(adv, b2, k=1).tolist() == [False, True, False, False, False, True]
    # ties keep the lower index; a row's |A| is the mean over its action tokens
    adv2 = torch.tensor([[1.0, 3.0], [2.0, 0.0], [-2.0, 9.0]])
    b3 = TurnBatch.from_scalars([0.0] * 3, [0, 0, 0], lengths=[2, 1, 1])
    assert top_abs_advantage(adv2, b3, k=2).tolist() == [True, True, False]
    with pytest.raises(ValueError, match="k must"):
        top_abs_advantage(adv2, b3, k=0)

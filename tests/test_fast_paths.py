"""The loop-free GAE scan and the row-blocked shapers against the previous implementations.

The references below are the code these replaced (a Python loop over the token axis for
GAE; full-tensor passes for the shapers; a row-wise unique for `compact_ids`), kept here
verbatim in substance. Batches: collated multi-turn, multi-agent episodes with prompts and
padding (turn layout), and batches with random non-contiguous action masks (the compaction
path, as in trajectory layout), with truncated episodes and several option settings.
"""

import pytest
import torch

from sparring.advantages import ESTIMATORS, compute, rowblock
from sparring.advantages.scan import from_grid, reverse_scan, to_grid
from sparring.advantages.token_scan import last_index, spans, suffix_scan
from sparring.advantages.turn import keep_rows, turn_rewards
from sparring.data import Episode, Turn, collate
from sparring.segments import compact_ids, segment_mean, segment_median

# ---------------------------------------------------------------- old implementations


def old_last_action_onehot(mask):
    after = mask.flip(1).cumsum(1).flip(1)
    return mask & (after == 1)


def old_row_gae(r, V, mask, gamma, lam):
    n, T = mask.shape
    rv = (r - V).t().contiguous()
    VT, mT = V.t().contiguous(), mask.t().contiguous()
    out = torch.empty_like(rv)
    carry_a = torch.zeros(n, dtype=r.dtype)
    carry_v = torch.zeros_like(carry_a)
    for t in range(T - 1, -1, -1):
        a = torch.add(rv[t], carry_v, alpha=gamma).add_(carry_a, alpha=gamma * lam)
        out[t] = a
        carry_a = torch.where(mT[t], a, carry_a)
        carry_v = torch.where(mT[t], VT[t], carry_v)
    return torch.where(mask, out.t(), 0.0), carry_a, carry_v


def old_gae(b, gamma=1.0, lam=0.95, whiten=False, token_rewards=None, add_return=False,
            truncated="mask"):
    V, mask = b.values.float(), b.action_mask
    r = old_last_action_onehot(mask) * turn_rewards(b, add_return)[:, None]
    if token_rewards is not None:
        r = r + token_rewards.float() * mask
    A, first_a, first_v = old_row_gae(r, V, mask, gamma, lam)
    if b.layout == "turn" and int(b.turn.max()) > 0:
        gl = gamma * lam
        fa, fv = to_grid(first_a, b), to_grid(first_v, b)
        ln = to_grid(b.length.float(), b)
        a, bb = torch.zeros_like(fa), torch.zeros_like(fa)
        a[:, :-1] = gamma * fv[:, 1:] + gl * fa[:, 1:]
        bb[:, :-1] = torch.pow(torch.tensor(gl), ln[:, 1:])
        c = from_grid(reverse_scan(a, bb), b)
        d = (b.length[:, None] - mask.cumsum(1)).float()
        A = A + torch.where(mask, torch.pow(torch.tensor(gl), d) * c[:, None], 0.0)
    m = mask & keep_rows(b, truncated)[:, None]
    if whiten and bool(m.any()):
        sd = A[m].std() if int(m.sum()) > 1 else torch.zeros(())
        A = (A - A[m].mean()) / (sd + 1e-8)
    return torch.where(m, A, 0.0)


def old_turn_gae(b, gamma=1.0, lam=0.95, high_gamma=0.95, high_lam=None, whiten=False,
                 truncated="mask"):
    V, mask = b.values.float(), b.action_mask
    hl = lam if high_lam is None else high_lam
    last = old_last_action_onehot(mask)
    v_end = (V * last).sum(1)
    ve = to_grid(v_end, b)
    nxt = torch.zeros_like(ve)
    nxt[:, :-1] = ve[:, 1:]
    delta = to_grid(turn_rewards(b), b) + high_gamma * nxt - ve
    target = from_grid(reverse_scan(delta, high_gamma * hl), b) + v_end
    A, _, _ = old_row_gae(last * target[:, None], V, mask, gamma, lam)
    m = mask & keep_rows(b, truncated)[:, None]
    if whiten and int(m.sum()) > 1:
        A = (A - A[m].mean()) / (A[m].std() + 1e-8)
    return torch.where(m, A, 0.0)


def old_row_mean(x, mask):
    return (x * mask).sum(1) / mask.sum(1).clamp(min=1)


def old_ucas(adv, b, alpha=0.5, beta=0.1):
    m = b.action_mask
    c = old_row_mean(b.old_logp.float(), m).exp()[:, None]
    p = b.old_logp.float().exp()
    pos = adv * (1 + alpha * (1 - c))
    neg = adv * (1 + alpha * c) - beta * p
    return torch.where(adv > 0, pos, torch.where(adv < 0, neg, adv)) * m


def old_canon(adv, b, metric="entropy", weight=2.0):
    m = b.action_mask
    x = old_row_mean(b.entropy.float(), m) if metric == "entropy" else b.length.float()
    a = old_row_mean(adv.float(), m)
    ids, n = old_compact_ids(b.group)
    high = x > segment_median(x, ids, n)[ids]
    hid, hn = old_compact_ids(ids, high.long())
    mh, mg = segment_mean(a, hid, hn)[hid], segment_mean(a, ids, n)[ids]
    new = (a - mh) + weight * (mh - mg)
    return adv + (new - a)[:, None] * m


def old_entropy_shaping(adv, b, lo=0.5, hi=2.0, eps=1e-6):
    H = old_row_mean(b.entropy.float(), b.action_mask)
    has = b.action_mask.any(1)
    ref = H[has].mean() if bool(has.any()) else torch.ones(())
    return adv * ((H / (ref + eps)).clamp(lo, hi))[:, None]


def old_compact_ids(*keys):
    uniq, inv = torch.unique(torch.stack([k.long() for k in keys], 1), dim=0,
                             return_inverse=True)
    return inv, uniq.shape[0]


# ---------------------------------------------------------------- random batches


def random_turn_batch(seed, n_eps=6, agents=3, max_turns=5, G=2):
    """Collated episodes: prompts of 0-4 tokens, actions of 1-7 tokens, padding, some
    truncated episodes; random values, log-probs and entropies."""
    g = torch.Generator().manual_seed(seed)

    def ri(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    eps = []
    for e in range(n_eps):
        turns = []
        for _ in range(ri(1, max_turns)):
            la = ri(1, 7)
            turns.append(Turn(agent=ri(0, agents - 1), prompt_ids=[1] * ri(0, 4),
                              action_ids=[2] * la,
                              logprobs=(-torch.rand(la, generator=g) * 2).tolist(),
                              entropies=(torch.rand(la, generator=g) * 3).tolist(),
                              reward=float(torch.randn(1, generator=g))))
        eps.append(Episode(env="r", seed=e, group=e % G, num_agents=agents, turns=turns,
                           returns=torch.randn(agents, generator=g).tolist(),
                           truncated=ri(0, 3) == 0))
    b = collate(eps)
    V = torch.randn(b.input_ids.shape, generator=g)
    return b.with_fields(values=V)


def scattered(b, seed, layout):
    """The same rows with random (non-contiguous) action masks; log-probs, entropies,
    values and garbage (NaN values) outside the new mask."""
    g = torch.Generator().manual_seed(seed)
    n, T = b.action_mask.shape
    T2 = T + 9
    mask = torch.rand(n, T2, generator=g) < 0.55
    mask[:, -2:] = False  # padding
    mask[0] = False  # a row without actions
    V = torch.where(mask, torch.randn(n, T2, generator=g), torch.nan)
    lp = torch.where(mask, -torch.rand(n, T2, generator=g) * 2, 0.0)
    ent = torch.where(mask, torch.rand(n, T2, generator=g) * 3, 0.0)
    return b.with_fields(layout=layout, action_mask=mask, attention_mask=mask.clone(),
                         input_ids=torch.zeros(n, T2, dtype=torch.long), old_logp=lp,
                         entropy=ent, values=V, length=mask.sum(1))


def batches():
    out = []
    for seed in range(4):
        b = random_turn_batch(seed)
        out += [("turn", b), ("scattered-turn", scattered(b, seed, "turn"))]
    one = random_turn_batch(7, max_turns=1)
    out.append(("scattered-trajectory", scattered(one, 7, "trajectory")))
    return out


BATCHES = batches()
IDS = [f"{k}-{i}" for i, (k, _) in enumerate(BATCHES)]
GAE_OPTS = [dict(gamma=1.0, lam=0.95), dict(gamma=0.9, lam=0.7, truncated="terminal"),
            dict(gamma=0.99, lam=0.0), dict(gamma=0.0, lam=0.5), dict(gamma=1.0, lam=1.0),
            dict(gamma=0.95, lam=0.9, whiten=True), dict(gamma=0.8, lam=0.6, add_return=True)]


def close(got, want):
    assert got.shape == want.shape
    assert torch.allclose(got.double(), want.double(), atol=1e-5, rtol=0), float(
        (got.double() - want.double()).abs().max())


# ---------------------------------------------------------------- tests


@pytest.fixture(params=["one-block", "many-blocks"])
def blocks(request, monkeypatch):
    """Run each test with all rows in one memory block, and with blocks of a few rows."""
    if request.param == "many-blocks":
        monkeypatch.setattr(rowblock, "BLOCK_ELEMS", 70)


@pytest.mark.parametrize("b", [b for _, b in BATCHES], ids=IDS)
@pytest.mark.parametrize("opts", GAE_OPTS)
def test_gae_matches_loop(b, opts, blocks):
    close(compute("gae", b, **opts)[0], old_gae(b, **opts))


@pytest.mark.parametrize("b", [b for _, b in BATCHES], ids=IDS)
def test_gae_token_rewards_match_loop(b, blocks):
    g = torch.Generator().manual_seed(3)
    tr = torch.randn(b.action_mask.shape, generator=g)
    got = ESTIMATORS["gae"](b, gamma=0.97, lam=0.9, token_rewards=tr)
    close(got, old_gae(b, gamma=0.97, lam=0.9, token_rewards=torch.where(
        b.action_mask, tr, 0.0)))


@pytest.mark.parametrize("b", [b for k, b in BATCHES if k.endswith("turn")])
@pytest.mark.parametrize("opts", [dict(), dict(gamma=0.9, lam=0.8, high_gamma=0.95,
                                               high_lam=0.6, truncated="terminal"),
                                  dict(gamma=0.7, lam=0.0, whiten=True)])
def test_turn_gae_matches_loop(b, opts, blocks):
    b = b.with_fields(values=torch.nan_to_num(b.values, nan=100.0))  # old: NaN-unsafe v_end
    close(compute("turn_gae", b, **opts)[0], old_turn_gae(b, **opts))


@pytest.mark.parametrize("b", [b for _, b in BATCHES], ids=IDS)
def test_shapers_match_full_tensor_versions(b, blocks):
    adv = ESTIMATORS["grpo"](b)
    close(compute("ucas", b)[0], old_ucas(adv, b))
    close(compute("ucas", b, alpha=0.9, beta=0.3)[0], old_ucas(adv, b, 0.9, 0.3))
    close(compute("canon", b)[0], old_canon(adv, b))
    close(compute("canon", b, metric="length", weight=0.5)[0],
          old_canon(adv, b, "length", 0.5))
    close(compute("entropy_shaping", b)[0], old_entropy_shaping(adv, b))
    close(compute("entropy_shaping", b, lo=0.8, hi=1.1)[0],
          old_entropy_shaping(adv, b, 0.8, 1.1))


def test_suffix_scan_matches_loop(blocks):
    g = torch.Generator().manual_seed(0)
    for T, gl in [(1, 0.9), (5, 0.5), (16, 0.95), (37, 0.0), (300, 1.0), (2100, 0.99),
                  (70, 0.05)]:
        X = torch.randn(3, T, generator=g, dtype=torch.float64)
        want = torch.zeros_like(X)
        acc = torch.zeros(3, dtype=torch.float64)
        for t in range(T - 1, -1, -1):
            acc = X[:, t] + gl * acc
            want[:, t] = acc
        got = suffix_scan(X.float(), gl)
        tol = 1e-5 * max(1.0, float(want.abs().max()))
        assert torch.allclose(got.double(), want, atol=tol, rtol=0), (T, gl)


def test_spans_and_last_index_match_brute_force(blocks):
    g = torch.Generator().manual_seed(1)
    for contiguous in (True, False):
        n, T = 40, 23
        if contiguous:
            first = torch.randint(0, T, (n,), generator=g)
            ln = torch.randint(0, T + 1, (n,), generator=g).clamp(max=T - first)
            ar = torch.arange(T)
            mask = (ar >= first[:, None]) & (ar < (first + ln)[:, None])
        else:
            mask = torch.rand(n, T, generator=g) < 0.4
            mask[0, [2, 5]] = True
        f, last, cnt, cont = spans(mask)
        rows = [[t for t in range(T) if mask[i, t]] for i in range(n)]
        assert cont == all(not r or r == list(range(r[0], r[-1] + 1)) for r in rows)
        assert cnt.tolist() == [len(r) for r in rows]
        assert last_index(mask).tolist() == [r[-1] if r else 0 for r in rows]
        if cont:
            assert f.tolist() == [r[0] if r else 0 for r in rows]
            assert last.tolist() == [r[-1] if r else 0 for r in rows]


def test_compact_ids_orders_tuples_lexicographically():
    g = torch.Generator().manual_seed(2)
    for k in (1, 2, 3):
        keys = [torch.randint(-3, 6, (50,), generator=g) for _ in range(k)]
        tuples = [tuple(int(x[i]) for x in keys) for i in range(50)]
        rank = {t: j for j, t in enumerate(sorted(set(tuples)))}
        ids, n = compact_ids(*keys)
        assert n == len(rank) and ids.tolist() == [rank[t] for t in tuples]
    big = [torch.tensor([0, 2 ** 40, 0]), torch.tensor([5, 1, 2 ** 40]),
           torch.tensor([0, 0, 2 ** 30])]  # ranges too large to fold: row-wise path
    ids, n = compact_ids(*big)
    assert n == 3 and ids.tolist() == [0, 2, 1]

"""Shared-prefix forwards give the same log-probs, entropies, hidden states (a value head's
input) and gradients as full rows, for the FLOPs of each prompt once."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from sparring.policy.forward import token_logprobs, token_logprobs_and_hidden
from sparring.policy.prefix import find_prefixes, first_action_positions, select_rows
from sparring.policy.tiny import build_tiny_model

SMALL = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
         "intermediate_size": 64}


def test_find_prefixes_groups_equal_prompts():
    ids = torch.tensor([[5, 6, 7, 1], [5, 6, 8, 0], [5, 6, 7, 2], [5, 9, 9, 9]])
    pre = find_prefixes(ids, torch.tensor([3, 3, 3, 2]))
    assert pre.first.tolist() == [0, 1, 3] and pre.inverse.tolist() == [0, 1, 0, 2]
    # same tokens, different prefix length: a different prefix
    pre = find_prefixes(ids[:2], torch.tensor([2, 3]))
    assert pre.inverse.tolist() == [0, 1]


def test_first_action_positions():
    m = torch.tensor([[False, False, True, True], [False, False, False, False],
                      [True, True, False, False]])
    got = first_action_positions(m, torch.tensor([4, 3, 2]))
    assert got.tolist() == [2, 3, 1]  # no action tokens: whole length; never below 1


def _batch(seed: int, longest: int = 6, shared: int = 0, cluster: int = 0):
    """12 right-padded rows: 3 distinct prompts (lengths 3, 5, 2 after ``shared`` common
    tokens; prompts 0 and 1 also share ``cluster`` tokens after those, which prompt 2 does
    not start with: a seat's own system prompt) x 4, continuations of 1 to ``longest``
    tokens, one row with no action token."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(3, 60, (shared,), generator=g)
    seat = torch.cat([torch.tensor([61]), torch.randint(3, 60, (cluster - 1,), generator=g)]) \
        if cluster else torch.zeros(0, dtype=torch.long)
    other = torch.tensor([62]) if cluster else torch.zeros(0, dtype=torch.long)
    prompts = [torch.cat([start, s, torch.randint(3, 60, (k,), generator=g)])
               for s, k in ((seat, 3), (seat, 5), (other, 2))]
    rows, plens = [], []
    for i in range(12):
        p = prompts[i % 3]
        c = torch.randint(3, 60, (1 + i % longest,), generator=g)
        rows.append(torch.cat([p, c]))
        plens.append(len(p))
    T = max(len(r) for r in rows)
    ids = torch.zeros(12, T, dtype=torch.long)
    att = torch.zeros(12, T, dtype=torch.bool)
    amask = torch.zeros(12, T, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        att[i, :len(r)] = True
        amask[i, plens[i]:len(r)] = True
    amask[7] = False
    return ids, att, amask


@pytest.mark.parametrize("temperature,longest,shared,cluster,passes", [
    (1.0, 6, 0, 0, 1), (0.7, 6, 0, 0, 1), (1.0, 1, 0, 0, 1),
    (1.0, 6, 12, 0, 2),  # 12: a common start, run once
    (1.0, 6, 12, 10, 3)])  # and 10 more shared by two of the prompts: a pass of their own
def test_shared_prefix_equals_full_forward(temperature, longest, shared, cluster, passes):
    torch.manual_seed(0)
    model, _ = build_tiny_model(SMALL)
    model.float()
    ids, att, amask = _batch(1, longest, shared, cluster)
    plen = first_action_positions(amask, att.sum(1))
    pre = find_prefixes(ids, plen)
    assert pre.count == 4  # 3 prompts, and row 7's whole row is its own prefix
    seen = []  # the prompt passes' shapes, then the continuation's (if any)
    hook = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape),
                                           with_kwargs=True)
    with torch.no_grad():
        token_logprobs(model, ids, att, prefixes=pre)
    hook.remove()
    assert len(seen) == passes + (longest > 1)  # one-token continuations: nothing to feed
    if passes == 3:  # the cluster's 10 tokens ran once, for the two prompts that share them
        assert seen[0] == (1, shared) and seen[1] == (2, cluster)
    # constrained decoding at two action positions of two rows
    allowed = [None] * 12
    p0 = int(plen[0])
    allowed[0] = {p0: [int(ids[0, p0]), 9, 11]}
    if longest > 1:
        allowed[4] = {int(plen[4]) + 1: [20, 21]}
    w = torch.randn(ids.shape)
    results = []
    for prefixes in (None, pre):
        model.zero_grad()
        lp, ent = token_logprobs(model, ids, att, temperature, with_entropy=True,
                                 allowed=allowed, prefixes=prefixes)
        ((lp * w + 0.1 * ent) * amask).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((lp * amask, ent * amask, grads))
    (lp0, e0, g0), (lp1, e1, g1) = results
    assert torch.allclose(lp0, lp1, atol=1e-5), (lp0 - lp1).abs().max()
    assert torch.allclose(e0, e1, atol=1e-5)
    for a, b in zip(g0, g1):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()
    # the restricted position: the sampled id's log-prob among the 3 allowed ones, by hand
    with torch.no_grad():
        z = model(input_ids=ids[:1], attention_mask=att[:1].long()).logits[0, p0 - 1]
        want = torch.log_softmax(z[allowed[0][p0]] / temperature, 0)[0]
    assert float(lp1[0, p0]) == pytest.approx(float(want), abs=1e-5)


def _linear_flops(fn) -> int:
    """FLOPs of the matrix products of the linear layers (``mm``, ``addmm``) ``fn()`` runs."""
    with FlopCounterMode(display=False) as counter:
        fn()
    counts = counter.get_flop_counts()["Global"]
    return sum(counts.get(op, 0) for op in (torch.ops.aten.mm, torch.ops.aten.addmm))


@pytest.mark.parametrize("rows,prompt,continuation", [(8, 5, 3), (4, 7, 2)])
def test_shared_prefix_runs_a_prompt_once_and_no_row_its_last_token(rows, prompt, continuation):
    torch.manual_seed(0)
    model, _ = build_tiny_model(SMALL)
    g = torch.Generator().manual_seed(0)
    start = torch.randint(3, 60, (prompt,), generator=g)
    ids = torch.stack([torch.cat([start, torch.randint(3, 60, (continuation,), generator=g)])
                       for _ in range(rows)])
    att = torch.ones_like(ids, dtype=torch.bool)
    amask = att.clone()
    amask[:, :prompt] = False
    pre = find_prefixes(ids, first_action_positions(amask, att.sum(1)))
    # a token through the blocks: 2 FLOPs a weight of q, k, v, o (4 heads of 8, 2 key/value
    # heads) and the MLP's three matrices; a position's logits: 2 FLOPs a weight of the head
    h, i, layers, vocab = 32, 64, 2, model.config.vocab_size
    per_token = layers * 2 * (h * 32 + 2 * h * 16 + 32 * h + 3 * h * i)
    per_logits = 2 * h * vocab
    with torch.no_grad():
        shared = _linear_flops(lambda: token_logprobs(model, ids, att, prefixes=pre))
        full = _linear_flops(lambda: token_logprobs(model, ids, att))
    # the prompt once; each row's continuation but its last token; logits where a
    # continuation token is predicted (the prompt's last position once, then each row's own)
    fed = prompt + rows * (continuation - 1)
    assert shared == fed * per_token + (1 + rows * (continuation - 1)) * per_logits
    assert full == rows * (prompt + continuation) * (per_token + per_logits)


@pytest.mark.parametrize("longest,shared,cluster", [(6, 0, 0), (1, 0, 0), (6, 12, 10)])
def test_shared_prefix_hidden_states_equal_full_forward(longest, shared, cluster):
    """A value head on the policy reads the shared-prefix forward's hidden states: at every
    action token they equal the full forward's (the state of the context before the token,
    checked by hand against HF's last hidden state), and so do the gradients through them."""
    torch.manual_seed(1)
    model, _ = build_tiny_model(SMALL)
    model.float()
    ids, att, amask = _batch(2, longest, shared, cluster)
    pre = find_prefixes(ids, first_action_positions(amask, att.sum(1)))
    probe = torch.randn(SMALL["hidden_size"])
    results = []
    for prefixes in (None, pre):
        model.zero_grad()
        lp, _, h = token_logprobs_and_hidden(model, ids, att, allowed=None, prefixes=prefixes)
        assert h.shape == (*ids.shape, SMALL["hidden_size"])
        ((h @ probe + lp) * amask).sum().backward()
        results.append((h * amask[..., None], [p.grad.clone() for p in model.parameters()]))
    (h0, g0), (h1, g1) = results
    torch.testing.assert_close(h0, h1, atol=1e-5, rtol=1e-4)
    # a gradient sums many terms in another order in the two passes: float32 rounding
    # leaves up to about 2e-4 of relative difference on some CPUs (AVX2 without AVX-512)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    with torch.no_grad():  # hidden[:, t] is HF's last hidden state at t - 1
        last = model(input_ids=ids, attention_mask=att.long(),
                     output_hidden_states=True).hidden_states[-1]
    want = torch.zeros_like(last)
    want[:, 1:] = last[:, :-1]
    torch.testing.assert_close(h1, want * amask[..., None], atol=1e-5, rtol=1e-4)


def test_select_rows_adds_repeated_rows_in_a_fixed_order_on_two_threads():
    """The backward of a gather that repeats prefix rows sums each prefix's row gradients.
    x[sel] sums them in an order set by thread timing on a multi-threaded CPU (9 of 9 repeats
    differed here); select_rows (index_select) gives the same bits every time. Two threads
    for this test only (the suite runs on one, tests/conftest.py)."""
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(4, 64, 256, generator=g, requires_grad=True)
    sel = torch.randint(0, 4, (256,), generator=g)
    upstream = torch.randn(256, 64, 256, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = []
        for _ in range(10):
            keys.grad = None
            (selected,), = select_rows(((keys,),), sel)
            selected.backward(upstream)
            grads.append(keys.grad.clone())
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(grads[0], torch.zeros_like(keys).index_add_(0, sel, upstream))
    assert all(torch.equal(grads[0], q) for q in grads[1:])

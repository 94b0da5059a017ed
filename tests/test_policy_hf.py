"""HFPolicy: exact log-probs, left padding, constraints, stop strings, sampling filters."""

import copy
import math

import pytest
import torch

from sparring.data import Episode, Turn, collate
from sparring.policy.forward import token_logprobs
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import ActionPrefixes, SamplingParams, TokenTrie, filter_logits
from sparring.policy.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model({"seed": 1})


@pytest.fixture
def tiny_on(tiny, device):
    """A copy of the tiny model on the device under test (HFPolicy moves its model there),
    and its tokenizer."""
    model, tok = tiny
    return copy.deepcopy(model).to(device), tok


def _prompts(tok, shared: str = ""):
    """Three prompts; ``shared`` (a system-prompt-like common prefix) starts each of them."""
    return [tok.encode(shared + s, add_special_tokens=False)
            for s in ("hi", "a longer prompt here", "x.o\n")]


SYSTEM = "You play tic-tac-toe. Answer with a digit.\n"  # > SHARED_PREFIX_MIN tokens


def _greedy_with_shapes(pol, prompts, n):
    """``pol``'s greedy generations of up to ``n`` tokens, and the input shape of every
    forward it ran (to see which prompt parts ran once)."""
    shapes = []
    hook = pol.model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        return pol.generate(prompts, SamplingParams(greedy=True, max_new_tokens=n)), shapes
    finally:
        hook.remove()


def _greedy_reference(model, tok, prompt, n):
    """Up to ``n`` argmax tokens after ``prompt``, re-running the whole sequence each time
    (no cache, no batching): what batched greedy generation must reproduce."""
    seq, out = list(prompt), []
    device = next(model.parameters()).device
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([seq], device=device)).logits[0, -1].argmax())
            out.append(nxt)
            seq.append(nxt)
            if nxt == tok.eos_token_id:
                break
    return out


def _right_padded(seqs):
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = True
    return ids, mask


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("copies", [1, 3])  # 3: equal prompts share one prefill
@pytest.mark.parametrize("shared", ["", SYSTEM])  # SYSTEM: the common prefix runs once
def test_generation_logprobs_match_forward_recompute(tiny_on, temperature, copies, shared):
    model, tok = tiny_on
    pol = HFPolicy(model, tok, seed=0, device=model.device)
    prompts = [p for p in _prompts(tok, shared) for _ in range(copies)]
    gens = pol.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=10,
                                                with_entropy=True))
    ids, mask = _right_padded([p + g.token_ids for p, g in zip(prompts, gens)])
    lp, ent = token_logprobs(model, ids.to(model.device), mask.to(model.device),
                             temperature=temperature, with_entropy=True)
    lp, ent = lp.cpu(), ent.cpu()
    for i, (p, g) in enumerate(zip(prompts, gens)):
        n = len(g.token_ids)
        assert n >= 1 and len(g.logprobs) == n == len(g.entropies)
        torch.testing.assert_close(lp[i, len(p):len(p) + n], torch.tensor(g.logprobs), atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[i, len(p):len(p) + n], torch.tensor(g.entropies), atol=1e-5, rtol=0)
        assert g.text == tok.decode(g.token_ids, skip_special_tokens=True)
        if g.finish_reason == "eos":
            assert g.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in g.token_ids[:-1]
        else:
            assert g.finish_reason == "length" and n == 10


@pytest.mark.parametrize("shared", ["", SYSTEM])
def test_greedy_batched_equals_uncached_reference(tiny_on, shared):
    """Left-padded batched greedy == a plain argmax loop re-running the full sequence."""
    model, tok = tiny_on
    pol = HFPolicy(model, tok, device=model.device)
    prompts = _prompts(tok, shared) + _prompts(tok, shared)[::-1]  # each twice: one prefill
    gens, shapes = _greedy_with_shapes(pol, prompts, 6)
    # the common prefix alone (1 row), then the 3 distinct remainders, then decode steps
    n_sys = len(tok.encode(SYSTEM, add_special_tokens=False))
    assert shapes[0] == ((1, n_sys) if shared else (3, max(len(p) for p in prompts)))
    for p, g in zip(prompts, gens):
        assert g.token_ids == _greedy_reference(model, tok, p, 6)


def test_the_cache_goes_under_the_installed_transformers_name(tiny):
    """Generation passes its KV cache as the model's forward names it (``cache`` in
    transformers 5.2x, ``past_key_values`` before), so no deprecation is logged per run."""
    import inspect

    model, tok = tiny
    names = inspect.signature(type(model).forward).parameters
    want = "cache" if "cache" in names else "past_key_values"
    seen = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append({k for k in ("cache", "past_key_values") if k in kw}),
        with_kwargs=True)
    try:
        HFPolicy(model, tok).generate(_prompts(tok, SYSTEM), SamplingParams(max_new_tokens=4))
    finally:
        hook.remove()
    assert seen and all(s <= {want} for s in seen) and any(s == {want} for s in seen)


def test_seeded_reproducibility(tiny):
    model, tok = tiny
    sp = SamplingParams(max_new_tokens=8)
    a = HFPolicy(model, tok, seed=5).generate(_prompts(tok), sp)
    b = HFPolicy(model, tok, seed=5).generate(_prompts(tok), sp)
    c = HFPolicy(model, tok, seed=6).generate(_prompts(tok), sp)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_constrained_decoding_spells_legal_actions_and_logprobs_reproduce(tiny_on):
    model, tok = tiny_on
    pol = HFPolicy(model, tok, seed=3, device=model.device)
    legal = [["a1", "a12", "b2"], ["c3"], ["hello", "help", "x"]]
    prompts = _prompts(tok) * 4
    allowed = legal * 4
    gens = pol.generate(prompts, SamplingParams(temperature=0.8, max_new_tokens=10), allowed=allowed)
    eos = tok.eos_token_id
    turns = []
    for p, g, acts in zip(prompts, gens, allowed):
        assert g.text in acts and g.token_ids[-1] == eos and g.finish_reason == "eos"
        # brute force: at each step the allowed ids are the next tokens of the legal strings
        # (plus EOS where a legal string is complete) consistent with the prefix so far
        seqs = [tok.encode(a, add_special_tokens=False) + [eos] for a in acts]
        for j in range(len(g.token_ids)):
            pre = g.token_ids[:j]
            exp = {s[j] for s in seqs if s[:j] == pre and len(s) > j}
            assert set(g.allowed_ids[j]) == exp
        # brute force restricted log-prob from a full forward
        with torch.no_grad():
            logits = model(torch.tensor([p + g.token_ids], device=model.device)
                           ).logits[0].float().cpu() / 0.8
        for j, t in enumerate(g.token_ids):
            z = logits[len(p) + j - 1, g.allowed_ids[j]]
            ref = z[g.allowed_ids[j].index(t)] - torch.logsumexp(z, 0)
            assert abs(ref.item() - g.logprobs[j]) < 1e-5
        turns.append(Turn(agent=0, prompt_ids=list(p), action_ids=g.token_ids, logprobs=g.logprobs,
                          allowed_ids=g.allowed_ids))
    ep = Episode(env="toy", seed=0, group=0, num_agents=1, turns=turns, returns=[0.0])
    batch = collate([ep]).to(model.device)
    lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.8,
                           allowed=batch.allowed)
    torch.testing.assert_close(lp[batch.action_mask], batch.old_logp[batch.action_mask], atol=1e-5, rtol=0)
    sub = batch.select([2, 0])
    assert sub.allowed == [batch.allowed[2], batch.allowed[0]]
    # without the restriction the recomputed log-probs differ (the test can fail)
    lp_free, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.8)
    assert (lp_free[batch.action_mask] - batch.old_logp[batch.action_mask]).abs().max() > 1e-2


def test_stop_string_ends_generation(tiny_on):
    """Same seed, same samples: with a stop string the generation is the prefix that ends
    at the first token completing it."""
    model, tok = tiny_on
    p = _prompts(tok)[:1]
    sp = SamplingParams(max_new_tokens=12)
    full = HFPolicy(model, tok, seed=7, device=model.device).generate(p, sp)[0]
    chars = [tok.decode([t]) for t in full.token_ids]
    k = next(i for i in range(1, len(chars)) if chars[i].strip() and chars[i] not in chars[:i])
    stop = SamplingParams(max_new_tokens=12, stop=(chars[k],))
    got = HFPolicy(model, tok, seed=7, device=model.device).generate(p, stop)[0]
    assert got.finish_reason == "stop" and got.token_ids == full.token_ids[:k + 1]


def test_filter_logits_top_k_top_p_by_hand():
    z = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    inf = float("-inf")
    assert filter_logits(z, top_k=2).isinf().tolist() == [[False, False, True, True, True]]
    # nucleus 0.8: 0.5 + 0.2 = 0.7 < 0.8, so 0.15 is needed too
    assert filter_logits(z, top_p=0.8).isinf().tolist() == [[False, False, False, True, True]]
    assert filter_logits(z, top_p=0.7).isinf().tolist() == [[False, False, True, True, True]]
    assert filter_logits(z, top_p=0.1)[0, 0] > inf and filter_logits(z, top_p=0.1).isinf().sum() == 4


def test_top_k_sampling_frequencies(tiny):
    """2000 one-token samples: recorded log-probs are the renormalised top-3 distribution,
    and empirical frequencies match it (4-sigma)."""
    model, tok = tiny
    pol = HFPolicy(model, tok, seed=0)
    p = tok.encode("ab", add_special_tokens=False)
    n = 2000
    gens = pol.generate([p] * n, SamplingParams(top_k=3, temperature=2.0, max_new_tokens=1))
    with torch.no_grad():
        z = model(torch.tensor([p])).logits[0, -1].float() / 2.0
    top = torch.topk(z, 3)
    probs = torch.softmax(top.values, 0)
    counts = {int(t): 0 for t in top.indices}
    for g in gens:
        t = g.token_ids[0]
        assert t in counts
        assert abs(g.logprobs[0] - math.log(probs[top.indices.tolist().index(t)])) < 1e-5
        counts[t] += 1
    for t, q in zip(top.indices.tolist(), probs.tolist()):
        assert abs(counts[t] / n - q) < 4 * math.sqrt(q * (1 - q) / n)


def test_bad_inputs_are_named(tiny):
    model, tok = tiny
    pol = HFPolicy(model, tok)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0)
    with pytest.raises(ValueError, match="at least one token"):
        pol.generate([[]])
    with pytest.raises(ValueError, match="allowed lists"):
        pol.generate([[1, 2]], allowed=[["a"], ["b"]])
    with pytest.raises(ValueError, match="at least one legal action"):
        pol.generate([[1, 2]], allowed=[[]])
    # a prompt past the model's positions is refused, naming the setting to change
    limit = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"a prompt of {limit - 2} tokens plus max_new_tokens=3 "
                       f"passes the model's {limit} positions: set rollout.max_prompt_tokens"):
        pol.generate([[1, 2], [1] * (limit - 2)], SamplingParams(max_new_tokens=3))
    assert len(pol.generate([[1] * (limit - 3)], SamplingParams(max_new_tokens=3))) == 1


def test_from_pretrained_folder(tmp_path, tiny):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    pol = HFPolicy.from_pretrained(tmp_path, dtype="float32")
    a = pol.generate(_prompts(tok), SamplingParams(greedy=True, max_new_tokens=5))
    b = HFPolicy(model, tok).generate(_prompts(tok), SamplingParams(greedy=True, max_new_tokens=5))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_forced_tails_skip_the_model(tiny):
    """A move that can only end one way ('4' -> EOS; 'ab' after 'a') is finished without
    more forwards: with single-character moves generate runs the prompts once (counted at
    the input embedding, which every forward of the model starts with)."""
    model, tok = tiny
    pol = HFPolicy(model, tok, seed=0)
    calls = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        gens = pol.generate(_prompts(tok), SamplingParams(max_new_tokens=4),
                            allowed=[["1", "4", "7"]] * 3)
        assert len(calls) == 1
        for g in gens:
            assert g.text in ("1", "4", "7") and g.finish_reason == "eos"
            assert g.logprobs[1] == 0.0 and g.allowed_ids[1] == [tok.eos_token_id]
        calls.clear()
        g = pol.generate(_prompts(tok)[:1], SamplingParams(max_new_tokens=4),
                         allowed=[["ab", "cd"]])[0]
        assert len(calls) == 1 and g.text in ("ab", "cd") and g.logprobs[1:] == [0.0, 0.0]
        # a tail longer than max_new_tokens is not forced: the row stops at the limit
        g = pol.generate(_prompts(tok)[:1], SamplingParams(max_new_tokens=2),
                         allowed=[["abc"]])[0]
        assert g.finish_reason == "length" and len(g.token_ids) == 2
    finally:
        hook.remove()


def test_action_prefixes_are_spelt_then_free_and_logprobs_reproduce(tiny_on):
    """With `ActionPrefixes` each completion starts with one of the prefixes (the tokens
    constrained to the trie's children, as a brute force over the prefixes' tokens says),
    then runs freely (allowed None, any token); the learner's recomputed log-probs, with
    the restriction at the prefix positions only, equal the sampler's."""
    model, tok = tiny_on
    pol = HFPolicy(model, tok, seed=5, device=model.device)
    choices = [ActionPrefixes(["calc:", "answer:"]), ActionPrefixes(["answer:"]), None]
    prompts = _prompts(tok) * 3
    allowed = choices * 3
    sp = SamplingParams(temperature=0.7, max_new_tokens=12)
    gens = pol.generate(prompts, sp, allowed=allowed)
    turns = []
    for p, g, acts in zip(prompts, gens, allowed):
        if acts is None:
            assert g.allowed_ids is None
            continue
        seqs = [tok.encode(a, add_special_tokens=False) for a in acts]
        spelt = [s for s in seqs if g.token_ids[:len(s)] == s]
        assert len(spelt) == 1, (g.token_ids, seqs)
        n = len(spelt[0])
        for j in range(n):
            exp = {s[j] for s in seqs if s[:j] == g.token_ids[:j] and len(s) > j}
            assert set(g.allowed_ids[j]) == exp
        assert g.allowed_ids[n:] == [None] * (len(g.token_ids) - n)
        with torch.no_grad():
            logits = model(torch.tensor([p + g.token_ids], device=model.device)
                           ).logits[0].float().cpu() / 0.7
        for j, t in enumerate(g.token_ids):
            z = logits[len(p) + j - 1]
            if g.allowed_ids[j] is not None:
                z = z[g.allowed_ids[j]]
                t = g.allowed_ids[j].index(t)
            assert abs((z[t] - torch.logsumexp(z, 0)).item() - g.logprobs[j]) < 1e-5
        turns.append(Turn(agent=0, prompt_ids=list(p), action_ids=g.token_ids,
                          logprobs=g.logprobs, allowed_ids=g.allowed_ids))
    # free text followed the prefixes (EOS is not forced after one)
    assert sum(len(t.action_ids) - t.allowed_ids.count(None) < len(t.action_ids)
               for t in turns) >= 3
    ep = Episode(env="toy", seed=0, group=0, num_agents=1, turns=turns, returns=[0.0])
    batch = collate([ep]).to(model.device)
    lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.7,
                           allowed=batch.allowed)
    torch.testing.assert_close(lp[batch.action_mask], batch.old_logp[batch.action_mask],
                               atol=1e-5, rtol=0)


def test_token_trie_open_ended():
    """An open-ended trie (action prefixes) constrains up to a leaf, then nothing: no EOS
    in it, no forced tail, and the free tokens record None."""
    trie = TokenTrie([[1, 2], [1, 3, 4], [5]], open_ended=True)
    assert trie.forced_tail(trie.step(0, 5)) is None and trie.is_free(trie.step(0, 5))
    assert not trie.is_free(0) and not trie.is_free(trie.step(0, 1))
    assert trie.allowed_along([1, 3, 4, 9, 9]) == [[1, 5], [2, 3], [4], None, None]
    assert trie.allowed_along([5, 7]) == [[1, 5], None]
    assert not TokenTrie([[1, 2]]).is_free(2)  # a closed trie's leaf is the end, not free


def test_token_trie_forced_tail():
    trie = TokenTrie([[1, 2, 0], [1, 3, 0], [4, 0], [5, 6, 7, 0]])
    assert trie.forced_tail(0) is None  # a choice at the root
    n1 = trie.step(0, 1)
    assert trie.forced_tail(n1) is None  # 2 or 3
    assert trie.forced_tail(trie.step(0, 4)) == [0]
    assert trie.forced_tail(trie.step(0, 5)) == [6, 7, 0]
    assert trie.forced_tail(trie.step(trie.step(0, 4), 0)) is None  # at a leaf


def test_token_trie_tokens_after_first_is_the_longest_forced_tail():
    """Counted by hand: after 4 the move ends with [0]; after 5, [6, 7, 0]; a choice after
    a first token (1: then 2 or 3) or an open-ended trie leaves the move undecided."""
    assert TokenTrie([[4, 0], [5, 6, 7, 0], [8, 0]]).tokens_after_first == 3
    assert TokenTrie([[4, 0], [8, 0]]).tokens_after_first == 1
    assert TokenTrie([[4]]).tokens_after_first == 0  # the first token is a leaf
    assert TokenTrie([[1, 2, 0], [1, 3, 0], [4, 0]]).tokens_after_first is None
    assert TokenTrie([[4], [5]], open_ended=True).tokens_after_first is None


@pytest.mark.parametrize("shared", ["", SYSTEM])
def test_moves_decided_by_their_first_token_sample_as_the_cached_prefill(tiny, monkeypatch,
                                                                       shared):
    """With one-token moves (EOS forced after them) the prompts run once without a KV
    cache (`HFPolicy._last_logits`), unless they share a start `run_prompts` runs once
    (``SYSTEM``); either way the tokens equal those of the cached prefill and the log-probs
    agree to float rounding."""
    import sparring.policy.hf as hf

    model, tok = tiny
    prompts = _prompts(tok, shared) * 4
    allowed = [["1", "4", "7"], ["2", "5"], ["3", "6", "8", "9"]] * 4
    sp = SamplingParams(temperature=0.8, max_new_tokens=2)
    prefills = []
    real = hf.run_prompts
    monkeypatch.setattr(hf, "run_prompts", lambda *a, **k: prefills.append(1) or real(*a, **k))
    lean = HFPolicy(model, tok, seed=3).generate(prompts, sp, allowed=allowed)
    assert len(prefills) == (1 if shared else 0)
    monkeypatch.setattr(HFPolicy, "_last_logits", lambda self, prompts: None)
    cached = HFPolicy(model, tok, seed=3).generate(prompts, sp, allowed=allowed)
    assert len(prefills) == (2 if shared else 1)
    assert [g.token_ids for g in lean] == [g.token_ids for g in cached]
    for a, b in zip(lean, cached):
        assert a.finish_reason == b.finish_reason == "eos"
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_device_auto_is_the_gpu_when_there_is_one_else_the_cpu(tiny):
    """`model.device: auto` reached torch.device("auto") and failed."""
    model, tok = tiny
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert HFPolicy(model, tok, device="auto").device.type == want


def test_prompts_that_share_a_seat_prompt_run_it_once_and_generate_as_alone(tiny_on):
    """Two prompts share the system prompt and a seat's own rules after it, the third only
    the system prompt: the prefill runs the common start (1 row), then X's rules once for
    the two prompts that share them, then the rests; greedy generation equals a plain
    argmax loop over the full sequence."""
    model, tok = tiny_on
    pol = HFPolicy(model, tok, device=model.device)
    seat = {"X": "Seat X: you move first, so take the centre.\n",
            "O": "Seat O: answer a corner with the centre.\n"}
    prompts = [tok.encode(SYSTEM + seat[s] + obs, add_special_tokens=False)
               for s, obs in (("X", "x.."), ("X", "x.o.."), ("O", "o"))]
    gens, shapes = _greedy_with_shapes(pol, prompts, 5)
    common = len(tok.encode(SYSTEM + "Seat ", add_special_tokens=False))  # all three
    x_rules = len(tok.encode(SYSTEM + seat["X"] + "x.", add_special_tokens=False)) - common
    assert shapes[0] == (1, common)
    assert shapes[1] == (2, x_rules)  # a row per seat; O's has only its first token to share
    for p, g in zip(prompts, gens):
        assert g.token_ids == _greedy_reference(model, tok, p, 5)

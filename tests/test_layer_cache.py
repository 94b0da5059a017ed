"""Trained top layers over a frozen, cached lower network (the ``top_layers`` head,
`sparring.policy.layer_cache`, `sparring.policy.top_layers`): the top layers run on stored
states give the model's own forward (hidden states, log-probs, gradients), a state does not
depend on the batch that first needed it, only the top layers train, and a run with the
cache matches one without it and resumes exactly."""


import pytest
import torch

from sparring.policy.feature_cache import attach_feature_cache, feature_cache_of
from sparring.policy.forward import token_logprobs_and_hidden
from sparring.policy.heads import TopLayers, build_head, top_layer_names
from sparring.policy.hf import HFPolicy
from sparring.policy.hidden import capture_hidden
from sparring.policy.layer_cache import LayerCache
from sparring.policy.prefix import find_prefixes, first_action_positions
from sparring.policy.sampling import SamplingParams
from sparring.policy.tiny import build_tiny_model
from tests.test_feature_cache import (
    SMALL_RUN,
    assert_resumed_step_3_repeats,
    frozen_tiny_from_run,
    rows,
)

SMALL = {"hidden_size": 32, "num_layers": 3, "num_heads": 4, "num_kv_heads": 2,
         "intermediate_size": 64}
CONTEXTS = [([5, 8, 13, 21, 34], ()), ([5, 8, 13, 21, 34], (40,)),
            ([5, 8, 13, 21, 34], (40, 3)), ([7, 7, 9], (41, 42, 43)), ([6], ())]
# prompts with a common start (a system turn), one of them ending where another goes on
SHARED_START = [([5, 8, 13, 21, 34], (40,)), ([5, 8, 13, 2, 9, 9], ()),
                ([5, 8, 13, 2, 9, 9], (41, 42)), ([5, 8, 13], (40, 3))]


def tiny(seed: int = 0):
    torch.manual_seed(seed)
    model, tok = build_tiny_model(SMALL)
    return model.float().eval(), tok


def plain_hidden(model, contexts):
    """The last hidden state of each context from the model's own forward, one at a time."""
    out = []
    for p, c in contexts:
        with capture_hidden(model) as hs:
            model(input_ids=torch.tensor([list(p) + list(c)]))
        out.append(hs[-1][0, -1])
    return torch.stack(out)


@pytest.mark.parametrize("contexts", [CONTEXTS, SHARED_START], ids=["apart", "shared_start"])
@pytest.mark.parametrize("layers,keys_values", [(1, True), (1, False), (2, True), (3, True)])
def test_top_layers_on_cached_states_give_the_forwards_hidden_states_and_gradients(
        layers, keys_values, contexts):
    model, _ = tiny()
    TopLayers(layers=layers, keys_values=keys_values).freeze(model)
    cache = LayerCache(model, layers, 100, fixed_keys=not keys_values)
    probe = torch.randn(len(contexts), SMALL["hidden_size"])
    grads = []
    for run in (lambda: plain_hidden(model, contexts), lambda: cache.features(contexts)):
        model.zero_grad()
        h = run()
        (h * probe).sum().backward()
        grads.append((h.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                   if p.requires_grad}))
    (want, want_grads), (got, got_grads) = grads
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert want_grads.keys() == got_grads.keys() == top_layer_names(model, layers, keys_values)
    for n in want_grads:
        torch.testing.assert_close(got_grads[n], want_grads[n], atol=1e-5, rtol=1e-4)
    # each distinct prompt ran the lower layers once
    assert cache.prompt_passes == len({tuple(p) for p, _ in contexts})


def test_a_contexts_states_do_not_depend_on_its_batch():
    model, _ = tiny()
    a, b = LayerCache(model, 1, 100), LayerCache(model, 1, 100)
    p = [5, 8, 13, 21, 34]
    a.prefetch([(p, (40,))])
    b.prefetch([(p, (41,)), (p, (40,)), (p, (42,)), ([7, 7], (40,))])
    key = (bytes(torch.tensor(p).numpy().astype("int64")),
           bytes(torch.tensor([40]).numpy().astype("int64")))
    assert torch.equal(a.tokens[key], b.tokens[key])  # bit for bit
    assert torch.equal(a.prompts[key[0]], b.prompts[key[0]])
    full = LayerCache(model, 1, 1)  # one prompt held: it empties itself, and still answers
    assert full.features(CONTEXTS).shape == (len(CONTEXTS), SMALL["hidden_size"])
    assert len(full.prompts) == 1


def test_gradients_through_repeated_contexts_repeat_bit_for_bit():
    """Contexts repeat in a learner's batch (rows that share a prompt and a move prefix);
    the gradient of the top layers sums over the repeats in a fixed order, so the same
    backward on two threads gives the same gradients every time."""
    torch.manual_seed(0)
    model = build_tiny_model({**SMALL, "hidden_size": 64})[0].float()
    TopLayers(layers=1, keys_values=True).freeze(model)
    cache = LayerCache(model, 1, 100)
    g = torch.Generator().manual_seed(0)
    contexts = [CONTEXTS[int(i)] for i in torch.randint(0, len(CONTEXTS), (2000,), generator=g)]
    probe = torch.randn(len(contexts), 64, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = []
        for _ in range(6):
            model.zero_grad()
            (cache.features(contexts) * probe).sum().backward()
            grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
    finally:
        torch.set_num_threads(threads)
    for other in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], other))


def constrained_rows():
    """Six right-padded rows over three prompts, 1-3 action tokens each, the first one
    constrained to itself and ids 9 and 11: ``(ids, att, amask, prefixes, allowed)``."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 60, (n,), generator=g) for n in (9, 6, 11)]
    rows = [torch.cat([prompts[i % 3], torch.randint(3, 60, (1 + i % 3,), generator=g)])
            for i in range(6)]
    T = max(len(r) for r in rows)
    ids, att = torch.zeros(6, T, dtype=torch.long), torch.zeros(6, T, dtype=torch.bool)
    amask = torch.zeros(6, T, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)], att[i, :len(r)] = r, True
        amask[i, len(prompts[i % 3]):len(r)] = True
    pre = find_prefixes(ids, first_action_positions(amask, att.sum(1)))
    allowed = [{int(pre.plen[i]): sorted({int(ids[i, pre.plen[i]]), 9, 11})} for i in range(6)]
    return ids, att, amask, pre, allowed


def test_the_learner_and_sampler_read_the_cache_as_the_plain_model():
    """Log-probs, entropies and hidden states over a batch of right-padded rows with
    constrained positions, and the sampler's tokens and log-probs, with and without the cache
    registered; the magnet-like copy (another reader) runs its own top layer."""
    model, tok = tiny()
    TopLayers(layers=1).freeze(model)
    ids, att, amask, pre, allowed = constrained_rows()
    texts = [tok.encode(t) for t in ("board one", "board two", "board one")]
    moves = [["a", "bcd", "ef"], ["a", "b"], ["a", "bcd", "ef"]]
    sp = SamplingParams(max_new_tokens=4, with_entropy=True)
    out = []
    for cache in (None, LayerCache(model, 1, 100)):
        attach_feature_cache(model, cache)
        lp, ent, h = token_logprobs_and_hidden(model, ids, att, with_entropy=True,
                                               allowed=allowed, prefixes=pre)
        gens = HFPolicy(model, tok, seed=1).generate(texts, sp, moves, seeds=[1, 2, 3])
        out.append((lp * amask, ent * amask, h * amask[..., None], gens))
    attach_feature_cache(model, None)
    for want, got in zip(out[0][:3], out[1][:3]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    for want, got in zip(out[0][3], out[1][3]):
        assert got.token_ids == want.token_ids
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs),
                                   atol=1e-5, rtol=0)
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[-1].mlp.down_proj.weight.mul_(2.0)
    torch.testing.assert_close(cache.features(CONTEXTS, other), plain_hidden(other, CONTEXTS),
                               atol=1e-5, rtol=1e-4)


def test_only_the_top_layers_train_and_adapters_below_them_are_refused():
    model, _ = tiny()
    build_head({"name": "top_layers", "layers": 2}).freeze(model)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {n for n, _ in model.named_parameters()
                       if n.startswith(("model.layers.1.", "model.layers.2.", "model.norm."))}
    model, _ = tiny()
    build_head({"name": "top_layers", "keys_values": False}).freeze(model)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "model.layers.2.self_attn.q_proj.weight" in trained
    assert not {"model.layers.2.self_attn.k_proj.weight", "model.layers.2.self_attn.v_proj.weight",
                "model.layers.2.input_layernorm.weight"} & trained
    with pytest.raises(ValueError, match="keys_values: false needs layers: 1"):
        build_head({"name": "top_layers", "layers": 2, "keys_values": False})
    with pytest.raises(ValueError, match="layers=4; the model has 3"):
        build_head({"name": "top_layers", "layers": 4}).freeze(tiny()[0])
    model, _ = tiny()
    model.model.layers[0].self_attn.q_proj.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="lora.last_layers to at most 1"):
        TopLayers(layers=1).freeze(model, lora=True)


def test_lora_below_the_top_layers_is_a_config_error():
    from sparring.config import ConfigError, find_recipe, load_config

    with pytest.raises(ConfigError, match="lora.last_layers between 1 and 2"):
        load_config(find_recipe("default"), ["model.head={name: top_layers, layers: 2}",
                                             "lora.enabled=true"])


# the frozen-head run of tests/test_feature_cache.py, two layers, the top one training
RUN = [*(o for o in SMALL_RUN if not o.startswith(("model.options", "model.head"))),
       "model.options={hidden_size: 32, num_layers: 2, num_heads: 2, num_kv_heads: 2, "
       "intermediate_size: 64}", "model.head={name: top_layers, keys_values: false}"]


def test_a_top_layers_run_matches_one_without_the_cache_and_resumes_exactly(tmp_path):
    """The default recipe with its top layer training (snapshots in the league from step
    1, the magnet reading the cache with its own top layer): the same losses with and
    without the cache; resumed from step 2 it logs the uninterrupted run's step 3 bit for
    bit; the saved policy differs from the start in the top layer only."""
    from sparring.assembly.trained import load_policy
    from sparring.cli import main
    cached, plain, cut = tmp_path / "cached", tmp_path / "plain", tmp_path / "cut"
    assert main(["train", *RUN, f"train.run_dir={cached}"]) == 0
    assert main(["train", *RUN, "model.head.cache=0", f"train.run_dir={plain}"]) == 0
    for want, got in zip(rows(plain), rows(cached)):
        for k in ("loss", "policy_loss", "value_loss", "entropy", "grad_norm"):
            assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    assert_resumed_step_3_repeats(cached, cut)
    policy, _, _ = load_policy(cached)
    start, _ = frozen_tiny_from_run(cached)
    changed = {n for (n, p), q in zip(policy.model.named_parameters(), start.parameters())
               if not torch.equal(p, q)}
    assert changed and changed <= top_layer_names(start, 1, keys_values=False)
    assert feature_cache_of(policy.model) is None  # a loaded policy runs the plain forward

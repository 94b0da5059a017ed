"""A frozen network's features, cached per context (`sparring.policy.feature_cache`): the
learner's and the sampler's results from stored features equal those of the network's own
forward passes, a context's features do not depend on the batch that first needed them,
and a run with the cache resumes exactly."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from sparring.policy.feature_cache import (
    FeatureCache,
    attach_feature_cache,
    feature_cache_of,
)
from sparring.policy.forward import token_logprobs_and_hidden
from sparring.policy.heads import freeze_body, untie_output_layer
from sparring.policy.hf import HFPolicy
from sparring.policy.lora import frozen_sha256
from sparring.policy.prefix import find_prefixes, first_action_positions
from sparring.policy.sampling import SamplingParams
from sparring.policy.tiny import build_tiny_model

SMALL = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
         "intermediate_size": 64}


def frozen_tiny(seed: int = 0):
    torch.manual_seed(seed)
    model, tok = build_tiny_model(SMALL)  # tied embeddings, as SmolLM2's
    model.float()
    assert untie_output_layer(model) and not untie_output_layer(model)
    freeze_body(model)
    return model, tok


def batch():
    """10 rows: 3 prompts (one a prefix of another's start), continuations of 1-3 tokens."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 60, (n,), generator=g) for n in (9, 6, 11)]
    rows, plens = [], []
    for i in range(10):
        p = prompts[i % 3]
        rows.append(torch.cat([p, torch.randint(3, 60, (1 + i % 3,), generator=g)]))
        plens.append(len(p))
    T = max(len(r) for r in rows)
    ids = torch.zeros(10, T, dtype=torch.long)
    att = torch.zeros(10, T, dtype=torch.bool)
    amask = torch.zeros(10, T, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)], att[i, :len(r)] = r, True
        amask[i, plens[i]:len(r)] = True
    return ids, att, amask


def test_untying_gives_the_head_its_own_copy_and_leaves_the_embeddings_to_the_body():
    model, _ = frozen_tiny()
    head, inputs = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert head is not inputs and torch.equal(head, inputs)
    assert head.requires_grad and not inputs.requires_grad
    assert model.config.tie_word_embeddings is False


@pytest.mark.parametrize("constrained", ["one position", "every position"])
def test_cached_features_give_the_forwards_log_probs_hidden_states_and_head_gradients(
        constrained):
    """With every scored position constrained the head runs over the allowed ids only."""
    model, _ = frozen_tiny()
    ids, att, amask = batch()
    pre = find_prefixes(ids, first_action_positions(amask, att.sum(1)))
    allowed = [None] * 10
    p0 = int(pre.plen[0])
    allowed[0] = {p0: [int(ids[0, p0]), 9, 11]}
    if constrained == "every position":
        allowed = [{t: sorted({int(ids[i, t]), 9 + t % 3, 30}) for t in range(
            int(pre.plen[i]), int(att[i].sum()))} for i in range(10)]
    w = torch.randn(ids.shape)
    probe = torch.randn(SMALL["hidden_size"])
    results = []
    for cache in (None, FeatureCache(model, 100)):
        attach_feature_cache(model, cache)
        model.zero_grad()
        lp, ent, h = token_logprobs_and_hidden(model, ids, att, 0.8, with_entropy=True,
                                               allowed=allowed, prefixes=pre)
        ((lp * w + 0.1 * ent + h @ probe) * amask).sum().backward()
        results.append((lp * amask, ent * amask, h * amask[..., None],
                        model.get_output_embeddings().weight.grad.clone()))
        assert all(p.grad is None for n, p in model.named_parameters() if "lm_head" not in n)
    attach_feature_cache(model, None)
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert cache.prompt_passes == 3  # each prompt ran once, every continuation over its KV


def test_a_contexts_features_do_not_depend_on_its_batch_and_equal_the_plain_forwards():
    model, _ = frozen_tiny()
    p1, p2 = [5, 8, 13, 21, 34], [7, 7, 9]
    a, b = FeatureCache(model, 100), FeatureCache(model, 100)
    both = a.features([(p1, ()), (p1, (40,)), (p2, (41, 42)), (p1, (40, 3))])
    alone = torch.cat([b.features([(p2, (41, 42))]), b.features([(p1, (40,))])])
    assert torch.equal(alone, both[[2, 1]])  # bit for bit
    with torch.no_grad():
        for i, ctx in enumerate([p1, p1 + [40], p2 + [41, 42], p1 + [40, 3]]):
            want = model(input_ids=torch.tensor([ctx]), output_hidden_states=True
                         ).hidden_states[-1][0, -1]
            torch.testing.assert_close(both[i], want, atol=1e-5, rtol=1e-4)
    full = FeatureCache(model, 2)  # full: it empties itself, and still answers the call
    assert full.features([(p1, (40, 3))]).shape == (1, SMALL["hidden_size"])
    assert len(full.store) == 2


@pytest.mark.parametrize("free_row", [True, False])
@pytest.mark.parametrize("greedy", [True, False])
def test_the_sampler_reads_cached_features_and_decodes_on_past_them(greedy, free_row):
    """Constrained rows (moves of 1 to 3 tokens) and a free row (3 tokens) or none (the head
    then runs over the allowed first tokens only): with the cache the first token comes from
    stored features and the rest from a prefill run only for rows that go on; tokens and
    log-probs are those of the plain sampler."""
    model, tok = frozen_tiny()
    prompts = [tok.encode(t) for t in ("board one", "board two", "board one", "other")]
    allowed = [["a", "bcd", "ef"], ["a", "b"], ["a", "bcd", "ef"],
               None if free_row else ["x", "yz"]]
    sp = SamplingParams(max_new_tokens=4, greedy=greedy, with_entropy=True)
    out = []
    for cache in (None, FeatureCache(model, 100)):
        attach_feature_cache(model, cache)
        policy = HFPolicy(model, tok, seed=1)
        out.append(policy.generate(prompts, sp, allowed, seeds=[1, 2, 3, 4]))
    attach_feature_cache(model, None)
    for want, got in zip(*out):
        assert got.token_ids == want.token_ids
        assert torch.isfinite(torch.tensor(got.logprobs)).all()  # a free row among constrained
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs),
                                   atol=1e-5, rtol=0)
    assert cache.prompt_passes == 3  # the distinct prompts


@pytest.mark.parametrize("whiten", [0.0, 0.1])
def test_transformed_features_keep_the_starting_logits_and_precondition_the_gradient(whiten):
    """``W_0 h + (W - W_0) z``, ``z = P (h - mu)``: before `fix_transform` and at ``W = W_0``
    the model's own logits, bit for bit; the head's gradient is ``delta z^T``, by hand, with
    ``mu`` the mean of the contexts held at the fix and ``P`` the identity (centering) or
    the inverse square root of their covariance shrunk by ``whiten`` (checked by its
    defining property ``P (S + eps tr(S)/H I) P = I``); later contexts change neither."""
    model, _ = frozen_tiny()
    cache = FeatureCache(model, 100, center=True, whiten=whiten)
    prompts = [[5, 8, 13, 21, 34], [7, 7, 9], [2, 4], [11, 3, 3, 6], [1]]
    feats = cache.features([(p, ()) for p in prompts]).double()
    head = model.get_output_embeddings()
    h = torch.randn(4, SMALL["hidden_size"])
    assert torch.equal(cache.head_logits(head, h), head(h))  # not fixed yet: the plain head
    cache.fix_transform()
    assert torch.equal(cache.head_logits(head, h), head(h))
    rows = torch.tensor([3, 9])
    assert torch.equal(cache.head_logits(head, h, rows),
                       torch.nn.functional.linear(h, head.weight[rows]))
    mu = feats.mean(0)
    torch.testing.assert_close(cache.mean, mu.float())
    if whiten:
        S = (feats - mu).T @ (feats - mu) / len(feats)
        S += whiten * S.trace() / len(S) * torch.eye(len(S), dtype=S.dtype)
        P = cache.precondition.double()
        torch.testing.assert_close(P, P.T)
        torch.testing.assert_close(P @ S @ P, torch.eye(len(S), dtype=S.dtype),
                                   atol=1e-4, rtol=0)
    else:
        assert cache.precondition is None
        P = torch.eye(SMALL["hidden_size"], dtype=torch.float64)
    z = ((h.double() - mu) @ P).float()
    torch.testing.assert_close(cache.head_input(h), z, atol=1e-4, rtol=1e-4)
    delta = torch.randn(4, head.weight.shape[0])
    head.weight.grad = None
    (cache.head_logits(head, h) * delta).sum().backward()
    torch.testing.assert_close(head.weight.grad, delta.T @ z, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # a moved head: W_0 h + (W - W_0) z
        start = head.weight.clone()
        head.weight.add_(0.1 * torch.randn_like(head.weight))
        torch.testing.assert_close(cache.head_logits(head, h),
                                   h @ start.T + z @ (head.weight - start).T,
                                   atol=1e-4, rtol=1e-4)
    cache.features([([1, 2, 3], ())])
    cache.fix_transform()  # once: later contexts leave the transform as it was
    torch.testing.assert_close(cache.mean, mu.float())


def test_the_sampler_decodes_with_the_transformed_head_past_the_first_token():
    """Whitened, with a moved head, free rows of 3 tokens: every sampled token's log-prob
    (the first from stored features, the rest from the decoding pass) is the transformed
    head's ``W_0 h + (W - W_0) z`` on that context's own features, as the learner scores
    it, not the model's plain head."""
    model, tok = frozen_tiny()
    prompts = [tok.encode(t) for t in ("board one", "other", "board two")]
    cache = FeatureCache(model, 100, whiten=0.1)
    cache.features([(p, ()) for p in prompts] + [([3, 1, 4], ()), ([1, 5], ())])
    cache.fix_transform()
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight.add_(0.5 * torch.randn_like(head.weight))
    attach_feature_cache(model, cache)
    try:
        gens = HFPolicy(model, tok, seed=1).generate(
            prompts, SamplingParams(max_new_tokens=3), None, seeds=[1, 2, 3])
        for p, g in zip(prompts, gens):
            assert len(g.token_ids) >= 2  # a token past the first, from the decoding pass
            h = cache.features([(p, tuple(g.token_ids[:j])) for j in range(len(g.token_ids))])
            with torch.no_grad():
                want = torch.log_softmax(cache.head_logits(head, h), -1)
                plain = torch.log_softmax(head(h), -1)
            want = want[torch.arange(len(h)), g.token_ids]
            torch.testing.assert_close(torch.tensor(g.logprobs), want, atol=1e-5, rtol=0)
            assert (plain[torch.arange(len(h)), g.token_ids] - want).abs().max() > 1e-3
    finally:
        attach_feature_cache(model, None)


def test_a_copy_of_the_model_does_not_inherit_the_cache():
    import copy

    model, _ = frozen_tiny()
    attach_feature_cache(model, FeatureCache(model, 10))
    assert feature_cache_of(copy.deepcopy(model)) is None
    attach_feature_cache(model, None)
    assert feature_cache_of(model) is None


SMALL_RUN = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
             "intermediate_size: 64}", "rollout.episodes_per_step=16", "envs.0.group_size=4",
             "train.epochs=1", "train.minibatch_size=0", "eval.every=0", "eval.at_start=false",
             "logging.progress=false", "model.head={name: frozen_features}",
             "checkpoint.every=1", "train.steps=3", "league.every=1"]


def rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("transform", ["none", "center", "whiten"])
def test_a_frozen_body_run_matches_one_without_the_cache_and_resumes_exactly(transform, tmp_path):
    """The default recipe with a frozen body (its snapshots in the league from step 1, each
    its trained head alone): the
    same losses with and without the cache (to float rounding; centered, the first step's,
    before any update); resumed from step 2 it logs the uninterrupted run's step 3 bit for
    bit (the cache starts empty and recomputes the same features; the transform comes from
    the checkpoint); the saved policy has the trained head, the untouched input embeddings
    and, with a transform, the run's (fixed at step 1, the same in every checkpoint)."""
    from sparring.assembly.trained import load_policy
    from sparring.cli import main
    from sparring.storage.folders import step_dirs

    cached, plain, cut = tmp_path / "cached", tmp_path / "plain", tmp_path / "cut"
    center = transform != "none"
    arm = {"none": [], "center": ["model.head.center=true"],
           "whiten": ["model.head.whiten=0.1"]}[transform]
    assert main(["train", *SMALL_RUN, *arm, f"train.run_dir={cached}"]) == 0
    assert main(["train", *SMALL_RUN, "model.head.cache=0", f"train.run_dir={plain}"]) == 0
    for want, got in zip(rows(plain)[:1 if center else 3], rows(cached)):
        for k in ("policy_loss", "entropy") if center else (
                "loss", "policy_loss", "value_loss", "entropy", "grad_norm"):
            assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    for _, ckpt in step_dirs(cached):  # checkpoints, too, hold the head alone
        held = load_file(ckpt / "model.safetensors")
        assert set(held) == {"lm_head.weight"}
        meta = json.loads((ckpt / "state.json").read_text())["meta"]
        assert meta["frozen_sha256"] == frozen_sha256(frozen_tiny_from_run(cached)[0], held)
    snaps = sorted((cached / "pool").iterdir())  # the trained head alone, not the network
    assert snaps and all((s / "trained.safetensors").is_file()
                         and not (s / "model.safetensors").exists() for s in snaps)
    assert_resumed_step_3_repeats(cached, cut)
    policy, _, _ = load_policy(cached)
    start, _ = frozen_tiny_from_run(cached)
    model = policy.model
    assert torch.equal(model.get_input_embeddings().weight, start.get_input_embeddings().weight)
    assert not torch.equal(model.get_output_embeddings().weight,
                           start.get_output_embeddings().weight)
    if center:
        first, _, _ = load_policy(step_dirs(cached)[0][1])
        want, got = feature_cache_of(first.model), feature_cache_of(model)
        assert want.mean is not None and torch.equal(got.mean, want.mean)
        assert torch.equal(got.start, want.start)
        assert (got.precondition is None) == (transform == "center")
        if transform == "whiten":
            assert torch.equal(got.precondition, want.precondition)
    else:
        assert feature_cache_of(model) is None


def assert_resumed_step_3_repeats(run, cut):
    """A copy of the 3-step ``run`` without its last checkpoint, resumed from step 2 at
    ``cut``, logs ``run``'s step 3 bit for bit (timings aside)."""
    from sparring.cli import main
    from sparring.storage.folders import step_dirs

    shutil.copytree(run, cut)
    shutil.rmtree(step_dirs(cut)[-1][1])
    (cut / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in rows(run) if r["step"] <= 2))
    assert main(["train", "--resume", str(cut)]) == 0
    drop = ("time/", "throughput/")
    assert {k: v for k, v in rows(cut)[-1].items() if not k.startswith(drop)} == \
        {k: v for k, v in rows(run)[-1].items() if not k.startswith(drop)}


def frozen_tiny_from_run(run):
    """The run's model as built before training (same seed, config)."""
    from sparring.assembly.parts import load_model
    from sparring.config.run_folder import read_run_config

    cfg = read_run_config(run / "config.yaml")
    torch.manual_seed(cfg.train.seed)
    return load_model(cfg)


@pytest.mark.parametrize("option", ["center: true", "whiten: 0.1"])
def test_a_feature_transform_is_an_option_of_the_frozen_head_with_a_cache(option):
    from sparring.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^model.head: head 'frozen_features': center and "
                                          r"whiten transform the cached features; they need "
                                          r"cache above 0$"):
        load_config(None, [f"model.head={{name: frozen_features, cache: 0, {option}}}"])
    assert load_config(None, [f"model.head={{name: frozen_features, {option}}}"])
    with pytest.raises(ConfigError, match=r"^model.head: head 'lm_head' has no option "
                                          r"'center'; allowed: body_lr_scale$"):
        load_config(None, ["model.head.center=true"])
    with pytest.raises(ConfigError, match=r"^model.head: head 'frozen_features' option "
                                          r"'whiten': -1 is out of range \(must be >= 0\)$"):
        load_config(None, ["model.head={name: frozen_features, whiten: -1}"])

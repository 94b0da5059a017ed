"""A frozen network's features, cached per context (`sparring.policy.feature_cache`): the
learner's and the sampler's results from stored features equal those of the network's own
forward passes, a context's features do not depend on the batch that first needed them,
and a run with the cache resumes exactly."""

import json
import shutil

import pytest
import torch

from sparring.policy.feature_cache import (
    FeatureCache,
    attach_feature_cache,
    feature_cache_of,
)
from sparring.policy.forward import token_logprobs_and_hidden
from sparring.policy.hf import HFPolicy
from sparring.policy.prefix import find_prefixes, first_action_positions
from sparring.policy.sampling import SamplingParams
from sparring.policy.tiny import build_tiny_model
from sparring.train.param_groups import freeze_body, untie_output_layer

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


@pytest.mark.parametrize("greedy", [True, False])
def test_the_sampler_reads_cached_features_and_decodes_on_past_them(greedy):
    """Constrained rows (moves of 1 to 3 tokens) and free rows (3 tokens): with the cache the
    first token comes from stored features and the rest from a prefill run only for rows
    that go on; tokens and log-probs are those of the plain sampler."""
    model, tok = frozen_tiny()
    prompts = [tok.encode(t) for t in ("board one", "board two", "board one", "other")]
    allowed = [["a", "bcd", "ef"], ["a", "b"], ["a", "bcd", "ef"], None]
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


def test_centered_features_keep_the_starting_logits_and_drop_the_shared_part_of_the_gradient():
    """``W (h - mu) + W_0 mu``: at ``W = W_0`` the model's own logits; the head's gradient is
    ``delta (h - mu)^T``, by hand."""
    model, _ = frozen_tiny()
    cache = FeatureCache(model, 100, center=True)
    p1, p2 = [5, 8, 13, 21, 34], [7, 7, 9]
    feats = cache.features([(p1, ()), (p2, ())])
    mu = feats.mean(0)
    torch.testing.assert_close(cache.mean, mu)
    head = model.get_output_embeddings()
    h = torch.randn(4, SMALL["hidden_size"])
    torch.testing.assert_close(cache.head_logits(head, h), head(h), atol=1e-5, rtol=1e-5)
    delta = torch.randn(4, head.weight.shape[0])
    head.weight.grad = None
    (cache.head_logits(head, h) * delta).sum().backward()
    torch.testing.assert_close(head.weight.grad, delta.T @ (h - mu), atol=1e-5, rtol=1e-5)
    rows = torch.tensor([3, 9])
    torch.testing.assert_close(cache.head_logits(head, h, rows), head(h)[:, rows],
                               atol=1e-5, rtol=1e-5)
    cache.features([([1, 2, 3], ())])  # later batches leave mu as it was
    torch.testing.assert_close(cache.mean, mu)


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
             "logging.progress=false", "optim.body_lr_scale=0", "checkpoint.every=1",
             "train.steps=3", "league.every=1"]


def rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("center", [False, True])
def test_a_frozen_body_run_matches_one_without_the_cache_and_resumes_exactly(center, tmp_path):
    """The default recipe with a frozen body (its snapshots in the league from step 1, each
    its trained head alone): the
    same losses with and without the cache (to float rounding; centered, the first step's,
    before any update); resumed from step 2 it logs the uninterrupted run's step 3 bit for
    bit (the cache starts empty and recomputes the same features; the centering comes from
    the checkpoint); the saved policy has the trained head, the untouched input embeddings
    and, centered, the run's mean features."""
    from sparring.cli import main
    from sparring.train.checkpoint import step_dirs
    from sparring.train.restore import load_policy

    cached, plain, cut = tmp_path / "cached", tmp_path / "plain", tmp_path / "cut"
    arm = [f"train.feature_center={center}"]
    assert main(["train", *SMALL_RUN, *arm, f"train.run_dir={cached}"]) == 0
    assert main(["train", *SMALL_RUN, "train.feature_cache=0", f"train.run_dir={plain}"]) == 0
    for want, got in zip(rows(plain)[:1 if center else 3], rows(cached)):
        for k in ("policy_loss", "entropy") if center else (
                "loss", "policy_loss", "value_loss", "entropy", "grad_norm"):
            assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k
    snaps = sorted((cached / "pool").iterdir())  # the trained head alone, not the network
    assert snaps and all((s / "trained.safetensors").is_file()
                         and not (s / "model.safetensors").exists() for s in snaps)
    shutil.copytree(cached, cut)
    shutil.rmtree(step_dirs(cut)[-1][1])
    (cut / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in rows(cached) if r["step"] <= 2))
    assert main(["train", "--resume", str(cut)]) == 0
    drop = ("time/", "throughput/")
    assert {k: v for k, v in rows(cut)[-1].items() if not k.startswith(drop)} == \
        {k: v for k, v in rows(cached)[-1].items() if not k.startswith(drop)}
    policy, _, _ = load_policy(cached)
    start, _ = frozen_tiny_from_run(cached)
    model = policy.model
    assert torch.equal(model.get_input_embeddings().weight, start.get_input_embeddings().weight)
    assert not torch.equal(model.get_output_embeddings().weight,
                           start.get_output_embeddings().weight)
    if center:
        first, _, _ = load_policy(step_dirs(cached)[0][1])
        mean = feature_cache_of(first.model).mean
        assert mean is not None and torch.equal(feature_cache_of(model).mean, mean)
    else:
        assert feature_cache_of(model) is None


def frozen_tiny_from_run(run):
    """The run's model as built before training (same seed, config)."""
    from sparring.train.parts import load_model
    from sparring.train.restore import read_run_config

    cfg = read_run_config(run / "config.yaml")
    torch.manual_seed(cfg.train.seed)
    return load_model(cfg)


def test_feature_center_needs_a_frozen_network_with_a_cache():
    from sparring.train.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="train.feature_center.*optim.body_lr_scale=0"):
        load_config(None, ["train.feature_center=true"])
    with pytest.raises(ConfigError, match="train.feature_center.*got 0.0 and 0"):
        load_config(None, ["train.feature_center=true", "optim.body_lr_scale=0",
                           "train.feature_cache=0"])
    assert load_config(None, ["train.feature_center=true", "optim.body_lr_scale=0"])

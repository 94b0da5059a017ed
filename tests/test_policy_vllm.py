"""vLLM backend without vLLM: the error names the extra; sampling options translate."""

import importlib.util

import pytest

from sparring.policy import vllm as backend
from sparring.policy.sampling import SamplingParams


def test_missing_extra_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install sparring\[vllm\]"):
        backend.VLLMPolicy("/nowhere")


def test_sampling_translation():
    kw = backend.vllm_sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5,
                                                     stop=("</answer>",)), seed=3)
    assert kw["temperature"] == 0.7 and kw["top_p"] == 0.9 and kw["top_k"] == -1
    assert kw["max_tokens"] == 5 and kw["stop"] == ["</answer>"] and kw["logprobs"] == 0 and kw["seed"] == 3
    kw = backend.vllm_sampling_kwargs(SamplingParams(greedy=True, top_k=4), seed=0)
    assert kw["temperature"] == 0.0 and kw["top_k"] == 4 and kw["stop"] is None

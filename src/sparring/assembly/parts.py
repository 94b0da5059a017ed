"""The parts of a run in one process: ``build_parts(cfg, run_dir) -> RunParts``.

`load_model` builds the policy model (in ``model.dtype``, its compute precision recorded on
it) and its tokenizer; `build_parts` adds the rollout schedule
(`sparring.rollout.rollouts.Rollouts`) and the periodic evaluation
(`sparring.eval.periodic.make_eval_fn`). With ``model.backend=vllm`` each policy's seats
sample from a `sparring.policy.vllm.VLLMPolicy` that receives its learner's weights before
every step (`sparring.rollout.synced.EngineRollouts`): an engine per policy, or with
``lora.shared_base`` one engine serving every policy's adapter. A Ray rollout worker builds
its parts with this function; `sparring.assembly.run.build` adds the workers on top.

Several policies (``policies``): a model per policy (`load_model` of its own ``model``
section: the same initial weights unless it changes them), or with ``lora.shared_base`` one
base model with an adapter per policy (attached here, seeded with ``train.seed``, so the
rollouts' policies sample from their own adapters); ``RunParts.policies`` holds an
`HFPolicy` per name and ``RunParts.model`` ``{name: model}`` for the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparring.config import Config, policy_config
from sparring.eval.periodic import EvalFn, make_eval_fn
from sparring.policy import precision
from sparring.policy.heads import build_head, untie_output_layer
from sparring.policy.hf import HFPolicy, resolve_device
from sparring.rollout.rollouts import Rollouts
from sparring.train.determinism import use_deterministic_kernels


@dataclass
class RunParts:
    """What a run is made of. ``stateful``: objects with ``state_dict``/``load_state_dict``
    saved in every checkpoint (the rollouts' opponent pool)."""

    model: Any  # with several policies: {name: model} (train's `model`)
    tokenizer: Any
    policy: HFPolicy  # with several policies: the first one's
    rollout_fn: Rollouts  # an EngineRollouts over them with model.backend=vllm
    eval_fn: EvalFn
    stateful: dict[str, Any] = field(default_factory=dict)
    pad_id: int = 0
    policies: dict[str, HFPolicy] = field(default_factory=dict)  # {} with one policy
    precision: str = "float32"  # the compute precision chosen, and why (printed by the CLI)
    # what the run started outside this process and `close` ends (Ray learner ranks)
    started: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """End what the run started: learner rank actors and their group, rollout workers
        (each also ends when this process does)."""
        for obj in (*reversed(self.started), self.rollout_fn):
            close = getattr(obj, "close", None)
            if callable(close):
                close()


def load_model(cfg: Config) -> tuple[Any, Any]:
    """``model.name``: 'tiny' (built from ``model.options``), 'smollm2', or an HF folder/id;
    the weights in ``model.dtype``, the compute precision of ``model.precision`` recorded on
    the model (`sparring.policy.precision`); a tied LM head untied when ``model.head``
    trains it apart from the body (`untie_output_layer`)."""
    model, tok = _load_weights(cfg)
    if build_head(cfg.model.head).body_lr_scale != 1:  # apart from the input embeddings
        untie_output_layer(model)
    mode = model_precision(cfg, model)
    precision.apply(model, mode.mode)
    return model, tok


def model_precision(cfg: Config, model: Any) -> precision.Resolved:
    """What ``model.precision`` resolves to for ``model`` on ``model.device``, and why."""
    n = sum(p.numel() for p in model.parameters())
    device = str(resolve_device(cfg.model.device))
    return precision.resolve(cfg.model.precision, device, n, next(model.parameters()).dtype)


def _load_weights(cfg: Config) -> tuple[Any, Any]:
    m = cfg.model
    dtype = getattr(torch, m.dtype)
    if m.name == "tiny":
        from sparring.policy.tiny import build_tiny_model

        model, tok = build_tiny_model(dict(m.options))
        return model.to(dtype), tok
    if m.name == "smollm2":
        from sparring.policy.smollm2 import smollm2_folder

        path = smollm2_folder()
    else:
        path = m.name
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=m.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=m.trust_remote_code,
                                                 dtype=dtype)
    return model, tok


def build_parts(cfg: Config, run_dir: str | Path | None = None) -> RunParts:
    """The models, policies, rollouts and evaluation of ``cfg`` in this process (the
    rollouts sample from a vLLM engine with ``model.backend=vllm``); pool snapshots go
    under ``run_dir`` (default ``runs/unnamed``). One path for one policy and several: a
    policy per name (one policy: the name '', its `HFPolicy` called 'learner')."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # pool snapshots save/load every few steps
    use_deterministic_kernels(cfg.train.deterministic)  # here: Ray workers build parts too
    if not cfg.envs:
        raise ValueError("config has no envs: add at least one, e.g. envs: [{name: tictactoe}]")
    several, shared = bool(cfg.policies), bool(cfg.policies) and cfg.lora.shared_base
    names = list(cfg.policies) or [""]
    models, toks = _policy_models(cfg, names)
    policies = {}
    for n in names:
        m = (policy_config(cfg, n) if n else cfg).model
        policies[n] = HFPolicy(models[n], toks[n], seed=cfg.train.seed, name=n or "learner",
                               device=m.device, adapter=n if shared else None, decode=m.decode)
    rollouts = Rollouts(cfg, policies, Path(run_dir or "runs/unnamed"))
    rollout_fn: Any = rollouts
    if cfg.model.backend == "vllm":
        rollout_fn = _engine_rollouts(cfg, rollouts, models, toks, shared)
    first = policies[names[0]]
    if several:
        chosen = ", ".join(f"{n}: {precision.mode_of(p.model)}" for n, p in policies.items())
    else:
        mode = model_precision(cfg, first.model)
        chosen = f"{mode.mode} ({mode.reason})"
    eval_fn = make_eval_fn(cfg, rollouts.arena, policies)
    stateful: dict[str, Any] = {"rollouts": rollouts}
    if eval_fn.history is not None:  # type: ignore[attr-defined]
        stateful["eval_history"] = eval_fn.history  # type: ignore[attr-defined]
    return RunParts(model={n: p.model for n, p in policies.items()} if several else first.model,
                    tokenizer=first.tokenizer, policy=first, rollout_fn=rollout_fn,
                    eval_fn=eval_fn, stateful=stateful, pad_id=first.pad_id,
                    policies=policies if several else {}, precision=chosen)


def _policy_models(cfg: Config, names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({name: model}, {name: tokenizer})``: the one policy's model (name ''); with several,
    a model per policy (`load_model` of its own ``model`` section), or with
    ``lora.shared_base`` one base model with an adapter per policy (seeded with
    ``train.seed``), the same PEFT model under every name."""
    from sparring.train.policies import policy_models

    if cfg.policies and cfg.lora.shared_base:
        base, tok = load_model(cfg)
        with torch.random.fork_rng(devices=[]):  # the adapters' initial weights
            torch.manual_seed(cfg.train.seed)
            return policy_models(cfg, base), dict.fromkeys(names, tok)
    loaded = {n: load_model(policy_config(cfg, n) if n else cfg) for n in names}
    return {n: m for n, (m, _) in loaded.items()}, {n: t for n, (_, t) in loaded.items()}


def _engine_rollouts(cfg: Config, rollouts: Rollouts, models: dict[str, Any],
                     toks: dict[str, Any], shared: bool) -> Any:
    """The rollouts on vLLM engines: one over the shared base serving an adapter per policy
    (``lora.shared_base``), else one per policy over its own model (the one policy's model
    is served as an adapter when ``model.vllm_options`` has ``enable_lora``)."""
    from sparring.rollout.synced import EngineRollouts

    names = list(models)
    if shared:
        ranks = [policy_config(cfg, n).lora.r for n in names]
        engine = _vllm_engine(cfg, models[names[0]].get_base_model(), toks[names[0]],
                              "policies", ranks)
        return EngineRollouts(rollouts, dict.fromkeys(names, engine), models, adapters=True)
    engines = {}
    for n in names:
        pc = policy_config(cfg, n) if n else cfg
        adapter = pc.lora.enabled and pc.model.vllm_options.get("enable_lora")
        engines[n] = _vllm_engine(pc, models[n], toks[n], n or "learner",
                                  [pc.lora.r] if adapter else [])
    return EngineRollouts(rollouts, engines, models)


def _vllm_engine(cfg: Config, model: torch.nn.Module, tok: Any, name: str,
                 lora_ranks: list[int]) -> Any:
    """A vLLM engine over ``model`` with ``model.vllm_options``; ``lora_ranks`` (one per
    adapter it serves) turn on ``enable_lora``, with ``max_lora_rank`` and ``max_loras``
    defaulting to their largest and their count."""
    from sparring.policy.vllm import VLLMPolicy

    options = dict(cfg.model.vllm_options)
    if lora_ranks:
        options["enable_lora"] = True
        options.setdefault("max_lora_rank", max(lora_ranks))
        options.setdefault("max_loras", len(lora_ranks))
    return VLLMPolicy.from_model(model, tok, seed=cfg.train.seed, name=name,
                                 trust_remote_code=cfg.model.trust_remote_code, **options)


__all__ = ["RunParts", "build_parts", "load_model", "model_precision"]

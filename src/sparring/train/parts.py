"""The parts of a run in one process: ``build_parts(cfg, run_dir) -> RunParts``.

`load_model` builds the policy model (in ``model.dtype``, its compute precision recorded on
it) and its tokenizer; `build_parts` adds the rollout schedule
(`sparring.rollout.schedule.Rollouts`) and the periodic evaluation
(`sparring.eval.periodic.make_eval_fn`). With ``model.backend=vllm`` the rollouts' learner
seats sample from a `sparring.policy.vllm.VLLMPolicy` that receives the learner's weights
before every step (`sparring.rollout.synced.EngineRollouts`). A Ray rollout worker builds
its parts with this function; `sparring.train.setup.build` adds the workers on top.

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

from sparring.eval.periodic import EvalFn, make_eval_fn
from sparring.policy import precision
from sparring.policy.hf import HFPolicy, resolve_device
from sparring.rollout.schedule import Rollouts
from sparring.train.config import Config


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


def load_model(cfg: Config) -> tuple[Any, Any]:
    """``model.name``: 'tiny' (built from ``model.options``), 'smollm2', or an HF folder/id;
    the weights in ``model.dtype``, the compute precision of ``model.precision`` recorded on
    the model (`sparring.policy.precision`)."""
    model, tok = _load_weights(cfg)
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
    """The model, policy, rollouts and evaluation of ``cfg`` in this process (the rollouts
    sample from a vLLM engine with ``model.backend=vllm``); pool snapshots go under
    ``run_dir`` (default ``runs/unnamed``)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # pool snapshots save/load every few steps
    if not cfg.envs:
        raise ValueError("config has no envs: add at least one, e.g. envs: [{name: tictactoe}]")
    if cfg.policies:
        return _build_several(cfg, Path(run_dir or "runs/unnamed"))
    model, tok = load_model(cfg)
    policy = HFPolicy(model, tok, device=cfg.model.device, seed=cfg.train.seed, name="learner")
    rollouts = Rollouts(cfg, policy, Path(run_dir or "runs/unnamed"))
    rollout_fn: Any = rollouts
    if cfg.model.backend == "vllm":  # the learner's seats sample from a vLLM engine
        from sparring.rollout.synced import EngineRollouts

        lora = cfg.lora.enabled and cfg.model.vllm_options.get("enable_lora")
        engine = _vllm_engine(cfg, policy.model, tok, "learner", [cfg.lora.r] if lora else [])
        rollout_fn = EngineRollouts(rollouts, engine, policy.model)
    chosen = model_precision(cfg, model)
    return RunParts(model=policy.model, tokenizer=tok, policy=policy, rollout_fn=rollout_fn,
                    eval_fn=make_eval_fn(cfg, rollouts.arena, policy),
                    stateful={"rollouts": rollouts}, pad_id=policy.pad_id,
                    precision=f"{chosen.mode} ({chosen.reason})")


def _build_several(cfg: Config, run_dir: Path) -> RunParts:
    """`build` with several policies (module docstring)."""
    from sparring.train.config import policy_config
    from sparring.train.policies import policy_models

    names = list(cfg.policies)
    if cfg.lora.shared_base:
        base, tok = load_model(cfg)
        toks = dict.fromkeys(names, tok)
        with torch.random.fork_rng(devices=[]):  # the adapters' initial weights
            torch.manual_seed(cfg.train.seed)
            models = policy_models(cfg, base)
    else:
        loaded = {n: load_model(policy_config(cfg, n)) for n in names}
        toks = {n: t for n, (_, t) in loaded.items()}
        models = {n: m for n, (m, _) in loaded.items()}
    adapter = cfg.lora.shared_base
    policies = {n: HFPolicy(models[n], toks[n], device=policy_config(cfg, n).model.device,
                            seed=cfg.train.seed, name=n, adapter=n if adapter else None)
                for n in names}
    rollouts = Rollouts(cfg, policies, run_dir)
    rollout_fn: Any = rollouts
    if cfg.model.backend == "vllm":  # one engine, an adapter per policy (checked: shared base)
        from sparring.rollout.synced import EngineRollouts

        engine = _vllm_engine(cfg, base, tok, "policies",
                              [policy_config(cfg, n).lora.r for n in names])
        rollout_fn = EngineRollouts(rollouts, engine, models[names[0]], adapters=names)
    first = policies[names[0]]
    return RunParts(model={n: p.model for n, p in policies.items()}, tokenizer=first.tokenizer,
                    policy=first, rollout_fn=rollout_fn,
                    eval_fn=make_eval_fn(cfg, rollouts.arena, policies),
                    stateful={"rollouts": rollouts}, pad_id=first.pad_id, policies=policies,
                    precision=", ".join(f"{n}: {precision.mode_of(p.model)}"
                                        for n, p in policies.items()))


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

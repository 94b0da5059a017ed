"""Wire a `Config` into the parts of a run: ``build(cfg, run_dir) -> RunParts``.

`load_model` builds the policy model (in ``model.dtype``) and its tokenizer; `build` adds the
rollout schedule (`sparring.rollout.schedule.Rollouts`) and the periodic evaluation
(`sparring.eval.periodic.make_eval_fn`). ``sparring train`` passes the parts to
`sparring.train.loop.train`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparring.eval.periodic import EvalFn, make_eval_fn
from sparring.policy.hf import HFPolicy
from sparring.rollout.schedule import Rollouts
from sparring.train.config import Config


@dataclass
class RunParts:
    """What a run is made of. ``stateful``: objects with ``state_dict``/``load_state_dict``
    saved in every checkpoint (the rollouts' opponent pool)."""

    model: Any
    tokenizer: Any
    policy: HFPolicy
    rollout_fn: Rollouts
    eval_fn: EvalFn
    stateful: dict[str, Any] = field(default_factory=dict)
    pad_id: int = 0


def load_model(cfg: Config) -> tuple[Any, Any]:
    """``model.name``: 'tiny' (built from ``model.options``), 'smollm2', or an HF folder/id;
    the weights in ``model.dtype``."""
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


def build(cfg: Config, run_dir: str | Path | None = None) -> RunParts:
    """The model, policy, rollouts and evaluation of ``cfg``; pool snapshots go under
    ``run_dir`` (default ``runs/unnamed``)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # pool snapshots save/load every few steps
    if not cfg.envs:
        raise ValueError("config has no envs: add at least one, e.g. envs: [{name: tictactoe}]")
    model, tok = load_model(cfg)
    policy = HFPolicy(model, tok, device=cfg.model.device, seed=cfg.train.seed, name="learner")
    rollouts = Rollouts(cfg, policy, Path(run_dir or "runs/unnamed"))
    return RunParts(model=policy.model, tokenizer=tok, policy=policy, rollout_fn=rollouts,
                    eval_fn=make_eval_fn(cfg, rollouts.arena, policy),
                    stateful={"rollouts": rollouts}, pad_id=policy.pad_id)

"""Export a trained policy as a standard Hugging Face model folder: ``sparring export RUN_DIR OUT``.

The policy of a run (its latest checkpoint) or of one checkpoint is rebuilt as `eval` and
`play` rebuild it (`sparring.train.restore.load_policy`: the run's config, safetensors
weights, nothing unpickled); LoRA adapters are merged into the base weights
(``merge_and_unload``), so the folder is a plain causal LM: ``config.json``,
``model.safetensors`` (sharded when large), ``generation_config.json`` and the tokenizer
files with its chat template. ``AutoModelForCausalLM.from_pretrained(OUT)`` loads it, as
does any server that reads Hugging Face folders (vLLM, TGI, llama.cpp's converter). A
``sparring_export.json`` records where it came from.

The folder is written beside ``OUT`` under a temporary name and renamed into place, so an
interrupted export never leaves a half-written ``OUT``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

EXPORT_INFO = "sparring_export.json"
DTYPES = ("float32", "bfloat16", "float16")


def merged_model(model: Any) -> Any:
    """``model`` with any PEFT LoRA adapters merged into its weights (a plain transformers
    model); a model without adapters is returned as it is."""
    from sparring.train.lora import is_peft

    return model.merge_and_unload() if is_peft(model) else model


def export(source: str | Path, out_dir: str | Path, *, dtype: str | None = None,
           overwrite: bool = False, trust_remote_code: bool = False,
           policy: str | None = None) -> Path:
    """Write the policy at ``source`` (a run folder or a checkpoint folder) to ``out_dir``
    as a Hugging Face folder; ``dtype``: the weights' dtype (default: the run's
    ``model.dtype``); ``trust_remote_code``: as for `load_policy` (off: a run folder's
    config cannot make a model's own code run); ``policy``: which one of a run with
    several policies. Returns ``out_dir``."""
    from sparring.train.restore import load_policy

    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"export: dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a one-line command, not a progress display
    loaded, cfg, ckpt = load_policy(source, device="cpu", trust_remote_code=trust_remote_code,
                                    policy=policy)
    if policy is not None:  # its own model and lora sections
        from sparring.train.config import policy_config
        cfg = policy_config(cfg, policy)
    model = merged_model(loaded.model)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    tmp = out.with_name(out.name + ".exporting")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        loaded.tokenizer.save_pretrained(tmp)
        step = json.loads((ckpt / "state.json").read_text(encoding="utf-8")).get("step")
        info = {"source": str(Path(source).resolve()), "checkpoint": str(ckpt.resolve()),
                "step": step, "base_model": cfg.model.name, "lora_merged": cfg.lora.enabled,
                "dtype": dtype or cfg.model.dtype, **({"policy": policy} if policy else {})}
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


__all__ = ["EXPORT_INFO", "export", "merged_model"]

"""Export a trained policy as a standard Hugging Face model folder: ``sparring export RUN_DIR OUT``.

The policy of a run (its latest checkpoint) or of one checkpoint is rebuilt as `eval` and
`play` rebuild it (`sparring.assembly.trained.load_policy`: the run's config, safetensors
weights, nothing unpickled); LoRA adapters are merged into the base weights
(``merge_and_unload``), so the folder is a plain causal LM: ``config.json``,
``model.safetensors`` (sharded when large), ``generation_config.json`` and the tokenizer
files with its chat template. ``AutoModelForCausalLM.from_pretrained(OUT)`` loads it, as
does any server that reads Hugging Face folders (vLLM, TGI, llama.cpp's converter). A
``sparring_export.json`` records where it came from.

The folder is written beside ``OUT`` under a temporary name and renamed into place, so an
interrupted export never leaves a half-written ``OUT``. ``OUT`` may not overlap the run it
comes from (be it, hold it, or lie inside it), and ``--overwrite`` replaces only a folder an
earlier export wrote (one with ``sparring_export.json``): `check_target`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

EXPORT_INFO = "sparring_export.json"
DTYPES = ("float32", "bfloat16", "float16")


def merged_model(model: Any) -> Any:
    """``model`` with any PEFT LoRA adapters merged into its weights (a plain transformers
    model); a model without adapters is returned as it is."""
    from sparring.policy.lora import is_peft

    return model.merge_and_unload() if is_peft(model) else model


def check_target(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool) -> None:
    """Refuse an ``out_dir`` an export could destroy data with (``FileExistsError`` or
    ``ValueError`` naming the rule): one that is the run folder ``run_dir``, contains it,
    or lies inside it (a checkpoint exported into its own run, ``RUN/checkpoints``); and,
    when it exists, anything but a folder an earlier export wrote, with ``overwrite``."""
    run, out = Path(run_dir).resolve(), Path(out_dir).resolve()
    if out == run or run.is_relative_to(out) or out.is_relative_to(run):
        where = ("is the run folder" if out == run else "contains the run folder"
                 if run.is_relative_to(out) else "lies inside the run folder")
        raise ValueError(f"export: {out_dir} {where} {run}; export to a folder outside the run")
    if not Path(out_dir).exists():
        return
    if not overwrite:
        raise FileExistsError(f"{out_dir} already exists (pass --overwrite to replace it)")
    if not (Path(out_dir).is_dir() and (Path(out_dir) / EXPORT_INFO).is_file()):
        raise FileExistsError(f"{out_dir} exists and is not an earlier export (it has no "
                              f"{EXPORT_INFO}); --overwrite replaces only an export: choose "
                              "another folder or remove it yourself")


def export(source: str | Path, out_dir: str | Path, *, dtype: str | None = None,
           overwrite: bool = False, trust_remote_code: bool = False,
           policy: str | None = None, average: bool = False) -> Path:
    """Write the policy at ``source`` (a run folder or a checkpoint folder) to ``out_dir``
    as a Hugging Face folder; ``dtype``: the weights' dtype (default: the run's
    ``model.dtype``); ``trust_remote_code``: as for `load_policy` (off: a run folder's
    config cannot make a model's own code run); ``policy``: which one of a run with
    several policies; ``average``: the run's magnet, an average of its recent policies
    (`sparring.assembly.trained.load_magnet`). Returns ``out_dir``."""
    from sparring.assembly.trained import load_policy

    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"export: dtype={dtype!r}; allowed: {', '.join(DTYPES)}")
    out = Path(out_dir)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a one-line command, not a progress display
    loaded, cfg, ckpt = load_policy(source, device="cpu", trust_remote_code=trust_remote_code,
                                    policy=policy, average=average)
    check_target(ckpt.parent.parent, out, overwrite=overwrite)  # the checkpoint's run
    if policy is not None:  # its own model and lora sections
        from sparring.config import policy_config
        cfg = policy_config(cfg, policy)
    model = merged_model(loaded.model)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.exporting-"))  # a new name
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        loaded.tokenizer.save_pretrained(tmp)
        from sparring.storage.bounded import read_json_bounded

        step = read_json_bounded(ckpt / "state.json", what="checkpoint state").get("step")
        info = {"source": str(Path(source).resolve()), "checkpoint": str(ckpt.resolve()),
                "step": step, "base_model": cfg.model.name, "lora_merged": cfg.lora.enabled,
                "dtype": dtype or cfg.model.dtype, **({"policy": policy} if policy else {}),
                **({"average": True} if average else {})}
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


__all__ = ["EXPORT_INFO", "check_target", "export", "merged_model"]

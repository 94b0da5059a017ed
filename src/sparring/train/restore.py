"""Load a trained policy back from a run folder or one of its checkpoints (for eval, play).

``RUN_DIR`` takes its latest checkpoint; ``RUN_DIR/checkpoints/step-N`` that one. The model
is rebuilt from the run's ``config.yaml`` and its weights (or LoRA adapter) are loaded from
safetensors; nothing is unpickled.
"""

from __future__ import annotations

from pathlib import Path

from sparring.policy.hf import HFPolicy
from sparring.train.checkpoint import latest_checkpoint, load_weights
from sparring.train.config import Config, load_config
from sparring.train.lora import apply_lora, load_trainable_state
from sparring.train.setup import load_model


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) for a run folder or a checkpoint folder."""
    p = Path(path)
    if (p / "state.json").exists():
        return p.parent.parent, p
    ckpt = latest_checkpoint(p)
    if ckpt is None:
        raise FileNotFoundError(f"{p} is neither a checkpoint nor a run folder with checkpoints")
    return p, ckpt


def load_policy(path: str | Path, device: str | None = None) -> tuple[HFPolicy, Config, Path]:
    """The policy saved at ``path`` (a run folder or checkpoint), its config and checkpoint."""
    run, ckpt = find_checkpoint(path)
    cfg = load_config(run / "config.yaml")
    model, tok = load_model(cfg)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
        load_trainable_state(model, load_weights(ckpt, "adapter"))
    else:
        load_trainable_state(model, load_weights(ckpt, "model"))
    policy = HFPolicy(model, tok, device=device or cfg.model.device, seed=cfg.train.seed,
                      name=f"{run.name}@{ckpt.name}")
    return policy, cfg, ckpt

"""LoRA through PEFT: wrapping a model, and the weights a checkpoint holds for it."""

from __future__ import annotations

from torch import Tensor, nn

from sparring.train.config import LoraConfig


def apply_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Wrap ``model`` with PEFT LoRA adapters (adapters are injected in place)."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError as e:  # pragma: no cover - peft is a declared extra
        raise ImportError("lora.enabled=true needs `peft`: pip install 'sparring[lora]'") from e
    pc = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                        target_modules=list(cfg.target_modules), bias="none")
    return get_peft_model(model, pc)


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def trainable_state(model: nn.Module) -> dict[str, Tensor]:
    """The weights a checkpoint must hold: the adapter with LoRA, else the whole model."""
    if is_peft(model):
        from peft import get_peft_model_state_dict
        return get_peft_model_state_dict(model)
    return model.state_dict()


def load_trainable_state(model: nn.Module, state: dict[str, Tensor]) -> None:
    if is_peft(model):
        from peft import set_peft_model_state_dict
        res = set_peft_model_state_dict(model, state)
        bad = [k for k in getattr(res, "unexpected_keys", []) if "lora" in k]
        if bad:
            raise KeyError(f"adapter weights do not match the model: {bad[:5]}")
        return
    model.load_state_dict(state)

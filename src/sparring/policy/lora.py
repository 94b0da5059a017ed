"""LoRA through PEFT: wrapping a model, and the weights a checkpoint holds for it.

Several policies on one base (``lora.shared_base``): `shared_adapters` gives one PEFT model
with an adapter per policy, named after it; the base stays frozen. Only one adapter is
active at a time (`use_adapter`), so whatever runs a policy's forward activates its adapter
first (`sparring.policy.hf.HFPolicy` and `sparring.train.learner.Learner` with ``adapter=``).
The opponent pool's snapshots of such a policy are adapters too (`save_adapter`, in PEFT's
format), added to the same model frozen (`load_frozen_adapter`) and deleted when the pool
drops them (`delete_adapter`). Activating an adapter sets ``requires_grad``: on for the
active adapter's weights unless it is frozen, off for every other adapter's; adding or
deleting a snapshot leaves that rule in place, so a learner that activates its adapter
trains exactly its weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from sparring.extras import import_extra
from sparring.policy.hf import activate_adapter, is_adapter_weight  # noqa: F401 (re-exported)

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PEFT's name, as its loader expects


class LoraSettings(Protocol):
    """What the adapters are made of (the ``lora`` section, `sparring.config.LoraConfig`)."""

    r: int
    alpha: float
    dropout: float
    target_modules: list[str]
    last_layers: int


def adapted_layers(model: nn.Module, last_layers: int) -> list[int] | None:
    """Indices of the transformer layers that get adapters under ``lora.last_layers``:
    the last ``last_layers`` of the model's ``config.num_hidden_layers`` (None: all)."""
    if last_layers == 0:
        return None
    total = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if total is None:
        raise ValueError("lora.last_layers needs a model whose config has "
                         "num_hidden_layers (a transformers causal LM)")
    if last_layers > total:
        raise ValueError(f"lora.last_layers={last_layers}, but the model has {total} layers")
    return list(range(total - last_layers, total))


def _peft_config(cfg: LoraSettings, model: nn.Module):
    PeftLoraConfig = import_extra("peft", "lora", "lora.enabled=true").LoraConfig  # noqa: N806
    return PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=list(cfg.target_modules), bias="none",
                          layers_to_transform=adapted_layers(model, cfg.last_layers))


def apply_lora(model: nn.Module, cfg: LoraSettings) -> nn.Module:
    """Wrap ``model`` with PEFT LoRA adapters (adapters are injected in place)."""
    from peft import get_peft_model

    return get_peft_model(model, _peft_config(cfg, model))


def shared_adapters(model: nn.Module, configs: Mapping[str, LoraSettings]) -> nn.Module:
    """One PEFT model over ``model`` with an adapter per entry of ``configs`` (named by its
    key, in order; LoRA's A matrices drawn from torch's RNG in that order, B zero), the base
    weights frozen; the first adapter is active."""
    from peft import get_peft_model

    names = list(configs)
    peft_model = get_peft_model(model, _peft_config(configs[names[0]], model),
                                adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, _peft_config(configs[name], model))
    peft_model.set_adapter(names[0])
    return peft_model


def use_adapter(model: nn.Module, adapter: str | None) -> None:
    """Make ``adapter`` the active one of ``model`` (None: nothing to do). PEFT also turns
    ``requires_grad`` on for its weights (off for a frozen adapter's) and off for the other
    adapters'."""
    if adapter is not None and model.active_adapter != adapter:
        activate_adapter(model, adapter)


def save_adapter(model: nn.Module, adapter: str, folder: str | Path) -> None:
    """Adapter ``adapter`` of ``model`` alone, in PEFT's format: ``adapter_config.json`` and
    ``adapter_model.safetensors`` (its LoRA weights, keys without the adapter's name; a full
    disk is the `OSError` it stands for)."""
    from sparring.storage.folders import write_tensors

    model.peft_config[adapter].save_pretrained(str(folder))
    write_tensors(Path(folder) / ADAPTER_WEIGHTS, trainable_state(model, adapter))


def load_frozen_adapter(model: nn.Module, folder: str | Path, name: str, device: Any) -> None:
    """`save_adapter`'s ``folder`` added to ``model`` as adapter ``name`` (one already there
    replaced), on ``device``, frozen: never trainable, even when active. The active adapter
    stays active, ``requires_grad`` follows the module docstring's rule, and torch's RNG is
    left as it was (PEFT draws the new adapter's initial weights before loading it), so a
    resumed run, which loads snapshots at other times, repeats an uninterrupted one. PEFT
    puts the model in eval mode: the caller restores the mode it wants."""
    if name in model.peft_config:
        delete_adapter(model, name)
    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.load_adapter(str(folder), adapter_name=name, is_trainable=False,
                           torch_device=str(device))
    activate_adapter(model, model.active_adapter)  # the rule, whatever PEFT's version did


def delete_adapter(model: nn.Module, name: str) -> None:
    """Delete adapter ``name`` from ``model``, its weights freed; when it is the active one,
    the model's first other adapter is activated first (`use_adapter`)."""
    if model.active_adapter == name:
        activate_adapter(model, next(a for a in model.peft_config if a != name))
    model.delete_adapter(name)


def frozen_adapters(model: nn.Module) -> set[str]:
    """The adapters of ``model`` that never train (`load_frozen_adapter`'s)."""
    return {n for n, c in getattr(model, "peft_config", {}).items()
            if getattr(c, "inference_mode", False)}


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def merged_state(model: nn.Module) -> dict[str, Tensor]:
    """The weights of the plain model that ``model`` computes: every LoRA-wrapped layer's
    base weight plus its active adapters' ``delta = scale * B @ A``, under the layer's own
    name (PEFT's ``base_layer`` renaming undone), the adapter weights dropped; ``model``
    unchanged (a model without adapters: its state dict)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft, no adapters
        return dict(model.state_dict())
    out: dict[str, Tensor] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, LoraLayer):
            base = mod.get_base_layer()
            w = base.weight.detach().clone()
            for a in mod.active_adapters:
                if a in mod.lora_A:
                    w += mod.get_delta_weight(a).to(w.dtype)
            out[f"{name}.weight"] = w
            if getattr(base, "bias", None) is not None:
                out[f"{name}.bias"] = base.bias.detach().clone()
    for k, v in model.state_dict().items():
        if ".base_layer." not in k and ".lora_" not in k:
            out.setdefault(k, v)
    return out


def trainable_state(model: nn.Module, adapter: str | None = None) -> dict[str, Tensor]:
    """The weights a checkpoint must hold: the adapter with LoRA (``adapter``: which one of
    a shared base; its keys carry no adapter name); the parameters that train, of a model
    with frozen ones (a frozen network under a trained head, `sparring.policy.heads`: the
    rest is the model as ``model.name`` loads it, which `frozen_sha256` identifies); else
    the whole model."""
    if is_peft(model):
        from peft import get_peft_model_state_dict
        return get_peft_model_state_dict(model, adapter_name=adapter or "default")
    if has_frozen_weights(model):
        return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    return model.state_dict()


def has_frozen_weights(model: nn.Module) -> bool:
    """Some weight of ``model`` does not train (a frozen network under a trained head)."""
    return any(not p.requires_grad for p in model.parameters())


def frozen_sha256(model: nn.Module, held: Collection[str]) -> str:
    """The sha256 of ``model``'s state that ``held`` (the names a checkpoint holds) leaves
    out: each entry's name, dtype, shape and bytes, in name order. Equal digests: the
    same frozen weights, so a checkpoint of the trained ones restores the same model."""
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        if name in held:
            continue
        t = value.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b"")
    return digest.hexdigest()


def load_parameters(model: nn.Module, values: Mapping[str, Tensor]) -> None:
    """Copy ``values`` into ``model``'s parameters of the same names (e.g. a magnet's EMA of
    the trained ones: `Learner.state_dict`); a name the model lacks is a KeyError."""
    params = dict(model.named_parameters())
    unknown = [k for k in values if k not in params]
    if unknown:
        raise KeyError(f"{len(unknown)} weights do not match the model's parameters, e.g. "
                       f"{unknown[0]!r}")
    with torch.no_grad():
        for k, v in values.items():
            params[k].copy_(v)


def load_trainable_state(model: nn.Module, state: dict[str, Tensor],
                         adapter: str | None = None, *, frozen: str | None = None) -> None:
    """Load what `trainable_state` saved (into adapter ``adapter`` of a shared base). A
    state that holds some of a plain model's weights only (the trained ones) needs
    ``frozen``, the `frozen_sha256` recorded when it was saved: the model's other weights
    must be those it trained beside (a ValueError that says so otherwise; nothing loaded)."""
    if is_peft(model):
        from peft import set_peft_model_state_dict
        res = set_peft_model_state_dict(model, state, adapter_name=adapter or "default")
        bad = [k for k in getattr(res, "unexpected_keys", []) if "lora" in k]
        if bad:
            raise KeyError(f"adapter weights do not match the model: {bad[:5]}")
        return
    own = model.state_dict()
    unknown = [k for k in state if k not in own]
    if unknown or len(state) == len(own):
        model.load_state_dict(state)  # a whole model, or a KeyError naming what differs
        return
    if frozen is None:
        raise ValueError(f"the weights hold {len(state)} of the model's {len(own)} entries "
                         "and no digest of the others: not a whole model, nor the trained "
                         "weights of one with frozen weights")
    found = frozen_sha256(model, state.keys())
    if found != frozen:
        raise ValueError(
            f"the checkpoint holds the trained weights only ({len(state)} of {len(own)}); "
            f"the rest must be the frozen weights they trained with (sha256 {frozen[:12]}), "
            f"but the model as loaded here has others ({found[:12]}): load it with the "
            "base model of its run (model.name and its options as the run had them)")
    model.load_state_dict(state, strict=False)

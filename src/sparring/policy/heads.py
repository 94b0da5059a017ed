"""Policy heads (``model.head``): what of the model trains and what its output layer reads.

``model.head`` is ``{name: ..., option: value}``, one of `HEADS` (``sparring list heads``):

* ``lm_head`` (the default): the model's own output layer, trained with the rest of the
  network; ``body_lr_scale`` below 1 trains everything but the output layer at that
  fraction of the lr (the output layer untied from the input embeddings first);
* ``frozen_features``: the network frozen, its output layer (untied) trained on the
  network's features as they start: a linear softmax over the move tokens. ``cache``
  keeps each context's features once computed (`sparring.policy.feature_cache`), so
  sampling, the learner, the KL reference, the pool's snapshots and the evaluations apply
  the head to stored features; ``center`` and ``whiten`` make the head's change read the
  features centered (and whitened) by their statistics over the run's first batch.
* ``top_layers``: the last ``layers`` transformer layers and the final norm train (their
  own weights, or LoRA adapters on them with ``lora.last_layers`` at most ``layers``),
  everything below them frozen. ``cache`` keeps the frozen layers' output per context
  (`sparring.policy.layer_cache`), so a step runs and back-propagates through the trained
  layers only, on stored states.

Why a recipe would freeze the body: under RL the network can merge inputs that the reward
does not yet tell apart, and a pull on the output distribution cannot split them again
(docs/benchmarks.md, "Two-policy signalling"); kept features are the premise of linear
probing (Kumar et al., "Fine-Tuning can Distort Pretrained Features and Underperform
Out-of-Distribution", ICLR 2022, train the head first for this reason).

The model surgery both need lives here too: `output_layer_names`, `untie_output_layer`
(from `sparring.assembly.parts.load_model`, where the head learns apart from the body) and
`freeze_body`. A head's `attach` gives the learner what it keeps while it trains
(`HeadState`: the feature cache, whose transform the first update fixes and checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from sparring.policy.feature_cache import FeatureCache, attach_feature_cache
from sparring.policy.layer_cache import LayerCache
from sparring.policy.top_layers import decoder_parts
from sparring.registry import Registry, build_component, option

HEADS = Registry("head")


class Head:
    """What every head has (module docstring); subclasses are frozen dataclasses whose
    fields are their options."""

    name = ""
    body_lr_scale = 1.0  # the lr of every trained weight but the output layer, as a fraction

    def freeze(self, model: nn.Module, lora: bool = False) -> None:
        """Turn ``requires_grad`` off for what this head keeps frozen (``lora``: the model
        carries LoRA adapters, whose own freezing stands)."""

    def attach(self, model: nn.Module, *readers: nn.Module) -> HeadState:
        """What the learner of ``model`` keeps while it trains (``readers``: models with the
        same frozen network, e.g. the KL reference's copy, that read its features too)."""
        return HeadState(None)


@HEADS.register("lm_head")
@dataclass(frozen=True, kw_only=True)
class LMHead(Head):
    """The model's own output layer, trained with the rest of the network."""

    name = "lm_head"
    body_lr_scale: float = option(
        1.0, "lr of every trained weight but the output layer, as a fraction of optim.lr "
        "(1: one lr for all); below 1 the output layer is untied from the input embeddings "
        "(its own copy). Not with LoRA, which trains no output layer; a frozen body is "
        "frozen_features", gt=0, le=1)


@HEADS.register("frozen_features", source="linear probing (Kumar et al. 2022)")
@dataclass(frozen=True, kw_only=True)
class FrozenFeatures(Head):
    """A linear head over the frozen network's features: only the output layer trains."""

    name = "frozen_features"
    body_lr_scale = 0.0
    cache: int = option(
        65536, "contexts whose last hidden states are kept, each computed once on its own, so "
        "sampling, the learner, the KL reference and evaluations apply the head to stored "
        "features instead of running the network (sparring.policy.feature_cache); 0: none",
        ge=0)
    center: bool = option(
        False, "the head's change since the start reads the features minus their mean over "
        "the run's first batch (the starting policy is unchanged; the head's gradient leaves "
        "out what all positions share, which dominates a real model's features; "
        "bench/linear_probe.py --center); needs the cache")
    whiten: float = option(
        0.0, "the head's change reads the features centered and whitened by their covariance "
        "over the run's first batch, shrunk towards the identity by this fraction of the "
        "mean variance (ZCA, centering included; a linear policy fits ~10x faster: "
        "bench/linear_probe.py --whiten); 0: off; needs the cache", ge=0)

    def freeze(self, model: nn.Module, lora: bool = False) -> None:
        freeze_body(model)

    def __post_init__(self) -> None:
        if (self.center or self.whiten) and not self.cache:
            raise ValueError("center and whiten transform the cached features; they need "
                             "cache above 0")

    @property
    def transforms(self) -> bool:
        """Whether the head reads transformed features (center or whiten)."""
        return bool(self.center or self.whiten)

    def feature_cache(self, model: nn.Module) -> FeatureCache | None:
        """A feature cache of ``model``'s frozen network with this head's transform (None
        without a cache)."""
        if not self.cache:
            return None
        return FeatureCache(model, self.cache, center=self.center, whiten=self.whiten)

    def attach(self, model: nn.Module, *readers: nn.Module) -> HeadState:
        features = self.feature_cache(model)
        if features is not None:
            for m in (model, *readers):
                attach_feature_cache(m, features)
        return HeadState(features)


@HEADS.register("top_layers")
@dataclass(frozen=True, kw_only=True)
class TopLayers(Head):
    """The last ``layers`` transformer layers (and the final norm) train; the rest is
    frozen, its output per context cached."""

    name = "top_layers"
    layers: int = option(
        1, "transformer layers that train, counted from the top (their own weights; with "
        "LoRA, the adapters on them: lora.last_layers at most this); the output layer and "
        "everything below them stay frozen", ge=1)
    cache: int = option(
        4096, "prompts whose frozen-layer outputs are kept (with their continuations' "
        "tokens), each computed once on its own, so sampling, the learner, the KL reference "
        "and evaluations run the trained layers only (sparring.policy.layer_cache); 0: "
        "none, every pass runs the whole network", ge=0)
    keys_values: bool = option(
        True, "the top layer's key and value projections and its input norm train; false: "
        "they stay frozen (layers: 1 only), so the cache keeps that layer's keys and values "
        "at every position too, and a step runs it at each context's last position only "
        "(its query, output projection and MLP train)")

    def __post_init__(self) -> None:
        if not self.keys_values and self.layers != 1:
            raise ValueError(f"keys_values: false needs layers: 1 (got {self.layers}); the "
                             "layers under the top one would change its keys and values")

    def freeze(self, model: nn.Module, lora: bool = False) -> None:
        """Without LoRA, ``requires_grad`` off for every weight outside the top layers and
        the final norm; with it, check that no adapter lies below them."""
        allowed = top_layer_names(model, self.layers, self.keys_values)
        for n, p in model.named_parameters():
            if n in allowed:
                continue
            if lora and p.requires_grad:
                raise ValueError(f"model.head top_layers (layers={self.layers}) trains the "
                                 f"top layers only, but {n} is a trained adapter below them; "
                                 f"set lora.last_layers to at most {self.layers}")
            p.requires_grad_(False)

    def attach(self, model: nn.Module, *readers: nn.Module) -> HeadState:
        if not self.cache:
            return HeadState(None)
        states = LayerCache(model, self.layers, self.cache, fixed_keys=not self.keys_values)
        for m in (model, *readers):
            attach_feature_cache(m, states)
        return HeadState(states)


def top_layer_names(model: nn.Module, layers: int, keys_values: bool = True) -> set[str]:
    """Names of the parameters of ``model``'s last ``layers`` decoder layers and final norm
    (without the top layer's key and value projections and input norm unless
    ``keys_values``)."""
    parts = decoder_parts(model)
    if not 1 <= layers <= len(parts.layers):
        raise ValueError(f"model.head top_layers: layers={layers}; the model has "
                         f"{len(parts.layers)} (1..{len(parts.layers)})")
    ids = {id(p) for layer in list(parts.layers)[-layers:] for p in layer.parameters()}
    ids |= {id(p) for p in parts.norm.parameters()}
    if not keys_values:
        top = parts.layers[-1]
        for module in (top.self_attn.k_proj, top.self_attn.v_proj, top.input_layernorm):
            ids -= {id(p) for p in module.parameters()}
    return {n for n, p in model.named_parameters() if id(p) in ids}


class HeadState:
    """What a head keeps while a learner trains: the feature cache of a frozen network
    (``features``: a `FeatureCache` or a `LayerCache`; None without one), a feature
    transform fixed before the first update and checkpointed with the learner
    (``feature_center``)."""

    def __init__(self, features: FeatureCache | LayerCache | None):
        self.features = features

    def before_update(self) -> None:
        if self.features is not None:
            self.features.fix_transform()  # from the first batch's features, once

    def state_dict(self) -> dict[str, Any]:
        center = None if self.features is None else self.features.center_state()
        return {} if center is None else {"feature_center": center}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.features is not None and "feature_center" in state:
            self.features.load_center_state(state["feature_center"])


def build_head(spec: dict[str, Any]) -> Head:
    """The head ``model.head`` names (``{name: ..., option: value}``); ValueError saying what
    is wrong."""
    return build_component(HEADS, spec)


def output_layer_names(model: nn.Module) -> set[str]:
    """Names (as ``named_parameters`` gives them) of the output layer's parameters."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings "
                         "(get_output_embeddings() is None); model.head needs one")
    ids = {id(p) for p in head.parameters()}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def untie_output_layer(model: nn.Module) -> bool:
    """Give a head tied to the input embeddings (SmolLM2, Qwen2.5-0.5B) its own copy of the
    matrix, so that it can learn at its own lr while the input embeddings stay with the
    body (frozen under ``frozen_features``: else the head's updates would change the body's
    input, and the backward would run through the whole network to reach the embedding).
    True if it was tied. The model's config says so too, so nothing ties them again."""
    head, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or inputs is None or head.weight is not inputs.weight:
        return False
    head.weight = nn.Parameter(inputs.weight.detach().clone(),
                               requires_grad=inputs.weight.requires_grad)
    for config in {id(c): c for c in (getattr(model, "config", None),
                                      getattr(getattr(model, "config", None),
                                              "get_text_config", lambda: None)())
                   if c is not None}.values():
        config.tie_word_embeddings = False
    return True


def freeze_body(model: nn.Module) -> None:
    """``requires_grad`` off for every parameter outside the output layer."""
    head = output_layer_names(model)
    for n, p in model.named_parameters():
        if n not in head:
            p.requires_grad_(False)


__all__ = ["HEADS", "FrozenFeatures", "Head", "HeadState", "LMHead", "TopLayers",
           "build_head", "freeze_body", "output_layer_names", "top_layer_names",
           "untie_output_layer"]

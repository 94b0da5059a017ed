"""``optim.body_lr_scale``: the output layer learns at the optimizer's lr, the rest of the
network at a fraction of it.

The output layer is the model's ``get_output_embeddings()`` (the LM head). A head tied to
the input embeddings is untied when the model is built for such a run
(`untie_output_layer`, from `sparring.assembly.parts.load_model`), so the input embeddings
belong to the body. Every other
trained weight (the body: embeddings, attention, MLPs, norms) learns at ``body_lr_scale *
lr``; at 0 the body is frozen (``requires_grad`` off, so the backward pass stops at the
head and gradient clipping sees the head alone), and the policy is a linear softmax over
the features the network had at the start. Why a recipe would want that: under RL the
body can merge inputs that the reward does not yet tell apart, and a pull on the output
distribution cannot split them again (docs/benchmarks.md, "Two-policy signalling");
kept features are the premise of linear probing (Kumar et al., "Fine-Tuning can Distort
Pretrained Features and Underperform Out-of-Distribution", ICLR 2022, train the head
first for this reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn


def output_layer_names(model: nn.Module) -> set[str]:
    """Names (as ``named_parameters`` gives them) of the output layer's parameters."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings "
                         "(get_output_embeddings() is None); optim.body_lr_scale needs one")
    ids = {id(p) for p in head.parameters()}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def untie_output_layer(model: nn.Module) -> bool:
    """Give a head tied to the input embeddings (SmolLM2, Qwen2.5-0.5B) its own copy of the
    matrix, so that it can learn at its own lr while the input embeddings stay with the
    body (frozen at ``body_lr_scale`` 0: else the head's updates would change the body's
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


def param_groups(model: nn.Module, trained: set[str], body_lr_scale: float,
                 full_lr: Iterable[nn.Parameter] = ()) -> list[dict[str, Any]]:
    """Optimizer groups of the ``trained`` weights and of ``full_lr`` (e.g. a separate
    critic's): a group at scale 1 (everything when ``body_lr_scale`` is 1, else the output
    layer and ``full_lr``), then the body at ``body_lr_scale`` if it has weights to train
    (`sparring.schedules.LRSchedule` multiplies each group's ``lr_scale`` in)."""
    params = [(n, p) for n, p in model.named_parameters() if n in trained]
    head = {n for n, _ in params} if body_lr_scale == 1 else output_layer_names(model)
    groups = [{"params": [p for n, p in params if n in head] + list(full_lr), "lr_scale": 1.0}]
    body = [p for n, p in params if n not in head]
    if body:
        groups.append({"params": body, "lr_scale": body_lr_scale})
    return groups


__all__ = ["freeze_body", "output_layer_names", "param_groups", "untie_output_layer"]

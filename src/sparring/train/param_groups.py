"""The optimizer groups of a head's ``body_lr_scale`` (``model.head``,
`sparring.policy.heads`): the output layer learns at the optimizer's lr, the rest of the
network at a fraction of it.

The output layer is the model's ``get_output_embeddings()`` (the LM head). A head tied to
the input embeddings is untied when the model is built for such a run
(`untie_output_layer`, from `sparring.assembly.parts.load_model`), so the input embeddings
belong to the body. Every other trained weight (the body: embeddings, attention, MLPs,
norms) learns at ``body_lr_scale * lr``; at 0 (``frozen_features``) the body is frozen
(`freeze_body`: ``requires_grad`` off, so the backward pass stops at the head and gradient
clipping sees the head alone), and the policy is a linear softmax over the features the
network had at the start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from sparring.policy.heads import freeze_body, output_layer_names, untie_output_layer


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

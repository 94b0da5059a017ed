"""Value functions for estimators that need ``batch.values`` (gae, turn_gae); the pieces
(`ValueHead`, `critic_body`, `last_hidden`) are shared with ArCHer's utterance critic
(`sparring.critic.archer`).

* ``head``: a small MLP on the policy's last hidden state (shared trunk; the value loss
  also trains the trunk).
* ``separate``: a copy of the initial model with its own MLP head (no shared weights).

The last hidden state is the input of the model's ``lm_head`` (`sparring.policy.hidden`); the
head reads the policy's own forward (`token_logprobs_and_hidden`, shared prompts and all),
so it costs no second pass.
Alignment matches `token_logprobs`: ``values[:, t] = V(context ids[<t])``, the value of
the state in which token ``t`` was generated; ``values[:, 0] = 0``.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from sparring.policy.hidden import capture_hidden, output_embedding, shift_right


class ValueHead(nn.Module):
    """``hidden [n, T, H] -> [n, T]``: Linear(H, w) -> tanh -> Linear(w, 1)."""

    def __init__(self, hidden_size: int, width: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.Tanh(), nn.Linear(width, 1))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.net(hidden.float()).squeeze(-1)


def critic_body(policy: nn.Module, kind: str) -> nn.Module | None:
    """The critic's own model for ``kind='separate'`` (a trainable copy of ``policy``: all its
    weights train, even when the policy uses LoRA), None for ``kind='head'``."""
    if kind not in ("head", "separate"):
        raise ValueError(f"unknown critic kind {kind!r}; known: head, separate")
    if kind == "head":
        return None
    body = copy.deepcopy(policy)
    for p in body.parameters():
        p.requires_grad_(True)
    return body


def last_hidden(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """``model``'s last hidden state ``[n, T, H]`` (the input of its lm_head)."""
    with capture_hidden(model) as hs:
        model(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False)
    return hs[-1]


class Critic(nn.Module):
    """A value head on the policy (``kind='head'``) or on its own model copy (``'separate'``)."""

    def __init__(self, policy: nn.Module, kind: str = "head", width: int = 64):
        super().__init__()
        self.body = critic_body(policy, kind)
        self.kind = kind
        self.head = ValueHead(output_embedding(policy).in_features, width)

    def values_from_hidden(self, hidden: Tensor) -> Tensor:
        """Values ``[n, T]`` from the hidden states of
        `sparring.policy.forward.token_logprobs_and_hidden` (``hidden[:, t]``: the state of
        the context before token ``t``); ``values[:, 0] = 0``."""
        v = self.head(hidden)
        return torch.cat([torch.zeros_like(v[:, :1]), v[:, 1:]], 1)

    def separate_values(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Values from the separate model (``kind='separate'`` only)."""
        assert self.body is not None
        return shift_right(self.head(last_hidden(self.body, input_ids, attention_mask)))

"""The last hidden state of a causal LM: the input of its lm_head, read with a forward
pre-hook, so the forward that gives the log-probs is not changed (a value head reads it:
`sparring.critic.value_head`, `sparring.policy.forward.token_logprobs_and_hidden`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


def output_embedding(model: torch.nn.Module) -> torch.nn.Module:
    """``model``'s lm_head (its input is the last hidden state)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) "
                         "to read the last hidden state from")
    return head


@contextmanager
def capture_hidden(model: torch.nn.Module) -> Iterator[list[Tensor]]:
    """Collect the input of ``model``'s lm_head (the last hidden state) during forwards."""
    store: list[Tensor] = []
    handle = output_embedding(model).register_forward_pre_hook(
        lambda _m, args: store.append(args[0]))
    try:
        yield store
    finally:
        handle.remove()


def shift_right(x: Tensor) -> Tensor:
    """``x [n, T, ...]`` moved one position along dim 1, 0 first: what position ``t`` computed
    (about the token after it) is filed under token ``t + 1``, as log-probs and values are."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)

"""Recompute per-token log-probs (and entropies) of given sequences with a forward pass.

Used by the learner (new log-probs for the loss) and by the consistency test against
generation-time log-probs. Position t holds log p(ids[t] | ids[<t]); position 0 is 0.
With ``temperature != 1`` the distribution is softmax(logits / temperature), the same
tempered distribution the sampler records (see policy docs).
"""

from __future__ import annotations

import torch
from torch import Tensor


def logprobs_from_logits(logits: Tensor, ids: Tensor, temperature: float = 1.0,
                         with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """``logits [n, T, V]`` predicting ``ids [n, T]`` shifted by one -> ``[n, T]`` (and entropy)."""
    lg = logits[:, :-1].float()
    if temperature != 1.0:
        lg = lg / temperature
    logz = torch.logsumexp(lg, dim=-1)
    picked = torch.gather(lg, -1, ids[:, 1:, None]).squeeze(-1)
    lp = torch.zeros(ids.shape, dtype=lg.dtype, device=ids.device)
    lp[:, 1:] = picked - logz
    ent = None
    if with_entropy:
        p = torch.softmax(lg, dim=-1)
        ent = torch.zeros_like(lp)
        ent[:, 1:] = logz - (p * lg).sum(-1)
    return lp, ent


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                   temperature: float = 1.0, with_entropy: bool = False
                   ) -> tuple[Tensor, Tensor | None]:
    """Forward ``model`` on right-padded ``input_ids [n, T]``; returns log-probs ``[n, T]``."""
    out = model(input_ids=input_ids, attention_mask=attention_mask.long(), use_cache=False)
    return logprobs_from_logits(out.logits, input_ids, temperature, with_entropy)

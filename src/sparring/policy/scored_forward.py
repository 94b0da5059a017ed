"""A Llama-family forward whose top layer runs at the scored positions only.

The learner needs a row's log-probs, entropies and value-head inputs at its action tokens
alone. Token ``t`` is predicted from the context ``ids[<t]``, so it needs the model's last
hidden state at ``t - 1``. Every layer below the top one runs at every position (the top
layer's keys and values read them), but the top layer's queries, attention output and MLP,
the final norm and the LM head run only at the K positions of each row that predict a
scored token (K the most scored tokens a row has). Rows are right-padded, so a causal mask
keeps every query off the padding. The arithmetic is the model's own, through its own
modules (`sparring.policy.top_layers`: pre-norm attention with rotary positions and grouped
K/V heads, then the MLP, each with a residual), so adapters on them (LoRA) apply;
tests/test_scored_forward.py checks it against the full forward.

On the default recipe's model (2 layers, rows of 18 tokens, 2 of them scored) an update
of distinct rows is 30% shorter (docs/results/default.md). For a large vocabulary, the LM
head and log-softmax run at K positions of a row instead of every one. Rows that share
their prompts take `sparring.policy.prefix`'s path instead, which runs only the moves
after each prompt.

Layout, as `sparring.policy.prefix.shared_prefix_logits` returns it (so the same
`logprobs_from_logits` and `to_rows` read it): ``logits [n, 1 + K, V]`` with
``logits[:, s]`` (s < K) predicting ``targets[:, s + 1]`` (``logits[:, K]`` and
``targets[:, 0]`` are placeholders), ``positions [n, K]`` the row position of
``targets[:, s + 1]`` (``T`` for a row with fewer than K scored tokens), and ``hidden
[n, 1 + K, H]`` the LM head's inputs in the layout of the logits.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sparring.policy.feature_cache import feature_cache_of
from sparring.policy.top_layers import _attend, _keys_values, _queries, decoder_parts

# decoders whose forward is `scored_logits`'s arithmetic: no embedding scale, no logit
# soft-capping, no norms beyond the pre-norms of each block
FAMILIES = ("llama", "qwen2", "qwen3")


def applies(model: nn.Module, scored: Tensor) -> bool:
    """Whether `scored_logits` runs for ``model`` on rows scored at ``scored [n, T]``: the
    model `supports` it and some token is scored, none at position 0 (which nothing
    predicts; the full forward gives it 0)."""
    return bool(scored.any()) and not bool(scored[:, :1].any()) and supports(model)


def supports(model: nn.Module) -> bool:
    """Whether `scored_logits` computes ``model``'s own forward: a Llama, Qwen2 or Qwen3
    causal LM without sliding-window attention, attention dropout while training, or a
    feature cache (a cached model reads its own states: `sparring.policy.feature_cache`)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in FAMILIES:
        return False
    if getattr(config, "use_sliding_window", False):
        return False
    if model.training and getattr(config, "attention_dropout", 0.0):
        return False
    return feature_cache_of(model) is None


def scored_positions(scored: Tensor) -> Tensor:
    """``scored [n, T]`` (true at the tokens whose log-probs are needed) -> each row's
    scored positions in order, ``[n, K]``, padded with ``T``."""
    n, T = scored.shape
    if T and bool(scored[:, 0].any()):
        raise ValueError("position 0 of a row has no context to be predicted from (`applies`)")
    at = torch.where(scored, torch.arange(T, device=scored.device), T)
    K = int(scored.sum(1).max()) if n else 0
    return at.sort(1).values[:, :K]


def allowed_at_slots(allowed: list, positions: Tensor) -> list:
    """Constrained-decoding restrictions ``{row position t: ids}`` moved to the layout's
    ``{1 + index of t among the row's positions: ids}``; positions not scored are dropped
    (nothing reads them; the padding position ``T`` is never a restriction's)."""
    out = []
    for row, d in zip(positions.tolist(), allowed, strict=True):
        slot = {t: 1 + j for j, t in enumerate(row)}
        out.append(None if d is None else {slot[t]: a for t, a in d.items() if t in slot})
    return out


def scored_logits(model: nn.Module, ids: Tensor, positions: Tensor, keep_hidden: bool = False
                  ) -> tuple[Tensor, Tensor, Tensor | None]:
    """(logits ``[n, 1 + K]``, targets ``[n, 1 + K]``, hidden or None) of right-padded
    ``ids [n, T]`` at ``positions [n, K]`` (`scored_positions`), in the module docstring's
    layout."""
    parts = decoder_parts(model)
    layers = list(parts.layers)
    n, T = ids.shape
    dev = ids.device
    x = model.get_input_embeddings()(ids)  # [n, T, H]
    rope = parts.rotary(x, torch.arange(T, device=dev)[None])
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()[None, None]
    for layer in layers[:-1]:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        keys, values = _keys_values(attn, h, rope)
        x = x + attn.o_proj(_attend(attn, _queries(attn, h, rope), keys, values, causal))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    top = layers[-1]
    attn = top.self_attn
    h = top.input_layernorm(x)
    keys, values = _keys_values(attn, h, rope)
    ctx = (positions - 1).clamp(0, T - 1)  # the context end predicting each scored token
    idx = ctx[:, :, None].expand(-1, -1, x.shape[-1])
    resid, h_q = x.gather(1, idx), h.gather(1, idx)  # [n, K, H]
    sees = torch.arange(T, device=dev)[None, None] <= ctx[:, :, None]  # [n, K, T]
    y = resid + attn.o_proj(_attend(attn, _queries(attn, h_q, parts.rotary(resid, ctx)),
                                    keys, values, sees[:, None]))
    y = parts.norm(y + top.mlp(top.post_attention_layernorm(y)))
    y = torch.cat([y, y.new_zeros(n, 1, y.shape[-1])], 1)  # [n, 1 + K, H]
    logits = model.get_output_embeddings()(y)
    targets = torch.cat([ids.new_zeros(n, 1), ids.gather(1, positions.clamp(max=T - 1))], 1)
    return logits, targets, y if keep_hidden else None


__all__ = ["FAMILIES", "allowed_at_slots", "applies", "scored_logits", "scored_positions",
           "supports"]

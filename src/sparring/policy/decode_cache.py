"""The KV cache `HFPolicy`'s decoding loop steps through, one new token per row a step.

Two kinds (``model.decode``):

* `GrowingKV` (``"dynamic"``): the model's own cache, one column longer each step;
  rows that finish are dropped from it, so later steps run only the live rows.
* `StaticKV` (``"compiled"``): every layer's keys and values preallocated as
  ``[B, H, C, D]`` with ``C`` = prompt columns + new tokens rounded up to `COLUMN_BLOCK`
  (transformers' ``StaticCache``, filled from the prompts' cache), and a decode step of
  fixed shapes compiled with ``torch.compile`` (``mode="reduce-overhead"`` on CUDA:
  the step is captured as a CUDA graph and replayed, one launch instead of hundreds).
  Finished rows stay in the batch and their outputs are ignored, so shapes never change
  within a call; a row's keys only ever meet its own earlier columns, so its logits are
  those of `GrowingKV` up to float rounding (the attention reduces over ``C`` columns,
  masked ones contributing exact zeros). A new batch size or column count compiles once
  more (automatic dynamic shapes then keep one graph for all sizes).

Both take the prompts' cache as `prefix.run_prompts` leaves it: left-padded, attention
mask ``[B, L]``, each row's next position ``[B]``. ``step(tokens)`` feeds one token per
live row (``[n]``, in the order of ``live``) and returns the next-token logits ``[n, V]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from sparring.policy.prefix import cache_argument, cache_of, select_rows, with_cache

DECODE_KINDS = ("dynamic", "compiled")
COLUMN_BLOCK = 64  # a static cache's columns are a multiple of this: fewer distinct shapes


class GrowingKV:
    """The model's dynamic KV cache; finished rows leave the batch (module docstring)."""

    def __init__(self, model: Any, cache: Any, mask: Tensor, next_pos: Tensor):
        self.model, self.cache, self.mask, self.next_pos = model, cache, mask, next_pos

    def keep(self, live: Sequence[int]) -> None:
        """Keep only batch rows ``live`` (indices into the current batch)."""
        sel = torch.as_tensor(live, device=self.mask.device)
        self.cache = select_rows(self.cache, sel)
        self.mask, self.next_pos = self.mask[sel], self.next_pos[sel]

    def step(self, tokens: Tensor) -> Tensor:
        """Feed ``tokens [n]``; returns the next-token logits ``[n, V]``."""
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask,
                         position_ids=self.next_pos[:, None], **with_cache(self.cache))
        self.cache = cache_of(out)
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1]


class StaticKV:
    """A preallocated KV cache and a compiled decode step of fixed shapes (module
    docstring). ``compile=False`` runs the same static step eagerly."""

    def __init__(self, model: Any, cache: Any, mask: Tensor, next_pos: Tensor,
                 new_tokens: int, *, compile: bool = True):
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        B, L = mask.shape
        columns = -(-(L + new_tokens) // COLUMN_BLOCK) * COLUMN_BLOCK
        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=columns)
        layers = getattr(cache, "layers", None)
        if layers is None or len(layers) != len(self.cache.layers) or any(
                type(t) is not StaticLayer for t in self.cache.layers):
            raise ValueError(
                "model.decode='compiled' needs a model whose every layer attends to all "
                f"earlier tokens (transformers' StaticLayer); {type(model).__name__} has "
                f"{sorted({type(t).__name__ for t in self.cache.layers})}: use "
                "model.decode='dynamic'")
        for static, grown in zip(self.cache.layers, layers):
            static.lazy_initialization(grown.keys, grown.values)
            static.keys[:, :, :L].copy_(grown.keys)
            static.values[:, :, :L].copy_(grown.values)
            static.cumulative_length.fill_(L)
        self.mask = torch.zeros(B, columns, dtype=mask.dtype, device=mask.device)
        self.mask[:, :L] = mask
        self.column = L
        self.next_pos = next_pos.clone()
        self.tokens = torch.zeros(B, dtype=torch.long, device=mask.device)
        self.live = torch.arange(B, device=mask.device)
        self.on_cuda = model.device.type == "cuda"
        self.cache_name = cache_argument()
        self.run = compiled_step(model.device.type) if compile else _last_logits

    def keep(self, live: Sequence[int]) -> None:
        """Keep only rows ``live`` of the current live ones; the batch keeps its shape."""
        self.live = self.live[torch.as_tensor(live, device=self.live.device)]

    def step(self, tokens: Tensor) -> Tensor:
        """Feed ``tokens [n]`` to the live rows (the others repeat their last token, whose
        output nobody reads); returns the live rows' next-token logits ``[n, V]``."""
        self.tokens[self.live] = tokens
        self.mask[:, self.column] = 1
        self.column += 1
        if self.on_cuda:
            torch.compiler.cudagraph_mark_step_begin()
        z = self.run(self.model, self.tokens, self.mask, self.next_pos, self.cache,
                     self.cache_name)
        self.next_pos += 1
        return z[self.live]


def _last_logits(model: Any, tokens: Tensor, mask: Tensor, next_pos: Tensor, cache: Any,
                 cache_name: str) -> Tensor:
    """The model on one token a row over ``cache``: next-token logits ``[B, V]``."""
    out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                use_cache=True, **{cache_name: cache})
    return out.logits[:, -1]


_COMPILED: dict[str, Callable[..., Tensor]] = {}


def compiled_step(device_type: str) -> Callable[..., Tensor]:
    """`_last_logits` compiled once per process and device type: one whole graph, CUDA
    graphs on a GPU. Dynamo guards on the model and the shapes, so each model and size
    compiles on its first call and is reused after."""
    if device_type not in _COMPILED:
        mode = "reduce-overhead" if device_type == "cuda" else None
        _COMPILED[device_type] = torch.compile(_last_logits, fullgraph=True, mode=mode)
    return _COMPILED[device_type]

"""Shared-prefix forward passes: rows that start with the same prompt run it once.

GRPO-style groups are G samples of one prompt, and self-play episodes of one group start
from the same observation, so a batch often holds each prompt many times; and distinct
prompts often start alike (a system prompt, a chat-template header, a seat's or a role's
own rules). Here the start all distinct prefixes share runs once (`run_prompts`, used by the
sampler's prefill too), then what each cluster of them shares after it, then each distinct
prefix's remainder once (left-padded, with its KV cache), the cache and the
prefix's last logits are indexed out to the rows that share it, and only the rest of each
row (its "continuation") runs per row. Indexing is differentiable, so the gradient through the
shared prefix is the sum of the rows' gradients: the same loss and gradient as running
every row in full (tests/test_prefix.py checks both to float tolerance), for fewer FLOPs.

Shapes: ``ids``, ``att`` ``[n, T]`` right-padded; ``plen [n]`` the prefix length of each row
(``1 <= plen <= len``), usually the position of its first action token.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sparring.policy.hidden import capture_hidden


@dataclass
class Prefixes:
    """Distinct prefixes of a batch: ``first [k]`` a row holding each, ``inverse [n]`` the
    prefix of each row, ``plen [n]`` the rows' prefix lengths, ``tokens`` the k prefixes,
    ``common`` the length of the start all of them share (0 for a single prefix)."""

    first: Tensor
    inverse: Tensor
    plen: Tensor
    tokens: list[tuple[int, ...]]
    common: int = 0

    @property
    def count(self) -> int:
        return int(self.first.numel())


def distinct(keys: Sequence[Hashable]) -> tuple[list[int], list[int]]:
    """(index of the first occurrence of each distinct key, distinct index of every key)."""
    seen: dict[Hashable, int] = {}
    first: list[int] = []
    inverse: list[int] = []
    for i, key in enumerate(keys):
        j = seen.setdefault(key, len(first))
        if j == len(first):
            first.append(i)
        inverse.append(j)
    return first, inverse


def distinct_rows(ids: Tensor, att: Tensor, allowed: Sequence[Any] | None = None
                  ) -> tuple[list[int], list[int]]:
    """`distinct` over whole rows: their tokens (up to their length) and, under constrained
    decoding, their restrictions (``TurnBatch.allowed``)."""
    lens = att.sum(1).tolist()
    rows = ids.tolist()
    keys = [(tuple(r[:n]), repr(sorted(allowed[i].items())) if allowed and allowed[i] else None)
            for i, (r, n) in enumerate(zip(rows, lens))]
    return distinct(keys)


def find_prefixes(ids: Tensor, plen: Tensor) -> Prefixes:
    """Group rows by their prefix ``ids[i, :plen[i]]`` (exact token equality)."""
    plen_l = plen.tolist()
    rows = ids[:, :max(plen_l, default=0)].tolist()
    keys = [tuple(r[:p]) for r, p in zip(rows, plen_l)]
    first, inverse = distinct(keys)
    uniq = [keys[i] for i in first]
    dev = ids.device
    return Prefixes(torch.tensor(first, dtype=torch.long, device=dev),
                    torch.tensor(inverse, dtype=torch.long, device=dev), plen, uniq,
                    common_prefix_len(uniq) if len(uniq) > 1 else 0)


def first_action_positions(action_mask: Tensor, lengths: Tensor) -> Tensor:
    """Prefix lengths for `shared_prefix_logits`: each row's first action position; rows
    without action tokens use their whole length (at least 1)."""
    has = action_mask.any(1)
    first = action_mask.to(torch.uint8).argmax(1)
    return torch.where(has, first, lengths).clamp(min=1)


@functools.cache
def cache_argument() -> str:
    """The name transformers gives a forward's KV cache: ``cache`` from 5.2x on (where
    ``past_key_values`` still works with a deprecation warning per process), before that
    ``past_key_values``."""
    from dataclasses import fields

    from transformers.modeling_outputs import CausalLMOutputWithPast

    names = {f.name for f in fields(CausalLMOutputWithPast)}
    return "cache" if "cache" in names else "past_key_values"


def with_cache(cache: Any) -> dict[str, Any]:
    """Forward keyword arguments that pass ``cache`` (``model(..., **with_cache(c))``)."""
    return {cache_argument(): cache, "use_cache": True}


def cache_of(out: Any) -> Any:
    """The KV cache a forward returned, under the installed transformers' name."""
    return getattr(out, cache_argument())


def select_rows(cache: Any, sel: Tensor) -> Any:
    """Rows ``sel`` of a KV cache (a transformers Cache, or legacy per-layer (k, v) tuples);
    differentiable, with ``index_select`` wherever the cache's tensors are reachable (its
    backward adds repeated rows in a fixed order; the ``t[sel]`` a Cache uses does not on a
    multi-threaded CPU)."""
    layers = getattr(cache, "layers", None)
    if layers is not None and all(hasattr(layer, "keys") and hasattr(layer, "values")
                                  for layer in layers):
        for layer in layers:
            if isinstance(layer.keys, Tensor) and layer.keys.numel():
                layer.keys = layer.keys.index_select(0, sel)
                layer.values = layer.values.index_select(0, sel)
        return cache
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(sel)
        return cache
    return tuple(tuple(t.index_select(0, sel) for t in layer) for layer in cache)


SHARED_PREFIX_MIN = 8  # tokens: a common prompt start shorter than this is not split off


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix shared by every sequence."""
    n = min(len(q) for q in seqs)
    ref = seqs[0]
    for q in seqs[1:]:
        j = 0
        while j < n and q[j] == ref[j]:
            j += 1
        n = j
    return n


def run_prompts(model: torch.nn.Module, prompts: Sequence[Sequence[int]], pad_id: int,
                device: torch.device | str, common: int | None = None
                ) -> tuple[Any, Tensor, Tensor, Tensor]:
    """Run ``k`` distinct prompts: (KV cache, next-token logits ``[k, V]``, attention mask
    ``[k, L]``, next position ``[k]``), each row as if its prompt had run alone.

    Shared starts run once, in up to three passes over a growing cache:
    1. the prompts' longest common prefix (a template header, rules every seat reads), when
       it has at least `SHARED_PREFIX_MIN` tokens;
    2. within each cluster of prompts that go on with the same token after it (a seat's or
       a role's own system prompt), the cluster's common continuation, when two or more
       prompts share `SHARED_PREFIX_MIN` more tokens (other clusters' rows are padding here);
    3. the rest of every prompt.
    Each pass is left-padded after the cache so far (the padding is masked, positions go on
    from each row's length), and its cache rows are copied to the rows of the next. Autograd
    flows as the caller's context allows (indexing a cache is differentiable: a shared part
    gets the sum of its rows' gradients). ``common``: the prompts' common prefix length when
    the caller has it.
    """
    k = len(prompts)
    if common is None:
        common = common_prefix_len(prompts) if k > 1 else 0
    P0 = min(common, min(len(q) for q in prompts) - 1) if k > 1 else 0
    if P0 < SHARED_PREFIX_MIN:
        P0 = 0
    run = _Extension(model, pad_id, device)
    members = [0] * k  # each prompt's cluster (pass 2)
    starts = [P0]  # where each cluster's rest begins
    if P0:
        run.extend(None, [prompts[0][:P0]])
        firsts, members = distinct([q[P0] for q in prompts])
        starts = [P0 + _shared_continuation([prompts[i][P0:] for i, m in enumerate(members)
                                             if m == c]) for c in range(len(firsts))]
        if any(st > P0 for st in starts):  # pass 2 (no empty-row risk: it follows pass 1)
            run.extend([0] * len(firsts), [prompts[i][P0:st] for i, st in zip(firsts, starts)])
        else:
            members, starts = [0] * k, [P0]
    logits = run.extend(members if run.cache is not None else None,
                        [q[starts[m]:] for q, m in zip(prompts, members)])
    return run.cache, logits, run.mask, run.next_pos


def _shared_continuation(rests: Sequence[Sequence[int]]) -> int:
    """How many leading tokens a cluster's prompts (past the common prefix) share, worth a
    pass of their own: 0 for a single prompt or fewer than `SHARED_PREFIX_MIN` tokens; at
    most the shortest rest minus one (every prompt keeps a token for the last pass)."""
    if len(rests) < 2:
        return 0
    n = min(common_prefix_len(rests), min(len(q) for q in rests) - 1)
    return n if n >= SHARED_PREFIX_MIN else 0


class _Extension:
    """`run_prompts`' growing state: a KV cache over some rows, its attention mask and each
    row's next position; `extend` appends one left-padded pass of segments."""

    def __init__(self, model: torch.nn.Module, pad_id: int, device: torch.device | str):
        self.model, self.pad_id, self.device = model, pad_id, device
        self.cache: Any = None
        self.mask: Tensor | None = None
        self.next_pos: Tensor | None = None

    def extend(self, parent: Sequence[int] | None, segments: Sequence[Sequence[int]]) -> Tensor:
        """Rows ``segments[j]``, each after the cache row ``parent[j]`` (None: no cache yet);
        returns the next-token logits after each ``[n, V]``."""
        dev, n = self.device, len(segments)
        if self.cache is not None:
            sel = torch.as_tensor(list(parent), dtype=torch.long, device=dev)
            self.cache = select_rows(self.cache, sel)
            before, start = self.mask[sel], self.next_pos[sel]
        else:
            before = torch.zeros((n, 0), dtype=torch.long, device=dev)
            start = torch.zeros(n, dtype=torch.long, device=dev)
        L = max(max((len(q) for q in segments), default=0), 1)
        ids = torch.full((n, L), self.pad_id, dtype=torch.long)
        real = torch.zeros((n, L), dtype=torch.long)
        for i, q in enumerate(segments):
            if len(q):
                ids[i, L - len(q):] = torch.as_tensor(list(q), dtype=torch.long)
                real[i, L - len(q):] = 1
        ids, real = ids.to(dev), real.to(dev)
        self.mask = torch.cat([before, real], 1)
        out = self.model(input_ids=ids, attention_mask=self.mask,
                         position_ids=start[:, None] + (real.cumsum(-1) - 1).clamp(min=0),
                         logits_to_keep=1, **with_cache(self.cache))
        self.cache, self.next_pos = cache_of(out), start + real.sum(-1)
        return out.logits[:, -1]


def shared_prefix_logits(model: torch.nn.Module, ids: Tensor, att: Tensor, pre: Prefixes,
                         pad_id: int = 0, keep_hidden: bool = False
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(logits ``[n, 1 + C, V]``, targets ``[n, 1 + C]``, positions ``[n, C]``, hidden).

    ``logits[:, s]`` (s < C) predicts the token at original position ``plen + s`` of the row,
    which is ``targets[:, s + 1]`` (``targets[:, 0]`` and ``logits[:, C]`` are placeholders);
    so `logprobs_from_logits(logits, targets)` gives at ``[:, s + 1]`` the log-prob of the
    row's token at ``plen + s``. ``positions[:, s] = plen + s`` (``T`` where the row has
    ended); C = the longest ``len - plen``. A row's last token is never an input (nothing
    after it is scored), so the continuation pass runs C - 1 positions. ``keep_hidden``:
    ``hidden [n, 1 + C, H]``, the lm_head inputs those logits came from (same layout), else
    None.
    """
    n, T = ids.shape
    dev = ids.device
    plen = pre.plen.to(dev)
    # 1. the distinct prefixes (their common start once), left-padded to end together
    with capture_hidden(model) if keep_hidden else nullcontext([]) as hs:
        cache, last, pre_att, _ = run_prompts(model, pre.tokens, pad_id, dev, pre.common)
    # index_select, not x[inverse]: on a CPU the latter's backward (index_put with
    # accumulate) sums the rows of one prefix in a thread-timed order; index_select's does
    # not (docs/reliability.md)
    last = last.index_select(0, pre.inverse)  # [n, V]: predicts the token at plen
    # run_prompts' last pass holds every prompt, its lm_head input their final hidden states
    h_parts = [hs[-1][:, -1].index_select(0, pre.inverse)[:, None]] if keep_hidden else []
    C, pos, valid, targets = continuation_targets(ids, att, plen, pad_id)
    parts = [last[:, None]]
    if C > 1:  # 2. the rest of every row, attending to its prefix through the cache
        cache = select_rows(cache, pre.inverse)  # differentiable: gradients add per prefix
        inp_valid = valid[:, 1:C]  # input at plen + s is needed iff a token follows it
        full_att = torch.cat([pre_att[pre.inverse], inp_valid], 1).long()
        with capture_hidden(model) if keep_hidden else nullcontext([]) as hs:
            out2 = model(input_ids=targets[:, :C - 1], attention_mask=full_att,
                         position_ids=pos[:, :C - 1].clamp(max=T - 1), **with_cache(cache))
        parts.append(out2.logits)
        h_parts += hs[-1:]
    parts.append(torch.zeros_like(last)[:, None])  # placeholder, sliced off by the caller
    hidden = None
    if keep_hidden:
        h_parts.append(torch.zeros_like(h_parts[0]))
        hidden = torch.cat(h_parts, 1)
    pad = torch.full((n, 1), pad_id, dtype=ids.dtype, device=dev)
    return torch.cat(parts, 1), torch.cat([pad, targets], 1), \
        torch.where(valid, pos, T)[:, :max(C, 0)], hidden


def continuation_targets(ids: Tensor, att: Tensor, plen: Tensor, pad_id: int = 0
                         ) -> tuple[int, Tensor, Tensor, Tensor]:
    """What the rows' continuations score: (C = the longest ``len - plen``, positions
    ``plen + s`` ``[n, max(C, 1)]``, ``valid`` (a token is there), the tokens ``[n, C]``,
    ``pad_id`` past a row's end)."""
    T = ids.shape[1]
    lens = att.sum(1)
    C = int((lens - plen).max()) if ids.shape[0] else 0
    pos = plen[:, None] + torch.arange(max(C, 1), device=ids.device)
    valid = pos < lens[:, None]
    targets = torch.where(valid, ids.gather(1, pos.clamp(max=T - 1)), pad_id)[:, :max(C, 0)]
    return C, pos, valid, targets


def to_rows(x: Tensor, positions: Tensor, T: int) -> Tensor:
    """Continuation values ``x [n, 1 + C, ...]`` (from `logprobs_from_logits` on the shared
    logits) back to the rows' positions ``[n, T, ...]``; 0 elsewhere. Differentiable in
    ``x``."""
    n = x.shape[0]
    idx = positions.reshape(*positions.shape, *([1] * (x.dim() - 2))).expand_as(x[:, 1:])
    out = torch.zeros(n, T + 1, *x.shape[2:], dtype=x.dtype, device=x.device)
    return out.scatter(1, idx, x[:, 1:])[:, :T]

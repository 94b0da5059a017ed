"""The order in which an epoch visits a batch's rows, cut into mini-batches in that order.

``train.minibatch_order``:

* ``rows``: a uniformly random permutation of the rows, new each epoch.
* ``prompt``: the rows of one prompt (the tokens before a row's first action token) stay
  next to each other: the distinct prompts in a random order, new each epoch, and each
  prompt's rows in a random order among themselves. Cut into mini-batches of ``m`` rows,
  a prompt's rows then share a mini-batch (only a prompt at a cut spans two), so a row
  repeated k times runs once per epoch under ``train.share_rows``, and a prompt k rows
  share once under ``train.share_prefix``, instead of in up to k mini-batches. Every row
  is still visited once an epoch and every mini-batch's loss is still the mean over its
  rows; what changes is which rows share a gradient step.

Shapes: ``group [n]`` the prompt index of each row (``0..g-1``); the result a permutation
``[n]`` of ``0..n-1``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from sparring.policy.prefix import find_prefixes, first_action_positions

MinibatchOrder = Literal["rows", "prompt"]


def prompt_index(input_ids: Tensor, action_mask: Tensor, attention_mask: Tensor) -> Tensor:
    """``[n]``: the index of each row's prompt among the batch's distinct prompts (equal
    token ids up to the row's first action token; a row without one is its own tokens)."""
    plen = first_action_positions(action_mask, attention_mask.sum(1))
    return find_prefixes(input_ids, plen).inverse.cpu()


def grouped_permutation(group: Tensor, generator: torch.Generator) -> Tensor:
    """A random permutation of ``0..n-1`` in which the rows of each group are contiguous:
    the groups in a uniformly random order, the rows within a group too."""
    n = len(group)
    if n == 0:
        return torch.zeros(0, dtype=torch.long)
    place = torch.randperm(int(group.max()) + 1, generator=generator)  # group -> its place
    rows = torch.randperm(n, generator=generator)
    return rows[torch.argsort(place[group[rows]], stable=True)]


def epoch_order(order: MinibatchOrder, n: int, group: Tensor | None,
                generator: torch.Generator) -> Tensor:
    """The rows of one epoch in ``order`` (module docstring); ``group``: `prompt_index`,
    needed for ``prompt``."""
    if order == "rows":
        return torch.randperm(n, generator=generator)
    if group is None or len(group) != n:
        raise ValueError(f"minibatch_order={order!r} needs the prompt index of each of the "
                         f"{n} rows")
    return grouped_permutation(group, generator)


def by_length(rows: Tensor, lengths: Tensor, tokens: int) -> list[Tensor]:
    """``rows`` cut into micro-batches of at most ``tokens`` padded tokens
    (`train.microbatch_tokens`): sorted by ``lengths [len(rows)]``, longest first (equal
    lengths in their given order), each micro-batch takes ``max(1, tokens // L)`` rows,
    ``L`` its first (longest) row's length."""
    order = torch.argsort(lengths, descending=True, stable=True)
    rows, lens = rows[order], lengths[order].tolist()
    parts, start = [], 0
    while start < len(lens):
        take = max(1, tokens // max(int(lens[start]), 1))
        parts.append(rows[start:start + take])
        start += take
    return parts


def micro_batches(rows: Tensor, lengths: Tensor, size: int, tokens: int) -> list[Tensor]:
    """``rows`` (their ``lengths [len(rows)]``) cut into micro-batches: `by_length` within
    ``tokens`` padded tokens when it is set (`train.microbatch_tokens`), else ``size`` rows
    each in their order (`train.microbatch_size`; 0: all of them in one)."""
    if tokens:
        return by_length(rows, lengths, tokens)
    size = size or max(len(rows), 1)
    return [rows[i:i + size] for i in range(0, len(rows), size)]


__all__ = ["MinibatchOrder", "by_length", "epoch_order", "grouped_permutation",
           "micro_batches", "prompt_index"]

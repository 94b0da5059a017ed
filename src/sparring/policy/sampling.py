"""Sampling options, the `Generation` record, logit processing and the legal-action trie.

The distribution a token is sampled from (and whose log-prob is recorded), per step:

1. ``z = logits / temperature`` (``greedy`` uses the same ``z`` and takes its argmax);
2. constrained decoding: tokens outside the allowed set ``A`` (children of the current
   trie node, see `TokenTrie`) get ``-inf``; past an `ActionPrefixes` prefix nothing is
   constrained;
3. top-k then top-p (nucleus) keep a set ``K`` of tokens, the rest get ``-inf``;
4. ``log p(x) = z_x - logsumexp_{y in K} z_y`` : the tempered, filtered, renormalised
   distribution. The entropy recorded is that of the same distribution.

`sparring.policy.forward.token_logprobs(..., temperature, allowed=...)` recomputes steps
1, 2 and 4 exactly. It does not apply top-k/top-p, so for training keep ``top_k=0`` and
``top_p=1.0`` (the defaults) whenever the learner's ratio must match the sampler.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

FINISH_REASONS = ("eos", "stop", "length")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: temperature, top_p, top_k (0 = off), max_new_tokens, stop strings,
    greedy (argmax), with_entropy (record per-token entropies)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    greedy: bool = False
    with_entropy: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling.temperature={self.temperature}; must be > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p={self.top_p}; must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k={self.top_k}; must be >= 0 (0 = off)")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens={self.max_new_tokens}; must be >= 1")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))


@dataclass
class Generation:
    """One sampled completion. ``token_ids`` are exactly the sampled tokens (with the EOS
    when one was sampled); ``logprobs``/``entropies`` have one entry per token (see the
    module docstring for the distribution); ``text`` decodes ``token_ids`` without special
    tokens; ``finish_reason`` is "eos", "stop" (a stop string appeared) or "length"
    ("explore" and ``logprobs`` None: a move the arena drew for an exploring training
    player, `sparring.rollout.players.ModelPlayer`, not sampled by the policy).
    ``allowed_ids``: under constrained decoding, per token the allowed token ids (None for
    a token sampled freely after an `ActionPrefixes` prefix)."""

    token_ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: str
    entropies: list[float] | None = None
    allowed_ids: list[list[int] | None] | None = None


def eos_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """The ids that end a generation: the tokenizer's EOS first, then any extra EOS ids of
    the model's generation config (every backend stops on the same ones)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    extra = getattr(generation_config, "eos_token_id", None)
    for e in [extra] if isinstance(extra, int) else (extra or []):
        if e not in ids:
            ids.append(e)
    if not ids:
        raise ValueError("the tokenizer has no eos_token; set one before generating")
    return ids


def check_generate_args(prompts: Sequence[Sequence[int]],
                        allowed: Sequence[Sequence[str] | None] | None,
                        seeds: Sequence[int] | None, *, max_positions: int | None = None,
                        max_new_tokens: int = 0) -> None:
    """Raise ValueError for an empty prompt, a prompt whose tokens plus ``max_new_tokens``
    pass the model's ``max_positions``, or ``allowed``/``seeds`` not one per prompt (what
    every backend's ``generate`` checks first)."""
    B = len(prompts)
    if any(len(p) == 0 for p in prompts):
        raise ValueError("generate: every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    if max_positions and longest + max_new_tokens > max_positions:
        raise ValueError(f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} "
                         f"passes the model's {max_positions} positions: set "
                         "rollout.max_prompt_tokens (0 means no limit) or shorten the "
                         "environment's text")
    if allowed is not None and len(allowed) != B:
        raise ValueError(f"generate: {len(allowed)} allowed lists for {B} prompts")
    if seeds is not None and len(seeds) != B:
        raise ValueError(f"generate: {len(seeds)} seeds for {B} prompts")


def filter_logits(z: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set logits outside the top-k / top-p (nucleus) set to ``-inf``. ``z [B, V]``.

    Top-p keeps the smallest prefix of tokens sorted by probability whose mass reaches
    ``top_p`` (the most likely token is always kept)."""
    if top_k > 0 and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


class ActionPrefixes(tuple):
    """The ways a move may begin (an env's ``action_prefixes``, e.g. ``("calc:", "answer:")``),
    passed per prompt as ``allowed`` in place of a list of whole legal actions: the sampler
    constrains the first tokens to spell one of them and decodes freely after it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ActionPrefixes({tuple(self)!r})"


class TokenTrie:
    """Prefix tree over token-id sequences; node ids are ints, root is 0.

    Built from the legal action strings of one prompt, each tokenized and followed by
    EOS, so a path from the root to a leaf spells exactly one legal action. With
    ``open_ended`` (built from `ActionPrefixes`, no EOS), a leaf ends the constraint
    instead: the tokens after it are free (`is_free`)."""

    def __init__(self, sequences: Sequence[Sequence[int]], open_ended: bool = False):
        if not sequences:
            raise ValueError("constrained decoding needs at least one legal action")
        self.open_ended = open_ended
        self.children: list[dict[int, int]] = [{}]
        for seq in sequences:
            if not seq:
                raise ValueError("a legal action tokenizes to no tokens")
            node = 0
            for tok in seq:
                nxt = self.children[node].get(tok)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][tok] = nxt
                    self.children.append({})
                node = nxt

    def allowed(self, node: int) -> list[int]:
        return list(self.children[node])

    def is_free(self, node: int) -> bool:
        """Whether the token at ``node`` is unconstrained: a leaf of an open-ended trie."""
        return self.open_ended and not self.children[node]

    def step(self, node: int, tok: int) -> int:
        """The node after ``tok`` (a free node stays where it is)."""
        return node if self.is_free(node) else self.children[node][tok]

    def allowed_along(self, ids: Sequence[int]) -> list[list[int] | None]:
        """Per token of ``ids`` (a path from the root), the ids allowed where it was chosen
        (None where it was free): what ``Generation.allowed_ids`` records for a
        constrained sample of ``ids``."""
        out: list[list[int] | None] = []
        node = 0
        for t in ids:
            out.append(None if self.is_free(node) else self.allowed(node))
            node = self.step(node, t)
        return out

    def forced_tail(self, node: int) -> list[int] | None:
        """The tokens from ``node`` to a leaf when every node on the way has one child
        (the only way to finish), else None (also at a leaf, and always in an open-ended
        trie, whose leaves do not finish the move)."""
        if self.open_ended:
            return None
        tail: list[int] = []
        while len(self.children[node]) == 1:
            (tok, node), = self.children[node].items()
            tail.append(tok)
        return tail if tail and not self.children[node] else None

    def is_leaf(self, node: int) -> bool:
        return not self.children[node]

    @functools.cached_property
    def tokens_after_first(self) -> int | None:
        """When the first token decides the move (after each legal first token the rest is
        its `forced_tail`), the longest such tail; else None (also for an open-ended
        trie). A sampler needs no context past the first token then."""
        tails = [self.forced_tail(child) if self.children[child] else []
                 for child in self.children[0].values()]
        return None if self.open_ended or any(t is None for t in tails) else max(map(len, tails))

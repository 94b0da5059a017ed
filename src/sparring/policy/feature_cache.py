"""A frozen network's features, computed once per context (the ``cache`` of the
``frozen_features`` head, ``model.head``: `sparring.policy.heads`).

With that head (and no LoRA) everything below the LM head stays as it
started for the whole run, so the last hidden state ``h(c)`` of a context ``c`` (the
vector the LM head reads after the tokens ``c``) is a function of ``c`` alone. This cache
holds ``h(c)``: the sampler's prefill (`sparring.policy.hf.HFPolicy`) and the learner's
continuation passes (`cached_prefix_logits`, in place of
`sparring.policy.prefix.shared_prefix_logits`) apply the head, and a value head, to stored
features and run the network only on contexts they have not met. A game with few
positions (tic-tac-toe: 627 decision points in the canonical view) stops running the
network after its first steps; the KL reference (the magnet, whose body is the policy's)
and the evaluations read the same cache.

Each context runs on its own (a batch of one, no padding, no shared-prefix pass, the
model's precision, eval mode), so its features depend on the context and the machine, not
on the batch that first needed it: a run resumed from a checkpoint (its cache starts
empty) recomputes the same values, and sampler and learner score with identical features.
They differ from a batched forward's only by rounding (bf16 autocast: about 1e-2 in a
logit; tests/test_feature_cache.py). Bounded: at ``max_entries`` the cache empties itself
(`sparring.memo.BoundedMemo`). Values are always computed by the model the cache was made
for; models with the same frozen network (the magnet, the pool's snapshots of the run) are
registered to read it with `attach_feature_cache`, by identity: a copy of a model (a
separate critic's trained body) does not inherit the cache.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from sparring.memo import BoundedMemo
from sparring.policy.hidden import capture_hidden, output_embedding
from sparring.policy.precision import autocast_for
from sparring.policy.prefix import Prefixes, cache_of, continuation_targets, with_cache

_CACHES: weakref.WeakKeyDictionary[nn.Module, FeatureCache] = weakref.WeakKeyDictionary()


Allowed = Sequence[dict[int, list[int]] | None]  # as sparring.policy.forward's
PROMPT_CACHES = 256  # prompts whose KV cache is kept (SmolLM2-135M: ~4.6 MB each at 200 tokens)

Context = tuple[Sequence[int] | Tensor, Sequence[int] | Tensor]  # (prompt, continuation)


def context_key(prompt: Sequence[int] | Tensor, continuation: Sequence[int] | Tensor = ()
                ) -> tuple[bytes, bytes]:
    """A context's token ids, split where its prompt ends, as a compact hashable key."""
    return tuple(np.asarray(_ints(x), dtype=np.int64).tobytes() for x in (prompt, continuation))


class FeatureCache:
    """(prompt, continuation) -> last hidden state ``[H]`` (float32) of a frozen network
    after the prompt's tokens and then the continuation's.

    How a context is computed, always the same way: the prompt alone (a batch of one, no
    padding), then the continuation one token at a time over the prompt's KV cache. So a
    value depends on the context only. The KV caches of the last `PROMPT_CACHES` prompts are
    kept, so the moves the learner scores after a prompt the sampler ran cost a token each,
    not a second pass over the prompt."""

    def __init__(self, model: nn.Module, max_entries: int, center: bool = False,
                 whiten: float = 0.0):
        if max_entries < 1:
            raise ValueError(f"FeatureCache: max_entries={max_entries}; must be >= 1")
        if whiten < 0:
            raise ValueError(f"FeatureCache: whiten={whiten}; must be >= 0 (0: off)")
        self.center = center or whiten > 0
        self.whiten = whiten
        self.mean: Tensor | None = None  # mu [H], once fixed (`fix_transform`)
        self.precondition: Tensor | None = None  # P [H, H] (whiten), once fixed
        self.start: Tensor | None = None  # W_0 [V, H]: the head when the transform was fixed
        self.model = model  # whose network computes every value (its precision, its device)
        self.store = BoundedMemo(max_entries)
        self.prompt_caches = BoundedMemo(PROMPT_CACHES)  # prompt -> its KV cache
        self.prompt_passes = 0  # prompts run through the network so far (a cost measure)

    def prefetch(self, contexts: Sequence[Context]) -> None:
        """Compute and keep the features of ``contexts``."""
        if contexts:
            self.features(contexts)

    @torch.no_grad()
    def features(self, contexts: Sequence[Context], reader: nn.Module | None = None) -> Tensor:
        """``[k, H]`` features of ``contexts`` ((prompt, continuation) pairs), running those
        not held. ``reader``, the model that asks, shares the frozen network, so it does not
        change them (the interface of `sparring.policy.layer_cache.LayerCache`, whose
        readers run their own top layers)."""
        keys = [context_key(p, c) for p, c in contexts]
        todo: dict[bytes, tuple[list[int], set[tuple[int, ...]]]] = {}
        for (p, c), key in zip(contexts, keys):
            if key not in self.store:
                entry = todo.setdefault(key[0], (_ints(p), set()))
                entry[1].add(tuple(_ints(c)))
        fresh: dict[tuple[bytes, bytes], Tensor] = {}  # this call's (kept if the store empties)
        model = self.model
        if todo:
            was_training = model.training
            model.eval()
            try:
                with autocast_for(model):
                    for prompt, continuations in todo.values():
                        fresh.update(self._run(model, prompt, sorted(continuations)))
            finally:
                model.train(was_training)
        return torch.stack([fresh[k] if k in fresh else self.store[k] for k in keys])

    @torch.no_grad()
    def fix_transform(self) -> None:
        """Fix ``mu``, ``P`` and ``W_0`` (`head_logits`) from every context held now, once:
        the learner calls it before its first update, so they come from the whole first
        batch. Until the head moves, the policy does not depend on them."""
        if not self.center or self.mean is not None or not self.store:
            return
        h = torch.stack(list(self.store.values())).double()
        mean = h.mean(0)
        if self.whiten:
            d = h - mean
            cov = d.T @ d / len(d)
            cov += self.whiten * cov.diagonal().mean() * torch.eye(len(cov), dtype=cov.dtype,
                                                              device=cov.device)
            evals, evecs = torch.linalg.eigh(cov)
            self.precondition = ((evecs * evals.rsqrt()) @ evecs.T).float()
        self.mean = mean.float()
        self.start = output_embedding(self.model).weight.detach().float().clone()

    def head_logits(self, head: nn.Module, h: Tensor, rows: Tensor | None = None) -> Tensor:
        """The logits ``head`` (an LM head, or a copy of it: the magnet's, a snapshot's) gives
        features ``h [..., H]``, over the vocabulary ``rows`` only when given. With a
        transform (``center``, ``whiten``) the head's change since the start reads the
        transformed features ``z = P (h - mu)`` (`head_input`):

            logits = W_0 h + (W - W_0) z      (+ the head's bias)

        ``mu`` and ``P`` from the features of the run's first batch, ``W_0`` the head then
        (`fix_transform`), so the starting policy is the model's own, bit for bit.
        Centering (``P = I``) leaves out of the gradient ``delta z^T`` the part all
        positions share (SmolLM2's tic-tac-toe positions: cosine 0.993 between two
        positions' features). Whitening, ``P = (S + eps tr(S)/H I)^{-1/2}`` with ``S`` the
        features' covariance (ZCA with shrinkage ``eps`` = ``whiten``), makes the gradient
        step that of a linear model on uncorrelated unit-variance inputs (the classic
        input-whitening argument for a linear layer, LeCun et al. 1998, "Efficient
        BackProp"; its use for a frozen LM's head is our reading). `bench/linear_probe.py`:
        centering fits a linear policy about 4x faster, whitening about 10x at a tenth of
        the learning rate."""
        if self.mean is None:
            return head_rows_logits(head, h, rows)
        weight, bias = head_rows(head, rows)
        start = self.start if rows is None else self.start.index_select(0, rows)
        start = start.to(h.dtype)
        return (torch.nn.functional.linear(h, start)
                + torch.nn.functional.linear(self.head_input(h), weight - start, bias))

    def head_input(self, h: Tensor) -> Tensor:
        """What a value head, and the head's change, read: ``z = P (h - mu)``, the features
        transformed like the policy's (``h`` itself without a transform)."""
        if self.mean is None:
            return h
        z = h - self.mean.to(h.dtype)
        if self.precondition is not None:
            z = z @ self.precondition.to(h.dtype)  # P is symmetric
        return z

    def center_state(self) -> dict[str, Tensor] | None:
        """``mu``, ``W_0`` and ``P`` once fixed (a checkpoint's), else None."""
        if self.mean is None:
            return None
        state = {"mean": self.mean, "start": self.start}
        if self.precondition is not None:
            state["precondition"] = self.precondition
        return state

    def load_center_state(self, state: dict[str, Tensor]) -> None:
        if "start" not in state:
            raise ValueError("feature transform state without the starting head 'start' "
                             "(a checkpoint of an older centering format, which is not read)")
        # copies: a tensor loaded from a file may be a view at an unaligned offset of its
        # buffer, and a one-row matmul then rounds differently from the run that saved it
        self.mean, self.start = _owned(state["mean"]), _owned(state["start"])
        p = state.get("precondition")
        self.precondition = None if p is None else _owned(p)

    def _run(self, model: nn.Module, prompt: list[int], continuations: list[tuple[int, ...]]
             ) -> dict[tuple[bytes, bytes], Tensor]:
        """The features of the prompt and of every prefix of each continuation, stored."""
        device = next(model.parameters()).device
        key = context_key(prompt)
        out = {}
        cache = self.prompt_caches.get(key[0])
        if cache is None:
            self.prompt_passes += 1
            out[key], cache = _step(model, torch.tensor([prompt], device=device), None)
            if len(self.prompt_caches) >= self.prompt_caches.size:
                self.prompt_caches.clear()
            self.prompt_caches[key[0]] = cache
        for cont in continuations:
            for j, tok in enumerate(cont, start=1):
                h, cache = _step(model, torch.tensor([[tok]], device=device), cache)
                out[context_key(prompt, cont[:j])] = h
            if cont:  # back to the prompt alone for the next one (negative: tokens to drop)
                cache.crop(-len(cont))
        if len(self.store) + len(out) > self.store.size:
            self.store.clear()  # full: start again (BoundedMemo's rule)
        for k, v in list(out.items())[:self.store.size]:
            self.store[k] = v
        return out


def head_rows(head: nn.Module, rows: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """``head``'s weight ``[V, H]`` and bias ``[V]`` (None without one), restricted to the
    vocabulary ``rows`` when given."""
    weight = head.weight if rows is None else head.weight.index_select(0, rows)
    bias = getattr(head, "bias", None)
    if bias is not None and rows is not None:
        bias = bias.index_select(0, rows)
    return weight, bias


def head_rows_logits(head: nn.Module, h: Tensor, rows: Tensor | None = None) -> Tensor:
    """``head``'s logits for features ``h [..., H]``, over vocabulary ``rows`` only when
    given (in ``h``'s dtype)."""
    weight, bias = head_rows(head, rows)
    return torch.nn.functional.linear(h, weight.to(h.dtype),
                                      None if bias is None else bias.to(h.dtype))


def _owned(x: Tensor) -> Tensor:
    """A float32 copy of ``x`` in fresh (aligned) memory."""
    return x.to(torch.float32, copy=True)


def _ints(x: Sequence[int] | Tensor) -> list[int]:
    return x.tolist() if isinstance(x, Tensor) else list(x)


def _step(model: nn.Module, ids: Tensor, cache) -> tuple[Tensor, object]:
    """Run ``ids [1, t]`` after ``cache``: (the last position's features, the new cache)."""
    with capture_hidden(model) as hs:
        out = model(input_ids=ids, logits_to_keep=1,
                    **(with_cache(cache) if cache is not None else {"use_cache": True}))
    return hs[-1][0, -1].float().clone(), cache_of(out)


def attach_feature_cache(model: nn.Module, cache: FeatureCache | None) -> None:
    """Register ``cache`` as the features of ``model``'s frozen network (None: remove)."""
    if cache is None:
        _CACHES.pop(model, None)
    else:
        _CACHES[model] = cache


def feature_cache_of(model: nn.Module) -> FeatureCache | None:
    """The cache registered for ``model`` (this very object), else None."""
    return _CACHES.get(model)


def cached_prefix_logits(model: nn.Module, cache: Any, ids: Tensor, att: Tensor,
                         pre: Prefixes, pad_id: int = 0, keep_hidden: bool = False,
                         allowed: Allowed | None = None, restrict_head: bool = True
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Allowed | None]:
    """`sparring.policy.prefix.shared_prefix_logits` from cached features (``cache``: a
    `FeatureCache`, or a `sparring.policy.layer_cache.LayerCache` whose states ``model``'s
    top layers read, differentiably): the same
    (logits ``[n, 1 + C, V]``, targets, positions, hidden) layout, ``logits[:, s]`` the head
    applied to the features of the context ``ids[i, :plen_i + s]``, and ``allowed`` (in
    that layout: ``{s + 1: ids}`` per row). Differentiable in the head's weights (and,
    through ``hidden``, in a value head's), not in the network's.

    When every scored position is constrained (and ``restrict_head``), the head runs only
    over the ids some position allows (the restricted distributions need no other logit):
    ``V`` is then their number, and targets and ``allowed`` come back as indices into them."""
    n = ids.shape[0]
    C, pos, valid, targets = continuation_targets(ids, att, pre.plen.to(ids.device), pad_id)
    plen = pre.plen.tolist()
    slots = [(i, s) for i in range(n) for s in range(C) if bool(valid[i, s])]
    rows = ids.tolist()
    feats = cache.features([(rows[i][:plen[i]], rows[i][plen[i]:plen[i] + s])
                            for i, s in slots], model)
    scored = valid[:, :C]  # the slots, in the same (row, slot) order
    hidden = torch.zeros(n, C + 1, feats.shape[-1], dtype=feats.dtype, device=ids.device)
    hidden[:, :C][scored] = feats.to(ids.device)
    head = output_embedding(model)
    pad = torch.full((n, 1), pad_id, dtype=ids.dtype, device=ids.device)
    targets = torch.cat([pad, targets], 1)
    sub = _allowed_ids(allowed, slots) if restrict_head else None
    if sub is not None:  # with the scored tokens themselves, should one lie outside
        sub = sorted(set(sub) | {rows[i][plen[i] + s] for i, s in slots})
    if sub is None:
        logits = cache.head_logits(head, hidden)
    else:  # the head's rows of the allowed ids only; ids renumbered into them
        index = {t: k for k, t in enumerate(sub)}
        rows_ = torch.tensor(sub, device=ids.device)
        logits = cache.head_logits(head, hidden, rows_)
        lookup = torch.zeros(max(sub) + 1, dtype=ids.dtype, device=ids.device)
        lookup[rows_] = torch.arange(len(sub), dtype=ids.dtype, device=ids.device)
        keep = torch.zeros_like(targets, dtype=torch.bool)
        keep[:, 1:] = scored  # targets[:, s + 1] is the token slot s predicts
        targets = torch.where(keep, lookup[targets.clamp(max=max(sub))], 0)
        allowed = [None if d is None else {j: [index[t] for t in a] for j, a in d.items()}
                   for d in allowed]
    T = ids.shape[1]
    return logits, targets, torch.where(valid, pos, T)[:, :max(C, 0)], \
        cache.head_input(hidden) if keep_hidden else None, allowed


def _allowed_ids(allowed: Allowed | None, slots: list[tuple[int, int]]) -> list[int] | None:
    """The ids any position allows, sorted, if every scored slot is constrained, else None."""
    if allowed is None:
        return None
    ids: set[int] = set()
    for i, s in slots:
        d = allowed[i]
        if d is None or s + 1 not in d:
            return None
        ids.update(d[s + 1])
    return sorted(ids) if ids else None


__all__ = ["FeatureCache", "attach_feature_cache", "cached_prefix_logits", "context_key",
           "feature_cache_of"]

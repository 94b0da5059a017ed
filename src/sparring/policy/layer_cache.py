"""A frozen lower network's output, computed once per context (the ``cache`` of the
``top_layers`` head, ``model.head``: `sparring.policy.heads`).

Under that head only the last N transformer layers (and the final norm) train; the layers
below keep their starting weights for the whole run. Their output at every position of a
context, the input ``s(c) [T, H]`` of the first trained layer, is then a function of the
context ``c`` alone. This cache keeps it per prompt (``[P, H]``, the prompt run on its own
and stopped at the first trained layer) and per continuation (``[L, H]``, run over the
prompt's KV cache of the lower layers). `features` then runs a reader's trained layers on
stored states (`sparring.policy.top_layers.top_hidden`), so the sampler's first token, the
learner, the KL reference, the pool's snapshots and the evaluations run N layers instead
of the network once a context has been met, and the backward stops there. With the top
layer's key and value projections frozen (``fixed_keys``, N = 1) its keys and values at a
prompt's positions are kept too, and the top layer runs at each context's last position;
otherwise the start the prompts of a forward share runs once through the trained layers.

The reader is whichever model scores: the policy, the magnet's copy, a snapshot's copy.
They share the frozen lower layers, hence the states, but each runs its own top layers.
The interface is `sparring.policy.feature_cache.FeatureCache`'s (``features``, ``prefetch``,
``head_logits``, ``head_input``), without a feature transform.

A state depends on its context only, never on the batch that first asked for it: a prompt
runs alone (a batch of one, eval mode, the model's precision), continuations of one length
in forwards of a fixed `ROWS` rows. So a resumed run, whose cache starts empty, computes
the same values bit for bit. Bounded: at ``max_prompts`` prompts the cache empties itself.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from sparring.memo import BoundedMemo
from sparring.policy.feature_cache import (
    PROMPT_CACHES,
    Context,
    context_key,
    head_rows_logits,
)
from sparring.policy.precision import autocast_for
from sparring.policy.prefix import common_prefix_len, select_rows, with_cache
from sparring.policy.top_layers import decoder_parts, prompt_keys_values, top_hidden

TOKENS_PER_PROMPT = 32  # continuations' states kept per prompt (the bound's ratio)
ROWS = 16  # continuations a forward over a prompt's KV cache (a fixed shape: `_run_continuations`)


class _Stop(Exception):
    """Raised at the first trained layer: the lower layers' part of a forward is done."""


class LayerCache:
    """(prompt, continuation) -> the input states of layer ``start`` at each position of
    the context, and the last hidden state a reader's top layers make of them."""

    def __init__(self, model: nn.Module, trained_layers: int, max_prompts: int,
                 fixed_keys: bool = False):
        parts = decoder_parts(model)
        layers = parts.layers
        if not 1 <= trained_layers <= len(layers):
            raise ValueError(f"top_layers: layers={trained_layers}; the model has "
                             f"{len(layers)} (1..{len(layers)})")
        if fixed_keys and trained_layers != 1:
            raise ValueError("LayerCache: fixed_keys keeps the top layer's keys and values, "
                             "which layers trained under it would change; it needs "
                             f"trained_layers=1, not {trained_layers}")
        if max_prompts < 1:
            raise ValueError(f"LayerCache: max_prompts={max_prompts}; must be >= 1")
        self.model = model  # whose lower layers compute every state
        self.start = len(layers) - trained_layers
        self.first_trained = layers[self.start]
        self.hidden_size = int(parts.norm.weight.shape[0])
        self.prompts = BoundedMemo(max_prompts)  # prompt key -> [P, H]
        self.tokens = BoundedMemo(max_prompts * TOKENS_PER_PROMPT)  # context key -> [H]
        self.prompt_caches = BoundedMemo(PROMPT_CACHES)  # prompt key -> lower KV cache
        self.prompt_passes = 0  # prompts run through the lower layers so far (a cost measure)
        self.mean = None  # no feature transform (FeatureCache's interface)
        # the top layer's key and value projections frozen: its keys and values at a
        # prompt's positions are the same for every reader, and kept with the states
        self.fixed_keys = fixed_keys
        self.prompt_keys = BoundedMemo(max_prompts)  # prompt key -> (keys, values)

    def features(self, contexts: Sequence[Context], reader: nn.Module | None = None
                 ) -> Tensor:
        """``[k, H]``: the last hidden state of each context under ``reader``'s top layers
        (``model``'s by default), differentiable in them when grad is on."""
        reader = self.model if reader is None else reader
        prompts, index, conts = self._states(contexts)
        first: dict[int, int] = {}  # prompt index -> its first context
        for j, i in enumerate(index):
            first.setdefault(i, j)
        tokens = [_ints(contexts[first[i]][0]) for i in range(len(prompts))]
        final_keys = None
        if self.fixed_keys:
            final_keys = [self._prompt_keys(t, s) for t, s in zip(tokens, prompts)]
        with autocast_for(reader):
            return top_hidden(reader, self.start, prompts, list(zip(index, conts)),
                              final_keys, shared=common_prefix_len(tokens)).float()

    @torch.no_grad()
    def _prompt_keys(self, prompt, states: Tensor) -> tuple[Tensor, Tensor]:
        key = context_key(prompt)[0]
        held = self.prompt_keys.get(key)
        if held is None:
            with autocast_for(self.model):
                held = prompt_keys_values(self.model, states)
            if len(self.prompt_keys) >= self.prompt_keys.size:
                self.prompt_keys.clear()
            self.prompt_keys[key] = held
        return held

    def prefetch(self, contexts: Sequence[Context]) -> None:
        """Compute and keep the states of ``contexts`` without running any top layers."""
        self._states(contexts)

    def head_logits(self, head: nn.Module, h: Tensor, rows: Tensor | None = None) -> Tensor:
        """``head``'s logits for last hidden states ``h [..., H]`` (over vocabulary ``rows``
        only, when given)."""
        return head_rows_logits(head, h, rows)

    def head_input(self, h: Tensor) -> Tensor:
        return h

    def fix_transform(self) -> None:
        """No transform to fix (FeatureCache's interface)."""

    def center_state(self) -> None:
        return None

    @torch.no_grad()
    def _states(self, contexts: Sequence[Context]
                ) -> tuple[list[Tensor], list[int], list[Tensor]]:
        """The distinct prompts' states, each context's prompt index, and each context's
        continuation states ``[L, H]``, computing those not held."""
        keys = [context_key(p, c) for p, c in contexts]
        model = self.model
        was_training = model.training
        model.eval()
        fresh: dict = {}  # this call's states (kept should a memo empty itself meanwhile)
        try:
            with autocast_for(model):
                todo: dict[bytes, tuple[list[int], set[tuple[int, ...]]]] = {}
                for (p, c), key in zip(contexts, keys):
                    if key[0] not in self.prompts and key[0] not in fresh:
                        fresh[key[0]] = self._run_prompt(key[0], _ints(p))
                    if len(c) and key not in self.tokens:
                        todo.setdefault(key[0], (_ints(p), set()))[1].add(tuple(_ints(c)))
                for pk, (prompt, conts) in todo.items():
                    fresh.update(self._run_continuations(pk, prompt, sorted(conts)))
        finally:
            model.train(was_training)
        order: dict[bytes, int] = {}
        prompts: list[Tensor] = []
        index: list[int] = []
        states: list[Tensor] = []
        for (_, c), key in zip(contexts, keys):
            if key[0] not in order:
                order[key[0]] = len(prompts)
                prompts.append(fresh[key[0]] if key[0] in fresh else self.prompts[key[0]])
            index.append(order[key[0]])
            if len(c):
                states.append(fresh[key] if key in fresh else self.tokens[key])
            else:
                states.append(torch.zeros(0, self.hidden_size, device=prompts[0].device))
        return prompts, index, states

    def _run_prompt(self, key: bytes, prompt: list[int]) -> Tensor:
        """Run the prompt through the lower layers: its states (kept) and its KV cache
        (kept too, for the continuations that follow it)."""
        from transformers import DynamicCache

        self.prompt_passes += 1
        cache = DynamicCache()
        states = self._lower(torch.tensor([prompt], device=self._device()), cache)
        if len(self.prompt_caches) >= self.prompt_caches.size:
            self.prompt_caches.clear()
        self.prompt_caches[key] = cache
        if len(self.prompts) >= self.prompts.size:
            self.prompts.clear()
            self.tokens.clear()
        self.prompts[key] = states
        return states

    def _run_continuations(self, key: bytes, prompt: list[int],
                           conts: list[tuple[int, ...]]) -> dict:
        """The states ``[L, H]`` of each continuation's tokens after the prompt, kept under
        (prompt, continuation). Continuations of one length run together, `ROWS` rows a
        forward over the prompt's KV cache (the last chunk filled with copies of its first
        row), so every forward has the same shape and a state does not depend on which
        other continuations were asked for with it."""
        if key not in self.prompt_caches:
            self._run_prompt(key, prompt)
        base = self.prompt_caches[key]
        device = self._device()
        out = {}
        by_length: dict[int, list[tuple[int, ...]]] = {}
        for c in conts:
            by_length.setdefault(len(c), []).append(c)
        for group in by_length.values():
            for i in range(0, len(group), ROWS):
                chunk = group[i:i + ROWS]
                rows = chunk + [chunk[0]] * (ROWS - len(chunk))
                states = self._lower(torch.tensor(rows, device=device),
                                     _copy_rows(base, ROWS, device))
                for j, c in enumerate(chunk):
                    out[(key, context_key(c)[0])] = states[j]
        if len(self.tokens) + len(out) > self.tokens.size:
            self.tokens.clear()
        self.tokens.update(out)
        return out

    def _lower(self, ids: Tensor, cache) -> Tensor:
        """Run ``ids [n, t]`` through the layers below ``start`` after ``cache`` (extended in
        place): the input of layer ``start``, ``[t, H]`` float32 for one row, else
        ``[n, t, H]``."""
        got: list[Tensor] = []

        def stop(_module, args, kwargs):
            got.append(args[0] if args else kwargs["hidden_states"])
            raise _Stop

        handle = self.first_trained.register_forward_pre_hook(stop, with_kwargs=True)
        try:
            self.model(input_ids=ids, **with_cache(cache))
        except _Stop:
            pass
        finally:
            handle.remove()
        h = got[0].float().clone()
        return h[0] if len(h) == 1 else h

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device


def _copy_rows(cache, n: int, device: torch.device):
    """A copy of a one-row KV cache with ``n`` rows (the original is left as it is)."""
    if cache.get_seq_length() == 0:  # no layer below the trained ones: nothing to copy
        return copy.deepcopy(cache)
    return select_rows(copy.deepcopy(cache), torch.zeros(n, dtype=torch.long, device=device))


def _ints(x: Sequence[int] | Tensor) -> list[int]:
    return x.tolist() if isinstance(x, Tensor) else list(x)


__all__ = ["LayerCache"]

"""`HFPolicy`: batched sampling from any Hugging Face causal LM, with exact log-probs.

A custom decoding loop over ``model.forward`` with a KV cache: prompts are left-padded
into one batch (explicit position ids, so padding never shifts positions), one forward
per new token, finished rows are dropped from the batch and the cache. Per sampled
token it records the log-prob (and optionally the entropy) of the distribution it was
sampled from; `sparring.policy.sampling` says precisely which. Randomness comes only
from the policy's seeded ``torch.Generator`` or, when the caller gives per-prompt
``seeds``, from one generator per prompt, so a run is reproducible.

Constrained decoding: ``allowed[i]`` lists the legal action strings of prompt ``i``;
the sampler then only follows token paths of a trie over ``encode(action) + [EOS]``
(each action's canonical tokenization) and records, per token, the allowed ids, which
``Turn.allowed_ids`` carries to the learner (`sparring.policy.forward` re-applies them).

Decoding: ``decode`` picks the KV cache the loop steps through
(`sparring.policy.decode_cache`): ``"dynamic"`` grows the model's cache and drops finished
rows; ``"compiled"`` preallocates it and replays a compiled decode step of fixed shapes.

Precision: every forward runs under the model's `precision.autocast_for` context (bf16
autocast for a ``bf16-mixed`` model, see `sparring.policy.precision`).

``adapter``: the LoRA adapter of a multi-adapter PEFT ``model`` (several policies on one
base, ``lora.shared_base``, and the pool's snapshots of them) that this policy is;
`activate` (called by ``generate``) makes it the active one before the model runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparring.memo import BoundedMemo
from sparring.policy.decode_cache import DECODE_KINDS, GrowingKV, StaticKV
from sparring.policy.feature_cache import feature_cache_of
from sparring.policy.hidden import capture_hidden, output_embedding
from sparring.policy.precision import autocast_for
from sparring.policy.prefix import (
    SHARED_PREFIX_MIN,
    common_prefix_len,
    distinct,
    run_prompts,
    select_rows,
)
from sparring.policy.sampling import (
    ActionPrefixes,
    Generation,
    SamplingParams,
    TokenTrie,
    check_generate_args,
    eos_ids,
    filter_logits,
)
from sparring.policy.scored_forward import scored_logits, supports

_CACHE_SIZE = 4096  # entries of each of HFPolicy's encoding caches


def resolve_device(device: str | torch.device) -> str | torch.device:
    """``model.device``: ``"auto"`` is CUDA where torch sees a GPU, else the CPU; any other
    value is returned as it is."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def device_unavailable(device: str | torch.device) -> str | None:
    """Why ``device`` cannot hold a model on this machine (None when it can): a config or
    a run folder may come from another machine, e.g. a run trained on a GPU read on a
    laptop."""
    kind = str(device).split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        return "torch sees no CUDA device here"
    if kind == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available here"
    return None


def is_adapter_weight(param_name: str, adapter: str) -> bool:
    """Whether ``param_name`` is a LoRA weight of ``adapter`` (``...lora_A.<adapter>.weight``)."""
    parts = param_name.split(".")
    return any(p.startswith("lora_") and nxt == adapter for p, nxt in zip(parts, parts[1:]))


def activate_adapter(model: Any, adapter: str) -> None:
    """Make ``adapter`` the active adapter of the multi-adapter PEFT ``model``. PEFT turns
    ``requires_grad`` on for its weights and off for every other adapter's; a frozen adapter
    (loaded for inference: a pool snapshot) has them off too."""
    model.set_adapter(adapter)
    if model.peft_config[adapter].inference_mode:
        for name, p in model.named_parameters():
            if is_adapter_weight(name, adapter):
                p.requires_grad_(False)


PREFETCH_FIRST_TOKENS = 64  # a cached prompt's legal first tokens computed with it (at most)


class HFPolicy:
    """Wraps ``model`` and ``tokenizer``; ``generate`` is the whole interface."""

    def __init__(self, model: Any, tokenizer: Any, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype | str | None = None, seed: int = 0, name: str = "policy",
                 adapter: str | None = None, decode: str = "dynamic"):
        if decode not in DECODE_KINDS:
            raise ValueError(f"unknown decode {decode!r}; known: {', '.join(DECODE_KINDS)}")
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        device = resolve_device(device)
        self.model = model.to(device=device, dtype=dtype) if dtype else model.to(device)
        self.model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.name = name
        self.adapter = adapter
        self.decode = decode
        self.eos_ids = eos_ids(tokenizer, getattr(model, "generation_config", None))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._tries = BoundedMemo(_CACHE_SIZE)  # action list -> TokenTrie
        self._encoded = BoundedMemo(_CACHE_SIZE)  # action string -> token ids

    @classmethod
    def from_pretrained(cls, path: str | Path, *, trust_remote_code: bool = False,
                        device: str = "cpu", dtype: torch.dtype | str | None = None,
                        seed: int = 0, name: str | None = None) -> HFPolicy:
        """Load a local folder (or hub id, offline-cached). ``trust_remote_code`` is off by default."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=trust_remote_code)
        return cls(model, tok, device=device, dtype=dtype, seed=seed, name=name or str(path))

    def activate(self) -> None:
        """Make this policy's adapter the model's active one (nothing without ``adapter``)."""
        if self.adapter is not None and self.model.active_adapter != self.adapter:
            activate_adapter(self.model, self.adapter)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """New weights from the learner (e.g. between training steps)."""
        self.model.load_state_dict(state)
        self.model.eval()

    def encode_actions(self, actions: Sequence[str]) -> TokenTrie:
        """The trie of ``encode(a) + [EOS]`` over legal actions ``a``, or, for
        `ActionPrefixes`, the open-ended trie of ``encode(a)`` (free text follows). Tries
        are immutable and cached per action list (games repeat their legal-move sets
        constantly), as are the token ids of each action string; both caches are bounded."""
        open_ended = isinstance(actions, ActionPrefixes)
        key = (open_ended, *actions)
        end = [] if open_ended else [self.eos_ids[0]]
        return self._tries.get_or(key, lambda: TokenTrie(
            [self._action_ids(a) + end for a in key[1:]], open_ended=open_ended))

    def _action_ids(self, action: str) -> list[int]:
        return self._encoded.get_or(
            action, lambda: self.tokenizer.encode(action, add_special_tokens=False))

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams | None = None,
                 allowed: Sequence[Sequence[str] | None] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """Sample one completion per prompt (token ids). ``allowed``: per prompt the legal
        action strings (constrained decoding) or None (free). ``seeds``: per prompt the seed
        of its own random stream, so a completion depends on its prompt, the weights and its
        seed, not on the other prompts of the batch (what lets rollouts be split among
        workers); None: all rows draw from the policy's ``generator``, in batch order."""
        return self._sample(prompts, sampling or SamplingParams(), allowed, seeds)[0]

    def generate_with_graph(self, prompts: Sequence[Sequence[int]],
                            sampling: SamplingParams | None = None,
                            allowed: Sequence[Sequence[str] | None] | None = None,
                            seeds: Sequence[int] | None = None
                            ) -> tuple[list[Generation], Tensor]:
        """`generate` with autograd on: the same completions (the same draws from the same
        generators), and their log-probs ``[B, S]`` (S the longest completion, 0 past a
        row's end and at tokens a constraint forced) as tensors whose graph runs back
        through the decoding to the weights. For an on-policy update that takes no
        optimizer step between sampling and the loss (`Learner.update`'s
        ``sampled_logp``): the learner's forward would recompute exactly these log-probs,
        so back-propagating through the sampler's own forward gives the same gradient
        without it. The graph holds every decode step's activations until the backward."""
        if self.decode != "dynamic" or feature_cache_of(self.model) is not None:
            raise ValueError("generate_with_graph decodes through the model's own dynamic "
                             "cache: model.decode='dynamic' and no feature cache")
        with torch.enable_grad():
            gens, parts = self._sample(prompts, sampling or SamplingParams(), allowed, seeds,
                                       graph=True)
        logp = torch.zeros(len(gens), max((len(g.token_ids) for g in gens), default=0),
                           device=self.device)
        for rows, cols, values in parts:  # one scatter per decode step
            logp = logp.index_put((rows, cols), values)
        return gens, logp

    def _sample(self, prompts: Sequence[Sequence[int]], sp: SamplingParams,
                allowed: Sequence[Sequence[str] | None] | None,
                seeds: Sequence[int] | None, graph: bool = False
                ) -> tuple[list[Generation], list[tuple[Tensor, Tensor, Tensor]]]:
        """The arguments checked, this policy's adapter active, `_decode` under the model's
        precision context; no prompts: nothing."""
        if not prompts:
            return [], []
        check_generate_args(prompts, allowed, seeds, max_new_tokens=sp.max_new_tokens,
                            max_positions=getattr(self.model.config, "max_position_embeddings",
                                                  None))
        self.activate()
        with autocast_for(self.model):
            return self._decode(prompts, sp, allowed, seeds, graph)

    def _decode(self, prompts: Sequence[Sequence[int]], sp: SamplingParams,
                allowed: Sequence[Sequence[str] | None] | None,
                seeds: Sequence[int] | None, graph: bool = False
                ) -> tuple[list[Generation], list[tuple[Tensor, Tensor, Tensor]]]:
        """`generate`'s decoding loop (under the model's precision context): the
        completions and, with ``graph``, each step's sampled log-probs as (rows, token
        positions, log-probs with their graph), else []."""
        B = len(prompts)
        gens = None if seeds is None else [
            torch.Generator(device=self.device).manual_seed(int(s)) for s in seeds]
        tries = [None if a is None else self.encode_actions(a) for a in (allowed or [None] * B)]
        nodes = [0] * B

        cache, z_next, mask, next_pos = self._first_logits(prompts, tries, sp.max_new_tokens)
        features = feature_cache_of(self.model)  # a transformed head: decode through it too
        transformed = features is not None and features.mean is not None
        if features is not None and self.decode != "dynamic":
            raise ValueError("model.decode='compiled' cannot decode through a head that reads "
                             "cached features (frozen_features with a cache): use "
                             "model.decode='dynamic'")
        kv = None if cache is None else self._decode_cache(cache, mask, next_pos, sp)

        rows = list(range(B))  # original index of each live batch row
        toks: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        ents: list[list[float]] = [[] for _ in range(B)]
        alw: list[list[list[int] | None]] = [[] for _ in range(B)]
        finish = ["length"] * B
        parts: list[tuple[Tensor, Tensor, Tensor]] = []
        eos = set(self.eos_ids)
        for step in range(sp.max_new_tokens):
            z = z_next.float() / sp.temperature
            keep = None  # rows without a trie, or past an action prefix, keep every token
            for k, r in enumerate(rows):
                if tries[r] is None:
                    continue
                if tries[r].is_free(nodes[r]):
                    alw[r].append(None)
                    continue
                if keep is None:
                    keep = torch.ones_like(z, dtype=torch.bool)
                a = tries[r].allowed(nodes[r])
                alw[r].append(a)
                keep[k] = False
                keep[k, a] = True
            if keep is not None:
                z = z.masked_fill(~keep, float("-inf"))
            z = filter_logits(z, sp.top_k, sp.top_p)
            logp = torch.log_softmax(z, dim=-1)
            if sp.greedy:
                tok = z.argmax(-1)
            else:
                u = (torch.rand(len(rows), generator=self.generator, device=self.device)
                     if gens is None else _uniforms([gens[r] for r in rows]))
                tok = _sample_rows(logp.exp(), u)
            lp_rows = logp.gather(-1, tok[:, None]).squeeze(-1)
            if graph:
                parts.append((torch.as_tensor(rows, device=self.device),
                              torch.as_tensor([len(toks[r]) for r in rows], device=self.device),
                              lp_rows))
            lp = lp_rows.tolist()
            ent = None
            if sp.with_entropy:
                p = logp.exp()
                ent = (-(p * logp.masked_fill(p == 0, 0.0)).sum(-1)).tolist()
            tl = tok.tolist()
            live = []
            for k, r in enumerate(rows):
                t = tl[k]
                toks[r].append(t)
                lps[r].append(lp[k])
                if ent is not None:
                    ents[r].append(ent[k])
                if tries[r] is not None:
                    nodes[r] = tries[r].step(nodes[r], t)
                    t = self._forced_tail(tries[r], r, t, nodes, toks, lps, ents, alw, sp, ent)
                if t in eos:
                    finish[r] = "eos"
                elif sp.stop and _hit_stop(self.tokenizer, toks[r], sp.stop):
                    finish[r] = "stop"
                else:
                    live.append(k)
            if not live or step + 1 >= sp.max_new_tokens:
                break
            if len(live) < len(rows):
                if kv is not None:
                    kv.keep(live)
                tok = tok[torch.as_tensor(live, device=self.device)]
                rows = [rows[k] for k in live]
            if kv is None:  # the first token came from cached features: run the prompts
                cache, _, mask, next_pos = self._prefill([prompts[r] for r in rows])
                kv = self._decode_cache(cache, mask, next_pos, sp)
            with capture_hidden(self.model) if transformed else nullcontext() as hs:
                z_next = kv.step(tok)
            if transformed:  # the head reads transformed features (feature_cache.head_logits)
                z_next = features.head_logits(output_embedding(self.model),
                                              hs[-1][:, -1].float())

        return [Generation(
            token_ids=toks[i], logprobs=lps[i],
            text=self.tokenizer.decode(toks[i], skip_special_tokens=True),
            finish_reason=finish[i], entropies=ents[i] if sp.with_entropy else None,
            allowed_ids=alw[i] if tries[i] is not None else None) for i in range(B)], parts

    def _decode_cache(self, cache: Any, mask: Tensor, next_pos: Tensor,
                      sp: SamplingParams) -> GrowingKV | StaticKV:
        """The prompts' cache as `decode` steps through it (room for every new token)."""
        if self.decode == "compiled":
            return StaticKV(self.model, cache, mask, next_pos, sp.max_new_tokens)
        return GrowingKV(self.model, cache, mask, next_pos)

    def _first_logits(self, prompts: Sequence[Sequence[int]],
                      tries: Sequence[TokenTrie | None], max_new_tokens: int
                      ) -> tuple[Any, Tensor, Tensor | None, Tensor | None]:
        """`_prefill`; or, when every row's first token decides its move (a game's one-token
        moves, their EOS forced), `_last_logits` and no KV cache (None, with the mask and
        positions): nothing runs past the first token; or, for a model with a feature cache
        (a frozen network, `sparring.policy.feature_cache`), the head on the prompts' cached
        features and no KV cache yet: in both cases `_decode` runs the prompts only for
        rows that go on past their first token. A constrained row's legal first tokens
        (up to `PREFETCH_FIRST_TOKENS`) are computed with its prompt, a token each over the
        prompt's KV cache: the learner scores the sampled move's next token after them, and
        later that context would cost the prompt's pass again. When every row is
        constrained the head runs over the allowed first tokens only (the others' logits
        are -inf, which the constraint would give them anyway), as the learner's does."""
        features = feature_cache_of(self.model)
        if features is None:
            decided = [None if t is None else t.tokens_after_first for t in tries]
            if all(n is not None and 1 + n <= max_new_tokens for n in decided):
                z = self._last_logits(prompts)
                if z is not None:
                    return None, z, None, None
            return self._prefill(prompts)
        first, inverse = distinct([tuple(p) for p in prompts])
        ahead = []
        legal = [None if tries[i] is None else tries[i].allowed(0) for i in first]
        for i, ids in zip(first, legal):
            if ids is not None and len(ids) <= PREFETCH_FIRST_TOKENS:
                ahead += [(prompts[i], (t,)) for t in ids]
        contexts = [(prompts[i], ()) for i in first]
        features.prefetch(ahead)
        h = features.features(contexts, self.model).to(self.device)
        head = output_embedding(self.model)
        if any(ids is None for ids in legal):
            z = features.head_logits(head, h)
        else:  # every row constrained: the head's rows of the allowed first tokens only
            sub = torch.as_tensor(sorted(set().union(*legal)), device=self.device)
            z = torch.full((len(first), head.weight.shape[0]), float("-inf"),
                           device=self.device)
            z[:, sub] = features.head_logits(head, h, sub).float()
        return None, z.index_select(0, torch.as_tensor(inverse, device=self.device)), None, None

    def _last_logits(self, prompts: Sequence[Sequence[int]]) -> Tensor | None:
        """The prompts' next-token logits ``[B, V]`` from one forward without a KV cache,
        each distinct prompt once, the top layer at its last position alone
        (`scored_forward.scored_logits`, the learner's own forward). None where
        `_prefill` does better or this does not apply: prompts that share a start
        `run_prompts` runs once, or a model outside the Llama family."""
        if not supports(self.model):
            return None
        first, inverse = distinct([tuple(p) for p in prompts])
        uniq = [prompts[i] for i in first]
        if len(uniq) > 1 and common_prefix_len(uniq) >= SHARED_PREFIX_MIN:
            return None
        ids = torch.full((len(uniq), max(map(len, uniq))), self.pad_id, dtype=torch.long)
        for i, q in enumerate(uniq):
            ids[i, :len(q)] = torch.as_tensor(list(q), dtype=torch.long)
        ends = torch.tensor([[len(q)] for q in uniq], dtype=torch.long)
        logits = scored_logits(self.model, ids.to(self.device), ends.to(self.device))[0]
        return logits[:, 0].index_select(0, torch.as_tensor(inverse, device=self.device))

    def _prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, Tensor, Tensor, Tensor]:
        """Run the prompts: (KV cache, next-token logits ``[B, V]``, attention mask ``[B, L]``,
        next position ``[B]``). Equal prompts (a group's samples, episodes from one start)
        run once and their common start once (`prefix.run_prompts`); caches and logits are
        then indexed out to the rows that share them."""
        first, inverse = distinct([tuple(p) for p in prompts])
        cache, z, mask, next_pos = run_prompts(self.model, [prompts[i] for i in first],
                                               self.pad_id, self.device)
        if len(first) < len(prompts):
            inv = torch.as_tensor(inverse, device=self.device)
            cache, z, mask, next_pos = select_rows(cache, inv), z[inv], mask[inv], next_pos[inv]
        return cache, z, mask, next_pos

    @staticmethod
    def _forced_tail(trie: TokenTrie, r: int, t: int, nodes: list[int], toks, lps, ents, alw,
                     sp: SamplingParams, ent) -> int:
        """When constrained decoding leaves row ``r`` a single way to finish (one child per
        node down to a leaf, which ends in EOS), append that tail without running the
        model: each forced token has probability 1 under the restricted distribution
        (log-prob 0, entropy 0, allowed ids [token]), exactly what the learner recomputes.
        Returns the row's last token (EOS when the tail was appended, else ``t``)."""
        tail = trie.forced_tail(nodes[r])
        if not tail or len(toks[r]) + len(tail) > sp.max_new_tokens:
            return t
        for c in tail:
            toks[r].append(c)
            lps[r].append(0.0)
            if ent is not None:
                ents[r].append(0.0)
            alw[r].append([c])
            nodes[r] = trie.step(nodes[r], c)
        return tail[-1]


def _uniforms(gens: Sequence[torch.Generator]) -> Tensor:
    """One uniform in [0, 1) from each of ``gens`` (a row's own stream)."""
    return torch.cat([torch.rand(1, generator=g, device=g.device) for g in gens])


def _sample_rows(p: Tensor, u: Tensor) -> Tensor:
    """One token per row of ``p [B, V]`` by inverse-CDF sampling: the first token whose
    cumulative probability exceeds ``u[k]`` times the row's total. Zero-probability tokens
    are never chosen, also when rounding puts ``u[k]`` times the total on the total itself
    (no token exceeds it: the row's last token with p > 0 is taken)."""
    cdf = p.cumsum(-1)
    tok = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
    past = tok >= p.shape[-1]
    if past.any():
        tok[past] = (p[past] > 0).long().cumsum(-1).argmax(-1)
    return tok


def _hit_stop(tokenizer: Any, toks: list[int], stop: Sequence[str]) -> bool:
    longest = max(len(s) for s in stop)
    tail = tokenizer.decode(toks[-(longest + 8):], skip_special_tokens=False)
    return any(s in tail for s in stop)

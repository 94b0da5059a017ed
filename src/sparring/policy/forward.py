"""Recompute per-token log-probs (and entropies) of given sequences with a forward pass.

Used by the learner (new log-probs for the loss) and by the consistency test against
generation-time log-probs. Position t holds log p(ids[t] | ids[<t]); position 0 is 0.
With ``temperature != 1`` the distribution is softmax(logits / temperature), the same
tempered distribution the sampler records (see `sparring.policy.sampling`).

Constrained decoding: ``allowed`` (``TurnBatch.allowed``) gives, per row, a dict
``{position t: allowed token ids}``; at those positions the distribution is renormalised
over the allowed ids only, ``log p(x) = z_x - logsumexp_{y in allowed} z_y`` (and the
entropy is that of the restricted distribution), exactly what the sampler recorded.

``bonus``: what the per-token "entropy" tensor holds, the quantity an entropy bonus weighs
(`algorithm.entropy_bonus`): ``"entropy"``, ``H(pi) = logsumexp z - sum_a pi_a z_a``, or
``"uniform_kl"``, ``-KL(u || pi) = log k + (1/k) sum_a log pi_a`` with ``u`` uniform over the
k allowed ids (the whole vocabulary where nothing constrains), or ``"allowed_mass"``,
``log M``, ``M = sum_{a in allowed} pi_full(a)`` the probability the unconstrained policy
puts on the tokens constrained decoding allows (0 where nothing constrains): weighed as a
bonus it teaches the model to write a legal move, or an env's command word, without the
constraint (``log pi_full(x) = log pi_allowed(x) + log M``). Its gradient is not that of
``log M``, which is ``pi_allowed(a) (1 - M)`` on an allowed logit and would sharpen the
choice among the allowed tokens towards the one already preferred: it is ``(1 - M) / k``
on each of the k allowed logits alike and ``-pi_j`` on every other, raising M and leaving
the choice among the allowed tokens to the policy loss. Alike only within a state: where
an env offers fewer command words in some states (the calculator offers only ``answer:``
once its calls are spent), the bonus raises those words alone there, and the shared
weights carry the raise to the states that offer all of them, a tilt the policy loss has
to outweigh. The uniform KL's gradient on a logit is
``(1/k - pi_a)``: a pull towards uniform play that does not fade as ``pi_a -> 0``, where the
entropy's ``-pi_a (log pi_a + H)`` does; our logit-space reading of the mutation term of the
selection-mutation dynamics (Hofbauer and Huttegger, Games 2015), under which signalling
games leave their partial-pooling traps (docs/benchmarks.md, "Two-policy signalling").

A value head (`sparring.critic.value_head`) reads the same forward's last hidden states
(`token_logprobs_and_hidden`), so a critic on the policy costs no second pass and shares its
prompts as the log-probs do.

``scored``: where only some tokens' values are needed (the learner's action tokens), a
Llama-family model runs its top layer, LM head and log-softmax at those tokens alone
(`sparring.policy.scored_forward`); the other positions then hold 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext

import torch
from torch import Tensor

from sparring.policy.feature_cache import cached_prefix_logits, feature_cache_of
from sparring.policy.hidden import capture_hidden, shift_right
from sparring.policy.prefix import Prefixes, shared_prefix_logits, to_rows
from sparring.policy.scored_forward import (
    allowed_at_slots,
    applies,
    scored_logits,
    scored_positions,
)

Allowed = Sequence[dict[int, list[int]] | None]


BONUSES = ("entropy", "uniform_kl", "allowed_mass")


def logprobs_from_logits(logits: Tensor, ids: Tensor, temperature: float = 1.0,
                         with_entropy: bool = False, allowed: Allowed | None = None,
                         bonus: str = "entropy") -> tuple[Tensor, Tensor | None]:
    """``logits [n, T, V]`` predicting ``ids [n, T]`` shifted by one -> ``[n, T]`` (and the
    ``bonus`` per token, module docstring)."""
    if bonus not in BONUSES:
        raise ValueError(f"unknown bonus {bonus!r}; known: {', '.join(BONUSES)}")
    lg = logits[:, :-1].float()
    if temperature != 1.0:
        lg = lg / temperature
    logz = torch.logsumexp(lg, dim=-1)
    picked = torch.gather(lg, -1, ids[:, 1:, None]).squeeze(-1)
    lp = torch.zeros(ids.shape, dtype=lg.dtype, device=ids.device)
    lp[:, 1:] = picked - logz
    ent = None
    if with_entropy:
        ent = torch.zeros_like(lp)
        if bonus == "entropy":
            ent[:, 1:] = logz - (torch.softmax(lg, dim=-1) * lg).sum(-1)
        elif bonus == "uniform_kl":
            ent[:, 1:] = math.log(lg.shape[-1]) + lg.mean(-1) - logz
    if allowed is not None and any(allowed):
        _restrict(lg, ids, allowed, lp, ent, bonus, logz)
    return lp, ent


def _restrict(lg: Tensor, ids: Tensor, allowed: Allowed, lp: Tensor, ent: Tensor | None,
              bonus: str, logz_full: Tensor) -> None:
    """Overwrite ``lp``/``ent`` at constrained positions with the restricted distribution
    (``ent``: its ``bonus``; ``logz_full [n, T-1]``: the unrestricted log-normalisers).

    Flattens every (row, position, allowed id) triple and reduces per position with
    scatter ops (segment logsumexp), so the cost is one gather over the allowed ids."""
    rows, pos, seg, tok = [], [], [], []
    for r, d in enumerate(allowed):
        for t, a in (d or {}).items():
            seg += [len(rows)] * len(a)
            tok += a
            rows.append(r)
            pos.append(t)
    dev = lg.device
    R = torch.tensor(rows, dtype=torch.long, device=dev)
    P = torch.tensor(pos, dtype=torch.long, device=dev)
    S = torch.tensor(seg, dtype=torch.long, device=dev)
    A = torch.tensor(tok, dtype=torch.long, device=dev)
    if (P < 1).any() or (ids.shape[1] <= P).any():
        raise ValueError("allowed positions must lie in 1..T-1 of the row")
    m = len(rows)
    vals = lg[R[S], P[S] - 1, A]  # [M] logits of the allowed ids
    mx = torch.full((m,), float("-inf"), device=dev).scatter_reduce(0, S, vals, reduce="amax")
    sumexp = torch.zeros(m, device=dev).index_add_(0, S, (vals - mx[S]).exp())
    logz = mx + sumexp.log()
    lp[R, P] = lg[R, P - 1, ids[R, P]] - logz
    if ent is None:
        return
    if bonus == "entropy":
        p = (vals - logz[S]).exp()
        ent[R, P] = logz - torch.zeros(m, device=dev).index_add_(0, S, p * vals)
        return
    k = torch.zeros(m, device=dev).index_add_(0, S, torch.ones_like(vals))  # allowed ids
    if bonus == "allowed_mass":  # value log M; gradient (1 - M)/k on allowed, -pi elsewhere
        full = logz_full[R, P - 1]
        with torch.no_grad():
            log_mass = logz - full
            w = ((1 - log_mass.exp()) / k)[S] + (vals - full[S]).exp()
        surrogate = torch.zeros(m, device=dev).index_add_(0, S, w * vals) - full
        ent[R, P] = log_mass + surrogate - surrogate.detach()
    else:  # log k + mean_a z_a - logsumexp_a z_a
        ent[R, P] = k.log() + torch.zeros(m, device=dev).index_add_(0, S, vals) / k - logz


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                   temperature: float = 1.0, with_entropy: bool = False,
                   allowed: Allowed | None = None, prefixes: Prefixes | None = None,
                   bonus: str = "entropy", scored: Tensor | None = None
                   ) -> tuple[Tensor, Tensor | None]:
    """Forward ``model`` on right-padded ``input_ids [n, T]``; returns log-probs ``[n, T]``
    (and, ``with_entropy``, the ``bonus`` per token, module docstring).

    ``allowed``: per row ``{position: allowed token ids}`` from constrained decoding
    (``TurnBatch.allowed``), or None. ``prefixes``: `prefix.find_prefixes` of the rows to run
    each distinct prefix once (`prefix.shared_prefix_logits`); positions before a row's
    prefix end then get 0 (they are never action tokens). ``scored [n, T]`` (bool): the
    only positions whose values are needed, or None (module docstring)."""
    lp, ent, _ = _forward(model, input_ids, attention_mask, temperature, with_entropy,
                          allowed, prefixes, keep_hidden=False, bonus=bonus, scored=scored)
    return lp, ent


def token_logprobs_and_hidden(model: torch.nn.Module, input_ids: Tensor,
                              attention_mask: Tensor, temperature: float = 1.0,
                              with_entropy: bool = False, allowed: Allowed | None = None,
                              prefixes: Prefixes | None = None, bonus: str = "entropy",
                              scored: Tensor | None = None
                              ) -> tuple[Tensor, Tensor | None, Tensor]:
    """`token_logprobs` and the hidden states ``[n, T, H]`` they were computed from:
    ``hidden[:, t]`` is the last hidden state of the context ``ids[<t]`` (the state in which
    token ``t`` is predicted; 0 at t = 0 and, with ``prefixes``, before the row's prefix end,
    and with ``scored``, off the scored positions)."""
    return _forward(model, input_ids, attention_mask, temperature, with_entropy, allowed,
                    prefixes, keep_hidden=True, bonus=bonus, scored=scored)


def _forward(model, input_ids, attention_mask, temperature, with_entropy, allowed, prefixes,
             keep_hidden: bool, bonus: str = "entropy", scored: Tensor | None = None
             ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    if prefixes is None and scored is not None and applies(model, scored):
        pos = scored_positions(scored.bool())
        if is_sharded_module(model):  # its units gather their weights in their own forwards
            logits, targets, h = kept_logits(model, input_ids, attention_mask, pos, keep_hidden)
        else:
            logits, targets, h = scored_logits(model, input_ids, pos, keep_hidden)
        return _to_rows(logits, targets, pos, h, input_ids.shape[1], temperature,
                        with_entropy, None if allowed is None else allowed_at_slots(allowed, pos),
                        bonus)
    if prefixes is None:
        with capture_hidden(model) if keep_hidden else nullcontext([]) as hs:
            out = model(input_ids=input_ids, attention_mask=attention_mask.long(),
                        use_cache=False)
        lp, ent = logprobs_from_logits(out.logits, input_ids, temperature, with_entropy, allowed,
                                       bonus)
        return lp, ent, shift_right(hs[-1]) if keep_hidden else None  # hs[-1][:, t]: token t + 1
    shifted = None
    if allowed is not None:  # position t of row i -> t - plen_i + 1 of the shared logits
        pl = prefixes.plen.tolist()
        shifted = [None if d is None else {t - pl[i] + 1: a for t, a in d.items()}
                   for i, d in enumerate(allowed)]
    cache = feature_cache_of(model)  # a frozen network's features, run once per context
    if cache is None:
        logits, targets, pos, h = shared_prefix_logits(model, input_ids, attention_mask,
                                                       prefixes, keep_hidden=keep_hidden)
    else:
        logits, targets, pos, h, shifted = cached_prefix_logits(
            model, cache, input_ids, attention_mask, prefixes, keep_hidden=keep_hidden,
            allowed=shifted,  # the allowed mass needs the whole vocabulary's logits
            restrict_head=not (with_entropy and bonus == "allowed_mass"))
    return _to_rows(logits, targets, pos, h, input_ids.shape[1], temperature, with_entropy,
                    shifted, bonus)


def is_sharded_module(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded over ranks by FSDP2 (`fully_shard`): its weights are
    gathered only inside its own forward, so no part of it may be called directly."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def kept_logits(model: torch.nn.Module, ids: Tensor, attention_mask: Tensor,
                positions: Tensor, keep_hidden: bool = False
                ) -> tuple[Tensor, Tensor, Tensor | None]:
    """`scored_logits`' layout (logits and targets ``[n, 1 + K]``, hidden or None) from the
    model's own forward, its LM head run only at the contexts that predict ``positions
    [n, K]`` (``logits_to_keep``): every position's hidden state, but not every position's
    logits over the vocabulary."""
    n, T = ids.shape
    ctx = (positions - 1).clamp(0, T - 1)  # the context end predicting each scored token
    with capture_hidden(model) if keep_hidden else nullcontext([]) as hs:
        logits = model(input_ids=ids, attention_mask=attention_mask.long(), use_cache=False,
                       logits_to_keep=ctx).logits  # [n, K, V]
    logits = torch.cat([logits, logits.new_zeros(n, 1, logits.shape[-1])], 1)
    targets = torch.cat([ids.new_zeros(n, 1), ids.gather(1, positions.clamp(max=T - 1))], 1)
    h = None
    if keep_hidden:
        h = torch.cat([hs[-1], hs[-1].new_zeros(n, 1, hs[-1].shape[-1])], 1)
    return logits, targets, h


def _to_rows(logits: Tensor, targets: Tensor, pos: Tensor, h: Tensor | None, T: int,
             temperature: float, with_entropy: bool, allowed: Allowed | None, bonus: str
             ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-probs, the ``bonus`` and hidden states ``[n, T]`` of the rows from logits in
    `shared_prefix_logits`' layout (``allowed`` already in that layout's positions)."""
    lp, ent = logprobs_from_logits(logits, targets, temperature, with_entropy, allowed, bonus)
    hidden = None
    if h is not None:  # h[:, s] predicts targets[:, s + 1], i.e. logits' layout shifted
        hidden = to_rows(shift_right(h), pos, T)
    return (to_rows(lp, pos, T), None if ent is None else to_rows(ent, pos, T), hidden)

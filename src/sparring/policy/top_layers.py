"""The last N transformer layers of a Llama-family causal LM, run on stored input states.

Under the ``top_layers`` head (``model.head``, `sparring.policy.heads`) the layers below the
top N never change, so their output at each position of a context (the input of the first
trained layer) can be kept (`sparring.policy.layer_cache`). `top_hidden` runs the trained
layers on those states and returns what the model's own forward would give its LM head: the
final norm of the last layer's output at each context's last position. It is that forward's
arithmetic written out (pre-norm attention with rotary positions and grouped K/V heads, then
the MLP, each with a residual), using the model's own modules, so adapters on them (LoRA)
apply as they do there; tests/test_layer_cache.py checks it against the full forward.

Cost: the top layer needs its keys and values at every position but its output at one, so
it runs its attention query and MLP at the context's last position only; the layers under
it (N > 1) run at every position. Contexts share their prompt's positions: each distinct
prompt runs once, and a continuation's tokens attend to its prompt's keys and values; the
start every prompt holds alike (``shared``, a common system turn) runs once for them all.

Shapes: ``prompts`` a list of ``[P_i, H]`` states, ``contexts`` ``(prompt index,
continuation states [L_j, H])`` pairs (``L_j`` may be 0); the result ``[k, H]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_LAYER = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")


@dataclass
class DecoderParts:
    """The modules of a Llama-family decoder that `top_hidden` runs."""

    layers: nn.ModuleList
    norm: nn.Module  # the final norm, whose output the LM head reads
    rotary: nn.Module  # (states, position ids) -> (cos, sin)


def decoder_parts(model: nn.Module) -> DecoderParts:
    """The decoder layers, final norm and rotary embedding of ``model`` (a causal LM, or a
    PEFT model wrapping one); ValueError naming what is missing on another architecture."""
    total = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) == total:
            break
    else:
        raise ValueError(f"{type(model).__name__}: no list of config.num_hidden_layers "
                         "decoder layers found; the top_layers head needs a Llama-family "
                         "causal LM (Llama, Qwen2, Qwen3, Mistral)")
    missing = [n for n in ("norm", "rotary_emb") if not hasattr(module, n)]
    missing += [n for n in _LAYER if not hasattr(layers[0], n)]
    missing += [f"self_attn.{n}" for n in _ATTENTION
                if not hasattr(getattr(layers[0], "self_attn", None), n)]
    if missing:
        raise ValueError(f"{type(model).__name__}'s decoder lacks {', '.join(missing)}; the "
                         "top_layers head runs Llama-family layers (Llama, Qwen2, Qwen3, "
                         "Mistral)")
    return DecoderParts(layers, module.norm, module.rotary_emb)


def top_hidden(model: nn.Module, start: int, prompts: Sequence[Tensor],
               contexts: Sequence[tuple[int, Tensor]],
               final_keys: Sequence[tuple[Tensor, Tensor]] | None = None,
               shared: int = 0) -> Tensor:
    """The last hidden state ``[k, H]`` (the LM head's input) of each context, from the
    input states of layer ``start`` (module docstring), running layers ``start..`` of
    ``model``. Differentiable in those layers' weights and in the final norm's.
    ``final_keys``: per prompt the top layer's keys and values (`prompt_keys_values`),
    given when that layer's key and value projections are frozen (then they are the same
    for every model that shares them, and a caller keeps them). ``shared``: the number of
    leading positions at which every prompt holds the same tokens (a common system turn);
    the trained layers run those positions once, from ``prompts[0]``'s states, and every
    prompt's later positions attend to them."""
    parts = decoder_parts(model)
    top = list(parts.layers)[start:]
    if not top:
        raise ValueError(f"top_hidden: start={start}, but the model has "
                         f"{len(parts.layers)} layers")
    dev = prompts[0].device
    plen = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev)
    which = torch.tensor([i for i, _ in contexts], dtype=torch.long, device=dev)
    conts = [s for _, s in contexts]
    if final_keys is not None and len(top) == 1:
        kp, vp = (_pad_heads([kv[i] for kv in final_keys]) for i in (0, 1))
        ends = torch.stack([p[-1] for p in prompts]).to(kp.dtype)
    else:
        # every prompt keeps at least its last position apart from the shared start
        C = max(0, min(shared, int(plen.min()) - 1))
        head = prompts[0][None, :C]  # [1, C, H], run once for every prompt
        rest, rlen = _pad([p[C:] for p in prompts])  # [m, R, H]
        ropes = _split_ropes(parts, head, rest)  # the same for every trained layer
        if len(top) > 1:  # the layers under the top one run at every position
            head, rest, conts = _lower_trained(parts, top[:-1], head, rest, rlen, which,
                                               conts, ropes)
        layer = top[-1]
        kp, vp = _split_keys_values(layer.self_attn, layer.input_layernorm(head),
                                    layer.input_layernorm(rest), *ropes)
        ends = rest[torch.arange(len(prompts), device=dev), rlen - 1]
    return parts.norm(_final_layer(parts, top[-1], kp, vp, ends, plen, which, conts))


def _split_ropes(parts: DecoderParts, head: Tensor, rest: Tensor
                 ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The rotary tables of a shared start ``head [1, C, H]`` (positions ``0..C-1``) and of
    the later positions ``rest [m, R, H]`` (``C..C+R-1``)."""
    C, R = head.shape[1], rest.shape[1]
    dev = rest.device
    return (parts.rotary(rest, torch.arange(C, device=dev)[None]),
            parts.rotary(rest, C + torch.arange(R, device=dev)[None]))


def _split_keys_values(attn: nn.Module, hh: Tensor, hr: Tensor, rope_h: tuple[Tensor, Tensor],
                       rope_r: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """``attn``'s keys and values ``[m, kv, C + R, d]`` at every position of ``m`` prompts
    whose first ``C`` positions share the normed states ``hh [1, C, H]`` and whose later
    ones are ``hr [m, R, H]`` (rotary tables: `_split_ropes`); the shared part's
    projections run once."""
    kr, vr = _keys_values(attn, hr, rope_r)
    if not hh.shape[1]:
        return kr, vr
    ks, vs = _keys_values(attn, hh, rope_h)
    m = len(hr)
    return (torch.cat([ks.expand(m, -1, -1, -1), kr], 2),
            torch.cat([vs.expand(m, -1, -1, -1), vr], 2))


def _lower_trained(parts: DecoderParts, layers: Sequence[nn.Module], head: Tensor,
                   rest: Tensor, rlen: Tensor, which: Tensor, conts: Sequence[Tensor],
                   ropes: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]
                   ) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Trained layers below the top one, at every position: the prompts' shared start
    ``head [1, C, H]`` (causal, once), their later positions ``rest [m, R, H]`` (over the
    start, then causal within each prompt) and each continuation's ``[L_j, H]`` (over its
    prompt's keys and values, then causal within itself). ``ropes``: `_split_ropes` of
    ``head`` and ``rest``."""
    dev = rest.device
    C = head.shape[1]
    m, R, _ = rest.shape
    c, clen = _pad(conts, width=rest.shape[-1], like=rest)  # [k, L, H]
    k, L = c.shape[:2]
    rope_h, rope_r = ropes
    rope_c = parts.rotary(rest, C + rlen[which][:, None] + torch.arange(L, device=dev)[None])
    start_keys = torch.ones(C, dtype=torch.bool, device=dev)
    rest_keys = torch.arange(R, device=dev)[None] < rlen[which][:, None]  # [k, R]
    causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
    cont_mask = torch.cat([start_keys.expand(k, L, C), rest_keys[:, None].expand(k, L, R),
                           causal.expand(k, L, L)], -1)
    rest_mask = torch.cat([start_keys.expand(R, C),
                           torch.ones(R, R, dtype=torch.bool, device=dev).tril()], -1)
    causal_h = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    for layer in layers:
        attn = layer.self_attn
        hh, hr = layer.input_layernorm(head), layer.input_layernorm(rest)
        kp, vp = _split_keys_values(attn, hh, hr, rope_h, rope_r)  # [m, kv, C + R, d]
        if k and L:
            hc = layer.input_layernorm(c)
            kc, vc = _keys_values(attn, hc, rope_c)
            keys = torch.cat([kp.index_select(0, which), kc], 2)
            values = torch.cat([vp.index_select(0, which), vc], 2)
            c = c + attn.o_proj(_attend(attn, _queries(attn, hc, rope_c), keys, values,
                                        cont_mask[:, None]))
            c = c + layer.mlp(layer.post_attention_layernorm(c))
        rest = rest + attn.o_proj(_attend(attn, _queries(attn, hr, rope_r), kp, vp,
                                          rest_mask[None, None]))
        rest = rest + layer.mlp(layer.post_attention_layernorm(rest))
        if C:
            head = head + attn.o_proj(_attend(attn, _queries(attn, hh, rope_h),
                                              kp[:1, :, :C], vp[:1, :, :C],
                                              causal_h[None, None]))
            head = head + layer.mlp(layer.post_attention_layernorm(head))
    return head, rest, [c[j, :n] for j, n in enumerate(clen.tolist())]


def _final_layer(parts: DecoderParts, layer: nn.Module, kp: Tensor, vp: Tensor,
                 ends_p: Tensor, plen: Tensor, which: Tensor, conts: Sequence[Tensor]
                 ) -> Tensor:
    """The top layer's output ``[k, H]`` at each context's last position, one attention per
    prompt: its queries are the prompt's last position (input state ``ends_p [m, H]``) and
    the last token of each of its continuations; its keys, the prompt's positions (``kp``,
    ``vp`` ``[m, kv, P, d]``) and every continuation token, each query seeing the prompt
    and its own continuation (a tree over the shared prompt)."""
    dev = plen.device
    attn = layer.self_attn
    m = len(plen)
    rows = torch.arange(m, device=dev)
    last = plen - 1
    Pm = kp.shape[2]
    # the continuation tokens, flattened: prompt, context, offset among its prompt's
    lens = [len(s) for s in conts]
    with_cont = [j for j, n in enumerate(lens) if n]
    slot = torch.zeros(len(conts), dtype=torch.long, device=dev)  # query slot per context
    per_prompt = [0] * m
    tok_prompt, tok_off, tok_pos, tok_slot = [], [], [], []
    used = [0] * m
    pl = plen.tolist()
    wl = which.tolist()
    for j in with_cont:
        i = wl[j]
        per_prompt[i] += 1
        slot[j] = per_prompt[i]
        for t in range(lens[j]):
            tok_prompt.append(i)
            tok_off.append(used[i] + t)
            tok_pos.append(pl[i] + t)
            tok_slot.append(per_prompt[i])
        used[i] += lens[j]
    Q = 1 + max(per_prompt, default=0)
    T = max(used, default=0)
    H = ends_p.shape[-1]
    resid = ends_p.new_zeros(m, Q, H)
    resid = resid.index_put((rows, torch.zeros_like(rows)), ends_p)
    q_pos = torch.zeros(m, Q, dtype=torch.long, device=dev)
    q_pos[:, 0] = last
    mask = torch.zeros(m, Q, Pm + T, dtype=torch.bool, device=dev)
    mask[:, :, :Pm] = (torch.arange(Pm, device=dev)[None] < plen[:, None])[:, None]
    keys, values = kp, vp
    if with_cont:
        cj = torch.tensor(with_cont, dtype=torch.long, device=dev)
        ci, cs = which[cj], slot[cj]
        c_last = torch.stack([conts[j][-1] for j in with_cont]).to(resid.dtype)
        resid = resid.index_put((ci, cs), c_last)
        q_pos[ci, cs] = plen[ci] + torch.tensor([lens[j] - 1 for j in with_cont], device=dev)
        tokens = torch.cat([conts[j] for j in with_cont]).to(resid.dtype)  # [n, H]
        ti = torch.tensor(tok_prompt, dtype=torch.long, device=dev)
        to = torch.tensor(tok_off, dtype=torch.long, device=dev)
        rope_t = parts.rotary(tokens[None], torch.tensor(tok_pos, device=dev)[None])
        kt, vt = _keys_values(attn, layer.input_layernorm(tokens[None]), rope_t)  # [1,kv,n,d]
        d = kt.shape[-1]
        k_c = kt.new_zeros(m, T, kt.shape[1], d).index_put((ti, to), kt[0].transpose(0, 1))
        v_c = vt.new_zeros(m, T, vt.shape[1], d).index_put((ti, to), vt[0].transpose(0, 1))
        keys = torch.cat([kp.to(k_c.dtype), k_c.transpose(1, 2)], 2)
        values = torch.cat([vp.to(v_c.dtype), v_c.transpose(1, 2)], 2)
        mask[ti, torch.tensor(tok_slot, device=dev), Pm + to] = True
    h = layer.input_layernorm(resid)
    rope_q = parts.rotary(resid, q_pos)
    a = _attend(attn, _queries(attn, h, rope_q), keys, values, mask[:, None])  # [m, Q, h*d]
    y = resid + attn.o_proj(a)
    out = y + layer.mlp(layer.post_attention_layernorm(y))  # [m, Q, H]
    # index_select, not out[which, slot]: contexts repeat (rows that share a prompt), and
    # the indexing's backward sums their gradients in a thread-dependent order
    return out.flatten(0, 1).index_select(0, which * Q + slot)


def prompt_keys_values(model: nn.Module, states: Tensor) -> tuple[Tensor, Tensor]:
    """``model``'s top layer's keys and values ``[kv, P, d]`` at every position of a prompt
    whose input states of that layer are ``states [P, H]``."""
    top = decoder_parts(model).layers[-1]
    x = states[None]
    rope = decoder_parts(model).rotary(x, torch.arange(len(states), device=x.device)[None])
    kp, vp = _keys_values(top.self_attn, top.input_layernorm(x), rope)
    return kp[0], vp[0]


def _pad_heads(xs: Sequence[Tensor]) -> Tensor:
    """``[kv, P_i, d]`` tensors right-padded with zeros along P into ``[m, kv, max P, d]``."""
    P = max(x.shape[1] for x in xs)
    out = xs[0].new_zeros(len(xs), xs[0].shape[0], P, xs[0].shape[2])
    for i, x in enumerate(xs):
        out[i, :, :x.shape[1]] = x
    return out


def _pad(states: Sequence[Tensor], width: int | None = None, like: Tensor | None = None
         ) -> tuple[Tensor, Tensor]:
    """``states`` (``[T_i, H]``) right-padded with zeros into ``[n, max T, H]``, and ``[n]``
    their lengths."""
    ref = like if like is not None else states[0]
    lens = torch.tensor([len(s) for s in states], dtype=torch.long, device=ref.device)
    T = int(lens.max()) if len(states) else 0
    out = ref.new_zeros(len(states), T, width if width is not None else ref.shape[-1])
    for i, s in enumerate(states):
        if len(s):
            out[i, :len(s)] = s.to(out.dtype)
    return out, lens


def _heads(x: Tensor, d: int) -> Tensor:
    """``[n, T, heads * d] -> [n, heads, T, d]``."""
    return x.view(*x.shape[:2], -1, d).transpose(1, 2)


def _rotate(x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
    """Rotary positions on ``x [n, heads, T, d]`` (the halves convention of Llama)."""
    cos, sin = (r[:, None].to(x.dtype) for r in rope)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _head_dim(attn: nn.Module) -> int:
    return int(attn.head_dim)


def _queries(attn: nn.Module, h: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
    d = _head_dim(attn)
    q = attn.q_proj(h).view(*h.shape[:2], -1, d)
    if getattr(attn, "q_norm", None) is not None:  # Qwen3
        q = attn.q_norm(q)
    return _rotate(q.transpose(1, 2), rope)


def _keys_values(attn: nn.Module, h: Tensor, rope: tuple[Tensor, Tensor]
                 ) -> tuple[Tensor, Tensor]:
    d = _head_dim(attn)
    key = attn.k_proj(h).view(*h.shape[:2], -1, d)
    if getattr(attn, "k_norm", None) is not None:  # Qwen3
        key = attn.k_norm(key)
    return _rotate(key.transpose(1, 2), rope), _heads(attn.v_proj(h), d)


def _attend(attn: nn.Module, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """Scaled dot-product attention of ``q [n, h, T, d]`` over ``keys``, ``values``
    ``[n, kv, S, d]`` (each K/V head serving ``h / kv`` query heads), ``mask`` broadcastable
    to ``[n, h, T, S]`` (True: attend); ``[n, T, h * d]``."""
    n, h, T, d = q.shape
    kv = keys.shape[1]
    groups = h // kv
    scale = getattr(attn, "scaling", d ** -0.5)
    # query heads i * groups .. (i + 1) * groups - 1 share K/V head i: fold them into the
    # query positions of that head rather than repeating the keys and values
    q = q.reshape(n, kv, groups * T, d)
    mask = mask.expand(n, -1, T, -1)
    if mask.shape[1] != 1:
        raise ValueError("_attend: the mask must be the same for every head")
    mask = mask.repeat(1, 1, groups, 1)  # [n, 1, groups * T, S]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=scale)
    return out.reshape(n, h, T, d).transpose(1, 2).reshape(n, T, h * d)


__all__ = ["DecoderParts", "decoder_parts", "prompt_keys_values", "top_hidden"]

"""The update through the sampler's graph: the sampler's log-probs, with their autograd
graph (`HFPolicy.generate_with_graph`), as the loss's log-probs in place of the learner's
forward (`Learner.update`'s ``sampled_logp``).

With no optimizer step between sampling and the loss, the learner's forward would
recompute the sampled tokens' log-probs ``log pi(a_t | s_t)`` from the same weights, so the
gradient of the loss through the sampler's forward is the same gradient, for one forward
fewer. `sampled_rows` puts the sampler's ``[n, S]`` rows at the batch's action positions;
`check_sampled_logp` refuses every update where the two would differ.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sparring.config import Config


def sampled_rows(action_mask: Tensor, token_logp: Tensor, lengths: Tensor) -> Tensor:
    """The sampler's per-row token log-probs ``token_logp [n, S]`` (row i: the ``lengths[i]``
    tokens of the one turn of the batch's row i, in order, as
    `HFPolicy.generate_with_graph` returns them) at the batch's action positions
    (``action_mask [n, T]``): ``[n, T]``, 0 elsewhere, differentiable in ``token_logp``."""
    n, S = token_logp.shape
    counts = action_mask.sum(1).to(lengths.device)
    if action_mask.shape[0] != n or lengths.shape != (n,) or not torch.equal(counts, lengths):
        raise ValueError(f"{n} rows of sampled log-probs ({lengths.tolist()} tokens) do not "
                         f"match the batch's {action_mask.shape[0]} rows' action tokens "
                         f"({counts.tolist()}): one single-turn episode a row, in order")
    valid = torch.arange(S, device=token_logp.device)[None] < lengths.to(token_logp.device)[:, None]
    out = torch.zeros(action_mask.shape, dtype=token_logp.dtype, device=token_logp.device)
    return out.masked_scatter(action_mask.to(token_logp.device), token_logp[valid])


def has_dropout(model: nn.Module) -> bool:
    """Whether ``model`` drops anything while training: a dropout module with p > 0 or a
    Hugging Face config's ``attention_dropout`` above 0."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "attention_dropout", 0.0)) or any(
        isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def check_sampled_logp(sampled_logp: Tensor, n: int, T: int, cfg: Config, model: nn.Module, *,
                       critic: bool, sampler_correction: str, ranked: bool) -> None:
    """Raise, naming each reason, unless ``sampled_logp`` can stand in for the learner's
    forward in an update of ``n`` rows of ``T`` tokens: ``critic`` (a critic reads that
    forward), ``sampler_correction`` (the learner's importance correction level) and
    ``ranked`` (the update is split over learner ranks) describe the learner."""
    t, a = cfg.train, cfg.algorithm
    if tuple(sampled_logp.shape) != (n, T):
        raise ValueError(f"sampled_logp has shape {tuple(sampled_logp.shape)}, "
                         f"expected {(n, T)}")
    if not sampled_logp.requires_grad:
        raise ValueError("sampled_logp has no autograd graph: take it from "
                         "HFPolicy.generate_with_graph")
    why = [w for bad, w in (
        (t.epochs != 1, f"train.epochs={t.epochs} (must be 1)"),
        (bool(t.minibatch_size) and t.minibatch_size < n,
         f"train.minibatch_size={t.minibatch_size} splits the batch of {n} rows"),
        (critic, "a critic reads the forward"),
        (a.entropy_coef > 0, "an entropy bonus reads the forward (entropy_coef > 0)"),
        (sampler_correction != "off", "importance correction compares the learner's "
         "log-probs with the sampler's"),
        (ranked, "the update is split over learner ranks"),
        (has_dropout(model), "the model has dropout, which the learner's forward applies "
         "and the sampler's does not")) if bad]
    if why:
        raise ValueError("sampled_logp stands in for the learner's forward only in an update "
                         "of one optimizer step over the whole batch that needs nothing else "
                         "of that forward; here " + "; ".join(why))

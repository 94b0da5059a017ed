"""The learner's forward passes over a `TurnBatch`: one differentiable forward of some rows
(the loss's), and no-grad passes over every row in micro-batches (old, reference and
current log-probs, entropies, critic values).

What a forward saves, with the same result to float tolerance
(tests/test_prefix.py, tests/test_train_learner.py):

* ``train.share_rows``: a row repeated in the batch runs once, then is indexed out
  (indexing is differentiable: its gradient is the sum over the rows that repeat it);
* ``train.share_prefix``: the rows' distinct prompts, and the start they all share, run
  once each (`sparring.policy.prefix`) when that pays (`BatchForward.prefixes`);
* a value head reads the policy forward's own hidden states (no second pass);
* a Llama-family model runs its top layer and LM head at the action tokens alone
  (`sparring.policy.scored_forward`).

Every forward runs under the model's precision context (`sparring.policy.precision`:
bf16 autocast over float32 weights for a ``bf16-mixed`` model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor, nn

from sparring.data import TurnBatch
from sparring.policy.forward import (
    is_sharded_module,
    token_logprobs,
    token_logprobs_and_hidden,
)
from sparring.policy.lora import use_adapter
from sparring.policy.precision import autocast_for
from sparring.policy.prefix import (
    SHARED_PREFIX_MIN,
    Prefixes,
    distinct_rows,
    find_prefixes,
    first_action_positions,
)
from sparring.train.minibatches import micro_batches
from sparring.train.sharded_weights import reshard

if TYPE_CHECKING:
    from sparring.config import Config
    from sparring.critic.value_head import Critic
    from sparring.train.reference import Reference

PerRow = Literal["policy", "entropy", "ref", "values"]


def row_slices(batch: TurnBatch, rows: Tensor) -> tuple[Tensor, Tensor, int]:
    """Input ids ``[r, L]`` and attention of ``rows``, trimmed to their longest row ``L``."""
    att = batch.attention_mask[rows]
    L = max(int(att.sum(1).max()), 1) if len(rows) else 1
    return batch.input_ids[rows][:, :L], att[:, :L], L


def allowed_of(batch: TurnBatch, rows: Tensor) -> Sequence | None:
    """The constrained-decoding restrictions of ``rows`` (``TurnBatch.allowed``), or None."""
    return None if batch.allowed is None else [batch.allowed[i] for i in rows.tolist()]


class BatchForward:
    """The forward passes of one policy ``model`` (its LoRA ``adapter`` active, when it has
    one) at sampling ``temperature``, with its ``critic`` and KL ``reference`` when it has
    them."""

    def __init__(self, model: nn.Module, cfg: Config, temperature: float, *,
                 adapter: str | None = None, critic: Critic | None = None,
                 reference: Reference | None = None):
        self.model, self.cfg, self.temperature = model, cfg, temperature
        self.adapter, self.critic, self.reference = adapter, critic, reference
        self.device = next(model.parameters()).device

    def prefixes(self, ids: Tensor, att: Tensor, amask: Tensor | None) -> Prefixes | None:
        """The rows' prompts, to run each distinct one and their common start once, when
        that pays (`train.share_prefix`): at most half of the rows' prompts are distinct, or
        they all start with the same `SHARED_PREFIX_MIN` or more tokens (a system prompt, a
        chat-template header). Else None (a plain forward); always None for a model sharded
        over the learner ranks (its blocks' parts are called directly there), whose own
        forward runs its LM head at the action tokens alone (`forward.kept_logits`)."""
        if (amask is None or not self.cfg.train.share_prefix or ids.shape[0] < 2
                or is_sharded_module(self.model)):
            return None
        pre = find_prefixes(ids, first_action_positions(amask, att.sum(1)))
        pays = 2 * pre.count <= ids.shape[0] or pre.common >= SHARED_PREFIX_MIN
        return pre if pays else None

    def forward(self, ids: Tensor, att: Tensor, *, with_values: bool, allowed=None,
                amask: Tensor | None = None, bonus: str = "entropy"
                ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Policy log-probs, entropies (or another ``bonus`` per token,
        `sparring.policy.forward`) and (when asked and there is a critic) critic values,
        ``[n, T]`` each. ``allowed``: the rows' constrained-decoding restrictions;
        ``amask``: their action masks (to share prompts, see `prefixes`)."""
        return self._each_distinct_row(
            lambda *rows: self._forward(*rows, with_values=with_values, bonus=bonus),
            ids, att, allowed, amask)

    def _each_distinct_row(self, run, ids: Tensor, att: Tensor, allowed, amask: Tensor | None
                           ) -> tuple[Tensor | None, ...]:
        """``run(ids, att, allowed, amask)`` (a tuple of ``[n, T]`` results); with
        ``train.share_rows``, on each distinct row once (`distinct_rows`), then indexed out
        to the rows that repeat it."""
        if self.cfg.train.share_rows and ids.shape[0] > 1:
            first, inverse = distinct_rows(ids, att, allowed)
            if len(first) < ids.shape[0]:
                f = torch.as_tensor(first, device=ids.device)
                out = run(ids[f], att[f], None if allowed is None else [allowed[i] for i in first],
                          None if amask is None else amask[f])
                inv = torch.as_tensor(inverse, device=ids.device)
                # index_select: a fixed order of the repeated rows' gradients
                return tuple(None if x is None else x.index_select(0, inv) for x in out)
        return run(ids, att, allowed, amask)

    def _forward(self, ids: Tensor, att: Tensor, allowed, amask: Tensor | None, *,
                 with_values: bool, bonus: str) -> tuple[Tensor, Tensor, Tensor | None]:
        """`forward` of rows as they are (none shared)."""
        head = with_values and self.critic is not None and self.critic.kind == "head"
        pre = self.prefixes(ids, att, amask)
        scored = None if amask is None else amask > 0
        values = None
        with autocast_for(self.model):
            if head:  # the value head reads this forward's hidden states
                logp, ent, hidden = token_logprobs_and_hidden(
                    self.model, ids, att, self.temperature, with_entropy=True,
                    allowed=allowed, prefixes=pre, bonus=bonus, scored=scored)
                values = self.critic.values_from_hidden(hidden)
            else:
                logp, ent = token_logprobs(self.model, ids, att, self.temperature,
                                           with_entropy=True, allowed=allowed, prefixes=pre,
                                           bonus=bonus, scored=scored)
                if with_values and self.critic is not None:
                    values = self.critic.separate_values(ids, att)
        return logp, ent, values

    def _reference_logprobs(self, ids: Tensor, att: Tensor, allowed, amask: Tensor
                            ) -> tuple[Tensor]:
        """The KL reference's log-probs of rows as they are, ``([n, T],)``."""
        return token_logprobs(self.reference.model, ids, att, self.temperature,
                              allowed=allowed, prefixes=self.prefixes(ids, att, amask),
                              scored=amask > 0)[:1]

    def chunks(self, batch: TurnBatch) -> list[Tensor]:
        """The row indices of ``batch`` in the update's micro-batches
        (`minibatches.micro_batches`)."""
        t = self.cfg.train
        return micro_batches(torch.arange(batch.n_rows), batch.attention_mask.sum(1).cpu(),
                             t.microbatch_size, t.microbatch_tokens)

    def per_row(self, batch: TurnBatch, what: PerRow) -> Tensor:
        """``what`` over all rows, ``[n, T]``, zero off the action tokens, no gradient, in
        micro-batches, the model in eval mode: ``policy`` log-probs, their ``entropy``,
        the reference's log-probs (``ref``) or the critic's ``values``."""
        return self.per_rows(batch, what)[0]

    @torch.no_grad()
    def per_rows(self, batch: TurnBatch, *what: PerRow) -> tuple[Tensor, ...]:
        """`per_row` of each name in ``what``, from one pass over the rows (``ref``, the
        reference's own pass, only alone)."""
        if "ref" in what and len(what) > 1:
            raise ValueError(f"per_rows{what}: the reference's log-probs take their own pass")
        batch = batch.to(self.device)
        use_adapter(self.model, self.adapter)
        outs = [torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.device)
                for _ in what]
        was_training = self.model.training
        self.model.eval()
        try:
            for rows in self.chunks(batch):
                ids, att, L = row_slices(batch, rows)
                if what == ("ref",):
                    with self.reference.context(), autocast_for(self.reference.model):
                        outs[0][rows, :L] = self._each_distinct_row(
                            self._reference_logprobs, ids, att, allowed_of(batch, rows),
                            batch.action_mask[rows, :L])[0].float()
                else:
                    logp, ent, values = self.forward(
                        ids, att, with_values="values" in what,
                        allowed=allowed_of(batch, rows), amask=batch.action_mask[rows, :L])
                    got = {"values": values, "entropy": ent, "policy": logp}
                    for out, name in zip(outs, what):
                        out[rows, :L] = got[name].float()
        finally:
            self.model.train(was_training)
            model = self.reference.model if what == ("ref",) else self.model
            if is_sharded_module(model):  # no backward follows to free the root's weights
                reshard(model)
        return tuple(out * batch.action_mask for out in outs)

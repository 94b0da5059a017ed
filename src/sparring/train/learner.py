"""The learner: several epochs of mini-batch updates over one `TurnBatch`.

Each epoch orders the rows by ``train.minibatch_order`` (a random permutation, or the rows
of each prompt kept together: `sparring.train.minibatches`) and cuts them into mini-batches.
Per mini-batch (one optimizer step), over micro-batches of ``train.microbatch_size`` rows
or of ``train.microbatch_tokens`` padded tokens (the rows sorted by length), the loss is
`sparring.train.loss.micro_loss`'s

    L = agg(objective(logp, old_logp, A)) + c_kl * agg(KL_k(pi || ref))
        - c_ent * agg(H(pi)) + c_v * agg((V - target)^2 / 2)

with each micro-batch's forward from `sparring.train.batch_forward` (rows and prompts
shared, a value head on the policy's own hidden states, the model's precision context);
backward, optimizer and magnet stay in the weights' dtype. The reference
(`sparring.train.reference`) is the frozen initial model (with LoRA: the base model with
adapters disabled) or a "magnet": an EMA of the policy's weights, updated after every
optimizer step (regularised self-play, R-NaD / magnetic mirror descent).
With ``adapter=NAME`` (several policies as LoRA adapters on one base, ``lora.shared_base``)
the learner trains only that adapter's weights and activates it before every forward; a
magnet then copies the whole model (base included) once per such learner.
With ``algorithm.recompute_old_logp`` the step also reports how far the sampler's
log-probs of the sampled tokens are from the learner's recomputation under the same
weights: ``sampler/logp_diff_mean`` and ``sampler/logp_diff_max`` (of ``|log p_sampler -
log p_learner|`` over the action tokens) and ``sampler/kl`` (the k3 estimate of
KL(pi_sampler || pi_learner) on them). It is about 0 for the HF sampler in float32 (other
batch shapes only) and larger where the sampler is another engine or another precision;
``algorithm.importance_correction`` (token or turn) then reweights the advantages by the
truncated importance weight min(pi_learner / pi_sampler, c) (`sparring.importance`), and
``sampler/is_weight`` (its mean over the tokens) and ``sampler/is_weight_max`` are logged;
its default, ``auto``, is ``token`` on the vLLM backend (`sampler_correction_level`).
The recomputed log-probs come from `annotate`'s pass for a value head when there is one
(``TurnBatch.learner_logp``: one forward gives both, no weight moves in between).
A non-finite loss or gradient skips the optimizer step with a warning, and so does a step
that would leave a weight or an optimizer moment non-finite (it is undone, bit for bit:
`sparring.train.guarded_step`);
after ``max_skipped_updates`` consecutive skips `NonFiniteError` is raised.
With a process group of W > 1 learner ranks (`sparring.train.data_parallel`), each rank
trains on a contiguous share of every mini-batch's rows with the whole mini-batch's token
and sequence counts, the gradients are summed over the ranks before the optimizer step
(every rank then holds the same weights), and the metrics are those of the whole batch;
after `shard_optimizer`, each rank keeps and steps the optimizer state of its own share of
the weights only (`sparring.train.sharded_optimizer`); after `shard_weights`, the update
trains a copy of the model whose weights, gradients and optimizer state are sharded over
the ranks (FSDP2: `sparring.train.sharded_weights`), and rank 0's model gets the trained
weights back whole after each update (the other ranks free theirs). ``optimizer_state_mb``
reports the optimizer state this process holds.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor, nn

from sparring.aggregation import count_seqs, count_tokens
from sparring.config import Config
from sparring.critic.archer import Archer
from sparring.critic.value_head import Critic
from sparring.data import TurnBatch
from sparring.importance import sampler_level
from sparring.objectives import OBJECTIVES
from sparring.objectives import _load_families as _load_objectives
from sparring.policy.heads import build_head
from sparring.policy.hidden import output_embedding
from sparring.policy.lora import is_adapter_weight, load_parameters, use_adapter
from sparring.schedules import LRSchedule, lr_at
from sparring.train import data_parallel as dp
from sparring.train.batch_forward import BatchForward, allowed_of, row_slices
from sparring.train.entropy_target import EntropyTarget
from sparring.train.guarded_step import NonFiniteError, guarded_step
from sparring.train.loss import micro_loss
from sparring.train.minibatches import epoch_order, micro_batches, prompt_index
from sparring.train.param_groups import param_groups
from sparring.train.reference import Reference
from sparring.train.row_sparse_adamw import RowSparseAdamW, can_fuse
from sparring.train.sampled_graph import check_sampled_logp
from sparring.train.sharded_optimizer import OptimizerShard
from sparring.train.sharded_weights import (
    clip_grads,
    distribute_like,
    filler_rows,
    gather_trained,
    is_sharded,
    local,
    release,
    shard_copy,
    total_grad_norm,
    whole,
)

log = logging.getLogger(__name__)


def sampler_correction_level(cfg: Config) -> str:
    """The level of ``algorithm.importance_correction`` for the sampler's log-probs against
    the learner's recomputation (`sparring.importance.sampler_level`): off without
    ``recompute_old_logp``, ``auto`` being ``token`` on the vLLM backend."""
    return sampler_level(cfg.algorithm.importance_correction.level,
                         vllm=cfg.model.backend == "vllm",
                         recomputed=cfg.algorithm.recompute_old_logp)


def state_megabytes(optimizer: torch.optim.Optimizer) -> float:
    """The memory of the tensors ``optimizer`` keeps (AdamW's moments and steps), in MiB:
    this rank's share with a sharded optimizer."""
    return sum(local(t).numel() * t.element_size() for st in optimizer.state.values()
               for t in st.values() if isinstance(t, Tensor)) / 2**20


class Learner:
    """Owns the optimizer, schedule, reference / magnet model and critic of one policy."""

    def __init__(self, model: nn.Module, cfg: Config, *, needs: Collection[str] = (),
                 temperature: float | None = None, adapter: str | None = None):
        """``needs``: what the advantage stage asks the learner to supply
        (`AdvantageStage.needs`): ``values`` builds a critic (unless ``critic.enabled`` is
        off), ``utterance_critic`` ArCHer's twin Q/V critic; see `annotate`. ``adapter``:
        the one LoRA adapter of a multi-adapter PEFT ``model`` this learner trains."""
        self.model, self.cfg, self.adapter = model, cfg, adapter
        use_adapter(model, adapter)
        self.needs = frozenset(needs)
        self.head = build_head(cfg.model.head)  # what trains (sparring.policy.heads)
        self.head.freeze(model, lora=cfg.lora.enabled)  # what the head keeps as it started
        # the weights this learner trains (magnet and optimizer follow them)
        self.trained = {n for n, p in model.named_parameters() if p.requires_grad
                        and (adapter is None or is_adapter_weight(n, adapter))}
        self.device = next(model.parameters()).device
        a, c, o = cfg.algorithm, cfg.critic, cfg.optim
        self.temperature = cfg.rollout.temperature if temperature is None else temperature
        self.sampler_correction = sampler_correction_level(cfg)
        _load_objectives()
        self.objective = OBJECTIVES.get(a.objective)
        needs_ref = (a.kl.coef > 0 or "ref_logp" in self.objective.needs
                     or "ref_logp" in self.needs)
        self.reference = (Reference(model, a.kl.reference, a.kl.magnet_rate, self.trained)
                          if needs_ref else None)
        # ArCHer's utterance critic has its own optimizer (sparring.critic.archer)
        self.archer = (Archer(model, cfg) if "utterance_critic" in self.needs
                       and c.enabled != "off" else None)
        self.critic: Critic | None = None
        if self.archer is None and self._wants_values():
            self.critic = Critic(model, c.kind, c.hidden).to(self.device)
        # a frozen body's output layer: AdamW on the rows that have had a gradient only
        sparse = ([output_embedding(model).weight] if self.head.body_lr_scale == 0
                  and not o.weight_decay else [])
        self.optimizer = self._optimizer_over(model, sparse)
        # the head's own state: a frozen network's feature cache, which the reference's
        # copy (the same body) reads too
        copies = [] if self.reference is None or self.reference.copy is None else \
            [self.reference.copy]
        self.head_state = self.head.attach(model, *copies)
        self.features = self.head_state.features  # the frozen network's outputs (or None)
        self.passes = BatchForward(model, cfg, self.temperature, adapter=adapter,
                                   critic=self.critic, reference=self.reference)
        self.schedule = LRSchedule(self.optimizer, lr=o.lr, schedule=o.schedule,
                                   warmup_steps=o.warmup_steps, total_steps=cfg.train.steps,
                                   final_ratio=o.lr_final_ratio)
        self.entropy_target = (EntropyTarget(a.entropy_coef, a.entropy_target,
                                             a.entropy_target_rate)
                               if a.entropy_target is not None else None)
        self.gen = torch.Generator().manual_seed(cfg.train.seed)
        self.shard: OptimizerShard | None = None  # see shard_optimizer
        # distributed.sharding: full: the sharded copy the update trains (shard_weights)
        self.sharded_model: nn.Module | None = None
        self.train_passes = self.passes
        self.consecutive_skips = 0
        self.total_skips = 0

    # ------------------------------------------------------------ set-up helpers

    def _optimizer_over(self, model: nn.Module, sparse: list[Tensor], **kwargs: Any
                        ) -> RowSparseAdamW:
        """AdamW over ``model``'s trained weights and the critic's (`param_groups`), the
        ``sparse`` ones stepped on their touched rows only, fused where torch's kernel
        takes every weight (`can_fuse`); ``self.params`` becomes its parameters."""
        critic = [] if self.critic is None else [p for p in self.critic.parameters()
                                                 if p.requires_grad]
        groups = param_groups(model, self.trained, self.head.body_lr_scale, full_lr=critic)
        self.params = [p for g in groups for p in g["params"]]
        kwargs.setdefault("fused", can_fuse(self.params) or None)
        o = self.cfg.optim
        return RowSparseAdamW(groups, sparse=sparse, lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                              weight_decay=o.weight_decay, **kwargs)

    def entropy_coef(self) -> float:
        """The entropy bonus of this update: ``algorithm.entropy_coef`` on the
        ``entropy_schedule`` after ``entropy_warmup_steps`` (`sparring.schedules.lr_at`: a
        linear warm-up, then constant or its cosine with m = ``entropy_final_ratio``),
        counted in the lr schedule's updates; with ``entropy_target``, the weight it has
        adapted to (`sparring.train.entropy_target`)."""
        a = self.cfg.algorithm
        if self.entropy_target is not None:
            return self.entropy_target.coef
        schedule = a.entropy_schedule
        if schedule == "constant" and a.entropy_warmup_steps:
            schedule = "warmup"  # lr_at's constant has no warm-up
        return lr_at(self.schedule.step_count, lr=a.entropy_coef, schedule=schedule,
                     warmup_steps=a.entropy_warmup_steps, total_steps=self.cfg.train.steps,
                     final_ratio=a.entropy_final_ratio)

    def _wants_values(self) -> bool:
        mode = self.cfg.critic.enabled
        return mode == "on" or (mode == "auto" and "values" in self.needs)

    @property
    def ref_model(self) -> nn.Module | None:
        """The reference's own copy (a magnet, or a full model's frozen start), else None
        (no KL reference, or the LoRA model's base with its adapters disabled)."""
        return None if self.reference is None else self.reference.whole_model

    def _old_logp_pass(self, n: int) -> bool:
        """Whether an update over ``n`` rows recomputes the old log-probs in a pass of its
        own (``recompute_old_logp``, unless one optimizer step covers every row: then the
        loss's own forward gives them)."""
        t = self.cfg.train
        one_step = t.epochs == 1 and (t.minibatch_size or max(n, 1)) >= n
        return self.cfg.algorithm.recompute_old_logp and not one_step

    def values(self, batch: TurnBatch) -> Tensor:
        """Critic values on the action tokens ``[n, T]`` (for estimators that need them)."""
        if self.critic is None:
            raise ValueError("this learner has no critic (critic.enabled is off)")
        return self.passes.per_row(batch, "values")

    def policy_logprobs(self, batch: TurnBatch) -> Tensor:
        """The current policy's log-probs of the action tokens ``[n, T]``, no gradient (the
        proximal policy of an off-policy correction: `sparring.distributed.RayRollouts`)."""
        return self.passes.per_row(batch, "policy")

    def ref_logprobs(self, batch: TurnBatch) -> Tensor:
        if self.reference is None:
            raise ValueError("this run has no reference model (algorithm.kl.coef is 0)")
        return self.passes.per_row(batch, "ref")

    def annotate(self, batch: TurnBatch, needs: Collection[str]
                 ) -> tuple[TurnBatch, dict[str, float]]:
        """``batch`` with what an advantage stage ``needs`` from the learner, and metrics.

        ``values``: critic values on the action tokens; ``utterance_critic``: ArCHer's critic
        is first updated from its replay buffer (which takes in this batch), then its
        per-turn outputs go into ``batch.extras`` (q1, q2, v1, v2); ``ref_logp``: reference
        log-probs; ``entropies``: the current policy's token entropies (when the rollout did
        not record them)."""
        batch = batch.to(self.device)
        use_adapter(self.model, self.adapter)
        metrics: dict[str, float] = {}
        if "values" in needs or self.critic is not None:
            if self.critic is not None and self._old_logp_pass(batch.n_rows):
                # the update's recomputed old log-probs come from the values' pass: no
                # weight moves between the two
                values, logp = self.passes.per_rows(batch, "values", "policy")
                batch = batch.with_fields(values=values, learner_logp=logp)
            else:
                batch = batch.with_fields(values=self.values(batch))
        if "utterance_critic" in needs:
            if self.archer is None:
                raise ValueError("the estimator needs ArCHer's utterance critic, but this "
                                 "learner has none (critic.enabled is off)")
            metrics.update(self.archer.observe(batch))
            batch, td = self.archer.annotate(batch)
            metrics.update(td)
        if "ref_logp" in needs and batch.ref_logp is None:
            batch = batch.with_fields(ref_logp=self.ref_logprobs(batch))
        if "entropies" in needs and batch.entropy is None:
            batch = batch.with_fields(entropy=self.passes.per_row(batch, "entropy"))
        return batch, metrics

    # ------------------------------------------------------------ the update

    def _micro_loss(self, passes: BatchForward, batch: TurnBatch, rows: Tensor, adv: Tensor,
                    old: Tensor | None, ref: Tensor | None, mask: Tensor,
                    counts: dict[str, Any], stats: dict[str, float],
                    sampled_logp: Tensor | None = None) -> Tensor:
        """The loss of ``rows`` (`sparring.train.loss.micro_loss`) on their forward by
        ``passes``, or on the sampler's own log-probs ``sampled_logp [n, T]`` (`update`);
        ``old`` None: the old log-probs are this forward's own, detached (`update`)."""
        ids, att, L = row_slices(batch, rows)
        if sampled_logp is not None:
            logp = sampled_logp[rows, :L]
            ent, values = torch.zeros_like(logp), None
        else:
            logp, ent, values = passes.forward(ids, att, with_values=self.critic is not None,
                                               allowed=allowed_of(batch, rows),
                                               amask=batch.action_mask[rows, :L],
                                               bonus=self.cfg.algorithm.entropy_bonus)
        return micro_loss(self.cfg, batch, rows, logp, ent, values, adv=adv, old=old, ref=ref,
                          mask=mask, counts=counts, entropy_coef=self.entropy_coef(),
                          sampler_correction=self.sampler_correction,
                          objective_needs=self.objective.needs, stats=stats)

    def _skip(self, why: str) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.consecutive_skips += 1
        self.total_skips += 1
        log.warning("skipping an update: %s (%d in a row)", why, self.consecutive_skips)
        limit = self.cfg.train.max_skipped_updates
        if self.consecutive_skips >= limit:
            raise NonFiniteError(
                f"{self.consecutive_skips} consecutive updates had a non-finite {why.split()[1]}; "
                f"stopping (limit train.max_skipped_updates={limit}). Lower optim.lr, check "
                f"rewards/advantages for NaN or inf, or raise optim.max_grad_norm clipping.")

    def shard_optimizer(self) -> None:
        """From now on keep and step only this rank's share of the optimizer state
        (`sparring.train.sharded_optimizer`); in one process, nothing changes. Every rank
        calls it once, after every rank has loaded the run's start state."""
        ranks = dp.ranks()
        if ranks is not None and self.shard is None:
            self.shard = OptimizerShard(self.optimizer, ranks)
            self.shard.keep_own_state()

    def shard_weights(self) -> None:
        """From now on train a copy of the model sharded over the learner ranks (weights,
        gradients and optimizer state: `sparring.train.sharded_weights`), the optimizer
        state carried over; rank 0's model keeps the whole weights, copied back after
        each update, and the other ranks free their whole model. In one process, nothing
        changes. Every rank calls it once, after every rank has loaded the run's start
        state."""
        ranks = dp.ranks()
        if ranks is None or self.sharded_model is not None:
            return
        why = ("a frozen network's feature or layer cache" if self.features is not None else
               "an output layer trained on a frozen body (its rows step sparsely)"
               if self.head.body_lr_scale == 0 else
               "ArCHer's utterance critic" if self.archer is not None else
               "several LoRA adapters on one base" if self.adapter is not None else
               "an estimator that reads reference log-probs" if "ref_logp" in self.needs
               else None)
        if why is not None:
            raise ValueError(f"distributed.sharding: full does not support {why}; use "
                             "distributed.sharding: optimizer")
        before = self.optimizer.state_dict()
        self.sharded_model = shard_copy(self.model)
        if self.reference is not None:
            self.reference.follow(self.sharded_model, shard=self.reference.kind == "magnet")
        # foreach steps would mix sharded weights with the critic's whole ones in one op
        self.optimizer = self._optimizer_over(self.sharded_model, [], foreach=False)
        for g, old in zip(self.optimizer.param_groups, before["param_groups"]):  # not the kernel
            g.update({k: v for k, v in old.items() if k not in ("params", "foreach", "fused")})
        for i, p in enumerate(self.params):
            if i in before["state"]:
                self.optimizer.state[p] = {k: distribute_like(v, p) if isinstance(v, Tensor)
                                           else v for k, v in before["state"][i].items()}
        self.schedule.optimizer = self.optimizer
        self.train_passes = BatchForward(self.sharded_model, self.cfg, self.temperature,
                                         critic=self.critic, reference=self.reference)
        if ranks.rank != dp.LEADER:  # only rank 0 samples, evaluates and checkpoints
            release(self.model)
            if self.reference is not None and self.reference.whole is not None:
                release(self.reference.whole)

    def _sum_and_clip_grads(self, ranked: bool) -> tuple[float, list[Tensor]]:
        """The gradients summed over the learner ranks (``ranked``; onto their owners with a
        sharded optimizer) and clipped to ``optim.max_grad_norm``: their norm before
        clipping, and the parameters about to step (a sharded optimizer's; else [])."""
        max_norm = self.cfg.optim.max_grad_norm or math.inf
        if self.sharded_model is not None:  # FSDP summed the sharded ones; the critic's
            size = dp.ranks().size
            whole_params = [p for p in self.params if not is_sharded(p)]
            dp.all_reduce_grads(whole_params)
            for p in whole_params:
                if p.grad is not None:
                    p.grad.div_(size)  # its loss was scaled by the rank count too
            norm = total_grad_norm(self.params)
            if math.isfinite(norm) and max_norm < math.inf:
                clip_grads(self.params, max_norm, norm)
            return norm, []
        if self.shard is not None:
            stepped = self.shard.reduce_grads()
            return self.shard.clip_grads(stepped, max_norm), stepped
        if ranked:
            dp.all_reduce_grads(self.params)
        return float(torch.nn.utils.clip_grad_norm_(self.params, max_norm)), []

    def _guarded_step(self, grad_norm: float, stepped: list[Tensor]) -> bool:
        """The optimizer step, undone if it leaves a weight non-finite
        (`sparring.train.guarded_step`); with a sharded optimizer, this rank's share of
        it, then every weight of ``stepped`` from its owner."""
        if self.sharded_model is not None:
            return guarded_step(self.optimizer, grad_norm,
                                agree=lambda ok: dp.all_ranks(ok, self.device))
        if self.shard is None:
            return guarded_step(self.optimizer, grad_norm)
        kept = guarded_step(self.optimizer, grad_norm, agree=self.shard.agree)
        if kept:
            self.shard.share_weights(stepped)
        return kept

    def _micro_batches(self, rows: Tensor, minibatch: Tensor, lengths: Tensor
                       ) -> list[tuple[Tensor, bool]]:
        """This rank's ``rows`` of ``minibatch`` in micro-batches (`minibatches.micro_batches`
        over the batch's row ``lengths [n]``), as ``(rows, real)``; with sharded weights
        (``train.microbatch_size`` only) every rank runs as many as the rank with the most
        rows, the missing ones on a spare row whose loss is weighted 0
        (`sparring.train.sharded_weights.filler_rows`)."""
        t = self.cfg.train
        if self.sharded_model is None:
            return [(part, True) for part in micro_batches(
                rows, lengths[rows], t.microbatch_size, t.microbatch_tokens)]
        most = -(-len(minibatch) // dp.ranks().size)  # the largest share
        size = t.microbatch_size or max(most, 1)
        return filler_rows(rows, -(-most // size), size, minibatch[:1])

    def update(self, batch: TurnBatch, advantages: Tensor, keep: Tensor | None = None,
               sampled_logp: Tensor | None = None) -> dict[str, float]:
        """Train on ``batch`` with ``advantages [n, T]``; rows with ``keep[i] = False`` are
        left out of the loss. Returns the step's metrics.

        ``sampled_logp [n, T]``: the sampler's log-probs of the action tokens with their
        autograd graph (`HFPolicy.generate_with_graph`, placed by `sampled_rows`), used as
        the loss's log-probs instead of a learner forward. Exact where no optimizer step
        separates sampling from the loss: one epoch, one mini-batch and one micro-batch,
        and nothing else read from the policy's forward (no critic, no entropy bonus, no
        importance correction; a reference runs its own pass); raises otherwise."""
        batch, advantages = batch.to(self.device), advantages.to(self.device)
        n, T = batch.input_ids.shape
        if advantages.shape != (n, T):
            raise ValueError(f"advantages have shape {tuple(advantages.shape)}, expected {(n, T)}")
        if sampled_logp is not None:
            check_sampled_logp(sampled_logp, n, T, self.cfg, self.model,
                               critic=self.critic is not None or self.archer is not None,
                               sampler_correction=self.sampler_correction,
                               ranked=self.sharded_model is not None or dp.ranks() is not None)
        keep = (torch.ones(n, dtype=torch.bool) if keep is None else keep.bool()).to(self.device)
        if keep.shape != (n,):
            raise ValueError(f"keep has shape {tuple(keep.shape)}, expected ({n},)")
        cfg, a = self.cfg, self.cfg.algorithm
        model, passes = ((self.model, self.passes) if self.sharded_model is None
                         else (self.sharded_model, self.train_passes))
        use_adapter(model, self.adapter)
        self.head_state.before_update()
        mask = batch.action_mask & keep[:, None]
        norm = a.aggregation_norm if a.aggregation_norm is not None else float(T)
        mb = cfg.train.minibatch_size or max(n, 1)  # no rows: no optimizer step
        # recomputed old log-probs: with one optimizer step over the whole batch they are
        # the log-probs of the loss's own forward (no weight moves before it), so that
        # forward supplies them (None) instead of a second pass over every row
        if not a.recompute_old_logp:
            old = batch.old_logp
        elif sampled_logp is not None or not self._old_logp_pass(n):
            old = None
        elif batch.learner_logp is not None:  # `annotate`'s values pass computed them
            old = batch.learner_logp
        else:
            old = passes.per_row(batch, "policy")
        ref = None
        if self.reference is not None:
            ref = batch.ref_logp if batch.ref_logp is not None else passes.per_row(batch, "ref")
        ranks = dp.ranks()  # data-parallel learner ranks (sparring.train.data_parallel)
        stats: dict[str, float] = defaultdict(float)
        grad_norms: list[float] = []
        steps = skips = 0
        model.train()
        if self.critic is not None:
            self.critic.train()
        order = cfg.train.minibatch_order
        group = (prompt_index(batch.input_ids, batch.action_mask, batch.attention_mask)
                 if order == "prompt" else None)
        lengths = batch.attention_mask.sum(1).cpu()
        for _ in range(cfg.train.epochs):
            perm = epoch_order(order, n, group, self.gen)
            for start in range(0, n, mb):
                rows = perm[start:start + mb]
                if ranks is None:
                    m = mask[rows]
                    num_tokens, num_seqs = count_tokens(m), count_seqs(m)
                else:  # this rank's rows, the whole mini-batch's counts
                    rows = dp.rank_rows(rows, ranks.rank, ranks.size)
                    num_tokens, num_seqs = dp.global_counts(mask[rows])
                counts = dict(num_tokens=num_tokens, num_seqs=num_seqs, norm=norm)
                if counts["num_tokens"] == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                finite = True
                parts = self._micro_batches(rows, perm[start:start + mb], lengths)
                if sampled_logp is not None and len(parts) > 1:
                    raise ValueError("sampled_logp needs the batch in one micro-batch; "
                                     "train.microbatch_size / microbatch_tokens split it "
                                     f"into {len(parts)}")
                for part, real in parts:
                    loss = self._micro_loss(passes, batch, part, advantages, old, ref, mask,
                                            counts, stats if real else defaultdict(float),
                                            sampled_logp)
                    if self.sharded_model is not None:  # every rank runs every backward
                        finite = finite and (not real or bool(torch.isfinite(loss)))
                        (loss * (dp.ranks().size if real else 0.0)).backward()
                        continue
                    if not torch.isfinite(loss):
                        finite = False
                        break
                    loss.backward()
                if ranks is not None:  # all ranks skip together
                    finite = dp.all_ranks(finite, self.device)
                if not finite:
                    skips += 1
                    self._skip("non-finite loss")
                    continue
                gn, stepped = self._sum_and_clip_grads(ranks is not None)
                if not math.isfinite(gn):
                    skips += 1
                    self._skip("non-finite gradient")
                    continue
                if not self._guarded_step(gn, stepped):
                    skips += 1
                    self._skip("non-finite weight after the optimizer step (step undone)")
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                self.consecutive_skips = 0
                if self.reference is not None:
                    self.reference.pull()
                grad_norms.append(gn)
                steps += 1
        if self.sharded_model is not None:  # the whole trained weights, into rank 0's model
            leader = ranks.rank == dp.LEADER
            trained = gather_trained(self.sharded_model, self.trained)
            if leader:
                load_parameters(self.model, trained)
            if self.reference is not None and self.reference.whole is not None:  # a magnet
                trained = gather_trained(self.reference.copy, self.trained)
                if leader:
                    load_parameters(self.reference.whole, trained)
        if ranks is not None:
            stats = dp.reduce_stats(stats)
        out = {"lr": self.schedule.current()}
        if self.cfg.algorithm.entropy_coef > 0:
            out["entropy_coef"] = self.entropy_coef()
        self.schedule.step()
        ntok = max(stats.pop("_ntok", 0.0), 1.0)
        n_loss = max(steps + skips, 1)
        for k, v in stats.items():
            if k.startswith("_max/"):
                out[k[5:]] = v
            elif k.startswith("_tok/"):
                out[k[5:]] = v / ntok
            else:
                out[k] = v / n_loss
        if self.entropy_target is not None and steps > 0:
            self.entropy_target.observe(out["entropy"])
        out.update(grad_norm=sum(grad_norms) / max(len(grad_norms), 1), optimizer_steps=steps,
                   skipped_updates=skips, total_skipped_updates=self.total_skips,
                   optimizer_state_mb=state_megabytes(self.optimizer))
        return out

    # ------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        """The learner's state; with a sharded optimizer a collective of every rank, whose
        optimizer state is whole on rank 0 only (`OptimizerShard.full_state_dict`)."""
        optimizer = (self.optimizer.state_dict() if self.shard is None
                     else self.shard.full_state_dict())
        if self.sharded_model is not None:  # every rank gathers the shards, in one order
            optimizer = {**optimizer, "state": {
                i: {k: whole(v) if isinstance(v, Tensor) else v for k, v in st.items()}
                for i, st in optimizer["state"].items()}}
        st: dict[str, Any] = {
            "optimizer": optimizer, "schedule": self.schedule.state_dict(),
            "gen": self.gen.get_state(), "consecutive_skips": self.consecutive_skips,
            "total_skips": self.total_skips}
        if self.critic is not None:
            st["critic"] = self.critic.state_dict()
        if self.entropy_target is not None:
            st["entropy_target"] = self.entropy_target.state_dict()
        if self.archer is not None:
            st["archer"] = self.archer.state_dict()
        st.update(self.head_state.state_dict())  # the feature transform, if any
        magnet = None if self.reference is None else self.reference.magnet_state()
        if magnet is not None:
            st["magnet"] = {k: whole(v) for k, v in magnet.items()}
            st["magnet_steps"] = self.reference.steps
        return st

    def load_state_dict(self, st: dict[str, Any]) -> None:
        if self.sharded_model is not None:
            raise RuntimeError("a learner's state loads before its weights are sharded "
                               "(Learner.shard_weights)")
        self.optimizer.load_state_dict(st["optimizer"])
        if self.shard is not None:
            self.shard.keep_own_state()
        self.schedule.load_state_dict(st["schedule"])
        self.gen.set_state(st["gen"])
        self.consecutive_skips = int(st["consecutive_skips"])
        self.total_skips = int(st["total_skips"])
        self.head_state.load_state_dict(st)
        if self.critic is not None:
            self.critic.load_state_dict(st["critic"])
        if self.entropy_target is not None and "entropy_target" in st:
            self.entropy_target.load_state_dict(st["entropy_target"])
        if self.archer is not None:
            if "archer" not in st:
                raise KeyError("this run trains ArCHer's critic but the checkpoint holds none")
            self.archer.load_state_dict(st["archer"])
        if "magnet" in st:
            if self.reference is None:
                raise KeyError("checkpoint has magnet weights but this run has no magnet")
            self.reference.load_magnet_state(st["magnet"])
            self.reference.steps = int(st.get("magnet_steps", 0))

    def reference_state(self) -> dict[str, Tensor] | None:
        """Weights of a frozen 'initial' reference copy (saved once per run), else None."""
        return None if self.reference is None else self.reference.frozen_state()

    def load_reference_state(self, state: dict[str, Tensor]) -> None:
        if self.reference is None:
            raise KeyError("this run has no frozen reference model")
        self.reference.load_frozen_state(state)

"""Optimizer state sharded over the learner ranks (``distributed.sharding: optimizer``;
the first stage of ZeRO, Rajbhandari et al. 2020).

Data-parallel ranks (`sparring.train.data_parallel`) all hold the same weights and, after
the gradient all-reduce, the same gradients; without sharding each also holds AdamW's two
moments of every weight, twice the weights' own memory. With it, every trained parameter
has one *owner* rank (`owners`), and only the owner keeps its optimizer state and steps
it: per rank, AdamW's state shrinks to about 1/W. A step is then

1. each parameter's gradient summed over the ranks onto its owner (`reduce_grads`: a
   reduce, where unsharded ranks all-reduce), the other ranks dropping theirs;
2. the gradients clipped by their global norm (`clip_grads`): each rank computes the
   norms of its own gradients, the ranks exchange them (one small all-reduce), and every
   rank forms the total as `torch.nn.utils.clip_grad_norm_` does from the same norms in
   the same order;
3. each rank steps its own parameters (AdamW leaves a parameter without a gradient
   alone, state and all);
4. every stepped parameter is broadcast from its owner (`share_weights`, one broadcast
   per owner and dtype), so every rank again holds the same weights.

A step's traffic is then a reduce and a broadcast of the gradients' size, as much as
the unsharded all-reduce. The per-element arithmetic is that of one process, so the
weights and moments equal an unsharded update's bit for bit (on 2 ranks, where a sum of
two is the same in either order). The guarded step's decision to keep or undo a step is
agreed over the ranks (`agree`). A checkpoint needs the whole state: rank 0
gathers the shards (`full_state_dict`, a collective every rank joins) into the format of
one process, so a sharded run's checkpoint resumes unsharded, and the other way round;
`keep_own_state` drops the rest after a load.

What it does not shard: the weights (each rank holds them whole), the gradients while
the backward pass makes them (each rank's own, whole, until step 1), and the optimizer of
ArCHer's utterance critic.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from sparring.train import data_parallel as dp
from sparring.train.data_parallel import LEADER


def owners(sizes: list[int], world: int) -> list[int]:
    """The owner rank of each of the parameters of ``sizes`` elements: largest first, each
    to the rank that owns the fewest elements so far (the lowest rank on a tie), so the
    ranks' shares differ by at most the largest parameter."""
    load = [0] * world
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        out[i] = r
        load[r] += sizes[i]
    return out


class OptimizerShard:
    """This rank's share of ``optimizer``'s state, over the ranks ``ranks`` (module
    docstring). The owners follow the order of the optimizer's parameters, the same on
    every rank."""

    def __init__(self, optimizer: torch.optim.Optimizer, ranks: dp.Ranks):
        self.optimizer, self.ranks = optimizer, ranks
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.owner = {id(p): r for p, r in zip(params, owners([p.numel() for p in params],
                                                               ranks.size))}
        self.device = params[0].device if params else torch.device("cpu")

    def owns(self, p: Tensor) -> bool:
        return self.owner[id(p)] == self.ranks.rank

    def keep_own_state(self) -> None:
        """Drop the optimizer state of the parameters another rank owns."""
        for p in [p for p in self.optimizer.state if not self.owns(p)]:
            del self.optimizer.state[p]

    def reduce_grads(self) -> list[Tensor]:
        """Sum each parameter's gradient over the ranks onto its owner; the other ranks
        drop theirs. Returns the parameters about to step (those with a gradient on some
        rank, `dp.agreed_grads`), the same list on every rank."""
        stepped = dp.agreed_grads(p for g in self.optimizer.param_groups for p in g["params"])
        for p in stepped:
            dist.reduce(p.grad, dst=self.owner[id(p)])
            if not self.owns(p):
                p.grad = None
        return stepped

    def clip_grads(self, stepped: list[Tensor], max_norm: float) -> float:
        """Clip the gradients of ``stepped`` (this rank's own) to the global norm
        ``max_norm``; returns that norm (before clipping). It is
        `torch.nn.utils.clip_grad_norm_`'s over all of them, bit for bit: the same norm of
        each gradient, from its owner (the others add exact zeros), stacked in the same
        order (by device and dtype, then the parameters' order), the same 2-norm of them
        and the same clip coefficient."""
        if not stepped:
            return 0.0
        own = [p for p in stepped if self.owns(p)]
        norms = torch.zeros(len(stepped), dtype=torch.float64, device=self.device)
        if own:
            at = [i for i, p in enumerate(stepped) if self.owns(p)]
            norms[at] = torch.stack([n.double() for n in torch._foreach_norm(
                [p.grad for p in own])])
        dist.all_reduce(norms)
        groups: dict[tuple[torch.device, torch.dtype], int] = {}
        order = sorted(range(len(stepped)), key=lambda i: (
            groups.setdefault((stepped[i].device, stepped[i].dtype), len(groups)), i))
        total = torch.linalg.vector_norm(torch.stack(
            [norms[i].to(stepped[i].dtype) for i in order]), 2.0)
        torch.nn.utils.clip_grads_with_norm_(own, max_norm, total)
        return float(total)

    def share_weights(self, stepped: list[Tensor]) -> None:
        """Each of ``stepped`` from its owner to every rank: one broadcast of the
        concatenated parameters per owner and dtype."""
        buckets: dict[tuple[int, torch.dtype], list[Tensor]] = defaultdict(list)
        for p in stepped:
            buckets[self.owner[id(p)], p.dtype].append(p)
        with torch.no_grad():
            for (src, _), ps in sorted(buckets.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
                flat = torch.cat([p.reshape(-1) for p in ps])
                dist.broadcast(flat, src=src)
                if src != self.ranks.rank:
                    for p, part in zip(ps, flat.split([p.numel() for p in ps])):
                        p.copy_(part.view_as(p))

    def agree(self, ok: bool) -> bool:
        """True when ``ok`` holds on every rank (a step kept everywhere or nowhere)."""
        return dp.all_ranks(ok, self.device)

    def full_state_dict(self) -> dict[str, Any]:
        """A collective of all ranks. On rank 0: the optimizer's whole ``state_dict``, in
        the format of one process (every parameter's state, by its index in the
        optimizer); on the other ranks: their own shard's."""
        local = self.optimizer.state_dict()
        parts: list[Any] | None = ([None] * self.ranks.size if self.ranks.rank == LEADER
                                   else None)
        dist.gather_object(dp.to_cpu(local["state"]), parts, dst=LEADER)
        if parts is None:
            return local
        merged = {k: v for part in parts for k, v in (part or {}).items()}
        return {"state": dict(sorted(merged.items())), "param_groups": local["param_groups"]}

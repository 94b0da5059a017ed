"""FSDP2 (`fully_shard`) updates with rank 0 sampling alone between them, against one process.

    torchrun --nproc-per-node 2 bench/fsdp2_sampling.py            # gloo on CPUs
    torchrun --nproc-per-node 2 bench/fsdp2_sampling.py --steps 5

The tiny model's decoder layers and the root are sharded over the ranks. Each step: every
rank trains on its half of the batch, with its loss (normalised by the whole batch's token
count) scaled by W, since FSDP2 averages gradients and gloo has no ``PREMUL_SUM`` to make
that a sum; AdamW steps the shards. Then every rank unshards each sharded module (a
collective), the other ranks reshard at once (local), and rank 0 runs two forwards alone
with resharding after forward switched off (``set_reshard_after_forward(False)``; turned
back on for the layers only: the root's is off already, and turning it on desynchronises
the next backward), then reshards before the next step. Rank 0 prints, per step, the
largest difference of its forwards from one process's model trained on the whole batch,
and at the end the largest weight difference. Not a Sparring component: the probe behind
what docs/cluster.md says about FSDP2.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.distributed as dist

from sparring.train.learner_ranks import init_group


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    init_group("gloo")
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor

    from sparring.policy.tiny import build_tiny_model

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model, _ = build_tiny_model({"hidden_size": 32, "num_layers": 2, "num_heads": 4,
                                 "num_kv_heads": 2, "intermediate_size": 64})
    whole = copy.deepcopy(model)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    whole_opt = torch.optim.AdamW(whole.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    rows = 4 * world

    def loss_of(m: torch.nn.Module, ids: torch.Tensor, count: int) -> torch.Tensor:
        return m(input_ids=ids).logits.logsumexp(-1).sum() / count

    for step in range(args.steps):
        ids = torch.randint(1, 100, (rows, 10), generator=gen)
        if rank == 0:
            for m in sharded:
                m.reshard()
        mine = ids[rank * 4:(rank + 1) * 4]
        (loss_of(model, mine, ids.numel()) * world).backward()
        opt.step()
        opt.zero_grad()
        loss_of(whole, ids, ids.numel()).backward()
        whole_opt.step()
        whole_opt.zero_grad()
        for m in sharded:
            m.unshard()
        if rank == 0:
            model.set_reshard_after_forward(False)
            with torch.no_grad():
                want = whole(input_ids=ids[:2]).logits
                diff = max(float((model(input_ids=ids[:2]).logits - want).abs().max())
                           for _ in range(2))
            for layer in model.model.layers:
                layer.set_reshard_after_forward(True, recurse=False)
            print(f"step {step + 1}: rank 0's forwards alone, largest difference from one "
                  f"process {diff:.2e}", flush=True)
        else:
            for m in sharded:
                m.reshard()
        box = [None]
        dist.broadcast_object_list(box, src=0)  # the others wait while rank 0 samples
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v
            for k, v in model.state_dict().items()}
    if rank == 0:
        diff = max(float((full[k] - v).abs().max()) for k, v in whole.state_dict().items())
        print(f"after {args.steps} steps: largest weight difference from one process "
              f"{diff:.2e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

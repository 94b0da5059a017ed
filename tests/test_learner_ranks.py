"""Data-parallel learner ranks (`sparring.train.data_parallel`): one `Learner.update` on
2 gloo ranks over a batch equals one update in one process over the same batch.

Both ranks run in one pair of forked processes (every case of this module in turn; forked,
not spawned, so that they need not import torch again); the single-process
update runs here. Compared after the update: the weights and AdamW's first moments
(``exp_avg``, a multiple of the gradient, so a wrongly scaled gradient shows even where
Adam's step is scale-free) to atol 1e-6, rtol 1e-5 (float32, a different summation
order), and the step's metrics. Also: a rank left without rows (a mini-batch of one row),
and a non-finite loss on one rank only (every rank then skips the step, as one process
does, instead of one rank waiting on the others' gradients).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sparring.aggregation import count_seqs, count_tokens
from sparring.config import from_dict
from sparring.policy import forward
from sparring.policy.lora import apply_lora
from sparring.train import data_parallel as dp
from sparring.train import learner as learner_module
from sparring.train.batch_forward import BatchForward
from sparring.train.learner import Learner
from sparring.train.learner_ranks import torchrun_ranks
from sparring.train.sharded_optimizer import owners
from tests import train_helpers as th
from tests.test_train_learner import ragged_batch

pytestmark = pytest.mark.usefixtures("train_doubles")

ATOL, RTOL = 1e-6, 1e-5
WORLD = 2
SEED = 3  # train.seed: the learner's row permutation
# name: (config overrides, the ranks use their local counts instead of the global ones)
CASES = {
    "token-mean": ({"algorithm": {"aggregation": "token-mean"}}, False),
    "seq-mean": ({"algorithm": {"aggregation": "seq-mean-token-mean"}}, False),
    "token-mean-micro": ({"algorithm": {"aggregation": "token-mean"},
                          "train": {"minibatch_size": 5, "microbatch_size": 2, "epochs": 2}},
                         False),
    "seq-mean-micro": ({"algorithm": {"aggregation": "seq-mean-token-mean", "entropy_coef": 0.01,
                                      "kl": {"coef": 0.1}},
                        "train": {"minibatch_size": 5, "microbatch_size": 2, "epochs": 2}},
                       False),
    "one-row-minibatches": ({"algorithm": {"aggregation": "token-mean"},
                             "train": {"minibatch_size": 1}}, False),
    "nan-on-one-rank": ({"algorithm": {"aggregation": "token-mean"}}, False),
    "token-mean-local-counts": ({"algorithm": {"aggregation": "token-mean"}}, True),
    "seq-mean-local-counts": ({"algorithm": {"aggregation": "seq-mean-token-mean"}}, True),
    "token-mean-sharded": ({"algorithm": {"aggregation": "token-mean"},
                            "distributed": {"sharding": "optimizer"}}, False),
    "clipped": ({"algorithm": {"aggregation": "token-mean"},  # every step clipped
                 "optim": {"max_grad_norm": 1e-3}, "train": {"minibatch_size": 4}}, False),
    "clipped-sharded": ({"algorithm": {"aggregation": "token-mean"},
                         "optim": {"max_grad_norm": 1e-3}, "train": {"minibatch_size": 4},
                         "distributed": {"sharding": "optimizer"}}, False),
    "seq-mean-micro-sharded": ({"algorithm": {"aggregation": "seq-mean-token-mean",
                                              "entropy_coef": 0.01, "kl": {"coef": 0.1}},
                                "train": {"minibatch_size": 5, "microbatch_size": 2,
                                          "epochs": 2},
                                "distributed": {"sharding": "optimizer"}}, False),
}
# the same cases with the weights, gradients and optimizer state sharded (FSDP2)
CASES["magnet-critic"] = ({"algorithm": {"aggregation": "token-mean",
                                         "kl": {"coef": 0.1, "reference": "magnet",
                                                "magnet_rate": 0.2}},
                           "critic": {"enabled": "on", "target": "returns"},
                           "train": {"minibatch_size": 5, "microbatch_size": 2, "epochs": 2}},
                          False)
CASES["lora"] = ({"algorithm": {"aggregation": "token-mean", "kl": {"coef": 0.1}},
                  "lora": {"enabled": True, "r": 4, "alpha": 8},
                  "train": {"minibatch_size": 5, "microbatch_size": 2, "epochs": 2}}, False)
FULL = ("token-mean", "seq-mean-micro", "clipped", "one-row-minibatches", "magnet-critic",
        "lora")
for _name in FULL:
    CASES[f"{_name}-full"] = ({**CASES[_name][0], "distributed": {"sharding": "full"}}, False)
METRICS = ("loss", "policy_loss", "grad_norm", "approx_kl", "entropy", "optimizer_steps",
           "skipped_updates")


def make_cfg(over: dict):
    base = {"algorithm": {"estimator": "test_centered", "objective": "test_clip"},
            "optim": {"lr": 1e-3, "max_grad_norm": None},
            "train": {"steps": 10, "seed": SEED}, "logging": {"progress": False}}
    for sec, vals in over.items():
        for k, v in vals.items():
            if isinstance(v, dict):
                base.setdefault(sec, {}).setdefault(k, {}).update(v)
            else:
                base.setdefault(sec, {})[k] = v
    return from_dict(base)


def nan_row_advantages(adv, mask):
    """``adv`` with a NaN on an action token of the last row of the first epoch's
    permutation (rank 1's share of a whole-batch mini-batch)."""
    row = int(torch.randperm(len(adv), generator=torch.Generator().manual_seed(SEED))[-1])
    adv = adv.clone()
    adv[row, int(mask[row].nonzero()[0])] = float("nan")
    return adv


def one_update(name: str) -> dict:
    """Weights, AdamW first moments (zeros before any step) and metrics after one
    `Learner.update` of case ``name``; with a sharded optimizer the moments are those of
    the gathered state (whole on rank 0), and ``owned`` says which parameters' state this
    rank kept."""
    cfg = make_cfg(CASES[name][0])
    model = th.tiny_qwen(0)
    if cfg.lora.enabled:  # the adapters' A matrices drawn alike in every process
        torch.manual_seed(0)
        model = apply_lora(model, cfg.lora)
    learner = Learner(model, cfg)
    if cfg.distributed.sharding == "optimizer":
        learner.shard_optimizer()
    elif cfg.distributed.sharding == "full":
        learner.shard_weights()
    batch, adv = ragged_batch(n=9, max_action=5)  # uneven token counts per rank
    if name == "nan-on-one-rank":
        adv = nan_row_advantages(adv, batch.action_mask)
    metrics = learner.update(batch, adv)
    owned = [p in learner.optimizer.state for p in learner.params]
    state = learner.state_dict()["optimizer"]["state"]  # by the parameter's index
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "exp_avg": [state[i]["exp_avg"].clone() if i in state else torch.zeros_like(p)
                        for i, p in enumerate(learner.params)],
            "owned": owned, "sizes": [p.numel() for p in learner.params], "metrics": metrics}


def _local_counts(mask):
    return count_tokens(mask), count_seqs(mask)


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    th.register()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        for name, (_, local) in CASES.items():
            saved = dp.global_counts
            if local:
                dp.global_counts = _local_counts
            try:
                result = one_update(name)
            finally:
                dp.global_counts = saved
            torch.save(result, f"{out}/{name}.{rank}.pt")
        refused = {}  # what distributed.sharding: full refuses, with its message
        for head in ({"name": "frozen_features", "cache": 64}, {"name": "frozen_features",
                                                                "cache": 0}):
            learner = Learner(th.tiny_qwen(0), make_cfg({"model": {"head": head}}))
            try:
                learner.shard_weights()
            except ValueError as e:
                refused[head["cache"]] = str(e)
        torch.save(refused, f"{out}/refused.{rank}.pt")
    finally:
        dist.destroy_process_group()


def collect_before_fork() -> None:
    """Free this process's garbage before forking ranks: a child that collected it would run
    finalizers needing threads only the parent has (a dropped ``TCPStore`` joins its server
    thread, which in the child never ends)."""
    gc.collect()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    """``name -> [rank 0's result, rank 1's result]``, every case from one pair of ranks."""
    th.register()
    out = tmp_path_factory.mktemp("ranks")
    collect_before_fork()
    mp.start_processes(_rank, args=(_free_port(), str(out)), nprocs=WORLD, join=True,
                       start_method="fork")
    return {name: [torch.load(out / f"{name}.{r}.pt") for r in range(WORLD)]
            for name in [*CASES, "refused"]}


def max_diff(a: dict, b: dict) -> float:
    """The largest |a - b| over the weights and first moments."""
    pairs = [(a["weights"][k], b["weights"][k]) for k in a["weights"]]
    pairs += list(zip(a["exp_avg"], b["exp_avg"]))
    return max(float((x.double() - y.double()).abs().max()) for x, y in pairs)


def assert_same(a: dict, b: dict) -> None:
    for k in a["weights"]:
        torch.testing.assert_close(a["weights"][k], b["weights"][k], atol=ATOL, rtol=RTOL,
                                   msg=lambda m, k=k: f"weight {k}: {m}")
    for i, (x, y) in enumerate(zip(a["exp_avg"], b["exp_avg"])):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=RTOL,
                                   msg=lambda m, i=i: f"exp_avg of parameter {i}: {m}")
    for k in METRICS:
        if k in a["metrics"]:
            assert b["metrics"][k] == pytest.approx(a["metrics"][k], rel=RTOL, abs=ATOL), k


@pytest.mark.parametrize("name", ["token-mean", "seq-mean", "token-mean-micro",
                                  "seq-mean-micro", "one-row-minibatches", "clipped"])
def test_two_ranks_match_one_process(ranked, name):
    single = one_update(name)
    for result in ranked[name]:
        assert_same(single, result)
    print(f"{name}: max |2 ranks - 1 process| = {max_diff(single, ranked[name][0]):.3g}")


@pytest.mark.parametrize("name", ["token-mean", "seq-mean-micro"])
def test_ranks_hold_identical_weights(ranked, name):
    r0, r1 = ranked[name]
    for k in r0["weights"]:
        assert torch.equal(r0["weights"][k], r1["weights"][k]), k


@pytest.mark.parametrize("name", ["token-mean-local-counts", "seq-mean-local-counts"])
def test_local_counts_break_equality(ranked, name):
    """Each rank normalising by its own counts (not the global ones) gives another gradient:
    the comparison above detects it."""
    single = one_update(name.replace("-local-counts", ""))
    with pytest.raises(AssertionError):
        assert_same(single, ranked[name][0])


def test_non_finite_loss_on_one_rank_skips_the_step_on_all(ranked):
    single = one_update("nan-on-one-rank")
    assert single["metrics"]["skipped_updates"] == 1
    for result in ranked["nan-on-one-rank"]:
        assert result["metrics"]["skipped_updates"] == 1
        assert result["metrics"]["optimizer_steps"] == 0
        for k, w in th.tiny_qwen(0).state_dict().items():
            assert torch.equal(result["weights"][k], w), k


@pytest.mark.parametrize("name", ["token-mean-sharded", "seq-mean-micro-sharded",
                                  "clipped-sharded"])
def test_a_sharded_optimizer_matches_one_process(ranked, name):
    """Rank 0's gathered optimizer state and both ranks' weights equal one unsharded
    process's update (the weights on the two ranks bit for bit), and the unsharded ranks'
    update bit for bit (gradient norms and clipping included)."""
    base = name.removesuffix("-sharded")
    single = one_update(base)
    r0, r1 = ranked[name]
    assert_same(single, r0)
    if base == "clipped":
        assert single["metrics"]["grad_norm"] > 100 * 1e-3  # the clip acts on every step
    unsharded = ranked[base][0]
    for k in r0["weights"]:
        assert torch.equal(r0["weights"][k], r1["weights"][k]), k
        assert torch.equal(r0["weights"][k], unsharded["weights"][k]), k
    assert r0["metrics"]["grad_norm"] == unsharded["metrics"]["grad_norm"]


@contextlib.contextmanager
def sharded_forward():
    """One process's learner on the forward the sharded model runs (the model's own, its
    LM head at the action tokens alone: `forward.kept_logits`; no shared prompts, no top
    layer at the action tokens alone), and AdamW's unfused kernel, which the sharded weights
    step with: the same values up to rounding, which Adam's first steps magnify on
    near-zero gradients."""
    saved = forward.is_sharded_module, BatchForward.prefixes, learner_module.can_fuse
    forward.is_sharded_module = lambda model: True
    BatchForward.prefixes = lambda self, ids, att, amask: None
    learner_module.can_fuse = lambda params: False
    try:
        yield
    finally:
        forward.is_sharded_module, BatchForward.prefixes, learner_module.can_fuse = saved


@pytest.mark.parametrize("name", FULL)
def test_sharded_weights_match_one_process(ranked, name):
    """With the weights, gradients and optimizer state sharded (FSDP2), rank 0's whole
    weights and gathered first moments equal one process's update (micro-batches on one
    rank only, a rank without rows, every step clipped, a magnet and a critic, LoRA), and
    rank 1 has freed its whole copy."""
    with sharded_forward():
        single = one_update(name)
    rank0, rank1 = ranked[f"{name}-full"]
    assert_same(single, rank0)
    assert all(w.numel() == 0 for w in rank1["weights"].values())  # freed: rank 0 samples
    print(f"{name}, sharded: max |2 ranks - 1 process| = "
          f"{max_diff(single, ranked[f'{name}-full'][0]):.3g}")


def test_sharded_weights_keep_a_share_of_the_optimizer_state(ranked):
    """Each rank's AdamW moments hold about half the elements of one process's."""
    r0, r1 = ranked["token-mean-full"]
    whole = ranked["token-mean"][0]["metrics"]["optimizer_state_mb"]
    for r in (r0, r1):
        assert r["metrics"]["optimizer_state_mb"] < 0.6 * whole


def test_sharded_weights_refuse_a_frozen_body_with_a_clear_error(ranked):
    for refused in ranked["refused"]:
        assert "feature or layer cache" in refused[64]
        assert "output layer trained on a frozen body" in refused[0]
        assert all("distributed.sharding: optimizer" in m for m in refused.values())


def test_each_rank_keeps_the_optimizer_state_of_its_own_share(ranked):
    r0, r1 = ranked["token-mean-sharded"]
    assert not any(a and b for a, b in zip(r0["owned"], r1["owned"]))
    assert all(a or b for a, b in zip(r0["owned"], r1["owned"]))  # every weight trained here
    load = [sum(n for n, o in zip(r["sizes"], r["owned"]) if o) for r in (r0, r1)]
    assert abs(load[0] - load[1]) <= max(r0["sizes"])
    assert min(load) > 0


def test_owners_balance_the_elements_largest_first():
    # by hand, largest first: 10 -> rank 0 (loads 10, 0); 6 -> 1 (10, 6); 5 -> 1 (10, 11);
    # 4 -> 0 (14, 11); 1 -> 1 (14, 12)
    assert owners([5, 10, 1, 6, 4], 2) == [1, 0, 1, 1, 0]
    assert owners([3, 3, 3], 4) == [0, 1, 2]  # one rank left without a parameter
    assert owners([], 2) == []


def test_rank_rows_are_a_contiguous_partition():
    rows = torch.arange(11)
    for size in (1, 2, 3, 4, 16):
        shares = [dp.rank_rows(rows, r, size) for r in range(size)]
        assert torch.equal(torch.cat(shares), rows)
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def _torchrun_rank(rank: int, port: int, second_port: int, out: str) -> None:
    """One rank as torchrun starts it (its place in the environment): what
    `torchrun_ranks` gives, and whether a group is left joined after the block, when the
    block started the group and when it found one already there (that group on another
    port: a rank could otherwise reach the first group's store as rank 0 closes it)."""
    import os

    os.environ.update(WORLD_SIZE=str(WORLD), RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    with torchrun_ranks() as r:
        seen = (r.rank, r.size)
    left = not dist.is_initialized()
    os.environ["MASTER_PORT"] = str(second_port)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    with torchrun_ranks():
        pass
    kept = dist.is_initialized()
    dist.destroy_process_group()
    torch.save({"seen": seen, "left": left, "kept": kept}, f"{out}/torchrun.{rank}.pt")


def test_torchrun_ranks_leave_the_group_they_started_and_only_that(tmp_path):
    port = _free_port()
    second = next(p for p in iter(_free_port, None) if p != port)
    collect_before_fork()
    mp.start_processes(_torchrun_rank, args=(port, second, str(tmp_path)), nprocs=WORLD,
                       join=True, start_method="fork")
    got = [torch.load(tmp_path / f"torchrun.{r}.pt") for r in range(WORLD)]
    assert got == [{"seen": (r, WORLD), "left": True, "kept": True} for r in range(WORLD)]


# A group of one rank, then `torch.distributed.nn` imported (as transformers' modeling_utils
# does), then the group destroyed: prints 1 if the group object is still alive, else 0.
GROUP_LEFT_AFTER_DESTROY = """
import gc, sys, weakref
import torch.distributed as dist
from sparring.train.learner_ranks import init_group
start = init_group if sys.argv[1] == "init_group" else dist.init_process_group
start("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
import torch.distributed.nn
group = weakref.ref(dist.group.WORLD)
dist.destroy_process_group()
gc.collect()
print(int(group() is not None))
"""


def test_a_group_from_init_group_is_freed_at_destroy_though_torch_distributed_nn_is_imported_later(
        tmp_path):
    """Imported after `dist.init_process_group`, `torch.distributed.nn` holds the group in
    its default arguments, so the group (and its gloo threads, which can abort the process
    at exit) outlives `dist.destroy_process_group`; `init_group` imports it first, and the
    group is freed."""
    left = {}
    for start in ("init_process_group", "init_group"):
        done = subprocess.run([sys.executable, "-c", GROUP_LEFT_AFTER_DESTROY, start,
                               str(tmp_path / start)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        left[start] = int(done.stdout.split()[-1])
    assert left == {"init_process_group": 1, "init_group": 0}


def test_no_process_group_means_one_process():
    assert not dist.is_initialized()
    assert dp.ranks() is None

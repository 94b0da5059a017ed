"""examples/minimal_selfplay.py computes what the trainer computes: on one batch of its own
self-play games, its advantages equal the trainer's advantage stage, its PPO loss and
gradient equal `sparring.train.loss.micro_loss` on the trainer's forward, and its update
loop moves the weights as `sparring.train.learner.Learner.update` does; and it runs."""

import copy
import importlib.util
import math
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import yaml

from sparring import Config, collate
from sparring.aggregation import count_seqs, count_tokens
from sparring.objectives import OBJECTIVES
from sparring.policy import forward
from sparring.train.batch_forward import BatchForward, allowed_of, row_slices
from sparring.train.learner import Learner
from sparring.train.loss import micro_loss
from sparring.train.policies import advantage_stage

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minimal_selfplay.py"
# The loss and its gradient: the trainer runs the prompts the rows share once, the example
# runs every row whole, so float32 sums differ in order (measured: 1e-8 on a loss of 0.05,
# 3e-8 on gradients up to 0.05). The weights after an update: the same forward on both
# sides (bit for bit today); a real difference moves them by about the lr, 3e-4.
LOSS_TOL = dict(rtol=1e-5, atol=1e-6)
GRAD_TOL = dict(rtol=1e-3, atol=1e-6)
WEIGHT_TOL = dict(rtol=1e-5, atol=1e-7)


def load_example():
    spec = importlib.util.spec_from_file_location("minimal_selfplay", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ex():
    return load_example()


@pytest.fixture(scope="module")
def played(ex):
    """(policy, batch): 4 deals x 8 games of Kuhn poker by the example's untrained policy."""
    policy = ex.build_policy()
    episodes = ex.rollout(ex.build_arena(), policy, step=1, groups=4, group_size=8)
    return policy, collate(episodes, pad_id=policy.pad_id)


def trainer_config(ex, folder: Path, minibatch: int, share_prefix: bool = True) -> Config:
    """The trainer's config (from the built-in defaults, not a recipe) with the example's
    estimator, objective, aggregation, entropy bonus, optimizer and batch sizes; the rest
    stays off as in the example: no KL term, no critic, constant lr and bonus.
    ``share_prefix``: the trainer's forward runs shared prompts once (its default)."""
    recipe = {
        "envs": [{"name": ex.ENV, "options": ex.ENV_OPTIONS}],
        "rollout": {"temperature": ex.TEMPERATURE, "max_new_tokens": ex.MAX_NEW_TOKENS,
                    "history": "state", "system_prompt": "", "invalid_action": "constrained"},
        "algorithm": {"estimator": ex.ESTIMATOR, "estimator_options": ex.ESTIMATOR_OPTIONS,
                      "objective": "ppo_clip", "objective_options": {"eps_low": ex.CLIP},
                      "aggregation": ex.AGGREGATION, "entropy_coef": ex.ENTROPY_COEF},
        "optim": {"lr": ex.LR, "weight_decay": 0.0, "max_grad_norm": ex.MAX_GRAD_NORM},
        "train": {"epochs": ex.EPOCHS, "minibatch_size": minibatch, "seed": 0,
                  "share_prefix": share_prefix},
    }
    path = folder / "trainer.yaml"
    path.write_text(yaml.safe_dump(recipe))
    cfg = Config.load(path)
    a = cfg.algorithm
    assert (a.kl.coef, a.entropy_schedule, cfg.optim.schedule, a.recompute_old_logp) == (
        0.0, "constant", "constant", False)
    return cfg


def test_advantages_equal_the_trainers_advantage_stage(ex, played, tmp_path):
    """Bit for bit (the same estimator, reached two ways), on a batch where they are not
    trivial: of both signs and of several sizes, so that a sign, a centring or a scale
    that differed would show."""
    _, batch = played
    stage = advantage_stage(trainer_config(ex, tmp_path, minibatch=0))
    adv, keep = stage(batch)
    mine = ex.advantages(batch)
    torch.testing.assert_close(mine, adv * keep[:, None], rtol=0, atol=0)
    on_actions = mine[batch.action_mask]
    assert (on_actions > 0).any() and (on_actions < 0).any()
    assert len(torch.unique(on_actions.abs())) > 2


def test_ppo_loss_and_gradient_equal_the_trainers_micro_loss(ex, played, tmp_path):
    """One mini-batch of rows, old log-probs moved by up to +-0.5 nats so that ratios fall
    on both sides of the clip range with advantages of both signs: the example's loss
    (its forward, its clipped surrogate, `aggregate`, the entropy bonus) against
    `micro_loss` on the trainer's `BatchForward`, in value and in gradient. With the clip
    at 0.3 instead of the trainer's 0.2 the loss differs far beyond the tolerance."""
    policy, batch = played
    cfg = trainer_config(ex, tmp_path, minibatch=0)
    model = policy.model
    gen = torch.Generator().manual_seed(1)
    shift = (torch.rand(batch.old_logp.shape, generator=gen) - 0.5) * batch.action_mask
    batch = batch.with_fields(old_logp=batch.old_logp + shift)
    adv = ex.advantages(batch)
    rows = torch.randperm(batch.n_rows, generator=gen)[:48]

    def grads():
        out = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return out

    model.zero_grad(set_to_none=True)
    logp, ent, L = ex.logprobs(model, batch, rows)
    mask = batch.action_mask[rows, :L]
    old = batch.old_logp[rows, :L]
    mine, stats = ex.ppo_loss(logp, old, adv[rows, :L], mask, ent)
    mine.backward()
    my_grads = grads()

    ids, att, L2 = row_slices(batch, rows)
    assert L2 == L
    m = batch.action_mask[rows]
    logp2, ent2, _ = BatchForward(model, cfg, cfg.rollout.temperature).forward(
        ids, att, with_values=False, allowed=allowed_of(batch, rows),
        amask=batch.action_mask[rows, :L])
    theirs = micro_loss(cfg, batch, rows, logp2, ent2, None, adv=adv, old=batch.old_logp,
                        ref=None, mask=batch.action_mask,
                        counts=dict(num_tokens=count_tokens(m), num_seqs=count_seqs(m),
                                    norm=float(batch.input_ids.shape[1])),
                        entropy_coef=cfg.algorithm.entropy_coef, sampler_correction="off",
                        objective_needs=OBJECTIVES.get("ppo_clip").needs,
                        stats=defaultdict(float))
    theirs.backward()
    their_grads = grads()

    ratio = torch.exp(logp.detach() - old)[mask]
    a = adv[rows, :L][mask]
    for side in (ratio < 1 - ex.CLIP, ratio > 1 + ex.CLIP):
        assert (side & (a > 0)).any() and (side & (a < 0)).any()
    assert 0.2 < stats["clip_frac"] < 0.9
    torch.testing.assert_close(mine, theirs, **LOSS_TOL)
    for g1, g2 in zip(my_grads, their_grads):
        torch.testing.assert_close(g1, g2, **GRAD_TOL)
    with torch.no_grad():
        wider, _ = ex.ppo_loss(logp, old, adv[rows, :L], mask, ent, clip=0.3)
    assert abs(float(wider) - theirs.item()) > 1000 * LOSS_TOL["atol"]


def test_ppo_update_moves_the_weights_as_the_learner_does(ex, played, tmp_path, monkeypatch):
    """The example's update loop (epochs, shuffled mini-batches, gradient clipping, fused AdamW)
    against `Learner.update` on a copy of the same model, batch and advantages: the same
    weights after 2 epochs x 2 mini-batches, the same mean loss; the weights moved by far
    more than the tolerance. The trainer's forward is the example's full one here (no prompt
    sharing, no top layer at the action tokens alone): AdamW's first steps are about
    lr * g / |g|, so where a gradient is near 0 rounding alone can flip a step of size lr
    (with either on: up to 4e-4 apart on 4% of the embedding's weights)."""
    monkeypatch.setattr(forward, "applies", lambda _model, _scored: False)
    policy, batch = played
    minibatch = (batch.n_rows + 1) // 2
    adv = ex.advantages(batch)
    mine, theirs = copy.deepcopy(policy.model), copy.deepcopy(policy.model)
    start = [p.detach().clone() for p in mine.parameters()]

    optimizer = torch.optim.AdamW(mine.parameters(), lr=ex.LR, weight_decay=0.0, fused=True)
    gen = torch.Generator().manual_seed(0)  # the trainer's: train.seed
    my_metrics = ex.ppo_update(mine, optimizer, batch, adv, gen, minibatch=minibatch)
    learner = Learner(theirs, trainer_config(ex, tmp_path, minibatch, share_prefix=False))
    their_metrics = learner.update(batch, adv)

    assert their_metrics["optimizer_steps"] == 2 * ex.EPOCHS
    assert my_metrics["loss"] == pytest.approx(their_metrics["loss"], rel=1e-5, abs=1e-6)
    moved = max(float((p.detach() - s).abs().max()) for p, s in zip(mine.parameters(), start))
    assert moved > 100 * WEIGHT_TOL["atol"]
    for (name, p1), p2 in zip(mine.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p1, p2, **WEIGHT_TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_main_trains_a_few_steps_and_reports_exploitability(ex):
    """Two steps of 2 deals x 8 games: every metric finite, the exploitability in range."""
    history = ex.main(steps=2, groups=2, group_size=8, log=False)
    assert len(history) == 2
    for row in history:
        assert {"loss", "policy_loss", "entropy", "clip_frac", "approx_kl",
                "exploitability"} <= set(row)
        assert all(math.isfinite(v) for v in row.values())
        assert 0.0 <= row["exploitability"] < 1.0

"""Shared pieces of the trainer tests: a tiny Qwen2, test-only registry entries, a
deterministic fake rollout that samples from the model.

The estimator / objective registered here are test doubles written out in full
(independent of the registered catalogue): ``test_centered`` (A = R - group mean),
``test_centered_v`` (the same, declaring it needs values) and ``test_clip`` (PPO-clip).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sparring.advantages import ESTIMATORS
from sparring.data import Episode, Turn
from sparring.objectives import OBJECTIVES
from sparring.registry import Entry

VOCAB = 40
GOOD_TOKEN = 7


def tiny_qwen(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg)


@contextmanager
def forward_shapes(model) -> Iterator[list[torch.Size]]:
    """The shape of the token ids of each forward of ``model`` inside the block, read at
    its input embedding (which every forward path calls: the model's own and
    `sparring.policy.scored_forward`'s)."""
    shapes: list[torch.Size] = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _out: shapes.append(args[0].shape))
    try:
        yield shapes
    finally:
        hook.remove()


def _centered(batch, scale=1.0, **_):
    r = batch.returns
    n = int(batch.group.max()) + 1
    s = torch.zeros(n).index_add_(0, batch.group, r)
    c = torch.zeros(n).index_add_(0, batch.group, torch.ones_like(r))
    return (scale * (r - (s / c)[batch.group])[:, None] * batch.action_mask).float()


def _clip(logp, old_logp, advantages, mask, *, ref_logp=None, eps=0.2, **_):
    ratio = torch.exp(logp - old_logp)
    loss = -torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    with torch.no_grad():  # the objective contract: (loss, diagnostics over the tokens)
        r = ratio[mask.bool()]
        clipped = ((r < 1 - eps) | (r > 1 + eps)).float()
        diagnostics = {"clip_frac": clipped.mean(), "ratio": r.mean()} if r.numel() else {}
    return loss, diagnostics


TEST_ENTRIES = [
    (ESTIMATORS, Entry("test_centered", _centered, family="test", needs=("group",))),
    (ESTIMATORS, Entry("test_centered_v", _centered, family="test", needs=("group", "values"))),
    (OBJECTIVES, Entry("test_clip", _clip, family="test")),
]


def first_step_grads(learner):
    """AdamW after its first step: exp_avg = (1 - beta1) g, so g = exp_avg / (1 - beta1)."""
    b1 = learner.optimizer.param_groups[0]["betas"][0]
    return [learner.optimizer.state[p]["exp_avg"] / (1 - b1) for p in learner.params]


def register() -> None:
    for reg, entry in TEST_ENTRIES:
        if entry.name not in reg:
            reg.add(entry)


def unregister() -> None:
    for reg, entry in TEST_ENTRIES:
        reg._entries.pop(entry.name, None)


class Sampler:
    """A seeded torch generator as a checkpointable object."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def state_dict(self):
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, st):
        self.gen.set_state(st["gen"])


@torch.no_grad()
def bandit_rollout(model, sampler: Sampler, n_groups: int = 4, group_size: int = 4,
                   n_tokens: int = 2):
    """Single-turn episodes: prompt [1, x] (x from python's random), ``n_tokens`` sampled
    tokens (from ``sampler``), reward = share of GOOD_TOKEN + numpy noise."""
    was = model.training
    model.eval()
    xs = [random.randint(2, 5) for _ in range(n_groups)]
    ids = torch.tensor([[1, x] for x in xs for _ in range(group_size)])
    lps = []
    for _ in range(n_tokens):
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1].float()
        logp = torch.log_softmax(logits, -1)
        tok = torch.multinomial(logp.exp(), 1, generator=sampler.gen)
        lps.append(logp.gather(1, tok))
        ids = torch.cat([ids, tok], 1)
    model.train(was)
    lp = torch.cat(lps, 1)
    eps = []
    for i in range(len(ids)):
        act = ids[i, 2:].tolist()
        r = sum(t == GOOD_TOKEN for t in act) / n_tokens + float(np.random.normal(0, 0.01))
        turn = Turn(agent=0, prompt_ids=ids[i, :2].tolist(), action_ids=act,
                    logprobs=lp[i].tolist(), reward=r, done=True)
        eps.append(Episode(env="bandit", seed=i, group=i // group_size, num_agents=1,
                           turns=[turn], returns=[r]))
    return eps

"""The learner logs the objective's own diagnostics, weighted by micro-batch tokens."""

import math
from dataclasses import replace

import pytest
import torch

from sparring.config import from_dict
from sparring.data import Episode, Turn, collate
from sparring.policy.forward import token_logprobs
from sparring.train.learner import Learner
from tests import train_helpers as th

pytestmark = pytest.mark.usefixtures("train_doubles")


def shifted_batch(model):
    """Six rows: rows 0, 2, 4 have one action token, rows 1, 3, 5 three; the old log-probs
    are the model's own minus 0.1 on rows 0, 2, 4 (log ratio 0.1) and equal elsewhere."""
    eps = []
    for i in range(6):
        n = 1 if i % 2 == 0 else 3
        t = Turn(agent=0, prompt_ids=[1, 2 + i], action_ids=[10 + i + j for j in range(n)],
                 logprobs=[0.0] * n)
        eps.append(Episode(env="toy", seed=i, group=i // 2, num_agents=1, turns=[t],
                           returns=[float(i)]))
    batch = collate(eps)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    shift = torch.tensor([0.1, 0.0, 0.1, 0.0, 0.1, 0.0])[:, None]
    old = (logp - shift) * batch.action_mask
    return replace(batch, old_logp=old), batch.action_mask.float()


@pytest.mark.parametrize("micro", [0, 1])
def test_gspo_clip_fraction_is_over_sequences(micro):
    model = th.tiny_qwen(4)
    batch, adv = shifted_batch(model)
    cfg = from_dict({"algorithm": {"estimator": "test_centered", "objective": "gspo"},
                     "train": {"steps": 1, "microbatch_size": micro},
                     "logging": {"progress": False}})
    out = Learner(model, cfg).update(batch, adv)
    s = math.exp(0.1)  # the shifted rows' sequence ratio, above 1 + 4e-4; the others 1
    if micro == 0:  # one micro-batch: a mean over the 6 sequences (tokens would give 3/12)
        assert out["clip_frac"] == pytest.approx(3 / 6, abs=1e-6)
        assert out["ratio"] == pytest.approx((3 * s + 3 * 1.0) / 6, abs=1e-5)
        assert out["ratio_max"] == pytest.approx(s, abs=1e-5)
    else:  # one row per micro-batch, weighted by its action tokens (1 or 3, 12 in all)
        assert out["clip_frac"] == pytest.approx(3 * 1 / 12, abs=1e-6)
        assert out["ratio"] == pytest.approx((3 * 1 * s + 3 * 3 * 1.0) / 12, abs=1e-5)
        # a maximum is the step's maximum, whatever the micro-batches
        assert out["ratio_max"] == pytest.approx(s, abs=1e-5)
    # approx_kl stays the learner's: k3 of KL(pi_old || pi) per token, 3 of 12 tokens shifted
    assert out["approx_kl"] == pytest.approx(3 * (s - 1 - 0.1) / 12, abs=1e-6)


def test_an_objective_without_a_ratio_logs_no_clip_fraction():
    model = th.tiny_qwen(4)
    batch, adv = shifted_batch(model)
    cfg = from_dict({"algorithm": {"estimator": "test_centered", "objective": "reinforce"},
                     "train": {"steps": 1}, "logging": {"progress": False}})
    out = Learner(model, cfg).update(batch, adv)
    assert "clip_frac" not in out and "ratio" not in out
    assert "approx_kl" in out and "entropy" in out

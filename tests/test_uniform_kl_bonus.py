"""``algorithm.entropy_bonus=uniform_kl``: the bonus per token is ``-KL(u || pi)`` over the
moves constrained decoding allows (the whole vocabulary where nothing constrains), its
logit gradient is ``1/k - pi_a`` (no fading for a given-up move), the config asks for
constrained decoding, and a run logs ``uniform_kl`` in place of ``entropy``."""

import math

import pytest
import torch

from sparring import Config, Trainer
from sparring.config import ConfigError, load_config
from sparring.policy.forward import logprobs_from_logits

V = 7
ALLOWED = [{1: [2, 5], 2: [3], 3: [0, 1, 4, 6]}, {2: [1, 2, 3]}]


def brute_bonus(z: torch.Tensor, allowed: list[int] | None) -> float:
    """log k + (1/k) sum_a log pi_a, pi the softmax over the allowed logits (all if None)."""
    ids = list(range(V)) if allowed is None else allowed
    logp = torch.log_softmax(z[ids], 0)
    return math.log(len(ids)) + logp.mean().item()


def test_the_bonus_is_minus_kl_from_uniform_with_a_non_fading_gradient():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, V, generator=g) * 3).requires_grad_()
    ids = torch.tensor([[0, 5, 3, 4, 1], [0, 2, 1, 6, 6]])
    _, ent = logprobs_from_logits(logits, ids, with_entropy=True, allowed=ALLOWED,
                                  bonus="uniform_kl")
    for r in range(2):
        for t in range(1, 5):
            want = brute_bonus(logits[r, t - 1].detach(), ALLOWED[r].get(t))
            assert ent[r, t].item() == pytest.approx(want, abs=1e-5), (r, t)
    assert ent[0, 2].item() == pytest.approx(0.0, abs=1e-6)  # one allowed move: pi = u
    assert (ent <= 1e-6).all()  # -KL <= 0
    # the pull on each allowed logit is 1/k - pi_a, on the others 0 (closed form)
    ent[0, 3].backward()
    z = logits[0, 2].detach()
    allowed = ALLOWED[0][3]
    pi = torch.softmax(z[allowed], 0)
    want = torch.zeros(V)
    want[allowed] = 1 / len(allowed) - pi
    torch.testing.assert_close(logits.grad[0, 2], want, atol=1e-6, rtol=0)
    # on the least likely move (pi about 0.01) the entropy's pull is near 0, this one's near 1/k
    rare = allowed[int(pi.argmin())]
    logits.grad = None
    _, ent_h = logprobs_from_logits(logits, ids, with_entropy=True, allowed=ALLOWED)
    ent_h[0, 3].backward()
    assert abs(logits.grad[0, 2, rare]) < 0.1 and want[rare] > 0.2


def test_entropy_stays_the_default_bonus():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, V, generator=g)
    ids = torch.zeros(2, 5, dtype=torch.long)
    _, ent = logprobs_from_logits(logits, ids, with_entropy=True, allowed=ALLOWED)
    p = torch.softmax(logits[1, 1, [1, 2, 3]], 0)
    assert ent[1, 2].item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-5)
    with pytest.raises(ValueError, match="unknown bonus 'mutation'"):
        logprobs_from_logits(logits, ids, with_entropy=True, bonus="mutation")


def test_the_config_needs_constrained_decoding_and_no_entropy_target():
    with pytest.raises(ConfigError, match="rollout.invalid_action=constrained"):
        load_config(None, ["algorithm.entropy_bonus=uniform_kl", "rollout.invalid_action=retry"])
    with pytest.raises(ConfigError, match="entropy_target"):
        load_config(None, ["algorithm.entropy_bonus=uniform_kl", "algorithm.entropy_coef=0.1",
                           "algorithm.entropy_target=0.5"])
    with pytest.raises(ConfigError, match="policies.speaker.algorithm.entropy_bonus"):
        load_config(None, ["envs=[{name: signalling, seats: [speaker, listener]}]",
                           "policies={speaker: {algorithm: {entropy_bonus: uniform_kl}}, "
                           "listener: {}}", "rollout.invalid_action=forfeit"])


def test_a_run_logs_the_uniform_kl(tmp_path):
    cfg = Config.load("signalling_two_policies", [
        "train.steps=2", "rollout.episodes_per_step=16", "eval.games=4",
        "logging.progress=false", "checkpoint.every=0", "algorithm.entropy_coef=0.1",
        "algorithm.entropy_bonus=uniform_kl", f"train.run_dir={tmp_path}"])
    rows = Trainer(cfg).fit()
    for row in rows[1:]:
        for role in ("speaker", "listener"):
            assert f"policy/{role}/entropy" not in row
            assert 0 < row[f"policy/{role}/uniform_kl"] < math.log(4)

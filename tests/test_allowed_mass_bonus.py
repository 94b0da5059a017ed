"""``algorithm.entropy_bonus=allowed_mass``: the bonus per token is the log of the mass the
unconstrained distribution puts on the tokens constrained decoding allowed there (0 where
nothing constrains), its logit gradient is ``(1 - M) / k`` on each of the k allowed ids
and ``-pi_j`` on the others (the choice among the allowed ids is left alone), the cached-layer
forward gives the plain forward's value, and a run logs ``allowed_mass`` in place of
``entropy``."""

import pytest
import torch

from sparring import Config, Trainer
from sparring.config import ConfigError, load_config
from sparring.policy.feature_cache import attach_feature_cache
from sparring.policy.forward import logprobs_from_logits, token_logprobs
from sparring.policy.heads import TopLayers
from sparring.policy.layer_cache import LayerCache
from tests.test_layer_cache import constrained_rows, tiny

V = 7
ALLOWED = [{1: [2, 5], 2: [3], 3: [0, 1, 4, 6]}, {2: [1, 2, 3]}]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_the_bonus_is_the_log_mass_of_the_allowed_tokens(temperature):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, V, generator=g) * 3).requires_grad_()
    ids = torch.tensor([[0, 5, 3, 4, 1], [0, 2, 1, 6, 6]])
    lp, ent = logprobs_from_logits(logits, ids, temperature, with_entropy=True,
                                   allowed=ALLOWED, bonus="allowed_mass")
    for r in range(2):
        for t in range(1, 5):
            a = ALLOWED[r].get(t)
            p = torch.softmax(logits[r, t - 1].detach() / temperature, 0)
            want = 0.0 if a is None else float(p[a].sum().log())
            assert ent[r, t].item() == pytest.approx(want, abs=1e-5), (r, t)
            if a is not None:  # log pi_full(x) = log pi_allowed(x) + the bonus
                assert float((lp + ent)[r, t].detach()) == pytest.approx(
                    float(p[ids[r, t]].log()), abs=1e-5)
    assert (ent <= 1e-6).all()
    ent[0, 3].backward()  # (1 - M) / k on each allowed logit, -pi_j on the others
    z = logits[0, 2].detach() / temperature
    allowed = ALLOWED[0][3]
    pi = torch.softmax(z, 0)
    mass = float(pi[allowed].sum())
    want = -pi.clone()
    want[allowed] = (1 - mass) / len(allowed)
    torch.testing.assert_close(logits.grad[0, 2], want / temperature, atol=1e-6, rtol=0)
    # the step moves every allowed logit alike: the choice among them stays where it was
    z2 = (logits[0, 2].detach() + 0.5 * logits.grad[0, 2]) / temperature  # an ascent step
    torch.testing.assert_close(torch.softmax(z2[allowed], 0), torch.softmax(z[allowed], 0))
    assert float(torch.softmax(z2, 0)[allowed].sum()) > mass


def test_the_cached_layer_forward_gives_the_plain_forwards_allowed_mass():
    """Under a layer cache the head otherwise runs over the allowed ids only; the allowed
    mass needs the whole vocabulary, and gets the plain model's value."""
    model, _ = tiny()
    TopLayers(layers=1).freeze(model)
    ids, att, amask, pre, allowed = constrained_rows()
    out = []
    for cache in (None, LayerCache(model, 1, 100)):
        attach_feature_cache(model, cache)
        lp, ent = token_logprobs(model, ids, att, with_entropy=True, allowed=allowed,
                                 prefixes=pre, bonus="allowed_mass")
        out.append((lp * amask, ent * amask))
    attach_feature_cache(model, None)
    torch.testing.assert_close(out[1], out[0], atol=1e-5, rtol=1e-4)
    first = torch.zeros_like(amask)  # the constrained positions; 0 on the free ones
    for i, d in enumerate(allowed):
        first[i, list(d)] = True
    assert (out[0][1][first] < -1.0).all()  # 3 of the tiny vocabulary's ids hold little mass
    assert (out[0][1][amask & ~first] == 0).all()


def test_the_config_needs_constrained_decoding():
    with pytest.raises(ConfigError, match="rollout.invalid_action=constrained"):
        load_config(None, ["algorithm.entropy_bonus=allowed_mass",
                           "rollout.invalid_action=retry"])


def test_a_run_raises_the_allowed_mass_and_logs_it(tmp_path):
    cfg = Config.load(None, [
        "envs=[{name: calculator, options: {digits: 1, max_calls: 1}, group_size: 4}]",
        "rollout.invalid_action=constrained", "rollout.max_new_tokens=4",
        "rollout.episodes_per_step=8", "train.steps=6", "eval.every=0",
        "logging.progress=false", "checkpoint.every=0", "optim.lr=0.01",
        "algorithm.entropy_coef=1.0", "algorithm.entropy_bonus=allowed_mass",
        f"train.run_dir={tmp_path}"])
    rows = [r for r in Trainer(cfg).fit() if "allowed_mass" in r]
    assert len(rows) == 6 and all("entropy" not in r for r in rows)
    mass = [r["allowed_mass"] for r in rows]
    assert all(m <= 0 for m in mass)
    assert mass[-1] > mass[0]  # the bonus moves the free distribution onto the commands

"""Back-propagating through the sampler's own forward (`HFPolicy.generate_with_graph` and
`Learner.update`'s ``sampled_logp``): the completions `generate` draws, and the gradient of
the learner's own forward."""

import copy

import pytest
import torch

from sparring.config import from_dict
from sparring.data import Episode, Turn, collate
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import SamplingParams
from sparring.policy.tiny import TinyConfig, build_tiny_model
from sparring.train.learner import Learner
from sparring.train.sampled_graph import sampled_rows
from tests import train_helpers as th

SAMPLING = SamplingParams(temperature=1.3, max_new_tokens=5)
# a repeated prompt (run once by the sampler), free rows and constrained ones whose moves
# end in forced tails ("1" forces "2" and EOS; "gon" forces "e" and EOS)
PROMPTS = ["ab", "ab", "abc", "x", "ab", "zz"]
ALLOWED = [None, ["12", "3"], None, ["go", "gone"], ["12", "3"], None]


def policy_pair(seed=0):
    model, tok = build_tiny_model(TinyConfig(hidden_size=32, num_layers=2, num_heads=2,
                                             num_kv_heads=1, intermediate_size=64, seed=seed))
    ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    return (HFPolicy(model, tok, seed=7), HFPolicy(copy.deepcopy(model), tok, seed=7), ids)


def test_generate_with_graph_draws_what_generate_draws_and_keeps_the_graph():
    plain, graphed, ids = policy_pair()
    want = plain.generate(ids, SAMPLING, ALLOWED)
    got, logp = graphed.generate_with_graph(ids, SAMPLING, ALLOWED)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert logp.requires_grad and logp.shape == (len(ids), max(len(g.token_ids) for g in got))
    for i, (g, w) in enumerate(zip(got, want)):
        n = len(g.token_ids)
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
        assert logp[i, :n].tolist() == g.logprobs  # the recorded floats are these tensors'
        assert not logp[i, n:].any()
    forced = [lp for g in got for lp in g.logprobs if lp == 0.0]
    assert forced, "the test needs a forced tail (log-prob 0, no graph)"


def cfg(**train):
    return from_dict({"algorithm": {"estimator": "grpo", "objective": "ppo_clip",
                                    "aggregation": "token-mean"},
                      "optim": {"lr": 1e-3, "max_grad_norm": None},
                      "rollout": {"temperature": SAMPLING.temperature},
                      "train": {"steps": 4, "epochs": 1, **train},
                      "logging": {"progress": False}})


def batch_of(gens, ids):
    episodes = []
    for i, (g, p) in enumerate(zip(gens, ids)):
        r = float(len(g.token_ids) % 3)
        turn = Turn(agent=0, prompt_ids=p, action_ids=g.token_ids, logprobs=g.logprobs,
                    allowed_ids=g.allowed_ids, reward=r, done=True)
        episodes.append(Episode(env="toy", seed=i, group=0, num_agents=1, turns=[turn],
                                returns=[r]))
    return collate(episodes, layout="trajectory", pad_id=0)


def test_update_through_the_sampler_has_the_learner_forwards_gradient():
    plain, graphed, ids = policy_pair(seed=1)
    gens, logp = graphed.generate_with_graph(ids, SAMPLING, ALLOWED)
    batch = batch_of(gens, ids)
    adv = torch.linspace(-1.0, 1.0, batch.input_ids.shape[0])[:, None] * batch.action_mask
    by_forward, by_sampler = Learner(plain.model, cfg()), Learner(graphed.model, cfg())
    by_forward.update(batch, adv)
    lengths = torch.tensor([len(g.token_ids) for g in gens])
    by_sampler.update(batch, adv, sampled_logp=sampled_rows(batch.action_mask, logp, lengths))
    for want, got in zip(th.first_step_grads(by_forward), th.first_step_grads(by_sampler)):
        # float32 rounding only: the decode steps' products sum in another order than the
        # learner's one pass (seen up to 5e-7 of a tensor's largest entry on some CPUs)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()) + 1e-12)


def test_sampled_rows_places_each_rows_tokens_at_its_action_positions():
    _, graphed, ids = policy_pair()
    gens, logp = graphed.generate_with_graph(ids, SAMPLING, ALLOWED)
    batch = batch_of(gens, ids)
    lengths = torch.tensor([len(g.token_ids) for g in gens])
    placed = sampled_rows(batch.action_mask, logp, lengths)
    assert torch.equal(placed.detach(), batch.old_logp * batch.action_mask)
    with pytest.raises(ValueError, match="do not match"):
        sampled_rows(batch.action_mask, logp, lengths + 1)


@pytest.mark.parametrize("train, message", [({"epochs": 2}, "train.epochs=2"),
                                            ({"minibatch_size": 2}, "train.minibatch_size=2"),
                                            ({"microbatch_size": 2}, "one micro-batch")])
def test_update_through_the_sampler_refuses_a_second_optimizer_step(train, message):
    _, graphed, ids = policy_pair()
    gens, logp = graphed.generate_with_graph(ids, SAMPLING, ALLOWED)
    batch = batch_of(gens, ids)
    lengths = torch.tensor([len(g.token_ids) for g in gens])
    placed = sampled_rows(batch.action_mask, logp, lengths)
    learner = Learner(graphed.model, cfg(**train))
    with pytest.raises(ValueError, match=message):
        learner.update(batch, batch.action_mask.float(), sampled_logp=placed)
    graphed.model.model.layers[0].mlp.act_fn = torch.nn.Sequential(
        graphed.model.model.layers[0].mlp.act_fn, torch.nn.Dropout(0.1))
    with pytest.raises(ValueError, match="dropout"):
        Learner(graphed.model, cfg()).update(batch, batch.action_mask.float(),
                                             sampled_logp=placed)
    with pytest.raises(ValueError, match="no autograd graph"):
        Learner(graphed.model, cfg()).update(batch, batch.action_mask.float(),
                                             sampled_logp=placed.detach())

"""Learner: gradients against a hand-written loss, micro-batch invariance, non-finite
guard, magnet EMA, value head, LoRA and full fine-tuning."""

import copy
import math

import pytest
import torch

from sparring.config import ConfigError, from_dict
from sparring.data import Episode, Turn, collate
from sparring.policy.lora import apply_lora, load_trainable_state, trainable_state
from sparring.train.batch_forward import BatchForward
from sparring.train.learner import Learner, NonFiniteError
from tests import train_helpers as th

pytestmark = pytest.mark.usefixtures("train_doubles")


def make_cfg(**over):
    base = {"algorithm": {"estimator": "test_centered", "objective": "test_clip"},
            "optim": {"lr": 1e-3, "max_grad_norm": None},
            "train": {"steps": 10}, "logging": {"progress": False}}
    for key, value in over.items():
        sec, name = key.split("__", 1)
        if "__" in name:
            sub, name = name.split("__")
            base.setdefault(sec, {}).setdefault(sub, {})[name] = value
        else:
            base.setdefault(sec, {})[name] = value
    return from_dict(base)


def ragged_batch(seed=0, n=7, max_action=4):
    """Rows of different prompt and action lengths (real padding; actions of 1 to
    ``max_action`` tokens), old log-probs noisy."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(n):
        lp_len, a_len = 1 + i % 3, 1 + (i * 2) % max_action
        prompt = torch.randint(1, th.VOCAB, (lp_len,), generator=g).tolist()
        act = torch.randint(1, th.VOCAB, (a_len,), generator=g).tolist()
        old = (-3.7 + 0.3 * torch.randn(a_len, generator=g)).tolist()
        t = Turn(agent=0, prompt_ids=prompt, action_ids=act, logprobs=old)
        r = float(torch.randn(1, generator=g))
        eps.append(Episode(env="toy", seed=i, group=i % 3, num_agents=1, turns=[t], returns=[r]))
    batch = collate(eps)
    adv = torch.randn(batch.input_ids.shape, generator=g) * batch.action_mask
    return batch, adv


def reference_grads(model, ref_model, batch, adv, mode, kl_coef, ent_coef, eps=0.2):
    """The loss written out by hand on the whole batch (no learner code)."""
    model = copy.deepcopy(model)
    ids, att, m = batch.input_ids, batch.attention_mask, batch.action_mask.float()
    logits = model(input_ids=ids, attention_mask=att.long()).logits[:, :-1]
    lsm = torch.log_softmax(logits, -1)
    logp = torch.zeros(ids.shape)
    logp[:, 1:] = lsm.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = torch.zeros(ids.shape)
    ent[:, 1:] = -(lsm.exp() * lsm).sum(-1)
    with torch.no_grad():
        rl = torch.log_softmax(ref_model(input_ids=ids, attention_mask=att.long()).logits[:, :-1], -1)
        ref = torch.zeros(ids.shape)
        ref[:, 1:] = rl.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(logp - batch.old_logp)
    pg = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    d = ref - logp
    kl = torch.exp(d) - 1 - d
    per_tok = pg + kl_coef * kl - ent_coef * ent
    if mode == "token-mean":
        loss = (per_tok * m).sum() / m.sum()
    else:  # seq-mean-token-mean
        loss = ((per_tok * m).sum(1) / m.sum(1)).mean()
    loss.backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_gradient_matches_hand_loss_for_every_microbatch_size(mode, device):
    """Micro-batches of 0 (the whole mini-batch), 1 and 3 rows, and of at most 8 and 1
    padded tokens (rows sorted by length; 1: a row each): the hand-written loss's gradient."""
    batch, adv = ragged_batch()
    model0 = th.tiny_qwen(1)
    ref_model = copy.deepcopy(model0)
    with torch.no_grad():  # the policy drifts away from the frozen reference
        for p in model0.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    expected = None
    for micro in ({"size": 0}, {"size": 1}, {"size": 3}, {"tokens": 8}, {"tokens": 1}):
        model = th.tiny_qwen(1).to(device)
        cfg = make_cfg(algorithm__aggregation=mode, algorithm__entropy_coef=0.01,
                       algorithm__kl__coef=0.1, train__microbatch_size=micro.get("size", 0),
                       train__microbatch_tokens=micro.get("tokens", 0))
        learner = Learner(model, cfg)  # reference = this (undrifted) initial model
        model.load_state_dict(model0.state_dict())
        if expected is None:
            expected = reference_grads(model0, ref_model, batch, adv, mode, 0.1, 0.01)
        out = learner.update(batch, adv)
        assert out["optimizer_steps"] == 1 and out["skipped_updates"] == 0
        got = th.first_step_grads(learner)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g.cpu(), e, atol=2e-6, rtol=1e-4)
        assert out["kl"] > 0


def test_cosine_entropy_schedule_weights_the_bonus_of_each_update():
    # c(s) = 0.01 (0.2 + 0.8 (1 + cos(pi s / 4)) / 2), by hand for s = 0..3
    expected = [0.01, 0.0088284, 0.006, 0.0031716]
    cfg = make_cfg(algorithm__entropy_coef=0.01, algorithm__entropy_schedule="cosine",
                   algorithm__entropy_final_ratio=0.2, train__steps=4)
    batch, adv = ragged_batch()
    learner = Learner(th.tiny_qwen(1), cfg)
    got = [learner.update(batch, adv)["entropy_coef"] for _ in range(4)]
    assert got == pytest.approx(expected, abs=1e-7)
    # the loss uses it: after two updates (a resumed schedule), the gradient is the
    # hand-written loss's with entropy weight c(2)
    model0 = th.tiny_qwen(1)
    learner = Learner(copy.deepcopy(model0), cfg)
    learner.schedule.load_state_dict({"step_count": 2})
    learner.update(batch, adv)
    want = reference_grads(model0, model0, batch, adv, "token-mean", 0.0, 0.006)
    for g, e in zip(th.first_step_grads(learner), want):
        torch.testing.assert_close(g, e, atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("schedule, expected", [
    # c(s) = 0.01 min(1, (s + 1) / 3), by hand for s = 0..4
    ("constant", [0.01 / 3, 0.02 / 3, 0.01, 0.01, 0.01]),
    # warm-up over 3, then the cosine over the 2 updates left (p = (s - 3) / 2, m = 0.2):
    # 0.01 (0.2 + 0.8 (1 + cos(pi p)) / 2) is 0.01 at s = 3 and 0.006 at s = 4
    ("cosine", [0.01 / 3, 0.02 / 3, 0.01, 0.01, 0.006]),
])
def test_entropy_warmup_raises_the_bonus_linearly_then_hands_over(schedule, expected):
    cfg = make_cfg(algorithm__entropy_coef=0.01, algorithm__entropy_schedule=schedule,
                   algorithm__entropy_final_ratio=0.2, algorithm__entropy_warmup_steps=3,
                   train__steps=5)
    batch, adv = ragged_batch()
    learner = Learner(th.tiny_qwen(1), cfg)
    got = [learner.update(batch, adv)["entropy_coef"] for _ in range(5)]
    assert got == pytest.approx(expected, abs=1e-9)


def test_entropy_target_moves_the_bonus_by_the_entropy_gap_and_resumes():
    # c_1 = c_0 exp(r (H* - H_0) / H*), with H_0 the first update's logged entropy, by hand
    cfg = make_cfg(algorithm__entropy_coef=0.01, algorithm__entropy_target=0.5,
                   algorithm__entropy_target_rate=0.2)
    batch, adv = ragged_batch()
    model0 = th.tiny_qwen(1)
    learner = Learner(copy.deepcopy(model0), cfg)
    first = learner.update(batch, adv)
    assert first["entropy_coef"] == 0.01  # the first update uses the start
    c1 = 0.01 * math.exp(0.2 * (0.5 - first["entropy"]) / 0.5)
    assert first["entropy"] > 0.5 and c1 < 0.01  # a random tiny model: above the target
    assert learner.entropy_coef() == pytest.approx(c1, rel=1e-12)
    # the next update's loss weighs the entropy by c_1: a fresh learner given the state
    # has the hand-written loss's gradient with that weight
    fresh = Learner(copy.deepcopy(model0), cfg)
    fresh.load_state_dict({**learner.state_dict(), "optimizer": fresh.optimizer.state_dict()})
    assert fresh.entropy_coef() == pytest.approx(c1, rel=1e-12)
    second = fresh.update(batch, adv)
    assert second["entropy_coef"] == pytest.approx(c1, rel=1e-12)
    want = reference_grads(model0, model0, batch, adv, "token-mean", 0.0, c1)
    for g, e in zip(th.first_step_grads(fresh), want):
        torch.testing.assert_close(g, e, atol=2e-6, rtol=1e-4)
    # below the target the weight grows, at most to MAX_COEF; never below MIN_RATIO of
    # its start
    from sparring.train.entropy_target import MAX_COEF, MIN_RATIO, EntropyTarget
    t = EntropyTarget(0.01, 0.5, 0.2)
    assert t.observe(0.0) == pytest.approx(0.01 * math.exp(0.2))
    assert EntropyTarget(0.9, 0.5, 1.0).observe(0.0) == MAX_COEF
    low = EntropyTarget(0.02, 0.1, 1.0)
    assert low.observe(5.0) == pytest.approx(0.02 * MIN_RATIO)  # e^-49 would go below
    assert low.observe(0.0) == pytest.approx(0.02 * MIN_RATIO * math.e)


@pytest.mark.parametrize("over, message", [
    ({"algorithm__entropy_target": 0.2}, r"entropy_coef, which is 0"),
    ({"algorithm__entropy_target": 0.2, "algorithm__entropy_coef": 0.01,
      "algorithm__entropy_schedule": "cosine"}, r"entropy_schedule='cosine' and"),
    ({"algorithm__entropy_target": 0.2, "algorithm__entropy_coef": 0.01,
      "algorithm__entropy_warmup_steps": 3}, r"entropy_warmup_steps=3 would be ignored"),
    ({"algorithm__entropy_target": 0.0, "algorithm__entropy_coef": 0.01}, r"entropy_target"),
])
def test_entropy_target_config_errors_name_the_key(over, message):
    from sparring.config import ConfigError
    with pytest.raises(ConfigError, match=message):
        make_cfg(**over)


def test_minibatches_and_epochs_count_optimizer_steps_and_change_all_weights(device):
    batch, adv = ragged_batch(n=8)
    model = th.tiny_qwen(2).to(device)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = Learner(model, make_cfg(train__minibatch_size=3, train__epochs=2))
    out = learner.update(batch, adv)
    assert out["optimizer_steps"] == 2 * math.ceil(8 / 3)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert set(changed) == set(before)  # full fine-tuning: every weight moves


def test_rows_not_kept_do_not_contribute():
    batch, adv = ragged_batch()
    keep = torch.tensor([True, False, True, True, False, True, True])
    m1 = th.tiny_qwen(4)
    l1 = Learner(m1, make_cfg())
    l1.update(batch, adv, keep)
    adv2 = adv.clone()
    adv2[~keep] = 123.0  # would change the gradient if those rows counted
    m2 = th.tiny_qwen(4)
    l2 = Learner(m2, make_cfg())
    l2.update(batch, adv2, keep)
    for a, b in zip(th.first_step_grads(l1), th.first_step_grads(l2)):
        torch.testing.assert_close(a, b)


def test_nonfinite_loss_and_gradient_skip_then_stop(caplog, device):
    batch, adv = ragged_batch()
    model = th.tiny_qwen(5).to(device)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = Learner(model, make_cfg(train__max_skipped_updates=3))
    bad = adv.clone()
    bad[0, batch.action_mask[0].nonzero()[0, 0]] = float("nan")
    out = learner.update(batch, bad)
    assert out["skipped_updates"] == 1 and out["optimizer_steps"] == 0
    assert "skipping an update" in caplog.text
    # a finite loss with an infinite gradient is skipped too
    p0 = learner.params[0]
    h = p0.register_hook(lambda g: g * float("inf"))
    assert learner.update(batch, adv)["skipped_updates"] == 1
    h.remove()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(NonFiniteError, match="3 consecutive"):
        learner.update(batch, bad)
    # a good update resets the counter
    learner.consecutive_skips = 0
    assert learner.update(batch, adv)["optimizer_steps"] == 1
    assert learner.consecutive_skips == 0


def test_magnet_reference_is_an_ema_of_the_weights(device):
    batch, adv = ragged_batch()
    model = th.tiny_qwen(6).to(device)
    init = {k: v.clone() for k, v in model.named_parameters()}
    learner = Learner(model, make_cfg(algorithm__kl__coef=0.05, algorithm__kl__reference="magnet",
                                      algorithm__kl__magnet_rate=0.25))
    learner.update(batch, adv)
    mag = dict(learner.ref_model.named_parameters())
    for k, p in model.named_parameters():
        torch.testing.assert_close(mag[k], 0.75 * init[k] + 0.25 * p.detach())


def test_a_magnet_moved_every_third_step_holds_then_moves_and_resumes_the_count():
    """A magnet moved every 3rd step (`Reference(every=3)`), rate 1 (R-NaD's outer loop):
    the magnet is the initial weights after optimizer steps 1 and 2, the policy's weights
    after step 3, held again after 4; a learner resumed from the state after step 2 moves
    it at its first step (3rd)."""
    batch, adv = ragged_batch()
    cfg = make_cfg(algorithm__kl__coef=0.05, algorithm__kl__reference="magnet",
                   algorithm__kl__magnet_rate=1.0)
    model = th.tiny_qwen(6)
    init = {k: v.clone() for k, v in model.named_parameters()}
    learner = Learner(model, cfg)
    learner.reference.every = 3

    def magnet():
        return {k: v.clone() for k, v in learner.ref_model.named_parameters()}

    def weights(m):
        return {k: v.detach().clone() for k, v in m.named_parameters()}

    for _ in range(2):
        learner.update(batch, adv)
        assert all(torch.equal(v, init[k]) for k, v in magnet().items())
    state, at2 = copy.deepcopy(learner.state_dict()), weights(model)
    learner.update(batch, adv)
    at3 = weights(model)
    assert not torch.equal(at3["lm_head.weight"], init["lm_head.weight"])
    assert all(torch.equal(v, at3[k]) for k, v in magnet().items())
    learner.update(batch, adv)
    assert all(torch.equal(v, at3[k]) for k, v in magnet().items())
    resumed_model = th.tiny_qwen(6)
    load_trainable_state(resumed_model, at2)
    resumed = Learner(resumed_model, cfg)
    resumed.reference.every = 3
    resumed.load_state_dict(state)
    resumed.update(batch, adv)
    assert all(torch.equal(v, w) for (_, v), w in
               zip(resumed.ref_model.named_parameters(), weights(resumed_model).values()))


def test_value_head_reads_the_last_hidden_state_and_learns_returns(device):
    batch, _ = ragged_batch()
    model = th.tiny_qwen(7).to(device)
    cfg = make_cfg(algorithm__estimator="test_centered_v", critic__coef=1.0, optim__lr=1e-2)
    assert Learner(th.tiny_qwen(7), cfg).critic is None  # 'auto': nobody asked for values
    learner = Learner(model, cfg, needs={"values"})
    assert learner.critic is not None  # 'auto': the stage says the estimator needs values
    v = learner.values(batch)
    batch = batch.to(device)
    with torch.no_grad():
        h = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(),
                  output_hidden_states=True).hidden_states[-1]
        head = learner.critic.head.net
        raw = head[2](torch.tanh(head[0](h))).squeeze(-1)
    expected = torch.zeros_like(raw)
    expected[:, 1:] = raw[:, :-1]  # value of the context before each token
    torch.testing.assert_close(v, expected * batch.action_mask)
    m = batch.action_mask
    err0 = ((v - batch.returns[:, None]) ** 2)[m].mean()
    zero = torch.zeros(batch.input_ids.shape, device=device)
    for _ in range(60):
        learner.update(batch, zero)
    err = ((learner.values(batch) - batch.returns[:, None]) ** 2)[m].mean()
    assert err < 0.2 * err0


def test_lora_trains_only_adapters_and_reference_is_the_base_model(device):
    batch, adv = ragged_batch()
    base = th.tiny_qwen(8).to(device)
    frozen = copy.deepcopy(base)
    model = apply_lora(base, make_cfg().lora)
    before = {k: v.clone() for k, v in model.named_parameters()}
    learner = Learner(model, make_cfg(algorithm__kl__coef=0.1, lora__enabled=True,
                                      optim__lr=1e-2))
    assert learner.ref_model is None  # reference = adapters disabled
    for _ in range(3):
        learner.update(batch, adv)
    moved = {k for k, v in model.named_parameters() if not torch.equal(v, before[k])}
    assert moved and all("lora_" in k for k in moved)
    assert any("lora_B" in k for k in moved)
    ref = learner.ref_logprobs(batch)
    batch = batch.to(device)
    with torch.no_grad():
        lsm = torch.log_softmax(frozen(input_ids=batch.input_ids,
                                       attention_mask=batch.attention_mask.long()).logits, -1)
    exp = torch.zeros(batch.input_ids.shape, device=device)
    exp[:, 1:] = lsm[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(ref, exp * batch.action_mask, atol=1e-5, rtol=1e-5)
    # the adapter alone round-trips into a fresh LoRA model
    state = trainable_state(model)
    assert state and all("lora_" in k for k in state)
    other = apply_lora(th.tiny_qwen(8).to(device), make_cfg().lora)
    load_trainable_state(other, state)
    ids, att = batch.input_ids, batch.attention_mask.long()
    with torch.no_grad():
        torch.testing.assert_close(other(input_ids=ids, attention_mask=att).logits,
                                   model(input_ids=ids, attention_mask=att).logits)


def test_lora_last_layers_adapts_the_top_layers_and_backward_stops_there():
    """``lora.last_layers=1`` on a 2-layer model: adapters in layer 1 only, the update moves
    only those, and no layer-0 output takes part in the backward (it does not need a
    gradient); too many layers is an error that names the key."""
    batch, adv = ragged_batch()
    cfg = make_cfg(lora__enabled=True, lora__last_layers=1, optim__lr=1e-2)
    model = apply_lora(th.tiny_qwen(8), cfg.lora)
    adapted = {k for k, _ in model.named_parameters() if "lora_" in k}
    assert adapted and all(".layers.1." in k for k in adapted)
    assert {k.split(".layers.1.")[1].split(".lora_")[0] for k in adapted} == \
        {f"self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
    needs_grad = {}
    layers = model.get_base_model().model.layers
    for i, layer in enumerate(layers):  # each layer's MLP output, on every forward path
        layer.mlp.register_forward_hook(
            lambda _m, _i, out, i=i: needs_grad.setdefault(i, set()).add(out.requires_grad))
    before = {k: v.clone() for k, v in model.named_parameters()}
    Learner(model, cfg).update(batch, adv)
    assert True not in needs_grad[0] and True in needs_grad[1]
    moved = {k for k, v in model.named_parameters() if not torch.equal(v, before[k])}
    assert moved and moved <= adapted
    with pytest.raises(ValueError, match="lora.last_layers=3, but the model has 2 layers"):
        apply_lora(th.tiny_qwen(8), make_cfg(lora__enabled=True, lora__last_layers=3).lora)


def test_bad_shapes_are_errors():
    batch, adv = ragged_batch()
    learner = Learner(th.tiny_qwen(9), make_cfg())
    with pytest.raises(ValueError, match="advantages have shape"):
        learner.update(batch, adv[:, :-1])
    with pytest.raises(ValueError, match="keep has shape"):
        learner.update(batch, adv, torch.ones(3, dtype=torch.bool))


def test_separate_critic_leaves_the_policy_alone():
    batch, _ = ragged_batch()
    model = th.tiny_qwen(10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = Learner(model, make_cfg(critic__enabled="on", critic__kind="separate",
                                      optim__lr=1e-2))
    body0 = {k: v.clone() for k, v in learner.critic.body.state_dict().items()}
    zero = torch.zeros(batch.input_ids.shape)  # no policy gradient, only the value loss
    out = learner.update(batch, zero)
    assert out["value_loss"] > 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    moved = [k for k, v in learner.critic.body.state_dict().items() if not torch.equal(v, body0[k])]
    assert moved


def test_recompute_old_logp_makes_the_first_ratio_one():
    batch, adv = ragged_batch()
    stale = Learner(th.tiny_qwen(11), make_cfg()).update(batch, adv)
    assert stale["approx_kl"] > 1e-3  # the batch's old log-probs are noisy
    fresh = Learner(th.tiny_qwen(11), make_cfg(algorithm__recompute_old_logp=True)).update(batch, adv)
    assert fresh["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert fresh["ratio"] == pytest.approx(1.0, abs=1e-6) and fresh["clip_frac"] == 0.0


@pytest.mark.parametrize("micro", [0, 3])
def test_one_optimizer_step_takes_its_old_logprobs_from_the_loss_forward(micro, monkeypatch):
    """With train.epochs 1 and one minibatch, the recomputed old log-probs are those of the
    loss's own forward (nothing moved the weights before it): no extra pass over the rows,
    and the update equals one made with the recomputed log-probs given as the batch's old
    ones (float tolerance: the two forwards batch the rows differently)."""
    from dataclasses import replace

    batch, adv = ragged_batch()
    # AdamW's first step is lr g / (|g| + eps): with eps >> |g| it is linear in the gradient
    # (else it is lr sign(g), which rounding can flip where g is ~0)
    cfg = dict(train__epochs=1, train__microbatch_size=micro, optim__eps=10.0, optim__lr=10.0)
    given = Learner(th.tiny_qwen(11), make_cfg(**cfg))
    recomputed = given.policy_logprobs(batch)
    given.update(replace(batch, old_logp=recomputed), adv)
    learner = Learner(th.tiny_qwen(11), make_cfg(algorithm__recompute_old_logp=True, **cfg))
    passes = []
    real = BatchForward.per_row
    monkeypatch.setattr(BatchForward, "per_row",
                        lambda self, b, what: passes.append(what) or real(self, b, what))
    out = learner.update(batch, adv)
    assert "policy" not in passes
    assert out["ratio"] == 1.0 and out["approx_kl"] == 0.0 and out["clip_frac"] == 0.0
    for (name, p), q in zip(learner.model.named_parameters(), given.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
    many = Learner(th.tiny_qwen(11), make_cfg(algorithm__recompute_old_logp=True,
                                                train__epochs=2))
    many.update(batch, adv)
    assert "policy" in passes  # two optimizer steps: the old log-probs are a pass of their own


@pytest.mark.parametrize("epochs", [1, 2])  # the loss forward's log-probs / a pass of their own
def test_the_sampler_learner_gap_is_measured_on_the_action_tokens(epochs):
    """sampler/logp_diff_mean, _max and sampler/kl against the batch's old (sampler)
    log-probs and the model's own, computed here with a plain forward of the initial
    weights; and the gap is 0 when the sampler's log-probs are the learner's."""
    from dataclasses import replace

    from sparring.kl import kl_estimate
    from sparring.policy.forward import token_logprobs

    batch, adv = ragged_batch()
    model0 = th.tiny_qwen(11)
    with torch.no_grad():
        lp, _ = token_logprobs(model0, batch.input_ids, batch.attention_mask)
    m = batch.action_mask
    gap = (batch.old_logp - lp).abs()[m]
    kl = kl_estimate(batch.old_logp, lp, m, "k3")[m]
    cfg = make_cfg(algorithm__recompute_old_logp=True, train__epochs=epochs)
    out = Learner(copy.deepcopy(model0), cfg).update(batch, adv)
    assert out["sampler/logp_diff_mean"] == pytest.approx(float(gap.mean()), rel=1e-5)
    assert out["sampler/logp_diff_max"] == pytest.approx(float(gap.max()), rel=1e-5)
    assert out["sampler/kl"] == pytest.approx(float(kl.mean()), rel=1e-4)
    same = Learner(copy.deepcopy(model0), cfg).update(replace(batch, old_logp=lp), adv)
    assert same["sampler/logp_diff_max"] < 1e-5 and abs(same["sampler/kl"]) < 1e-9
    assert "sampler/kl" not in Learner(copy.deepcopy(model0), make_cfg()).update(batch, adv)


def test_explored_rows_have_no_sampler_gap():
    """Rows marked ``extras["explored"]`` (moves drawn by exploration.learner, no sampler
    log-probs: 0.0 in the batch) count as no gap: the step's gap is the one of the sampled
    rows' tokens, its mean over all action tokens; unmarked, the explored rows' zeros would
    be counted as gaps of |log p| (several nats)."""
    from dataclasses import replace

    from sparring.policy.forward import token_logprobs

    batch, adv = ragged_batch()
    model0 = th.tiny_qwen(11)
    with torch.no_grad():
        lp, _ = token_logprobs(model0, batch.input_ids, batch.attention_mask)
    explored = torch.tensor([1.0, math.nan, math.nan, 1.0, math.nan, math.nan, math.nan])
    m = batch.action_mask
    old = torch.where(explored[:, None] == 1.0, torch.zeros_like(lp), batch.old_logp)
    gap = ((old - lp).abs() * m * (explored != 1.0)[:, None])
    cfg = make_cfg(algorithm__recompute_old_logp=True)
    marked = replace(batch, old_logp=old, extras={"explored": explored})
    out = Learner(copy.deepcopy(model0), cfg).update(marked, adv)
    assert out["sampler/logp_diff_mean"] == pytest.approx(float(gap.sum() / m.sum()), rel=1e-5)
    assert out["sampler/logp_diff_max"] == pytest.approx(float(gap.max()), rel=1e-5)
    unmarked = Learner(copy.deepcopy(model0), cfg).update(replace(marked, extras={}), adv)
    assert unmarked["sampler/logp_diff_max"] > out["sampler/logp_diff_max"] + 1.0


@pytest.mark.parametrize("level, backend", [("token", "hf"), ("turn", "hf"), ("auto", "vllm")])
def test_sampler_correction_reweights_the_advantages_by_the_truncated_weight(level, backend):
    """algorithm.importance_correction for the sampler: the update equals one without it whose advantages
    were multiplied by hand by min(pi_learner / pi_sampler, c), per token or per row (a
    row is one turn here), pi_learner from a plain forward of the initial weights. The
    default ('auto') is the token level on the vLLM backend."""
    from sparring.policy.forward import token_logprobs

    batch, adv = ragged_batch()
    model0 = th.tiny_qwen(11)
    with torch.no_grad():
        lp, _ = token_logprobs(model0, batch.input_ids, batch.attention_mask)
    m = batch.action_mask
    log_r = torch.where(m, lp - batch.old_logp, 0.0)
    if level == "turn":
        log_r = torch.where(m, log_r.sum(1, keepdim=True), 0.0)
    w = torch.where(m, log_r.clamp(max=math.log(1.2)).exp(), 1.0)
    assert ((w < 1.2) & m).any() and torch.isclose(w, torch.tensor(1.2)).any()  # both sides
    # AdamW's first step is linear in the gradient with eps >> |g| (see the test above)
    cfg = dict(algorithm__recompute_old_logp=True, train__epochs=1, optim__eps=10.0,
               optim__lr=10.0)
    corrected = Learner(copy.deepcopy(model0), make_cfg(
        algorithm__importance_correction={"level": level, "clip": 1.2},
        model__backend=backend, **cfg))
    out = corrected.update(batch, adv)
    by_hand = Learner(copy.deepcopy(model0), make_cfg(
        algorithm__importance_correction__level="off", **cfg))
    by_hand.update(batch, adv * w)
    for (name, p), q in zip(corrected.model.named_parameters(), by_hand.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
    assert out["sampler/is_weight"] == pytest.approx(float(w[m].mean()), rel=1e-5)
    assert out["sampler/is_weight_max"] == pytest.approx(1.2)


def test_the_values_pass_gives_the_update_its_recomputed_old_logprobs(monkeypatch):
    """With a value head and recompute_old_logp over several optimizer steps, `annotate`'s
    values pass also returns the policy's log-probs (the same forward, no weight moved in
    between): they equal a pass of their own bit for bit, the update makes no second pass,
    and its weights are those of an update that ran that pass."""
    from dataclasses import replace

    batch, adv = ragged_batch()
    cfg = make_cfg(critic__enabled="on", critic__kind="head", train__epochs=2,
                   algorithm__recompute_old_logp=True)
    torch.manual_seed(0)  # the same value head in both learners
    merged = Learner(th.tiny_qwen(11), cfg)
    torch.manual_seed(0)
    separate = Learner(th.tiny_qwen(11), cfg)
    passes = []
    real = BatchForward.per_rows
    monkeypatch.setattr(BatchForward, "per_rows",
                        lambda self, b, *what: passes.append(what) or real(self, b, *what))
    annotated, _ = merged.annotate(batch, ("values",))
    assert passes == [("values", "policy")]
    assert torch.equal(annotated.learner_logp, separate.policy_logprobs(batch))
    assert torch.equal(annotated.values, separate.values(batch))
    assert (annotated.learner_logp != 0).sum() == batch.action_mask.sum()
    passes.clear()
    merged.update(annotated, adv)
    assert ("policy",) not in passes and ("ref",) not in passes
    separate.update(replace(annotated, learner_logp=None), adv)
    assert ("policy",) in passes
    for (name, p), q in zip(merged.model.named_parameters(), separate.model.parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("backend, recompute, level", [
    ("vllm", True, "token"), ("hf", True, "off"), ("vllm", False, "off")])
def test_sampler_correction_auto_is_the_token_level_on_vllm_only(backend, recompute, level):
    """'auto' corrects where the sampler is a vLLM engine and the learner recomputes the
    old log-probs (without the recomputation there is nothing to compare them with)."""
    from sparring.train.learner import sampler_correction_level

    cfg = make_cfg(model__backend=backend, algorithm__recompute_old_logp=recompute)
    assert cfg.algorithm.importance_correction.level == "auto"
    assert sampler_correction_level(cfg) == level
    explicit = make_cfg(model__backend="vllm", algorithm__recompute_old_logp=True,
                        algorithm__importance_correction__level="turn")
    assert sampler_correction_level(explicit) == "turn"


def test_sampler_correction_needs_the_recomputed_logprobs():
    from sparring.config import ConfigError

    with pytest.raises(ConfigError, match="^algorithm.importance_correction.level: 'token' "
                                          "compares .*recompute_old_logp=true"):
        make_cfg(algorithm__importance_correction__level="token")
    with pytest.raises(ConfigError, match=r"^algorithm.importance_correction.clip: 0.0 is out "
                                          r"of range \(must be > 0\)"):
        make_cfg(algorithm__importance_correction__clip=0)


def shared_prompt_batch(seed=0, prompts=3, samples=4, start=0, repeat=0):
    """GRPO-shaped: each prompt (``start`` common tokens, then 1-3 of its own) sampled
    ``samples`` times, actions 1-4 tokens; the first ``repeat`` episodes once more at the end
    (equal rows)."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(1, th.VOCAB, (start,), generator=g).tolist()
    eps = []
    for k in range(prompts):
        prompt = common + torch.randint(1, th.VOCAB, (1 + k % 3,), generator=g).tolist()
        for j in range(samples):
            a_len = 1 + (k + j) % 4
            act = torch.randint(1, th.VOCAB, (a_len,), generator=g).tolist()
            old = (-3.7 + 0.3 * torch.randn(a_len, generator=g)).tolist()
            t = Turn(agent=0, prompt_ids=prompt, action_ids=act, logprobs=old)
            eps.append(Episode(env="toy", seed=k, group=k, num_agents=1, turns=[t],
                               returns=[float(torch.randn(1, generator=g))]))
    batch = collate(eps + eps[:repeat])
    adv = torch.randn(batch.input_ids.shape, generator=g) * batch.action_mask
    return batch, adv


@pytest.mark.parametrize("micro,start,samples", [(0, 0, 4), (5, 0, 4), (0, 10, 1)])
def test_shared_prompts_give_the_hand_loss_gradient(micro, start, samples):
    """train.share_prefix runs each prompt once (and, start=10, the common start once); the
    gradient is still the full one."""
    batch, adv = shared_prompt_batch(prompts=6 if samples == 1 else 3, samples=samples,
                                     start=start)
    model0 = th.tiny_qwen(2)
    expected = reference_grads(model0, copy.deepcopy(model0), batch, adv, "token-mean", 0.0,
                               0.01)
    for share in (True, False):
        model = copy.deepcopy(model0)
        cfg = make_cfg(algorithm__entropy_coef=0.01, train__microbatch_size=micro,
                       train__share_prefix=share)
        learner = Learner(model, cfg)
        with th.forward_shapes(model) as calls:
            learner.update(batch, adv)
        for g, e in zip(th.first_step_grads(learner), expected):
            torch.testing.assert_close(g, e, atol=2e-6, rtol=1e-4)
        if start:  # all 6 prompts distinct: the 10-token common start runs alone first
            assert (calls[0] == (1, 10)) == share
        else:  # the 3 prompts run once (a [3, P] prefill) before the continuations
            assert (calls[0][0] == 3) == (share and micro == 0)


def test_value_head_shares_prompts_and_rows_with_the_same_values_and_gradients():
    """A value head reads the policy's own forward: with train.share_prefix and
    train.share_rows on (the prompts run once, a repeated row once), the values and the
    update's gradients (trunk and head) are those of the plain forward, and the forward
    runs the prompts once (no second, unshared pass for the critic)."""
    batch, adv = shared_prompt_batch(prompts=3, samples=4, repeat=4)  # 4 rows twice
    model0 = th.tiny_qwen(4)
    got = []
    for share in (False, True):
        model = copy.deepcopy(model0)
        cfg = make_cfg(critic__enabled="on", critic__coef=1.0, train__share_prefix=share,
                       train__share_rows=share)
        torch.manual_seed(0)  # the same value head
        learner = Learner(model, cfg)
        values = learner.values(batch)
        with th.forward_shapes(model) as calls:
            learner.update(batch, adv)
        got.append((values, th.first_step_grads(learner), calls))
    (v0, g0, c0), (v1, g1, c1) = got
    assert v0.abs().sum() > 0
    torch.testing.assert_close(v1, v0, atol=1e-5, rtol=1e-4)
    assert len(g0) == len(g1)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, atol=2e-6, rtol=1e-4)
    assert c0[0][0] == 16 and c1[0][0] == 3  # plain: 16 rows; shared: the 3 prompts once
    assert len(c1) == 2  # prompts, then the 12 distinct continuations: one forward in all
    assert c1[1][0] == 12


def _rows_twice():
    """12 rows: 3 prompts x 2 constrained moves, each row twice."""
    eps = []
    for i in range(12):
        p, a = i % 3, (i // 3) % 2
        t = Turn(agent=0, prompt_ids=[1, 2 + p, 5], action_ids=[10 + a, 3], logprobs=[0.0, 0.0],
                 allowed_ids=[[10, 11], [3]])
        eps.append(Episode(env="toy", seed=i, group=p, num_agents=1, turns=[t], returns=[0.0]))
    return collate(eps)


def test_share_rows_runs_the_kl_references_distinct_rows_once_with_the_same_logprobs():
    """The KL reference's pass shares repeated rows too: 6 distinct rows of 12 run, and
    its log-probs are those of every row run (to float rounding)."""
    batch = _rows_twice()
    got = []
    for share in (False, True):
        cfg = from_dict({"algorithm": {"estimator": "test_centered", "kl": {"coef": 0.1}},
                         "train": {"steps": 1, "share_rows": share, "share_prefix": False}})
        learner = Learner(th.tiny_qwen(5), cfg)
        with th.forward_shapes(learner.reference.model) as shapes:
            ref = learner.passes.per_row(batch, "ref")
        got.append((ref, [s[0] for s in shapes]))
    (ref0, seen0), (ref1, seen1) = got
    assert seen0 == [12] and seen1 == [6]
    assert bool((ref0 * batch.action_mask != 0).any())
    torch.testing.assert_close(ref1, ref0, atol=1e-5, rtol=0)


def test_share_rows_runs_each_distinct_row_once_with_the_same_logprobs_and_gradients():
    """train.share_rows: a batch where rows repeat (a group's equal moves, constrained
    decoding's restrictions included) runs only its distinct rows, and the log-probs,
    entropies and gradients are those of the plain forward (to float rounding)."""
    batch = _rows_twice()
    w = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(0))
    got = []
    for share in (False, True):
        model = th.tiny_qwen(5)
        cfg = from_dict({"algorithm": {"estimator": "test_centered"},
                         "train": {"steps": 1, "share_rows": share, "share_prefix": False}})
        learner = Learner(model, cfg)
        with th.forward_shapes(model) as shapes:
            logp, ent, _ = learner.passes.forward(batch.input_ids, batch.attention_mask,
                                                  with_values=False, allowed=batch.allowed,
                                                  amask=batch.action_mask)
        seen = [s[0] for s in shapes]
        ((logp * w + 0.1 * ent) * batch.action_mask).sum().backward()
        got.append((logp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()
                                                  if p.grad is not None], seen))
    (lp0, e0, g0, seen0), (lp1, e1, g1, seen1) = got
    assert seen0 == [12] and seen1 == [6]  # 6 distinct rows
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(e1, e0, atol=1e-5, rtol=0)
    assert len(g0) == len(g1) > 0
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_a_heads_body_lr_scale_moves_the_body_at_its_fraction_and_frozen_features_freeze_it():
    """Adam's first step moves every weight with a gradient by exactly lr (m/sqrt(v) = sign g),
    so the output layer moves by 1e-3 and the body by scale * 1e-3; at 0 the body gets no
    gradient at all and the optimizer holds the head alone."""
    batch, adv = ragged_batch(n=8)
    for scale in (0.25, 0.0):
        model = th.tiny_qwen(2)
        before = {k: v.clone() for k, v in model.named_parameters()}
        head = ({"name": "frozen_features"} if scale == 0 else
                {"name": "lm_head", "body_lr_scale": scale})
        learner = Learner(model, make_cfg(model__head=head, optim__eps=1e-12))
        learner.update(batch, adv)
        for name, p in model.named_parameters():
            step = (p.detach() - before[name]).abs()
            moved = step[step > 0]
            want = 1e-3 if name == "lm_head.weight" else scale * 1e-3
            if want == 0:
                assert moved.numel() == 0 and p.grad is None and not p.requires_grad, name
            else:
                torch.testing.assert_close(moved, torch.full_like(moved, want), rtol=1e-3,
                                           atol=0, msg=name)
        assert (learner.params == [model.lm_head.weight]) is (scale == 0)


def test_the_output_layer_is_the_tied_embedding_and_a_head_apart_from_lora_is_refused():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sparring.policy.heads import output_layer_names

    tied = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, tie_word_embeddings=True))
    assert output_layer_names(tied) == {"model.embed_tokens.weight"}
    assert output_layer_names(th.tiny_qwen()) == {"lm_head.weight"}
    with pytest.raises(ConfigError, match=r"^model.head: lm_head \(body_lr_scale 0.5\) trains "
                                          r"the output layer apart .*use lm_head with "
                                          r"body_lr_scale 1 with LoRA$"):
        make_cfg(model__head={"name": "lm_head", "body_lr_scale": 0.5}, lora__enabled=True)
    with pytest.raises(ConfigError, match=r"^model.head: frozen_features \(body_lr_scale 0.0\)"):
        make_cfg(model__head={"name": "frozen_features"}, lora__enabled=True)
    with pytest.raises(ConfigError, match=r"^model.head: head 'lm_head' option 'body_lr_scale': "
                                          r"0 is out of range \(must be > 0\)"):
        make_cfg(model__head={"name": "lm_head", "body_lr_scale": 0})


def test_optimizer_state_mb_counts_adamw_moments_and_steps_by_hand():
    from sparring.train.learner import state_megabytes

    p = torch.nn.Parameter(torch.zeros(10, 3))
    opt = torch.optim.AdamW([p], lr=1e-3)
    assert state_megabytes(opt) == 0.0  # no state before the first step
    p.grad = torch.ones(10, 3)
    opt.step()
    # exp_avg and exp_avg_sq: 2 x 30 float32; step: one float32 scalar
    assert state_megabytes(opt) * 2**20 == 2 * 30 * 4 + 4

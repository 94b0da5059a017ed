"""ArCHer's utterance critic in the trainer: replay buffer links and eviction, TD targets
and critic loss by hand, one update moves Q towards its target, Polyak by hand, Q converges
to the known return on a deterministic toy, config errors, crash + resume is exact."""

import json

import pytest
import torch

from sparring.config import ConfigError, from_dict
from sparring.critic.archer import Archer
from sparring.critic.replay import TurnReplay
from sparring.data import Episode, Turn, collate
from sparring.storage.folders import step_dirs
from sparring.storage.metrics_file import read_metrics
from sparring.train.learner import Learner
from sparring.train.loop import resume, train
from sparring.train.policies import advantage_stage
from tests import train_helpers as th


def cfg_of(**archer):
    return from_dict({"algorithm": {"estimator": "archer_targets", "objective": "ppo_clip"},
                      "critic": {"archer": {"gamma": 0.5, "tau": 0.25, "updates": 1, **archer}},
                      "optim": {"lr": 1e-2, "max_grad_norm": None},
                      "train": {"steps": 4, "seed": 3}, "logging": {"progress": False}})


def two_turn_episode(r0=0.5, r1=1.0, truncated=False, group=0, p=2):
    t0 = Turn(agent=0, prompt_ids=[1, p], action_ids=[3, 4], reward=r0)
    t1 = Turn(agent=0, prompt_ids=[1, p, 3, 4, 5], action_ids=[6], reward=r1, done=True)
    return Episode(env="toy", seed=0, group=group, num_agents=1, turns=[t0, t1],
                   returns=[r0 + r1], truncated=truncated)


def hidden_by_hand(model, ids):
    """The last hidden state of one unpadded row, from the model's own output."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0]


def head_by_hand(head, h):
    l1, l2 = head.net[0], head.net[2]
    with torch.no_grad():
        return float(torch.tanh(h @ l1.weight.T + l1.bias) @ l2.weight.T + l2.bias)


def heads(critic, model, ids, v_pos, q_pos):
    h = hidden_by_hand(model, ids)
    return {k: head_by_hand(critic.heads[k], h[q_pos if k[0] == "q" else v_pos])
            for k in ("q1", "q2", "v1", "v2")}


ROW0, ROW1 = [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]  # V reads positions 1 and 4, Q 3 and 5


# ---------------------------------------------------------------- replay buffer


def test_replay_links_next_turns_flags_truncation_and_evicts_whole_steps():
    two_seat = Episode(env="toy", seed=0, group=0, num_agents=2, returns=[1.0, 0.0], turns=[
        Turn(agent=0, prompt_ids=[1], action_ids=[7, 8], reward=0.25),
        Turn(agent=1, prompt_ids=[1, 7, 8], action_ids=[9]),
        Turn(agent=0, prompt_ids=[1, 7, 8, 9], action_ids=[10], reward=0.75, done=True)])
    b = collate([two_seat, two_turn_episode(truncated=True)])
    # rows (collate order): ep0 seat0 turns 0, 1; ep0 seat1 turn 0; ep1 seat0 turns 0, 1
    rp = TurnReplay(2)
    rp.add(b, 0)
    assert rp.next_of(torch.arange(5)).tolist() == [1, -1, -1, 4, -1]
    assert rp.rows["done"].tolist() == [False, True, True, False, True]
    assert rp.rows["valid"].tolist() == [True, True, True, True, False]
    assert rp.rows["reward"].tolist() == [0.25, 0.75, 0.0, 0.5, 1.0]
    want = [[1, 7, 8], [1, 7, 8, 9, 10], [1, 7, 8, 9], ROW0, ROW1]
    ids, att, first, last = rp.tensors(torch.tensor([4, 0, 2]))
    assert [ids[i, :int(att[i].sum())].tolist() for i in range(3)] == [want[4], want[0], want[2]]
    assert ids[~att].abs().sum() == 0
    assert first.tolist() == [5, 1, 3] and last.tolist() == [5, 2, 3]
    rp.add(collate([two_turn_episode(r0=2.0)]), 1)
    rp.add(collate([two_turn_episode(r0=3.0)]), 2)  # step 0 leaves
    assert len(rp) == 4 and rp.rows["step"].tolist() == [1, 1, 2, 2]
    assert rp.rows["reward"].tolist() == [2.0, 1.0, 3.0, 1.0]
    assert rp.next_of(torch.arange(4)).tolist() == [1, -1, 3, -1]
    ids, att, _, _ = rp.tensors(torch.arange(4))
    assert [ids[i, :int(att[i].sum())].tolist() for i in range(4)] == [ROW0, ROW1, ROW0, ROW1]
    with pytest.raises(ValueError, match="turn-layout"):
        rp.add(collate([two_turn_episode()], layout="trajectory"), 3)


# ---------------------------------------------------------------- targets and loss by hand


def perturbed_archer(cfg):
    model = th.tiny_qwen(0)
    arc = Archer(model, cfg)
    with torch.no_grad():  # a target that differs from the online critic
        for p in arc.target.parameters():
            p.mul_(1.5).add_(0.05)
    return model, arc


@pytest.mark.parametrize("kind", ["head", "separate"])
def test_td_targets_and_critic_loss_match_a_hand_computation(kind):
    cfg = cfg_of()
    cfg.critic.kind = kind
    cfg.train.microbatch_size = 1  # the separate body's update runs one row per chunk
    model, arc = perturbed_archer(cfg)

    def by_hand(critic, _model, ids, v_pos, q_pos):  # the critic's body, else the policy
        return heads(critic, critic.body or model, ids, v_pos, q_pos)

    batch = collate([two_turn_episode()])
    on0 = by_hand(arc.online, model, ROW0, 1, 3)
    on1 = by_hand(arc.online, model, ROW1, 4, 5)
    tg0 = by_hand(arc.target, model, ROW0, 1, 3)
    tg1 = by_hand(arc.target, model, ROW1, 4, 5)
    y = [0.5 + 0.5 * min(tg1["v1"], tg1["v2"]), 1.0]  # turn 1 is the last: done
    z = [min(tg0["q1"], tg0["q2"]), min(tg1["q1"], tg1["q2"])]
    on = [on0, on1]
    lq = sum((on[i]["q1"] - y[i]) ** 2 + (on[i]["q2"] - y[i]) ** 2 for i in range(2)) / 4
    lv = sum((on[i]["v1"] - z[i]) ** 2 + (on[i]["v2"] - z[i]) ** 2 for i in range(2)) / 4
    arc.replay.add(batch, 0)
    ty, tz = arc.targets(torch.arange(2))
    assert ty.tolist() == pytest.approx(y, abs=1e-5)
    assert tz.tolist() == pytest.approx(z, abs=1e-5)
    arc.replay = TurnReplay(arc.ac.buffer_steps)
    m = arc.observe(batch)
    assert m["critic/q_loss"] == pytest.approx(lq, rel=1e-4)
    assert m["critic/v_loss"] == pytest.approx(lv, rel=1e-4)
    assert m["critic/q_mean"] == pytest.approx(sum(o["q1"] + o["q2"] for o in on) / 4, rel=1e-4)
    assert m["critic/v_mean"] == pytest.approx(sum(o["v1"] + o["v2"] for o in on) / 4, rel=1e-4)
    assert m["critic/buffer_turns"] == 2.0
    # annotate: extras from the updated online critic, v_target from the target's V at s
    out, td = arc.annotate(batch)
    now = [by_hand(arc.online, model, ROW0, 1, 3), by_hand(arc.online, model, ROW1, 4, 5)]
    tnow = [by_hand(arc.target, model, ROW0, 1, 3), by_hand(arc.target, model, ROW1, 4, 5)]
    for k in ("q1", "q2", "v1", "v2"):
        assert out.extras[k].tolist() == pytest.approx([r[k] for r in now], abs=1e-5)
    assert out.extras["v_target"].tolist() == pytest.approx(
        [min(r["v1"], r["v2"]) for r in tnow], abs=1e-5)
    y_now = [0.5 + 0.5 * min(tnow[1]["v1"], tnow[1]["v2"]), 1.0]
    err = sum(abs(min(now[i]["q1"], now[i]["q2"]) - y_now[i]) for i in range(2)) / 2
    assert td["critic/td_error"] == pytest.approx(err, rel=1e-4)
    with pytest.raises(ValueError, match="just given to observe"):
        arc.annotate(collate([two_turn_episode(), two_turn_episode()]))


def test_truncated_last_turn_has_no_q_target_in_the_loss():
    model, arc = perturbed_archer(cfg_of())
    on = [heads(arc.online, model, ROW0, 1, 3), heads(arc.online, model, ROW1, 4, 5)]
    tg1 = heads(arc.target, model, ROW1, 4, 5)
    y0 = 0.5 + 0.5 * min(tg1["v1"], tg1["v2"])
    m = arc.observe(collate([two_turn_episode(truncated=True)]))
    # only turn 0 has a Q target; both turns are in the V loss
    assert m["critic/q_loss"] == pytest.approx(
        ((on[0]["q1"] - y0) ** 2 + (on[0]["q2"] - y0) ** 2) / 2, rel=1e-4)


def test_q_learns_from_the_whole_buffer_v_from_the_newest_step_only():
    model, arc = perturbed_archer(cfg_of(buffer_steps=2, batch_turns=4))
    arc.replay.add(collate([two_turn_episode(r0=2.0, p=9)]), 0)  # an older policy's turns
    arc.steps_seen = 1
    old = [[1, 9, 3, 4], [1, 9, 3, 4, 5, 6]]
    rows = [(old[0], 2.0, old[1]), (old[1], 1.0, None), (ROW0, 0.5, ROW1), (ROW1, 1.0, None)]
    lq = lv = 0.0
    for i, (ids, r, nxt) in enumerate(rows):
        v_pos, q_pos = (1, 3) if len(ids) == 4 else (4, 5)
        on, tg = heads(arc.online, model, ids, v_pos, q_pos), heads(arc.target, model, ids,
                                                                     v_pos, q_pos)
        tn = heads(arc.target, model, nxt, 4, 5) if nxt else None
        y = r + (0.5 * min(tn["v1"], tn["v2"]) if tn else 0.0)
        z = min(tg["q1"], tg["q2"])
        lq += ((on["q1"] - y) ** 2 + (on["q2"] - y) ** 2) / 2 / 4
        if i >= 2:
            lv += ((on["v1"] - z) ** 2 + (on["v2"] - z) ** 2) / 2 / 2
    m = arc.observe(collate([two_turn_episode()]))
    assert m["critic/buffer_turns"] == 4.0
    assert m["critic/q_loss"] == pytest.approx(lq, rel=1e-4)
    assert m["critic/v_loss"] == pytest.approx(lv, rel=1e-4)


def test_one_update_moves_q_towards_its_target_and_leaves_the_policy_alone():
    model, arc = perturbed_archer(cfg_of())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tg1 = heads(arc.target, model, ROW1, 4, 5)
    y = [0.5 + 0.5 * min(tg1["v1"], tg1["v2"]), 1.0]

    def q_err():
        on = [heads(arc.online, model, ROW0, 1, 3), heads(arc.online, model, ROW1, 4, 5)]
        return sum((on[i][q] - y[i]) ** 2 for i in range(2) for q in ("q1", "q2"))

    e0 = q_err()
    arc.observe(collate([two_turn_episode()]))
    assert q_err() < e0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_polyak_update_by_hand():
    _, arc = perturbed_archer(cfg_of(tau=0.25))
    on = [p.detach().clone() for p in arc.online.parameters()]
    tg = [p.detach().clone() for p in arc.target.parameters()]
    arc.polyak()
    for t_new, t, p in zip(arc.target.parameters(), tg, on):
        assert torch.allclose(t_new, 0.75 * t + 0.25 * p, atol=1e-7)


def test_separate_critic_trains_its_own_body_not_the_policy():
    cfg = cfg_of()
    cfg.critic.kind = "separate"
    model = th.tiny_qwen(0)
    arc = Archer(model, cfg)
    policy0 = {k: v.clone() for k, v in model.state_dict().items()}
    body0 = {k: v.clone() for k, v in arc.online.body.state_dict().items()}
    arc.observe(collate([two_turn_episode()]))
    assert all(torch.equal(policy0[k], v) for k, v in model.state_dict().items())
    assert any(not torch.equal(body0[k], v) for k, v in arc.online.body.state_dict().items())
    assert arc.target.body is not None and arc.target.body is not arc.online.body


def test_q_converges_near_the_known_return_on_a_deterministic_toy():
    # turn 0: reward 0, turn 1: reward 1 then done; gamma 0.5 -> Q(s0, a0) = 0.5, Q(s1, a1) = 1,
    # V(s0) = 0.5, V(s1) = 1 (one action per state)
    model, arc = perturbed_archer(cfg_of(tau=0.5, updates=20, lr=3e-3))
    batch = collate([two_turn_episode(r0=0.0, r1=1.0)])
    for _ in range(15):
        arc.observe(batch)
    out, _ = arc.annotate(batch)
    for k in ("q1", "q2"):
        assert out.extras[k].tolist() == pytest.approx([0.5, 1.0], abs=0.05)
    for k in ("v1", "v2"):
        assert out.extras[k].tolist() == pytest.approx([0.5, 1.0], abs=0.05)


# ---------------------------------------------------------------- config errors


@pytest.mark.parametrize("override, key", [
    ("critic.archer.tau=0", "critic.archer.tau"),
    ("critic.archer.tau=1.5", "critic.archer.tau"),
    ("critic.archer.gamma=-0.1", "critic.archer.gamma"),
    ("critic.archer.buffer_steps=0", "critic.archer.buffer_steps"),
    ("critic.archer.updates=0", "critic.archer.updates"),
    ("critic.enabled=off", "critic.enabled"),
])
def test_config_errors_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_dict({"algorithm": {"estimator": "archer_targets"}}, [override])


def test_learner_builds_the_utterance_critic_only_for_archer():
    cfg = cfg_of()
    lrn = Learner(th.tiny_qwen(0), cfg, needs=advantage_stage(cfg).needs)
    assert lrn.archer is not None and lrn.critic is None
    assert not any(p is q for p in lrn.params for q in lrn.archer.params)
    other = from_dict({"algorithm": {"estimator": "gae"}})
    assert Learner(th.tiny_qwen(0), other,
                   needs=advantage_stage(other).needs).archer is None


# ---------------------------------------------------------------- crash + resume


@torch.no_grad()
def two_turn_rollout(model, sampler, n=6):
    """Two turns per episode sampled from ``model``: reward 1 on turn 1 for GOOD_TOKEN."""
    eps = []
    for i in range(n):
        turns, ctx = [], [1, 2 + i % 3]
        for k in range(2):
            logits = model(input_ids=torch.tensor([ctx])).logits[0, -1].float()
            logp = torch.log_softmax(logits, -1)
            tok = int(torch.multinomial(logp.exp(), 1, generator=sampler.gen))
            r = float(k == 1 and tok == th.GOOD_TOKEN)
            turns.append(Turn(agent=0, prompt_ids=list(ctx), action_ids=[tok],
                              logprobs=[float(logp[tok])], reward=r, done=k == 1))
            ctx = ctx + [tok, 3]
        eps.append(Episode(env="toy", seed=i, group=i // 2, num_agents=1, turns=turns,
                           returns=[sum(t.reward for t in turns)]))
    return eps


def _run(run_dir, crash_at=None, resume_run=False):
    model = th.tiny_qwen(0)
    sampler = th.Sampler(5)

    def rollout_fn(step):
        if step == crash_at:
            raise KeyboardInterrupt
        return two_turn_rollout(model, sampler)

    cfg = from_dict({"algorithm": {"estimator": "archer_targets", "objective": "ppo_clip"},
                     "critic": {"archer": {"buffer_steps": 2, "updates": 2, "batch_turns": 8}},
                     "optim": {"lr": 3e-3}, "train": {"steps": 5, "seed": 4},
                     "checkpoint": {"every": 0, "keep": 3}, "logging": {"progress": False}})
    if resume_run:
        return resume(run_dir, model, rollout_fn, stateful={"sampler": sampler})
    return train(cfg, model, rollout_fn, stateful={"sampler": sampler}, run_dir=run_dir)


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
            for r in rows]


def test_crash_then_resume_restores_critic_targets_and_replay_exactly(tmp_path):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    _run(full)
    with pytest.raises(KeyboardInterrupt):
        _run(crashed, crash_at=3)
    (ckpt,) = [p for s, p in step_dirs(crashed) if s == 3]
    state = json.loads((ckpt / "state.json").read_text())["state"]["learner"]["archer"]
    assert {"online", "target", "optimizer", "replay", "gen", "steps_seen"} <= set(state)
    assert state["steps_seen"] == 3 and state["replay"]["steps"] == 2
    _run(crashed, resume_run=True)
    a, b = _strip(read_metrics(full)), _strip(read_metrics(crashed))
    assert [r["step"] for r in a] == [1, 2, 3, 4, 5]
    assert a == b
    for key in ("critic/q_loss", "critic/v_loss", "critic/q_mean", "critic/v_mean",
                "critic/td_error", "critic/buffer_turns"):
        assert key in a[-1], key
    assert a[0]["critic/buffer_turns"] == 12 and a[-1]["critic/buffer_turns"] == 24

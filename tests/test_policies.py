"""Several policies in one run: config, rollouts, separate updates, multi-LoRA on
one base, exact resume, evaluation and the command line, and a slow learning run."""

import json
import re
import time
from pathlib import Path

import pytest
import torch

from sparring.assembly.run import build
from sparring.config import (
    ConfigError,
    check_resume_overrides,
    from_dict,
    load_config,
    policy_config,
)
from sparring.data import Episode, Turn, collate
from sparring.storage.folders import read_tensors, step_dirs
from sparring.storage.metrics_file import read_metrics
from sparring.train.loop import resume, train

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2,
        "intermediate_size": 64}
VOLATILE = ("time/", "throughput/")


def _merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _data(**over):
    base = {"model": {"name": "tiny", "options": TINY},
            "policies": {"speaker": {}, "listener": {"optim": {"lr": 3e-3}}},
            "envs": [{"name": "signalling", "options": {"k": 3}, "group_size": 4,
                      "seats": ["speaker", "listener"]}],
            "rollout": {"episodes_per_step": 8, "max_new_tokens": 8, "history": "state",
                        "system_prompt": ""},
            "algorithm": {"estimator": "grpo"},
            "optim": {"lr": 1e-2},
            "train": {"steps": 4, "epochs": 1, "seed": 3},
            "eval": {"games": 4, "every": 0, "at_start": False, "opponents": ["random"]},
            "checkpoint": {"every": 2, "keep": 5},
            "logging": {"progress": False}}
    return _merge(base, over)


def _cfg(**over):
    return from_dict(_data(**over))


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


# ---------------------------------------------------------------- config


def test_a_policy_inherits_the_top_level_sections_and_overrides_its_own_keys():
    cfg = from_dict(_data(policies={"speaker": {"model": {"options": {"seed": 5}}},
                                    "listener": {"optim": {"lr": 3e-4, "schedule": "cosine"},
                                                 "kl": {"coef": 0.2}, "lora": {"r": 4}}},
                          algorithm={"kl": {"coef": 0.05, "estimator": "k1"}}),
                    ["policies.speaker.optim.weight_decay=0.1"])
    s, li = policy_config(cfg, "speaker"), policy_config(cfg, "listener")
    assert s.model.options == {**TINY, "seed": 5}  # merged key by key, not replaced
    assert li.model.options == TINY
    assert (s.optim.lr, s.optim.weight_decay, s.optim.schedule) == (1e-2, 0.1, "constant")
    assert (li.optim.lr, li.optim.weight_decay, li.optim.schedule) == (3e-4, 0.0, "cosine")
    assert (s.algorithm.kl.coef, s.algorithm.kl.estimator) == (0.05, "k1")
    assert (li.algorithm.kl.coef, li.algorithm.kl.estimator) == (0.2, "k1")
    assert (s.lora.r, li.lora.r) == (8, 4)
    assert cfg.optim.lr == 1e-2 and cfg.algorithm.kl.coef == 0.05  # the run's own unchanged


def test_command_line_overrides_add_and_change_policies():
    from sparring.config import PolicySpec

    data = _data()
    data["policies"] = {}
    data["envs"][0]["seats"] = []
    cfg = from_dict(data, ["policies.a={}", "policies.b.optim.lr=0.5",
                           "envs.0.seats=[a, b]"])
    assert cfg.policies == {"a": PolicySpec(), "b": PolicySpec(optim={"lr": 0.5})}
    cfg = from_dict(data, ["policies={a: {kl: {coef: 0.1}}, b: null}", "envs.0.seats=[b, a]"])
    assert cfg.policies == {"a": PolicySpec(kl={"coef": 0.1}), "b": PolicySpec()}
    assert policy_config(cfg, "a").algorithm.kl.coef == 0.1


def test_a_policy_may_have_its_own_algorithm_with_its_kl_keys_on_top():
    cfg = _cfg(policies={"speaker": {"algorithm": {"entropy_coef": 0.05, "estimator": "rloo",
                                                   "kl": {"coef": 0.3}}},
                         "listener": {"algorithm": {"kl": {"coef": 0.3}}, "kl": {"coef": 0.1}}},
               algorithm={"estimator": "grpo", "kl": {"estimator": "k2"}})
    s, li = policy_config(cfg, "speaker"), policy_config(cfg, "listener")
    assert (s.algorithm.estimator, s.algorithm.entropy_coef) == ("rloo", 0.05)
    assert (li.algorithm.estimator, li.algorithm.entropy_coef) == ("grpo", 0.0)
    assert (s.algorithm.kl.coef, s.algorithm.kl.estimator) == (0.3, "k2")
    assert li.algorithm.kl.coef == 0.1  # `kl` over `algorithm.kl`


def test_policies_whose_estimators_need_different_layouts_are_refused(monkeypatch):
    from dataclasses import replace

    from sparring.advantages import ESTIMATORS

    monkeypatch.setitem(ESTIMATORS._entries, "whole_episode_only",
                        replace(ESTIMATORS.get("grpo"), name="whole_episode_only",
                                layout="trajectory"))
    data = _data(policies={"listener": {"algorithm": {"estimator": "whole_episode_only"}}},
                 algorithm={"estimator": "turn_rtg"})
    with pytest.raises(ConfigError, match=r"policies: the estimators need different row "
                       r"layouts \(speaker: turn, listener: trajectory\)"):
        from_dict(data)
    data["algorithm"]["estimator"] = "grpo"  # any + trajectory: one layout
    from_dict(data)


BAD = [
    ({"envs": [{"name": "signalling", "seats": ["speaker", "listner"]}]},
     r"envs\.0\.seats\.1: unknown policy 'listner'; did you mean 'listener'"),
    ({"envs": [{"name": "signalling", "seats": ["speaker"]}]},
     r"envs\.0\.seats: signalling has 2 seats, got 1 names"),
    ({"envs": [{"name": "signalling", "seats": ["speaker", "listener", "speaker"]}]},
     r"envs\.0\.seats: signalling has 2 seats, got 3 names"),
    ({"envs": [{"name": "signalling"}]}, r"envs\.0\.seats: with `policies` every env names"),
    ({"policies": {"speaker": {}, "listener": {}, "idle": {}}},
     r"policies\.idle: no env seat plays it"),
    ({"policies": {"speaker": {"optim": {"lrr": 1}}}},
     r"unknown key 'policies\.speaker\.optim\.lrr'; did you mean 'lr'"),
    ({"policies": {"speaker": {"optim": {"lr": -1}}}},
     r"policies\.speaker\.optim\.lr: -1\.0 is out of range \(must be > 0\)"),
    ({"policies": {"speaker": {"model": {"options": {"hiden_size": 8}}}}},
     r"policies\.speaker\.model\.options: the tiny model has no option 'hiden_size'"),
    ({"policies": {"spe/aker": {}}}, r"policies\.spe/aker: a policy name is letters"),
    ({"policies": {"speaker": {"algorithm": {"estimator": "grpoo"}}, "listener": {}}},
     r"policies\.speaker\.algorithm\.estimator: unknown estimator 'grpoo'"),
    ({"policies": {"speaker": {"algorithm": {"estimator_options": {"bogus": 1}}},
                   "listener": {}}},
     r"policies\.speaker\.algorithm\.estimator_options: .*bogus"),
    ({"policies": {"speaker": {"algorithm": {"entropy_coeff": 1}}, "listener": {}}},
     r"unknown key 'policies\.speaker\.algorithm\.entropy_coeff'; did you mean 'entropy_coef'"),
    ({"lora": {"shared_base": True}}, r"lora\.shared_base: .* set lora\.enabled=true"),
    ({"lora": {"enabled": True, "shared_base": True},
      "policies": {"speaker": {"model": {"options": {"seed": 1}}}}},
     r"policies\.speaker\.model: with lora\.shared_base"),
]


@pytest.mark.parametrize(("over", "message"), BAD)
def test_bad_policies_or_seats_are_errors_naming_the_key(over, message):
    data = _data()
    if "policies" in over:  # replace, not merge: the listed policies are the run's
        data["policies"] = {}
    with pytest.raises(ConfigError, match=message):
        from_dict(_merge(data, over))


def test_seats_without_policies_are_an_error_and_no_policies_is_the_old_config():
    data = _data()
    data["policies"] = {}
    with pytest.raises(ConfigError, match=r"envs\.0\.seats: names policies, but the config "
                                          "defines none"):
        from_dict(data)
    data["envs"][0]["seats"] = []
    assert from_dict(data).policies == {}


def test_resume_refuses_a_change_of_the_policies_or_their_models():
    saved = _cfg()
    check_resume_overrides(saved, from_dict(_data(), ["policies.listener.optim.lr=1e-4"]))
    for over, key in ((["policies.listener.lora.r=4"], "policies.listener.lora.r"),
                      (["policies.listener.model.options.seed=2"],
                       "policies.listener.model.options.seed"),
                      (["policies.listener.kl.reference=magnet"],
                       "policies.listener.kl.reference")):
        with pytest.raises(ConfigError, match=re.escape(key) + ": cannot change on --resume"):
            check_resume_overrides(saved, from_dict(_data(), over))
    other = _data(envs=[{"name": "signalling", "seats": ["speaker", "speaker"]}])
    other["policies"] = {"speaker": {}}
    with pytest.raises(ConfigError, match="policies: cannot change on --resume"):
        check_resume_overrides(saved, from_dict(other))


# ---------------------------------------------------------------- data and rollouts


def test_collate_records_the_policy_of_every_row():
    def ep(players, acting):
        turns = [Turn(agent=a, prompt_ids=[1], action_ids=[2] if a in acting else [])
                 for a in range(len(players))]
        return Episode(env="toy", seed=0, group=0, num_agents=len(players), turns=turns,
                       returns=[0.0] * len(players), info={"players": players})

    b = collate([ep(["a", "b"], {0, 1}), ep(["b", "bot"], {0}), ep(["a", "a"], {0, 1})])
    # rows in episode then seat order: a, b | b (the bot's turn makes none) | a, a
    assert b.policy_names == ["a", "b"]
    assert b.policy.tolist() == [0, 1, 1, 0, 0]
    assert b.select([1, 3]).policy.tolist() == [1, 0]
    assert collate([Episode(env="toy", seed=0, group=0, num_agents=1,
                            turns=[Turn(agent=0, prompt_ids=[1], action_ids=[2])],
                            returns=[0.0])]).policy_names == [""]


def test_each_seat_plays_its_policy_and_each_turn_is_one_batched_call_per_policy(tmp_path):
    parts = build(_cfg(), tmp_path)
    calls = {"speaker": [], "listener": []}
    for name, pol in parts.policies.items():
        original = pol.generate

        def counting(prompts, *a, _name=name, _orig=original, **kw):
            calls[_name].append(len(prompts))
            return _orig(prompts, *a, **kw)

        pol.generate = counting
    episodes = parts.rollout_fn(0)
    # 8 episodes of one round: each policy is called once, for all 8 episodes at once
    assert calls == {"speaker": [8], "listener": [8]}
    assert all(ep.info["players"] == ["speaker", "listener"] for ep in episodes)
    batch = collate(episodes)
    for name, seat in (("speaker", 0), ("listener", 1)):
        rows = batch.policy == batch.policy_names.index(name)
        assert batch.agent[rows].unique().tolist() == [seat] and int(rows.sum()) == 8


def test_against_a_bot_the_rotating_seat_is_played_by_that_seats_policy(tmp_path):
    cfg = _cfg(envs=[{"name": "signalling", "options": {"k": 3}, "group_size": 2,
                      "seats": ["speaker", "listener"], "opponents": ["random"]}])
    episodes = build(cfg, tmp_path).rollout_fn(0)
    # episode i: the learner's seat is i % 2 (seating.rotating), the bot in the other one
    want = [["speaker", "random"] if i % 2 == 0 else ["random", "listener"] for i in range(8)]
    assert [ep.info["players"] for ep in episodes] == want


def _pool_cfg(**over):
    # the speaker's initial weights differ from the listener's, so a snapshot shows whose it is
    return _cfg(**_merge({"policies": {"speaker": {"model": {"options": {"seed": 5}}}},
                          "envs": [{"name": "signalling", "options": {"k": 3}, "group_size": 2,
                                    "seats": ["speaker", "listener"], "opponents": ["pool"]}],
                          "league": {"every": 1, "max": 2}}, over))


def test_each_policy_snapshots_itself_and_its_pool_keeps_league_max(tmp_path):
    from safetensors.torch import load_file

    parts = build(_pool_cfg(), tmp_path)
    roll = parts.rollout_fn
    roll(0), roll(1)
    assert sorted(p.name for p in (tmp_path / "pool").iterdir()) == \
        ["step-000001.listener", "step-000001.speaker"]
    for name, model in parts.model.items():  # each snapshot holds its own policy's weights
        saved = load_file(tmp_path / "pool" / f"step-000001.{name}" / "model.safetensors")
        mine = model.state_dict()
        assert all(torch.equal(v, mine[k]) for k, v in saved.items())
    other = load_file(tmp_path / "pool" / "step-000001.speaker" / "model.safetensors")
    assert any(not torch.equal(v, parts.model["listener"].state_dict()[k])
               for k, v in other.items())
    for step in (2, 3, 4):
        roll(step)
    for name, pool in roll.pools.items():
        assert [(c.step, c.path, c.name) for c in pool.checkpoints] == \
            [(s, f"pool/step-00000{s}.{name}", f"ckpt-{s}.{name}") for s in (3, 4)]
        assert len(pool._cache) <= 2
    # at step 4's start the pools held 2 and 3: snapshot 1 of each went, 2 goes next
    assert sorted(p.name for p in (tmp_path / "pool").iterdir()) == \
        [f"step-00000{s}.{n}" for s in (2, 3, 4) for n in ("listener", "speaker")]
    state = roll.state_dict()
    assert set(state) == {"pools"} and set(state["pools"]) == {"speaker", "listener"}


def test_against_the_pool_each_seat_is_a_snapshot_of_its_own_policy(tmp_path, monkeypatch):
    from sparring.rollout.snapshots import SnapshotStore

    original = SnapshotStore.load
    played: dict[str, int] = {}  # snapshot folder -> prompts it generated for

    def load(self, path):
        pol = original(self, path)
        generate = pol.generate

        def counting(prompts, *a, **kw):
            played[pol.name] = played.get(pol.name, 0) + len(prompts)
            return generate(prompts, *a, **kw)

        pol.generate = counting
        return pol

    monkeypatch.setattr(SnapshotStore, "load", load)
    parts = build(_pool_cfg(), tmp_path)
    roll = parts.rollout_fn
    roll(0)
    episodes = roll(1)
    seats = ["speaker", "listener"]
    seen = set()
    for i, ep in enumerate(episodes):
        me = i % 2  # the rotating seat: its policy, the other seat from its own pool
        for s, player in enumerate(ep.info["players"]):
            want = {seats[s]} if s == me else {"random", f"ckpt-1.{seats[s]}"}
            assert player in want
            seen.add(player)
    assert {"ckpt-1.speaker", "ckpt-1.listener"} <= seen
    # the snapshot players sampled from the weights of their own policy
    assert set(played) == {"step-000001.speaker", "step-000001.listener"}
    for name, model in parts.model.items():
        snap = roll.pools[name]._cache["pool/step-000001." + name].policy.model.state_dict()
        mine = model.state_dict()
        assert all(torch.equal(v, mine[k]) for k, v in snap.items())
    speaker_snap = roll.pools["speaker"]._cache["pool/step-000001.speaker"].policy.model
    listener = parts.model["listener"].state_dict()
    assert any(not torch.equal(v, listener[k])
               for k, v in speaker_snap.state_dict().items())
    batch = collate(episodes, pad_id=parts.pad_id)  # snapshot turns make no rows
    assert set(batch.policy_names) <= {"speaker", "listener"}


# ---------------------------------------------------------------- updates


def test_an_update_of_one_policy_leaves_the_other_bit_identical(tmp_path):
    cfg = _cfg(train={"steps": 1}, checkpoint={"every": 0},
               policies={"speaker": {"algorithm": {"entropy_coef": 0.05}}})
    parts = build(cfg, tmp_path / "parts")

    def speaker_rows_only(step):  # the listener's turns made no rows (as a bot's would)
        episodes = parts.rollout_fn(step)
        for ep in episodes:
            for t in ep.turns:
                if t.agent == 1:
                    t.action_ids, t.logprobs, t.allowed_ids = [], None, None
        return episodes

    before = {n: {k: v.clone() for k, v in m.state_dict().items()} for n, m in parts.model.items()}
    train(cfg, parts.model, speaker_rows_only, None, parts.stateful, run_dir=tmp_path / "run",
          pad_id=parts.pad_id)
    listener = parts.model["listener"].state_dict()
    assert all(torch.equal(listener[k], v) for k, v in before["listener"].items())
    speaker = parts.model["speaker"].state_dict()
    assert sum(not torch.equal(speaker[k], v) for k, v in before["speaker"].items()) > 0
    row = read_metrics(tmp_path / "run")[-1]
    assert row["policy/speaker/optimizer_steps"] == 1  # one epoch, the whole batch
    assert row["policy/listener/optimizer_steps"] == 0
    assert row["policy/listener/lr"] == 3e-3 and row["policy/speaker/lr"] == 1e-2
    # the speaker's own algorithm section: its learner weights an entropy bonus
    assert row["policy/speaker/entropy_coef"] == 0.05 and "policy/listener/entropy_coef" not in row
    assert "loss" not in row and "policy/speaker/loss" in row  # learner metrics per policy
    assert "return/seat1" in row and "reward" in row  # rollout metrics stay global


@pytest.mark.parametrize("shared", [False, True], ids=["own_models", "lora_one_base"])
def test_two_policies_have_separate_optimizers_over_disjoint_weights(shared, tmp_path):
    from sparring.train.policies import trained_policies

    over = {"lora": {"enabled": True, "shared_base": True, "r": 2}} if shared else {}
    cfg = _cfg(**over)
    parts = build(cfg, tmp_path)
    speaker, listener = trained_policies(cfg, parts.model)
    batch = collate(parts.rollout_fn(0), pad_id=parts.pad_id)
    mine = batch.select((batch.policy == batch.policy_names.index("speaker")).nonzero()[:, 0])
    mine, _ = speaker.learner.annotate(mine, speaker.stage.needs)
    adv, keep = speaker.stage(mine)
    before = {k: v.clone() for k, v in listener.model.state_dict().items()}
    speaker_before = {n: p.detach().clone() for n, p in speaker.model.named_parameters()}
    speaker.learner.update(mine, adv, keep)
    # every tensor the listener's forward reads (with a shared base: its adapter, the base)
    after = listener.model.state_dict()
    changed = {k for k, v in before.items() if not torch.equal(after[k], v)}
    trained = {n for n, p in speaker.model.named_parameters()
               if not torch.equal(p, speaker_before[n])}
    assert trained and all(not shared or ".speaker." in n for n in trained)
    assert changed == ({n for n in trained} if shared else set())
    assert not {id(p) for p in speaker.learner.params} & {id(p) for p in listener.learner.params}
    assert len(listener.learner.optimizer.state) == 0
    assert len(speaker.learner.optimizer.state) == len(speaker.learner.params)


def _merged_forward(cfg, adapter_state, ids):
    """The tiny model's logits with LoRA merged by hand: W + (alpha / r) B A per target."""
    from sparring.policy.tiny import build_tiny_model

    model, _ = build_tiny_model(dict(cfg.model.options))
    scale = cfg.lora.alpha / cfg.lora.r
    with torch.no_grad():
        for name, module in model.named_modules():
            a = adapter_state.get(f"base_model.model.{name}.lora_A.weight")
            if a is not None:
                b = adapter_state[f"base_model.model.{name}.lora_B.weight"]
                module.weight += scale * b @ a
        return model(input_ids=ids).logits


def test_two_lora_adapters_on_one_base_train_apart_and_leave_the_base_alone(tmp_path):
    from peft import get_peft_model_state_dict

    cfg = _cfg(lora={"enabled": True, "shared_base": True, "r": 2, "alpha": 4.0,
                     "target_modules": ["q_proj", "v_proj"]},
               train={"steps": 3}, checkpoint={"every": 0})
    parts = build(cfg, tmp_path / "parts")
    peft_model = parts.model["speaker"]
    assert parts.model["listener"] is peft_model  # one model in memory
    base = {k: v.clone() for k, v in peft_model.state_dict().items() if "lora_" not in k}
    train(cfg, parts.model, parts.rollout_fn, None, parts.stateful, run_dir=tmp_path / "run",
          pad_id=parts.pad_id)
    after = peft_model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())  # bit-identical base
    states = {n: get_peft_model_state_dict(peft_model, adapter_name=n)
              for n in ("speaker", "listener")}
    for st in states.values():  # B starts at zero: both adapters trained
        assert all(v.abs().sum() > 0 for k, v in st.items() if "lora_B" in k)
    assert any(not torch.equal(states["speaker"][k], states["listener"][k])
               for k in states["speaker"])
    # each policy samples through its own adapter: the model's logits with that adapter
    # active equal a fresh model with that adapter merged in by hand
    ids = torch.tensor([[3, 40, 41, 42, 7]])
    for name, pol in parts.policies.items():
        pol.activate()
        with torch.no_grad():
            got = peft_model(input_ids=ids).logits
        torch.testing.assert_close(got, _merged_forward(cfg, states[name], ids),
                                   atol=1e-5, rtol=1e-5)
    ckpt = step_dirs(tmp_path / "run")[-1][1]
    for name, st in states.items():
        saved = read_tensors(ckpt / f"adapter.{name}.safetensors")
        assert set(saved) == set(st) and all(torch.equal(saved[k], st[k]) for k in st)


# ---------------------------------------------------------------- a league of adapters


SHARED_LORA = {"lora": {"enabled": True, "shared_base": True, "r": 4}}


def _shared_pool_cfg(**over):
    # self-play too: against the pool a group of 2 gives each policy one row (no advantage)
    return _cfg(**_merge({**SHARED_LORA, "league": {"every": 1, "max": 2},
                          "envs": [{"name": "signalling", "options": {"k": 3}, "group_size": 2,
                                    "seats": ["speaker", "listener"],
                                    "opponents": ["self", "pool"]}]}, over))


def _adapter_logprobs(policy, ids):
    """Log-probs of ``ids`` under ``policy``'s adapter of the shared model."""
    from sparring.policy.forward import token_logprobs

    policy.activate()
    with torch.no_grad():
        return token_logprobs(policy.model, ids, torch.ones_like(ids))[0]


def test_a_shared_base_snapshot_is_the_adapter_alone_and_plays_as_the_adapter_did(
        tmp_path, monkeypatch):
    """With lora.shared_base a snapshot is its policy's adapter (PEFT's format,
    LoRA weights only, a fraction of a full snapshot); loaded, it is one more adapter of the
    run's model whose log-probs are the policy's at the moment of the snapshot. Learners
    after steps with snapshot play train exactly their own adapter, which gets gradients."""
    from safetensors.torch import load_file

    from sparring.train.learner import Learner

    cfg = _shared_pool_cfg()
    parts = build(cfg, tmp_path / "parts")
    model, roll = parts.model["speaker"], parts.rollout_fn
    ids = torch.tensor([[3, 40, 41, 42, 7, 12, 50]])
    at_start: dict[int, dict[str, torch.Tensor]] = {}  # the weights step k's snapshot takes

    def rollouts(step):
        at_start[step] = {n: _adapter_logprobs(p, ids) for n, p in parts.policies.items()}
        return roll(step)

    rollouts.league_metrics = roll.league_metrics
    seen = []  # per optimizer step: its adapter, what requires and has a gradient, its norm
    guarded = Learner._guarded_step

    def step_and_look(self, grad_norm, stepped):
        params = dict(self.model.named_parameters())
        seen.append((self.adapter, {n for n, p in params.items() if p.requires_grad},
                     {n for n, p in params.items() if p.grad is not None}, grad_norm,
                     any(a.startswith("pool-") for a in self.model.peft_config)))
        return guarded(self, grad_norm, stepped)

    monkeypatch.setattr(Learner, "_guarded_step", step_and_look)
    train(cfg, parts.model, rollouts, None, parts.stateful, run_dir=tmp_path / "run",
          pad_id=parts.pad_id)
    for adapter, grad_on, got_grad, _, _ in seen:  # exactly its own adapter's weights
        assert grad_on == got_grad == {n for n in dict(model.named_parameters())
                                       if f".{adapter}." in n}
    for name in parts.policies:  # after steps with snapshot play, gradients that move them
        assert any(a == name and norm > 0 and pool for a, _, _, norm, pool in seen)
    for name, pool in roll.pools.items():
        assert [c.step for c in pool.checkpoints] == [2, 3]
        for ck in pool.checkpoints:
            snap = pool._player(ck).policy
            assert snap.model is model and snap.adapter == f"pool-step-00000{ck.step}-{name}"
            torch.testing.assert_close(_adapter_logprobs(snap, ids), at_start[ck.step][name],
                                       rtol=0, atol=1e-6)
            assert not any(p.requires_grad for p in model.parameters())  # active, frozen
        assert not torch.allclose(at_start[2][name], _adapter_logprobs(parts.policies[name], ids))
    folder = tmp_path / "parts" / "pool" / "step-000003.speaker"
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "manifest.json", "snapshot.json"]
    weights = load_file(folder / "adapter_model.safetensors")
    assert weights and all(".lora_A." in k or ".lora_B." in k for k in weights)
    full = build(_pool_cfg(), tmp_path / "full")  # own models: full snapshots
    full.rollout_fn(0), full.rollout_fn(1)
    size = (tmp_path / "full" / "pool" / "step-000001.speaker" / "model.safetensors").stat().st_size
    assert (folder / "adapter_model.safetensors").stat().st_size * 10 < size


def test_a_shared_base_pool_deletes_the_adapters_it_lets_go(tmp_path):
    """A snapshot adapter dropped from its pool or evicted from its cache (``league.cache``)
    leaves the model at the next play (the arena may still be playing an evicted one): the
    model holds the policies' adapters and those of the loaded snapshots only."""
    from sparring.distributed.weights import weights_to_send

    parts = build(_shared_pool_cfg(league={"cache": 1}), tmp_path)
    model, roll = parts.model["speaker"], parts.rollout_fn
    evicted = 0
    for step in range(6):
        roll(step)
        evicted += len(roll.snapshots._unloaded)  # let go during this play
        roll.snapshots.release(roll.pools)
        loaded = {p.policy.adapter for pool in roll.pools.values() for p in pool.loaded().values()}
        assert set(model.peft_config) == {"speaker", "listener", *loaded}
        assert len(loaded) <= 2  # a snapshot per pool
    assert evicted  # (draws of both snapshots of a pool in one play)
    state = roll.state_dict()
    for pool in state["pools"].values():
        pool["checkpoints"] = pool["checkpoints"][-1:]  # a pool that dropped its older one
    roll.load_state_dict(state)
    roll.collect(6, [])
    loaded = {p.policy.adapter for pool in roll.pools.values() for p in pool.loaded().values()}
    assert loaded and set(model.peft_config) == {"speaker", "listener", *loaded}
    for first in (True, False):  # Ray workers get the policies' weights, load their own pool
        sent = weights_to_send(parts.model, first=first)
        assert sent and not any("pool-" in k for k in sent)


# ---------------------------------------------------------------- resume


VARIANTS = {
    # own models: one policy pulled towards its initial weights, the other to a magnet
    "separate": {"policies": {"speaker": {"kl": {"coef": 0.05}},
                              "listener": {"optim": {"lr": 3e-3},
                                           "kl": {"coef": 0.05, "reference": "magnet",
                                                  "magnet_rate": 0.1}}}},
    # adapters on one base, KL towards the base (adapters off)
    "shared_lora": {"lora": {"enabled": True, "shared_base": True, "r": 2},
                    "algorithm": {"kl": {"coef": 0.05}}},
    # own models against each other's past snapshots (a pool per policy)
    "pool": {"envs": [{"name": "signalling", "options": {"k": 3}, "group_size": 2,
                       "seats": ["speaker", "listener"], "opponents": ["self", "pool"]}],
             "league": {"every": 1, "max": 2}},
    # adapters on one base against their past adapters, the listener pulled to a magnet
    "pool_shared_lora": {**SHARED_LORA,
                         "envs": [{"name": "signalling", "options": {"k": 3}, "group_size": 2,
                                   "seats": ["speaker", "listener"],
                                   "opponents": ["self", "pool"]}],
                         "league": {"every": 1, "max": 2},
                         "policies": {"listener": {"kl": {"coef": 0.05, "reference": "magnet",
                                                          "magnet_rate": 0.1}}}},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_resumed_two_policy_run_repeats_an_uninterrupted_one(variant, tmp_path):
    cfg = _cfg(**VARIANTS[variant], eval={"every": 2, "opponents": ["random"]})
    full, cut = tmp_path / "full", tmp_path / "cut"
    parts = build(cfg, full)
    train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful, run_dir=full,
          pad_id=parts.pad_id)

    parts = build(cfg, cut)

    def stop_at_step_3(step):
        if step == 2:
            raise KeyboardInterrupt
        return parts.rollout_fn(step)

    stop_at_step_3.league_metrics = parts.rollout_fn.league_metrics  # logged as by the rollouts
    with pytest.raises(KeyboardInterrupt):
        train(cfg, parts.model, stop_at_step_3, parts.eval_fn, parts.stateful, run_dir=cut,
              pad_id=parts.pad_id)
    assert [s for s, _ in step_dirs(cut)] == [2]
    parts = build(cfg, cut)  # a fresh process: new models, rollouts
    resume(cut, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
           pad_id=parts.pad_id)
    a, b = _strip(read_metrics(full)), _strip(read_metrics(cut))
    assert [r["step"] for r in a] == [1, 2, 3, 4] and a == b
    assert "eval/signalling/joint/mean_return_seat0" in a[3]
    assert "eval/policy/listener/signalling/random/win" in a[3]
    ck_a, ck_b = step_dirs(full)[-1][1], step_dirs(cut)[-1][1]
    kind = "adapter" if variant.endswith("shared_lora") else "model"
    names = sorted(p.name for p in ck_a.iterdir() if p.suffix == ".safetensors")
    assert names == [f"{kind}.listener.safetensors", f"{kind}.speaker.safetensors",
                     "state.safetensors"]
    for name in names:  # weights of both policies, and every tensor of their state
        x, y = read_tensors(ck_a / name), read_tensors(ck_b / name)
        assert set(x) == set(y) and all(torch.equal(x[k], y[k]) for k in x)
    state = json.loads((ck_a / "state.json").read_text())["state"]
    assert {"learner.speaker", "stage.speaker", "learner.listener", "stage.listener"} <= set(state)
    if variant == "separate":
        assert "magnet" in state["learner.listener"] and "magnet" not in state["learner.speaker"]
        assert sorted(p.name for p in full.glob("reference*")) == ["reference.speaker.safetensors"]
    if variant.startswith("pool"):  # each policy's pool, snapshots played in resumed steps
        pools = state["user.rollouts"]["pools"]
        assert {n: [c["path"] for c in p["checkpoints"]] for n, p in pools.items()} == \
            {n: [f"pool/step-000002.{n}", f"pool/step-000003.{n}"]
             for n in ("speaker", "listener")}
        # the resumed process drew snapshots (loaded from disk) in the steps it replayed
        assert any(pool._cache for pool in parts.rollout_fn.pools.values())


# ---------------------------------------------------------------- eval, play, export


def test_exploitability_of_a_profile_of_two_policies():
    """Zero-sum: NashConv(p0, q1) = BR_0(q1) + BR_1(p0), so swapping the seats of two
    policies and adding gives the sum of each playing both seats."""
    from sparring.config import RolloutConfig
    from sparring.eval.games import policy_exploitability
    from sparring.policy.hf import HFPolicy
    from sparring.policy.tiny import build_tiny_model
    from sparring.rollout.rollouts import make_arena

    arena = make_arena(RolloutConfig(system_prompt=""))
    p, q = (HFPolicy(*build_tiny_model({**TINY, "seed": s})) for s in (1, 2))
    e = {k: policy_exploitability(arena, v, "kuhn_poker", {})
         for k, v in {"pp": p, "qq": q, "pq": [p, q], "qp": [q, p], "p,p": [p, p]}.items()}
    assert e["p,p"] == e["pp"]  # one policy in every seat, either way
    # (float32 forwards batched differently: equal to rounding)
    assert e["pq"] + e["qp"] == pytest.approx(e["pp"] + e["qq"], abs=1e-6)
    assert abs(e["pq"] - e["pp"]) > 1e-4  # the second seat's policy counts


def test_eval_play_and_export_take_a_policy(tmp_path, capsys):
    from sparring.assembly.trained import load_policies, load_policy
    from sparring.cli import main
    from sparring.terminal_game import play_in_terminal

    cfg = _cfg(train={"steps": 1}, checkpoint={"every": 0})
    parts = build(cfg, tmp_path)
    run = train(cfg, parts.model, parts.rollout_fn, None, parts.stateful,
                run_dir=tmp_path / "run", pad_id=parts.pad_id)
    capsys.readouterr()
    assert main(["eval", str(run), "--policy", "listener", "--games", "2"]) == 0
    out = capsys.readouterr().out
    assert "listener" in out and "speaker" not in out.split("policy")[-1]
    assert main(["eval", str(run), "--games", "2"]) == 0  # each policy in turn
    out = capsys.readouterr().out
    assert "listener" in out and "speaker" in out
    assert main(["eval", str(run), "--policy", "nobody"]) == 2
    assert "no policy 'nobody'; it trains speaker, listener" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--policy: this run trains several policies"):
        load_policy(run)
    # the saved weights come back: the loaded listener equals the trained one
    loaded, _, _ = load_policy(run, policy="listener")
    trained = parts.model["listener"].state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in loaded.model.state_dict().items())
    policies, _, _ = load_policies(run)
    assert list(policies) == ["speaker", "listener"]
    # a person guesses 'red' as the listener against the trained speaker: both score
    # 1 exactly when the secret of seed 0's first round is red
    from sparring.envs import make

    env = make("signalling", k=3)
    env.reset(0)
    returns = play_in_terminal(list(policies.values()), cfg, "signalling", human_seat=1,
                   ask=lambda _: "red", say=lambda _: None, seed=0)
    want = 1.0 if env.secrets[0] == "red" else 0.0
    assert returns == [want, want]
    out_dir = tmp_path / "exported"
    assert main(["export", str(run), str(out_dir), "--policy", "speaker"]) == 0
    info = json.loads((out_dir / "sparring_export.json").read_text())
    assert info["policy"] == "speaker"


# ---------------------------------------------------------------- learning


@pytest.mark.slow
def test_two_policies_learn_a_signalling_convention(tmp_path):
    """configs/signalling_two_policies.yaml: a speaker and a listener, each its own model,
    agree on a code for 4 colours (chance 1/4); the greedy pair is right >= 90% of the time.
    Over seeds 0-7 the recipe reaches the full code on every seed by step 350 (its seed 2,
    this test's, last of them; docs/benchmarks.md, "Two-policy signalling over seeds")."""
    t0 = time.perf_counter()
    cfg = load_config(CONFIGS / "signalling_two_policies.yaml",
                      ["logging.progress=false", f"train.run_dir={tmp_path}"])
    parts = build(cfg, tmp_path)
    train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful, run_dir=tmp_path,
          pad_id=parts.pad_id)
    last = read_metrics(tmp_path)[-1]
    success = last["eval/signalling/joint/mean_return_seat0"]
    print(f"signalling two policies: success {success:.3f} after {cfg.train.steps} steps, "
          f"{time.perf_counter() - t0:.0f} s")
    assert success >= 0.9

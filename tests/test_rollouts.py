"""The rollout schedule of a run (sparring.rollout.rollouts): episode counts, opponents,
seat rotation, determinism per step."""

import re
import shutil
from pathlib import Path

import pytest

from sparring.assembly.run import build
from sparring.config import ConfigError, load_config
from sparring.config.plan import episode_counts
from sparring.rollout.seating import learner_seat, rotating

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = ["model.options.hidden_size=32", "model.options.num_layers=1",
        "model.options.intermediate_size=64", "model.options.num_heads=2",
        "model.options.num_kv_heads=2"]


def _cfg(overrides=()):
    """The default recipe, small; without its loss replay, whose buffer makes a step's
    rollouts depend on the steps played before (tests/test_loss_replay.py covers it), and
    with one bot in the pool, the random one: with several, PFSP's draws follow the scores
    of the steps before."""
    return load_config(CONFIGS / "default.yaml", [*TINY, "rollout.episodes_per_step=24",
                                                  "envs.0.group_size=4",
                                                  "envs.0.starts=[{name: random_opening, "
                                                  "moves: 4}]", "league.bots=[random]",
                                                  *overrides])


def test_episode_counts_follow_weights_in_whole_groups():
    cfg = load_config(CONFIGS / "mixed_games.yaml", ["rollout.episodes_per_step=64"])
    # weights 2:1:1 of 64 episodes, group size 16 -> 32, 16, 16
    assert episode_counts(cfg) == [32, 16, 16]


def test_rotation_puts_the_learner_in_every_seat_in_turn():
    draws = iter(range(100))
    choose = rotating("me", lambda: next(draws), 3)
    assert [choose(i) for i in range(4)] == [["me", 0, 1], [2, "me", 3], [4, 5, "me"],
                                             ["me", 6, 7]]
    assert [learner_seat(i, 3) for i in range(4)] == [0, 1, 2, 0]


def test_rollouts_mix_self_play_bots_and_the_pool(tmp_path):
    cfg = _cfg(["league.every=1", "envs.0.opponents=[self, random, random, pool]"])
    roll = build(cfg, tmp_path).rollout_fn
    eps = roll(1)  # step 1 adds the first snapshot to the pool
    assert len(eps) == 24
    kinds = [tuple(ep.info["players"]) for ep in eps]
    selfplay = [k for k in kinds if k == ("learner", "learner")]
    vs_random = [k for k in kinds if "random" in k]
    assert len(selfplay) == 8 and len(vs_random) >= 8
    assert (tmp_path / "pool" / "step-000001" / "tokenizer_config.json").exists()
    assert [c["step"] for c in roll.state_dict()["pool"]["checkpoints"]] == [1]
    # the learner's seat rotates against bots: both seats are played
    seats = {k.index("learner") for k in kinds if "random" in k}
    assert seats == {0, 1}
    groups = {ep.group for ep in eps}
    assert len(groups) == 6  # 24 episodes / group size 4, unique across opponent kinds


def test_a_steps_groups_of_one_env_play_in_one_arena_run(tmp_path, monkeypatch):
    """Self-play, bot and pool groups of one env spec share the arena's run, so each turn
    is one batched generate call for the learner (not one per opponent kind)."""
    cfg = _cfg(["league.every=1", "envs.0.opponents=[self, random, pool]"])
    roll = build(cfg, tmp_path).rollout_fn
    runs, calls = [], []
    play, generate = roll.arena.run_episodes, roll.learner.policy.generate
    monkeypatch.setattr(roll.arena, "run_episodes",
                        lambda *a, **kw: runs.append(1) or play(*a, **kw))
    monkeypatch.setattr(roll.learner.policy, "generate",
                        lambda prompts, *a, **kw: calls.append(len(prompts))
                        or generate(prompts, *a, **kw))
    roll(1)
    assert len(runs) == 1
    assert 1 <= len(calls) <= 9  # a game lasts at most 9 turns: one call a turn at most


def test_learner_seats_set_the_learners_seat_against_the_league(tmp_path):
    """learner_seats [0, 1, 1, 1] with opponents [self, random, random, pool] and groups of
    4: each of the 4 league groups puts the learner in seats 0, 1, 1, 1 (4 in seat 0, 12 in
    seat 1); the 8 self-play episodes still have it in both."""
    cfg = _cfg(["envs.0.learner_seats=[0, 1, 1, 1]", "league.every=1",
                "envs.0.opponents=[self, random, random, pool]"])
    eps = build(cfg, tmp_path).rollout_fn(1)
    kinds = [tuple(ep.info["players"]) for ep in eps]
    assert kinds.count(("learner", "learner")) == 8
    seats = [k.index("learner") for k in kinds if k != ("learner", "learner")]
    assert (seats.count(0), seats.count(1)) == (4, 12)


def test_the_pool_records_the_learners_score_from_its_league_games_only(tmp_path):
    """opponents [self, random, pool], groups of 4, 24 episodes: groups 0-1 self-play, 2-3
    the random bot as an opponent kind, 4-5 the pool (its random bot only: no snapshot
    yet). Only groups 4-5 count: the learner's score there (1 win, 1/2 draw, 0 loss from
    the game's returns), averaged, moves the prior 1/2 half way (score_rate 0.5)."""
    cfg = _cfg(["envs.0.opponents=[self, random, pool]", "league.every=0",
                "league.mode=pfsp"])
    roll = build(cfg, tmp_path).rollout_fn
    eps = roll(0)

    def score(ep):
        me = ep.info["players"].index("learner")
        mine, theirs = ep.info["env_returns"][me], ep.info["env_returns"][1 - me]
        return 1.0 if mine > theirs else 0.5 if mine == theirs else 0.0

    league = [score(ep) for ep in eps if ep.group in (4, 5)]
    assert len(league) == 8
    expected = 0.5 + 0.5 * (sum(league) / 8 - 0.5)
    assert roll.pool.scores == pytest.approx({"random": expected})
    assert roll.state_dict()["pool"]["scores"] == pytest.approx({"random": expected})
    # logged by the loop: the bot's score and, the pool holding only it, probability 1
    assert roll.league_metrics() == pytest.approx({"league/score/random": expected,
                                                   "league/prob/random": 1.0})


def test_rollouts_repeat_exactly_for_the_same_step(tmp_path):
    a = build(_cfg(), tmp_path / "a").rollout_fn
    b = build(_cfg(), tmp_path / "b").rollout_fn
    a(0)  # a different step in between must not change step 3's rollouts
    ea, eb = a(3), b(3)
    assert [[t.action_ids for t in e.turns] for e in ea] == \
        [[t.action_ids for t in e.turns] for e in eb]


def test_an_alias_plays_exactly_as_the_canonical_name(tmp_path):
    a = build(_cfg(), tmp_path / "a").rollout_fn
    b = build(_cfg(["envs.0.name=tic_tac_toe"]), tmp_path / "b").rollout_fn
    ea, eb = a(2), b(2)
    assert {e.env for e in eb} == {"tictactoe"}
    assert [[t.action_ids for t in e.turns] for e in ea] == \
        [[t.action_ids for t in e.turns] for e in eb]


def test_unknown_opponent_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"envs.0.opponents.1: unknown opponent 'bogus' "
                                          r"\(allowed: self, pool, .*random"):
        _cfg(["envs.0.opponents=[self,bogus]"])


def _snapshot_steps(run):
    return sorted(int(p.name.split("-")[1]) for p in (run / "pool").iterdir())


def _pool_cfg():
    return _cfg(["league.every=1", "league.max=2", "envs.0.opponents=[pool]",
                 "rollout.episodes_per_step=4"])


def test_pool_paths_are_relative_to_the_run_folder(tmp_path):
    """Snapshot paths are stored relative to the run folder (pool/step-N, not
    runs/rel/pool/step-N), so a moved run folder, or a relative run_dir resumed from
    another directory, still loads them."""
    roll = build(_pool_cfg(), tmp_path / "a").rollout_fn
    roll(0), roll(1), roll(2)
    paths = [c["path"] for c in roll.state_dict()["pool"]["checkpoints"]]
    assert paths == ["pool/step-000001", "pool/step-000002"]
    state = roll.state_dict()
    (tmp_path / "a").rename(tmp_path / "b")  # move the run folder
    moved = build(_pool_cfg(), tmp_path / "b").rollout_fn
    moved.load_state_dict(state)
    snapshot = moved.pool._player(moved.pool.checkpoints[0])  # loaded from the new place
    assert snapshot.name == "ckpt-1" and not snapshot.train
    assert len(moved(3)) == 4
    legacy = {**state["pool"], "checkpoints": [{"path": "runs/old/pool/step-000002",
                                                "step": 2, "name": "ckpt-2"}]}
    moved.load_state_dict({"pool": legacy})  # the older format: paths as given
    assert moved.state_dict()["pool"]["checkpoints"][0]["path"] == "pool/step-000002"


def test_pool_folder_keeps_the_sampled_snapshots_and_those_kept_checkpoints_need(tmp_path):
    """The pool folder holds only what the pool and the kept checkpoints need, not every
    snapshot taken. Each step first deletes the snapshots its pool no longer holds; a kept
    checkpoint at step c keeps the league.max snapshots before c (its pool), and nothing
    between two kept checkpoints' pools; killed writes go on the first step."""
    run = tmp_path / "run"
    roll = build(_pool_cfg(), run).rollout_fn
    (run / "pool" / "step-000009.tmp").mkdir(parents=True)  # a snapshot write that was killed
    for step in range(6):
        roll(step)
    # snapshots 1..5; at step 5's start the pool held [3, 4], so 1 and 2 went; 3 goes next
    assert _snapshot_steps(run) == [3, 4, 5]
    assert [c.step for c in roll.pool.checkpoints] == [4, 5]
    assert not (run / "pool" / "step-000009.tmp").exists()

    run2 = tmp_path / "run2"
    roll = build(_pool_cfg(), run2).rollout_fn
    (run2 / "checkpoints" / "step_000003").mkdir(parents=True)  # its pool holds 1 and 2
    for step in range(6):
        roll(step)
    assert _snapshot_steps(run2) == [1, 2, 3, 4, 5]
    shutil.rmtree(run2 / "checkpoints" / "step_000003")
    (run2 / "checkpoints" / "step_000005").mkdir()  # its pool holds 3 and 4
    roll(6)
    assert _snapshot_steps(run2) == [3, 4, 5, 6]

    run3 = tmp_path / "run3"  # a best checkpoint kept far behind the last one
    roll = build(_pool_cfg(), run3).rollout_fn
    for kept in (3, 8):
        (run3 / "checkpoints" / f"step_{kept:06d}").mkdir(parents=True)
    for step in range(10):
        roll(step)
    # at step 9's start: step 3's pool [1, 2], step 8's [6, 7], the live pool [7, 8]; then 9
    assert _snapshot_steps(run3) == [1, 2, 6, 7, 8, 9]


def test_each_pool_snapshot_is_loaded_once_while_the_pool_holds_it(tmp_path, monkeypatch):
    """By default every snapshot the pool holds stays loaded, so each is loaded once (with
    league.max=3, keeping only 2 loaded would cost a soak recipe about a quarter of its
    time in reloads); ``league.cache`` bounds that (each miss is a load)."""
    from sparring.rollout.snapshots import SnapshotStore

    original = SnapshotStore.load

    def steps_loaded(cache: int) -> list[str]:
        loads: list[str] = []
        monkeypatch.setattr(SnapshotStore, "load",
                            lambda self, path: loads.append(path) or original(self, path))
        roll = build(_cfg(["league.every=1", "league.max=3",
                           f"league.cache={cache}", "envs.0.opponents=[pool]"]),
                     tmp_path / f"c{cache}").rollout_fn
        for step in range(8):
            roll(step)
        return loads

    loads = steps_loaded(0)
    # snapshots 1..7 are taken, each held for 3 steps and drawn then; none loaded twice
    assert len(loads) == len(set(loads)) and len(loads) >= 6
    reloads = steps_loaded(1)  # one kept in memory: draws among 3 reload them
    assert set(reloads) == set(loads) and len(reloads) > len(loads)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x5A  # inside the tensor data: the file still parses
    path.write_bytes(bytes(data))


SNAPSHOT_DAMAGE = {
    "flipped bits": (lambda s: _flip_last_byte(s / "model.safetensors"),
                     "model.safetensors does not match its sha256"),
    "truncated weights": (lambda s: (s / "model.safetensors").write_bytes(b"\0" * 8),
                          "model.safetensors has 8 bytes, the manifest says"),
    "config.json deleted": (lambda s: (s / "config.json").unlink(), "config.json is missing"),
    "manifest deleted": (lambda s: (s / "manifest.json").unlink(),
                         "manifest.json is missing (snapshot.json says"),
    "manifest malformed": (lambda s: (s / "manifest.json").write_text('{"files": {"a": "x"}}'),
                           "manifest.json: not a valid manifest"),
}


@pytest.mark.parametrize("damage", list(SNAPSHOT_DAMAGE))
def test_a_pool_snapshot_is_checked_against_its_manifest_when_loaded(damage, tmp_path):
    """A snapshot holds a manifest of its files (and snapshot.json, which says so), checked
    when it is loaded: flipped bits or a truncated file raise `CheckpointError` naming the
    file and the problem, rather than playing on with different numbers."""
    import json

    from sparring.storage.folders import FORMAT, CheckpointError

    roll = build(_pool_cfg(), tmp_path).rollout_fn
    roll(0), roll(1)
    snap = tmp_path / "pool" / "step-000001"
    files = json.loads((snap / "manifest.json").read_text())["files"]
    assert sorted(files) == sorted(p.name for p in snap.iterdir() if p.name != "manifest.json")
    assert json.loads((snap / "snapshot.json").read_text()) == {"format": FORMAT, "step": 1}
    harm, why = SNAPSHOT_DAMAGE[damage]
    harm(snap)
    with pytest.raises(CheckpointError, match=f"{snap}/{re.escape(why)}"):
        roll.snapshots.load("pool/step-000001")


def test_a_snapshot_written_before_manifests_loads_with_a_warning(tmp_path, caplog):
    roll = build(_pool_cfg(), tmp_path).rollout_fn
    roll(0), roll(1)
    snap = tmp_path / "pool" / "step-000001"
    (snap / "manifest.json").unlink(), (snap / "snapshot.json").unlink()
    assert roll.snapshots.load("pool/step-000001").name == "step-000001"
    assert f"{snap} has no manifest.json (written by an older sparring)" in caplog.text


def test_the_leagues_exploration_follows_its_cosine_schedule(tmp_path):
    """epsilon(step) = 0.4 * (0.25 + 0.75 * (1 + cos(pi * step / 10)) / 2): 0.4 at step 0,
    0.4 * 0.625 = 0.25 at step 5, 0.4 * 0.25 = 0.1 at step 10; set on every policy's pool."""
    roll = build(_cfg(["exploration.league={rate: 0.4, schedule: cosine, final_ratio: 0.25}",
                       "train.steps=10"]),
                 tmp_path).rollout_fn
    for step, epsilon in [(0, 0.4), (5, 0.25), (10, 0.1)]:
        roll.collect(step, [])
        assert roll.pool.explore == pytest.approx(epsilon)


def test_the_learners_own_explore_follows_its_cosine_schedule(tmp_path):
    """exploration.learner: the same cosine as the pool's, on the training player; its
    explored turns are rows marked explored. Without recomputed old log-probs, or in the
    trajectory layout, the config is refused."""
    from sparring.config import ConfigError

    roll = build(_cfg(["exploration.learner.rate=0.4", "exploration.learner.schedule=cosine",
                       "exploration.learner.final_ratio=0.25", "train.steps=10",
                       "algorithm.recompute_old_logp=true"]), tmp_path).rollout_fn
    for step, epsilon in [(0, 0.4), (5, 0.25), (10, 0.1)]:
        eps = roll(step)
        assert roll.learner.explore == pytest.approx(epsilon)
    assert (roll.learner.explore_turns, roll.learner.explore_tactical) == (0, False)
    assert roll.pool.explore_turns == 0
    marked = [t for e in eps for t in e.turns if t.extras.get("explored") == 1.0]
    assert marked and all(t.action_ids and t.logprobs is None for t in marked)
    with pytest.raises(ConfigError, match="^exploration.learner.rate: 0.1 plays moves .*"
                                          "algorithm.recompute_old_logp=true"):
        _cfg(["exploration.learner.rate=0.1"])
    with pytest.raises(ConfigError, match="^exploration.learner.rate: .*rollout.layout=turn"):
        _cfg(["exploration.learner.rate=0.1", "algorithm.recompute_old_logp=true",
              "rollout.layout=trajectory"])


def test_a_lora_policys_pool_snapshot_plays_as_the_policy_did(tmp_path):
    """A LoRA run's snapshot holds the merged weights (base + adapter): the snapshot's
    logits are the policy's, not those of a base with re-initialised projections."""
    import torch

    cfg = _cfg(["league.every=1", "envs.0.opponents=[pool]", "rollout.episodes_per_step=4",
                "lora.enabled=true", "lora.target_modules=[q_proj, v_proj]"])
    from sparring.train.policies import trained_policies

    parts = build(cfg, tmp_path)
    trained_policies(cfg, parts.model)  # as the training loop does: adapters injected
    with torch.no_grad():  # an adapter away from its zero start, as after training
        for n, p in parts.policy.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    parts.rollout_fn(1)  # takes the snapshot of step 1
    snap = parts.rollout_fn.snapshots.load("pool/step-000001")
    ids = torch.tensor([[3, 6, 77, 76, 6, 5]])
    with torch.no_grad():
        want = parts.policy.model(input_ids=ids).logits
        got = snap.model(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_random_opening_starts_each_group_at_its_own_random_position(tmp_path):
    cfg = _cfg(["envs.0.starts.0.moves=4", "rollout.episodes_per_step=96",
                "envs.0.opponents=[self, random]"])
    parts = build(cfg, tmp_path)
    eps = parts.rollout_fn(0)
    starts: dict[int, set[str]] = {}
    for ep in eps:
        starts.setdefault(ep.group, set()).add(ep.turns[0].state_key)
    assert all(len(s) == 1 for s in starts.values())  # a group shares its opening
    boards = [next(iter(s)) for s in starts.values()]
    marks = [sum(c != "." for c in b) for b in boards]
    assert max(marks) <= 4 and len(set(marks)) >= 3  # 24 groups, 0..4 opening moves
    assert len({ep.turns[0].state_key for ep in eps}) > 1
    for ep in eps:  # the opening is nobody's turn: every recorded turn is a player's move
        assert sum(c != "." for c in ep.turns[-1].state_key) == \
            sum(c != "." for c in ep.turns[0].state_key) + len(ep.turns) - 1
    plain = build(_cfg(["rollout.episodes_per_step=96", "envs.0.starts=[]"]),
                  tmp_path / "plain").rollout_fn(0)
    assert {ep.turns[0].state_key for ep in plain} == {"." * 9}


def test_symmetric_views_show_each_seat_its_own_view(tmp_path):
    """With a symmetric_views start, a training turn's prompt is the board seen through the
    mover's view (its state key says which), a group shares its views, and the policy's
    first turns spread over the views; without the option the plain game is played."""
    from sparring.envs.games.tictactoe import VIEWS

    cfg = _cfg(["envs.0.starts=[{name: random_opening, moves: 4}, {name: symmetric_views}]",
                "envs.0.options.canonical=false",
                "rollout.episodes_per_step=96", "envs.0.opponents=[self, random]"])
    parts = build(cfg, tmp_path)
    eps = parts.rollout_fn(0)
    views: dict[int, set[str]] = {}
    for ep in eps:
        for t in ep.turns:
            board, view = t.state_key.split("|view")
            shown = "".join(board[i] for i in VIEWS[int(view)])
            assert t.prompt_text.endswith(f"{'XO'[t.agent]} {shown}<|end|><|assistant|>") \
                or not t.prompt_text  # a bot's turn has no prompt
        views.setdefault(ep.group, set()).add(ep.turns[0].state_key)
    assert all(len(v) == 1 for v in views.values())  # a group shares its views
    assert len({next(iter(v)) for v in views.values()}) > 3
    plain = build(_cfg(["rollout.episodes_per_step=96"]),
                  tmp_path / "plain").rollout_fn(0)
    assert all("|" not in t.state_key for ep in plain for t in ep.turns)

"""Opponent pool: sampling weights, pruning, caching, seat rotation, state round trip."""

import json

import pytest

from sparring.policy.sampling import SamplingParams
from sparring.rollout.opponents import OpponentPool
from sparring.rollout.players import BotPlayer, ModelPlayer


class FakePolicy:
    def __init__(self, path):
        self.path, self.tokenizer = path, None

    def generate(self, prompts, sampling=None, allowed=None):
        raise AssertionError("not called here")


def _pool(mode="recency", **kw):
    loads = []
    pool = OpponentPool(mode=mode, decay=0.5, seed=1,
                        loader=lambda p: loads.append(p) or FakePolicy(p), **kw)
    pool.add_bot(lambda env, seat: "1", name="ones")
    for step in (10, 20, 30):
        pool.add_checkpoint(f"/ck/{step}", step)
    return pool, loads


def test_probabilities_by_hand():
    pool, _ = _pool("recency")
    # bot 1, checkpoints oldest..newest 0.25, 0.5, 1 -> total 2.75
    assert pool.probabilities() == pytest.approx([1 / 2.75, 0.25 / 2.75, 0.5 / 2.75, 1 / 2.75])
    pool, _ = _pool("uniform")
    assert pool.probabilities() == pytest.approx([0.25] * 4)


def test_pfsp_weights_the_entries_by_the_learners_score_by_hand():
    pool, _ = _pool("pfsp", power=2.0, score_rate=0.5)
    # no games yet: every entry at the prior 1/2, so all alike
    assert pool.probabilities() == pytest.approx([0.25] * 4)
    # 'ones': scores 1, 1, 0, 1 -> mean 0.75, x = 0.5 + 0.5 * (0.75 - 0.5) = 0.625;
    # then one loss -> 0.625 + 0.5 * (0 - 0.625) = 0.3125
    pool.record({"ones": [1, 1, 0, 1], "ckpt-20": [1.0], "ckpt-30": []})
    assert pool.scores == pytest.approx({"ones": 0.625, "ckpt-20": 0.75})
    pool.record({"ones": [0]})
    assert pool.scores["ones"] == pytest.approx(0.3125)
    # weights (1 - x)^2: ones 0.6875^2, ckpt-10 (prior) 0.25, ckpt-20 0.0625, ckpt-30 0.25
    w = [0.6875 ** 2, 0.25, 0.0625, 0.25]
    assert pool.probabilities() == pytest.approx([x / sum(w) for x in w])
    # the learner beats every entry: all alike again
    pool.record({n: [1.0] for n in pool.names()})
    pool.score_rate = 1.0
    pool.record({n: [1.0] for n in pool.names()})
    assert pool.probabilities() == pytest.approx([0.25] * 4)


def test_pfsp_meets_a_beaten_bot_almost_never():
    pool, _ = _pool("pfsp", score_rate=1.0)
    pool.record({"ones": [1.0] * 99 + [0.5], "ckpt-10": [0.5], "ckpt-20": [0.5],
                 "ckpt-30": [0.5]})
    counts = sum(pool.sample().name == "ones" for _ in range(2000))
    # weight 0.005^2 against 3 * 0.25: p = 3.3e-5, so 2000 draws show it at most rarely
    assert counts <= 2


def test_a_dropped_checkpoint_leaves_the_scores():
    pool, _ = _pool("pfsp", max_checkpoints=3)
    pool.record({"ckpt-10": [1.0], "ones": [0.0]})
    pool.add_checkpoint("/ck/40", 40)
    assert set(pool.scores) == {"ones"}


def test_sample_frequencies_and_players():
    pool, loads = _pool("recency", cache_size=3)
    n = 4000
    counts = {}
    for _ in range(n):
        p = pool.sample()
        counts[p.name] = counts.get(p.name, 0) + 1
        if p.name != "ones":
            assert isinstance(p, ModelPlayer) and not p.train
            assert p.policy.path == f"/ck/{p.name.split('-')[1]}"
    ref = dict(zip(["ones", "ckpt-10", "ckpt-20", "ckpt-30"], [1 / 2.75, 0.25 / 2.75, 0.5 / 2.75, 1 / 2.75]))
    for k, q in ref.items():
        assert abs(counts[k] / n - q) < 4 * (q * (1 - q) / n) ** 0.5
    assert sorted(loads) == ["/ck/10", "/ck/20", "/ck/30"]  # each loaded once (cache of 3)


def test_cache_evicts_least_recent():
    pool, loads = _pool("uniform", cache_size=1)
    a = pool._player(pool.checkpoints[0])
    assert pool._player(pool.checkpoints[0]) is a
    pool._player(pool.checkpoints[1])
    pool._player(pool.checkpoints[0])
    assert loads == ["/ck/10", "/ck/20", "/ck/10"]


def test_max_checkpoints_prunes_oldest():
    pool, _ = _pool("uniform", max_checkpoints=2)
    assert [c.step for c in pool.checkpoints] == [20, 30]


def test_players_fn_rotates_learner_seat():
    pool, _ = _pool("uniform")
    learner = ModelPlayer(FakePolicy("me"), name="learner")
    choose = pool.players_fn(learner, 3)
    for i in range(6):
        seats = choose(i)
        assert len(seats) == 3 and seats[i % 3] is learner
        assert all(s is not learner for k, s in enumerate(seats) if k != i % 3)


def test_state_dict_round_trip_continues_the_same_samples():
    pool, _ = _pool("recency")
    pool.sample()
    state = json.loads(json.dumps(pool.state_dict()))
    ahead = [pool.sample().name for _ in range(20)]
    other = OpponentPool(loader=FakePolicy)
    other.add_bot(BotPlayer(lambda e, s: "1", name="ones"))
    other.load_state_dict(state)
    assert other.mode == "recency" and [c.step for c in other.checkpoints] == [10, 20, 30]
    assert [other.sample().name for _ in range(20)] == ahead
    pool.record({"ones": [0.0], "ckpt-10": [1.0]})
    other.load_state_dict(json.loads(json.dumps(pool.state_dict())))
    assert other.scores == pool.scores and other.probabilities() == pool.probabilities()
    with pytest.raises(ValueError, match="same bots"):
        OpponentPool().load_state_dict(state)


def test_errors_are_named():
    with pytest.raises(ValueError, match="opponents.mode"):
        OpponentPool(mode="elo")
    with pytest.raises(ValueError, match="empty"):
        OpponentPool().sample()
    with pytest.raises(ValueError, match="power"):
        OpponentPool(mode="pfsp", power=0)
    with pytest.raises(ValueError, match="score_rate"):
        OpponentPool(mode="pfsp", score_rate=1.5)
    pool, _ = _pool()
    with pytest.raises(ValueError, match="already"):
        pool.add_bot(lambda e, s: "2", name="ones")


def test_pool_snapshots_explore_with_the_pools_epsilon():
    pool, _ = _pool("uniform", explore=0.25)
    snapshot = pool._player(pool.checkpoints[0])
    assert isinstance(snapshot, ModelPlayer) and not snapshot.train and snapshot.explore == 0.25
    assert isinstance(pool.bots[0], BotPlayer)  # bots play as they are


def test_set_explore_reaches_loaded_and_later_snapshots():
    pool, _ = _pool("uniform", explore=0.5, explore_turns=2)
    loaded = pool._player(pool.checkpoints[0])
    assert (loaded.explore, loaded.explore_turns) == (0.5, 2)
    pool.set_explore(0.125)
    later = pool._player(pool.checkpoints[1])
    assert loaded.explore == later.explore == 0.125 and later.explore_turns == 2


def test_pool_snapshots_sample_with_the_pools_sampling():
    hot = SamplingParams(temperature=2.0, max_new_tokens=3)
    pool, _ = _pool("uniform", sampling=hot)
    assert pool._player(pool.checkpoints[0]).sampling is hot
    plain, _ = _pool("uniform")
    assert plain._player(plain.checkpoints[0]).sampling is None  # the arena's

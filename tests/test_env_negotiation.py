import re

import pytest

from sparring.envs import make

FIXED = {"counts": (1, 2, 3), "values": ((4, 0, 2), (0, 2, 2))}  # both worth 10


def test_deal_rewards_by_hand():
    env = make("negotiation", **FIXED)
    env.reset(0)
    assert env.current_seat() == 0
    assert "accept" not in env.legal_actions(0) and env.legal_actions(1) == []
    assert env.parse(0, "accept").status == "illegal"
    p = env.parse(0, "I keep the book and the balls: <answer>propose 1 0 3</answer>")
    assert p.action == "propose 1 0 3"
    assert env.step(p.action).rewards == [0.0, 0.0]
    assert env.observation(1).endswith("offer: you get 0 2 0")
    assert env.observation(0).endswith("you proposed: you get 1 0 3")
    res = env.step(env.parse(1, "fine, accept").action)
    # seat 0 keeps 1 book + 3 balls = 4 + 6 = 10; seat 1 gets 2 hats = 4
    assert res.done and res.rewards == [1.0, 0.4] and env.returns() == [1.0, 0.4]
    assert env.current_seat() is None


def test_counter_offer_and_raw_values():
    env = make("negotiation", normalize=False, **FIXED)
    env.reset(0)
    env.step("propose 1 0 0")
    env.step("propose 0 2 3")  # seat 1 keeps hats and balls: 4 + 6; seat 0 gets the book: 4
    assert env.observation(0).endswith("offer: you get 1 0 0")
    res = env.step("accept")
    assert res.rewards == [4.0, 10.0] and res.info["deal"]


def test_no_deal():
    env = make("negotiation", max_turns=3, **FIXED)
    env.reset(0)
    assert not env.step("propose 1 2 3").done
    assert not env.step("propose 1 2 3").done
    res = env.step("propose 0 0 0")
    assert res.done and res.rewards == [0.0, 0.0] and res.info["deal"] is False
    assert env.returns() == [0.0, 0.0]
    with pytest.raises(RuntimeError):
        env.step("accept")


def test_private_values_and_sampler():
    env = make("negotiation")
    for seed in range(200):
        env.reset(seed)
        obs = [env.observation(0), env.observation(1)]
        counts = [int(x) for x in re.search(r"items: (\d) book (\d) hat (\d) ball", obs[0]).groups()]
        vals = [[int(x) for x in re.search(r"your values: (\d+) (\d+) (\d+)", o).groups()]
                for o in obs]
        assert all(1 <= n <= 3 for n in counts)
        for v in vals:
            assert all(0 <= x <= 5 for x in v)
            assert sum(n * x for n, x in zip(counts, v)) == 10
        assert all(a or b for a, b in zip(*vals))  # every item is worth something to someone
        assert len(env.legal_actions(0)) == (counts[0] + 1) * (counts[1] + 1) * (counts[2] + 1)


def test_parse_and_options():
    env = make("negotiation", **FIXED)
    env.reset(0)
    assert env.parse(0, "propose   1  1  1").action == "propose 1 1 1"
    assert env.parse(0, "Propose 01 1 1").action == "propose 1 1 1"
    assert env.parse(0, "propose 2 0 0").status == "illegal"  # only one book
    assert env.parse(0, "propose 1 0 30").status == "illegal"
    assert env.parse(0, "propose 1 0 3000").status == "unparsable"
    assert env.parse(0, "propose 1 0").status == "unparsable"
    assert env.parse(0, "I won't accept; propose 1 1 1").action == "propose 1 1 1"
    assert env.parse(1, "propose 0 0 0").status == "illegal"  # not seat 1's turn
    assert env.parse(0, "").status == "unparsable"
    with pytest.raises(ValueError):
        env.step("accept")
    with pytest.raises(ValueError, match="max_turns"):
        make("negotiation", max_turns=1)
    with pytest.raises(ValueError, match="values"):
        make("negotiation", counts=(1, 1, 1), values=((5, 5, 0), (1, 1, 1)))
    with pytest.raises(ValueError, match="both"):
        make("negotiation", counts=(1, 1, 1))

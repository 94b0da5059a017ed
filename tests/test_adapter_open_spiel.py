"""The OpenSpiel adapter against our own games, determinism, chance, and the missing-extra error."""

import random
import re
import sys
from collections import Counter

import pytest

from sparring.envs import make

pytest.importorskip("pyspiel")


def test_tictactoe_through_adapter_matches_ours():
    ad, ours = make("openspiel", game="tic_tac_toe"), make("tictactoe")

    def cell(s):  # "x(1,2)" -> "6"
        r, c = map(int, re.findall(r"\d", s))
        return str(3 * r + c + 1)

    for g in range(200):
        rng = random.Random(g)
        ad.reset(g)
        ours.reset(g)
        while (seat := ours.current_seat()) is not None:
            assert ad.current_seat() == seat
            legal = ad.legal_actions(seat)
            assert [cell(a) for a in legal] == ours.legal_actions(seat)
            a = rng.choice(legal)
            r1, r2 = ad.step(a), ours.step(cell(a))
            assert r1.rewards == r2.rewards and r1.done == r2.done
        assert ad.current_seat() is None and ad.returns() == ours.returns()


def test_kuhn_chance_is_seeded_and_uniform():
    env = make("openspiel", game="kuhn_poker")
    first = []
    deals = Counter()
    for seed in range(600):
        env.reset(seed)
        deals[env.state_key()] += 1
        first.append(env.info_state(0))
    env.reset(7)
    again = env.info_state(0)
    assert again == first[7]
    assert len(deals) == 6 and min(deals.values()) > 60  # 6 deals, each about 100 times
    assert env.legal_actions(0) == ["Pass", "Bet"]
    assert env.parse(0, "I will <answer>Bet</answer>").action == "Bet"
    assert env.parse(1, "Bet").status == "unparsable"  # not seat 1's turn: nothing legal
    c = env.clone()
    c.step("Bet")
    assert env.current_seat() == 0 and c.current_seat() == 1
    with pytest.raises(ValueError, match="illegal action"):
        env.step("Raise")


def test_bad_game_and_missing_extra(monkeypatch):
    with pytest.raises(ValueError, match="cannot load game"):
        make("openspiel", game="no_such_game")
    monkeypatch.setitem(sys.modules, "pyspiel", None)
    with pytest.raises(ImportError, match="openspiel' extra"):
        make("openspiel", game="tic_tac_toe")

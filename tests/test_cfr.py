"""CFR / CFR+ convergence, the known Kuhn game value, and the CFR bot."""

import time

import pytest

from sparring.envs import make
from sparring.envs.bots import CFRBot, RandomBot
from sparring.envs.bots.cfr import solve
from sparring.eval import exploitability, game_tree


def test_kuhn_cfr_plus_converges_and_value():
    pol = solve("kuhn_poker", 300)
    assert exploitability("kuhn_poker", pol) < 0.01
    tree = game_tree("kuhn_poker")
    v0 = tree.values(tree.sigma_from(pol))[0][0]
    assert v0 == pytest.approx(-1 / 18, abs=2e-3)  # Kuhn's game value for the first player
    # Equilibrium facts (Kuhn 1950): seat 1 always calls with K, never calls with J.
    assert pol["K|b"]["bet"] > 0.99 and pol["J|b"]["bet"] < 0.01
    assert pol["K|pb"]["bet"] > 0.99 and pol["J|pb"]["bet"] < 0.01


def test_vanilla_cfr_and_three_players():
    assert exploitability("kuhn_poker", solve("kuhn_poker", 400, "cfr")) < 0.02
    assert exploitability("kuhn_poker", solve("kuhn_poker", 200, players=3), players=3) < 0.01
    with pytest.raises(ValueError, match="variant"):
        solve("kuhn_poker", 10, "dcfr")


def test_leduc_cfr_plus_fast():
    seen = []
    t0 = time.perf_counter()
    pol = solve("leduc", 60, callback=lambda t, s: seen.append(t))
    assert time.perf_counter() - t0 < 30
    assert seen == list(range(1, 61))
    assert exploitability("leduc", pol) < 0.1


def test_cfr_bot_beats_random_in_kuhn():
    env = make("kuhn_poker")
    bot, rnd = CFRBot(300, seed=1), RandomBot(2)
    total = 0.0
    n = 2000
    for g in range(n):
        env.reset(g)
        cfr_seat = g % 2
        while (s := env.current_seat()) is not None:
            env.step((bot if s == cfr_seat else rnd).act(env, s))
        total += env.returns()[cfr_seat]
    # The CFR strategy earns about +0.145 chips a hand against uniform random (stderr ~0.03 here).
    assert total / n > 0.05

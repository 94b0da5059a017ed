"""Every built-in game follows the Env protocol under random play, deterministically."""

import random

import pytest

from sparring.envs import Env, make

GAMES = [("tictactoe", {}), ("connect_four", {}), ("nim", {}), ("nim", {"misere": True}),
         ("kuhn_poker", {}), ("kuhn_poker", {"players": 3}), ("leduc", {})]


def trace(name, opts, seed):
    env = make(name, **opts)
    env.reset(seed)
    rng = random.Random(seed)
    out, total = [], [0.0] * env.num_seats
    while (seat := env.current_seat()) is not None:
        for s in range(env.num_seats):
            obs = env.observation(s)
            assert isinstance(obs, str) and 0 < len(obs) < 400
            assert (env.legal_actions(s) != []) == (s == seat)
        a = rng.choice(env.legal_actions(seat))
        assert env.parse(seat, f"<answer>{a}</answer>").action == a
        key = env.state_key()
        hash(key)
        res = env.step(a)
        assert len(res.rewards) == env.num_seats
        total = [t + r for t, r in zip(total, res.rewards)]
        out.append((key, a, env.observation(seat)))
    assert total == env.returns()
    assert sum(total) == 0.0  # all built-in competitive games are zero-sum
    assert all(isinstance(env.system_prompt(s), str) for s in range(env.num_seats))
    return out


@pytest.mark.parametrize("name,opts", GAMES)
def test_protocol_and_determinism(name, opts):
    assert isinstance(make(name, **opts), Env)
    for seed in range(30):
        assert trace(name, opts, seed) == trace(name, opts, seed)


@pytest.mark.parametrize("name,opts", [("kuhn_poker", {}), ("kuhn_poker", {"players": 3}), ("leduc", {})])
def test_private_cards_hidden(name, opts):
    from sparring.envs.games.kuhn_poker import RANKS as KR

    env = make(name, **opts)
    for seed in range(30):
        env.reset(seed)
        for s in range(env.num_seats):
            mine = env.info_state(s).split("|")[0]
            rank = (lambda c: KR[c]) if name == "kuhn_poker" else (lambda c: "JQK"[c // 2])
            assert mine == rank(env.cards[s])
            obs = env.observation(s)
            # the observation names only this seat's card (others' ranks may coincide in Leduc)
            assert f"Card: {mine}." in obs
            assert all(f"P{o}=" not in obs for o in range(env.num_seats))

import re

import pytest

from sparring.envs import make
from sparring.envs.games.signalling import COLOURS, SYMBOLS


def play(env, seed, sender, receiver):
    env.reset(seed)
    while env.current_seat() is not None:
        seat = env.current_seat()
        obs = env.observation(seat)
        res = env.step(sender(obs) if seat == 0 else receiver(obs))
    return env.returns(), res


def test_convention_always_wins():
    env = make("signalling", k=4, rounds=3)
    code = dict(zip(COLOURS[:4], SYMBOLS[:4]))
    decode = {s: c for c, s in code.items()}

    def sender(obs):
        return code[re.search(r"secret: (\w+)", obs).group(1)]

    def receiver(obs):
        return decode[re.search(r"symbol: (\w+)", obs).group(1)]

    for seed in range(50):
        returns, res = play(env, seed, sender, receiver)
        assert returns == [3.0, 3.0] and res.done and res.info["correct"]


def test_ignoring_the_symbol_is_chance():
    env = make("signalling", k=4)
    n = 4000
    total = sum(play(env, s, lambda o: SYMBOLS[0], lambda o: "blue")[0][0] for s in range(n))
    assert abs(total / n - 0.25) < 0.03  # 1/k; 4.4 standard deviations


def test_information_and_turns():
    env = make("signalling", k=3)
    for seed in range(20):
        env.reset(seed)
        secret = re.search(r"secret: (\w+)", env.observation(0)).group(1)
        assert secret in COLOURS[:3]
        assert secret not in env.observation(1)
        assert env.legal_actions(1) == [] and env.legal_actions(0) == list(SYMBOLS[:3])
        assert env.parse(0, "I send red").status == "illegal"  # a colour, not a symbol
        env.step(env.parse(0, "<answer>mog</answer>").action)
        assert "symbol: mog" in env.observation(1) and secret not in env.observation(1)
        assert env.parse(1, "zib").status == "illegal"
        guess = "red" if secret != "red" else "green"
        res = env.step(env.parse(1, f"I guess {guess}").action)
        assert res.done and res.rewards == [0.0, 0.0] and res.info["secret"] == secret
        assert env.observation(0).startswith(f"last: mog -> {guess} (wrong)")


def test_options():
    for opts in ({"k": 1}, {"k": 9}, {"rounds": 0}):
        with pytest.raises(ValueError, match=next(iter(opts))):
            make("signalling", **opts)
    env = make("signalling")
    with pytest.raises(ValueError):
        env.step("red")  # the sender must send a symbol

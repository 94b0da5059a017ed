"""Every parser of part B's environments classifies any text and never raises; whatever
it calls legal, step() accepts. Also: the same seed gives the same episode."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparring.envs import make
from sparring.envs.base import ParseResult

NAMES = ["negotiation", "signalling", "arithmetic", "countdown", "frozen_lake", "sokoban",
         "twenty_questions", "calculator"]

TEXTS = st.one_of(
    st.text(),
    st.binary(),
    st.text(alphabet="0123456789 +-*/()=:<>answercalcproseiupdwnlftgh?", max_size=200),
    st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=20), st.integers(100, 3000)),
    st.sampled_from(["<answer></answer>", "<answer>accept</answer>", "calc: 1/0",
                     "calc: 9**9**9", "answer: 1e999", "propose 9 9 9", "is it a dog?",
                     "\x00\x00", "\ud800", "up" * 5000, "<answer>" * 100]),
)


def advance(env, rng, k):
    """Up to k legal moves (free-text envs get a fixed well-formed answer)."""
    fixed = {"arithmetic": "1", "countdown": "1", "calculator": "calc: 1+1"}
    for _ in range(k):
        seat = env.current_seat()
        if seat is None:
            return
        legal = env.legal_actions(seat)
        if legal is None:
            p = env.parse(seat, fixed[env.name])
            if not p.ok:
                return
            env.step(p.action)
        else:
            env.step(rng.choice(legal))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS, seed=st.integers(0, 50), k=st.integers(0, 3))
def test_parse_never_raises(name, text, seed, k):
    env = make(name)
    env.reset(seed)
    advance(env, random.Random(seed), k)
    seat = env.current_seat()
    if seat is None:
        return
    for s in range(env.num_seats):
        p = env.parse(s, text)
        assert isinstance(p, ParseResult) and p.status in ("legal", "illegal", "unparsable")
        assert (p.action is not None) == p.ok
        if not p.ok:
            assert p.error
    p = env.parse(seat, text)
    if p.ok:
        legal = env.legal_actions(seat)
        assert legal is None or p.action in legal
        res = env.step(p.action)
        assert len(res.rewards) == env.num_seats


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_episode(name):
    def trace(seed):
        env = make(name)
        env.reset(seed)
        rng, out = random.Random(seed), []
        for _ in range(12):
            seat = env.current_seat()
            if seat is None:
                break
            out.append((seat, env.observation(seat), env.state_key()))
            advance(env, rng, 1)
        return out, env.returns()

    for seed in (0, 1, 17):
        assert trace(seed) == trace(seed)

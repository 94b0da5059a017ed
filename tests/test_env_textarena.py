import sys
from types import SimpleNamespace

import pytest

from sparring.envs import make
from sparring.envs.adapters.textarena import TextArenaEnv

PROMPT, MSG, ACTION = (SimpleNamespace(name=n) for n in ("PROMPT", "GAME_MESSAGE",
                                                          "PLAYER_ACTION"))


class FakeCountTo3:
    """TextArena's API on a toy game: players alternately say numbers; the one who says 3
    wins (+1, the other -1). Observations are handed out once, like TextArena's."""

    def __init__(self):
        self.state = SimpleNamespace(role_mapping={0: "Alice", 1: "Bob", -1: "GAME"})

    def reset(self, num_players, seed=None):
        self.n, self.seed, self.turn, self.player = num_players, seed, 0, 0
        self.pending = {p: [(-1, f"You are {'Alice' if p == 0 else 'Bob'}. Say 3 to win.",
                             PROMPT), (-1, f"seed {seed}", MSG)] for p in range(num_players)}

    def get_observation(self):
        out, self.pending[self.player] = self.pending[self.player], []
        return self.player, out

    def step(self, action):
        for p in range(self.n):
            self.pending[p].append((self.player, action, ACTION))
        self.turn += 1
        if action.strip() == "3":
            self.winner = self.player
            return True, {"reason": "said 3"}
        self.player = 1 - self.player
        return False, {}

    def close(self):
        return {p: 1 if p == self.winner else -1 for p in range(self.n)}, {"turns": self.turn}


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # import textarena -> ImportError
    with pytest.raises(ImportError, match=r"the 'textarena' extra: pip install 'sparring\[textarena\]'"):
        make("textarena", env_id="TicTacToe-v0")
    with pytest.raises(ValueError, match="env_id"):
        TextArenaEnv()
    with pytest.raises(ValueError, match="history"):
        TextArenaEnv(env=FakeCountTo3(), history="some")


def test_mapping_on_a_fake_env():
    env = TextArenaEnv(env=FakeCountTo3(), num_players=2)
    env.reset(7)
    assert env.current_seat() == 0 and env.legal_actions(0) is None
    assert env.system_prompt(0) == "You are Alice. Say 3 to win."
    assert env.observation(0) == "[GAME] seed 7"
    assert env.parse(0, "hmm <answer>1</answer>").action == "1"
    assert env.parse(1, "1").status == "illegal"
    assert env.parse(0, "   ").status == "unparsable"
    key0 = env.state_key()
    res = env.step("1")
    assert res.rewards == [0.0, 0.0] and not res.done and env.current_seat() == 1
    assert env.system_prompt(1) == "You are Bob. Say 3 to win."
    assert env.observation(1) == "[GAME] seed 7\n[Alice] 1"
    assert env.state_key() != key0
    env.step("2")
    assert env.observation(0) == "[GAME] seed 7\n[Alice] 1\n[Bob] 2"
    res = env.step("3")
    assert res.done and res.rewards == [1.0, -1.0] and res.info["reason"] == "said 3"
    assert res.info["game_info"] == {"turns": 3}
    assert env.returns() == [1.0, -1.0] and env.current_seat() is None
    with pytest.raises(RuntimeError):
        env.step("4")


def test_last_history_and_wrapped_strings():
    env = TextArenaEnv(env=FakeCountTo3(), history="last")
    env.reset(0)
    env.step("1")
    env.step("2")
    # only what came after Alice's last move (TextArena echoes her own move first)
    assert env.observation(0) == "[Alice] 1\n[Bob] 2"
    env.step("1")
    env.step("0")
    assert env.observation(0) == "[Alice] 1\n[Bob] 0"

    class Wrapped(FakeCountTo3):
        def get_observation(self):
            player, _ = super().get_observation()
            return player, f"full history for {player} at turn {self.turn}"

    env = TextArenaEnv(env=Wrapped(), history="last")
    env.reset(0)
    env.step("2")
    assert env.observation(1) == "full history for 1 at turn 1"
    assert env.system_prompt(1) == "Play the game. Reply with your move."


def test_real_textarena_if_installed():
    pytest.importorskip("textarena")
    env = make("textarena", env_id="TicTacToe-v0")
    env.reset(0)
    moves = iter(f"[{i}]" for i in (4, 0, 1, 2, 7, 3, 5, 6, 8))
    while env.current_seat() is not None:
        res = env.step(next(moves))
    assert sorted(res.rewards) in ([-1.0, 1.0], [0.0, 0.0])

"""Arena self-play on the real games with the tiny model (skipped until the games land)."""

import pytest

from sparring.data import collate
from sparring.envs.invalid import InvalidActionPolicy
from sparring.policy.hf import HFPolicy
from sparring.policy.sampling import SamplingParams
from sparring.policy.tiny import build_tiny_model
from sparring.rollout.arena import Arena
from sparring.rollout.prompts import PromptConfig

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


@pytest.fixture(scope="module")
def policy():
    model, tok = build_tiny_model({"seed": 5})
    return HFPolicy(model, tok, seed=0)


def _check_masks(eps):
    b = collate(eps)
    for i in range(b.n_rows):
        t = eps[int(b.episode[i])].agent_turns(int(b.agent[i]))[int(b.turn[i])]
        assert b.input_ids[i][b.action_mask[i]].tolist() == t.action_ids
        assert int(b.action_mask[i].sum()) == len(t.action_ids)


def test_tictactoe_self_play(policy):
    pytest.importorskip("sparring.envs.games.tictactoe")
    arena = Arena(SamplingParams(max_new_tokens=3), PromptConfig("state"), InvalidActionPolicy("constrained"))
    eps = arena.run_episodes("tictactoe", seeds=[0, 1], group_size=3, seat_players=policy)
    assert len(eps) == 6 and [e.group for e in eps] == [0, 0, 0, 1, 1, 1]
    for ep in eps:
        board = ["."] * 9
        winner = None
        for k, t in enumerate(ep.turns):  # replay by hand
            assert t.agent == k % 2 and winner is None
            cell = int(t.action_text) - 1
            assert board[cell] == "."
            board[cell] = "XO"[t.agent]
            if any(all(board[c] == "XO"[t.agent] for c in ln) for ln in LINES):
                winner = t.agent
        assert winner is not None or len(ep.turns) == 9
        exp = [0.0, 0.0] if winner is None else [1.0 if s == winner else -1.0 for s in range(2)]
        assert ep.returns == exp == ep.info["env_returns"]
        last = {t.agent: t for t in ep.turns}
        assert [last[s].reward for s in range(2)] == exp  # end rewards on each seat's last turn
    _check_masks(eps)


def test_kuhn_three_player_self_play(policy):
    pytest.importorskip("sparring.envs.games.kuhn_poker")
    arena = Arena(SamplingParams(max_new_tokens=6), PromptConfig("full"), InvalidActionPolicy("constrained"))
    eps = arena.run_episodes("kuhn_poker", {"players": 3}, seeds=[0, 1, 2], group_size=2, seat_players=policy)
    for ep in eps:
        assert ep.num_agents == 3 and "forfeit" not in ep.info
        assert sum(ep.returns) == pytest.approx(0.0) and ep.returns == ep.info["env_returns"]
        assert sum(t.reward for t in ep.turns) == pytest.approx(0.0)
        assert [t.agent for t in ep.turns][:3] == [0, 1, 2]
    _check_masks(eps)

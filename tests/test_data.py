import math

import pytest
import torch

from sparring.data import Episode, Turn, TurnBatch, collate, load_jsonl, save_jsonl
from tests.helpers import two_seat_episode


def test_jsonl_round_trip_is_lossless(tmp_path):
    ep = two_seat_episode()
    ep.turns[0].extras = {"p_before": 0.1 + 0.2}  # a float with a long repr
    ep.turns[1].entropies = [1.0 / 3.0]
    ep.info = {"winner": 0, "text": "héllo\n\"quoted\""}
    path = tmp_path / "eps.jsonl"
    save_jsonl(path, [ep, two_seat_episode(group=1)])
    back = load_jsonl(path)
    assert back[0] == ep
    assert back[0].turns[0].extras["p_before"] == 0.1 + 0.2
    assert len(back) == 2


def test_turn_rejects_mismatched_logprobs():
    with pytest.raises(ValueError, match="logprobs"):
        Turn(agent=0, prompt_ids=[1], action_ids=[2, 3], logprobs=[-1.0])


def test_turn_layout_rows_and_masks():
    b = collate([two_seat_episode()], layout="turn", pad_id=0)
    # rows ordered by agent, then the agent's turns: (a0,t0), (a0,t1), (a1,t0)
    assert b.agent.tolist() == [0, 0, 1]
    assert b.turn.tolist() == [0, 1, 0]
    assert b.step.tolist() == [0, 2, 1]
    assert b.traj.tolist() == [0, 0, 1]
    assert b.input_ids.shape == (3, 8)
    assert b.input_ids[1].tolist() == [1, 2, 5, 6, 9, 8, 8, 8]
    assert b.action_mask[1].tolist() == [False] * 5 + [True] * 3
    assert b.action_mask[2].tolist() == [False, True] + [False] * 6
    assert b.old_logp[1, 5:].tolist() == pytest.approx([-1.0, -2.0, -3.0])
    assert b.old_logp[~b.action_mask].abs().sum() == 0
    assert b.reward.tolist() == [0.0, 1.0, 0.5]
    assert b.returns.tolist() == [1.0, 1.0, -1.0]
    assert b.last.tolist() == [False, True, True]
    assert b.length.tolist() == [2, 3, 1]
    assert b.state_keys == ["s0", "s2", "s1"]


def test_trajectory_layout_concatenates_agent_turns_and_masks_observations():
    b = collate([two_seat_episode()], layout="trajectory")
    assert b.n_rows == 2
    # seat 0: prompt [1,2] action [5,6], new observation [9], action [8,8,8]
    assert b.input_ids[0].tolist() == [1, 2, 5, 6, 9, 8, 8, 8]
    assert b.action_mask[0].tolist() == [False, False, True, True, False, True, True, True]
    assert b.reward.tolist() == [1.0, 0.5]
    assert b.length.tolist() == [5, 1]


def test_trajectory_layout_refuses_rewritten_history():
    ep = two_seat_episode()
    ep.turns[2].prompt_ids = [4, 9]  # not an extension of [1, 2, 5, 6]
    with pytest.raises(ValueError, match="layout='turn'"):
        collate([ep], layout="trajectory")


def test_select_keeps_global_ids():
    b = collate([two_seat_episode(), two_seat_episode(group=1)], layout="turn")
    s = b.select([3, 5])
    assert s.episode.tolist() == [1, 1]
    assert s.traj.tolist() == [2, 3]


def test_from_scalars():
    b = TurnBatch.from_scalars([1.0, 0.0, 2.0], group=[0, 0, 1], lengths=[1, 3, 2])
    assert b.action_mask.tolist() == [[True, False, False], [True, True, True], [True, True, False]]
    assert b.n_traj == 3
    assert math.isclose(float(b.returns.sum()), 3.0)


def test_unknown_episode_field_is_named():
    d = Episode(env="x", seed=0, group=0, num_agents=1).to_dict()
    d["bogus"] = 1
    with pytest.raises(ValueError, match="bogus"):
        Episode.from_dict(d)


def test_extras_are_nan_where_missing():
    ep = two_seat_episode()
    ep.turns[0].extras = {"p": 0.5}
    b = collate([ep])
    assert b.extras["p"][0] == 0.5
    assert torch.isnan(b.extras["p"][1:]).all()


def test_bot_turns_without_tokens_make_no_rows():
    ep = two_seat_episode()
    ep.turns[1].action_ids, ep.turns[1].logprobs = [], None  # seat 1 is a bot
    b = collate([ep])
    assert b.agent.tolist() == [0, 0] and b.n_traj == 1

"""Loss replay (the ``loss_replay`` start of ``envs[].starts``): what a training start
records, replaying a position (cards included), which decisions of a lost game are kept,
the buffer's order and size, the config's errors, and a run whose groups start again from
its own losses, exactly on resume."""

from pathlib import Path

import pytest

from sparring.assembly.run import build
from sparring.config import ConfigError, load_config
from sparring.data import Episode
from sparring.envs import make
from sparring.envs.wrappers import RandomOpening
from sparring.rollout.loss_replay import LossReplay

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
        "intermediate_size: 64}"]


def _played(moves, seed=0, opening=0, players=("learner", "learner")):
    """A tic-tac-toe episode: ``moves`` (the first ``opening`` as a listed opening) played
    through a training start, with the info the arena records."""
    env = RandomOpening(make("tictactoe"), 0, [moves[:opening]] if opening else (), 1.0)
    env.reset(seed)
    for m in moves[opening:]:
        env.step(m)
    return Episode(env="tictactoe", seed=seed, group=0, num_agents=2,
                   info={"players": list(players), "env_returns": env.returns(),
                         "start": env.start_record()})


def test_a_training_start_records_every_move_its_seat_and_the_state_before_it():
    ep = _played(["5", "1", "9", "3"], seed=4, opening=1)
    start = ep.info["start"]
    assert start["seed"] == 4 and start["opening"] == 1 and start["source"] == "listed"
    assert start["moves"] == ["5", "1", "9", "3"]
    assert start["movers"] == [0, 1, 0, 1]
    assert start["keys"] == [".........", "....X....", "O...X....", "O...X...X"]


def test_a_replayed_start_is_the_recorded_position_cards_included():
    board = RandomOpening(make("tictactoe"), 4, replayed=[(7, ("5", "1"))], replayed_share=1.0)
    board.reset(123)
    assert board.state_key() == "O...X...." and board.current_seat() == 0
    assert board.start_record() == {"seed": 7, "moves": ["5", "1"], "movers": [0, 1],
                                    "keys": [".........", "....X...."], "opening": 2,
                                    "source": "replayed"}
    # Kuhn: the reset seed deals the cards, so the replay deals what the game had
    plain = make("kuhn_poker")
    plain.reset(11)
    plain.step("pass")
    cards = RandomOpening(make("kuhn_poker"), 0, replayed=[(11, ("pass",))], replayed_share=1.0)
    for seed in (0, 1, 2):
        cards.reset(seed)
        assert cards.env.info_state(1) == plain.info_state(1)
        assert cards.observation(1) == plain.observation(1)


def test_the_replayed_share_is_drawn_per_reset_seed():
    env = RandomOpening(make("tictactoe"), 0, replayed=[(0, ("5",))], replayed_share=0.3)
    sources = []
    for seed in range(1000):
        env.reset(seed)
        sources.append(env.start_record()["source"])
    # 1000 Bernoulli(0.3) draws: mean 300, sd 14.5; five sd either side
    assert 227 < sources.count("replayed") < 373
    env.reset(17)
    first = env.start_record()
    env.reset(17)
    assert env.start_record() == first
    never = RandomOpening(make("tictactoe"), 0, replayed=[(0, ("5",))], replayed_share=0.0)
    for seed in range(50):
        never.reset(seed)
        assert never.start_record()["source"] == "random"


def test_a_lost_game_keeps_the_losers_last_decisions():
    # X: 1, 2, 3 wins the top row; O played 4 (after 1) and 5 (after 1 4 2)
    won_by_x = _played(["1", "4", "2", "5", "3"], seed=9)
    replay = LossReplay(size=10, depth=2)
    assert replay.add(won_by_x, {"learner"}) == 2
    assert replay.starts() == ((9, ("1",)), (9, ("1", "4", "2")))
    assert list(replay.entries) == ["X........", "XX.O....."]
    one = LossReplay(size=10, depth=1)
    one.add(won_by_x, {"learner"})
    assert one.starts() == ((9, ("1", "4", "2")),)
    # the opening's moves are nobody's decisions: O's first move here is opening
    opened = _played(["1", "4", "2", "5", "3"], seed=9, opening=2)
    replay = LossReplay(size=10, depth=5)
    replay.add(opened, {"learner"})
    assert replay.starts() == ((9, ("1", "4", "2")),)


def test_draws_and_untrained_losers_add_nothing():
    draw = _played(["1", "5", "9", "2", "8", "7", "3", "6", "4"])
    assert draw.info["env_returns"] == [0.0, 0.0]
    replay = LossReplay(size=10, depth=2)
    assert replay.add(draw, {"learner"}) == 0
    lost_by_bot = _played(["1", "4", "2", "5", "3"], players=("learner", "random"))
    assert replay.add(lost_by_bot, {"learner"}) == 0
    won_by_o = _played(["1", "5", "2", "3", "4", "7"], players=("learner", "random"))
    assert won_by_o.info["env_returns"] == [-1.0, 1.0]
    assert replay.add(won_by_o, {"learner"}) == 2
    assert replay.starts() == ((0, ("1", "5")), (0, ("1", "5", "2", "3")))
    assert len(replay) == 2 and replay.add(Episode(env="x", seed=0, group=0, num_agents=2), {"learner"}) == 0


def test_the_buffer_keeps_the_latest_distinct_positions():
    a = _played(["1", "4", "2", "5", "3"], seed=1)
    b = _played(["1", "5", "2", "3", "4", "7"], seed=2)
    replay = LossReplay(size=3, depth=2)
    replay.add(a, {"learner"})  # keys X........, XX.O.....
    replay.add(b, {"learner"})  # X's decisions: X...O...., XXO.O....
    assert list(replay.entries) == ["XX.O.....", "X...O....", "XXO.O...."]
    replay.add(a, {"learner"})  # both of a's again, now the latest
    assert list(replay.entries) == ["XXO.O....", "X........", "XX.O....."]
    copy = LossReplay(size=3, depth=2)
    copy.load_state_dict(replay.state_dict())
    assert copy.entries == replay.entries
    with pytest.raises(ValueError, match="size=0"):
        LossReplay(size=0, depth=1)


def test_bad_loss_replay_settings_are_config_errors_naming_the_key():
    with pytest.raises(ConfigError, match=r"^envs\.0\.starts\.1: start 'loss_replay' option "
                                          r"'share': 1\.5 is out of range \(must be <= 1\)$"):
        load_config(CONFIGS / "default.yaml", [*TINY, "envs.0.starts.1.share=1.5"])
    with pytest.raises(ConfigError, match=r"^envs\.0\.starts\.1: .*'size': 0 is out of range"):
        load_config(CONFIGS / "default.yaml", [*TINY, "envs.0.starts.1.size=0"])
    with pytest.raises(ConfigError, match=r"^envs\.0\.starts\.1: .*no option 'sise' "
                                          r"\(did you mean 'size'\?\)"):
        load_config(CONFIGS / "default.yaml", [*TINY, "envs.0.starts.1.sise=4"])
    with pytest.raises(ConfigError,
                       match=r"^envs\.0\.starts\.0: loss_replay: arithmetic has one seat"):
        load_config(CONFIGS / "arithmetic_grpo.yaml",
                    [*TINY, "envs.0.starts=[{name: loss_replay}]"])


def _cfg(extra=()):
    return load_config(CONFIGS / "default.yaml",
                       [*TINY, "envs.0.starts.1.share=1.0", "envs.0.opponents=[self]",
                        "rollout.episodes_per_step=64", *extra])


def test_groups_start_again_from_the_runs_own_losses_and_resume_exactly(tmp_path):
    """Share 1: step 0 (empty buffer) starts as the random openings say; every group of
    step 1 starts from a position of step 0's lost games. A fresh rollout function given
    the state repeats step 2 exactly."""
    parts = build(_cfg(), tmp_path / "run")
    rollouts = parts.rollout_fn
    first = rollouts(0)
    assert {ep.info["start"]["source"] for ep in first} == {"random"}
    kept = LossReplay(256, 2)
    for ep in first:
        kept.add(ep, {"learner"})
    assert rollouts.replays[0].starts() == kept.starts() and len(kept) > 0
    second = rollouts(1)
    starts = set(kept.starts())
    for ep in second:
        s = ep.info["start"]
        assert s["source"] == "replayed"
        assert (s["seed"], tuple(s["moves"][:s["opening"]])) in starts
    metrics = rollouts.league_metrics()
    assert metrics["loss_replay/tictactoe/share"] == 1.0
    assert metrics["loss_replay/tictactoe/positions"] == len(rollouts.replays[0])
    state = rollouts.state_dict()
    again = build(_cfg(), tmp_path / "again").rollout_fn
    again.load_state_dict(state)
    assert again.replays[0].entries == rollouts.replays[0].entries
    a, b = rollouts(2), again(2)
    assert [[t.action_text for t in e.turns] for e in a] == \
        [[t.action_text for t in e.turns] for e in b]
    assert [e.info["start"] for e in a] == [e.info["start"] for e in b]

"""Listed openings (the ``openings`` start of ``envs[].starts``): the file format, the
config's errors, a run whose training groups start from them, and the shipped tic-tac-toe
tactic list against bench/must_block.py's independent enumeration."""

from pathlib import Path

import pytest

from sparring.assembly.run import build
from sparring.config import ConfigError, load_config
from sparring.envs.openings import openings_path, parse_openings, read_openings
from tests.helpers import load_bench

CONFIGS = Path(__file__).parents[1] / "configs"
TACTICS = "configs/openings/tictactoe_canonical_tactics.txt"
TINY = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
        "intermediate_size: 64}"]


def test_the_file_format_drops_comments_and_blank_lines():
    text = "# header\n5 1  # a comment\n\n  1 2 3\n#only a comment\n"
    assert parse_openings(text) == (("5", "1"), ("1", "2", "3"))
    with pytest.raises(ValueError, match="lists no opening"):
        parse_openings("# nothing\n\n")


def test_a_relative_path_is_found_in_the_checkout_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert openings_path(TACTICS) == (CONFIGS / "openings" /
                                      "tictactoe_canonical_tactics.txt").resolve()
    (tmp_path / "mine.txt").write_text("5\n")
    assert read_openings("mine.txt") == (("5",),)
    with pytest.raises(FileNotFoundError, match="no openings file 'nope.txt'"):
        openings_path("nope.txt")


def _cfg(tmp_path, text, extra=()):
    path = tmp_path / "openings.txt"
    path.write_text(text)
    return load_config(CONFIGS / "default.yaml",
                       [*TINY, f"envs.0.starts=[{{name: random_opening, moves: 4}}, "
                        f"{{name: openings, file: '{path}'}}]", "envs.0.options={}", *extra])


def test_bad_openings_are_config_errors_naming_the_key(tmp_path):
    with pytest.raises(ConfigError,
                       match=r"^envs\.0\.starts\.1: openings: opening 2: move 2 \('5'\) is not "
                       r"legal after '5' \(legal: 1 2 3 4 6 7 8 9\)$"):
        _cfg(tmp_path, "1\n5 5\n")
    with pytest.raises(ConfigError, match=r"^envs\.0\.starts\.1: openings: .*lists no opening"):
        _cfg(tmp_path, "# none\n")
    with pytest.raises(ConfigError, match=r"^envs\.0\.starts\.0: openings: no openings file"):
        load_config(CONFIGS / "default.yaml",
                    [*TINY, "envs.0.starts=[{name: openings, file: missing.txt}]"])
    with pytest.raises(ConfigError, match=r"^envs\.0\.starts\.1: .*'share': 2 is out of range"):
        _cfg(tmp_path, "5\n", ["envs.0.starts.1.share=2"])
    with pytest.raises(ConfigError, match=r"^envs\.0\.starts\.0: .*option 'file' is required"):
        load_config(CONFIGS / "default.yaml", [*TINY, "envs.0.starts=[{name: openings}]"])


def test_an_error_quotes_nothing_from_a_file_that_is_no_openings_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, "root:x:0:0:secret:/root:/bin/bash\nsecond line\n")
    assert str(e.value) == ("envs.0.starts.1: openings: opening 1: move 1 (no move of the "
                            "game) is not legal at the start (legal: 1 2 3 4 5 6 7 8 9)")
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, "5 1\n5 hunter2\n")
    assert str(e.value) == ("envs.0.starts.1: openings: opening 2: move 2 (no move of the "
                            "game) is not legal after '5' (legal: 1 2 3 4 6 7 8 9)")
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, "1 5 2 6 3\n")
    assert str(e.value) == ("envs.0.starts.1: openings: opening 1: move 5 ('3') after "
                            "'1 5 2 6' ends the game; an opening must leave a move to play")


def test_training_groups_start_from_the_listed_openings(tmp_path):
    """Every group of a step starts after one of the listed openings (share 1), a group
    sharing its start; the opening's moves are nobody's turns."""
    cfg = _cfg(tmp_path, "5 1\n1 2 3\n", ["envs.0.starts.0.moves=0",
                                           "rollout.episodes_per_step=48",
                                           "envs.0.opponents=[self, random]"])
    parts = build(cfg, tmp_path / "run")
    eps = parts.rollout_fn(0)
    starts = {}
    for ep in eps:
        starts.setdefault(ep.group, set()).add(ep.turns[0].state_key)
    assert all(len(s) == 1 for s in starts.values())
    assert {next(iter(s)) for s in starts.values()} == {"O...X....", "XOX......"}
    for ep in eps:
        assert sum(c != "." for c in ep.turns[-1].state_key) == \
            sum(c != "." for c in ep.turns[0].state_key) + len(ep.turns) - 1


def test_the_shipped_tactic_list_is_every_tactic_position_in_the_canonical_view():
    """Each listed opening reaches a position where the mover has a win in one or must
    block the only threat, and together they are bench/must_block.py's tactic positions
    (found by its own walk over raw boards), each once as the canonical view shows it."""
    from sparring.envs import make
    from sparring.envs.games.tictactoe import TicTacToe
    from sparring.envs.views import CanonicalViews
    from sparring.envs.wrappers import play_opening

    must_block = load_bench("must_block")
    expected = {}
    for board, seat, kind, _ in must_block.tactic_positions():
        game = TicTacToe()
        game.board, game.turn = list(board), seat
        expected.setdefault(CanonicalViews(game).observation(seat), kind)
    listed = read_openings(TACTICS)
    env = make("tictactoe", canonical=True)
    got = {}
    for moves in listed:
        env.reset(0)
        play_opening(env, moves)
        seat = env.current_seat()
        obs = env.observation(seat)
        assert obs not in got  # each position once
        got[obs] = must_block.tactic_at(list(env.env.board), seat)[0]
    assert got == expected
    assert sum(k == "win" for k in got.values()) == 321 and len(got) == 454

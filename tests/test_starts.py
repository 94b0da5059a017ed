"""Start components (``envs[].starts``, `sparring.envs.starts`): each option checked against
the registry with a one-line error naming its key, the game each builds, and the help
that lists them."""

from pathlib import Path

import pytest

from sparring.config import ConfigError, commented_yaml, load_config
from sparring.envs import make
from sparring.envs.starts import STARTS, check_starts, parse_starts, start_env
from sparring.envs.views import SymmetricViews
from sparring.envs.wrappers import RandomOpening

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = ["model.options.hidden_size=32", "model.options.num_layers=1",
        "model.options.intermediate_size=64", "model.options.num_heads=2",
        "model.options.num_kv_heads=2"]


@pytest.mark.parametrize("starts, message", [
    ("[{name: random_opening, moves: 1.5}]",
     r"envs\.0\.starts\.0: start 'random_opening' option 'moves' takes a int, got 1\.5"),
    ("[{name: random_opening, move: 2}]",
     r"envs\.0\.starts\.0: start 'random_opening' has no option 'move' \(did you mean "
     r"'moves'\?\); allowed: moves"),
    ("[{name: loss_replay, share: 0}]",
     r"envs\.0\.starts\.0: start 'loss_replay' option 'share': 0 is out of range "
     r"\(must be > 0\)"),
    ("[{name: symmetric_views, enabled: true}]",
     r"envs\.0\.starts\.0: start 'symmetric_views' has no option 'enabled'; allowed: \(none\)"),
    ("[{moves: 2}]", r"envs\.0\.starts\.0: expected \{name: \.\.\., option: value, \.\.\.\}"),
    ("[{name: random_opening}, {name: loss_replay, depth: 0}]",
     r"envs\.0\.starts\.1: start 'loss_replay' option 'depth': 0 is out of range"),
])
def test_a_bad_start_is_a_one_line_config_error_naming_its_key(starts, message):
    with pytest.raises(ConfigError, match=rf"^{message}") as e:
        load_config(CONFIGS / "default.yaml", [*TINY, f"envs.0.starts={starts}"])
    assert "\n" not in str(e.value)


def test_random_opening_on_a_game_without_clone_names_the_entry():
    with pytest.raises(ConfigError, match=r"^envs\.0\.starts\.0: random_opening: "
                                          r"RandomOpening: arithmetic has no clone\(\)"):
        load_config(CONFIGS / "arithmetic_grpo.yaml",
                    [*TINY, "envs.0.starts=[{name: random_opening, moves: 2}]"])


def test_the_components_build_the_wrappers_the_old_keys_built():
    """random_opening + loss_replay + symmetric_views is RandomOpening over SymmetricViews
    with the same arguments: the same draws from each reset seed."""
    replayed = ((3, ("9",)), (4, ("1",)))
    parts = parse_starts([{"name": "loss_replay", "share": 0.5},
                          {"name": "random_opening", "moves": 3},
                          {"name": "symmetric_views"}])
    env = start_env(make("tictactoe"), parts, replayed)
    assert isinstance(env, RandomOpening) and isinstance(env.env, SymmetricViews)
    same = RandomOpening(SymmetricViews(make("tictactoe")), 3, (), 1.0, replayed, 0.5)
    for seed in range(40):
        env.reset(seed)
        same.reset(seed)
        assert env.start_record() == same.start_record()
        assert env.env.views == same.env.views
    plain = start_env(make("tictactoe"), parse_starts([{"name": "random_opening",
                                                         "moves": 0}]))
    assert not isinstance(plain, RandomOpening | SymmetricViews)  # no moves: the plain game


def test_each_start_is_given_once():
    with pytest.raises(ValueError, match="1: 'random_opening' is given twice"):
        parse_starts([{"name": "random_opening"}, {"name": "random_opening", "moves": 2}])


def test_views_are_checked_first_and_the_others_on_the_viewed_game():
    parts = parse_starts([{"name": "random_opening", "moves": 2},
                          {"name": "symmetric_views"}])
    check_starts(parts, make("tictactoe"), {})
    with pytest.raises(ValueError, match="^1: symmetric_views: the game's option canonical"):
        check_starts(parts, make("tictactoe", canonical=True), {"canonical": True})


def test_the_reference_lists_every_start_with_its_options():
    text = commented_yaml()
    for entry in STARTS:
        assert f"#     #   {entry.name}: " in text
    assert "#     #     moves (default 4): " in text

"""Game names: OpenSpiel's names are aliases of ours (``leduc_poker`` = ``leduc``,
``tic_tac_toe`` = ``tictactoe``) everywhere a game is named; exploitability is a
capability an environment declares, not a list of names."""

import itertools
from pathlib import Path

import pytest

from sparring.cli import main
from sparring.config import ConfigError, load_config
from sparring.envs import ENVS, env_entry, has_game_tree, make
from sparring.envs.games.leduc import Leduc
from sparring.eval import exploitability, uniform_policy
from sparring.registry import Entry, Registry, UnknownNameError

CONFIGS = Path(__file__).parents[1] / "configs"
TINY = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
        "intermediate_size: 64}"]


def test_registry_resolves_aliases_to_the_canonical_entry():
    reg = Registry("thing")
    entry = reg.add(Entry("alpha", fn=lambda: 1, aliases=("a", "first")))
    assert reg.get("a") is reg.get("first") is reg.get("alpha") is entry
    assert reg.canonical("first") == "alpha" and reg["a"]() == 1
    assert "a" in reg and reg.names() == ["alpha"] and len(reg) == 1
    for clash in (Entry("a", fn=print), Entry("beta", fn=print, aliases=("alpha",))):
        with pytest.raises(ValueError, match="already registered"):
            reg.add(clash)
    with pytest.raises(UnknownNameError, match=r"unknown thing 'b'; known: alpha \(aliases: "
                                               r"a = alpha, first = alpha\)"):
        reg.get("b")


def test_openspiel_names_make_our_games():
    assert isinstance(make("leduc_poker"), Leduc)
    assert make("tic_tac_toe").name == "tictactoe"
    assert make("leduc_poker", compact=True).compact
    assert env_entry("leduc_poker") is ENVS.get("leduc")
    assert env_entry("kuhn_poker").name == "kuhn_poker"  # OpenSpiel's name is ours too
    assert ENVS.get("leduc").aliases == ("leduc_poker",)


def test_exploitability_through_an_alias_equals_the_canonical_one():
    assert exploitability("leduc_poker", uniform_policy) == exploitability("leduc", uniform_policy)


def test_game_tree_is_declared_by_the_environment():
    assert has_game_tree("kuhn_poker") and has_game_tree("leduc") and has_game_tree("leduc_poker")
    assert not has_game_tree("tictactoe") and not has_game_tree("arithmetic")
    with pytest.raises(ValueError, match="'tictactoe' declares no game tree"):
        exploitability("tic_tac_toe", uniform_policy)
    assert make("kuhn_poker", players=3).tree_options() == {"players": 3}


def test_cfr_bot_plays_the_game_tree_the_env_declares():
    from sparring.envs.bots import CFRBot

    env = make("kuhn_poker", players=3)
    env.reset(1)
    assert CFRBot(iterations=20).act(env, env.current_seat()) in env.legal_actions(0)


def test_list_shows_aliases(capsys):
    assert main(["list", "envs", "bots"]) == 0
    out = capsys.readouterr().out
    assert "aliases" in out and "leduc_poker" in out and "tic_tac_toe" in out
    assert "minimax" in out and "cfr" in out


def test_config_with_an_alias_validates_trains_and_evaluates(tmp_path, capsys):
    from sparring.assembly.run import build
    from sparring.assembly.trained import load_policy
    from sparring.terminal_game import play_in_terminal
    from sparring.train.loop import train

    with pytest.raises(ConfigError, match="envs.0.name: unknown environment 'tic_tac_tooe'"):
        load_config(CONFIGS / "default.yaml", ["envs.0.name=tic_tac_tooe"])
    cfg = load_config(CONFIGS / "default.yaml", [
        *TINY, "envs.0.name=tic_tac_toe", "envs.0.group_size=2", "rollout.episodes_per_step=4",
        "train.steps=1", "eval.games=2", "eval.at_start=false", "checkpoint.every=0",
        "logging.progress=false"])
    parts = build(cfg, tmp_path)
    run = train(cfg, parts.model, parts.rollout_fn, parts.eval_fn, parts.stateful,
                run_dir=tmp_path / "run", pad_id=parts.pad_id)
    assert "eval/tictactoe/random/win" in (run / "metrics.jsonl").read_text()

    assert main(["eval", str(run), "--env", "tic_tac_toe", "--vs", "random", "--games", "2"]) == 0
    assert "tictactoe" in capsys.readouterr().out
    assert main(["eval", str(run), "--env", "bogus_game", "--games", "2"]) == 2
    assert "unknown environment 'bogus_game'" in capsys.readouterr().err

    policy, run_cfg, _ = load_policy(run)
    moves = itertools.cycle("123456789")  # tries every cell in turn until one is legal
    returns = play_in_terminal(policy, run_cfg, "tic_tac_toe", ask=lambda _: next(moves), say=lambda _: None)
    assert len(returns) == 2

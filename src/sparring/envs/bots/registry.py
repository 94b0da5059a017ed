"""The bot registry: a bot's name -> a factory ``fn(seed) -> Bot``.

Configs (``envs[].opponents``, ``league.bots``, ``eval.opponents``) and
``sparring eval --vs`` name bots; `make_bot` builds one, `sparring list bots` lists them.
``needs``: what the bot asks of the game (`NEEDS`): ``clone`` (it searches copies of the
state), ``perfect_information`` (those copies hold nothing its seat may not see: no hidden
deal), ``game_tree`` (the env exposes its exact tree, see `sparring.envs.base.TreeGame`).
`bot_refusal` says why a bot cannot play a game honestly; `check_opponents` with a game
is the one check of configs, the league and ``sparring eval --vs``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import Any

from sparring.envs.bots.cfr import CFRBot
from sparring.envs.bots.mcts import MCTSBot
from sparring.envs.bots.minimax import MinimaxBot
from sparring.envs.bots.simple import Bot, RandomBot
from sparring.envs.bots.tactical import TacticalBot
from sparring.registry import Registry

BOTS = Registry("bot")


@BOTS.register("random", family="baseline", source="uniform over the legal actions")
def random_bot(seed: int) -> Bot:
    """Uniformly random legal moves."""
    return RandomBot(seed=seed)


@BOTS.register("tactical", family="baseline", needs=("clone", "perfect_information"),
               source="uniform over the moves a two-ply lookahead keeps")
def tactical_bot(seed: int) -> Bot:
    """Random, but takes a win in one and blocks the opponent's win in one."""
    return TacticalBot(seed=seed)


@BOTS.register("minimax", family="search", needs=("clone", "perfect_information"),
               source="exact minimax, two-seat zero-sum perfect-information games")
def minimax_bot(seed: int) -> Bot:
    """Optimal play by exact minimax (tic-tac-toe, Nim), random among optimal moves."""
    return MinimaxBot(seed=seed)


@BOTS.register("mcts", family="search", needs=("clone", "perfect_information"),
               source="UCT with random rollouts (Kocsis & Szepesvari, 2006)")
def mcts_bot(seed: int) -> Bot:
    """UCT Monte-Carlo tree search, 100 simulations per move."""
    return MCTSBot(simulations=100, seed=seed)


@BOTS.register("cfr", family="equilibrium", needs=("game_tree",),
               source="CFR+ average strategy (Tammelin, 2014)")
def cfr_bot(seed: int) -> Bot:
    """Samples the CFR+ average strategy (an approximate Nash equilibrium)."""
    return CFRBot(seed=seed)


def make_bot(name: str, seed: int) -> Bot:
    """The bot registered as ``name``, seeded with ``seed``."""
    return BOTS.get(name).fn(seed)


def _has_clone(env: Any) -> bool:
    return callable(getattr(env, "clone", None))


def _perfect_information(env: Any) -> bool:
    declared = getattr(env, "perfect_information", None)
    if declared is not None:
        return bool(declared)
    return not callable(getattr(env, "deal_outcomes", None))


def _has_game_tree(env: Any) -> bool:
    return all(callable(getattr(env, m, None))
               for m in ("deal_outcomes", "reset_deal", "info_state", "tree_options"))


# need -> (does the game meet it, why the bot is refused when it does not)
NEEDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "clone": (_has_clone, "it searches copies of the state, and the game has no clone()"),
    "perfect_information": (
        _perfect_information, "it searches copies of the full state, which hold what its "
        "seat may not see (the game has hidden information, e.g. the other player's card)"),
    "game_tree": (_has_game_tree, "it solves the game's exact tree, and the game exposes "
                  "none (only games registered with game_tree=True, e.g. Kuhn and Leduc)"),
}


def bot_refusal(name: str, env: Any) -> str | None:
    """Why bot ``name`` cannot play ``env`` honestly (its first unmet need), or None."""
    for need in BOTS.get(name).needs:
        met, why = NEEDS[need]
        if not met(env):
            return why
    return None


def check_opponents(key: str, names: Sequence[str], special: Sequence[str] = (),
                    game: Any = None) -> None:
    """ValueError "KEY.J: unknown opponent 'x'; did you mean 'y'? (allowed: ...)" for the
    first of ``names`` that is neither a bot nor one of ``special`` (``self``, ``pool``
    where those are allowed); with ``game`` (an env), "KEY.J: bot 'x' cannot play GAME: WHY"
    for the first bot that cannot play it honestly (`bot_refusal`). The one check of a
    config's, a league's and ``--vs``'s names."""
    for j, name in enumerate(names):
        if name not in special and name not in BOTS:
            known = [*special, *BOTS.names()]
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{key}.{j}: unknown opponent {name!r}{hint} (allowed: "
                             f"{', '.join(known)})")
    if game is None:
        return
    for j, name in enumerate(names):
        why = None if name in special else bot_refusal(name, game)
        if why:
            raise ValueError(f"{key}.{j}: bot {name!r} cannot play {game.name}: {why}")

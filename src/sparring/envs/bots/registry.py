"""The bot registry: a bot's name -> a factory ``fn(seed) -> Bot``.

Configs (``envs[].opponents``, ``league.bots``, ``eval.opponents``) and
``sparring eval --vs`` name bots; `make_bot` builds one, `sparring list bots` lists them.
``needs``: what the bot asks of the game (``clone``: search from copies of the state;
``game_tree``: the env declares its exact tree, see `sparring.envs.base.TreeGame`).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

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


@BOTS.register("tactical", family="baseline", needs=("clone",),
               source="uniform over the moves a two-ply lookahead keeps")
def tactical_bot(seed: int) -> Bot:
    """Random, but takes a win in one and blocks the opponent's win in one."""
    return TacticalBot(seed=seed)


@BOTS.register("minimax", family="search", needs=("clone",),
               source="exact minimax, two-seat zero-sum perfect-information games")
def minimax_bot(seed: int) -> Bot:
    """Optimal play by exact minimax (tic-tac-toe, Nim), random among optimal moves."""
    return MinimaxBot(seed=seed)


@BOTS.register("mcts", family="search", needs=("clone",),
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


def check_opponents(key: str, names: Sequence[str], special: Sequence[str] = ()) -> None:
    """ValueError "KEY.J: unknown opponent 'x'; did you mean 'y'? (allowed: ...)" for the
    first of ``names`` that is neither a bot nor one of ``special`` (``self``, ``pool``
    where those are allowed): the one check of a config's, a league's and ``--vs``'s names."""
    for j, name in enumerate(names):
        if name not in special and name not in BOTS:
            known = [*special, *BOTS.names()]
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{key}.{j}: unknown opponent {name!r}{hint} (allowed: "
                             f"{', '.join(known)})")

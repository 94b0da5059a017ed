"""Reference opponents. Every bot is a player: ``bot.act(env, seat) -> action str`` (and
calling the bot does the same). Search bots need ``env.clone()`` (all built-in games have it).

* `RandomBot`: uniform over legal actions.
* `TacticalBot`: random among the moves a two-ply lookahead keeps (takes a win, blocks a
  one-move threat; `sparring.envs.lookahead`).
* `MinimaxBot`: exact minimax for two-seat zero-sum perfect-information games
  (tic-tac-toe, Nim), memoised over ``state_key()``, random tie-breaking.
* `MCTSBot`: UCT with random rollouts (Connect Four), configurable simulations.
* `CFRBot`: plays the CFR+ average strategy of a game with an exact tree (Kuhn, Leduc),
  solved on first use.

`BOTS` (`sparring.envs.bots.registry`) names them for configs and the command line.
"""

from sparring.envs.bots.cfr import CFRBot, cfr_policy
from sparring.envs.bots.mcts import MCTSBot
from sparring.envs.bots.minimax import MinimaxBot, minimax_value
from sparring.envs.bots.registry import BOTS, NEEDS, bot_refusal, check_opponents, make_bot
from sparring.envs.bots.simple import Bot, RandomBot
from sparring.envs.bots.tactical import TacticalBot

__all__ = ["BOTS", "NEEDS", "bot_refusal", "check_opponents", "Bot", "CFRBot", "MCTSBot", "MinimaxBot", "RandomBot", "cfr_policy",
           "TacticalBot", "make_bot", "minimax_value"]

"""The fixed point an entropy bonus pulls self-play towards: the agent logit equilibrium.

On-policy policy gradient with an entropy bonus of weight ``alpha`` on each decision,
``E[sum_t A_t log pi(a_t|I_t) + alpha H(pi(.|I_t))]``, is stationary, for a tabular softmax
policy, where at every information set ``I`` that is reached

    pi(a|I) = exp(Q(I, a) / alpha) / sum_b exp(Q(I, b) / alpha),

``Q(I, a)`` the acting seat's value of ``a`` given ``I`` (`GameTree.action_values`; the bonus
is not part of the return, so ``Q`` holds no future bonus). That is the agent quantal
response equilibrium with logit responses (McKelvey and Palfrey, 1998). Its exploitability
is the floor a run with that bonus can settle at: small ``alpha`` gives a floor near 0 but
dynamics that cycle; large ``alpha`` gives dynamics that settle but a floor far from the
equilibrium (uniform play as ``alpha`` grows). Reading the recipe's ``entropy_coef`` as this
``alpha`` is our reading: it holds where each turn has one choice token (constrained
decoding, tokens after the first forced) and the loss is token-mean, which divides the
policy term and the bonus by the same count, so ``alpha`` is in the game's reward units.

Solved by magnetic mirror descent with a uniform magnet (Sokota et al., 2023, the
behavioural form with these ``Q`` values), per information set:

    sigma_{t+1} proportional to exp((log sigma_t + eta Q_t) / (1 + eta alpha)),

whose fixed points are exactly the logit equilibria; ``eta`` is halved whenever the
residual stops falling (large steps oscillate at small ``alpha``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sparring.envs.tree import GameTree, game_tree


@dataclass
class LogitEquilibrium:
    """``sigma``: ``[n_slots]``; ``residual``: max over slots of |sigma - logit response|."""

    alpha: float
    sigma: np.ndarray
    residual: float
    iterations: int
    converged: bool


def infoset_softmax(tree: GameTree, z: np.ndarray) -> np.ndarray:
    """``[n_slots]``: softmax of the logits ``z`` within each information set."""
    z = z - np.maximum.reduceat(z, tree.offset[:-1])[tree.slot_infoset]
    e = np.exp(z)
    return e / np.add.reduceat(e, tree.offset[:-1])[tree.slot_infoset]


def logit_response(tree: GameTree, q: np.ndarray, alpha: float) -> np.ndarray:
    """``[n_slots]``: the logit response to the action values ``q``, softmax of ``q / alpha``."""
    return infoset_softmax(tree, q / alpha)


def residual(tree: GameTree, sigma: np.ndarray, alpha: float) -> float:
    """How far ``sigma`` is from being its own logit response (0 at the equilibrium)."""
    return float(np.abs(sigma - logit_response(tree, tree.action_values(sigma), alpha)).max())


def logit_equilibrium(game: Any, alpha: float, *, start: np.ndarray | None = None,
                      step: float | None = None, tol: float = 1e-8,
                      max_iterations: int = 200_000, check_every: int = 100,
                      **options: Any) -> LogitEquilibrium:
    """The agent logit equilibrium of ``game`` (a name with ``options``, an env or a
    `GameTree`) at temperature ``alpha`` > 0, from ``start`` (default uniform; a nearby
    ``alpha``'s solution converges faster). ``step``: the initial ``eta`` (default
    ``1 / max |utility|``)."""
    if not alpha > 0:
        raise ValueError(f"logit_equilibrium needs alpha > 0, got {alpha}")
    tree = game_tree(game, **options)
    eta = float(step) if step is not None else 1.0 / max(float(np.abs(tree.utility).max()), 1e-12)
    sigma = tree.uniform() if start is None else tree.sigma_from(np.asarray(start, dtype=np.float64))
    last = residual(tree, sigma, alpha)
    it = 0
    while last > tol and it < max_iterations:
        for _ in range(check_every):
            q = tree.action_values(sigma)
            sigma = infoset_softmax(
                tree, (np.log(np.maximum(sigma, 1e-300)) + eta * q) / (1.0 + eta * alpha))
        it += check_every
        now = residual(tree, sigma, alpha)
        if now > 0.99 * last:
            eta /= 2.0
        last = now
    return LogitEquilibrium(alpha, sigma, last, it, last <= tol)

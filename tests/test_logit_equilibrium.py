"""The agent logit equilibrium (sparring.eval.logit_equilibrium) and the action values
it is built on (GameTree.action_values), against independent computations."""

import math

import numpy as np
import pytest

from sparring.envs import make
from sparring.envs.tree import GameTree
from sparring.eval import exploitability, game_tree
from sparring.eval.logit_equilibrium import logit_equilibrium, logit_response

# seat 0's payoff in a 2x2 zero-sum game played with hidden moves: rows seat 0's H/T,
# columns seat 1's H/T
PAYOFF = {("H", "H"): 3.0, ("H", "T"): -1.0, ("T", "H"): -2.0, ("T", "T"): 1.0}


class HiddenMatrixGame:
    """Seat 0 moves, then seat 1 moves without seeing it: a matrix game as a tree."""

    name = "hidden_matrix"
    num_seats = 2

    def __init__(self):
        self.moves = []

    def deal_outcomes(self):
        return [()]

    def reset_deal(self, deal):
        self.moves = []

    def clone(self):
        c = HiddenMatrixGame()
        c.moves = list(self.moves)
        return c

    def current_seat(self):
        return len(self.moves) if len(self.moves) < 2 else None

    def legal_actions(self, seat):
        return ["H", "T"]

    def info_state(self, seat):
        return f"seat{seat}"  # seat 1 does not see seat 0's move

    def step(self, action):
        self.moves.append(action)

    def returns(self):
        u = PAYOFF[tuple(self.moves)]
        return [u, -u]


def logistic(x):
    return 1.0 / (1.0 + math.exp(-x))


def matrix_qre(alpha):
    """p = P(seat 0 plays H) at the logit equilibrium by bisection: seat 1's H probability
    q(p) falls with p and seat 0's response rises with q, so p - response(q(p)) is
    strictly increasing and has one root."""
    def q_of(p):  # seat 1's H-minus-T value is minus seat 0's payoffs, averaged over p
        d1 = -(p * PAYOFF["H", "H"] + (1 - p) * PAYOFF["T", "H"]) \
             + (p * PAYOFF["H", "T"] + (1 - p) * PAYOFF["T", "T"])
        return logistic(d1 / alpha)

    def gap(p):
        q = q_of(p)
        d0 = (q * PAYOFF["H", "H"] + (1 - q) * PAYOFF["H", "T"]) \
            - (q * PAYOFF["T", "H"] + (1 - q) * PAYOFF["T", "T"])
        return p - logistic(d0 / alpha)

    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return lo, q_of(lo)


@pytest.mark.parametrize("alpha", [0.3, 1.0, 3.0])
def test_a_matrix_game_matches_its_one_dimensional_root(alpha):
    tree = GameTree(HiddenMatrixGame())
    got = logit_equilibrium(tree, alpha)
    assert got.converged
    p, q = matrix_qre(alpha)
    d = tree.as_dict(got.sigma)
    assert d["seat0"]["H"] == pytest.approx(p, abs=1e-6)
    assert d["seat1"]["H"] == pytest.approx(q, abs=1e-6)


def brute_force_action_values(env, policy):
    """Q(I, a) by walking every history of the env: the others' and chance's reach times
    the acting seat's value after a, summed per information set and normalised."""
    num, den = {}, {}

    def value(state):
        seat = state.current_seat()
        if seat is None:
            return np.array(state.returns())
        legal = state.legal_actions(seat)
        probs = policy[state.info_state(seat)]
        return sum(probs[a] * value(child(state, a)) for a in legal)

    def child(state, a):
        c = state.clone()
        c.step(a)
        return c

    deals = env.deal_outcomes()

    def walk_all(state, reach):  # reach per seat, chance folded into every seat's "others"
        seat = state.current_seat()
        if seat is None:
            return
        key = state.info_state(seat)
        others = np.prod([r for i, r in enumerate(reach) if i != seat])
        for a in state.legal_actions(seat):
            c = child(state, a)
            num[key, a] = num.get((key, a), 0.0) + others * value(c)[seat]
            den[key, a] = den.get((key, a), 0.0) + others
            nxt = list(reach)
            nxt[seat] *= policy[key][a]
            walk_all(c, nxt)

    for deal in deals:
        state = env.clone()
        state.reset_deal(deal)
        walk_all(state, [1.0 / len(deals)] + [1.0] * env.num_seats)
    return {k: num[k] / den[k] for k in num}


def test_action_values_match_a_brute_force_walk_on_kuhn():
    env = make("kuhn_poker")
    tree = game_tree("kuhn_poker")
    w = np.random.default_rng(1).random(tree.n_slots) + 0.05
    sigma = w / np.add.reduceat(w, tree.offset[:-1])[tree.slot_infoset]
    want = brute_force_action_values(env, tree.as_dict(sigma))
    got = tree.action_values(sigma)
    for i, (key, legal) in enumerate(zip(tree.infosets, tree.actions)):
        for k, a in enumerate(legal):
            assert got[tree.offset[i] + k] == pytest.approx(want[key, a], abs=1e-12)


def test_kuhn_equilibrium_is_its_own_logit_response_and_nears_nash_as_alpha_falls():
    env = make("kuhn_poker")
    tree = game_tree("kuhn_poker")
    prev, floors = None, []
    for alpha in (1.0, 0.3, 0.1):
        got = logit_equilibrium(tree, alpha, start=prev)
        prev = got.sigma
        assert got.converged
        q = brute_force_action_values(env, tree.as_dict(got.sigma))
        qv = np.array([q[key, a] for key, legal in zip(tree.infosets, tree.actions) for a in legal])
        np.testing.assert_allclose(got.sigma, logit_response(tree, qv, alpha), atol=1e-7)
        floors.append(exploitability(tree, got.sigma))
    uniform = exploitability(tree, tree.uniform())
    assert uniform > floors[0] > floors[1] > floors[2]


def test_alpha_must_be_positive():
    with pytest.raises(ValueError, match="alpha > 0"):
        logit_equilibrium("kuhn_poker", 0.0)

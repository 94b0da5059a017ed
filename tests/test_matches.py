"""Match runner (on the arena), Wilson intervals and Bradley-Terry Elo against
hand-computed numbers."""

import math

import pytest

from sparring.envs.bots import MinimaxBot, RandomBot
from sparring.eval import elo_ratings, play_match, round_robin, wilson
from sparring.policy.sampling import Generation
from sparring.policy.tiny import build_tokenizer
from sparring.rollout.players import ModelPlayer


def lowest(env, seat):
    return env.legal_actions(seat)[0]


def highest(env, seat):
    return env.legal_actions(seat)[-1]


class Scripted:
    """A model-like policy (``generate`` + ``tokenizer``) answering ``answer(prompt text)``."""

    def __init__(self, answer, name="scripted"):
        self.tokenizer, self.answer, self.name = build_tokenizer(), answer, name
        self.calls, self.sizes = 0, []

    def generate(self, prompts, sampling=None, allowed=None):
        self.calls += 1
        self.sizes.append(len(prompts))
        out = []
        for p in prompts:
            text = self.answer(self.tokenizer.decode(p))
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=text,
                                  finish_reason="eos"))
        return out


def first_free_cell(prompt):
    """Tic-tac-toe: the first legal cell listed in the (full-text) observation."""
    return prompt.rsplit("Legal:", 1)[1].split()[0].strip(",.")


def test_wilson_hand_values():
    lo, hi = wilson(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and round(hi, 4) == 0.2775
    lo, hi = wilson(10, 10)
    assert round(lo, 4) == 0.7225 and hi == 1.0
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_elo_closed_forms():
    r = elo_ratings([("a", "b", 1.0)] * 75 + [("a", "b", 0.0)] * 25, prior=0.0)
    assert r["a"] - r["b"] == pytest.approx(400 * math.log10(3), abs=1e-6)
    assert (r["a"] + r["b"]) / 2 == pytest.approx(1000.0)
    # strengths 1 : 2 : 4 reproduced exactly by counts -> 400 log10 2 apart
    out = ([("a", "b", 1.0)] * 10 + [("a", "b", 0.0)] * 20 + [("b", "c", 1.0)] * 10
           + [("b", "c", 0.0)] * 20 + [("a", "c", 1.0)] * 10 + [("a", "c", 0.0)] * 40)
    r = elo_ratings(out, prior=0.0)
    assert r["b"] - r["a"] == pytest.approx(400 * math.log10(2), abs=1e-6)
    assert r["c"] - r["b"] == pytest.approx(400 * math.log10(2), abs=1e-6)
    draws = elo_ratings([("a", "b", 0.5)] * 7)
    assert draws["a"] == pytest.approx(draws["b"])
    perfect = elo_ratings([("a", "b", 1.0)] * 5)  # finite thanks to the prior
    assert math.isfinite(perfect["a"]) and perfect["a"] > perfect["b"]


def test_scripted_tictactoe_match():
    # lowest as X: 1,9,2,8,3 -> X wins; highest as X: 9,1,8,2,7 -> X wins. X always wins.
    res = play_match("tictactoe", {"low": lowest, "high": highest}, games=3)
    assert len(res.games) == 6
    for name in ("low", "high"):
        rec = res.overall[name]
        assert (rec.wins, rec.draws, rec.losses) == (3, 0, 3)
        assert res.per_seat[(name, 0)].wins == 3 and res.per_seat[(name, 1)].losses == 3
        assert rec.mean_return == 0.0
    assert sorted(g.seed for g in res.games) == [0, 0, 1, 1, 2, 2]
    assert {g.seating for g in res.games} == {("low", "high"), ("high", "low")}
    assert "low" in res.table()


def test_forfeit_and_errors():
    junk = Scripted(lambda prompt: "nonsense", name="junk")
    res = play_match("tictactoe", {"bot": lowest, "junk": junk}, games=2)
    assert res.overall["junk"].losses == 4 and res.overall["junk"].forfeits == 4
    assert res.overall["bot"].wins == 4
    assert res.overall["junk"].mean_return == -1.0
    with pytest.raises(ValueError, match="2 seats but 3 players"):
        play_match("tictactoe", [lowest, lowest, lowest])
    with pytest.raises(TypeError, match="cannot use int as a player"):
        play_match("tictactoe", [lowest, 42])
    with pytest.raises(RuntimeError, match="bot 'bad'"):  # a bot's bad move is a bug
        play_match("tictactoe", {"low": lowest, "bad": lambda e, s: "nonsense"}, games=1)


def test_a_model_gets_one_generate_call_per_step():
    model = Scripted(first_free_cell)
    res = play_match("tictactoe", {"m": ModelPlayer(model, name="m", train=False),
                                   "low": lowest}, games=10)
    assert len(res.games) == 20 and res.overall["m"].forfeits == 0
    # 20 games at once: the model moves in its 10 X games, then in its 10 O games, ...
    assert model.calls <= 9 and model.sizes[:2] == [10, 10]
    assert res.overall["m"].games == 20


def test_alias_names_the_same_game():
    a = play_match("tic_tac_toe", {"low": lowest, "high": highest}, games=2)
    b = play_match("tictactoe", {"low": lowest, "high": highest}, games=2)
    assert [(g.seating, g.returns) for g in a.games] == [(g.seating, g.returns) for g in b.games]


def test_three_player_kuhn_zero_sum_and_seatings():
    res = play_match("kuhn_poker", [RandomBot(1), RandomBot(2), RandomBot(3)], games=50,
                     options={"players": 3})
    assert len(res.games) == 150
    assert sum(r.return_sum for r in res.overall.values()) == pytest.approx(0.0)
    assert {res.per_seat[(n, s)].games for n in res.players for s in range(3)} == {50}


def test_round_robin_elo_orders_players():
    res = round_robin("tictactoe", {"minimax": MinimaxBot(1), "random": RandomBot(2),
                                    "low": lowest}, games=40)
    elo = res.elo()
    assert elo["minimax"] > elo["random"] and elo["minimax"] > elo["low"]
    assert res.overall["minimax"].losses == 0
    assert res.overall["minimax"].games == 160


def test_a_forfeit_is_a_loss_even_without_a_penalty():
    """With penalty 0 a game forfeited before any reward has returns [0, 0]; the
    forfeiting seat still loses (and loses its Elo pairings), the other seat wins."""
    junk = Scripted(lambda prompt: "zz", name="junk")
    res = play_match("tictactoe", {"bot": lowest, "junk": junk}, games=2, penalty=0.0)
    assert all(g.returns == [0.0, 0.0] for g in res.games)  # the case a draw hid
    j, b = res.overall["junk"], res.overall["bot"]
    assert (j.wins, j.draws, j.losses, j.forfeits) == (0, 0, 4, 4)
    assert (b.wins, b.draws, b.losses) == (4, 0, 0)
    assert all(res.per_seat[("junk", s)].losses == 2 for s in (0, 1))
    scores = {(i, s) for i, _, s in res.pairwise()}
    assert scores == {("bot", 1.0), ("junk", 0.0)}  # the seat listed first scores s

"""`sparring.envs.parsing`: `strict_answer` needs the whole text to be the answer format;
`parse_choice` reads the last whole-word mention of an action."""

import pytest

from sparring.envs.parsing import parse_choice, strict_answer


@pytest.mark.parametrize("text,move", [
    ("<answer>bet</answer>", "bet"), (" <answer> pass </answer>\n", "pass"),
    ("<answer>Pass bet</answer>", "Pass bet"),  # one span: whether it is one move is the env's
    ("Pass bet", None), ("<answer>bet", None), ("<answer></answer>", None),
    ("<answer>bet</answer> and more", None), ("<answer>a</answer><answer>b</answer>", None),
    ("<answer>b\nc</answer>", None)])
def test_strict_answer_is_the_whole_text_in_the_format(text, move):
    assert strict_answer(text, "<answer>{}</answer>") == move


def test_strict_answer_with_the_bare_format():
    assert strict_answer(" 5 ", "{}") == "5" and strict_answer("", "{}") is None


def _last_mention(text: str, vocab: list[str]) -> str | None:
    """Brute force: at every position of the lower-cased text, every action written there
    as a whole word; the last position wins, the longer action on a tie, then vocab order."""
    low, best = text.lower(), None
    for i in range(len(low) + 1):
        for a in vocab:
            w = a.lower()
            whole = (low.startswith(w, i) and (i == 0 or not (low[i - 1].isalnum() or low[i - 1] == "_"))
                     and (i + len(w) == len(low) or not (low[i + len(w)].isalnum()
                                                         or low[i + len(w)] == "_")))
            if whole and (best is None or i > best[0] or (i == best[0] and len(w) > len(best[1]))):
                best = (i, a)
    return None if best is None else best[1]


def test_parse_choice_takes_the_last_whole_word_mention_as_brute_force_does():
    """Random texts over overlapping names (``a b`` and ``b``, ``bet`` and ``bet all``, a
    name in two letter cases): legal, illegal and unparsable as the brute force says."""
    import random

    rng = random.Random(0)
    all_actions = ["a b", "b", "bet", "bet all", "Bet", "c_d", "10", "1"]
    words = ["a", "b", "bet", "all", "BET", "c_d", "c", "d", "10", "1", "x", "_"]
    for _ in range(2000):
        text = "".join(rng.choice(words) + rng.choice([" ", "", ",", "\n", "_"])
                       for _ in range(rng.randint(0, 6)))
        legal = rng.sample(all_actions, rng.randint(0, len(all_actions)))
        got = parse_choice(f"<answer>{text}</answer>" if rng.random() < 0.3 else text,
                           legal, all_actions)
        want = _last_mention(text.strip(), list(dict.fromkeys(all_actions + legal)))
        if not text.strip():
            assert got.status == "unparsable"
        elif want is None:
            assert got.status == "unparsable", text
        elif want in legal:
            assert (got.status, got.action) == ("legal", want), (text, legal)
        else:
            assert got.status == "illegal" and repr(want) in got.error, (text, legal)
    assert parse_choice("a", [], None).status == "unparsable"

"""`sparring.envs.parsing.strict_answer`: the whole text must be the answer format."""

import pytest

from sparring.envs.parsing import strict_answer


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

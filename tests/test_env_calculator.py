import re

import pytest

from sparring.envs import make


def question_value(obs: str) -> int:
    """The question's value, computed here: products first, then sums/differences."""
    q = re.match(r"Q: (.*) = \?", obs).group(1)
    m = re.fullmatch(r"\((\d+) \+ (\d+)\) \* (\d+)", q)
    if m:
        a, b, c = map(int, m.groups())
        return (a + b) * c
    total = 0
    for sign, term in re.findall(r"(^|[+-]) ?([\d *]+)", q):
        prod = 1
        for f in term.split("*"):
            prod *= int(f)
        total += -prod if sign == "-" else prod
    return total


def test_tool_then_answer():
    env = make("calculator", max_calls=3)
    for seed in range(20):
        env.reset(seed)
        value = question_value(env.observation(0))
        assert value > 1000
        res = env.step(env.parse(0, "calc: 2 * (3 + 4)").action)
        assert res.rewards == [0.0] and not res.done and res.info["result"] == "14"
        assert "calc: 2 * (3 + 4) -> 14" in env.observation(0)
        assert "calls left: 2" in env.observation(0)
        res = env.step(env.parse(0, "calc: __import__('os').system('true')").action)
        assert res.info["result"].startswith("error:") and not res.done
        p = env.parse(0, f"so the result is\nanswer: {value}")
        assert p.action == f"answer: {value}"
        res = env.step(p.action)
        assert res.done and res.rewards == [1.0] and res.info["correct"] and res.info["calls"] == 2
        assert env.current_seat() is None and env.returns() == [1.0]


def test_wrong_answer_and_options():
    env = make("calculator")
    env.reset(5)
    value = question_value(env.observation(0))
    assert env.step(f"answer: {value - 1}").rewards == [0.0]

    env = make("calculator", require_tool=True)
    env.reset(5)
    assert env.step(f"answer: {value}").rewards == [0.0]  # right, but no tool call
    env.reset(5)
    env.step("calc: 1 + 1")
    assert env.step(f"answer: {value}").rewards == [1.0]

    env = make("calculator", tool_cost=0.1)
    env.reset(5)
    env.step("calc: 1 + 1")
    env.step("calc: 2 + 2")
    assert env.step(f"answer: {value}").rewards == pytest.approx([0.8])


def test_call_limit_and_parsing():
    env = make("calculator", max_calls=1)
    env.reset(0)
    assert env.parse(0, "calc: 3*4 then answer: 12").action == "answer: 12"
    assert env.parse(0, "<answer>12</answer>").action == "answer: 12"
    assert env.parse(0, "<answer>calc: 5*5</answer>").action == "calc: 5*5"
    assert env.parse(0, "ANSWER: 7").action == "answer: 7"
    assert env.parse(0, "blah").status == "unparsable"
    assert env.parse(0, "answer: twelve").status == "unparsable"
    assert env.parse(0, "calc:   ").status == "unparsable"
    env.step("calc: 5*5")
    assert env.parse(0, "calc: 1+1").status == "illegal"
    assert env.parse(0, "answer: 3").ok
    with pytest.raises(ValueError):
        env.step("calc: 1+1")


def test_bad_options():
    for opts in ({"max_calls": 0}, {"digits": 9}, {"tool_cost": -1}):
        with pytest.raises(ValueError, match=next(iter(opts))):
            make("calculator", **opts)


def test_an_expression_ends_at_an_equals_sign():
    """A model that writes "calc: 12 * 34 = 408" asks for 12 * 34 (what SmolLM2 writes)."""
    env = make("calculator")
    env.reset(0)
    assert env.parse(0, "calc: 12 * 34 = 408").action == "calc: 12 * 34"
    assert env.parse(0, "calc: 189 * 896 - 246 = 189 * 8").action == "calc: 189 * 896 - 246"
    assert env.parse(0, "calc: = 408").status == "unparsable"
    res = env.step(env.parse(0, "calc: 12 * 34 =").action)
    assert res.info["result"] == "408"


def test_action_prefixes_and_the_outcome_counts():
    """The command words are the moves' prefixes (only `answer:` once the calls are spent);
    the last step reports whether a call was made and whether the answer was right without."""
    env = make("calculator", max_calls=2)
    env.reset(3)
    value = question_value(env.observation(0))
    assert env.action_prefixes(0) == ["calc:", "answer:"]
    env.step("calc: 1 + 1")
    assert env.action_prefixes(0) == ["calc:", "answer:"]
    env.step("calc: 2 + 2")
    assert env.action_prefixes(0) == ["answer:"]
    info = env.step(f"answer: {value}").info
    assert (info["correct"], info["calls"], info["used_tool"], info["correct_without_tool"]) \
        == (True, 2, 1, 0)
    env.reset(3)
    info = env.step(f"answer: {value}").info
    assert (info["used_tool"], info["correct_without_tool"]) == (0, 1)
    env.reset(3)
    assert env.step(f"answer: {value + 1}").info["correct_without_tool"] == 0

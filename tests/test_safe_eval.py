import builtins
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparring.envs.tasks.safe_eval import UnsafeExpression, format_number, literals, safe_eval


@pytest.mark.parametrize("expr,value", [
    ("1+2*3", 7), ("(1+2)*3", 9), ("7//2", 3), ("-7//2", -4), ("7%3", 1), ("-7 % 3", 2),
    ("2**10", 1024), ("-3**2", -9), ("(-3)**2", 9), ("+5", 5), ("1/4+1/4", Fraction(1, 2)),
    ("0.1+0.2", Fraction(3, 10)), ("2**-2", Fraction(1, 4)), ("((2))", 2), ("1_000 + 1", 1001),
    ("7/2*2", 7), ("2.5 ** 2", Fraction(25, 4)),
])
def test_values(expr, value):
    assert safe_eval(expr) == value


@pytest.mark.parametrize("expr", [
    "x", "x + 1", "abs(-1)", "__import__('os').system('true')", "(1).real", "[1]", "(1, 2)",
    "'a'", "'a' * 3", "True", "True + 1", "None", "1j", "lambda: 1", "1 if 1 else 0", "1 < 2",
    "a.b", "x[0]", "{1: 2}", "f'{1}'", "1 and 2", "~1", "not 1", "1 << 2", "1 | 2", "1 @ 2",
    "(y := 2)", "", "   ", "1 +", "2 ** 0.5", "1 / 0", "1 // 0", "1 % 0", "0 ** -1",
])
def test_rejects(expr):
    with pytest.raises(UnsafeExpression):
        safe_eval(expr)


@pytest.mark.parametrize("expr", [
    "2 ** 1000", "9 ** 9 ** 9", "10 ** 10 ** 10", "(10 ** 30) * (10 ** 30)", "99999999999 ** 4",
    "2 ** 64 * 2 ** 64 * 2", "(1/3) ** 64 / 3 ** 64", "1e400", "1" * 201, "1+" * 150 + "1",
    "(" * 300 + "1" + ")" * 300,
])
def test_size_limits_are_fast(expr):
    t = time.perf_counter()
    with pytest.raises(UnsafeExpression):
        safe_eval(expr)
    assert time.perf_counter() - t < 0.5


def test_within_limits():
    assert safe_eval("2 ** 64") == 18446744073709551616
    assert safe_eval("10 ** 38") == 10**38
    assert safe_eval("-" * 150 + "1") == 1  # even count of unary minus


def test_never_uses_eval_or_exec(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("eval/exec called")
    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    assert safe_eval("6 * 7") == 42


def test_non_string_input():
    for bad in (b"1+1", 3, None):
        with pytest.raises(UnsafeExpression):
            safe_eval(bad)


def test_literals_and_format():
    assert sorted(literals("3*(4-1)/2")) == [1, 2, 3, 4]
    assert literals("1/0") == [1, 0]  # syntax only, no evaluation
    with pytest.raises(UnsafeExpression):
        literals("x + 1")
    assert format_number(Fraction(7, 2)) == "3.5"
    assert format_number(Fraction(-12)) == "-12"
    assert format_number(Fraction(1, 3)) == "0.333333333333"


@st.composite
def int_trees(draw, depth=3):
    """(source text, value) of a random + - * tree, evaluated here with Python ints."""
    if depth == 0 or draw(st.booleans()):
        v = draw(st.integers(0, 999))
        return str(v), v
    (a, va), (b, vb) = draw(int_trees(depth - 1)), draw(int_trees(depth - 1))
    op = draw(st.sampled_from("+-*"))
    v = va + vb if op == "+" else va - vb if op == "-" else va * vb
    if draw(st.booleans()):
        return f"-({a} {op} {b})", -v
    return f"({a} {op} {b})", v


@settings(max_examples=200, deadline=None)
@given(int_trees())
def test_matches_integer_reference(tree):
    text, value = tree
    assert safe_eval(text) == value


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="0123456789+-*/%() .e_j", max_size=80)))
def test_fuzz_value_or_clear_error(text):
    try:
        v = safe_eval(text)
    except UnsafeExpression as e:
        assert str(e)
    else:
        assert isinstance(v, Fraction)

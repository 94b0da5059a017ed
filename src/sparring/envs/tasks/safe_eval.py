"""A safe arithmetic evaluator on the `ast` module: never ``eval``/``exec``.

Allowed: int and decimal literals, ``+ - * / // % **``, parentheses, unary ``-``/``+``.
Everything else (names, calls, attributes, subscripts, comparisons, strings, ...) is
rejected with `UnsafeExpression`. Arithmetic is exact (`fractions.Fraction`), and sizes
are bounded: the source length, the exponent, and the bit length of every intermediate
numerator and denominator (checked *before* a power is computed), so no input can make
it run long or use much memory.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

MAX_LEN = 200  # characters of source
MAX_BITS = 128  # |numerator|, denominator < 2**MAX_BITS (about 3.4e38)
MAX_EXPONENT = 64


class UnsafeExpression(ValueError):
    """The text is not an allowed arithmetic expression, or a limit was exceeded."""


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _parse(expr: object, max_len: int) -> ast.expr:
    if not isinstance(expr, str):
        raise UnsafeExpression(f"expression must be a string, got {type(expr).__name__}")
    text = expr.strip()
    if not text:
        raise UnsafeExpression("empty expression")
    if len(text) > max_len:
        raise UnsafeExpression(f"expression longer than {max_len} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise UnsafeExpression(f"not an arithmetic expression ({type(e).__name__})") from None
    return tree.body


def _check(x: Fraction, max_bits: int) -> Fraction:
    if abs(x.numerator).bit_length() > max_bits or x.denominator.bit_length() > max_bits:
        raise UnsafeExpression("number too large")
    return x


def _literal(node: ast.Constant) -> Fraction:
    v = node.value
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise UnsafeExpression(f"only numbers are allowed, not {type(v).__name__} {v!r}")
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise UnsafeExpression("number too large")
        return Fraction(repr(v))  # 0.1 -> 1/10, as written
    return Fraction(v)


def _eval(node: ast.AST, max_bits: int, max_exp: int) -> Fraction:
    if isinstance(node, ast.Constant):
        return _check(_literal(node), max_bits)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _eval(node.operand, max_bits, max_exp)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a = _eval(node.left, max_bits, max_exp)
        b = _eval(node.right, max_bits, max_exp)
        if isinstance(node.op, ast.Pow):
            return _power(a, b, max_bits, max_exp)
        fn = _BINOPS.get(type(node.op))
        if fn is None:
            raise UnsafeExpression(f"operator {type(node.op).__name__} is not allowed")
        if b == 0 and isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod):
            raise UnsafeExpression("division by zero")
        return _check(Fraction(fn(a, b)), max_bits)
    raise UnsafeExpression(f"{type(node).__name__} is not allowed (numbers and + - * / // % ** only)")


def _power(a: Fraction, b: Fraction, max_bits: int, max_exp: int) -> Fraction:
    if b.denominator != 1:
        raise UnsafeExpression("exponent must be an integer")
    e = b.numerator
    if abs(e) > max_exp:
        raise UnsafeExpression(f"exponent {e} too large (|exponent| <= {max_exp})")
    if a == 0 and e < 0:
        raise UnsafeExpression("division by zero")
    bits = max(abs(a.numerator).bit_length(), a.denominator.bit_length())
    if (bits - 1) * abs(e) > max_bits:  # the result has at least this many bits
        raise UnsafeExpression("number too large")
    return _check(a**e, max_bits)


def safe_eval(expr: object, *, max_len: int = MAX_LEN, max_bits: int = MAX_BITS,
              max_exponent: int = MAX_EXPONENT) -> Fraction:
    """The exact value of an arithmetic expression; `UnsafeExpression` for anything else."""
    node = _parse(expr, max_len)
    try:
        return _eval(node, max_bits, max_exponent)
    except RecursionError:
        raise UnsafeExpression("expression nested too deeply") from None


_ALLOWED = (ast.Constant, ast.UnaryOp, ast.BinOp, ast.USub, ast.UAdd, ast.Pow,
            *_BINOPS)


def literals(expr: object, *, max_len: int = MAX_LEN) -> list[Fraction]:
    """The number literals of an expression, in no particular order (for countdown rules).

    Checks the syntax (allowed nodes only) but does not evaluate: ``1/0`` is fine here.
    """
    node = _parse(expr, max_len)
    out = []
    for n in ast.walk(node):
        if not isinstance(n, _ALLOWED):
            raise UnsafeExpression(f"{type(n).__name__} is not allowed "
                                   "(numbers and + - * / // % ** only)")
        if isinstance(n, ast.Constant):
            out.append(_literal(n))
    return out


def format_number(x: Fraction) -> str:
    """An exact integer as digits, any other value to 12 significant digits."""
    if x.denominator == 1:
        return str(x.numerator)
    return format(float(x), ".12g")


__all__ = ["MAX_BITS", "MAX_EXPONENT", "MAX_LEN", "UnsafeExpression", "format_number",
           "literals", "safe_eval"]

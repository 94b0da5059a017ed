import itertools
import re
from fractions import Fraction

import pytest

from sparring.envs import make
from sparring.envs.tasks.arithmetic import parse_number


def reference(problem: str) -> int:
    """Evaluate 'a op b op c ...' with * before + and -, written out by hand."""
    toks = problem.split()
    nums, ops = [int(toks[0])], []
    for op, n in zip(toks[1::2], toks[2::2]):
        if op == "*":
            nums[-1] *= int(n)
        else:
            ops.append(op)
            nums.append(int(n))
    total = nums[0]
    for op, n in zip(ops, nums[1:]):
        total = total + n if op == "+" else total - n
    return total


@pytest.mark.parametrize("terms", [2, 3, 4])
def test_arithmetic_reward(terms):
    env = make("arithmetic", digits=2, terms=terms)
    for seed in range(30):
        env.reset(seed)
        problem = env.observation(0).removesuffix(" = ?")
        assert len(problem.split()) == 2 * terms - 1
        assert all(10 <= int(t) <= 99 for t in problem.split()[::2])
        right = reference(problem)
        assert env.current_seat() == 0 and env.legal_actions(0) is None
        p = env.parse(0, f"let me think... <answer>{right}</answer>")
        assert p.ok and p.action == str(right)
        res = env.step(p.action)
        assert res.done and res.rewards == [1.0] and res.info["correct"] is True
        assert env.returns() == [1.0] and env.current_seat() is None
        env.reset(seed)
        res = env.step(str(right + 1))
        assert res.rewards == [0.0] and res.info["correct"] is False


def test_arithmetic_deterministic_and_varied():
    a, b = make("arithmetic"), make("arithmetic")
    obs = set()
    for seed in range(20):
        a.reset(seed)
        b.reset(seed)
        assert a.observation(0) == b.observation(0)
        obs.add(a.observation(0))
    assert len(obs) > 15


def test_parse_number():
    assert parse_number("<answer>42</answer>").action == "42"
    assert parse_number("first 12, then 13").action == "13"
    assert parse_number("<answer> -7 </answer> and 9").action == "-7"
    assert parse_number("3.50").action == "3.5"
    assert parse_number("The answer is 42.").action == "42"
    assert parse_number("no digits").status == "unparsable"
    assert parse_number("9" * 100).status == "unparsable"
    assert parse_number(b"\xff 5").action == "5"


@pytest.mark.parametrize("opts", [{"digits": 0}, {"terms": 1}, {"ops": "/"}, {"ops": ""}])
def test_arithmetic_bad_options(opts):
    with pytest.raises(ValueError, match=next(iter(opts))):
        make("arithmetic", **opts)


def solve(numbers, target):
    """Brute force: an expression over a sub-multiset of numbers equal to target, or None."""
    items = [(Fraction(n), str(n)) for n in numbers]

    def rec(items):
        for v, e in items:
            if v == target:
                return e
        for i, j in itertools.permutations(range(len(items)), 2):
            (a, ea), (b, eb) = items[i], items[j]
            rest = [x for k, x in enumerate(items) if k not in (i, j)]
            cands = [(a + b, f"({ea} + {eb})"), (a - b, f"({ea} - {eb})"),
                     (a * b, f"({ea} * {eb})")]
            if b != 0:
                cands.append((a / b, f"({ea} / {eb})"))
            for c in cands:
                found = rec(rest + [c])
                if found:
                    return found
        return None

    return rec(items)


def test_countdown_solvable_and_rewarded():
    env = make("countdown", n_numbers=4, max_number=20, max_target=100)
    for seed in range(60):
        env.reset(seed)
        m = re.fullmatch(r"numbers ([\d ]+) target (\d+)", env.observation(0))
        numbers, target = [int(x) for x in m.group(1).split()], int(m.group(2))
        assert len(numbers) == 4 and all(1 <= n <= 20 for n in numbers)
        assert 1 <= target <= 100 and target not in numbers
        expr = solve(numbers, target)
        assert expr is not None, (numbers, target)
        p = env.parse(0, f"{expr} = {target}")
        assert p.ok, p.error
        res = env.step(p.action)
        assert res.rewards == [1.0] and res.done


def test_countdown_rules():
    env = make("countdown")
    env.reset(3)
    m = re.fullmatch(r"numbers ([\d ]+) target (\d+)", env.observation(0))
    numbers, target = [int(x) for x in m.group(1).split()], int(m.group(2))
    assert target not in numbers
    missing = max(numbers) + 1
    assert env.parse(0, f"<answer>{numbers[0]} + {missing}</answer>").status == "illegal"
    n0 = numbers[0]
    if numbers.count(n0) == 1:
        assert env.parse(0, f"{n0} * {n0}").status == "illegal"
    assert env.parse(0, "hello there").status == "unparsable"
    assert env.parse(0, f"{n0} + x").status == "unparsable"
    p = env.parse(0, str(n0))  # legal, but n0 != target
    assert p.ok
    assert env.step(p.action).rewards == [0.0]
    with pytest.raises(RuntimeError):
        env.step(p.action)

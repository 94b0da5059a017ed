"""Environment steps per second: every registered env, uniformly random legal moves.

Two loops per env, each for ``--steps`` steps (resetting with the next seed at the end of
an episode): "step" = legal_actions + step; "turn" = what a rollout does per turn:
observation + legal_actions + parse(text of the chosen move) + step. Free-text envs
(legal_actions None) answer "<answer>0</answer>". Target: >= 20,000 steps/s for
tictactoe and kuhn_poker.

    PYTHONPATH=src python bench/envs.py            # full run
    PYTHONPATH=src python bench/envs.py --quick    # smoke test
"""

from __future__ import annotations

import argparse
import random
import time

from sparring.envs import list_envs, make

FREE_TEXT = "<answer>0</answer>"


def run(env, steps: int, full: bool, seed: int = 0) -> tuple[float, int]:
    rng = random.Random(seed)
    ep = seed
    env.reset(ep)
    episodes = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        seat = env.current_seat()
        if seat is None:
            episodes += 1
            ep += 1
            env.reset(ep)
            seat = env.current_seat()
        if full:
            env.observation(seat)
        legal = env.legal_actions(seat)
        if legal is None:
            parsed = env.parse(seat, FREE_TEXT)
            if not parsed.ok:  # this env rejects the stock answer: start a new episode
                episodes += 1
                ep += 1
                env.reset(ep)
                continue
            action = parsed.action
        else:
            action = rng.choice(legal)
            if full:
                action = env.parse(seat, action).action
        env.step(action)
    return steps / (time.perf_counter() - t0), episodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000, help="steps per env and loop")
    ap.add_argument("--quick", action="store_true", help="2,000 steps per env (smoke test)")
    ap.add_argument("--envs", nargs="*", help="only these env names")
    args = ap.parse_args()
    steps = 2_000 if args.quick else args.steps
    print(f"{'env':16s} {'step/s':>10s} {'turn/s':>10s} {'episodes':>9s}")
    for entry in list_envs():
        if args.envs and entry.name not in args.envs:
            continue
        try:
            env = make(entry.name)
        except (ImportError, ValueError) as e:  # a missing extra, or options it requires
            print(f"{entry.name:16s} skipped ({e})")
            continue
        raw, eps = run(env, steps, full=False)
        full, _ = run(env, steps, full=True)
        print(f"{entry.name:16s} {raw:10,.0f} {full:10,.0f} {eps:9d}")


if __name__ == "__main__":
    main()

"""The code a signalling run has learned: the speaker's distribution over the symbols for
each colour and the listener's over the colours for each symbol.

    PYTHONPATH=src python bench/signalling_code.py RUN [RUN ...]   # each run's last checkpoint

Each probability is the policy's constrained-decoding distribution over the legal answers
(`sparring.eval.games.probabilities_at`, the prompt cut to ``rollout.max_prompt_tokens`` as
the rollouts cut it), for a one-round game.
A full code is a permutation: each colour's symbol read back as that colour.
"""

from __future__ import annotations

import argparse

from sparring.assembly.trained import load_policy
from sparring.envs import make
from sparring.eval.games import probabilities_at
from sparring.rollout.rollouts import make_arena


def code_tables(run: str) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(speaker: colour -> {symbol: p}, listener: symbol -> {colour: p}) of ``run``."""
    speaker, cfg, _ = load_policy(run, "cpu", policy="speaker")
    listener, _, _ = load_policy(run, "cpu", policy="listener")
    arena = make_arena(cfg.rollout)
    env = make("signalling", **{**cfg.envs[0].options, "rounds": 1})
    sent, read = {}, {}
    for colour in env.colours:
        env.reset(0)
        env.secrets = [colour]
        sent[colour] = probabilities_at(speaker, arena, [(env, 0)])[0]
    for symbol in env.symbols:
        env.reset(0)
        env.step(symbol)
        read[symbol] = probabilities_at(listener, arena, [(env, 1)])[0]
    return sent, read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    for run in ap.parse_args().runs:
        sent, read = code_tables(run)
        print(run)
        for colour, p in sent.items():
            print(f"  speaker  {colour:>7}: " + " ".join(f"{k} {v:.2f}" for k, v in p.items()))
        for symbol, p in read.items():
            print(f"  listener {symbol:>7}: " + " ".join(f"{k} {v:.2f}" for k, v in p.items()))


if __name__ == "__main__":
    main()

"""``sparring play``: a person plays a game against a trained model in the terminal."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

from sparring.envs import make
from sparring.eval.periodic import env_options
from sparring.rollout.prompts import PromptBuilder, PromptConfig
from sparring.rollout.rollouts import rollout_sampling


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters other than newline and tab (an
    environment's escape sequences, which could move the cursor or retitle the window) and
    lone surrogates are shown escaped, as ``\\x1b``."""
    return "".join(c if c in "\n\t" or (unicodedata.category(c) not in ("Cc", "Cs"))
                   else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


def _readable(env, seat: int) -> str:
    """The full-text observation for a person, also when the model reads the compact one."""
    compact = getattr(env, "compact", False)
    env.compact = False
    try:
        return env.observation(seat)
    finally:
        env.compact = compact


def play_in_terminal(policy, cfg, env_name: str, human_seat: int = 0, greedy: bool = True,
         ask: Callable[[str], str] = input, say: Callable[[str], None] = print,
         seed: int = 0) -> list[float]:
    """One game: the human types moves (re-asked until legal), the model answers with
    constrained decoding over the legal moves (``policy``: one policy for every model seat,
    or a list with each seat's policy, a run with several policies). Returns the game's
    per-seat returns. A game
    ends with win / lose / draw; a single-seat task with the score (and whether the answer
    was correct, when the task says). ``ask`` raising EOFError (Ctrl-D) ends the game.
    Everything shown goes through `printable` (no raw escape sequences from the env)."""
    options = env_options(cfg, env_name)
    env = make(env_name, **options)
    shown = say

    def say(text: str) -> None:  # everything the game prints passes through `printable`
        shown(printable(text))

    if not (isinstance(human_seat, int) and 0 <= human_seat < env.num_seats):
        raise ValueError(f"--seat: {env.name} has seats 0 to {env.num_seats - 1}, "
                         f"got {human_seat!r}")
    env.reset(seed)
    info: dict = {}
    r = cfg.rollout
    seat_policy = list(policy) if isinstance(policy, list | tuple) else [policy] * env.num_seats
    if len(seat_policy) != env.num_seats:
        raise ValueError(f"play: {len(seat_policy)} policies for the {env.num_seats} seats of "
                         f"{env.name}")
    prompts = PromptConfig(history="state", max_prompt_tokens=r.max_prompt_tokens,
                           system_prompt=r.system_prompt, answer_prefix=r.answer_prefix)
    sampling = rollout_sampling(r, greedy=greedy)
    say(env.system_prompt(human_seat))
    while (seat := env.current_seat()) is not None:
        if seat == human_seat:
            say("\n" + _readable(env, seat))
            while True:
                text = ask("your move> ")
                res = env.parse(seat, text)
                if res.ok:
                    break
                say(f"not a legal move: {res.error}")
            action = res.action
        else:
            model = seat_policy[seat]
            prompt = PromptBuilder(model.tokenizer, prompts).build(
                env.system_prompt(seat), [], env.observation(seat)).ids
            legal = env.legal_actions(seat)
            gen = model.generate([prompt], sampling, allowed=None if legal is None else [legal])[0]
            res = env.parse(seat, prompts.answer(gen.text))
            action = res.action if res.ok else (legal or [""])[0]
            say(f"model plays: {action}")
        info = env.step(action).info or {}
    returns = env.returns()
    say("\n" + env.observation(human_seat))
    mine = returns[human_seat]
    if env.num_seats == 1:  # a task: no one to win against
        verdict = ("" if "correct" not in info else " (correct)" if info["correct"]
                   else " (wrong" + (f": the answer is {info['answer']})" if "answer" in info
                                    else ")"))
        say(f"your score: {mine:g}{verdict}")
    else:
        say("you win" if mine > 0 else "you lose" if mine < 0 else "draw")
    return returns

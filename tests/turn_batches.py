"""Hand-built multi-turn, multi-agent episodes for the turn-level estimator tests.

Group 0: two 3-seat episodes (E0: 5 turns, E1: 4 turns); group 1: E2 (truncated by a turn
budget) and E3. Turns have different prompt and action lengths, so rows are padded.
Plain-Python helpers (`rows`, `rtg_list`, `zscore`) give the reference values.
`random_batch` builds seeded random batches with every optional field filled.
"""

import math

import torch

from sparring.data import Episode, Turn, TurnBatch, collate

# (agent, prompt_len, action_len, reward, state_key)
SPECS = [
    dict(group=0, truncated=False, returns=[4.0, -1.0, 2.0], turns=[
        (0, 2, 2, 1.0, "a"), (1, 3, 1, 0.0, "b"), (2, 1, 3, 2.0, "c"), (0, 4, 1, 3.0, "d"),
        (1, 2, 2, -1.0, "e")]),
    dict(group=0, truncated=False, returns=[1.0, 2.0, 0.0], turns=[
        (0, 2, 1, 0.0, "a"), (1, 3, 2, 2.0, "b2"), (2, 2, 1, 0.0, "c"), (0, 3, 2, 1.0, "d2")]),
    dict(group=1, truncated=True, returns=[0.5, 0.5, 0.5], turns=[
        (0, 1, 1, 0.5, "a"), (1, 1, 1, 0.5, "b"), (2, 1, 1, 0.5, "c")]),
    dict(group=1, truncated=False, returns=[1.0, 0.0, -1.0], turns=[
        (0, 2, 2, 1.0, "a"), (1, 1, 3, 0.0, "b"), (2, 2, 1, -1.0, "c")]),
]


def extras_for(e: int, step: int, agent: int) -> dict[str, float]:
    p0 = 0.1 * step + 0.01 * e
    return {"p_before": p0, "p_after": p0 + 0.05 * (agent + 1) - 0.03 * (step % 2),
            "match": 0.25 * ((step + e) % 3), "q1": 0.3 * step - agent, "q2": 0.2 * step,
            "v1": 0.1 * agent, "v2": 0.05 * step - 0.1}


def episodes() -> list[Episode]:
    eps = []
    for e, spec in enumerate(SPECS):
        turns = []
        for s, (a, lp, la, r, key) in enumerate(spec["turns"]):
            turns.append(Turn(
                agent=a, prompt_ids=[10 + e] * lp, action_ids=[20 + s] * la,
                logprobs=[-0.1 * (j + 1) - 0.05 * s for j in range(la)],
                entropies=[0.5 + 0.1 * j + 0.2 * a for j in range(la)],
                reward=r, state_key=key, done=s == len(spec["turns"]) - 1,
                extras=extras_for(e, s, a)))
        eps.append(Episode(env="toy3", seed=e, group=spec["group"], num_agents=3, turns=turns,
                           returns=list(spec["returns"]), truncated=spec["truncated"]))
    return eps


def batch():
    return collate(episodes(), layout="turn")


def rows() -> list[dict]:
    """Reference rows in collate's order (episode, agent, the agent's turns)."""
    out = []
    for e, spec in enumerate(SPECS):
        for a in range(3):
            mine = [(s, t) for s, t in enumerate(spec["turns"]) if t[0] == a]
            for k, (s, t) in enumerate(mine):
                out.append(dict(e=e, g=spec["group"], a=a, k=k, step=s, r=t[3], key=t[4],
                                ret=spec["returns"][a], last=k == len(mine) - 1,
                                trunc=spec["truncated"], n_turns=len(mine),
                                ex=extras_for(e, s, a)))
    return out


def rtg_list(rs: list[float], gamma: float) -> list[float]:
    out, acc = [], 0.0
    for r in reversed(rs):
        acc = r + gamma * acc
        out.append(acc)
    return out[::-1]


def zscore(xs: list[float], eps: float = 1e-6, std: bool = True) -> list[float]:
    m = sum(xs) / len(xs)
    if not std:
        return [x - m for x in xs]
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / max(len(xs) - 1, 1))
    return [(x - m) / (sd + eps) for x in xs]


EXTRAS = ("p_before", "p_after", "match", "q1", "q2", "v1", "v2", "greedy_reward")


def random_batch(seed: int, episodes: int = 6, agents: int = 3, max_turns: int = 4,
                 groups: int = 2, layout: str = "turn") -> TurnBatch:
    """Collated random episodes: prompts of 0-4 tokens, actions of 1-6, padding, some
    truncated episodes, binary returns, state keys that repeat, every per-turn extra
    (`EXTRAS`), entropies and critic values. Trajectory layout gives one turn per agent."""
    g = torch.Generator().manual_seed(seed)

    def ri(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    eps = []
    for e in range(episodes):
        turns = []
        for s in range(ri(1, max_turns) if layout == "turn" else agents):
            la = ri(1, 6)
            turns.append(Turn(
                agent=ri(0, agents - 1) if layout == "turn" else s, prompt_ids=[1] * ri(0, 4),
                action_ids=[2] * la, logprobs=(-torch.rand(la, generator=g) * 2).tolist(),
                entropies=(torch.rand(la, generator=g) * 3).tolist(),
                reward=float(torch.randn(1, generator=g)), state_key=f"state {ri(0, 2)}",
                extras={k: float(torch.rand(1, generator=g)) for k in EXTRAS}))
        eps.append(Episode(env="random", seed=e, group=e % groups, num_agents=agents,
                           turns=turns, returns=[float(ri(0, 1)) for _ in range(agents)],
                           truncated=ri(0, 3) == 0))
    b = collate(eps, layout=layout)
    return b.with_fields(values=torch.randn(b.input_ids.shape, generator=g))

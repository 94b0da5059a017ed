"""Can a linear readout of a model's frozen features play a game without a blunder?

    PYTHONPATH=src python bench/linear_probe.py [RECIPE] [--iters N] [--lr LR]
        [--center | --whiten EPS]

The ceiling of a recipe that trains only the output layer (``model.head: frozen_features``):
the recipe's untrained model reads every decision point of the game (its exact prompt, as
the exact evaluations build it) and gives its last hidden state ``h`` (the features the LM
head reads). A head ``W`` over the legal moves' first tokens, started at the model's own
LM-head rows, is then fitted by full-batch Adam to put its probability on minimax's
optimal moves:

    loss = - mean over positions of log sum_{a in A*(s)} softmax_{legal}(W h(s))_a

With ``--center`` or ``--whiten`` the head's change reads the transformed features, as
the recipe's with the head's ``center`` / ``whiten``
(`sparring.policy.feature_cache`: ``W_0 h + (W - W_0) z``, the transform from all the
decision points): the same optimum, reached in fewer iterations.

This is supervised, a diagnostic only: it says whether the features separate the
positions well enough that *some* linear policy on them plays perfectly, not whether RL
finds it. It prints the fit's accuracy (greedy move optimal) over the iterations and the
fitted head's exact non-loss against minimax (`sparring.eval.vs_minimax`), and the same
for the model's own head (the start). A two-seat game with a minimax solver only
(tic-tac-toe, Nim).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?", default="smollm2_tictactoe")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--center", action="store_true",
                    help="the head's change reads the features minus their mean over the "
                    "positions (model.head's center)")
    ap.add_argument("--whiten", type=float, default=0.0, metavar="EPS",
                    help="... centered and whitened, the covariance shrunk by EPS "
                    "(model.head's whiten)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args()
    from sparring.assembly.parts import load_model
    from sparring.config import load_config
    from sparring.config.files import find_recipe
    from sparring.envs import make
    from sparring.envs.bots.minimax import optimal_children
    from sparring.eval.games import position_prompts
    from sparring.eval.periodic import env_options
    from sparring.eval.vs_minimax import exact_vs_minimax
    from sparring.policy.feature_cache import FeatureCache
    from sparring.policy.hf import HFPolicy
    from sparring.rollout.rollouts import make_arena

    torch.manual_seed(args.seed)
    cfg = load_config(find_recipe(args.recipe), args.overrides)
    game = cfg.envs[0].name
    options = env_options(cfg, game)
    policy = HFPolicy(*load_model(cfg), device="cpu", name="base")
    arena = make_arena(cfg.rollout)
    points: dict[tuple[str, int], tuple[int, object]] = {}  # (observation, seat) -> (seat, env)
    seen: set[str] = set()

    def walk(env) -> None:  # every reachable position once; a prompt once per observation
        seat = env.current_seat()
        if seat is None or env.state_key() in seen:
            return
        seen.add(env.state_key())
        points.setdefault((env.observation(seat), seat), (seat, env.clone()))
        for a in env.legal_actions(seat):
            child = env.clone()
            child.step(a)
            walk(child)

    root = make(game, **options)
    root.reset(0)
    walk(root)
    keys = list(points)
    t0 = time.perf_counter()
    seats = [points[k][0] for k in keys]
    envs = [points[k][1] for k in keys]
    # each prompt's last hidden state, computed alone (the recipe's feature cache)
    cache = FeatureCache(policy.model, len(keys), center=args.center, whiten=args.whiten)
    H = cache.features(
        [(p, ()) for p in position_prompts(policy, arena, list(zip(envs, seats)))])
    cos = torch.nn.functional.normalize(H, dim=-1)
    print(f"mean cosine between two positions' features: {float((cos @ cos.T).mean()):.3f}")
    cache.fix_transform()  # the recipe's transform, here from every decision point
    Z = cache.head_input(H)  # z = P (h - mu), or h itself
    actions = sorted({a for e, s in zip(envs, seats) for a in e.legal_actions(s)})
    tok = [policy.tokenizer.encode(arena.written_format.format(a), add_special_tokens=False)
           for a in actions]
    if any(len(t) != 1 for t in tok):
        raise SystemExit(f"moves of more than one token: {dict(zip(actions, tok))}")
    head0 = policy.model.get_output_embeddings().weight[[t[0] for t in tok]].detach().float()
    legal = torch.zeros(len(keys), len(actions), dtype=torch.bool)
    good = torch.zeros_like(legal)
    for i, (e, s) in enumerate(zip(envs, seats)):
        for a in e.legal_actions(s):
            legal[i, actions.index(a)] = True
        for a, _, _ in optimal_children(e):
            good[i, actions.index(a)] = True
    print(f"{len(keys)} decision points, features {tuple(H.shape)} in "
          f"{time.perf_counter() - t0:.0f} s; {len(actions)} moves")

    def probs(W: torch.Tensor) -> torch.Tensor:  # feature_cache.head_logits over the moves
        logits = H @ head0.T + Z @ (W - head0).T
        return torch.softmax(logits.masked_fill(~legal, float("-inf")), -1)

    def report(label: str, W: torch.Tensor) -> None:
        P = probs(W).detach()
        acc = good[torch.arange(len(keys)), P.argmax(-1)].float().mean()
        table = {k: {a: float(P[i, j]) for j, a in enumerate(actions) if legal[i, j]}
                 for i, k in enumerate(keys)}
        by_obs = {}
        for i, (e, s) in enumerate(zip(envs, seats)):
            by_obs[(e.observation(s), s)] = table[keys[i]]
        vs = exact_vs_minimax(lambda: make(game, **options),
                              lambda es, seat: [by_obs[(e.observation(seat), seat)] for e in es])
        r = vs.rates()
        print(f"{label}: greedy optimal at {acc:.3f} of positions, p(optimal) "
              f"{float((P * good).sum(-1).mean()):.3f}; exact non-loss vs minimax "
              f"{r['non_loss']:.3f} (X {r['non_loss_seat0']:.3f}, O {r['non_loss_seat1']:.3f}),"
              f" {int(r['blunder_states'])} blunder positions", flush=True)

    report("the model's own head", head0)
    W = head0.clone().requires_grad_(True)
    opt = torch.optim.Adam([W], lr=args.lr)
    for it in range(1, args.iters + 1):
        P = probs(W)
        loss = -torch.log((P * good).sum(-1).clamp_min(1e-12)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it in (10, 30, 100, 300, 500, 1000) or it == args.iters:
            print(f"iteration {it}: loss {loss.item():.4f}")
            report(f"  fitted head, iteration {it}", W)


if __name__ == "__main__":
    main()

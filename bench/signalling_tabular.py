"""The signalling game with a table of logits per input instead of a network: does the
partial-code trap belong to the game and the update, or to the model?

The k-colour Lewis game of `configs/signalling_two_policies.yaml`
(`sparring.envs.games.signalling`): a speaker table ``S[colour] -> logits over symbols`` and
a listener table ``L[symbol] -> logits over colours``, both started from logits
``b + e_x``, a bias ``b ~ N(0, shared^2)`` common to every input plus ``e_x ~ N(0, init^2)``
per input (``--shared 0``: independent rows; a small ``--init`` under a larger
``--shared``: a start that barely depends on its input, as the tiny model's does), trained
with Adam. Two updates:

* ``exact``: ascent on the expected shared reward ``J = (1/k) sum_c sum_m pi_S(m|c) pi_L(c|m)``
  (no sampling at all);
* ``sampled``: the recipe's update read on tables: ``batch`` games a step, GiGPO's advantage
  with batch anchors (``A = norm_batch(r) + norm_anchor(r)``, the anchor the speaker's colour
  or the listener's symbol; `sparring.advantages.normalize.normalize`, a singleton anchor
  gives 0) and PPO's clipped surrogate over ``epochs`` passes.

``--overlap RHO`` replaces each table with a linear map of fixed features,
``logits(x) = phi_x W``: unit vectors ``phi_x`` with cosine ``RHO`` between any two inputs
(a common direction plus one of each input's own), turned by a random rotation into ``--dim``
dimensions so that no weight belongs to one input, ``W ~ N(0, init^2)``. It is the tiny
model's situation with its features frozen: at initialisation its last-position features
for the four colours have cosines 0.82-0.93 (the prompt cut to 6 tokens), so an update made
for one colour moves the others nearly as much.

Either adds a regulariser of weight ``c`` to each policy: ``entropy`` (``+c H(pi)``, the
recipe's `algorithm.entropy_coef`), or ``mutation`` (``-c KL(u || pi)``, u uniform over the
legal moves; the framework's ``algorithm.entropy_bonus: uniform_kl``): our logit-space
reading of the selection-mutation dynamics of Hofbauer and Huttegger (Games 2015), whose pull
``c (1/k - pi_a)`` on a logit does not vanish as ``pi_a -> 0``, where the entropy's
``-pi_a (log pi_a + H)`` does. A seed reaches the full code when the greedy
listener inverts the greedy speaker on every colour.

    PYTHONPATH=src python bench/signalling_tabular.py --seeds 20
    PYTHONPATH=src python bench/signalling_tabular.py --mode sampled --arms none entropy:0.2 mutation:0.2
    PYTHONPATH=src python bench/signalling_tabular.py --mode sampled --dim 64 --overlap 0.9

Prints, per arm, how many seeds reach the full code and the greedy success of each seed.
"""

from __future__ import annotations

import argparse

import torch

from sparring.advantages.normalize import normalize


def regulariser(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-row bonus added to the objective (``[n, k]`` logits -> ``[n]``): the entropy, or
    ``-KL(u || pi) - log k = mean_a log pi(a)`` (the constant does not change the gradient)."""
    logp = logits.log_softmax(-1)
    if kind == "entropy":
        return -(logp.exp() * logp).sum(-1)
    if kind == "mutation":
        return logp.mean(-1)
    raise ValueError(f"unknown regulariser {kind!r}; use entropy or mutation")


def greedy_success(S: torch.Tensor, L: torch.Tensor) -> float:
    """Success of the greedy pair over uniformly drawn colours."""
    k = S.shape[0]
    return (L.argmax(-1)[S.argmax(-1)] == torch.arange(k)).float().mean().item()


def overlapping_features(k: int, overlap: float, dim: int, g: torch.Generator) -> torch.Tensor:
    """``[k, dim]`` unit rows with cosine ``overlap`` between any two: ``sqrt(overlap) u +
    sqrt(1 - overlap) e_x`` (``u`` common, ``e_x`` each row's own, orthonormal), then a random
    rotation of R^dim (``dim >= k + 1``)."""
    if not 0 <= overlap < 1 or dim < k + 1:
        raise ValueError(f"overlap {overlap} must be in [0, 1) and dim {dim} at least k + 1")
    phi = torch.zeros(k, dim)
    phi[:, 0] = overlap ** 0.5
    phi[:, 1:k + 1] = torch.eye(k) * (1 - overlap) ** 0.5
    rotation, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g))
    return phi @ rotation


def train(seed: int, *, mode: str, kind: str, coef: float, k: int, steps: int, batch: int,
          lr: float, epochs: int, init: float, shared: float = 0.0, clip: float = 0.2,
          overlap: float = 0.0, dim: int = 0) -> float:
    g = torch.Generator().manual_seed(seed)
    phi = overlapping_features(k, overlap, dim or k + 1, g) if overlap or dim else None
    if phi is None:  # a table per input: a shared bias plus each input's own logits
        weights = [(torch.randn(1, k, generator=g) * shared
                    + torch.randn(k, k, generator=g) * init).requires_grad_() for _ in range(2)]
    else:
        weights = [(torch.randn(phi.shape[1], k, generator=g) * init).requires_grad_()
                   for _ in range(2)]

    def tables() -> tuple[torch.Tensor, torch.Tensor]:
        """(speaker, listener) logits ``[k, k]``, one row per input."""
        if phi is None:
            return weights[0], weights[1]
        return phi @ weights[0], phi @ weights[1]

    opt = torch.optim.Adam(weights, lr=lr)
    for _ in range(steps):
        S, L = tables()
        if mode == "exact":
            J = (S.softmax(-1) * L.softmax(-1).T).sum() / k
            if coef:
                J = J + coef * (regulariser(S, kind).mean() + regulariser(L, kind).mean())
            opt.zero_grad()
            (-J).backward()
            opt.step()
            continue
        with torch.no_grad():
            c = torch.randint(k, (batch,), generator=g)
            m = torch.multinomial(S[c].softmax(-1), 1, generator=g).squeeze(1)
            y = torch.multinomial(L[m].softmax(-1), 1, generator=g).squeeze(1)
            r = (y == c).float()
            a_batch = normalize(r, torch.zeros_like(c), 1)
            a_s = a_batch + normalize(r, c, k)
            a_l = a_batch + normalize(r, m, k)
            old_s = S[c].log_softmax(-1).gather(1, m[:, None]).squeeze(1)
            old_l = L[m].log_softmax(-1).gather(1, y[:, None]).squeeze(1)
        for _ in range(epochs):
            S, L = tables()
            loss = 0.0
            for table, rows, act, old, adv in ((S, c, m, old_s, a_s), (L, m, y, old_l, a_l)):
                lp = table[rows].log_softmax(-1).gather(1, act[:, None]).squeeze(1)
                ratio = (lp - old).exp()
                loss = loss - torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
                if coef:
                    loss = loss - coef * regulariser(table[rows], kind).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return greedy_success(*tables())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("exact", "sampled"), default="exact")
    ap.add_argument("--arms", nargs="+", default=["none", "entropy:0.05", "mutation:0.05"],
                    help="none, entropy:C or mutation:C")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--steps", type=int, default=None, help="default: exact 500, sampled 250")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--init", type=float, default=1.0, help="std of each input's own logits")
    ap.add_argument("--shared", type=float, default=0.0,
                    help="std of the initial bias shared by every input")
    ap.add_argument("--overlap", type=float, default=0.0,
                    help="features with this cosine between inputs instead of tables")
    ap.add_argument("--dim", type=int, default=0, help="their dimension (default k + 1)")
    args = ap.parse_args()
    steps = args.steps or (500 if args.mode == "exact" else 250)
    print(f"{args.mode}, k={args.k}, {steps} steps, lr {args.lr}, init {args.init}, "
          f"shared {args.shared}, overlap {args.overlap}, dim {args.dim or args.k + 1}, "
          f"{args.seeds} seeds")
    print("| arm | full code | greedy success per seed |")
    print("|---|---|---|")
    for arm in args.arms:
        kind, _, c = arm.partition(":")
        coef = float(c) if c else 0.0
        if kind not in ("none", "entropy", "mutation"):
            raise SystemExit(f"unknown arm {arm!r}; use none, entropy:C or mutation:C")
        res = [train(s, mode=args.mode, kind=kind, coef=coef, k=args.k, steps=steps,
                     batch=args.batch, lr=args.lr, epochs=args.epochs, init=args.init,
                     shared=args.shared, overlap=args.overlap, dim=args.dim)
               for s in range(args.seeds)]
        full = sum(x == 1.0 for x in res)
        print(f"| {arm} | {full}/{len(res)} | {' '.join(f'{x:.2f}' for x in res)} |")


if __name__ == "__main__":
    main()

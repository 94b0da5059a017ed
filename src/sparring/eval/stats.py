"""Win-rate intervals and Elo ratings for match results.

* Wilson score interval (Wilson, 1927) for a binomial proportion k/n at z (1.96 = 95%):
  (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n).
* Elo ratings as the maximum-likelihood Bradley-Terry fit (a draw counts half a win):
  P(i beats j) = g_i / (g_i + g_j), rating_i = 400 log10 g_i, solved with the MM iteration
  of Hunter (2004): g_i <- W_i / sum_j n_ij / (g_i + g_j). Each player also gets ``prior``
  virtual draws against a fixed opponent of strength 1, so perfect records stay finite.
  Ratings are shifted to have mean ``base``. Order-independent, unlike online Elo updates.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes out of n; (0, 1) when n == 0."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def elo_ratings(outcomes: Iterable[tuple[str, str, float]], prior: float = 1.0,
                base: float = 1000.0, iters: int = 10_000, tol: float = 1e-10) -> dict[str, float]:
    """Bradley-Terry Elo from ``(i, j, score_of_i)`` outcomes (score 1, 0.5 or 0)."""
    if prior < 0:
        raise ValueError(f"elo prior must be >= 0, got {prior}")
    wins: dict[str, float] = defaultdict(float)
    games: dict[tuple[str, str], float] = defaultdict(float)
    for i, j, s in outcomes:
        if not 0.0 <= s <= 1.0 or i == j:
            raise ValueError(f"bad outcome {(i, j, s)!r}: need i != j and 0 <= score <= 1")
        wins[i] += s
        wins[j] += 1.0 - s
        games[(i, j)] += 1.0
        games[(j, i)] += 1.0
    names = sorted(wins)
    if not names:
        return {}
    opp: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for (i, j), n in games.items():
        opp[i].append((j, n))
    g = dict.fromkeys(names, 1.0)
    for _ in range(iters):
        new = {}
        for i in names:
            den = sum(n / (g[i] + g[j]) for j, n in opp[i]) + prior / (g[i] + 1.0)
            num = wins[i] + prior / 2
            if num <= 0:
                raise ValueError(f"elo: {i!r} never scored; use prior > 0")
            new[i] = num / den
        delta = max(abs(math.log(new[i] / g[i])) for i in names)
        g = new
        if delta < tol:
            break
    r = {i: 400.0 * math.log10(g[i]) for i in names}
    shift = base - sum(r.values()) / len(r)
    return {i: v + shift for i, v in r.items()}

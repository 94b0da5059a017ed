"""FrozenLake as text: walk from S to G over frozen cells F without falling into a hole H.

Rules as in Gymnasium's FrozenLake: actions ``up down left right``; a move off the grid
leaves the agent in place; reaching G gives reward 1 and ends the episode, a hole ends it
with 0. With ``slippery=True`` the agent moves as intended with probability
``1 - slip_prob`` and otherwise to one of the two perpendicular directions (equally
likely); Gymnasium's ``is_slippery`` is ``slip_prob = 2/3``. After ``max_steps`` moves the
episode is *truncated* (``info["truncated"] = True``, reward 0).

Maps: a fixed ``layout`` (rows of ``SFHG``), else a map of ``size`` drawn from the seed
(start top-left, goal bottom-right, each other cell frozen with probability ``p_frozen``,
redrawn until G is reachable). ``state_key()`` is the position ``"r,c"`` (states repeat
within an episode group: the anchor-state test bed of GiGPO, Feng et al. 2025).
"""

from __future__ import annotations

import random
from collections import deque

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import parse_choice

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ACTIONS = list(MOVES)
_PERP = {"up": ("left", "right"), "down": ("left", "right"),
         "left": ("up", "down"), "right": ("up", "down")}


def reachable(grid: list[str]) -> bool:
    """True when G can be reached from S without stepping on H (breadth-first search)."""
    n, m = len(grid), len(grid[0])
    start = next((r, c) for r in range(n) for c in range(m) if grid[r][c] == "S")
    seen, todo = {start}, deque([start])
    while todo:
        r, c = todo.popleft()
        if grid[r][c] == "G":
            return True
        for dr, dc in MOVES.values():
            q = (r + dr, c + dc)
            if 0 <= q[0] < n and 0 <= q[1] < m and q not in seen and grid[q[0]][q[1]] != "H":
                seen.add(q)
                todo.append(q)
    return False


def random_map(size: int, p_frozen: float, rng: random.Random) -> list[str]:
    for _ in range(10_000):
        cells = [["F" if rng.random() < p_frozen else "H" for _ in range(size)]
                 for _ in range(size)]
        cells[0][0], cells[-1][-1] = "S", "G"
        grid = ["".join(row) for row in cells]
        if reachable(grid):
            return grid
    raise ValueError(f"frozen_lake: no solvable {size}x{size} map with p_frozen={p_frozen}; "
                     "raise p_frozen")


class FrozenLake:
    """See the module docstring."""

    name = "frozen_lake"
    num_seats = 1

    def __init__(self, size: int = 4, layout: list[str] | None = None, p_frozen: float = 0.8,
                 slippery: bool = False, slip_prob: float = 2 / 3, max_steps: int = 20):
        if layout is not None:
            _check_layout(layout)
        if not 2 <= size <= 12:
            raise ValueError(f"frozen_lake: size={size}; must be in 2..12")
        if not 0.0 < p_frozen <= 1.0:
            raise ValueError(f"frozen_lake: p_frozen={p_frozen}; must be in (0, 1]")
        if not 0.0 <= slip_prob <= 1.0:
            raise ValueError(f"frozen_lake: slip_prob={slip_prob}; must be in [0, 1]")
        if max_steps < 1:
            raise ValueError(f"frozen_lake: max_steps={max_steps}; must be >= 1")
        self.layout = list(layout) if layout is not None else None
        self.size, self.p_frozen, self.max_steps = size, p_frozen, max_steps
        self.slip = slip_prob if slippery else 0.0
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.grid = self.layout or random_map(self.size, self.p_frozen, self.rng)
        self.pos = next((r, c) for r, row in enumerate(self.grid) for c, ch in enumerate(row)
                        if ch == "S")
        self.steps, self._done, self._ret = 0, False, 0.0

    def current_seat(self) -> int | None:
        return None if self._done else 0

    def system_prompt(self, seat: int) -> str:
        slip = " The ice is slippery: moves may go sideways." if self.slip else ""
        return ("Walk from S to G on the frozen lake; H is a hole, P is you. Moves: up, down, "
                f"left, right.{slip} Reply with the move in <answer></answer>.")

    def observation(self, seat: int) -> str:
        rows = [list(row) for row in self.grid]
        rows[self.pos[0]][self.pos[1]] = "P"
        board = "\n".join("".join(r) for r in rows)
        return f"{board}\nsteps left: {self.max_steps - self.steps}"

    def legal_actions(self, seat: int) -> list[str] | None:
        return list(ACTIONS)

    def parse(self, seat: int, text: str) -> ParseResult:
        return parse_choice(text, ACTIONS)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("frozen_lake: step() after the episode ended; call reset(seed)")
        if action not in MOVES:
            raise ValueError(f"frozen_lake: action {action!r:.40}; legal: {', '.join(ACTIONS)}")
        move = action
        if self.slip and self.rng.random() < self.slip:
            move = self.rng.choice(_PERP[action])
        dr, dc = MOVES[move]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        if 0 <= r < len(self.grid) and 0 <= c < len(self.grid[0]):
            self.pos = (r, c)
        self.steps += 1
        cell = self.grid[self.pos[0]][self.pos[1]]
        reward = 1.0 if cell == "G" else 0.0
        info: dict = {"moved": move}
        self._done = cell in "GH"
        if not self._done and self.steps >= self.max_steps:
            self._done, info["truncated"] = True, True
        self._ret += reward
        return StepResult([reward], self._done, info)

    def state_key(self) -> str:
        return f"{self.pos[0]},{self.pos[1]}"

    def returns(self) -> list[float]:
        return [self._ret]


def _check_layout(layout: list[str]) -> None:
    if not layout or any(len(r) != len(layout[0]) for r in layout) or not layout[0]:
        raise ValueError("frozen_lake: layout must be non-empty rows of equal length")
    text = "".join(layout)
    if set(text) - set("SFHG") or text.count("S") != 1 or "G" not in text:
        raise ValueError("frozen_lake: layout uses S F H G only, with one S and at least one G")


@register_env("frozen_lake", family="task", source="FrozenLake (Gymnasium); GiGPO test bed")
def make_frozen_lake(**options) -> FrozenLake:
    return FrozenLake(**options)

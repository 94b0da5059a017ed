"""A small Sokoban: push every box onto a target.

Board in the usual XSB characters: ``#`` wall, `` `` floor, ``.`` target, ``$`` box,
``*`` box on target, ``@`` player, ``+`` player on target. Actions ``up down left right``;
walking into a wall, or pushing a box into a wall or another box, leaves the board
unchanged. Reward ``1`` when the last box reaches a target (the episode ends), minus
``step_penalty`` per move; after ``max_steps`` moves the episode is *truncated*
(``info["truncated"] = True``).

Levels: a fixed ``level`` (XSB rows), else one drawn from the seed by reverse play (as
Boxoban / gym-sokoban generate theirs): boxes start on targets and the player walks and
*pulls* boxes at random; every pull is undone by a push, so every level is solvable.
``state_key()`` is the player and box positions (Sokoban is a GiGPO test bed).
"""

from __future__ import annotations

import random
from collections import deque

from sparring.envs import register_env
from sparring.envs.base import ParseResult, StepResult
from sparring.envs.parsing import parse_choice
from sparring.envs.tasks.frozen_lake import ACTIONS, MOVES

Pos = tuple[int, int]


def parse_level(rows: list[str]) -> tuple[set[Pos], set[Pos], set[Pos], Pos]:
    """XSB rows -> (walls, targets, boxes, player)."""
    walls, targets, boxes, players = set(), set(), set(), []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch not in "# .$*@+":
                raise ValueError(f"sokoban: level character {ch!r}; use '# .$*@+'")
            p = (r, c)
            if ch == "#":
                walls.add(p)
            if ch in ".*+":
                targets.add(p)
            if ch in "$*":
                boxes.add(p)
            if ch in "@+":
                players.append(p)
    if len(players) != 1 or not boxes or len(boxes) != len(targets):
        raise ValueError("sokoban: a level needs one player and as many boxes as targets (>= 1)")
    return walls, targets, boxes, players[0]


def _connected(floor: set[Pos]) -> bool:
    start = next(iter(floor))
    seen, todo = {start}, deque([start])
    while todo:
        r, c = todo.popleft()
        for dr, dc in MOVES.values():
            q = (r + dr, c + dc)
            if q in floor and q not in seen:
                seen.add(q)
                todo.append(q)
    return len(seen) == len(floor)


def generate(size: int, n_boxes: int, n_walls: int, pulls: int, rng: random.Random
             ) -> tuple[set[Pos], set[Pos], set[Pos], Pos]:
    """A solvable level with a border of walls around a ``(size-2)^2`` room."""
    inner = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    border = {(r, c) for r in range(size) for c in range(size)} - set(inner)
    for _ in range(10_000):
        extra = set(rng.sample(inner, n_walls))
        floor = set(inner) - extra
        if not _connected(floor):
            continue
        cells = rng.sample(sorted(floor), n_boxes + 1)
        targets, player = set(cells[:n_boxes]), cells[-1]
        boxes = set(targets)
        for _ in range(pulls):
            dr, dc = rng.choice(list(MOVES.values()))
            nxt = (player[0] + dr, player[1] + dc)
            if nxt not in floor or nxt in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            if behind in boxes and rng.random() < 0.8:  # pull the box along
                boxes.remove(behind)
                boxes.add(player)
            player = nxt
        if boxes != targets:
            return border | extra, targets, boxes, player
    raise ValueError(f"sokoban: no level found for size={size} boxes={n_boxes} "
                     f"walls={n_walls} pulls={pulls}; use fewer walls or boxes")


class Sokoban:
    """See the module docstring."""

    name = "sokoban"
    num_seats = 1

    def __init__(self, size: int = 6, boxes: int = 1, walls: int = 2, pulls: int = 30,
                 level: list[str] | None = None, max_steps: int = 30, step_penalty: float = 0.0):
        if not 4 <= size <= 10:
            raise ValueError(f"sokoban: size={size}; must be in 4..10")
        if not 1 <= boxes <= 3:
            raise ValueError(f"sokoban: boxes={boxes}; must be in 1..3")
        if not 0 <= walls <= (size - 2) ** 2 - boxes - 2:
            raise ValueError(f"sokoban: walls={walls}; too many for size {size}")
        if pulls < 1 or max_steps < 1 or step_penalty < 0:
            raise ValueError("sokoban: pulls and max_steps must be >= 1, step_penalty >= 0")
        self.level = parse_level(level) if level is not None else None
        self.rows = len(level) if level else size
        self.cols = max(map(len, level)) if level else size
        self.size, self.n_boxes, self.n_walls, self.pulls = size, boxes, walls, pulls
        self.max_steps, self.step_penalty = max_steps, step_penalty
        self.reset(0)

    def reset(self, seed: int) -> None:
        if self.level is not None:
            walls, targets, boxes, player = self.level
        else:
            walls, targets, boxes, player = generate(self.size, self.n_boxes, self.n_walls,
                                                     self.pulls, random.Random(seed))
        self.walls, self.targets = frozenset(walls), frozenset(targets)
        self.boxes, self.player = set(boxes), player
        self.steps, self._done, self._ret = 0, False, 0.0

    def current_seat(self) -> int | None:
        return None if self._done else 0

    def system_prompt(self, seat: int) -> str:
        return ("Sokoban: push every box ($) onto a target (.). # wall, @ you, * box on target. "
                "Moves: up, down, left, right. Reply with the move in <answer></answer>.")

    def observation(self, seat: int) -> str:
        out = []
        for r in range(self.rows):
            row = []
            for c in range(self.cols):
                p = (r, c)
                if p in self.walls:
                    ch = "#"
                elif p in self.boxes:
                    ch = "*" if p in self.targets else "$"
                elif p == self.player:
                    ch = "+" if p in self.targets else "@"
                else:
                    ch = "." if p in self.targets else " "
                row.append(ch)
            out.append("".join(row).rstrip())
        return "\n".join(out) + f"\nsteps left: {self.max_steps - self.steps}"

    def legal_actions(self, seat: int) -> list[str] | None:
        return list(ACTIONS)

    def parse(self, seat: int, text: str) -> ParseResult:
        return parse_choice(text, ACTIONS)

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("sokoban: step() after the episode ended; call reset(seed)")
        if action not in MOVES:
            raise ValueError(f"sokoban: action {action!r:.40}; legal: {', '.join(ACTIONS)}")
        dr, dc = MOVES[action]
        nxt = (self.player[0] + dr, self.player[1] + dc)
        pushed = False
        if not self._blocked(nxt):
            if nxt in self.boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if not self._blocked(beyond) and beyond not in self.boxes:
                    self.boxes.remove(nxt)
                    self.boxes.add(beyond)
                    self.player, pushed = nxt, True
            else:
                self.player = nxt
        self.steps += 1
        solved = self.boxes == self.targets
        reward = (1.0 if solved else 0.0) - self.step_penalty
        info: dict = {"pushed": pushed, "solved": solved}
        self._done = solved
        if not solved and self.steps >= self.max_steps:
            self._done, info["truncated"] = True, True
        self._ret += reward
        return StepResult([reward], self._done, info)

    def _blocked(self, p: Pos) -> bool:  # a wall, or off the board
        return p in self.walls or not (0 <= p[0] < self.rows and 0 <= p[1] < self.cols)

    def state_key(self) -> str:
        boxes = ";".join(f"{r},{c}" for r, c in sorted(self.boxes))
        return f"p{self.player[0]},{self.player[1]}|b{boxes}"

    def returns(self) -> list[float]:
        return [self._ret]


@register_env("sokoban", family="task", source="Sokoban (Boxoban-style reverse generation); GiGPO")
def make_sokoban(**options) -> Sokoban:
    return Sokoban(**options)

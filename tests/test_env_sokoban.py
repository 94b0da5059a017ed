from collections import deque

import pytest

from sparring.envs import make

STEP = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def read(obs):
    """Board text -> (walls, targets, boxes, player), parsed here."""
    walls, targets, boxes, player = set(), set(), set(), None
    for r, row in enumerate(obs.split("\n")[:-1]):
        for c, ch in enumerate(row):
            if ch == "#":
                walls.add((r, c))
            if ch in ".*+":
                targets.add((r, c))
            if ch in "$*":
                boxes.add((r, c))
            if ch in "@+":
                player = (r, c)
    return walls, targets, boxes, player


def solve(walls, targets, boxes, player, limit=200_000):
    """Breadth-first search over (player, boxes): the shortest push solution or None."""
    start = (player, frozenset(boxes))
    prev, todo = {start: None}, deque([start])
    while todo and len(prev) < limit:
        state = todo.popleft()
        p, bs = state
        if bs == targets:
            path = []
            while prev[state] is not None:
                state, move = prev[state]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in STEP.items():
            q = (p[0] + dr, p[1] + dc)
            if q in walls:
                continue
            nb = bs
            if q in bs:
                beyond = (q[0] + dr, q[1] + dc)
                if beyond in walls or beyond in bs:
                    continue
                nb = (bs - {q}) | {beyond}
            nxt = (q, nb)
            if nxt not in prev:
                prev[nxt] = (state, move)
                todo.append(nxt)
    return None


def test_fixed_level_push_and_block():
    env = make("sokoban", level=["#####", "#@$.#", "#####"])
    env.reset(0)
    assert env.observation(0) == "#####\n#@$.#\n#####\nsteps left: 30"
    assert env.state_key() == "p1,1|b1,2"
    res = env.step("right")
    assert res.done and res.rewards == [1.0] and res.info["pushed"]
    assert env.observation(0).startswith("#####\n# @*#")
    assert env.state_key() == "p1,2|b1,3"

    env = make("sokoban", level=["#####", "#.@$#", "#####"], max_steps=3, step_penalty=0.1)
    env.reset(0)
    res = env.step("right")  # box against the wall: nothing moves
    assert env.state_key() == "p1,2|b1,3" and not res.info["pushed"]
    assert res.rewards == pytest.approx([-0.1])
    env.step("left")  # the player stands on the target
    assert env.observation(0).startswith("#####\n#+ $#")
    res = env.step("up")  # wall
    assert res.done and res.info["truncated"] and env.returns() == pytest.approx([-0.3])


@pytest.mark.parametrize("opts,seeds", [({}, 80), ({"boxes": 2, "size": 6}, 20),
                                        ({"size": 7, "walls": 4}, 20)])
def test_generated_levels_solvable(opts, seeds):
    env = make("sokoban", max_steps=200, **opts)
    lengths = []
    for seed in range(seeds):
        env.reset(seed)
        walls, targets, boxes, player = read(env.observation(0))
        assert len(boxes) == len(targets) == opts.get("boxes", 1) and boxes != targets
        path = solve(walls, targets, boxes, player)
        assert path, f"seed {seed} unsolvable"
        lengths.append(len(path))
        for i, move in enumerate(path):  # replay through the env
            res = env.step(move)
            assert res.done == (i == len(path) - 1)
        assert res.rewards == [1.0] and env.returns() == [1.0]
    assert max(lengths) >= 4


def test_deterministic_and_options():
    a, b = make("sokoban"), make("sokoban")
    a.reset(7)
    b.reset(7)
    assert a.observation(0) == b.observation(0) and a.state_key() == b.state_key()
    assert a.parse(0, "<answer>UP</answer>").action == "up"
    assert a.parse(0, "").status == "unparsable"
    for opts in ({"size": 3}, {"boxes": 4}, {"walls": 50}, {"level": ["#@$#"]},
                 {"level": ["#@$.#", "#x  #"]}):
        with pytest.raises(ValueError, match="sokoban"):
            make("sokoban", **opts)


def test_impossible_generation_is_an_error():
    with pytest.raises(ValueError, match="sokoban: no level"):
        make("sokoban", size=4, boxes=2, walls=0, pulls=1)

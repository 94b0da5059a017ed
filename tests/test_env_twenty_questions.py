import math
import random

import pytest

from sparring.envs import make
from sparring.envs.tasks.twenty_questions import ATTRIBUTES, OBJECTS


def test_table_is_sound():
    vectors = {tuple(a in attrs for a in ATTRIBUTES) for attrs in OBJECTS.values()}
    assert len(vectors) == len(OBJECTS)  # every object differs in some attribute
    assert all(attrs <= set(ATTRIBUTES) for attrs in OBJECTS.values())
    bare = {a.split()[-1] if a.split()[0] in ("a", "an") else a for a in ATTRIBUTES}
    assert not bare & set(OBJECTS)


def test_hand_checked_answers():
    env = make("twenty_questions", objects=["whale", "shark"])
    seen = set()
    for seed in range(10):
        env.reset(seed)
        res = env.step("is it a mammal?")
        whale = res.info["answer"] == "yes"
        assert res.rewards == [0.0] and not res.done
        # both are alive animals in water, bigger than a person; neither flies
        assert env.step("is it found in water?").info["answer"] == "yes"
        assert env.step("is it able to fly?").info["answer"] == "no"
        assert env.observation(0) == ("a mammal? " + ("yes" if whale else "no")
                                      + "\nfound in water? yes\nable to fly? no\nquestions left: 17")
        wrong, right = ("is it a shark?", "is it a whale?") if whale else ("is it a whale?",
                                                                        "is it a shark?")
        res = env.step(wrong)
        assert res.info["answer"] == "no" and res.rewards == [0.0] and not res.done
        res = env.step(right)
        assert res.done and res.rewards == [1.0] and res.info["correct"]
        seen.add(whale)
    assert seen == {True, False}


def test_halving_strategy_always_wins():
    """Ask the attribute that splits the remaining candidates most evenly, then guess."""
    env = make("twenty_questions")
    bound = math.ceil(math.log2(len(OBJECTS))) + 1
    found = set()
    for seed in range(150):
        env.reset(seed)
        cands = list(OBJECTS)
        for _ in range(bound):
            if len(cands) == 1:
                res = env.step(f"is it {'an' if cands[0][0] in 'aeiou' else 'a'} {cands[0]}?")
                break
            attr = min(ATTRIBUTES, key=lambda a: abs(sum(a in OBJECTS[o] for o in cands)
                                                    - len(cands) / 2))
            yes = env.step(f"is it {attr}?").info["answer"] == "yes"
            cands = [o for o in cands if (attr in OBJECTS[o]) == yes]
        assert res.done and res.rewards == [1.0]
        found.add(cands[0])
    assert len(found) >= 18  # the seeds reach (nearly) every object


def test_uniform_random_play_wins_at_the_closed_form_rate():
    """A uniformly random legal move guesses right with probability 1/k a turn over the k =
    12 + 22 legal moves, so over q = 20 questions it wins p = 1 - (1 - 1/k)^q of episodes
    in p k turns on average: the chance level the twenty questions cards compare against."""
    env = make("twenty_questions")
    k = len(ATTRIBUTES) + len(OBJECTS)
    rng, n, wins, turns = random.Random(0), 6000, 0, 0
    for seed in range(n):
        env.reset(seed)
        while (seat := env.current_seat()) is not None:
            legal = env.legal_actions(seat)
            assert len(legal) == k
            env.step(rng.choice(legal))
            turns += 1
        wins += env.returns()[0] == 1.0
    p_win = 1 - (1 - 1 / k) ** env.max_questions
    se = math.sqrt(p_win * (1 - p_win) / n)
    assert abs(wins / n - p_win) < 4 * se  # 0.450 within about 0.026
    assert abs(turns / n - p_win * k) < 0.3  # 15.3 turns


def test_budget_runs_out():
    env = make("twenty_questions", max_questions=3)
    env.reset(0)
    results = [env.step("is it alive?") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert env.returns() == [0.0] and "truncated" not in results[-1].info
    with pytest.raises(RuntimeError):
        env.step("is it alive?")


def test_parse():
    env = make("twenty_questions")
    assert env.parse(0, "Is it an Animal?").action == "is it an animal?"
    assert env.parse(0, "IS   IT A DOG").action == "is it a dog?"
    assert env.parse(0, "is it the horse?").action == "is it a horse?"
    assert env.parse(0, "is it an airplane").action == "is it an airplane?"
    assert env.parse(0, "is it a mammal").action == "is it a mammal?"
    assert env.parse(0, "is it alive? no wait, is it a dog?").action == "is it a dog?"
    assert env.parse(0, "is it a cat?").status == "unparsable"
    assert env.parse(0, "is it a dogfish?").status == "unparsable"
    assert env.parse(0, "dog").status == "unparsable"
    assert len(env.legal_actions(0)) == len(ATTRIBUTES) + len(OBJECTS)
    with pytest.raises(ValueError, match="twenty_questions"):
        make("twenty_questions", objects=["unicorn"])
    with pytest.raises(ValueError, match="twenty_questions"):
        make("twenty_questions", max_questions=0)

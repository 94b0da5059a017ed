"""Single-agent tasks: arithmetic and countdown (verifiable, single-turn), FrozenLake and
Sokoban (grid worlds whose states repeat), twenty questions (a rule-based oracle) and a
calculator tool task. Each module registers its environments; build them with
``sparring.envs.make(name, **options)``. `safe_eval` is the `ast`-based evaluator."""

"""A plugin that registers Gymnasium's FrozenLake (through the adapter) as `gym_frozen_lake`.

    .venv/bin/sparring train examples/gymnasium_frozen_lake.yaml

The recipe names this file under `plugins:`, so it is imported before the config is
checked; `sparring train --plugin examples/gymnasium_frozen_lake.py ...` does the same for
any recipe. Needs `pip install 'sparring[gymnasium]'`.
"""

import gymnasium as gym

from sparring.envs import register_env
from sparring.envs.adapters.gymnasium import GymnasiumEnv

ACTIONS = ["left", "down", "right", "up"]  # Gymnasium's FrozenLake actions 0..3


@register_env("gym_frozen_lake", family="task", source="Gymnasium FrozenLake-v1 (adapter)")
def make_gym_frozen_lake(map_name: str = "4x4", slippery: bool = False) -> GymnasiumEnv:
    """FrozenLake-v1: the map with P where you stand (observation -> text); moves by name."""
    lake = gym.make("FrozenLake-v1", map_name=map_name, is_slippery=slippery)
    rows = ["".join(c.decode() for c in row) for row in lake.unwrapped.desc]

    def lake_text(cell: int) -> str:  # Gymnasium's observation: the cell index
        r, c = divmod(int(cell), len(rows[0]))
        return "\n".join(row if i != r else row[:c] + "P" + row[c + 1:]
                         for i, row in enumerate(rows))

    return GymnasiumEnv(lake, lake_text, action_to_text=ACTIONS)

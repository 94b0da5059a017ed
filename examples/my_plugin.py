"""A plugin: your own advantage estimator, registered with the catalogue's decorator.

    .venv/bin/sparring train --plugin examples/my_plugin.py kuhn_selfplay \
        algorithm.estimator=median_baseline algorithm.estimator_options={}

`--plugin` (a module name on the path, or a .py file) is imported before the config is
checked, so the config may name what it registers; the run's config.yaml records it under
`plugins:` (resume, eval, play and export import it again). Environments
(`sparring.envs.register_env`), objectives (`sparring.objectives.objective`) and shapers
(`sparring.advantages.shaping.shaper`) register the same way.
"""

import torch

from sparring.advantages import estimator
from sparring.data import TurnBatch
from sparring.segments import compact_ids, segment_median


@estimator("median_baseline", family="group", needs=("group",),
           source="an example plugin (Sparring README)")
def median_baseline(batch: TurnBatch, *, scale: float = 1.0) -> torch.Tensor:
    """A_i = scale (R_i - median_g R): the group's median return (the mean of the two middle
    ones for an even count) as the baseline, broadcast to the row's action tokens.
    Shapes: returns [n_rows, T], zero outside the action mask."""
    r = batch.returns.float()
    group, n = compact_ids(batch.group)
    return (scale * (r - segment_median(r, group, n)[group]))[:, None] * batch.action_mask

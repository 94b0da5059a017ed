"""The composition root: a run's parts built from its config.

`build_parts` (`sparring.assembly.parts`) makes the model, the rollouts and the evaluation;
`build` (`sparring.assembly.run`) adds the Ray rollout workers when the config asks for them;
`load_policy` (`sparring.assembly.trained`) rebuilds a trained policy from a run folder.
Everything below (config, catalogue, envs, policy, rollout, eval, train, distributed) is
put together here and nowhere else.
"""

from sparring.assembly.parts import RunParts, build_parts, load_model
from sparring.assembly.run import build

__all__ = ["RunParts", "build", "build_parts", "load_model"]

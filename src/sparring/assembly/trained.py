"""Load a trained policy back from a run folder or one of its checkpoints (for eval, play).

``RUN_DIR`` takes its latest checkpoint; ``RUN_DIR/checkpoints/step-N`` that one. The model
is rebuilt from the run's ``config.yaml`` and its weights (or LoRA adapter) are loaded from
safetensors; nothing is unpickled. A run with several ``policies`` holds one per policy:
``load_policy(..., policy=NAME)`` rebuilds that one (its own ``model`` and ``lora``; an
adapter of a shared base comes back as a single-adapter model over a fresh base),
`load_policies` all of them. A run folder is data, not code (`sparring.config.run_folder.read_run_config`):
its config's ``model.trust_remote_code`` is ignored (with a warning) and its ``plugins``
are not imported unless the caller passes ``trust_remote_code=True`` (the command line's
``--trust-remote-code``), so a folder with an ``auto_map`` and a Python file, or a plugin
path, cannot run that file. Plugins the user names on the command line (``--plugin``) are
imported by the command before the folder is read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from sparring.assembly.run import load_model
from sparring.config import Config, policy_config
from sparring.config.run_folder import read_run_config
from sparring.policy.feature_cache import FeatureCache, attach_feature_cache
from sparring.policy.heads import FrozenFeatures, build_head
from sparring.policy.hf import HFPolicy, device_unavailable
from sparring.policy.lora import apply_lora, load_parameters, load_trainable_state
from sparring.storage.folders import CheckpointError
from sparring.train.checkpoint import (
    checkpoint_meta,
    latest_intact_checkpoint,
    load_checkpoint,
    load_weights,
    verify_checkpoint,
)
from sparring.train.policies import FROZEN_SHA256, state_key

log = logging.getLogger(__name__)


def find_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) for a run folder or a checkpoint folder; a checkpoint
    folder named directly is verified as a whole (`verify_checkpoint`: no fallback)."""
    p = Path(path)
    if os.path.lexists(p / "state.json"):
        verify_checkpoint(p)
        return p.parent.parent, p
    ckpt = latest_intact_checkpoint(p)  # a damaged newest one is skipped with a warning
    if ckpt is None:
        raise FileNotFoundError(f"{p} is neither a checkpoint nor a run folder with an intact "
                                "checkpoint")
    return p, ckpt


def check_policy_name(cfg: Config, policy: str | None) -> None:
    """``policy`` names one of a multi-policy run's ``policies``, and is None for a run
    with one policy (`ValueError` naming ``--policy`` otherwise)."""
    names = list(cfg.policies)
    if policy is None and names:
        raise ValueError(f"--policy: this run trains several policies ({', '.join(names)}); "
                         "name one")
    if policy is not None and policy not in names:
        why = (f"it trains {', '.join(names)}" if names else
               "it trains one policy (no `policies` in its config): leave --policy out")
        raise ValueError(f"--policy: the run has no policy {policy!r}; {why}")


def load_policy(path: str | Path, device: str | None = None, *, trust_remote_code: bool = False,
                policy: str | None = None, average: bool = False) -> tuple[HFPolicy, Config, Path]:
    """The policy saved at ``path`` (a run folder or checkpoint), its config and checkpoint;
    ``policy``: which one of a run with several (required there, see `check_policy_name`);
    ``average``: the run's magnet instead (`load_magnet`). The model's own code runs only
    with ``trust_remote_code`` (see the module docstring). ``device``: where it runs
    (default: the run's ``model.device``, which must exist on this machine)."""
    cfg = read_run_config(_config_file(path), trust_remote_code=trust_remote_code)
    check_policy_name(cfg, policy)
    pcfg = cfg if policy is None else policy_config(cfg, policy)
    device = device or pcfg.model.device
    why = device_unavailable(device)
    if why and device == pcfg.model.device:
        raise ValueError(f"the run's model.device is {device!r}, but {why}: load it on "
                         "another device (device='cpu'; --device cpu for sparring eval "
                         "and play)")
    if why:
        raise ValueError(f"device {device!r}: {why}")
    run, ckpt = find_checkpoint(path)  # verified whole: its files are read once more below
    if average and not (pcfg.algorithm.kl.reference == "magnet" and pcfg.algorithm.kl.coef):
        raise ValueError("--average: this run has no average policy to load (it is the "
                         "magnet of algorithm.kl.reference=magnet with a coef above 0; "
                         f"this run has reference={pcfg.algorithm.kl.reference!r}, "
                         f"coef={pcfg.algorithm.kl.coef})")
    suffix = "" if policy is None else f".{policy}"
    model, tok = load_model(pcfg)
    if pcfg.lora.enabled:
        model = apply_lora(model, pcfg.lora)
        load_trainable_state(model, load_weights(ckpt, f"adapter{suffix}", verify=False))
    else:
        frozen = checkpoint_meta(ckpt).get(state_key(FROZEN_SHA256, policy))
        load_trainable_state(model, load_weights(ckpt, f"model{suffix}", verify=False),
                             frozen=frozen)
    if average:
        load_magnet(model, ckpt, policy)
    head = build_head(pcfg.model.head)
    if isinstance(head, FrozenFeatures) and head.transforms:
        load_feature_center(model, ckpt, head.cache, policy)
    loaded = HFPolicy(model, tok, device=device, seed=cfg.train.seed, decode=pcfg.model.decode,
                      name=f"{run.name}{'/' + policy if policy else ''}@{ckpt.name}"
                      f"{'/average' if average else ''}")
    return loaded, cfg, ckpt


def load_magnet(model: torch.nn.Module, ckpt: Path, policy: str | None = None) -> None:
    """Put the magnet's weights into ``model`` in place of the policy's: the EMA of the
    trained weights that ``algorithm.kl.reference=magnet`` pulls towards (R-NaD / MMD), an
    average of recent policies, which the learner's state in ``ckpt`` holds (its trained
    parameters only: the adapter with LoRA). In self-play it is often steadier than the
    last policy (docs/benchmarks.md: Kuhn poker)."""
    load_checkpoint(ckpt, {state_key("learner", policy): _MagnetInto(model, ckpt)}, verify=False)


def load_feature_center(model: torch.nn.Module, ckpt: Path, max_entries: int,
                        policy: str | None = None) -> None:
    """Give ``model`` the feature cache its run trained with, with the run's transform
    (``center``, ``whiten`` of the ``frozen_features`` head, `sparring.policy.feature_cache`):
    its head's change reads transformed features, so without it the loaded policy would
    not be the trained one."""
    features = FeatureCache(model, max_entries, center=True)
    load_checkpoint(ckpt, {state_key("learner", policy): _CenterInto(features, ckpt)},
                    verify=False)
    attach_feature_cache(model, features)


class _CenterInto:
    """Takes a learner's checkpoint state and loads its feature centering."""

    def __init__(self, features: FeatureCache, ckpt: Path) -> None:
        self.features, self.ckpt = features, ckpt

    def load_state_dict(self, state: dict) -> None:
        if "feature_center" not in state:
            raise CheckpointError(f"{self.ckpt} holds no feature transform (a run with "
                                  "model.head's center or whiten checkpointed before its "
                                  "first step?)")
        self.features.load_center_state(state["feature_center"])


class _MagnetInto:
    """Takes a learner's checkpoint state (`Learner.state_dict`) and loads its magnet into
    ``model``."""

    def __init__(self, model: torch.nn.Module, ckpt: Path) -> None:
        self.model, self.ckpt = model, ckpt

    def load_state_dict(self, state: dict) -> None:
        if "magnet" not in state:
            raise CheckpointError(f"{self.ckpt} holds no magnet weights (a checkpoint from "
                                  "before the run had a magnet?)")
        try:
            load_parameters(self.model, state["magnet"])
        except KeyError as e:
            raise CheckpointError(f"{self.ckpt}: the magnet does not match the model: "
                                  f"{e.args[0]}") from None


def load_policies(path: str | Path, device: str | None = None, *,
                  trust_remote_code: bool = False, average: bool = False
                  ) -> tuple[dict[str, HFPolicy], Config, Path]:
    """Every policy of a run with several (``{name: policy}``, all from one checkpoint),
    its config and that checkpoint; ``{'': policy}`` for a run with one; ``average``: each
    one's magnet (`load_magnet`)."""
    cfg = read_run_config(_config_file(path), trust_remote_code=trust_remote_code)
    _, ckpt = find_checkpoint(path)
    out = {n or "": load_policy(ckpt, device, trust_remote_code=trust_remote_code, policy=n,
                                average=average)[0]
           for n in list(cfg.policies) or [None]}
    return out, cfg, ckpt


def _config_file(path: str | Path) -> Path:
    """The ``config.yaml`` of a run folder or of a checkpoint's run; `FileNotFoundError`
    naming the path, and the first few names its folder holds, when it does not exist;
    `NotADirectoryError` when it is a file."""
    p = Path(path)
    if not p.exists():
        there = sorted(x.name for x in p.parent.iterdir()) if p.parent.is_dir() else []
        listed = ", ".join(there[:10]) + (f" and {len(there) - 10} more" if len(there) > 10 else "")
        raise FileNotFoundError(f"{p}: no such run folder or checkpoint"
                                + (f"; {p.parent} holds {listed}" if there else ""))
    if not p.is_dir():
        raise NotADirectoryError(f"{p} is a file: give a run folder or a checkpoint folder")
    return (p.parent.parent if (p / "state.json").exists() else p) / "config.yaml"

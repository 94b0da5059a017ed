"""The opponent pool's snapshots on disk: one of each policy every ``league.every`` steps,
loaded and checked when the pool draws it, deleted once no one can need it.

Snapshots live in ``RUN_DIR/pool/step-NNNNNN`` and the pool records them relative to the
run folder (``pool/step-NNNNNN``), so a run folder can be moved or resumed from another
working directory (`run_relative` maps the records of older runs). Disk: at the start of
each step (the state a checkpoint or a crash checkpoint of the previous step saves) every
snapshot the pool no longer holds is deleted, except those the pool of a kept checkpoint
holds (the ``league.max`` newest before each checkpoint in ``RUN_DIR/checkpoints``), so
every kept checkpoint can resume; at most ``league.max + 1`` (the one the newest snapshot
replaced) plus ``league.max`` for each kept checkpoint. Temporaries of a snapshot write
that was killed (``*.tmp``) are removed on the first step, when the run folder is locked by
the training loop.

A snapshot is checked like a checkpoint (`sparring.storage.folders.verify_folder`): it
holds ``manifest.json`` (size and sha256 of each file, written last) and ``snapshot.json``,
which says it has one; loading a snapshot with a file missing, truncated or garbled, or its
manifest missing or malformed, is a `CheckpointError` naming the file and the problem. (A
snapshot without ``snapshot.json``, written before snapshots had manifests, loads with a
warning.)

Several policies: each has a pool of its own; a snapshot of policy P is
``pool/step-NNNNNN.P`` (its pool entry ``ckpt-N.P``), every ``league.every`` steps each
policy takes one, and the rules above hold per policy.

What a snapshot holds: the plain model the policy plays with (``model.safetensors``, LoRA
merged into its layers, and the tokenizer); with frozen weights (``model.head``
frozen_features) the trained ones alone (``trained.safetensors``, loaded into a copy of the live
model); with ``lora.shared_base`` the policy's adapter alone, in PEFT's format
(``adapter_config.json``, ``adapter_model.safetensors``: its LoRA weights), so a pool costs adapter-sized disk and memory. Such a snapshot loads as one more
adapter of the run's one model, frozen, named ``pool-step-NNNNNN-P``, and plays as an
`HFPolicy` on that model with ``adapter=`` its name; once its pool lets it go (dropped, or
evicted from the cache) the adapter is deleted, at the start of the next play (`release`:
the arena may still be playing it).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

from sparring.policy.feature_cache import attach_feature_cache, feature_cache_of
from sparring.policy.hf import HFPolicy
from sparring.policy.lora import (
    delete_adapter,
    has_frozen_weights,
    is_peft,
    load_frozen_adapter,
    load_parameters,
    merged_state,
    save_adapter,
    trainable_state,
)
from sparring.seeding import stable_seed
from sparring.storage.atomic import atomic_write_text
from sparring.storage.folders import (
    FORMAT,
    read_tensors,
    step_dirs,
    storage_error,
    verify_folder,
    write_manifest,
    write_tensors,
)

if TYPE_CHECKING:
    from sparring.config import Config
    from sparring.rollout.opponents import OpponentPool

_SNAPSHOT_RE = re.compile(r"^step-(\d+)(?:\.([A-Za-z][\w-]*))?$")  # .NAME: policy NAME's
TRAINED_FILE = "trained.safetensors"  # a snapshot of a model with frozen weights
SNAPSHOT_FILE = "snapshot.json"  # {"format", "step"}: says the snapshot has a manifest


def run_relative(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A pool state's checkpoint records with their paths relative to the run folder:
    runs saved before paths were relative recorded RUN_DIR/pool/step-N as given."""
    return [{**c, "path": f"pool/{Path(c['path']).name}"}
            if Path(c["path"]).parent.name == "pool" else c for c in checkpoints]


class SnapshotStore:
    """The snapshots of one run's ``policies`` (``{pool name: policy}``, ``{'': policy}``
    for a run's one policy) under ``RUN_DIR/pool``. ``step``: the step being played, which
    seeds the snapshots loaded during it (`seed`)."""

    def __init__(self, cfg: Config, run_dir: Path, policies: Mapping[str, HFPolicy]):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.policies = dict(policies)
        self.step = 0
        self._tidied = False
        self._unloaded: list[HFPolicy] = []  # snapshot adapters to delete (`release`)

    def load(self, path: str) -> HFPolicy:
        """The snapshot at ``path`` (relative to the run folder), checked against its
        manifest, sampling with `seed` and its policy's tokenizer (a pool's ``loader``)."""
        match = _SNAPSHOT_RE.match(Path(path).name)
        several = "" not in self.policies
        owner = match.group(2) if match and several else None  # several: its policy
        policy = self.policies[owner] if owner is not None else next(iter(self.policies.values()))
        verify_folder(self.run_dir / path, SNAPSHOT_FILE)  # CheckpointError if damaged
        if policy.adapter is not None:
            return self._load_adapter(path, policy)
        if (self.run_dir / path / TRAINED_FILE).is_file():
            return self._load_trained(path, policy)
        m = self.cfg.model
        if owner is not None:
            from sparring.config import policy_config

            m = policy_config(self.cfg, owner).model
        p = HFPolicy.from_pretrained(self.run_dir / path, device=m.device, dtype=m.dtype,
                                     seed=self.seed(path), name=Path(path).name)
        p.tokenizer = policy.tokenizer
        return p

    def _load_trained(self, path: str, policy: HFPolicy) -> HFPolicy:
        """A snapshot of the trained weights alone (`_save`): a copy of the live model (whose
        frozen weights are the snapshot's) with them loaded, reading the policy's cached
        features (`sparring.policy.feature_cache`)."""
        model = copy.deepcopy(policy.model)
        load_parameters(model, read_tensors(self.run_dir / path / TRAINED_FILE))
        p = HFPolicy(model, policy.tokenizer, device=policy.device, seed=self.seed(path),
                     name=Path(path).name, decode=policy.decode)
        attach_feature_cache(p.model, feature_cache_of(policy.model))
        return p

    def _load_adapter(self, path: str, policy: HFPolicy) -> HFPolicy:
        """An adapter snapshot of ``policy`` (module docstring) on its model, whose train or
        eval mode stays as it was."""
        model, name = policy.model, "pool-" + Path(path).name.replace(".", "-")
        training = model.training
        load_frozen_adapter(model, self.run_dir / path, name, policy.device)
        p = HFPolicy(model, policy.tokenizer, device=policy.device, seed=self.seed(path),
                     name=Path(path).name, adapter=name, decode=policy.decode)
        model.train(training)
        return p

    def unload(self, path: str, player: Any) -> None:
        """A snapshot its pool let go (a pool's ``unloader``): an adapter snapshot's adapter
        is deleted at the next `release` (a full snapshot's model goes with its player)."""
        policy = getattr(player, "policy", None)
        if getattr(policy, "adapter", None) is not None:
            self._unloaded.append(policy)

    def release(self, pools: Mapping[str, OpponentPool]) -> None:
        """Delete the adapters `unload` was given, but those ``pools`` have loaded again;
        called before a play draws its snapshots."""
        loaded = {getattr(p.policy, "adapter", None) for pool in pools.values()
                  for p in pool.loaded().values()}
        for policy in self._unloaded:
            if policy.adapter not in loaded and policy.adapter in policy.model.peft_config:
                delete_adapter(policy.model, policy.adapter)
        self._unloaded.clear()

    def seed(self, path: str) -> int:
        """A snapshot's sampling seed depends only on (step, snapshot), not on when it was
        loaded, so a resumed run (empty snapshot cache) samples as an uninterrupted one."""
        return stable_seed(self.cfg.train.seed, self.step, Path(path).name)

    def write(self, step: int, pools: Mapping[str, OpponentPool]) -> None:
        """Step ``step``'s snapshot of each policy, added to its pool, when one is due
        (every ``league.every`` steps from 1, with an env playing the pool)."""
        every = self.cfg.league.every
        if not every or step == 0 or step % every or not any(
                "pool" in s.opponents for s in self.cfg.envs):
            return
        for name, policy in self.policies.items():
            suffix = f".{name}" if name else ""
            folder = self.run_dir / "pool" / f"step-{step:06d}{suffix}"
            tmp = folder.with_name(folder.name + ".tmp")  # written whole, then renamed: a
            shutil.rmtree(tmp, ignore_errors=True)        # kill mid-save leaves no half one
            self._save(policy, tmp)
            atomic_write_text(tmp / SNAPSHOT_FILE, json.dumps({"format": FORMAT, "step": step}))
            write_manifest(tmp)
            shutil.rmtree(folder, ignore_errors=True)  # a resumed run rewrites its own snapshot
            tmp.rename(folder)
            pools[name].add_checkpoint(folder.relative_to(self.run_dir).as_posix(), step,
                                       f"ckpt-{step}{suffix}")

    @staticmethod
    def _save(policy: HFPolicy, folder: Path) -> None:
        """The weights ``policy`` plays with: its adapter alone on a shared base; the trained
        weights alone (`TRAINED_FILE`) of a model with frozen ones (``model.head``
        frozen_features: the frozen network is the run's own, so a snapshot is its head, 113 MB for
        SmolLM2-135M instead of 650 MB); else the plain model (LoRA adapters merged into
        their layers) and its tokenizer."""
        if policy.adapter is not None:
            save_adapter(policy.model, policy.adapter, folder)
            return
        if not is_peft(policy.model) and has_frozen_weights(policy.model):
            folder.mkdir(parents=True, exist_ok=True)
            write_tensors(folder / TRAINED_FILE, trainable_state(policy.model))
            return
        model = policy.model.get_base_model() if is_peft(policy.model) else policy.model
        try:
            model.save_pretrained(folder, state_dict=merged_state(model))
        except SafetensorError as e:  # a full disk: the OSError it stands for
            raise (storage_error(e, folder / "model.safetensors") or e) from e
        policy.tokenizer.save_pretrained(folder)

    def tidy(self, pools: Mapping[str, OpponentPool]) -> None:
        """Delete killed writes (``*.tmp``) and the snapshots no one can sample (see the
        module docstring): ``pools`` hold the live ones."""
        root = self.run_dir / "pool"
        if not root.is_dir():
            return
        if not self._tidied:
            for p in root.glob("*.tmp"):
                if not self._match(p.name):  # (policy tmp's snapshots stay)
                    shutil.rmtree(p, ignore_errors=True)
            self._tidied = True
        snaps = self._on_disk()
        live = {Path(c.path).name for pool in pools.values() for c in pool.checkpoints}
        held = next(iter(pools.values())).max_checkpoints
        taken = sorted({s for s, _ in snaps})  # each policy's, once
        needed: set[int] = set()
        for kept in (s for s, _ in step_dirs(self.run_dir)):
            before = [s for s in taken if s < kept]  # a checkpoint's pool: the newest before it
            needed.update(before[-held:] if held else before)
        for step, folder in snaps:
            if folder.name not in live and step not in needed:
                shutil.rmtree(folder, ignore_errors=True)

    def _on_disk(self) -> list[tuple[int, Path]]:
        """(step, folder) of the snapshots on disk, oldest first."""
        root = self.run_dir / "pool"
        found = [(int(m.group(1)), p) for p in root.iterdir()
                 if p.is_dir() and (m := self._match(p.name))] if root.is_dir() else []
        return sorted(found)

    def _match(self, name: str) -> re.Match[str] | None:
        """The match of a snapshot folder ``name`` of this run's policies (``step-N``, or
        ``step-N.P`` for policy P of several), else None."""
        m = _SNAPSHOT_RE.match(name)
        return m if m and (m.group(2) or "") in self.policies else None

"""A run folder's saved config, read as data: it names no code that runs.

Without trust (the command line's ``--trust-remote-code`` off), its ``plugins`` are not
imported, ``model.trust_remote_code`` is turned off, and every code reference in an env
option must be one Sparring exposes (`sparring.plugins.check_reference`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparring.config.files import read_yaml
from sparring.config.overrides import ConfigError
from sparring.config.schema import Config, from_dict

log = logging.getLogger(__name__)


def read_run_config(path: str | Path, overrides: Sequence[str] = (), *,
                    trust_remote_code: bool = False) -> Config:
    """The config a run folder saved (``path``: its ``config.yaml``) plus ``overrides``, read
    as data: without ``trust_remote_code`` its ``plugins`` are not imported (they stay in
    ``cfg.plugins``; a name only they register is then an unknown name, and the error says
    how to load them), ``model.trust_remote_code`` is set to False, with a warning when
    the folder asked for it, and a code reference in an env option (an adapter's
    ``"module:attr"``) must be one Sparring exposes (`sparring.plugins.check_reference`):
    anything else is a ConfigError naming the option, raised before anything is imported
    or built; the config is then checked inside `sparring.plugins.untrusted`, so no
    reference or plugin it names resolves to code Sparring does not expose. With it, all
    of these are honoured."""
    data = read_yaml(path)
    if not (isinstance(data, dict) and isinstance(data.get("model"), dict) and data.get("envs")):
        raise ConfigError(f"{path} is empty or damaged: a run's config.yaml holds its model and "
                          "envs sections (as the run wrote it); restore it from a copy")
    return run_config_from_data(data, path, overrides, trust_remote_code=trust_remote_code)


def run_config_from_data(data: Any, path: str | Path, overrides: Sequence[str] = (), *,
                         trust_remote_code: bool = False) -> Config:
    """`read_run_config` of the YAML ``data`` read from ``path`` (named in errors), without
    its check that the sections of a run's config are there (a run of the Python API may
    have no ``envs``)."""
    from sparring.plugins import untrusted

    if trust_remote_code:
        cfg = from_dict(data, list(overrides))
        cfg.model.trust_remote_code = True
        return cfg
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must hold a mapping, got "
                          f"{type(data).__name__}")
    _refuse_code_references(data, path)
    saved: list[str] = []
    if data.get("plugins"):
        data = dict(data)
        listed = data.pop("plugins")
        saved = [str(x) for x in listed] if isinstance(listed, list) else [str(listed)]
    try:
        with untrusted():
            cfg = from_dict(data, list(overrides))
    except ConfigError as e:
        if not saved:
            raise
        raise ConfigError(f"{e} ({path} lists plugins {saved}, not imported from a run "
                          "folder: name them with --plugin, or pass --trust-remote-code)") \
            from None
    cfg.plugins = [*saved, *(p for p in cfg.plugins if p not in saved)]
    if cfg.model.trust_remote_code:
        log.warning("%s sets model.trust_remote_code: true; ignored (a run folder does not "
                    "run code unless you pass --trust-remote-code)", path)
    cfg.model.trust_remote_code = False
    return cfg


def _refuse_code_references(data: dict, path: str | Path) -> None:
    """ConfigError for the first env option of a run's saved config that names code
    Sparring does not expose (`sparring.envs.code_references`,
    `sparring.plugins.check_reference`); resolves nothing. A malformed ``envs`` or an
    unknown env name is left to the config check, which names it."""
    from sparring.envs import code_references
    from sparring.plugins import check_reference

    envs = data.get("envs")
    for i, env in enumerate(envs if isinstance(envs, list) else []):
        options = env.get("options") if isinstance(env, dict) else None
        if not isinstance(options, dict) or not isinstance(env.get("name"), str):
            continue
        try:
            refs = code_references(env["name"], options)
        except KeyError:  # an unknown env name: the config check names it
            continue
        for key, ref in refs.items():
            try:
                check_reference(ref, f"envs.{i}.options.{key} in {path}", trusted=False)
            except ValueError as e:
                raise ConfigError(str(e)) from None

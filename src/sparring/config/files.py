"""Recipe files: where a recipe name is looked up (`find_recipe`), YAML read with a size
guard (`read_yaml`) and a config written atomically (`save_config`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sparring.config.overrides import ConfigError, load_yaml_text

if TYPE_CHECKING:
    from sparring.config.schema import Config


def recipe_dirs() -> list[Path]:
    """Where recipe names are looked up: ./configs, then the checkout's configs/."""
    here = Path("configs")
    repo = Path(__file__).resolve().parents[3] / "configs"
    return [here] + ([repo] if repo.is_dir() and repo.resolve() != here.resolve() else [])


def find_recipe(name: str | Path | None) -> Path | None:
    """The YAML file of ``name``: a path, or a recipe name in `recipe_dirs` (``"default"``
    and None: configs/default.yaml, or None, the built-in defaults, when there is none)."""
    if name is None:
        name = "default"
    elif Path(name).is_file():
        return Path(name)
    for d in recipe_dirs():
        for cand in (d / f"{name}.yaml", d / name):
            if cand.is_file():
                return cand
    if name == "default":
        return None
    raise FileNotFoundError(f"no config {str(name)!r} (not a file, not configs/{name}.yaml)")


MAX_CONFIG_VALUES = 100_000  # far above any real config; a YAML alias bomb is far above it


def read_yaml(path: str | Path) -> Any:
    """The YAML document in ``path``. A `ConfigError` naming the file for what cannot be a
    config: bytes that are not UTF-8, a syntax error (with its line), nesting too deep for
    the parser, or more than `MAX_CONFIG_VALUES` values once aliases are expanded; and,
    before it is read, what is not a regular file of at most `MAX_CONFIG_BYTES`."""
    from sparring.storage.bounded import MAX_CONFIG_BYTES, FileLimitError, read_text_bounded
    try:
        text = read_text_bounded(path, MAX_CONFIG_BYTES, "config file")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except FileLimitError as e:
        raise ConfigError(str(e)) from None
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config") from None
    _check_size(data, path)
    return data


def _check_size(data: Any, path: str | Path) -> None:
    """ConfigError when ``data`` holds more than `MAX_CONFIG_VALUES` values, counting each
    use of a YAML alias (a shared object) again, as everything after loading would."""
    stack, seen = [data], 0
    while stack:
        x = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise ConfigError(f"{path}: more than {MAX_CONFIG_VALUES:,} values once its YAML "
                              "aliases are expanded; not a config")
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def save_config(cfg: Config, path: str | Path) -> None:
    """Write ``cfg`` as YAML atomically (a kill leaves the old file or the new one)."""
    from sparring.storage.atomic import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(asdict(cfg), sort_keys=False))

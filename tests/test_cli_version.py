"""``sparring --version``: the version of the installed package's metadata, whose one
source is pyproject.toml."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import sparring
from sparring.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def test_version_prints_the_package_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"sparring {sparring.__version__}\n"
    assert sparring.__version__ == importlib.metadata.version("sparring")


def test_version_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "sparring", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"sparring {sparring.__version__}"


def test_the_installed_metadata_is_this_trees_pyproject():
    """An install of this tree (``pip install -e .``, what scripts/setup.sh does) reports
    pyproject.toml's version; a stale install would report an older one."""
    dist = importlib.metadata.distribution("sparring")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if Path(url.removeprefix("file://")).resolve() != ROOT:
        pytest.skip(f"sparring is installed from {url or 'a wheel'}, not from this tree")
    assert dist.version == _pyproject_version()


def test_a_source_tree_that_was_never_installed_reads_pyproject(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert sparring._version() == _pyproject_version()

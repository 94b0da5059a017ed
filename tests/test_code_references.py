"""Code references in configs (``"module:attr"``): one resolver, `sparring.plugins`. A run
folder's config read without --trust-remote-code may name only the references Sparring
exposes: a reference into a Sparring module that walks out of it, or reaches one of
Sparring's own functions that imports or writes what its arguments name, runs nothing,
whichever command reads the folder; the example recipes' references still work, and the
flag lets a user's own module run."""

import sys
from pathlib import Path

import pytest
import yaml

from sparring.config import ConfigError
from tests.helpers import cli, one_line

pytest.importorskip("pettingzoo")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TEXT = "sparring.envs.adapters.pettingzoo:tictactoe_text"
SMALL = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
         "intermediate_size: 64}", "train.steps=1", "rollout.episodes_per_step=4",
         "envs.0.group_size=2", "train.epochs=1", "eval.games=2", "eval.at_start=false",
         "eval.every=0", "checkpoint.every=1", "logging.progress=false"]


def hostile_run(tmp_path: Path, env: str, env_kwargs: dict, *, obs_to_text: str = TEXT) -> Path:
    """A run folder (one empty checkpoint, so --resume gets as far as the config) whose
    PettingZoo env names ``env`` with ``env_kwargs``, shipping a module ``evilmod.py``
    that writes ``PWNED`` when imported."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "evilmod.py").write_text("open('PWNED', 'w').write('imported')\n")
    cfg = {"model": {"name": "tiny"},
           "envs": [{"name": "pettingzoo", "options": {
               "env": env, "env_kwargs": env_kwargs, "obs_to_text": obs_to_text}}]}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


COMMANDS = [["eval"], ["play"], ["export", "OUT"], ["train", "--resume"]]
ATTACKS = {
    "os.system": ("sparring.plugins:os.system", {"command": "touch PWNED"}),
    "private importer": ("sparring.plugins:_import_module", {"name": "evilmod"}),
    "public importer": ("sparring.plugins:import_plugin", {"name": "evilmod"}),
    "extra importer": ("sparring.extras:import_extra",
                       {"module": "evilmod", "extra": "x", "needed_by": "y"}),
    "file writer": ("sparring.storage.atomic:atomic_write_text",
                    {"path": "PWNED", "text": "written"}),
}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_run_folder_reference_through_a_sparring_module_runs_nothing(
        attack, command, tmp_path, capsys, monkeypatch):
    """``sparring.plugins:os.system`` ran the command while the config was checked (the
    error came after), and ``sparring.plugins:_import_module`` imported the folder's own
    module; so do Sparring's public functions that import or write what their arguments
    name. Each is refused with one line naming the option, and nothing runs."""
    env, kwargs = ATTACKS[attack]
    run = hostile_run(tmp_path, env, kwargs)
    monkeypatch.chdir(run)  # the current directory is where a command would land
    monkeypatch.delitem(sys.modules, "evilmod", raising=False)
    args = [command[0], run, tmp_path / "out"] if command[0] == "export" else [*command, run]
    rc, _, err = cli(capsys, *args)
    assert rc == 2
    assert not (run / "PWNED").exists() and not (tmp_path / "PWNED").exists()
    assert "evilmod" not in sys.modules
    line = one_line(err)
    assert "envs.0.options.env" in line and repr(env) in line and "--trust-remote-code" in line


def test_the_python_resume_reads_the_folder_config_as_data(tmp_path, monkeypatch):
    """`sparring.train.loop.resume` without a config read the folder's config as a
    trusted one; now it refuses the same reference before building anything."""
    from sparring.train.loop import resume

    run = hostile_run(tmp_path, *ATTACKS["os.system"])
    monkeypatch.chdir(run)
    with pytest.raises(ConfigError, match=r"envs\.0\.options\.env .*sparring\.plugins:os\.system"):
        resume(run, None, lambda step: [])
    assert not (run / "PWNED").exists()


def test_an_obs_to_text_reference_out_of_sparring_is_refused(tmp_path, capsys, monkeypatch):
    """The text functions go through the same resolver: a dotted path through a module
    Sparring imports is no exposed reference."""
    run = hostile_run(tmp_path, "classic/tictactoe-v3", {},
                      obs_to_text="sparring.envs.adapters.pettingzoo:copy.copy")
    monkeypatch.chdir(run)
    rc, _, err = cli(capsys, "eval", run)
    assert rc == 2 and "envs.0.options.obs_to_text" in one_line(err)


def test_the_resolver_without_trust_looks_up_exposed_references_only(monkeypatch):
    """Exposed names resolve to the exposed objects; nothing else resolves, and checking
    imports nothing (a module named by the reference stays unimported)."""
    from sparring.envs.adapters import pettingzoo as pz
    from sparring.plugins import (
        UntrustedCodeError,
        check_reference,
        exposed_references,
        import_object,
        import_plugin,
        untrusted,
    )

    refs = exposed_references()
    assert {TEXT, "sparring.envs.adapters.pettingzoo:tictactoe_cells",
            "sparring.envs.adapters.pettingzoo:TICTACTOE_CELLS"} <= set(refs)
    assert all(r.startswith("sparring.") and not r.split(":")[1].startswith("_") for r in refs)
    assert import_object(TEXT, trusted=False) is pz.tictactoe_text
    assert import_object("sparring.envs.adapters.pettingzoo:TICTACTOE_CELLS",
                         trusted=False) is pz.TICTACTOE_CELLS
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    for ref in ("sparring.plugins:os.system", "sparring.plugins:_import_module",
                "sparring.plugins:import_plugin", "sparring.envs.adapters.pettingzoo:"
                "import_object", "sparring.envs.adapters.pettingzoo:copy", "os:system",
                "json.tool:main", "sparring.__main__:main"):
        with pytest.raises(UntrustedCodeError, match="--trust-remote-code"):
            import_object(ref, "opt", trusted=False)
        with pytest.raises(UntrustedCodeError):
            check_reference(ref, "opt", trusted=False)
        check_reference(ref, "opt", trusted=True)  # the form only: imports nothing either
    assert "json.tool" not in sys.modules and "sparring.__main__" not in sys.modules
    with untrusted():  # the scope a run folder's config is checked in
        with pytest.raises(UntrustedCodeError):
            import_object("os:system")
        with pytest.raises(ImportError, match="imports no plugin"):
            import_plugin("json")
        assert import_object(TEXT) is pz.tictactoe_text
    import os
    assert import_object("os:system") is os.system  # your own config: any module


def test_the_example_recipes_references_work_from_a_run_folder(tmp_path, capsys):
    """examples/pettingzoo_tictactoe.yaml names the adapter's text helpers: its run folder
    evaluates and resumes without the flag."""
    run = tmp_path / "pz"
    rc, _, err = cli(capsys, "train", EXAMPLES / "pettingzoo_tictactoe.yaml", *SMALL,
                     f"train.run_dir={run}")
    assert rc == 0, err
    rc, out, err = cli(capsys, "eval", run, "--vs", "random", "--games", "2")
    assert rc == 0, err
    assert "random" in out
    rc, _, err = cli(capsys, "train", "--resume", run, "train.steps=2")
    assert rc == 0, err


def test_the_gymnasium_example_runs_and_evaluates_with_its_plugin_named(tmp_path, capsys):
    """examples/gymnasium_frozen_lake.yaml registers its env from a plugin: its run folder
    evaluates with the plugin named (--plugin; the folder's own list is not imported)."""
    pytest.importorskip("gymnasium")
    run = tmp_path / "gym"
    plugin = EXAMPLES / "gymnasium_frozen_lake.py"
    rc, _, err = cli(capsys, "train", EXAMPLES / "gymnasium_frozen_lake.yaml", *SMALL,
                     f"train.run_dir={run}")
    assert rc == 0, err
    rc, _, err = cli(capsys, "eval", run, "--vs", "random", "--games", "2", "--plugin", plugin)
    assert rc == 0, err


def test_the_flag_lets_a_users_own_module_run(tmp_path, capsys, monkeypatch):
    """The positive control: a run folder naming a function of the user's own module is
    refused without --trust-remote-code and imports it with the flag."""
    run = hostile_run(tmp_path, "classic/tictactoe-v3", {}, obs_to_text="usertext:text")
    (tmp_path / "usertext.py").write_text(
        "open('IMPORTED', 'w').write('yes')\n"
        "from sparring.envs.adapters.pettingzoo import tictactoe_text as text\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "usertext", raising=False)
    rc, _, err = cli(capsys, "eval", run)
    assert rc == 2 and "envs.0.options.obs_to_text" in one_line(err)
    assert not (tmp_path / "IMPORTED").exists()
    cli(capsys, "eval", run, "--trust-remote-code")  # the empty checkpoint fails later
    assert (tmp_path / "IMPORTED").read_text() == "yes"

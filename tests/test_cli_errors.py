"""The user-facing side of reliability: an ordinary user error at the command line is one
line on stderr naming the key or the file (exit code 2; Ctrl-C: 130), never a traceback
(that needs --debug), and it leaves no run folder behind and no run broken; a run folder is
data, never code. docs/reliability.md lists each promise with the test here that holds it."""

import errno
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from sparring.cli import main
from sparring.config import ConfigError
from sparring.storage.folders import step_dirs
from sparring.train.checkpoint import verify_checkpoint
from tests.helpers import cli, one_line

TINY = ["model.options={hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 2, "
        "intermediate_size: 64}", "rollout.episodes_per_step=8", "envs.0.group_size=4",
        "train.epochs=1", "eval.games=2", "eval.at_start=false", "logging.progress=false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished one-step tic-tac-toe run (tiny model)."""
    folder = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", *TINY, "train.steps=1", f"train.run_dir={folder}"]) == 0
    return folder


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("args, key", [
    (["envs.0.options.bogus=1"], "envs.0.options: tictactoe has no option 'bogus'"),
    (["league.bots=[foo]"], "league.bots.0: unknown opponent 'foo'"),
    (["eval.opponents=[zz]"], "eval.opponents.0: unknown opponent 'zz'"),
    (["model.device=banana"], "model.device: 'banana' is not a device"),
    (["train.run_dir={nam}"], "train.run_dir: '{nam}' is not a valid pattern"),
    (["train.seed=4294967296"], "train.seed: 4294967296 is out of range"),
    (["envs.0.opponents=[pool]", "league.bots=[]", "league.every=0"],
     "envs.0.opponents: 'pool'"),
    (["algorithm.estimator=gae", "algorithm.estimator_options={}", "critic.enabled=off"],
     "critic.enabled: estimator 'gae' needs values"),
    (["trian.steps=1"], "unknown key 'trian'; did you mean 'train'"),
    # a bool option takes a bool: a quoted "false" or other text is refused, not read as true
    (["envs.0.options.canonical='false'"],
     "envs.0.options: tictactoe option 'canonical' takes a bool, got 'false'"),
    (["envs.0.options.compact=abc"],
     "envs.0.options: tictactoe option 'compact' takes a bool, got 'abc'"),
    # refused before training, not at the first evaluation (the game tree is too large)
    (["envs.0.name=connect_four", "envs.0.options={}", "eval.opponents=[minimax]"],
     "eval.opponents: minimax cannot play envs.0 (connect_four): exact minimax gave up"),
    (["model.name=/nonexistent"], "model.name: '/nonexistent' does not exist; give a "
     "Hugging Face model folder"),  # a missing local path, not the hub's repo-id message
    (["train.name=../../escape"], "train.name: '../../escape' is not a plain name (it fills "
     "{name} in train.run_dir: no '/' or '\\', no leading '.', not empty); put folders in "
     "train.run_dir"),
    (["train.name=.."], "train.name: '..' is not a plain name"),
    (["rollout.episodes_per_step=10000000"],
     "rollout.episodes_per_step: 10000000 is out of range (must be <= 100000)"),
    (["model.options.num_layers=10000"], "model.options.num_layers: 10000 is out of range "
     "(must be <= 64 for the tiny model; a larger model is a Hugging Face one)"),
    (["algorithm.estimator_options={whiten: 1}"],
     "estimator 'turn_gae' option 'whiten' takes a bool, got 1"),
])
def test_a_bad_config_is_one_line_and_leaves_no_run_folder(args, key, tmp_path, monkeypatch,
                                                           capsys):
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli(capsys, "train", *TINY, *args)
    assert rc == 2
    assert key in one_line(err, "config error: ")
    assert list(tmp_path.iterdir()) == []  # no runs/ folder, nothing written


HIDDEN = ("it searches copies of the full state, which hold what its seat may not see (the "
          "game has hidden information, e.g. the other player's card)")
NO_TREE = ("it solves the game's exact tree, and the game exposes none (only games registered "
           "with game_tree=True, e.g. Kuhn and Leduc)")
KUHN = ["envs.0.name=kuhn_poker", "envs.0.options={}", "envs.0.starts=[]"]


@pytest.mark.parametrize("args, message", [
    ([*KUHN, "envs.0.opponents=[self, minimax]"],
     f"envs.0.opponents.1: bot 'minimax' cannot play kuhn_poker: {HIDDEN}"),
    ([*KUHN, "envs.0.opponents=[mcts]"],
     f"envs.0.opponents.0: bot 'mcts' cannot play kuhn_poker: {HIDDEN}"),
    ([*KUHN, "envs.0.opponents=[tactical]"],
     f"envs.0.opponents.0: bot 'tactical' cannot play kuhn_poker: {HIDDEN}"),
    (["envs.0.name=leduc", "envs.0.options={}", "envs.0.starts=[]", "league.bots=[random]",
      "eval.opponents=[mcts]"],
     f"eval.opponents.0: bot 'mcts' cannot play leduc: {HIDDEN} (envs.0)"),
    (["envs.0.opponents=[self, pool]", "league.bots=[random, cfr]"],
     f"league.bots.1: bot 'cfr' cannot play tictactoe: {NO_TREE} (envs.0)"),
    (["envs.0.name=nim", "envs.0.options={}", "envs.0.starts=[]", "eval.opponents=[cfr]"],
     f"eval.opponents.0: bot 'cfr' cannot play nim: {NO_TREE} (envs.0)"),
])
def test_a_bot_that_cannot_play_the_game_honestly_is_refused_before_a_run_folder(
        args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli(capsys, "train", *TINY, *args)
    assert rc == 2
    assert one_line(err, "config error: ") == f"config error: {message}"
    assert list(tmp_path.iterdir()) == []


def test_bots_that_can_play_the_game_are_accepted():
    from sparring.envs import make
    from sparring.envs.bots import bot_refusal
    for game, fine in (("kuhn_poker", ["random", "cfr"]), ("leduc", ["random", "cfr"]),
                       ("tictactoe", ["random", "tactical", "minimax", "mcts"]),
                       ("nim", ["random", "tactical", "minimax", "mcts"])):
        assert [bot_refusal(b, make(game)) for b in fine] == [None] * len(fine)


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text("envs:\n  - {name: tictactoe\n")
    rc, _, err = cli(capsys, "train", "bad.yaml")
    assert rc == 2
    assert "bad.yaml: not valid YAML at line 3" in one_line(err, "config error: ")


def test_a_yaml_key_given_twice_is_an_error_naming_the_key_and_lines(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.chdir(tmp_path)
    Path("dup.yaml").write_text("train:\n  steps: 3\nenvs:\n  - {name: tictactoe, "
                                "group_size: 4, group_size: 8}\n")
    rc, _, err = cli(capsys, "train", "dup.yaml")
    assert rc == 2 and one_line(err) == (
        "config error: dup.yaml: not valid YAML at line 4, column 38: key 'group_size' is "
        "given twice (both on line 4)")
    Path("dup.yaml").write_text("train:\n  steps: 3\nmodel: {name: tiny}\ntrain:\n  steps: 5\n")
    rc, _, err = cli(capsys, "train", "dup.yaml")
    assert rc == 2 and one_line(err) == (
        "config error: dup.yaml: not valid YAML at line 4, column 1: key 'train' is given "
        "twice (lines 1 and 4)")
    rc, _, err = cli(capsys, "train", "envs.0.options={canonical: true, canonical: false}")
    assert rc == 2 and one_line(err).startswith(
        "config error: envs.0.options: cannot parse the mapping '{canonical: true, canonical: "
        "false}' (key 'canonical' is given twice (both on line 1)")
    assert list(tmp_path.iterdir()) == [tmp_path / "dup.yaml"]
    from sparring.config import read_yaml  # a merge's keys may still be overridden
    Path("merge.yaml").write_text("a: &x {p: 1, q: 2}\nb:\n  <<: *x\n  p: 3\n")
    assert read_yaml("merge.yaml") == {"a": {"p": 1, "q": 2}, "b": {"p": 3, "q": 2}}


def test_debug_shows_the_traceback_instead(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="envs.0.options"):
        main(["--debug", "train", "envs.0.options.bogus=1"])
    with pytest.raises(ConfigError, match="envs.0.options"):
        main(["train", "envs.0.options.bogus=1", "--debug"])


def test_rounded_episode_counts_are_a_warning_that_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli(capsys, "train", *TINY, "rollout.episodes_per_step=11", "train.steps=1",
                     "train.run_dir=r", "envs.0.opponents=[self]", "eval.every=0")
    assert rc == 0
    assert "warning: rollout.episodes_per_step=11 is rounded to whole groups " \
           "(envs.0.group_size=4): each step plays 12 episodes" in err
    assert json.loads(Path("r/metrics.jsonl").read_text().splitlines()[0])["episodes"] == 12


# ---------------------------------------------------------------- eval, play, report


@pytest.mark.parametrize("games", ["0", "-3", "many"])
def test_eval_games_must_be_a_positive_count(games, run, capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", str(run), "--games", games])
    assert e.value.code == 2
    assert "argument --games:" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--games", "1e20"], "argument --games: expected a whole number, got '1e20'"),
    (["--games", "100000000000000000000"],
     "argument --games: at most 100,000 games per opponent, got 100,000,000,000,000,000,000"),
    (["--games", "100001"], "argument --games: at most 100,000 games per opponent, got 100,001"),
    (["--device", "foo"],
     "argument --device: 'foo' is not a device (allowed: cpu, cuda, cuda:N, mps, auto)"),
])
def test_eval_games_and_device_are_checked_before_anything_runs(args, message, run, capsys):
    for command in (["eval"], ["play"]) if args[0] == "--device" else (["eval"],):
        with pytest.raises(SystemExit) as e:
            main([*command, str(run), *args])
        assert e.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")


@pytest.mark.parametrize("args, message", [
    (["--env", "nosuch"], "error: --env: unknown environment 'nosuch'"),
    (["--vs", "nosuch"], "error: --vs.0: unknown opponent 'nosuch' (allowed: "),
    (["--vs", "random,cfr"], f"error: --vs.1: bot 'cfr' cannot play tictactoe: {NO_TREE}"),
    (["--env", "kuhn_poker", "--vs", "minimax"],
     f"error: --vs.0: bot 'minimax' cannot play kuhn_poker: {HIDDEN}"),
])
def test_eval_bad_arguments_are_one_line(args, message, run, capsys):
    rc, _, err = cli(capsys, "eval", str(run), *args)
    assert rc == 2 and one_line(err, "error: ").startswith(message)


def test_eval_and_play_of_a_folder_that_is_no_run(tmp_path, capsys):
    for cmd in ("eval", "play", "report"):
        rc, _, err = cli(capsys, cmd, str(tmp_path / "nowhere"))
        assert rc == 2 and "nowhere" in one_line(err, "error: ")


def test_eval_of_a_file_says_it_wants_a_folder(run, capsys):
    rc, _, err = cli(capsys, "eval", str(run / "metrics.jsonl"))
    assert rc == 2
    assert one_line(err, "error: ").endswith(
        "metrics.jsonl is a file: give a run folder or a checkpoint folder")


def test_eval_of_a_misspelt_checkpoint_names_the_checkpoints_there(run, capsys):
    rc, _, err = cli(capsys, "eval", str(run / "checkpoints" / "step_1"))
    assert rc == 2
    assert one_line(err, "error: ").endswith(
        f"step_1: no such run folder or checkpoint; {run / 'checkpoints'} holds step_000001")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_a_run_trained_on_a_gpu_is_evaluated_on_a_machine_without_one(run, tmp_path, capsys):
    gpu_run = tmp_path / "gpu_run"  # the run's config says cuda, as a GPU run's does
    shutil.copytree(run, gpu_run)
    conf = yaml.safe_load((gpu_run / "config.yaml").read_text())
    conf["model"]["device"] = "cuda"
    (gpu_run / "config.yaml").write_text(yaml.safe_dump(conf))
    rc, _, err = cli(capsys, "eval", str(gpu_run), "--games", "2")
    assert rc == 2 and one_line(err, "error: ") == (
        "error: the run's model.device is 'cuda', but torch sees no CUDA device here: load it "
        "on another device (device='cpu'; --device cpu for sparring eval and play)")
    rc, out, _ = cli(capsys, "eval", str(gpu_run), "--games", "2", "--device", "cpu")
    assert rc == 0 and "tictactoe" in out
    rc, _, err = cli(capsys, "eval", str(run), "--games", "2", "--device", "cuda:1")
    assert rc == 2 and one_line(err, "error: ") == (
        "error: device 'cuda:1': torch sees no CUDA device here")


def test_play_seat_and_env_are_checked(run, capsys):
    rc, _, err = cli(capsys, "play", str(run), "--seat", "5")
    assert rc == 2
    assert one_line(err, "error: ") == "error: --seat: tictactoe has seats 0 to 1, got 5"
    rc, _, err = cli(capsys, "play", str(run), "--env", "nosuch")
    assert rc == 2 and "--env: unknown environment 'nosuch'" in one_line(err, "error: ")


def test_play_ends_cleanly_on_ctrl_d_and_ctrl_c(run, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # Ctrl-D: end of input
    rc, out, err = cli(capsys, "play", str(run))
    assert rc == 0 and "game abandoned" in out and "Traceback" not in err

    class CtrlC(io.StringIO):
        def readline(self, *a):
            raise KeyboardInterrupt

    monkeypatch.setattr(sys, "stdin", CtrlC())
    rc, _, err = cli(capsys, "play", str(run))
    assert rc == 130 and err.strip() == "interrupted"


def test_play_with_stdin_closed_is_one_line(run, capsys, monkeypatch):
    """`sparring play RUN <&-` (Python's stdin is None) is one line, not a traceback."""
    monkeypatch.setattr(sys, "stdin", None)
    rc, _, err = cli(capsys, "play", str(run))
    assert rc == 2 and "stdin, which is closed" in one_line(err, "error: ")


def test_play_shows_an_environments_escape_sequences_escaped(run, capsys, monkeypatch):
    """`sparring play` prints the env's text with escape sequences escaped, never raw."""
    from sparring.envs.games.tictactoe import TicTacToe
    from sparring.terminal_game import printable

    assert printable("a\x1b[2Jb\n\tc\x07\udcff é") == "a\\x1b[2Jb\n\tc\\x07\\udcff é"
    real = TicTacToe.system_prompt
    monkeypatch.setattr(TicTacToe, "system_prompt",
                        lambda self, seat: "\x1b]0;pwned\x07" + real(self, seat))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    rc, out, _ = cli(capsys, "play", str(run))
    assert rc == 0 and "\x1b" not in out and "\\x1b]0;pwned\\x07" in out


def test_play_scores_a_task_instead_of_calling_it_a_draw():
    """A wrong calculator answer is scored as the task's result, not printed as "draw"."""
    from types import SimpleNamespace

    from sparring.config import from_dict
    from sparring.envs import make
    from sparring.policy.tiny import build_tokenizer
    from sparring.terminal_game import play_in_terminal

    cfg = from_dict({"envs": [{"name": "calculator"}]})
    question = make("calculator")
    question.reset(3)
    value = eval(question.question)  # noqa: S307 -- digits and + - * ( ) only: our oracle
    said = []
    policy = SimpleNamespace(tokenizer=build_tokenizer())
    returns = play_in_terminal(policy, cfg, "calculator", ask=lambda _: f"answer: {value + 1}",
                   say=said.append, seed=3)
    assert returns == [0.0]
    assert said[-1] == f"your score: 0 (wrong: the answer is {value})"
    said.clear()
    play_in_terminal(policy, cfg, "calculator", ask=lambda _: f"answer: {value}", say=said.append, seed=3)
    assert said[-1] == "your score: 1 (correct)"


def test_report_into_an_unwritable_place_is_one_line(run, capsys):
    blocker = run.parent / "a_file"
    blocker.write_text("")
    rc, _, err = cli(capsys, "report", str(run), "--out", str(blocker / "report"))
    assert rc == 2 and str(blocker) in one_line(err, "error: ")


def test_report_survives_a_damaged_config(tmp_path, capsys, caplog):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    (tmp_path / "config.yaml").write_text("algorithm: [unclosed\n")
    rc, out, _ = cli(capsys, "report", str(tmp_path))
    assert rc == 0 and out.strip() == str(tmp_path / "report" / "summary.md")
    assert "config.yaml is not valid YAML" in caplog.text


# ---------------------------------------------------------------- run folders


def test_resume_of_a_folder_without_checkpoint(tmp_path, capsys):
    rc, _, err = cli(capsys, "train", "--resume", str(tmp_path / "nowhere"))
    assert rc == 2 and one_line(err, "error: ") == f"error: --resume: no run folder {tmp_path}/nowhere"
    (tmp_path / "config.yaml").write_text("envs: [{name: tictactoe}]\n")
    rc, _, err = cli(capsys, "train", "--resume", str(tmp_path))
    assert rc == 2 and "has no checkpoint to resume from" in one_line(err, "error: ")


def test_a_resume_override_of_the_model_is_refused_before_anything_is_written(run, capsys):
    """`--resume RUN model.options.hidden_size=64` is refused in one line before any file is
    written, so the run can still be resumed, evaluated and played (rewriting config.yaml and
    then failing on a size mismatch would break it for good)."""
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    rc, _, err = cli(capsys, "train", "--resume", str(run), "model.options.hidden_size=64")
    assert rc == 2
    assert one_line(err, "config error: ").startswith(
        "config error: model.options.hidden_size: cannot change on --resume")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    rc, out, _ = cli(capsys, "eval", str(run), "--games", "2")
    assert rc == 0 and "2 games each" in out


def test_a_frozen_body_that_differs_from_the_runs_is_one_line_and_keeps_the_run(tmp_path,
                                                                                capsys):
    """A frozen-body run's checkpoints hold its head alone: resumed or evaluated over a model
    whose frozen weights differ (the tiny model's seed, edited in its config.yaml), it is
    one line naming the problem, and no file of the run changes."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "model.head={name: frozen_features}", "train.steps=1",
                 f"train.run_dir={run}"]) == 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["options"]["seed"] = 5
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for command in (["train", "--resume", run, "train.steps=2"], ["eval", run, "--games", "2"]):
        rc, _, err = cli(capsys, *command)
        assert rc == 2
        assert "the rest must be the frozen weights they trained with" in one_line(err, "error: ")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_resume_with_no_steps_left_says_so_and_writes_nothing(tmp_path, capsys):
    """`--resume RUN train.steps=N` on a run that has trained more than N steps, or a resume
    of a finished run, is refused in one line naming the counts, and nothing is written
    (config.yaml keeps its steps); it never exits 0 having trained nothing."""
    folder = tmp_path / "run"
    assert main(["train", *TINY, "train.steps=2", "checkpoint.every=1",
                 f"train.run_dir={folder}"]) == 0
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    rc, _, err = cli(capsys, "train", "--resume", str(folder), "train.steps=1")
    assert rc == 2 and one_line(err, "config error: ") == (
        f"config error: train.steps=1, but {folder} has trained 2 steps (its checkpoint "
        "step_000002): nothing to train; give train.steps above 2 to continue it")
    rc, _, err = cli(capsys, "train", "--resume", str(folder))
    assert rc == 2 and one_line(err, "config error: ") == (
        f"config error: {folder} already finished its 2 steps (train.steps=2): give "
        "train.steps above 2 to continue it")
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    rc, _, _ = cli(capsys, "train", "--resume", str(folder), "train.steps=3")
    assert rc == 0 and len((folder / "metrics.jsonl").read_text().splitlines()) == 3


def test_an_unwritable_run_folder_is_one_line(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    rc, _, err = cli(capsys, "train", *TINY, "train.steps=1", f"train.run_dir={blocker}/run")
    assert rc == 2 and f"{blocker}/run" in one_line(err, "error: ")

    def refuse(self, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)  # what a read-only folder does (we may be root)
    rc, _, err = cli(capsys, "train", *TINY, "train.steps=1", f"train.run_dir={tmp_path}/ro")
    assert rc == 2
    assert one_line(err, "error: ") == f"error: Permission denied: {tmp_path}/ro"


@pytest.mark.parametrize("raised", ["OSError", "SafetensorError"])
def test_a_full_disk_while_checkpointing_says_the_last_checkpoint_is_intact(raised, tmp_path,
                                                                            monkeypatch, capsys):
    """A real full disk fails inside safetensors' writer with a `SafetensorError`
    ("... No space left on device (os error 28)"), not an `OSError`; it is the same one
    line as an `OSError` ENOSPC, never a traceback."""
    from safetensors import SafetensorError

    import sparring.storage.folders as folders
    import sparring.train.checkpoint as ck

    if raised == "OSError":
        real = ck.write_tensors

        def full_at_step_2(path, tensors):
            if "step_000002" in str(path):
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return real(path, tensors)

        monkeypatch.setattr(ck, "write_tensors", full_at_step_2)
    else:
        real_save = folders.save_file

        def full_at_step_2(tensors, filename, metadata=None):  # what write_tensors calls
            if "step_000002" in str(filename):
                raise SafetensorError("Error while serializing: I/O error: No space left on "
                                      "device (os error 28)")
            return real_save(tensors, filename, metadata=metadata)

        monkeypatch.setattr(folders, "save_file", full_at_step_2)
    folder = tmp_path / "run"
    rc, _, err = cli(capsys, "train", *TINY, "train.steps=2", "checkpoint.every=1",
                     f"train.run_dir={folder}")
    assert rc == 2
    line = one_line(err, "error: ")
    assert line.startswith("error: no space left on device writing ")
    assert line.endswith(f"the last checkpoint, {folder}/checkpoints/step_000001, is intact: "
                         f"continue with `sparring train --resume {folder}`")
    assert [s for s, _ in step_dirs(folder)] == [1]
    verify_checkpoint(folder / "checkpoints" / "step_000001")


def test_ctrl_c_while_training_says_what_was_kept(tmp_path, monkeypatch, capsys):
    from sparring.rollout.rollouts import Rollouts

    real = Rollouts.__call__

    def stop_at_step_1(self, step):
        if step == 1:
            raise KeyboardInterrupt
        return real(self, step)

    monkeypatch.setattr(Rollouts, "__call__", stop_at_step_1)
    folder = tmp_path / "run"
    rc, _, err = cli(capsys, "train", *TINY, "train.steps=3", "checkpoint.every=0",
                     f"train.run_dir={folder}")
    assert rc == 130
    assert err.strip().splitlines()[-1] == (
        f"interrupted; the last checkpoint, {folder}/checkpoints/step_000001, is intact: "
        f"continue with `sparring train --resume {folder}`")


def test_sigterm_while_training_keeps_a_checkpoint_and_says_so(tmp_path, monkeypatch, capsys):
    """SIGTERM (what timeout, Docker and Slurm send) is handled as Ctrl-C is: a crash
    checkpoint, a message saying what was kept, and exit code 143."""
    import os
    import signal

    from sparring.rollout.rollouts import Rollouts

    real = Rollouts.__call__

    def terminated_at_step_1(self, step):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, step)

    monkeypatch.setattr(Rollouts, "__call__", terminated_at_step_1)
    folder = tmp_path / "run"
    rc, _, err = cli(capsys, "train", *TINY, "train.steps=3", "checkpoint.every=0",
                     f"train.run_dir={folder}")
    assert rc == 143
    assert err.strip().splitlines()[-1] == (
        f"terminated (SIGTERM); the last checkpoint, {folder}/checkpoints/step_000001, is "
        f"intact: continue with `sparring train --resume {folder}`")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is put back
    monkeypatch.setattr(Rollouts, "__call__", real)
    assert cli(capsys, "train", "--resume", str(folder))[0] == 0


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))


@pytest.mark.parametrize("damage, says", [
    (b"", "is empty or damaged"),
    (b"\xff\xfe\x00garbage\x81", "not UTF-8 text"),
    (b"model: {name: tiny}\n", "is empty or damaged"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
    (BOMB.encode(), "more than 100,000 values"),
], ids=["empty", "garbage", "no-envs", "deep", "alias-bomb"])
@pytest.mark.parametrize("command", ["eval", "train --resume"])
def test_a_damaged_run_config_is_one_line_naming_the_file(damage, says, command, run,
                                                           tmp_path, capsys):
    """A damaged config.yaml in a run folder (empty, garbage bytes, deep nesting, an alias
    bomb) is one line naming the file, for eval and --resume: not the default model and a size
    mismatch, a decode error without the file, "config has no envs", a RecursionError or a
    hang."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "config.yaml").write_bytes(damage)
    rc, _, err = cli(capsys, *command.split(), str(copy))
    line = one_line(err, "config error: ")
    assert rc == 2 and str(copy / "config.yaml") in line and says in line


def test_an_alias_bomb_recipe_is_refused_before_a_run_folder_exists(tmp_path, capsys):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(BOMB + "envs: [{name: tictactoe}]\n")  # 10^9 values in a few lines
    rc, _, err = cli(capsys, "train", str(recipe), f"train.run_dir={tmp_path / 'run'}")
    assert rc == 2 and "more than 100,000 values" in one_line(err, "config error: ")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- a run folder is data


def _hostile_run(tmp_path: Path, marker: Path, *, model_code: bool = False,
                 plugin: bool = False, reference: str = "") -> Path:
    """A run folder (one empty checkpoint) whose config asks for code to run: with
    ``model_code`` a model folder with an ``auto_map`` and a Python file, and
    ``trust_remote_code: true``; with ``plugin`` a plugin file in ``plugins``; with
    ``reference`` (gymnasium or pettingzoo) an adapter env whose options name a module
    ``evil.py`` shipped in the folder. Each file writes ``marker`` when it runs."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    cfg = {"model": {"name": "tiny", "trust_remote_code": True}, "envs": [{"name": "tictactoe"}]}
    if model_code:
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {
            "AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}))
        (model / "evil.py").write_text(f"open({str(marker)!r}, 'a').write('model code ran\\n')\n")
        cfg["model"]["name"] = str(model)
    if plugin:
        (run / "plugin.py").write_text(f"open({str(marker)!r}, 'a').write('plugin ran\\n')\n")
        cfg["plugins"] = [str(run / "plugin.py")]
    if reference:
        (run / "evil.py").write_text(f"open({str(marker)!r}, 'a').write('module ran\\n')\n"
                                     "def text(obs):\n    return str(obs)\n"
                                     "def env(**kwargs):\n    raise SystemExit\n")
        options = ({"env": "CartPole-v1", "obs_to_text": "evil:text"} if reference == "gymnasium"
                   else {"env": "evil", "obs_to_text": "sparring.envs.adapters.pettingzoo:"
                         "tictactoe_text"})  # the env module itself, without a colon
        cfg["envs"] = [{"name": reference, "options": options}]
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


@pytest.mark.parametrize("command", [["eval"], ["play"], ["export", "OUT"]])
@pytest.mark.parametrize("vector", ["model_code", "plugin"])
def test_a_run_folder_runs_no_code_without_the_flag(command, vector, tmp_path, capsys, caplog):
    """`eval`, `play` and `export` run none of a run folder's code: its config.yaml saying
    trust_remote_code: true is ignored with a warning, and a listed plugin (code too) is
    refused without the flag."""
    marker = tmp_path / "marker"
    run = _hostile_run(tmp_path, marker, **{vector: True})
    args = [command[0], str(run), *[str(tmp_path / a) for a in command[1:]]]
    rc, _, err = cli(capsys, *args)
    assert rc == 2 and "\nerror: " in "\n" + err  # (transformers may log around it)
    assert not marker.exists()
    assert "trust_remote_code: true; ignored" in caplog.text  # the warning says why


@pytest.mark.parametrize("command", ["eval", "play", "export", "train --resume"])
@pytest.mark.parametrize("adapter", ["gymnasium", "pettingzoo"])
def test_a_run_folder_imports_no_module_its_env_options_name(command, adapter, tmp_path,
                                                             capsys, monkeypatch):
    """An adapter option naming ``"module:attr"`` in a run folder's config is refused, naming
    the option, when `eval`, `play`, `export` or `--resume` checks it: importing it would
    search the working directory and run a module shipped in the folder."""
    marker = tmp_path / "marker"
    run = _hostile_run(tmp_path, marker, reference=adapter)
    monkeypatch.chdir(run)
    out = [str(tmp_path / "out")] if command == "export" else []
    rc, _, err = cli(capsys, *command.split(), str(run), *out)
    assert rc == 2 and not marker.exists()
    line = one_line(err, "")  # "error: " (export) or "config error: "
    assert "envs.0.options." in line and "'evil'" in line and "--trust-remote-code" in line


def test_the_flag_lets_the_folder_env_module_run(tmp_path, capsys, monkeypatch):
    """The positive control: with --trust-remote-code the adapter imports the module."""
    pytest.importorskip("gymnasium")
    marker = tmp_path / "marker"
    run = _hostile_run(tmp_path, marker, reference="gymnasium")
    monkeypatch.chdir(run)
    cli(capsys, "eval", str(run), "--trust-remote-code")
    assert marker.read_text() == "module ran\n"


def test_resume_refuses_a_folder_that_lists_plugins(tmp_path, capsys):
    marker = tmp_path / "marker"
    run = _hostile_run(tmp_path, marker, plugin=True)
    rc, _, err = cli(capsys, "train", "--resume", str(run))
    assert rc == 2 and not marker.exists()
    line = one_line(err, "error: ")
    assert "lists plugins" in line and "--plugin" in line and "--trust-remote-code" in line


def test_the_flag_lets_the_folder_plugins_run(tmp_path, capsys):
    """The positive control: the same folder with --trust-remote-code imports its plugin."""
    marker = tmp_path / "marker"
    run = _hostile_run(tmp_path, marker, plugin=True)
    cli(capsys, "eval", str(run), "--trust-remote-code")
    assert marker.read_text() == "plugin ran\n"


def test_train_names_the_best_checkpoint_in_its_closing_lines(tmp_path, capsys):
    folder = tmp_path / "run"
    rc, _, err = cli(capsys, "train", *TINY, "train.steps=3", "eval.every=1",
                     "checkpoint.every=0", "checkpoint.keep=1",
                     "checkpoint.best_metric=eval/tictactoe/random/mean_return",
                     "checkpoint.best_mode=max", f"train.run_dir={folder}")
    assert rc == 0
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    scores = [r["eval/tictactoe/random/mean_return"] for r in rows]
    step = 1 + scores.index(max(scores))  # the first of the highest (a tie does not improve)
    line = next(x for x in err.splitlines() if x.startswith("best checkpoint:"))  # with the summary
    assert f"step_{step:06d}" in line and f"at step {step})" in line
    assert (folder / "checkpoints" / f"step_{step:06d}").is_dir()


def test_eval_lists_positions_the_policy_sees_alike_once(tmp_path, capsys):
    """With the game option canonical, symmetric board positions read the same to the
    policy; the blunder list prints each (seat, observation, move) once with its count of
    board positions (counted here from the exact evaluation itself)."""
    from collections import Counter

    from sparring.assembly.trained import load_policies
    from sparring.eval.games import policy_vs_minimax
    from sparring.rollout.rollouts import make_arena

    folder = tmp_path / "run"
    assert main(["train", *TINY, "train.steps=1", f"train.run_dir={folder}",
                 "envs.0.options.canonical=true",
                 "eval.opponents=[random]"]) == 0
    rc, out, _ = cli(capsys, "eval", str(folder), "--vs", "minimax", "--games", "2")
    policies, cfg, _ = load_policies(folder)
    exact = policy_vs_minimax(make_arena(cfg.rollout), policies[""], "tictactoe",
                              dict(cfg.envs[0].options))
    seen = Counter((b.seat, b.observation, b.action) for b in exact.blunders)
    assert rc == 0 and exact.blunders and max(seen.values()) > 1  # symmetric twins exist
    printed = [line for line in out.splitlines() if line.startswith("  tictactoe seat ")]
    assert len(printed) == min(len(seen), 20)
    for line in printed:
        key = next(k for k in seen if line.startswith(f"  tictactoe seat {k[0]}: {k[1]!r} -> {k[2]} "))
        assert line.endswith(f" x{seen[key]} positions") == (seen[key] > 1)


def test_eval_against_minimax_adds_the_exact_row_and_the_blunders(run, capsys):
    from sparring.assembly.trained import load_policies
    from sparring.eval.games import policy_conversion_vs_minimax, policy_vs_minimax
    from sparring.rollout.rollouts import make_arena

    rc, out, _ = cli(capsys, "eval", str(run), "--vs", "minimax", "--games", "2")
    policies, cfg, _ = load_policies(run)
    exact = policy_vs_minimax(make_arena(cfg.rollout), policies[""], "tictactoe",
                              dict(cfg.envs[0].options))
    row = next(line for line in out.splitlines() if "minimax (exact)" in line)
    assert rc == 0 and f"{exact.rates()['non_loss']:.3f}" in row
    n = len(exact.blunders)
    assert (f"{n} positions where the policy plays a losing move" in out) == (n > 0)
    won = policy_conversion_vs_minimax(make_arena(cfg.rollout), policies[""], "tictactoe",
                                       dict(cfg.envs[0].options))
    for seat in (0, 1):
        w = [p.win for p in won if p.seat == seat]
        assert (f"seat {seat} converts the {len(w)} won positions of its first 3 moves "
                f"against minimax with mean win probability {sum(w) / len(w):.3f}") in out


# ---------------------------------------------------------------- damaged checkpoints


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    """A finished two-step tic-tac-toe run with a checkpoint after each step."""
    folder = tmp_path_factory.mktemp("cli2") / "run"
    assert main(["train", *TINY, "train.steps=2", "checkpoint.every=1",
                 f"train.run_dir={folder}"]) == 0
    return folder


def _garble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x5A  # inside the tensor data: the file still parses
    path.write_bytes(bytes(data))


def _manifest_naming(name: str):
    def harm(ckpt: Path) -> None:
        (ckpt / "manifest.json").write_text(
            json.dumps({"files": {name: {"bytes": 0, "sha256": "0" * 64}}}))
    return harm


def _link_to_dev_zero(ckpt: Path) -> None:
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors").symlink_to("/dev/zero")


UNTRUSTED = {
    "manifest deleted, weights garbled": (
        lambda c: ((c / "manifest.json").unlink(), _garble(c / "model.safetensors")),
        "manifest.json is missing"),
    "manifest with string values": (
        lambda c: (c / "manifest.json").write_text('{"files": {"state.json": "ok"}}'),
        "not a valid manifest"),
    "manifest entry /dev/zero": (_manifest_naming("/dev/zero"), "'/dev/zero' is not a file name"),
    "manifest entry ../": (_manifest_naming("../step_000001/model.safetensors"),
                           "is not a file name inside"),
    "weights a link to /dev/zero": (_link_to_dev_zero, "links outside"),
}


@pytest.mark.parametrize("damage", list(UNTRUSTED))
def test_eval_falls_back_from_a_checkpoint_whose_manifest_cannot_be_trusted(
        damage, run2, tmp_path, capsys, caplog):
    """A deleted manifest.json with garbled weights, a malformed manifest, an entry naming
    /dev/zero or a ``../`` path: each makes step 2 damaged, and eval warns why and evaluates
    step 1 (the newest intact checkpoint), without a traceback or a hang and reading
    nothing outside the checkpoints."""
    from tests.helpers import deadline

    run = tmp_path / "run"
    shutil.copytree(run2, run)
    harm, why = UNTRUSTED[damage]
    harm(run / "checkpoints" / "step_000002")
    with deadline(120):
        rc, out, _ = cli(capsys, "eval", str(run), "--games", "2")
    assert rc == 0 and f"{run}/checkpoints/step_000001 (2 games each" in out
    skipped = [r.getMessage() for r in caplog.records if "skipping checkpoint" in r.getMessage()]
    assert skipped and "step_000002" in skipped[0] and why in skipped[0], skipped


@pytest.mark.parametrize("command", ["eval", "export"])
def test_a_damaged_checkpoint_named_directly_is_one_line(command, run2, tmp_path, capsys):
    """A checkpoint folder given directly (no fallback) is verified as a whole before it is
    read: a state.json that is a fifo does not hang `export`, garbled weights are not
    evaluated."""
    import os

    from tests.helpers import deadline

    run = tmp_path / "run"
    shutil.copytree(run2, run)
    ckpt = run / "checkpoints" / "step_000002"
    (ckpt / "state.json").unlink()
    os.mkfifo(ckpt / "state.json")
    out = [str(tmp_path / "out")] if command == "export" else []
    with deadline(120):
        rc, _, err = cli(capsys, command, str(ckpt), *out)
    assert rc == 2 and "state.json is not a regular file" in one_line(err, "error: ")


@pytest.mark.parametrize("damage", ["flipped bits", "truncated"])
def test_a_damaged_pool_snapshot_stops_the_resume_with_one_line(damage, tmp_path, capsys):
    """Snapshots carry a manifest like checkpoints: with flipped bits or truncated, a pool
    snapshot stops the resume with one line naming the snapshot file and the problem (not
    a silent resume with different numbers, nor a traceback)."""
    folder = tmp_path / "run"
    pool = ["envs.0.opponents=[pool]", "league.bots=[random]", "league.every=1",
            "checkpoint.every=1"]
    assert main(["train", *TINY, *pool, "train.steps=3", f"train.run_dir={folder}"]) == 0
    snapshots = sorted((folder / "pool").glob("step-*/model.safetensors"))
    assert len(snapshots) == 2  # steps 1 and 2
    for weights in snapshots:
        if damage == "flipped bits":
            _garble(weights)
        else:
            weights.write_bytes(weights.read_bytes()[:-100])
    rc, _, err = cli(capsys, "train", "--resume", str(folder), "train.steps=4")
    assert rc == 2
    line = one_line(err, "error: ")
    assert f"{folder}/pool/step-00000" in line and "model.safetensors" in line
    assert ("sha256" if damage == "flipped bits" else "bytes, the manifest says") in line


def test_a_resume_trains_with_the_config_the_command_read(tmp_path, capsys):
    """`train --resume` reads the run's config once, with its checks, and the loop trains
    with that config: a plugin named with --plugin on the resume is part of the run (its
    saved config lists it); the loop does not read config.yaml a second time."""
    folder = tmp_path / "run"
    assert cli(capsys, "train", *TINY, "train.steps=1", f"train.run_dir={folder}")[0] == 0
    plugin = tmp_path / "noop_plugin.py"
    plugin.write_text("VALUE = 1\n")
    rc, _, err = cli(capsys, "train", "--resume", str(folder), "--plugin", str(plugin),
                     "train.steps=2")
    assert rc == 0, err
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    assert saved["train"]["steps"] == 2 and saved["plugins"] == [str(plugin)]

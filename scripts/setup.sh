#!/usr/bin/env bash
# Create .venv (or $SPARRING_VENV) and install Sparring into it, keeping torch pinned.
#
# * If the environment already has a torch (a CUDA build on a GPU machine), that exact
#   version is pinned, so nothing replaces it.
# * Otherwise torch==2.13.0 is installed first; on these machines pip resolves it to the
#   local CPU wheel, so no multi-GB CUDA build is pulled.
# Extras: SPARRING_EXTRAS (default "dev,lora,openspiel,pettingzoo,gymnasium,tensorboard,wandb":
# what the default tests exercise), e.g. SPARRING_EXTRAS=dev,vllm.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SPARRING_VENV:-.venv}"
extras="${SPARRING_EXTRAS:-dev,lora,openspiel,pettingzoo,gymnasium,tensorboard,wandb}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
if ! "$py" -c "import torch" 2>/dev/null; then
  "$py" -m pip install -q "torch==${SPARRING_TORCH:-2.13.0}"
fi
"$py" -c "import torch; print('torch==' + torch.__version__)" > "$venv/constraints.txt"
"$py" -m pip install -q -c "$venv/constraints.txt" -e ".[${extras}]"
echo "sparring installed in $venv with $(cat "$venv/constraints.txt")"

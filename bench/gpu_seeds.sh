#!/usr/bin/env bash
# Seeds of one recipe as parallel processes on one GPU, stopped at a deadline; each
# seed's log, metrics and last adapter are packed into $OUT to be copied back.
#
#   bash bench/gpu_seeds.sh RECIPE "0 1 2" SECONDS [overrides...]
#
# Each seed runs `sparring train RECIPE train.seed=S model.device=cuda [overrides]` with 4
# CPU threads; after SECONDS it gets SIGTERM (a checkpoint between steps; stopped inside a
# step, the run keeps its last periodic one). A small model's step is partly launch-bound,
# so several processes share the card (docs/benchmarks.md, "GPU figures"). Writes $OUT/seedS.tar.gz (bench/gpu_pack.py: the run's log, metrics and
# config and its last adapter in bf16; `bench/gpu_pack.py unpack` makes a run folder of it
# here) and $OUT/gpu.log (nvidia-smi every 30 s). A LoRA recipe: the adapter is what
# travels back. Needs src/ (and the model's files) on PYTHONPATH as `sparring` does.
set -u
recipe=$1; seeds=$2; seconds=$3; shift 3
out=${OUT:-/tmp/gpu_out}
runs=/tmp/gpu_runs
mkdir -p "$out" "$runs"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 30 \
    > "$out/gpu.log" 2>&1 &
smi=$!
for s in $seeds; do
    OMP_NUM_THREADS=4 timeout -s TERM -k 60 "$seconds" python3 -m sparring train "$recipe" \
        train.seed="$s" model.device=cuda logging.progress=false \
        train.run_dir="$runs/seed$s" "$@" > "$runs/seed$s.log" 2>&1 &
done
wait $(jobs -p | grep -v "^$smi\$")
kill "$smi" 2>/dev/null
for s in $seeds; do
    cp "$runs/seed$s.log" "$runs/seed$s/run.log"
    python3 bench/gpu_pack.py pack "$runs/seed$s" "$out/seed$s.tar.gz"
    tail -3 "$runs/seed$s.log"
done
ls -la "$out"

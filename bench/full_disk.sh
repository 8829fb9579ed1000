#!/usr/bin/env bash
# The two full-disk cases an operator meets, on small tmpfs mounts in a private mount namespace (Linux; root,
# or `unshare -rm` where user namespaces are allowed): the tests' tiny model (2x64, 20 steps, CPU) with
#   ARTIFACT_DIR on 200 KB holding an earlier file: room for the ~88 KB log, not the ~178 KB artifact;
#   CHECKPOINT_DIR on 2 MB with SAVE_EVERY=10: room for one ~1.27 MB checkpoint, not two.
# Prints each run's last console lines and what is left on each disk.
#   bash bench/full_disk.sh [TRAINER_DIR]     (default: this checkout; needs python data/build_sotu.py)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(cd "${1:-$here}" && pwd)"
out="$(mktemp -d)"
export NUM_LAYERS=2 MODEL_DIM=64 NUM_HEADS=4 NUM_KV_HEADS=2 MLP_MULT=2 TRAIN_SEQ_LEN=64 TRAIN_BATCH_TOKENS=2048 \
  VAL_BATCH_SIZE=16384 ITERATIONS=20 WARMDOWN_ITERS=8 WARMUP_STEPS=0 VAL_LOSS_EVERY=0 TRAIN_LOG_EVERY=10 \
  MAX_WALLCLOCK_SECONDS=0 DEVICE=cpu COMPILE=0 BF16=0 \
  DATA_PATH="$here/data/datasets/sotu_sp1024" TOKENIZER_PATH="$here/data/tokenizers/sotu_1024_bpe.model"
namespace=(-m)
[ "$(id -u)" = 0 ] || namespace=(-r -m)  # a user namespace where root is not at hand
unshare "${namespace[@]}" bash -s "$dir" "$out" <<'INNER'
set -u
dir=$1; out=$2
cd "$dir"
mkdir -p "$out/artifacts" "$out/checkpoints" "$out/logs"
mount -t tmpfs -o size=200k tmpfs "$out/artifacts"
echo "an earlier run's log" > "$out/artifacts/earlier.txt"
RUN_ID=full ARTIFACT_DIR="$out/artifacts" python train_gpt.py > "$out/artifact.console" 2>&1
echo "== ARTIFACT_DIR full: exit $?; the console's last lines:"; tail -n 3 "$out/artifact.console"
echo "-- left on that disk:"; ls -l "$out/artifacts"; echo "-- the log's last line:"; tail -n 1 "$out/artifacts/full.txt"
mount -t tmpfs -o size=2m tmpfs "$out/checkpoints"
RUN_ID=fullc SAVE_EVERY=10 ARTIFACT_DIR="$out/logs" CHECKPOINT_DIR="$out/checkpoints" python train_gpt.py \
  > "$out/checkpoint.console" 2>&1
echo "== CHECKPOINT_DIR full: exit $?; its checkpoint lines and the console's last line:"
grep -a "^checkpoint\|^WARNING: checkpoint" "$out/checkpoint.console"; tail -n 1 "$out/checkpoint.console"
echo "-- left on that disk:"; find "$out/checkpoints" -type f -printf "%s %p\n"
INNER
rm -rf "$out"

#!/usr/bin/env bash
# Issue 15 on one H200, in one call of ~6 minutes: install, the GPU tests of model/ and sampler/,
# the SFT-step MFU benchmark (reference, bidirectional, two-copy on the block-sparse kernel and on
# dense-bias cuDNN) and the sampler's gen phase (SDAR-4B shape, batch 128, 1,024 tokens, static).
# Full logs go to $OUT (the device tool's output folder; /tmp/gpu_speed elsewhere); a short table
# is printed last. Each stage has its own time limit, so one that hangs cannot eat the others'.
#
#   bash benchmarks/gpu_speed.sh [SDAR_CONFIG_JSON]       # default .carry/sdar-4b-config.json
#
# The SDAR config does not travel with ../shared: copy ../shared/models/sdar-4b-chat/config.json
# to .carry/sdar-4b-config.json (git-ignored) and carry `.carry`. Stage limits (seconds) can be
# changed with TESTS_S, MFU_S, SAMPLER_S. SMOKE=1 runs both benchmarks at their toy shapes (--tiny):
# a CPU check of this script's plumbing (~3 min on the 2-core VM).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_speed}
mkdir -p "$OUT"
CONFIG=${1:-.carry/sdar-4b-config.json}
TESTS_S=${TESTS_S:-200}
MFU_S=${MFU_S:-190}
SAMPLER_S=${SAMPLER_S:-170}
export PYTHONPATH=.
TINY=()
if [ "${SMOKE:-0}" = 1 ]; then TINY=(--tiny); fi

STAGE_DIR=$OUT
source benchmarks/stage.sh

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$OUT/gpu.txt" 2>&1
else
  printf 'gpu\nno nvidia-smi on this machine\n' >"$OUT/gpu.txt"
fi
stage install 120 python3 -m pip install -q --no-deps --no-build-isolation -e .
stage tests "$TESTS_S" python3 -m pytest -q -m gpu -p no:cacheprovider tests/model tests/sampler
stage model_mfu "$MFU_S" python3 benchmarks/model_mfu.py "${TINY[@]}" --steps 4 --warmup 1 \
  --variants reference,bidirectional,two_copy,two_copy_cudnn
if [ "${SMOKE:-0}" = 1 ]; then
  stage sampler "$SAMPLER_S" python3 benchmarks/sampler_throughput.py --tiny --phases gen --json "$OUT/sampler.json"
elif [ -f "$CONFIG" ]; then
  stage sampler "$SAMPLER_S" python3 benchmarks/sampler_throughput.py --config "$CONFIG" --phases gen \
    --json "$OUT/sampler.json"
else
  echo "sampler: skipped, no SDAR config at $CONFIG (see the header of this script)" | tee -a "$OUT/stages.txt"
fi

echo
echo "================ issue 15 on $(head -2 "$OUT/gpu.txt" | tail -1) ================"
cat "$OUT/stages.txt"
echo "--- GPU tests (tests/model, tests/sampler, -m gpu)"
tail -1 "$OUT/tests.log"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -8
echo "--- SFT step, Qwen3-1.7B dims, seq 2048, batch 4, bf16 (benchmarks/model_mfu.py)"
grep -E "compiled in|attention calls" "$OUT/model_mfu.log"
sed -n '/^variant /,$p' "$OUT/model_mfu.log"
echo "--- sampler, SDAR-4B shape, batch 128, prompt 512, gen 1024, static (benchmarks/sampler_throughput.py)"
grep -E "^(gen:|prefill|measured:|!!)|tokens/s|per forward pass|HBM roofline|compute roofline|each at its bound" \
  "$OUT/sampler.log" 2>/dev/null

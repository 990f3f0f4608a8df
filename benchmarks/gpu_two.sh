#!/usr/bin/env bash
# Issue 14 on a 2-GPU machine (nvidia-h200-x2), in device calls of at most 10 minutes each.
#   bash benchmarks/gpu_two.sh model      # ~6 min: sharded SFT step, FSDP (1,2,1) and data parallel
#                                         # (2,1,1), each against the same steps on one GPU
#   bash benchmarks/gpu_two.sh rl         # ~2 min: one RL update sharded over both GPUs == one GPU
#   bash benchmarks/gpu_two.sh verifier DICE_JSON   # ~6 min: the throughput benchmark (48 DICE
#                                         # candidates, each run from a cold compile cache) with the
#                                         # service on GPU 0 alone, then on both GPUs
# Logs go to $OUT (the device tool's output folder; /tmp/gpu_two elsewhere); a summary is printed
# last. The DICE file does not travel with ../shared: copy it into .carry/dice (git-ignored).
# SMOKE=1 runs the model part at toy size on 8 fake CPU devices (the plumbing, ~2 min).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_two}
mkdir -p "$OUT"
PART=${1:?usage: gpu_two.sh model|rl|verifier [DICE_JSON]}
export PYTHONUNBUFFERED=1
FAKE=()
if [ "${SMOKE:-0}" = 1 ]; then FAKE=(--tiny --cpu-devices 8); fi

STAGE_DIR=$OUT
source benchmarks/stage.sh

case "$PART" in
  model)
    for mesh in 1,-1,1 -1,1,1; do  # FSDP, data parallel: over every device here
      name=sharded_$([ "$mesh" = 1,-1,1 ] && echo fsdp || echo data)
      stage "$name" 270 python3 benchmarks/model_sharded_step.py --mesh="$mesh" --steps 4 \
        --compare-one-device "${FAKE[@]}"
      grep -E "^(mesh|OK|FAILED|one device:|step time:|compiled)" "$OUT/$name.log"
    done ;;
  rl)
    # The CI test of the sharded RL update (tests/rl/test_rl_update.py): FSDP over every device of
    # the default backend (here the GPUs; on CI 8 fake CPU devices) against one device.
    stage rl_update 200 python3 -m pytest -q -p no:cacheprovider tests/rl/test_rl_update.py -k sharded_update
    tail -3 "$OUT/rl_update.log" ;;
  verifier)
    DATA=${2:?usage: gpu_two.sh verifier DICE_JSON}
    stage verifier_gpu0 280 python3 benchmarks/verifier_throughput.py --gpus 0 \
      --data "$DATA" --candidates 48 --latency-candidates 2 --skip-naive --json "$OUT/gpu0.json"
    stage verifier_gpu01 280 python3 benchmarks/verifier_throughput.py --data "$DATA" --candidates 48 \
      --latency-candidates 2 --skip-naive --json "$OUT/gpu01.json"
    grep -hE "verdicts/h|slots|GPU" "$OUT/verifier_gpu0.log" "$OUT/verifier_gpu01.log" | head -20 ;;
  *) echo "unknown part $PART (model, rl, verifier)"; exit 2 ;;
esac
cat "$OUT/stages.txt"

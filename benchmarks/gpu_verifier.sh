#!/usr/bin/env bash
# Issue 16 on one H200, in one device call of ~9 minutes: DICE's 99 infilling items (their
# known-good CUDA answers) verified under both partial-replacement policies, then the timing
# comparison (20 pairs; the service at 1 and at 4 slots per GPU, then in-process methods).
# Full logs and results go to $OUT (the device tool's output folder; /tmp/gpu_verifier elsewhere)
# as one archive, results.tgz, plus a short summary printed last.
#
#   bash benchmarks/gpu_verifier.sh DICE_JSON      # kernel_infilling_evaluation.json
#
# The DICE file does not travel with ../shared: copy ../shared/data/dice/ into .carry/dice
# (git-ignored) and carry `.carry`. Stage limits (seconds): EVAL_S per policy, TIMING_S.
# The verifier for the two tables is one `dice-verifier serve` with 2 slots (judge memory cap
# 0.225 of the GPU each: at 4 slots the judge ran out on two DICE items) shared by both runs, so
# the second policy's compiles are cache hits.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_verifier}
WORK=/tmp/gpu_verifier_work
mkdir -p "$OUT" "$WORK"
DATA=${1:?usage: gpu_verifier.sh DICE_JSON}
EVAL_S=${EVAL_S:-220}
TIMING_S=${TIMING_S:-240}
PORT=50071

DEADLINE_S=${DEADLINE_S:-560}  # the whole script ends by then (a device call gets 600 s)
STAGE_DIR=$WORK
source benchmarks/stage.sh
after_stage() {  # what exists so far comes back even if the call is cut short
  tar -czf "$OUT/results.tgz" -C "$WORK" --exclude cache .
}

dice-verifier serve --listen "127.0.0.1:$PORT" --slots-per-gpu 2 --cache-dir "$WORK/cache" \
  --plain-logs >"$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 120); do grep -q "serving on" "$WORK/server.log" 2>/dev/null && break; sleep 1; done
head -3 "$WORK/server.log"
for policy in strict default; do
  stage "eval_$policy" "$EVAL_S" dice eval --reference-generations --problems "$DATA" \
    --verifier "127.0.0.1:$PORT" --policy "$policy" --out "$WORK/dice99_$policy" --no-plots
done
kill "$SERVER"; wait "$SERVER" 2>/dev/null
stage timing "$TIMING_S" python3 benchmarks/verifier_timing.py "$DATA" --pairs 20 \
  --slots-per-gpu 1,4 --cache-dir "$WORK/cache" --out "$WORK/timing.json"

echo
echo "================ issue 16 on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null) ================"
cat "$WORK/stages.txt"
for policy in strict default; do
  echo "--- DICE 99 infilling, reference generations, policy $policy"
  python3 -c "import json,sys; o=json.load(open(sys.argv[1]))['overall']; print(o['outcomes']); print({k: v for k, v in o.items() if k != 'outcomes'})" \
    "$WORK/dice99_$policy/summary.json" 2>&1 | cut -c1-1500
done
echo "--- timing"
sed -n '/^summary:/,$p' "$WORK/timing.log"
tar -czf "$OUT/results.tgz" -C "$WORK" --exclude cache .

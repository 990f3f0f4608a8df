#!/usr/bin/env bash
# Issue 26 (rewards at RL speed) and issue 25 item 4 (the scaled run budget) on one H200 box
# (16 cores), in device calls of ~9 minutes each. Logs go to $OUT (the device tool's output
# folder; /tmp/gpu_rl_speed elsewhere) with every JSON; a summary is printed last.
#
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON           # ~9 min: install; the run stage's new GPU
#       tests (tests/verifier/test_verifier_gpu_rl_speed.py, the comparison on CUDA tensors: 208 s
#       on an H100 on 2026-12-06, so the throughput stage gets what the deadline leaves);
#       verifier_rl_burst.py (16 problems x 8 samples a step, phase 1, cold cache, no step
#       started after 90 s of steps: 2-3 steps);
#       verifier_throughput.py --candidates 70 (cold cache, 4 one at a time, no naive path)
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON suites    # ~9 min: the GPU hostile suite
#       (tests/adversarial/test_adversarial_gpu.py, 100-108 s on 2026-12-04),
#       tests/verifier/test_verifier_gpu.py but its DICE 3497 test (DICE's 99 included: 205 s plus
#       a 53 s start-up, 331 s in all, on 2026-12-05 while 3497 failed fast; DICE's 99 alone took
#       377 s on an H100 once 3497 ran to OK), and verifier_run_stage.py (64 jobs of one
#       kernel at 4 slots: the next pair set up after the running job's timing vs at its fork,
#       both sides' warm-ups one after the other vs at once, two pairs forked ahead vs one, and
#       job processes that block on synchronisation vs spin; jobs/s, the job processes' CPU and
#       the median speedup, two rounds each) if time is left
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON profile   # ~3 min: py-spy (25 Hz, the first 75 s;
#       SPY_ARGS and SPY_RATE change it: `--native --rate 50` fell behind on an H100 on 2026-12-06
#       and the stage limit killed it before it wrote anything) records verifier_run_stage.py's
#       40 jobs at 4 slots; benchmarks/profile_jobs.py prints each role's CPU per job and its
#       costliest functions
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON churn     # ~5 min: gpu_setup_cost.py's set-up steps (1
#       and 8 at once) and --churn (CUDA contexts made and torn down a second, 1-16 at once; then
#       4 and 8 at once with 0.5 s of GPU work each), verifier_run_stage.py at 1, 2 and 4 slots
#       (32 jobs; CHURN_SLOTS): what bounds the run stage at ~1.9 jobs/s at 4 slots and at 8 (run 24
#       on an H100: ~5 contexts a second from 2 at once on). CHURN_ENV="NAME=VALUE ..." adds the
#       churn with that environment (e.g. CUDA_DEVICE_MAX_CONNECTIONS=1: fewer work queues a context)
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON kept      # ~8 min: judges kept for JUDGE_JOBS jobs
#       (default 64, worker/process.py): verifier_run_stage.py (64 jobs at 4 slots, defaults, a
#       judge per job, kept), the GPU hostile suite through kept judges; with CHURN_ENV also the
#       churn (2 and 4 at once) with and without it
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON kept_suites  # ~9 min: test_verifier_gpu.py (DICE's
#       99 but 3497) and verifier_rl_burst.py (split on) through judges kept for JUDGE_JOBS jobs
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON memory    # ~6 min: the DICE 3497 test (4 GiB
#       outputs, two seeds: 312 s on the H200 on 2026-12-04, each retried alone; 303 s on an H100
#       on 2026-12-05, checked per batch, OK at once)
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON levers    # ~8 min: verifier_run_stage.py (40 jobs of one
#       kernel at 4 slots: defaults; the next pair set up at its fork and both warm-ups at once;
#       30 timing trials instead of 100; all three), then verifier_rl_burst.py with all three
#       (--server-set; a cold and a warm step)
#   bash benchmarks/gpu_rl_speed.sh DICE_JSON timing    # ~9 min: verifier_timing.py at 1 slot
#       (item 4; 105 s on an H100 on 2026-12-05), verifier_timing_state.py (which state of the
#       candidate's process slows its calls: one process per state), verifier_run_stage.py's
#       fork/together variants; SPLIT_S=N adds verifier_split_compile.py --further-includes
#       --warm-front-ends (its shared build took 65 s there; it did not finish in 200 s)
#
# The DICE file does not travel with ../shared: copy ../shared/data/dice/ into .carry/dice
# (git-ignored) and carry `.carry`; wheels in .whl/ (../shared/device/wheels.sh: the image lacks
# grain, array-record, portpicker, pyseccomp, grpcio-health-checking, grpcio-reflection) are
# installed first. Stage limits: TESTS_S, BURST_S, THROUGHPUT_S, FRONT_ENDS_S (first part) and
# ADVERSARIAL_S, DICE_S, RUN_STAGE_S (second part), TIMING_S, STATE_S, RUN_STAGE_S, SPLIT_S (timing);
# TESTS_S=0, THROUGHPUT_S=0 and RUN_STAGE_S=0 skip those stages, ADVERSARIAL_S=N adds the GPU
# hostile suite to the first part,
# FRONT_ENDS_S=N adds verifier_warm_front_ends.py --split on 32 DICE candidates (its start-up took
# 88 s on the H200). BURST_ARGS and THROUGHPUT_ARGS pass flags on (e.g. "--server-set
# compile_split=true", "--compile-split"); BURST_BUDGET_S is the burst's --budget-s.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_rl_speed}
mkdir -p "$OUT"
DATA=${1:?usage: gpu_rl_speed.sh DICE_JSON [suites]}
PART=${2:-main}
export PYTHONUNBUFFERED=1 PYTHONPATH=.
DEADLINE_S=${DEADLINE_S:-570}
STAGE_DIR=$OUT
source benchmarks/stage.sh
# The device tool brings back at most 8 files of $OUT: every log and JSON is also in one archive,
# written after each stage, so the builds' records (.builds.jsonl) come back too.
after_stage() {
  tar -czf "$OUT/.logs.tgz" -C "$OUT" --exclude logs.tgz --exclude .logs.tgz . && mv "$OUT/.logs.tgz" "$OUT/logs.tgz"
}

nvidia-smi --query-gpu=name,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
git log --oneline -1 >"$OUT/commit.txt" 2>&1
if compgen -G ".whl/*.whl" >/dev/null; then  # what the image lacks (../shared/device/wheels.sh)
  stage wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
fi
stage install 90 python3 -m pip install -q --no-deps --no-build-isolation -e .
# verifier_run_stage.py: 64 jobs of one kernel at 4 slots, the next pair set up after the running
# job's timing vs at its fork, both sides' warm-ups one after the other vs at once, two pairs
# ahead vs one, blocking vs spinning synchronisation (jobs/s, the job processes' CPU and median
# speedup, two rounds each); a limit of 0 skips it.
run_stage_variants() {
  [ "$1" != 0 ] || return 0
  stage run_stage "$1" python3 benchmarks/verifier_run_stage.py --jobs 64 --slots-per-gpu 4 \
    --rounds 2 --variant fork:standby_setup_at_fork=true --variant together:warmup_together=true \
    --variant ahead:standby_pairs=2 --variant blocking:cuda_blocking_sync=true \
    --json "$OUT/run_stage.json"
}
run_stage_summary() {  # the variants' names (default: run_stage_variants's)
  echo "--- verifier_run_stage.py"
  [ -f "$OUT/run_stage.log" ] && grep -E "^(round|base|${1:-fork|together|ahead|blocking})" "$OUT/run_stage.log"
}

case "$PART" in
  main)
    if [ "${TESTS_S:-240}" != 0 ]; then
      stage tests "${TESTS_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
        tests/verifier/test_verifier_gpu_rl_speed.py tests/verifier/test_verifier_correctness.py
    fi
    # shellcheck disable=SC2086  # BURST_ARGS is a list of flags
    stage rl_burst "${BURST_S:-210}" python3 benchmarks/verifier_rl_burst.py --data "$DATA" \
      --steps 3 --budget-s "${BURST_BUDGET_S:-90}" ${BURST_ARGS:-} --json "$OUT/verifier_rl_burst.json"
    if [ -n "${FRONT_ENDS_S:-}" ]; then  # warm front ends: fork servers against nvcc's own runs
      stage front_ends "$FRONT_ENDS_S" python3 benchmarks/verifier_warm_front_ends.py --data "$DATA" \
        --count 32 --jobs "$(nproc)" --rounds 1 --split
    fi
    if [ "${THROUGHPUT_S:-170}" != 0 ]; then
      # shellcheck disable=SC2086
      stage throughput "${THROUGHPUT_S:-170}" python3 benchmarks/verifier_throughput.py \
        --data "$DATA" --candidates 70 --latency-candidates 4 --skip-naive ${THROUGHPUT_ARGS:-} \
        --json "$OUT/throughput.json"
    fi
    if [ "${ADVERSARIAL_S:-0}" != 0 ]; then  # the GPU hostile suite too (as `suites` runs it)
      stage adversarial "$ADVERSARIAL_S" python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
        tests/adversarial/test_adversarial_gpu.py
    fi
    echo
    echo "================ issue 26 on $(tail -1 "$OUT/gpu.txt") at $(cat "$OUT/commit.txt") ================"
    cat "$OUT/stages.txt"
    [ -f "$OUT/tests.log" ] && tail -5 "$OUT/tests.log"
    echo "--- verifier_rl_burst.py"
    grep -E "^(step|  outcomes|  GPU slot|  CPU-s|==|server|compiler|targets)" "$OUT/rl_burst.log"
    [ -f "$OUT/front_ends.log" ] && { echo "--- verifier_warm_front_ends.py"; tail -12 "$OUT/front_ends.log"; }
    [ -f "$OUT/throughput.log" ] && { echo "--- verifier_throughput.py --candidates 70"
      sed -n '/^== service ==/,$p' "$OUT/throughput.log" | head -20; }
    [ -f "$OUT/adversarial.log" ] && { echo "--- adversarial"; tail -4 "$OUT/adversarial.log"; }
    ;;
  suites)
    stage adversarial "${ADVERSARIAL_S:-160}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
      tests/adversarial/test_adversarial_gpu.py
    export DICE_INFILLING_JSON="$DATA" DICE_REPORT_DIR="$OUT"
    stage verifier_gpu "${DICE_S:-400}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
      tests/verifier/test_verifier_gpu.py -k "not 4_gib"
    run_stage_variants "${RUN_STAGE_S:-130}"
    echo
    echo "================ issue 26 suites on $(tail -1 "$OUT/gpu.txt") at $(cat "$OUT/commit.txt") ================"
    cat "$OUT/stages.txt"
    for name in adversarial verifier_gpu; do echo "--- $name"; tail -4 "$OUT/$name.log"; done
    run_stage_summary
    ;;
  levers)
    stage run_stage "${RUN_STAGE_S:-220}" python3 benchmarks/verifier_run_stage.py --jobs 40 \
      --slots-per-gpu 4 --rounds "${ROUNDS:-1}" \
      --variant both:standby_setup_at_fork=true+warmup_together=true \
      --variant t30:timing_trials=30 \
      --variant all:standby_setup_at_fork=true+warmup_together=true+timing_trials=30 \
      --json "$OUT/run_stage.json"
    # shellcheck disable=SC2086
    stage rl_burst "${BURST_S:-260}" python3 benchmarks/verifier_rl_burst.py --data "$DATA" \
      --steps 3 --budget-s "${BURST_BUDGET_S:-100}" --server-set compile_split=true \
      --server-set standby_setup_at_fork=true --server-set warmup_together=true \
      --server-set timing_trials=30 ${BURST_ARGS:-} --json "$OUT/verifier_rl_burst.json"
    echo
    echo "================ issue 26 levers on $(tail -1 "$OUT/gpu.txt") at $(cat "$OUT/commit.txt") ================"
    cat "$OUT/stages.txt"
    run_stage_summary "both|t30|all"
    echo "--- verifier_rl_burst.py"
    grep -E "^(step|  outcomes|  GPU slot|  CPU-s|==|server|compiler|targets)" "$OUT/rl_burst.log"
    ;;
  profile)  # py-spy (a wheel in .whl/) on the run stage: where a job's processes spend their CPU
    stage profile "${PROFILE_S:-200}" py-spy record --subprocesses ${SPY_ARGS:---rate 25 --duration 75} \
      --format raw -o "$OUT/spy.txt" -- python3 benchmarks/verifier_run_stage.py --jobs 40 \
      --slots-per-gpu 4 --rounds 1 --json "$OUT/run_stage_profiled.json"
    python3 benchmarks/profile_jobs.py "$OUT/spy.txt" --rate "${SPY_RATE:-25}" --jobs 40 --top 40 \
      >"$OUT/profile.txt" 2>&1
    echo
    echo "================ issue 26 profile on $(tail -1 "$OUT/gpu.txt") at $(cat "$OUT/commit.txt") ================"
    cat "$OUT/stages.txt"
    grep -E "^(round|base)" "$OUT/profile.log"
    tail -3 "$OUT/profile.log"
    head -c 7000 "$OUT/profile.txt"
    ;;
  churn)  # how many CUDA contexts the GPU makes and tears down a second, by how many at once
    stage churn "${CHURN_S:-240}" python3 benchmarks/gpu_setup_cost.py --processes 1 8 --rounds 2 \
      --churn 1 2 4 8 16 --churn-s 15
    stage churn_work "${CHURN_S:-240}" python3 benchmarks/gpu_setup_cost.py --processes \
      --churn 4 8 --churn-s 15 --churn-work-s 0.5
    if [ -n "${CHURN_ENV:-}" ]; then  # the same churn with the children's environment changed
      # shellcheck disable=SC2086  # CHURN_ENV is a list of NAME=VALUE
      stage churn_env "${CHURN_S:-240}" env $CHURN_ENV python3 benchmarks/gpu_setup_cost.py \
        --processes --churn 1 2 4 8 --churn-s 15
    fi
    churn_slots=${CHURN_SLOTS:-1 2 4}  # the run stage's jobs a second by slots (4: ~1.9, runs 20-23)
    for slots in $churn_slots; do
      stage "run_stage_$slots" "${RUN_STAGE_S:-90}" python3 benchmarks/verifier_run_stage.py \
        --jobs 32 --slots-per-gpu "$slots" --rounds 1 --json "$OUT/run_stage_$slots.json"
    done
    echo
    echo "================ issue 26 churn on $(tail -1 "$OUT/gpu.txt") at $(cat "$OUT/commit.txt") ================"
    cat "$OUT/stages.txt"
    cat "$OUT/churn.log" "$OUT/churn_work.log"
    [ -f "$OUT/churn_env.log" ] && { echo "--- churn with $CHURN_ENV"; cat "$OUT/churn_env.log"; }
    for slots in $churn_slots; do grep -h -E "^round" "$OUT/run_stage_$slots.log"; done
    ;;
  kept)  # judges kept for JUDGE_JOBS jobs (default 64; worker/process.py): one context a job
    jobs=${JUDGE_JOBS:-64}
    stage run_stage "${RUN_STAGE_S:-170}" python3 benchmarks/verifier_run_stage.py --jobs 64 \
      --slots-per-gpu 4 --rounds "${ROUNDS:-1}" --variant per_job:judge_jobs=1 \
      --variant "kept:judge_jobs=$jobs" --json "$OUT/run_stage.json"
    export DICE_VERIFIER_JUDGE_JOBS=$jobs  # tests/verifier/verifier_harness.make_config
    stage adversarial "${ADVERSARIAL_S:-170}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
      tests/adversarial/test_adversarial_gpu.py
    unset DICE_VERIFIER_JUDGE_JOBS
    if [ -n "${CHURN_ENV:-}" ]; then  # contexts a second with CHURN_ENV against without
      stage churn 60 python3 benchmarks/gpu_setup_cost.py --processes --churn 2 4 --churn-s 10
      # shellcheck disable=SC2086  # CHURN_ENV is a list of NAME=VALUE
      stage churn_env 60 env $CHURN_ENV python3 benchmarks/gpu_setup_cost.py --processes \
        --churn 2 4 --churn-s 10
    fi
    echo
    echo "================ issue 26 kept judges on $(tail -1 "$OUT/gpu.txt") at $(cat "$OUT/commit.txt") ================"
    cat "$OUT/stages.txt"
    run_stage_summary "per_job|kept"
    echo "--- adversarial (judges kept for $jobs jobs)"; tail -4 "$OUT/adversarial.log"
    for name in churn churn_env; do [ -f "$OUT/$name.log" ] && { echo "--- $name"; cat "$OUT/$name.log"; }; done
    ;;
  kept_suites)  # DICE's 99 and the RL burst through judges kept for JUDGE_JOBS jobs
    jobs=${JUDGE_JOBS:-64}
    export DICE_VERIFIER_JUDGE_JOBS=$jobs DICE_INFILLING_JSON="$DATA" DICE_REPORT_DIR="$OUT"
    stage verifier_gpu "${DICE_S:-400}" python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
      tests/verifier/test_verifier_gpu.py -k "not 4_gib"
    unset DICE_VERIFIER_JUDGE_JOBS
    # shellcheck disable=SC2086
    stage rl_burst "${BURST_S:-150}" python3 benchmarks/verifier_rl_burst.py --data "$DATA" \
      --steps 3 --budget-s "${BURST_BUDGET_S:-60}" --server-set compile_split=true \
      --server-set "judge_jobs=$jobs" ${BURST_ARGS:-} --json "$OUT/verifier_rl_burst.json"
    echo
    echo "================ issue 26 kept-judge suites on $(tail -1 "$OUT/gpu.txt") at $(cat "$OUT/commit.txt") ================"
    cat "$OUT/stages.txt"
    echo "--- verifier_gpu (judges kept for $jobs jobs)"; tail -4 "$OUT/verifier_gpu.log"
    echo "--- verifier_rl_burst.py"
    grep -E "^(step|  outcomes|  GPU slot|  CPU-s|==|server|compiler|targets)" "$OUT/rl_burst.log"
    ;;
  memory)
    export DICE_INFILLING_JSON="$DATA"
    stage memory "${MEMORY_S:-420}" python3 -m pytest -q -s -m gpu -p no:cacheprovider -rs \
      --durations=3 tests/verifier/test_verifier_gpu.py -k 4_gib
    echo
    cat "$OUT/stages.txt"
    grep -E "DICE 3497|passed|failed" "$OUT/memory.log"
    ;;
  timing)
    stage timing "${TIMING_S:-170}" python3 benchmarks/verifier_timing.py "$DATA" --pairs 20 \
      --slots-per-gpu 1 --cache-dir /tmp/gpu_rl_speed_cache --out "$OUT/timing_rows.json"
    stage state "${STATE_S:-200}" python3 benchmarks/verifier_timing_state.py "$DATA" --pairs 12 \
      --cache-dir /tmp/gpu_rl_speed_cache --out "$OUT/timing_state.json"
    run_stage_variants "${RUN_STAGE_S:-150}"
    if [ "${SPLIT_S:-0}" != 0 ]; then
      stage split "$SPLIT_S" python3 benchmarks/verifier_split_compile.py --data "$DATA" \
        --further-includes --warm-front-ends
    fi
    echo
    cat "$OUT/stages.txt"
    echo "--- verifier_timing.py"; sed -n '/^summary:/,$p' "$OUT/timing.log" | head -30
    echo "--- verifier_timing_state.py"; grep -E "^(none|calls|dynamo|audit|trace|ops|both|mon) " "$OUT/state.log"
    run_stage_summary
    [ -f "$OUT/split.log" ] && { echo "--- verifier_split_compile.py"; tail -12 "$OUT/split.log"; }
    ;;
  *) echo "unknown part $PART (main, suites, levers, profile, churn, memory or timing)"; exit 2 ;;
esac

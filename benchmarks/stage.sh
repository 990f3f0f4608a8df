# Sourced by the one-call GPU scripts (gpu_speed.sh, gpu_verifier.sh, gpu_two.sh):
#   stage NAME LIMIT_S COMMAND...
# runs COMMAND under `timeout`, its output in $STAGE_DIR/NAME.log, and appends
# "NAME: exit RC after N s (limit L s)" to $STAGE_DIR/stages.txt (and stdout). With DEADLINE_S set,
# no stage runs past that many seconds of the script (the device tool gives a call 600 s); with
# a function `after_stage` defined, it runs after every stage (e.g. to archive what exists so far).
stage() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  if [ -n "${DEADLINE_S:-}" ]; then
    local left=$((DEADLINE_S - SECONDS - 10))
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
    if [ "$limit" -le 0 ]; then echo "$name: skipped, no time left" | tee -a "$STAGE_DIR/stages.txt"; return; fi
  fi
  timeout "$limit" "$@" >"$STAGE_DIR/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - start)) s (limit $limit s)" | tee -a "$STAGE_DIR/stages.txt"
  if declare -F after_stage >/dev/null; then after_stage; fi
}

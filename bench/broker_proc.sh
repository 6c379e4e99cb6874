# Shared by bench/backlog.sh and bench/startup.sh: scratch space, and stopping the one broker
# (and the one helper process) a script started. Source it after defining `log`, with ROOT and
# STOP_TIMEOUT_S set and the scratch's name in SCRATCH_NAME. It sets WORK (the scratch
# directory, under target/: the repo's file system, not tmpfs) and traps EXIT, INT and TERM.
# BROKER_PID is the broker's pid and HELPER_PID a helper's ("" when none runs); stop_broker
# sets STOP_S.

# Whether process $1 runs: an exited child that is not reaped yet (a zombie) does not, though
# kill -0 still finds it.
running() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [ "${s%% *}" != Z ]
}
# SIGTERM, then SIGKILL after STOP_TIMEOUT_S; sets STOP_S to the seconds it took. Runs in the
# main shell (never in $(...)): only the broker's parent can reap it.
stop_broker() {
  local pid=$BROKER_PID start
  [ -n "$pid" ] || return 0
  start=$(date +%s.%N)
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((STOP_TIMEOUT_S * 100))); do running "$pid" || break; sleep 0.01; done
  if running "$pid"; then
    log "broker (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT_S}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  BROKER_PID=""
  STOP_S=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
}
# kill -9, as a crash would.
crash_broker() {
  [ -n "$BROKER_PID" ] || return 0
  kill -KILL "$BROKER_PID" 2>/dev/null || true
  wait "$BROKER_PID" 2>/dev/null || true
  BROKER_PID=""
}

mkdir -p "$ROOT/target"
WORK=$(mktemp -d "$ROOT/target/$SCRATCH_NAME.XXXXXX")
BROKER_PID=""
HELPER_PID=""
STOP_S=""
cleanup() {
  local status=$?
  if [ -n "$HELPER_PID" ]; then kill "$HELPER_PID" 2>/dev/null || true; wait "$HELPER_PID" 2>/dev/null || true; fi
  if [ -n "$BROKER_PID" ]; then log "stopping broker (pid $BROKER_PID)"; stop_broker; fi
  if [ "${KEEP_WORK:-0}" = 1 ] || [ $status -ne 0 ]; then
    log "scratch kept in $WORK"
  else
    rm -rf "$WORK"
  fi
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Shared by bench/backlog.sh and bench/startup.sh: stopping the one broker a script started.
# Source it after defining `log`; it uses BROKER_PID (the broker's pid, "" when none runs),
# STOP_TIMEOUT_S, and sets STOP_S.

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

#!/usr/bin/env bash
# Start-up and recovery time of one Haven broker (issue 9's targets: ready to serve in under
# 100 ms on an empty store; a 1,000,000-message journal recovered in under 5 s), printed as a
# markdown block to paste into BENCHMARKS.md.
#
#   bench/startup.sh                        # 10 empty starts, then a 1,000,000 x 1 KiB journal
#   N=20000 STARTS=3 RESTARTS=1 bench/startup.sh   # a quick look
#
# "Ready" is the time from the exec of `haven run` to a STOMP CONNECT answered by CONNECTED,
# both read on CLOCK_MONOTONIC by bench/startup_probe.py, which polls the port about every
# millisecond (it starts polling before the broker is started, so its own start-up is not in
# the figure). Also reported: exec to the first accepted TCP connection, and the broker's own
# "journal recovered ... ms=" log figure.
#   (i) empty store: STARTS starts, each on a data directory that does not exist yet, each
#       stopped with SIGTERM once it answered.
#  (ii) recovery: N persistent messages are sent with `haven bench --consumers 0` (fill as in
#       bench/backlog.sh); then RESTARTS times: kill -9 and a timed start on the same directory;
#       then RESTARTS times: SIGTERM (graceful stop, timed) and a timed start; last, a
#       `haven bench --drain-only` run checks that every message survived exactly once.
#
# Environment (defaults in brackets):
#   STARTS [10]           empty-store starts
#   N [1000000]           messages in the journal for (ii); 0 skips (ii)
#   SIZE [1024]           body bytes
#   RESTARTS [3]          timed starts after kill -9, and as many after SIGTERM
#   PRODUCERS [2]  RECEIPT_EVERY [1000]  RECEIPT_WINDOW [16]   the fill
#   DRAIN_TIMEOUT_S [120]  the drain: how long without a delivery before messages count as lost
#   SETTLE_S [1]          how long a started broker runs before it is stopped or killed
#   READY_TIMEOUT_S [300] a start that has not answered CONNECTED by then fails
#   DROP_CACHES [0]       1 = drop the page cache before each timed restart, so recovery reads
#                         the journal from disk (root only; affects the whole machine)
#   HAVEN_PORT [61653]    STOMP port on 127.0.0.1
#   HAVEN_BIN             use this binary instead of building target/release/haven
#   KEEP_WORK=1           keep the scratch directory (data, broker logs)
# Scratch lives under target/ (the repo's file system, not tmpfs), like bench/compare.sh's.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
  -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
  "") ;;
  *) echo "startup.sh: no arguments; configure with environment variables (--help)" >&2; exit 2 ;;
esac
STARTS=${STARTS:-10}
N=${N:-1000000}
SIZE=${SIZE:-1024}
RESTARTS=${RESTARTS:-3}
PRODUCERS=${PRODUCERS:-2}
RECEIPT_EVERY=${RECEIPT_EVERY:-1000}
RECEIPT_WINDOW=${RECEIPT_WINDOW:-16}
DRAIN_TIMEOUT_S=${DRAIN_TIMEOUT_S:-120}
SETTLE_S=${SETTLE_S:-1}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-300}
DROP_CACHES=${DROP_CACHES:-0}
HAVEN_PORT=${HAVEN_PORT:-61653}
QUEUE=/queue/startup
# Issue 9's targets, in milliseconds. The recovery target is for a 1,000,000-message journal.
EMPTY_TARGET_MS=100
RECOVERY_TARGET_MS=5000
RECOVERY_TARGET_N=1000000
# Bound on a graceful stop, in seconds, before SIGKILL.
STOP_TIMEOUT_S=60

log() { echo "[startup] $*" >&2; }
die() { log "$*"; exit 1; }

# --- scratch space and cleanup ----------------------------------------------------------------
SCRATCH_NAME=bench-startup
source "$ROOT/bench/broker_proc.sh"

# --- checks -----------------------------------------------------------------------------------
for v in STARTS N SIZE RESTARTS PRODUCERS RECEIPT_EVERY RECEIPT_WINDOW DRAIN_TIMEOUT_S SETTLE_S \
  READY_TIMEOUT_S HAVEN_PORT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v=${!v} is not a whole number"
done
[ "$STARTS" -ge 1 ] || die "STARTS must be at least 1"
[ "$N" -eq 0 ] || [ "$RESTARTS" -ge 1 ] || die "RESTARTS must be at least 1 (or N=0)"
[ "$N" -eq 0 ] || [ "$N" -ge "$PRODUCERS" ] || die "N must be at least PRODUCERS"
if [ "$DROP_CACHES" = 1 ]; then
  [ -w /proc/sys/vm/drop_caches ] || die "DROP_CACHES=1 needs root (/proc/sys/vm/drop_caches)"
fi
command -v python3 >/dev/null || die "python3 is needed for the timing helper"
PROBE=(python3 "$ROOT/bench/startup_probe.py")
# The journal holds every message once plus framing; ask for twice the payload to be safe.
need_kib=$(( N * (SIZE + 256) * 2 / 1024 + 262144 ))
free_kib=$(df -Pk "$WORK" | awk 'NR == 2 { print $4 }')
[ "$free_kib" -ge "$need_kib" ] \
  || die "$WORK has $((free_kib / 1024)) MiB free; this needs about $((need_kib / 1024)) MiB"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port_free "$HAVEN_PORT" || die "port $HAVEN_PORT is busy (set HAVEN_PORT)"

if [ -z "${HAVEN_BIN:-}" ]; then
  log "building haven (release)"
  (cd "$ROOT" && cargo build --release -p haven-cli >&2)
  target=${CARGO_TARGET_DIR:-target}
  case "$target" in /*) ;; *) target="$ROOT/$target" ;; esac
  HAVEN_BIN="$target/release/haven"
fi
[ -x "$HAVEN_BIN" ] || die "$HAVEN_BIN is not executable"

# --- a timed start ----------------------------------------------------------------------------
# Starts the broker on data directory $1, logging to $2, and waits until it answers CONNECTED.
# Sets BROKER_PID and TIMED to "<ready ms> <listen ms> <connect attempts>".
TIMED=""
timed_start() { # data_dir log_file
  local stamp="$WORK/stamp" ready="$WORK/ready" out="$WORK/probe.out" status=0
  rm -f "$stamp" "$ready" "$out"
  port_free "$HAVEN_PORT" || die "port $HAVEN_PORT is busy before a start"
  "${PROBE[@]}" wait "$stamp" --port "$HAVEN_PORT" --ready "$ready" --timeout-s "$READY_TIMEOUT_S" \
    >"$out" &
  HELPER_PID=$!
  # The waiter polls from the moment the ready file exists; its Python start-up is not timed.
  for _ in $(seq 1000); do
    [ -e "$ready" ] && break
    running "$HELPER_PID" || break
    sleep 0.01
  done
  [ -e "$ready" ] || die "the timing helper did not start"
  "${PROBE[@]}" exec "$stamp" -- "$HAVEN_BIN" run --data "$1" --stomp "127.0.0.1:$HAVEN_PORT" \
    >>"$2" 2>&1 &
  BROKER_PID=$!
  wait "$HELPER_PID" || status=$?
  HELPER_PID=""
  if [ $status -ne 0 ]; then
    tail -5 "$2" >&2
    die "the broker did not become ready (helper exit $status)"
  fi
  TIMED=$(cat "$out")
}

# The broker's own figure from its last start: "journal recovered records=.. messages=.. ms=..".
recovered_field() { # log_file field
  grep 'journal recovered' "$1" | tail -1 | sed -n "s/.* $2=\([0-9]*\).*/\1/p"
}

# "median min max" of the numbers given, one decimal.
stats() {
  python3 -c 'import statistics, sys
xs = [float(x) for x in sys.argv[1:]]
print(f"{statistics.median(xs):.1f} {min(xs):.1f} {max(xs):.1f}")' "$@"
}
verdict() { # median_ms target_ms
  awk -v m="$1" -v t="$2" 'BEGIN { if (m < t) print "met"; else print "**missed**" }'
}
drop_caches() {
  if [ "$DROP_CACHES" = 1 ]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi
}

# --- (i) empty store --------------------------------------------------------------------------
declare -a empty_ready=() empty_listen=() empty_own=()
for i in $(seq "$STARTS"); do
  dir="$WORK/empty-$i"
  timed_start "$dir" "$WORK/empty.log"
  read -r ready listen attempts <<<"$TIMED"
  empty_ready+=("$ready"); empty_listen+=("$listen")
  empty_own+=("$(recovered_field "$WORK/empty.log" ms)")
  log "empty start $i: ready in $ready ms (listening at $listen ms, $attempts connect attempts)"
  sleep "$SETTLE_S"
  stop_broker
  rm -rf "$dir"
done

# --- (ii) recovery ----------------------------------------------------------------------------
declare -a kill_ready=() kill_own=() term_ready=() term_own=() term_stop=() recovered_msgs=()
fill_json="" drain_json="" drain_status=0 fill_wall=""
if [ "$N" -gt 0 ]; then
  DATA="$WORK/data"
  LOGF="$WORK/recovery.log"
  timed_start "$DATA" "$LOGF"
  RUN_ID=$(( ($(date +%s%N) ^ ($$ << 40)) & 0x7fffffffffffffff ))
  COMMON=(--url "127.0.0.1:$HAVEN_PORT" --destination "$QUEUE" --run-id "$RUN_ID" --json
    --producers "$PRODUCERS" --count "$N" --size "$SIZE" --persistent true --warmup 0)
  log "fill: $N x $SIZE B persistent, $PRODUCERS producer(s), receipt every $RECEIPT_EVERY"
  t=$(date +%s.%N)
  fill_status=0
  fill_json=$("$HAVEN_BIN" bench "${COMMON[@]}" --consumers 0 --receipt-every "$RECEIPT_EVERY" \
    --receipt-window "$RECEIPT_WINDOW" --label startup-fill) || fill_status=$?
  fill_wall=$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  [ $fill_status -eq 0 ] || die "fill failed (exit $fill_status): $fill_json"
  log "fill: ${fill_wall}s"
  sleep "$SETTLE_S"

  # A timed start on the journal after the broker was stopped; appends the time to CONNECTED
  # to the array named $1 and the broker's own recovery time to the one named $2.
  timed_restart() { # ready-array own-array what
    local -n ready_out=$1 own_out=$2
    drop_caches
    timed_start "$DATA" "$LOGF"
    read -r ready listen attempts <<<"$TIMED"
    ready_out+=("$ready"); own_out+=("$(recovered_field "$LOGF" ms)")
    recovered_msgs+=("$(recovered_field "$LOGF" messages)")
    log "after $3: ready in $ready ms (listening at $listen ms)"
    sleep "$SETTLE_S"
  }
  for r in $(seq "$RESTARTS"); do
    crash_broker
    timed_restart kill_ready kill_own "kill -9 ($r)"
  done
  for r in $(seq "$RESTARTS"); do
    stop_broker
    term_stop+=("$(awk -v s="$STOP_S" 'BEGIN { printf "%.0f", s * 1000 }')")
    timed_restart term_ready term_own "SIGTERM ($r, stop took ${STOP_S}s)"
  done

  log "drain: checking that all $N messages survived exactly once"
  drain_json=$("$HAVEN_BIN" bench "${COMMON[@]}" --drain-only --consumers 1 --ack client \
    --prefetch 1000 --drain-timeout-s "$DRAIN_TIMEOUT_S" --label startup-drain) || drain_status=$?
  [ $drain_status -eq 0 ] || log "drain FAILED (exit $drain_status): $drain_json"
  stop_broker
fi

# --- summary ----------------------------------------------------------------------------------
json() { # json_text key -> value ("" when missing or not JSON)
  python3 -c 'import json,sys
try: v = json.loads(sys.argv[1]).get(sys.argv[2])
except Exception: v = None
print("" if v is None else v)' "$1" "$2"
}
row() { # label target_ms values...
  local label=$1 target=$2 med min max v
  shift 2
  read -r med min max <<<"$(stats "$@")"
  v="n/a (the target is for $(thousands "$RECOVERY_TARGET_N") messages)"
  [ -z "$target" ] || v="< $target ms: $(verdict "$med" "$target")"
  echo "| $label | $# | $med | $min | $max | $v |"
}
own() { # values... -> "median" of the broker's own figures, or n/a
  local xs=()
  for x in "$@"; do [ -n "$x" ] && xs+=("$x"); done
  if [ ${#xs[@]} -gt 0 ]; then stats "${xs[@]}" | awk '{ print $1 }'; else echo n/a; fi
}

# 1000000 -> 1,000,000 (printf's %'d groups only in locales that define it; C does not).
thousands() { echo "$1" | sed -e ':a' -e 's/\([0-9]\)\([0-9]\{3\}\)\($\|,\)/\1,\2\3/' -e 'ta'; }

recovery_target=""
if [ "$N" -ge "$RECOVERY_TARGET_N" ]; then recovery_target=$RECOVERY_TARGET_MS; fi
cat <<EOF

### Start-up and recovery: empty store, and $(thousands "$N") x $SIZE B persistent

\`STARTS=$STARTS N=$N SIZE=$SIZE RESTARTS=$RESTARTS DROP_CACHES=$DROP_CACHES bench/startup.sh\`
— $(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), \
$(nproc) CPU(s), $(uname -r), load average $(cut -d' ' -f1 /proc/loadavg) at the end

| start | runs | exec → CONNECTED median (ms) | min | max | target |
|---|---:|---:|---:|---:|---|
$(row "empty store (a new data directory)" "$EMPTY_TARGET_MS" "${empty_ready[@]}")
EOF
if [ "$N" -gt 0 ]; then
  row "$(thousands "$N")-message journal, after kill -9" "$recovery_target" "${kill_ready[@]}"
  row "$(thousands "$N")-message journal, after SIGTERM" "$recovery_target" "${term_ready[@]}"
fi
echo
echo "Empty store: exec → listening (first TCP accept) median $(own "${empty_listen[@]}") ms; the broker's own" \
  "\"journal recovered ... ms\" median $(own "${empty_own[@]}") ms."
if [ "$N" -gt 0 ]; then
  accounting="sent $(json "$fill_json" sent), receipts $(json "$fill_json" receipts), \
delivered $(json "$drain_json" delivered) ($(json "$drain_json" unique) unique), \
lost $(json "$drain_json" lost), duplicates $(json "$drain_json" duplicates), \
redelivered $(json "$drain_json" redelivered_flagged), stale $(json "$drain_json" stale)"
  ok=$([ "$(json "$drain_json" ok)" = True ] && [ $drain_status -eq 0 ] && echo OK || echo FAILED)
  cat <<EOF
Recovery: the broker's own "journal recovered ... ms" median $(own "${kill_own[@]}") ms after kill -9,
$(own "${term_own[@]}") ms after SIGTERM; messages it recovered per start: ${recovered_msgs[*]}.
Graceful stops (SIGTERM to exit) took $(own "${term_stop[@]}") ms (median). Fill: $(thousands "$N") messages,
$PRODUCERS producer(s), RECEIPT every $RECEIPT_EVERY, $(json "$fill_json" send_rate | awk '{ printf "%.0f", $1 }') msg/s (${fill_wall}s wall).
Page cache $([ "$DROP_CACHES" = 1 ] && echo "dropped before each restart" || echo "warm (DROP_CACHES=0)").
Drain after the last restart: $accounting → **$ok**.
EOF
  [ "$ok" = OK ] || exit 1
fi

#!/usr/bin/env bash
# Deep-backlog benchmark: one Haven broker, one queue filled with N persistent messages while no
# consumer is attached, then drained by consumers only. Measures fill and drain time, the
# broker's resident memory (VmRSS sampled every second, VmHWM peak per phase) and the data
# directory's size on disk, and prints a markdown block to paste into BENCHMARKS.md.
#
#   bench/backlog.sh                      # 5,000,000 x 1 KiB, memory_bytes_max 64 MiB
#   N=200000 MEMORY_BYTES_MAX= bench/backlog.sh   # quick run; key omitted (older brokers)
#
# The fill is `haven bench --consumers 0` (every message receipted, none consumed); the drain
# is `haven bench --drain-only` with the same --run-id, which checks that every message of the
# fill arrives exactly once (exit status non-zero otherwise).
#
# Environment (defaults in brackets):
#   N [5000000]             messages in the backlog
#   SIZE [1024]             body bytes
#   MEMORY_BYTES_MAX [67108864]  [limits] memory_bytes_max (the broker default); empty = leave the key out
#   PRODUCERS [2]  RECEIPT_EVERY [1000]  RECEIPT_WINDOW [16]     the fill
#   CONSUMERS [1]  ACK [client]  PREFETCH [1000]  DRAIN_TIMEOUT_S [120]   the drain
#   HAVEN_PORT [61623]      STOMP port on 127.0.0.1
#   HAVEN_BIN               use this binary instead of building target/release/haven
#   KEEP_WORK=1             keep the scratch directory (data, broker log, RSS samples)
# Scratch lives under target/ (the repo's file system, not tmpfs), like bench/compare.sh's.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
  -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
  "") ;;
  *) echo "backlog.sh: no arguments; configure with environment variables (--help)" >&2; exit 2 ;;
esac
N=${N:-5000000}
SIZE=${SIZE:-1024}
MEMORY_BYTES_MAX=${MEMORY_BYTES_MAX-67108864}
PRODUCERS=${PRODUCERS:-2}
RECEIPT_EVERY=${RECEIPT_EVERY:-1000}
RECEIPT_WINDOW=${RECEIPT_WINDOW:-16}
CONSUMERS=${CONSUMERS:-1}
ACK=${ACK:-client}
PREFETCH=${PREFETCH:-1000}
DRAIN_TIMEOUT_S=${DRAIN_TIMEOUT_S:-120}
HAVEN_PORT=${HAVEN_PORT:-61623}
QUEUE=/queue/backlog
# Bound on the broker's start-up and on its graceful stop, in seconds.
START_TIMEOUT_S=60
STOP_TIMEOUT_S=30

log() { echo "[backlog] $*" >&2; }
die() { log "$*"; exit 1; }

# --- scratch space and cleanup ----------------------------------------------------------------
mkdir -p "$ROOT/target"
WORK=$(mktemp -d "$ROOT/target/bench-backlog.XXXXXX")
BROKER_PID=""
SAMPLER_PID=""
STOP_S=""
# Graceful (SIGTERM), then SIGKILL after STOP_TIMEOUT_S; sets STOP_S to the seconds it took.
# Runs in the main shell (never in $(...)): only the broker's parent can reap it.
stop_broker() {
  local pid=$BROKER_PID start end
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  start=$(date +%s.%N)
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((STOP_TIMEOUT_S * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "broker (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT_S}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  end=$(date +%s.%N)
  BROKER_PID=""
  STOP_S=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
}
cleanup() {
  local status=$?
  if [ -n "$SAMPLER_PID" ]; then kill "$SAMPLER_PID" 2>/dev/null || true; wait "$SAMPLER_PID" 2>/dev/null || true; fi
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

# --- checks -----------------------------------------------------------------------------------
for v in N SIZE PRODUCERS RECEIPT_EVERY RECEIPT_WINDOW CONSUMERS PREFETCH DRAIN_TIMEOUT_S HAVEN_PORT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v=${!v} is not a whole number"
done
[ -z "$MEMORY_BYTES_MAX" ] || [[ $MEMORY_BYTES_MAX =~ ^[0-9]+$ ]] \
  || die "MEMORY_BYTES_MAX=$MEMORY_BYTES_MAX is not a whole number (or empty to omit the key)"
command -v python3 >/dev/null || die "python3 is needed to read the bench's JSON"
# The journal holds every message once plus framing; ask for twice the payload to be safe.
need_kib=$(( N * (SIZE + 256) * 2 / 1024 ))
free_kib=$(df -Pk "$WORK" | awk 'NR == 2 { print $4 }')
[ "$free_kib" -ge "$need_kib" ] \
  || die "$WORK has $((free_kib / 1024)) MiB free; the backlog needs about $((need_kib / 1024)) MiB"
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

# --- broker -----------------------------------------------------------------------------------
CONFIG="$WORK/haven.toml"
{
  echo "# generated by bench/backlog.sh"
  if [ -n "$MEMORY_BYTES_MAX" ]; then
    printf '[limits]\nmemory_bytes_max = %s\n' "$MEMORY_BYTES_MAX"
  fi
} >"$CONFIG"
mkdir -p "$WORK/data"
"$HAVEN_BIN" run --data "$WORK/data" --stomp "127.0.0.1:$HAVEN_PORT" --config "$CONFIG" \
  >"$WORK/haven.log" 2>&1 &
BROKER_PID=$!
for _ in $(seq $((START_TIMEOUT_S * 10))); do
  port_free "$HAVEN_PORT" || break
  kill -0 "$BROKER_PID" 2>/dev/null || { BROKER_PID=""; tail -5 "$WORK/haven.log" >&2; die "broker exited during start-up"; }
  sleep 0.1
done
port_free "$HAVEN_PORT" && die "broker did not listen on $HAVEN_PORT within ${START_TIMEOUT_S}s"
log "broker pid $BROKER_PID on 127.0.0.1:$HAVEN_PORT, data in $WORK/data"

status_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || true; }
rss_reset() { echo 5 >"/proc/$1/clear_refs" 2>/dev/null || true; } # resets VmHWM (Linux >= 4.0)
# Allocated size, like du; files the broker deletes meanwhile are skipped.
disk_kib() { { du -sk "$1" 2>/dev/null || true; } | awk '{ print $1 }'; }
mib() { awk -v k="${1:-0}" 'BEGIN { printf "%.0f", k / 1024 }'; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# RSS sampler: one line per second, "<seconds since start> <phase> <VmRSS KiB>".
PHASE_FILE="$WORK/phase"
echo start >"$PHASE_FILE"
(
  t0=$(date +%s)
  while kill -0 "$BROKER_PID" 2>/dev/null; do
    echo "$(( $(date +%s) - t0 )) $(cat "$PHASE_FILE") $(status_kib "$BROKER_PID" VmRSS)"
    sleep 1
  done
) >"$WORK/rss.tsv" &
SAMPLER_PID=$!
sampled_peak_kib() { awk -v p="$1" '$2 == p && $3 > m { m = $3 } END { print m + 0 }' "$WORK/rss.tsv"; }

RUN_ID=$(( ($(date +%s%N) ^ ($$ << 40)) & 0x7fffffffffffffff ))
COMMON=(--url "127.0.0.1:$HAVEN_PORT" --destination "$QUEUE" --run-id "$RUN_ID" --json
  --producers "$PRODUCERS" --count "$N" --size "$SIZE" --persistent true)

# --- fill -------------------------------------------------------------------------------------
log "fill: $N x $SIZE B persistent, $PRODUCERS producer(s), receipt every $RECEIPT_EVERY (window $RECEIPT_WINDOW)"
rss_start_kib=$(status_kib "$BROKER_PID" VmRSS)
rss_reset "$BROKER_PID"
echo fill >"$PHASE_FILE"
t=$(now)
fill_status=0
fill_json=$("$HAVEN_BIN" bench "${COMMON[@]}" --consumers 0 --receipt-every "$RECEIPT_EVERY" \
  --receipt-window "$RECEIPT_WINDOW" --label backlog-fill) || fill_status=$?
fill_wall=$(elapsed "$t" "$(now)")
fill_hwm_kib=$(status_kib "$BROKER_PID" VmHWM)
fill_end_kib=$(status_kib "$BROKER_PID" VmRSS)
fill_disk_kib=$(disk_kib "$WORK/data")
echo "$fill_json" >"$WORK/fill.json"
kill -0 "$BROKER_PID" 2>/dev/null || { BROKER_PID=""; tail -20 "$WORK/haven.log" >&2; die "broker died during the fill"; }
[ $fill_status -eq 0 ] || { tail -5 "$WORK/haven.log" >&2; die "fill failed (exit $fill_status): $fill_json"; }
log "fill: ${fill_wall}s wall, broker peak RSS $(mib "$fill_hwm_kib") MiB, data $(mib "$fill_disk_kib") MiB"

# --- drain ------------------------------------------------------------------------------------
log "drain: $CONSUMERS consumer(s), ack $ACK, prefetch $PREFETCH"
rss_reset "$BROKER_PID"
echo drain >"$PHASE_FILE"
t=$(now)
drain_status=0
drain_json=$("$HAVEN_BIN" bench "${COMMON[@]}" --drain-only --consumers "$CONSUMERS" \
  --ack "$ACK" --prefetch "$PREFETCH" --drain-timeout-s "$DRAIN_TIMEOUT_S" --label backlog-drain) \
  || drain_status=$?
drain_wall=$(elapsed "$t" "$(now)")
drain_hwm_kib=$(status_kib "$BROKER_PID" VmHWM)
drain_end_kib=$(status_kib "$BROKER_PID" VmRSS)
echo "$drain_json" >"$WORK/drain.json"
kill -0 "$BROKER_PID" 2>/dev/null || { BROKER_PID=""; tail -20 "$WORK/haven.log" >&2; die "broker died during the drain"; }
[ $drain_status -eq 0 ] || log "drain FAILED (exit $drain_status): $drain_json"
# Let one maintenance round (compaction, segment deletion) run before measuring the disk.
echo idle >"$PHASE_FILE"
sleep 3
drain_disk_kib=$(disk_kib "$WORK/data")
log "drain: ${drain_wall}s wall, broker peak RSS $(mib "$drain_hwm_kib") MiB, data $(mib "$drain_disk_kib") MiB"

echo stop >"$PHASE_FILE"
stop_broker
kill "$SAMPLER_PID" 2>/dev/null || true
wait "$SAMPLER_PID" 2>/dev/null || true
SAMPLER_PID=""

# --- summary ----------------------------------------------------------------------------------
json() { # file key -> value ("" when missing or the line is not JSON)
  python3 -c 'import json,sys
try: v = json.load(open(sys.argv[1])).get(sys.argv[2])
except Exception: v = None
print("" if v is None else v)' "$1" "$2"
}
fill_s=$(json "$WORK/fill.json" send_seconds)
drain_s=$(json "$WORK/drain.json" recv_seconds)
rate() { awk -v n="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.0f", n / s; else print "n/a" }'; }
fmt_s() { awk -v s="$1" 'BEGIN { if (s == "") print "n/a"; else printf "%.2f", s }'; }
if [ -n "$MEMORY_BYTES_MAX" ]; then
  memory_text="$(mib $((MEMORY_BYTES_MAX / 1024))) MiB"
else
  memory_text="(key omitted)"
fi
accounting="sent $(json "$WORK/fill.json" sent), receipts $(json "$WORK/fill.json" receipts), \
delivered $(json "$WORK/drain.json" delivered) ($(json "$WORK/drain.json" unique) unique), \
lost $(json "$WORK/drain.json" lost), duplicates $(json "$WORK/drain.json" duplicates), \
redelivered $(json "$WORK/drain.json" redelivered_flagged), stale $(json "$WORK/drain.json" stale)"
verdict=$([ "$(json "$WORK/drain.json" ok)" = True ] && [ $drain_status -eq 0 ] && echo OK || echo FAILED)

cat <<EOF

### Deep backlog: $(printf "%'d" "$N") x $SIZE B persistent, memory_bytes_max $memory_text

\`N=$N SIZE=$SIZE MEMORY_BYTES_MAX=$MEMORY_BYTES_MAX PRODUCERS=$PRODUCERS CONSUMERS=$CONSUMERS ACK=$ACK PREFETCH=$PREFETCH bench/backlog.sh\`
— $(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), \
$(nproc) CPU(s), $(uname -r)

| phase | time (s) | msg/s | wall (s) | broker peak RSS (VmHWM) | max sampled VmRSS | RSS at end | data dir on disk |
|---|---:|---:|---:|---:|---:|---:|---:|
| fill: $PRODUCERS producer(s), RECEIPT every $RECEIPT_EVERY, window $RECEIPT_WINDOW | $(fmt_s "$fill_s") | $(rate "$N" "$fill_s") | $fill_wall | $(mib "$fill_hwm_kib") MiB | $(mib "$(sampled_peak_kib fill)") MiB | $(mib "$fill_end_kib") MiB | $(mib "$fill_disk_kib") MiB |
| drain: $CONSUMERS consumer(s), ack $ACK, prefetch $PREFETCH | $(fmt_s "$drain_s") | $(rate "$N" "$drain_s") | $drain_wall | $(mib "$drain_hwm_kib") MiB | $(mib "$(sampled_peak_kib drain)") MiB | $(mib "$drain_end_kib") MiB | $(mib "$drain_disk_kib") MiB (3 s after) |

Broker RSS before the fill $(mib "$rss_start_kib") MiB; graceful stop ${STOP_S}s. Time = the bench's
first send → last receipt (fill) and drain start → last delivery (drain); wall = the bench
process. Accounting: $accounting → **$verdict**.
EOF

[ "$verdict" = OK ] || exit 1

#!/usr/bin/env bash
# Interleaved A/B of Haven builds or settings on one scenario: each repetition runs every
# variant once, each on a fresh broker and an empty journal, so drift on a shared machine
# falls on all variants alike. Prints one line per run: variant, received msg/s, p50 and p99
# send->receipt (us), p50 and p99 of the broker journal's own fdatasyncs (from its log at
# stop), peak RSS, broker CPU seconds.
#
#   bench/ab.sh SCENARIO REPS VARIANT...
#
# SCENARIO is a, a0, b, c, d, f or g (the suite's flags, bench/scenarios.sh); a VARIANT is
# "[VAR=value ...] BIN [haven run flags ...]" (environment and flags for the broker only), e.g.
#   bench/ab.sh c 4 target/release/haven "target/release/haven --config two-workers.toml"
# Environment: DURATION_S (5), AB_PORT (62031), BENCH_BIN (the first variant's binary runs
# `haven bench`).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 3 ] || { sed -n '2,13p' "$0"; exit 2; }
SCENARIO=$1 REPS=$2
shift 2
DURATION_S=${DURATION_S:-5}
PORT=${AB_PORT:-62031}
STOP_TIMEOUT_S=10
SCRATCH_NAME=bench-ab
log() { echo "[ab] $*" >&2; }
# shellcheck source=bench/broker_proc.sh
source "$ROOT/bench/broker_proc.sh"

# shellcheck source=bench/scenarios.sh
source "$ROOT/bench/scenarios.sh"
ARGS=$(scenario_args "$SCENARIO") || exit 2
# Splits variant $1 into ENV_VARS, BIN and RUN_FLAGS.
parse_variant() {
  local w words=($1)
  ENV_VARS=() BIN="" RUN_FLAGS=()
  for w in "${words[@]}"; do
    if [ -z "$BIN" ] && [[ $w == *=* ]] && [[ $w != -* ]]; then ENV_VARS+=("$w")
    elif [ -z "$BIN" ]; then BIN=$w
    else RUN_FLAGS+=("$w"); fi
  done
  [ -n "$BIN" ] || { log "variant '$1' names no binary"; exit 2; }
}
parse_variant "$1"
BENCH_BIN=${BENCH_BIN:-$BIN}

for rep in $(seq "$REPS"); do
  for variant in "$@"; do
    parse_variant "$variant"
    rm -rf "$WORK/data"
    env ${ENV_VARS[@]+"${ENV_VARS[@]}"} "$BIN" run --data "$WORK/data" --stomp "127.0.0.1:$PORT" \
      ${RUN_FLAGS[@]+"${RUN_FLAGS[@]}"} >"$WORK/broker.log" 2>&1 &
    BROKER_PID=$!
    for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
    echo 5 >"/proc/$BROKER_PID/clear_refs"
    # shellcheck disable=SC2086
    line=$("$BENCH_BIN" bench --url "127.0.0.1:$PORT" --duration-s "$DURATION_S" \
      --destination /queue/ab --json $ARGS)
    hwm_kib=$(awk '/VmHWM/ { print $2 }' "/proc/$BROKER_PID/status")
    cpu_s=$(awk -v hz="$(getconf CLK_TCK)" '{ s = $0; sub(/.*\) /, "", s); split(s, f, " "); printf "%.2f", (f[12] + f[13]) / hz }' "/proc/$BROKER_PID/stat")
    stop_broker
    # The journal's own fdatasync figures, which the broker logs when it stops.
    syncs=$(grep -o 'fdatasync latency since open.*' "$WORK/broker.log" | tail -1 || true)
    python3 -c '
import json, re, sys
d = json.loads(sys.argv[1])
r = d["receipt_latency_us"] or {}
rate, p50, p99, ok = d["recv_rate"], r.get("p50", 0), r.get("p99", 0), d["ok"]
s = dict(re.findall(r"(\w+)=(\d+)", sys.argv[6]))
sync = "sync p50 %s p99 %s us" % (s["p50_us"], s["p99_us"]) if s else "sync -"
print(f"{sys.argv[2]} | rep {sys.argv[3]} | {rate:,.0f} msg/s | receipt p50 {p50:,.0f} p99 {p99:,.0f} us"
      f" | {sync} | peak RSS {int(sys.argv[4]) // 1024} MiB | cpu {sys.argv[5]} s | ok {ok}")
' "$line" "$variant" "$rep" "$hwm_kib" "$cpu_s" "$syncs"
  done
done

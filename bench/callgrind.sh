#!/usr/bin/env bash
# Instructions a Haven broker executes for COUNT messages of scenario (c) (4 producers,
# 4 consumers, 1 KiB persistent, RECEIPT every 100), counted by valgrind's callgrind: a figure
# that does not depend on how fast a shared machine happens to be, for comparing builds.
# Prints the delivered count and the total; the profile is left in OUT (callgrind_annotate).
#
#   bash bench/callgrind.sh [BIN] [COUNT] [OUT]
#   PAIR=a|b bash bench/callgrind.sh [BIN] [COUNT] [OUT]
#
# With PAIR, the load crosses an A -> B network pair instead (producers on A, consumers on B)
# and only broker A or B runs under valgrind, the other natively: docs/PERFORMANCE.md's pair
# figures. BIN defaults to target/release/haven, COUNT to 60000, OUT to target/callgrind.out
# (target/callgrind-pair-<a|b>.out with PAIR). The count includes start-up and shutdown (a
# few million instructions). Needs valgrind.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PAIR=${PAIR:-}
case "$PAIR" in "" | a | b) ;; *) echo "PAIR is a or b, not '$PAIR'" >&2; exit 2 ;; esac
BIN=${1:-$ROOT/target/release/haven}
COUNT=${2:-60000}
OUT=${3:-$ROOT/target/callgrind${PAIR:+-pair-$PAIR}.out}
PORT=${CALLGRIND_PORT:-62060}
WORK=$(mktemp -d "$ROOT/target/callgrind.XXXXXX")
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
wait_port() {
    for _ in $(seq 300); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done
    echo "port $1 never opened" >&2; exit 1
}
# NAME PORT [CONFIG]: a broker on PORT, under valgrind when it is the one measured.
start() {
    local cmd=("$BIN" run --data "$WORK/$1" --stomp "127.0.0.1:$2" ${3:+--config "$3"})
    if [ "$1" = "${PAIR:-standalone}" ]; then
        cmd=(valgrind --tool=callgrind --callgrind-out-file="$OUT" "${cmd[@]}")
    fi
    "${cmd[@]}" >"$WORK/$1.log" 2>&1 &
    PIDS+=($!)
    wait_port "$2"
}
if [ -z "$PAIR" ]; then
    start standalone "$PORT"
    urls=(--url "127.0.0.1:$PORT")
else
    printf '[broker]\nname = "B"\n' >"$WORK/b.toml"
    printf '[broker]\nname = "A"\n\n[[network]]\nuri = "static:(tcp://127.0.0.1:%s)"\n' \
        "$((PORT + 1))" >"$WORK/a.toml"
    start b "$((PORT + 1))" "$WORK/b.toml"
    start a "$PORT" "$WORK/a.toml"
    for _ in $(seq 600); do grep -q "bridge up" "$WORK/a.log" && break; sleep 0.1; done
    grep -q "bridge up" "$WORK/a.log" || { echo "the bridge never came up" >&2; exit 1; }
    urls=(--url "127.0.0.1:$PORT" --consume-url "127.0.0.1:$((PORT + 1))")
fi
"$BIN" bench "${urls[@]}" --producers 4 --consumers 4 --size 1024 \
    --receipt-every 100 --count "$COUNT" --json 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("delivered %d lost %d duplicated %d" % (d["delivered"], d["lost"], d["duplicates"]))'
kill "${PIDS[@]}"; wait 2>/dev/null || true
grep -ho "Collected : [0-9]*" "$WORK"/*.log | sed 's/Collected :/instructions:/'

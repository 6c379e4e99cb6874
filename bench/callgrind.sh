#!/usr/bin/env bash
# Instructions a Haven broker executes for COUNT messages of scenario (c) (4 producers,
# 4 consumers, 1 KiB persistent, RECEIPT every 100), counted by valgrind's callgrind: a figure
# that does not depend on how fast a shared machine happens to be, for comparing builds.
# Prints the delivered count and the total; the profile is left in OUT (callgrind_annotate).
#
#   bash bench/callgrind.sh [BIN] [COUNT] [OUT]
#
# BIN defaults to target/release/haven, COUNT to 60000, OUT to target/callgrind.out. The
# count includes start-up and shutdown (a few million instructions). Needs valgrind.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/target/release/haven}
COUNT=${2:-60000}
OUT=${3:-$ROOT/target/callgrind.out}
PORT=${CALLGRIND_PORT:-62060}
WORK=$(mktemp -d "$ROOT/target/callgrind.XXXXXX")
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
valgrind --tool=callgrind --callgrind-out-file="$OUT" "$BIN" run --data "$WORK/data" \
    --stomp "127.0.0.1:$PORT" >"$WORK/log" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 300); do (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
"$BIN" bench --url "127.0.0.1:$PORT" --producers 4 --consumers 4 --size 1024 \
    --receipt-every 100 --count "$COUNT" --json 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("delivered %d lost %d duplicated %d" % (d["delivered"], d["lost"], d["duplicates"]))'
kill "$PID"; wait "$PID" 2>/dev/null || true
grep -o "Collected : [0-9]*" "$WORK/log" | sed 's/Collected :/instructions:/'

#!/usr/bin/env bash
# What a broker keeps after a burst: 8 s of scenario (f) (64 KiB persistent messages), then
# 3 s idle, then 5 s of scenario (c) (1 KiB, 4 producers / 4 consumers). Prints the broker's
# resident memory after (f), 3 s later, and the peak during (c) (VmHWM reset before it).
#
#   bash bench/idle_memory.sh [REPS]        # HAVEN_BIN runs another build
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=${1:-2}
BIN=${HAVEN_BIN:-$ROOT/target/release/haven}
[ -n "${HAVEN_BIN:-}" ] || (cd "$ROOT" && cargo build --release -q -p haven-cli)
WORK=$(mktemp -d)
PORT=17501
P=""
trap '[ -n "$P" ] && kill "$P" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
kib() { awk -v k="$1" '$1 == k":" {print $2}' "/proc/$P/status"; }
for rep in $(seq 1 "$REPS"); do
    rm -rf "$WORK/data"
    "$BIN" run --data "$WORK/data" --stomp "127.0.0.1:$PORT" 2>"$WORK/broker.log" & P=$!
    for _ in $(seq 1 100); do (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.05; done
    "$BIN" bench --url "127.0.0.1:$PORT" --size 65536 --producers 1 --consumers 1 --persistent true \
        --receipt-every 100 --warmup 500 --duration-s 8 --json >/dev/null 2>&1
    after_f=$(kib VmRSS); sleep 3; idle=$(kib VmRSS)
    echo 5 > "/proc/$P/clear_refs"
    "$BIN" bench --url "127.0.0.1:$PORT" --size 1024 --producers 4 --consumers 4 --persistent true \
        --receipt-every 100 --warmup 1000 --duration-s 5 --json >/dev/null 2>&1
    echo "rep $rep: resident after (f) $((after_f / 1024)) MiB, 3 s later $((idle / 1024)) MiB, peak during (c) $(($(kib VmHWM) / 1024)) MiB"
    kill "$P"; wait "$P" 2>/dev/null || true; P=""
done

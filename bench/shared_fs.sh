#!/usr/bin/env bash
# Throughput of a shared-fs master (with its slave waiting) against a standalone broker, same
# machine, same run, alternating: scenario (c) of BENCHMARKS.md (4 producers / 4 consumers,
# 1 KiB persistent, RECEIPT every 100). The shared-fs master reads the epoch file before every
# journal write; this measures what that costs.
#
#   bash bench/shared_fs.sh [REPS] [COUNT]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPS="${1:-3}"
COUNT="${2:-300000}"
BIN="$PWD/target/release/haven"
cargo build --release -q -p haven-cli
WORK="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
wait_port() { for _ in $(seq 1 300); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }
bench() { "$BIN" bench --url "127.0.0.1:$1" --producers 4 --consumers 4 --size 1024 --receipt-every 100 --count "$COUNT" --json 2>/dev/null | tail -1; }
printf '[ha]\nmode = "shared-fs"\n' > "$WORK/ha.toml"
for rep in $(seq 1 "$REPS"); do
    rm -rf "$WORK/standalone" "$WORK/shared"
    "$BIN" run --data "$WORK/standalone" --stomp 127.0.0.1:17101 2>"$WORK/s.log" & PIDS+=($!)
    wait_port 17101
    echo "rep $rep standalone $(bench 17101)"
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
    "$BIN" run --config "$WORK/ha.toml" --data "$WORK/shared" --stomp 127.0.0.1:17102 2>"$WORK/m.log" & PIDS+=($!)
    wait_port 17102
    "$BIN" run --config "$WORK/ha.toml" --data "$WORK/shared" --stomp 127.0.0.1:17103 2>"$WORK/sl.log" & PIDS+=($!)
    echo "rep $rep shared-fs $(bench 17102)"
    kill "${PIDS[-1]}" "${PIDS[-2]}"; wait 2>/dev/null || true
done

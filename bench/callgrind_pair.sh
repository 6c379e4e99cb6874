#!/usr/bin/env bash
# Instructions one broker of an A -> B pair executes while COUNT messages of scenario (c)
# (4 producers on A, 4 consumers on B, 1 KiB persistent, RECEIPT every 100) cross the bridge,
# counted by valgrind's callgrind; the other broker runs natively. The figures of
# docs/PERFORMANCE.md ("An A -> B pair under callgrind") come from it; compare with
# bench/callgrind.sh (a standalone broker, same load).
#
#   bash bench/callgrind_pair.sh a|b [BIN] [COUNT] [OUT]
#
# BIN defaults to target/release/haven, COUNT to 60000, OUT to target/callgrind-pair-<a|b>.out.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHICH=${1:?usage: callgrind_pair.sh a|b [BIN] [COUNT] [OUT]}
BIN=${2:-$ROOT/target/release/haven}
COUNT=${3:-60000}
OUT=${4:-$ROOT/target/callgrind-pair-$WHICH.out}
PORT_A=${CALLGRIND_PORT:-62070}
PORT_B=$((PORT_A + 1))
WORK=$(mktemp -d "$ROOT/target/callgrind-pair.XXXXXX")
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
printf '[broker]\nname = "B"\n' >"$WORK/b.toml"
printf '[broker]\nname = "A"\n\n[[network]]\nuri = "static:(tcp://127.0.0.1:%s)"\n' "$PORT_B" >"$WORK/a.toml"
wait_port() { for _ in $(seq 300); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; echo "port $1 never opened" >&2; exit 1; }
start() { # NAME PORT UNDER_VALGRIND
    local cmd=("$BIN" run --config "$WORK/$1.toml" --data "$WORK/$1" --stomp "127.0.0.1:$2")
    if [ "$3" = yes ]; then cmd=(valgrind --tool=callgrind --callgrind-out-file="$OUT" "${cmd[@]}"); fi
    "${cmd[@]}" >"$WORK/$1.log" 2>&1 &
    PIDS+=($!)
}
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
start b "$PORT_B" "$([ "$WHICH" = b ] && echo yes || echo no)"
wait_port "$PORT_B"
start a "$PORT_A" "$([ "$WHICH" = a ] && echo yes || echo no)"
wait_port "$PORT_A"
for _ in $(seq 600); do grep -q "bridge up" "$WORK/a.log" && break; sleep 0.1; done
grep -q "bridge up" "$WORK/a.log" || { echo "the bridge never came up" >&2; exit 1; }
"$BIN" bench --url "127.0.0.1:$PORT_A" --consume-url "127.0.0.1:$PORT_B" --producers 4 \
    --consumers 4 --size 1024 --receipt-every 100 --count "$COUNT" --json 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("delivered %d lost %d duplicated %d" % (d["delivered"], d["lost"], d["duplicates"]))'
kill "${PIDS[@]}"; wait 2>/dev/null || true
log=$WORK/$WHICH.log
grep -o "Collected : [0-9]*" "$log" | sed "s/Collected :/instructions ($WHICH):/"

# Shared by bench/shared_fs.sh, bench/shared_db.sh, bench/replicated.sh, bench/network.sh and
# bench/network_sustained.sh: scenario (c) of BENCHMARKS.md (4 producers / 4 consumers, 1 KiB
# persistent, RECEIPT every 100) against a standalone broker and an HA group (or a network),
# same machine, same run, alternating. Source it with the script's arguments ([REPS] [COUNT]).
# A script that starts more than brokers defines `cleanup_extra` to stop it; brokers whose pids
# are in PIDS are stopped on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPS="${1:-3}"
COUNT="${2:-300000}"
# HAVEN_BIN runs another build (say, an older commit's) instead of building this tree's.
if [ -n "${HAVEN_BIN:-}" ]; then
    BIN="$HAVEN_BIN"
else
    BIN="$PWD/target/release/haven"
    cargo build --release -q -p haven-cli
fi
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if declare -F cleanup_extra >/dev/null; then cleanup_extra; fi
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
wait_port() { for _ in $(seq 1 300); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }
# Scenario (c) against 127.0.0.1:PORT; prints one JSON line.
bench() { "$BIN" bench --url "127.0.0.1:$1" --producers 4 --consumers 4 --size 1024 --receipt-every 100 --count "$COUNT" --json 2>/dev/null | tail -1; }
# A fresh broker zero-fills its next journal segment in the background as it starts: let it
# finish, as a broker that has been running has, so a run measures the steady state.
settle() { sleep "${SETTLE_S:-1}"; }
# WARMUP messages (default 0) sent through a fresh broker (or network) before the measured run
# and not counted: a fresh journal zero-fills each new segment until released ones can be
# recycled, which a broker that has been running does not do. Args: producer port, consumer port.
warm_up() {
    [ "${WARMUP:-0}" -gt 0 ] || return 0
    "$BIN" bench --url "127.0.0.1:$1" --consume-url "127.0.0.1:$2" --producers 4 --consumers 4 \
        --size 1024 --receipt-every 100 --count "$WARMUP" --json >/dev/null 2>&1 \
        || { echo "the warm-up run failed" >&2; return 1; }
}
# CPU seconds (user + system) process $1 has used so far, less $2 (default 0).
cpu_s() { awk -v hz="$(getconf CLK_TCK)" -v since="${2:-0}" '{printf "%.2f", ($14 + $15) / hz - since}' "/proc/$1/stat"; }
# Starts a standalone broker on fresh data at 127.0.0.1:17101, settled and warmed up: its pid
# is then ${PIDS[-1]}.
start_standalone() {
    rm -rf "$WORK/standalone"
    "$BIN" run --data "$WORK/standalone" --stomp 127.0.0.1:17101 2>"$WORK/s.log" & PIDS+=($!)
    wait_port 17101
    settle
    warm_up 17101 17101
}
# Scenario (c) on a fresh standalone broker, printed as rep $1 with the broker's CPU seconds.
bench_standalone() {
    start_standalone
    local before; before=$(cpu_s "${PIDS[-1]}")
    local line; line=$(bench 17101)
    # cpu_s: the measured run's CPU seconds.
    echo "rep $1 standalone cpu_s $(cpu_s "${PIDS[-1]}" "$before") $line"
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
}
# Starts the A -> B pair of bench/network.sh on fresh data (the caller writes $WORK/a.toml and
# $WORK/b.toml) and waits until its bridge is up: A's pid is then ${PIDS[-1]}, B's ${PIDS[-2]}.
start_pair() {
    rm -rf "$WORK"/net-*
    "$BIN" run --config "$WORK/b.toml" --data "$WORK/net-b" --stomp 127.0.0.1:17302 2>"$WORK/b.log" & PIDS+=($!)
    wait_port 17302
    "$BIN" run --config "$WORK/a.toml" --data "$WORK/net-a" --stomp 127.0.0.1:17301 2>"$WORK/a.log" & PIDS+=($!)
    wait_port 17301
    # The clock starts with the first SEND: measure forwarding, not the bridge connecting.
    for _ in $(seq 1 100); do grep -q "bridge up" "$WORK/a.log" && break; sleep 0.05; done
    grep -q "bridge up" "$WORK/a.log" || { echo "the bridge never came up" >&2; exit 1; }
    settle
}

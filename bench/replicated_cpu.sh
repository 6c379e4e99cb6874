#!/usr/bin/env bash
# Where a 3-replica group's CPU goes under scenario (c) (4 producers / 4 consumers, 1 KiB
# persistent, RECEIPT every 100): one fresh group, WARM messages not measured, then COUNT
# measured; prints the rate, then each member's CPU ticks (10 ms) by thread name, the leader
# first. PERF=1 also records the leader with `perf record -g` into $PERF_OUT
# (default target/perf-leader.data, out of git's way). BIN runs another build.
#
#   [BIN=...] [COUNT=300000] [WARM=100000] [PERF=1] bash bench/replicated_cpu.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${BIN:-}" ]; then
    BIN="$PWD/target/release/haven"
    cargo build --release -q -p haven-cli
fi
PERF_OUT="${PERF_OUT:-$PWD/target/perf-leader.data}"
mkdir -p "$(dirname "$PERF_OUT")"
W=$(mktemp -d)
P=()
cleanup() { for p in "${P[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
for id in 1 2 3; do
    { printf '[ha]\nmode = "replicated"\nnode_id = %s\n' "$id"
      for m in 1 2 3; do
          printf '[[ha.members]]\nid = %s\nraft = "127.0.0.1:%s"\nstomp = "127.0.0.1:%s"\n' "$m" $((17210 + m)) $((17200 + m))
      done
    } > "$W/r$id.toml"
done
for id in 1 2 3; do
    "$BIN" run --config "$W/r$id.toml" --data "$W/d$id" --stomp "127.0.0.1:$((17200 + id))" 2>"$W/r$id.log" & P+=($!)
done
# Only the leader listens.
LEADER=""; LI=0
for _ in $(seq 1 600); do
    for i in 1 2 3; do
        (echo > "/dev/tcp/127.0.0.1/$((17200 + i))") 2>/dev/null && LEADER=$((17200 + i)) && LI=$i && break 2
    done
    sleep 0.05
done
[ -n "$LEADER" ] || { echo "no leader" >&2; exit 1; }
sleep 1
run() { "$BIN" bench --url "127.0.0.1:$LEADER" --producers 4 --consumers 4 --size 1024 --receipt-every 100 --count "$1" --json 2>/dev/null | tail -1; }
run "${WARM:-100000}" >/dev/null
snap() { for p in "${P[@]}"; do for t in /proc/"$p"/task/*; do echo "$p $(tr ' ' _ < "$t/comm") $(awk '{print $14 + $15}' "$t/stat")"; done; done; }
snap > "$W/before"
if [ "${PERF:-0}" = 1 ]; then perf record -F 999 -g -p "${P[$((LI - 1))]}" -o "$PERF_OUT" 2>/dev/null & PP=$!; fi
run "${COUNT:-300000}" | python3 -c 'import json, sys; j = json.load(sys.stdin); print("recv_rate %.0f lost %d duplicates %d" % (j["recv_rate"], j["lost"], j["duplicates"]))'
if [ "${PERF:-0}" = 1 ]; then kill -INT "$PP"; wait "$PP" || true; fi
snap > "$W/after"
python3 - "$W/before" "$W/after" "${P[$((LI - 1))]}" <<'PY'
import collections, sys
def load(path):
    ticks = collections.defaultdict(collections.Counter)
    for line in open(path):
        pid, comm, t = line.split()
        ticks[pid][comm] += int(t)
    return ticks
before, after, leader = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
for pid in sorted(after, key=lambda p: p != leader):
    used = collections.Counter({c: after[pid][c] - before[pid][c] for c in after[pid]})
    role = "leader" if pid == leader else "follower"
    print(role, pid, "ticks", sum(used.values()), dict(used.most_common(4)))
PY

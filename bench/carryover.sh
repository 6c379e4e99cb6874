#!/usr/bin/env bash
# What one broker carries from one scenario into the next, as the suite runs them: the given
# scenarios of BENCHMARKS.md (a b c d f g, with the suite's flags from bench/scenarios.sh;
# (e) is left out: it is count-based), DURATION_S seconds each (default 10), one after
# another on one broker process. For each it prints
# whether every message arrived exactly once, the rate, the broker's peak RSS during it
# (VmHWM, reset before it), its resident memory at the end and 3 s later. A fresh broker
# starts near 12 MiB; what (a) peaks at after another scenario is what that one left behind.
#
#   bash bench/carryover.sh a g a g a f a f a      # HAVEN_BIN runs another build
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || { echo "usage: bench/carryover.sh SCENARIO..." >&2; exit 2; }
BIN=${HAVEN_BIN:-$ROOT/target/release/haven}
[ -n "${HAVEN_BIN:-}" ] || (cd "$ROOT" && cargo build --release -q -p haven-cli)
DURATION_S=${DURATION_S:-10}
WORK=$(mktemp -d)
PORT=17511
P=""
trap '[ -n "$P" ] && kill "$P" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
mib() { awk -v k="$1" '$1 == k":" {printf "%d", $2 / 1024}' "/proc/$P/status"; }
# shellcheck source=bench/scenarios.sh
source "$ROOT/bench/scenarios.sh"
for s in "$@"; do scenario_args "$s" >/dev/null || exit 2; done
"$BIN" run --data "$WORK/data" --stomp "127.0.0.1:$PORT" 2>"$WORK/broker.log" & P=$!
for _ in $(seq 1 100); do (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.05; done
sleep 1
echo "fresh broker: resident $(mib VmRSS) MiB"
for s in "$@"; do
    echo 5 > "/proc/$P/clear_refs"
    # shellcheck disable=SC2046
    line=$("$BIN" bench --url "127.0.0.1:$PORT" $(scenario_args "$s") --duration-s "$DURATION_S" \
        --destination "/queue/carryover.$s" --json 2>/dev/null | tail -1)
    result=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("ok" if j["ok"] else "NOT OK", int(j["recv_rate"]), "msg/s")' "$line")
    peak=$(mib VmHWM); end=$(mib VmRSS); sleep 3
    echo "($s) $result: peak RSS $peak MiB, resident at the end $end MiB, 3 s later $(mib VmRSS) MiB"
done

#!/usr/bin/env bash
# Sustained forwarding throughput of a network of two brokers, A -> B, against a standalone
# broker, same run, alternating: the highest offered rate each carries, end to end, without
# falling behind. Scenario (c) of BENCHMARKS.md (4 producers / 4 consumers, 1 KiB persistent,
# RECEIPT every 100), paced with `haven bench --rate`.
#
# Why a second measure beside bench/network.sh: that one lets the producers send as fast as
# A receipts, and A receipts once a message is stored, not once it is forwarded. So A builds a
# backlog for the whole run, pages it out past `limits.memory_bytes_max` and reads it back:
# it measures the pair overloaded, paying for a backlog a pair running at its capacity would
# not have. A standalone broker under the same load has no backlog (its consumers keep up).
#
# A probe at rate R sends COUNT messages (after as many of warm-up per setup, unmeasured) and
# passes when every message arrived exactly once and the consumers' rate (first send -> last
# receive) was at least PASS_FRACTION (0.97) of R. Bisection between LO_FRACTION and
# HI_FRACTION of the setup's unpaced rate (measured first, in the same processes) for STEPS
# (6) probes. The 3% allowance covers the last deliveries' latency; it also lets a rate up to
# 3% above capacity pass, the same for both setups.
#
# The result is the highest rate that passed, counting the unpaced run as a probe at its own
# send rate: a standalone broker keeps up with unpaced producers (its consumers' rate is its
# producers'), and paced it does less well (at 1 ms timer steps each producer sends in small
# bursts, so the broker batches less), so its sustained rate is its unpaced one. The pair
# never passes unpaced: A receipts messages faster than the bridge forwards them.
#
#   bash bench/network_sustained.sh [REPS] [COUNT]
source "$(dirname "${BASH_SOURCE[0]}")/ha_common.sh" "${1:-3}" "${2:-600000}"
WARMUP="${WARMUP:-$COUNT}"
STEPS="${STEPS:-6}"
PASS_FRACTION="${PASS_FRACTION:-0.97}"
LO_FRACTION="${LO_FRACTION:-0.7}"
HI_FRACTION="${HI_FRACTION:-1.4}"
printf '[broker]\nname = "B"\n' > "$WORK/b.toml"
printf '[broker]\nname = "A"\n\n[[network]]\nuri = "static:(tcp://127.0.0.1:17302)"\n%s\n' \
    "${NETWORK_EXTRA:-}" > "$WORK/a.toml"

field() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d$2)" "$1"; }

# One run from port $1 to port $2, at rate $3 (empty: unpaced); prints its JSON line.
probe() {
    local rate=()
    [ -n "$3" ] && rate=(--rate "$3")
    "$BIN" bench --url "127.0.0.1:$1" --consume-url "127.0.0.1:$2" --producers 4 --consumers 4 \
        --size 1024 --receipt-every 100 --count "$COUNT" "${rate[@]}" --json 2>/dev/null | tail -1
}

# Bisects the sustained rate from port $1 to port $2; label $3. Prints each probe and, last,
# "sustained <label> <rate> unpaced <rate>".
search() {
    local line unpaced sent lo hi mid best=0
    line=$(probe "$1" "$2" "")
    unpaced=$(field "$line" "['recv_rate']")
    sent=$(field "$line" "['send_rate']")
    if python3 -c "import sys; sys.exit(0 if '$(field "$line" "['ok']")' == 'True' and $unpaced >= $PASS_FRACTION * $sent else 1)"; then
        best=$(printf '%.0f' "$unpaced")
        echo "  $3 unpaced send_rate $(printf '%.0f' "$sent") recv_rate $best pass"
    else
        echo "  $3 unpaced send_rate $(printf '%.0f' "$sent") recv_rate $(printf '%.0f' "$unpaced") fail"
    fi
    lo=$(python3 -c "print(int($unpaced * $LO_FRACTION))")
    hi=$(python3 -c "print(int($unpaced * $HI_FRACTION))")
    for _ in $(seq 1 "$STEPS"); do
        mid=$(( (lo + hi) / 2 ))
        line=$(probe "$1" "$2" "$mid")
        local recv ok pass
        recv=$(field "$line" "['recv_rate']")
        ok=$(field "$line" "['ok']")
        pass=$(python3 -c "print('pass' if '$ok' == 'True' and $recv >= $PASS_FRACTION * $mid else 'fail')")
        echo "  $3 rate $mid recv_rate $(printf '%.0f' "$recv") p99_ms $(field "$line" "['latency_us']['p99'] / 1000") $pass"
        if [ "$pass" = pass ]; then
            lo=$mid
            [ "$mid" -gt "$best" ] && best=$mid
        else
            hi=$mid
        fi
    done
    echo "sustained $3 $best unpaced $(printf '%.0f' "$unpaced")"
}

for rep in $(seq 1 "$REPS"); do
    start_standalone
    echo "rep $rep"
    search 17101 17101 standalone
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

    start_pair
    warm_up 17301 17302
    search 17301 17302 network
    echo "  A paged in (warm-up and probes): $(grep -o 'paged_in_total=[0-9]*' "$WORK/a.log" | tail -1)"
    kill "${PIDS[-1]}" "${PIDS[-2]}"; wait 2>/dev/null || true
done

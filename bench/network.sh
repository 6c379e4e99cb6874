#!/usr/bin/env bash
# Forwarding throughput of a network of two brokers, A -> B (issue 8's target), against a
# standalone broker, same run, alternating: scenario (c) of BENCHMARKS.md (4 producers /
# 4 consumers, 1 KiB persistent, RECEIPT every 100). The producers send to A and the
# consumers read from B, so every message crosses the bridge (stored on A, forwarded, stored
# on B, removed from A after B's RECEIPT). Both brokers run on this machine and its one disk.
# Extra connector keys (e.g. "prefetch_size = 5000") may be given in NETWORK_EXTRA.
#
# Each fresh broker, and each fresh pair, first carries WARMUP messages (default: COUNT) that
# are not measured, so both are measured in the steady state of a broker that has been
# running: a fresh journal zero-fills its first segments, and a receiving broker keeps its
# last `network_origins_max` forwarded messages' records, so it recycles nothing for longer
# (measured: half of its journal thread's CPU in a fresh run). WARMUP=0 measures fresh brokers.
#
#   bash bench/network.sh [REPS] [COUNT]
source "$(dirname "${BASH_SOURCE[0]}")/ha_common.sh" "$@"
WARMUP="${WARMUP:-$COUNT}"
printf '[broker]\nname = "B"\n' > "$WORK/b.toml"
printf '[broker]\nname = "A"\n\n[[network]]\nuri = "static:(tcp://127.0.0.1:17302)"\n%s\n' \
    "${NETWORK_EXTRA:-}" > "$WORK/a.toml"
for rep in $(seq 1 "$REPS"); do
    bench_standalone "$rep"
    start_pair
    warm_up 17301 17302
    before_a=$(cpu_s "${PIDS[-1]}"); before_b=$(cpu_s "${PIDS[-2]}")
    line=$("$BIN" bench --url 127.0.0.1:17301 --consume-url 127.0.0.1:17302 --producers 4 \
        --consumers 4 --size 1024 --receipt-every 100 --count "$COUNT" --json 2>/dev/null | tail -1)
    echo "rep $rep network cpu_s A $(cpu_s "${PIDS[-1]}" "$before_a") B $(cpu_s "${PIDS[-2]}" "$before_b") $line"
    kill "${PIDS[-1]}" "${PIDS[-2]}"; wait 2>/dev/null || true
done

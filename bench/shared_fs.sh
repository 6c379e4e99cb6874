#!/usr/bin/env bash
# Throughput of a shared-fs master (with its slave waiting) against a standalone broker, same
# machine, same run, alternating: scenario (c) of BENCHMARKS.md (4 producers / 4 consumers,
# 1 KiB persistent, RECEIPT every 100). The shared-fs master reads the epoch file before every
# journal write; this measures what that costs.
#
#   bash bench/shared_fs.sh [REPS] [COUNT]
source "$(dirname "${BASH_SOURCE[0]}")/ha_common.sh" "$@"
printf '[ha]\nmode = "shared-fs"\n' > "$WORK/ha.toml"
for rep in $(seq 1 "$REPS"); do
    bench_standalone "$rep"
    rm -rf "$WORK/shared"
    "$BIN" run --config "$WORK/ha.toml" --data "$WORK/shared" --stomp 127.0.0.1:17102 2>"$WORK/m.log" & PIDS+=($!)
    wait_port 17102
    "$BIN" run --config "$WORK/ha.toml" --data "$WORK/shared" --stomp 127.0.0.1:17103 2>"$WORK/sl.log" & PIDS+=($!)
    settle
    echo "rep $rep shared-fs $(bench 17102)"
    kill "${PIDS[-1]}" "${PIDS[-2]}"; wait 2>/dev/null || true
done

#!/usr/bin/env bash
# Throughput of a 3-replica Raft group (all on this machine and its one disk) against a
# standalone broker, same run, alternating: scenario (c) of BENCHMARKS.md (4 producers /
# 4 consumers, 1 KiB persistent, RECEIPT every 100). Default [ha] timings.
#
#   bash bench/replicated.sh [REPS] [COUNT]
source "$(dirname "${BASH_SOURCE[0]}")/ha_common.sh" "$@"
for id in 1 2 3; do
    {
        printf '[ha]\nmode = "replicated"\nnode_id = %s\n' "$id"
        for m in 1 2 3; do
            printf '[[ha.members]]\nid = %s\nraft = "127.0.0.1:%s"\nstomp = "127.0.0.1:%s"\n' "$m" $((17210 + m)) $((17200 + m))
        done
    } > "$WORK/r$id.toml"
done
for rep in $(seq 1 "$REPS"); do
    bench_standalone "$rep"
    rm -rf "$WORK"/d*
    for id in 1 2 3; do
        "$BIN" run --config "$WORK/r$id.toml" --data "$WORK/d$id" --stomp "127.0.0.1:$((17200 + id))" 2>"$WORK/r$id.log" & PIDS+=($!)
    done
    # Only the leader listens.
    LEADER=""
    for _ in $(seq 1 600); do
        for p in 17201 17202 17203; do
            (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null && LEADER=$p && break 2
        done
        sleep 0.05
    done
    [ -n "$LEADER" ] || { echo "no leader" >&2; exit 1; }
    settle
    echo "rep $rep replicated $(bench "$LEADER")"
    kill "${PIDS[-1]}" "${PIDS[-2]}" "${PIDS[-3]}"; wait 2>/dev/null || true
done

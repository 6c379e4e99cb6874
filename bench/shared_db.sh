#!/usr/bin/env bash
# Throughput of a shared-db master (PostgreSQL store, its slave waiting) against a standalone
# broker, same machine, same run, alternating: scenario (c) of BENCHMARKS.md (4 producers /
# 4 consumers, 1 KiB persistent, RECEIPT every 100). Starts a throwaway PostgreSQL (Debian's
# postgresql package; fsync on) on 127.0.0.1 and removes it afterwards. Run as root or as a
# user who can run initdb.
#
# With LEASE_WAITS=1 each rep also prints the master's lease renewals during the measured run
# (pg_stat_statements: count, mean and longest time in the database, lock waits included): a
# renewal must not wait behind the master's own writes.
#
#   bash bench/shared_db.sh [REPS] [COUNT]
source "$(dirname "${BASH_SOURCE[0]}")/ha_common.sh" "$@"
PGBIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
PGPORT=17200
chmod 755 "$WORK"
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup_extra() { as_pg "$PGBIN/pg_ctl" -D "$WORK/pg" -m fast stop >/dev/null 2>&1 || true; }
mkdir "$WORK/pg"
[ "$(id -u)" -eq 0 ] && chown postgres "$WORK/pg"
as_pg "$PGBIN/initdb" -D "$WORK/pg" -U postgres --auth=trust >/dev/null
PG_OPTS="-p $PGPORT -k $WORK/pg -c listen_addresses=127.0.0.1"
if [ "${LEASE_WAITS:-0}" = 1 ]; then
    PG_OPTS="$PG_OPTS -c shared_preload_libraries=pg_stat_statements"
fi
as_pg "$PGBIN/pg_ctl" -D "$WORK/pg" -o "$PG_OPTS" -l "$WORK/pg/log" -w start >/dev/null
psql_q() { as_pg "$PGBIN/psql" -h 127.0.0.1 -p $PGPORT -U postgres -qAt -c "$1" postgres; }
[ "${LEASE_WAITS:-0}" = 1 ] && psql_q "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
# The lease renewals' count, mean and longest time in the database (lock waits included) since
# the last pg_stat_statements_reset().
lease_renewals() {
    psql_q "SELECT 'lease_renewals ' || sum(calls) || ' mean_ms ' || round(sum(total_exec_time)::numeric / sum(calls), 2)
                   || ' max_ms ' || round(max(max_exec_time)::numeric, 1)
              FROM pg_stat_statements
             WHERE query LIKE '%UPDATE haven_lease%renewed_at = now()%' AND query NOT LIKE '%epoch + 1%'"
}
URL="postgres://postgres@127.0.0.1:$PGPORT/postgres"
printf '[ha]\nmode = "shared-db"\ndb_url = "%s"\n' "$URL" > "$WORK/ha.toml"
for rep in $(seq 1 "$REPS"); do
    bench_standalone "$rep"
    as_pg "$PGBIN/psql" -h 127.0.0.1 -p $PGPORT -U postgres -qc "DROP TABLE IF EXISTS haven_log, haven_lease, haven_meta" postgres >/dev/null
    "$BIN" run --config "$WORK/ha.toml" --data "$WORK/m" --stomp 127.0.0.1:17102 2>"$WORK/m.log" & PIDS+=($!)
    wait_port 17102
    "$BIN" run --config "$WORK/ha.toml" --data "$WORK/sl" --stomp 127.0.0.1:17103 2>"$WORK/sl.log" & PIDS+=($!)
    settle
    [ "${LEASE_WAITS:-0}" = 1 ] && psql_q "SELECT pg_stat_statements_reset()" >/dev/null
    echo "rep $rep shared-db $(bench 17102)"
    if [ "${LEASE_WAITS:-0}" = 1 ]; then echo "rep $rep shared-db $(lease_renewals)"; fi
    kill "${PIDS[-1]}" "${PIDS[-2]}"; wait "${PIDS[-1]}" "${PIDS[-2]}" 2>/dev/null || true
done

#!/usr/bin/env bash
# Haven vs ActiveMQ Classic 5.17 (and optionally RabbitMQ) on loopback, same machine, same run.
#
#   bench/compare.sh [--reps N] [--duration-s S] [--scenarios "a b c d"] [--brokers "haven activemq"]
#                    [--backlog-n N] [--record] [--no-pause]
#
# Installs ActiveMQ from Debian if missing, starts each broker with the config kept in bench/,
# runs the disk's fdatasync probe, then every scenario against every broker, alternating the
# broker order each repetition, and writes medians, ratios and peak RSS as a markdown table to
# stdout and bench/results/latest.md (raw JSON lines beside it); --record also puts the table
# into BENCHMARKS.md ("Last recorded run", bench/record.py). Stops everything it started.
#
# Scenarios (BENCHMARKS.md, "Scenarios"): a a0 b c d f g run for --duration-s each; e is
# count-based: a backlog of --backlog-n messages (default 1,000,000) filled with no consumer,
# then drained by one, on a queue of its own per repetition.
# Every broker is started once and kept for the whole suite, but only the one being measured
# runs: the others are held with SIGSTOP (and the fdatasync probe runs with all of them held).
# --no-pause leaves them all running, as the suite did before 2026-12-04.
# Brokers: haven, activemq (required by issue 2), rabbitmq (classic durable queues),
# rabbitmq-quorum (quorum queues, same node), haven-replicated (3 Raft replicas on this
# machine) and haven-network (two brokers A -> B with a network connector: producers on A,
# consumers on B, the bridge carries every message); e.g. --brokers "haven haven-network".
# Environment: HAVEN_BIN (default: build target/release/haven), HAVEN_PORT (61613),
# AMQ_PORT (61614), AMQ_OPENWIRE_PORT (61616), RABBIT_PORT (61615), REPL_PORT (61623..5),
# REPL_RAFT_PORT (61720..2), NET_PORT (61633..4), BACKLOG_N (as --backlog-n),
# BACKLOG_PHASE_TIMEOUT_S (1800: a fill or drain that takes longer is killed and counted
# failed), KEEP_WORK=1 keeps the scratch directory.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=3
DURATION_S=10
SCENARIOS="a b c d"
BROKERS="haven activemq"
BACKLOG_N=${BACKLOG_N:-1000000}
RECORD=0
PAUSE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --duration-s) DURATION_S=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --brokers) BROKERS=$2; shift 2 ;;
    --backlog-n) BACKLOG_N=$2; shift 2 ;;
    --record) RECORD=1; shift ;;
    --no-pause) PAUSE=0; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
HAVEN_PORT=${HAVEN_PORT:-61613}
AMQ_PORT=${AMQ_PORT:-61614}
AMQ_OPENWIRE_PORT=${AMQ_OPENWIRE_PORT:-61616}
RABBIT_PORT=${RABBIT_PORT:-61615}
# A fill or drain of scenario (e) that takes longer than this is killed: a broker that blocks
# its producer for good (flow control with no room) would otherwise hang the bench, which
# waits for its receipt window without a deadline.
BACKLOG_PHASE_TIMEOUT_S=${BACKLOG_PHASE_TIMEOUT_S:-1800}

log() { echo "[compare] $*" >&2; }
for s in $SCENARIOS; do
  case "$s" in a|a0|b|c|d|e|f|g) ;; *) log "unknown scenario $s (a a0 b c d e f g)"; exit 2 ;; esac
done
for v in REPS BACKLOG_N BACKLOG_PHASE_TIMEOUT_S; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { log "$v=${!v} is not a positive whole number"; exit 2; }
done

# --- scratch space and cleanup --------------------------------------------------------------
# Scratch lives on the same file system as the repo (not tmpfs), so brokers sync to a real disk.
WORK=$(mktemp -d "$ROOT/target/bench-compare.XXXXXX" 2>/dev/null || mktemp -d)
declare -A PIDS=() URL=() RSS_PID=() EXTRA=()
EPMD_STARTED=0
cleanup() {
  local status=$?
  local name pid
  resume_all # a stopped process acts on SIGTERM only once it is continued
  for name in "${!PIDS[@]}"; do
    pid=${PIDS[$name]}
    if kill -0 "$pid" 2>/dev/null; then
      log "stopping $name (pid $pid)"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  # A broker process that is a child of a start script (RabbitMQ's Erlang VM).
  for name in "${!RSS_PID[@]}"; do
    pid=${RSS_PID[$name]}
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  done
  if [ "${EPMD_STARTED:-0}" = 1 ]; then epmd -kill >/dev/null 2>&1 || true; fi
  if [ "${KEEP_WORK:-0}" = 1 ] || [ $status -ne 0 ]; then
    log "scratch kept in $WORK"
  else
    rm -rf "$WORK"
  fi
  exit $status
}
trap cleanup EXIT INT TERM

# --- holding the brokers that are not being measured -------------------------------------------
# All of them run for the whole suite, so without this the ones not being measured share the
# two cores with the one that is: a JVM's compiler and collector threads after its start and
# after its own runs, the Erlang VM's schedulers and timers, a Haven broker's maintenance. Held
# with SIGSTOP, each is measured as if it had the machine to itself, which is how users compare
# brokers. (With all running, the suite's (a) p99 send->receipt read 0.7-2.0 ms for Haven on an
# hour when Haven alone read 0.4-0.6: BENCHMARKS.md.)
procs_of() { # broker: prints the pids to hold and continue
  case $1 in
    rabbitmq|rabbitmq-quorum) echo "${RSS_PID[rabbitmq]:-}" ;;
    haven-replicated) echo "${PIDS[haven-replicated-0]:-} ${PIDS[haven-replicated-1]:-} ${PIDS[haven-replicated-2]:-}" ;;
    haven-network) echo "${PIDS[haven-network-a]:-} ${PIDS[haven-network-b]:-}" ;;
    *) echo "${PIDS[$1]:-}" ;;
  esac
}
signal_all() { # signal
  local b p
  for b in ${STARTED:-}; do
    for p in $(procs_of "$b"); do kill "-$1" "$p" 2>/dev/null || true; done
  done
}
resume_all() { signal_all CONT; }
measure_only() { # broker: continues it and holds every other started broker
  [ "$PAUSE" = 1 ] || return 0
  local keep b p
  keep=" $(procs_of "$1") "
  for b in $STARTED; do
    for p in $(procs_of "$b"); do
      if [[ $keep == *" $p "* ]]; then kill -CONT "$p" 2>/dev/null || true
      else kill -STOP "$p" 2>/dev/null || true; fi
    done
  done
  # A group held as a whole resumes with every member's election timer due: let leadership
  # settle before find_repl_leader looks for the leader.
  if [ "$1" = haven-replicated ]; then sleep 1; fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { # port seconds pid
  for _ in $(seq $(($2 * 10))); do
    if ! port_free "$1"; then return 0; fi
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# --- tools ------------------------------------------------------------------------------------
need_apt_update=1
apt_install() {
  if [ $need_apt_update = 1 ]; then apt-get update -qq; need_apt_update=0; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}
command -v python3 >/dev/null || apt_install python3

if [ -z "${HAVEN_BIN:-}" ]; then
  log "building haven (release)"
  (cd "$ROOT" && cargo build --release -p haven-cli >&2)
  HAVEN_BIN="$ROOT/target/release/haven"
fi
BENCH=("$HAVEN_BIN" bench)

# --- brokers ----------------------------------------------------------------------------------
# Scratch of a 3-member replicated group (`haven-replicated`): STOMP on REPL_PORT..+2, Raft on
# REPL_RAFT_PORT..+2, each member on its own data directory (all on this one disk).
REPL_PORT=${REPL_PORT:-61623}
REPL_RAFT_PORT=${REPL_RAFT_PORT:-61720}

start_activemq() {
  if [ ! -e /usr/share/activemq/bin/activemq.jar ]; then
    log "installing ActiveMQ from Debian (package activemq)"
    apt_install activemq default-jre-headless
  fi
  port_free "$AMQ_PORT" || { log "port $AMQ_PORT is busy"; return 1; }
  local base="$WORK/activemq"
  mkdir -p "$base/conf" "$base/data"
  cp "$ROOT/bench/activemq/activemq.xml" "$ROOT/bench/activemq/log4j2.properties" \
    "$ROOT/bench/activemq/log4j.properties" "$base/conf/"
  # The java command line of Debian's /usr/bin/activemq, with Debian's heap options
  # (/usr/share/activemq/activemq-options), run in the foreground so we own the pid. Debian's
  # build logs through log4j 1.x, so log4j.properties is what makes $WORK/activemq.log useful.
  java -Xms512M -Xmx512M -Dorg.apache.activemq.UseDedicatedTaskRunner=true \
    --add-reads=java.xml=java.logging \
    --add-opens java.base/java.security=ALL-UNNAMED --add-opens java.base/java.net=ALL-UNNAMED \
    --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/java.util=ALL-UNNAMED \
    --add-opens java.naming/javax.naming.spi=ALL-UNNAMED \
    --add-opens java.rmi/sun.rmi.transport.tcp=ALL-UNNAMED \
    --add-opens java.base/java.util.concurrent=ALL-UNNAMED \
    --add-opens java.base/java.util.concurrent.atomic=ALL-UNNAMED \
    --add-exports=java.base/sun.net.www.protocol.http=ALL-UNNAMED \
    --add-exports=java.base/sun.net.www.protocol.https=ALL-UNNAMED \
    --add-exports=java.base/sun.net.www.protocol.jar=ALL-UNNAMED \
    --add-exports=jdk.xml.dom/org.w3c.dom.html=ALL-UNNAMED \
    --add-exports=jdk.naming.rmi/com.sun.jndi.url.rmi=ALL-UNNAMED \
    -Dactivemq.classpath="$base/conf" -Dactivemq.home=/usr/share/activemq \
    -Dactivemq.base="$base" -Dactivemq.conf="$base/conf" -Dactivemq.data="$base/data" \
    -Dlog4j2.configurationFile="$base/conf/log4j2.properties" \
    -Dlog4j.configuration="file:$base/conf/log4j.properties" \
    -Dbench.stomp.port="$AMQ_PORT" -Dbench.openwire.port="$AMQ_OPENWIRE_PORT" \
    -jar /usr/share/activemq/bin/activemq.jar start "xbean:file:$base/conf/activemq.xml" \
    >"$WORK/activemq.log" 2>&1 &
  PIDS[activemq]=$!
  RSS_PID[activemq]=$!
  wait_port "$AMQ_PORT" 60 "${PIDS[activemq]}" || { log "ActiveMQ did not start; see $WORK/activemq.log"; return 1; }
  URL[activemq]="127.0.0.1:$AMQ_PORT"
}

# Three replicas (issue 7's throughput target), default timing; the bench talks to the leader.
start_haven-replicated() {
  local i cfg members=""
  for i in 0 1 2; do
    port_free $((REPL_PORT + i)) && port_free $((REPL_RAFT_PORT + i)) \
      || { log "port $((REPL_PORT + i)) or $((REPL_RAFT_PORT + i)) is busy"; return 1; }
    members+=$'[[ha.members]]\n'"id = $((i + 1))"$'\n'"raft = \"127.0.0.1:$((REPL_RAFT_PORT + i))\""$'\n'
    members+="stomp = \"127.0.0.1:$((REPL_PORT + i))\""$'\n\n'
  done
  for i in 0 1 2; do
    cfg="$WORK/replica-$i.toml"
    printf '[stomp]\nlisten = "127.0.0.1:%s"\n[journal]\ndir = "%s"\n[ha]\nmode = "replicated"\nnode_id = %s\ncluster_name = "bench"\n\n%s' \
      $((REPL_PORT + i)) "$WORK/replica-$i" $((i + 1)) "$members" >"$cfg"
    "$HAVEN_BIN" run --config "$cfg" >"$WORK/replica-$i.log" 2>&1 &
    PIDS[haven-replicated-$i]=$!
  done
  find_repl_leader 30 && return 0
  log "the replicated group elected no leader; see $WORK/replica-*.log"
  return 1
}

# Followers do not listen: the one port that opens is the leader's. Leadership can move under
# load (docs/REPLICATION.md, "Leadership changes under pressure"), so every run asks again
# rather than failing against a member that no longer leads.
find_repl_leader() { # seconds
  local j url
  for _ in $(seq $(($1 * 10))); do
    for j in 0 1 2; do
      if ! port_free $((REPL_PORT + j)); then
        url="127.0.0.1:$((REPL_PORT + j))"
        [ "${URL[haven-replicated]:-}" = "$url" ] || log "haven-replicated: member $((j + 1)) leads"
        URL[haven-replicated]=$url
        RSS_PID[haven-replicated]=${PIDS[haven-replicated-$j]}
        return 0
      fi
    done
    sleep 0.1
  done
  return 1
}

# Two brokers, A (NET_PORT) with a connector to B (NET_PORT + 1): the bench produces on A and
# consumes on B, so every message crosses the bridge. RSS is A's.
NET_PORT=${NET_PORT:-61633}
start_haven-network() {
  local a=$NET_PORT b=$((NET_PORT + 1)) n
  port_free "$a" && port_free "$b" || { log "port $a or $b is busy"; return 1; }
  mkdir -p "$WORK/net-a" "$WORK/net-b"
  printf '[broker]\nname = "B"\n' >"$WORK/net-b.toml"
  printf '[broker]\nname = "A"\n\n[[network]]\nuri = "static:(tcp://127.0.0.1:%s)"\n' "$b" >"$WORK/net-a.toml"
  for n in b a; do
    "$HAVEN_BIN" run --config "$WORK/net-$n.toml" --data "$WORK/net-$n" \
      --stomp "127.0.0.1:$([ $n = a ] && echo "$a" || echo "$b")" >"$WORK/haven-network-$n.log" 2>&1 &
    PIDS[haven-network-$n]=$!
  done
  wait_port "$a" 20 "${PIDS[haven-network-a]}" && wait_port "$b" 20 "${PIDS[haven-network-b]}" \
    || { log "haven-network did not start; see $WORK/haven-network-*.log"; return 1; }
  URL[haven-network]="127.0.0.1:$a"
  RSS_PID[haven-network]=${PIDS[haven-network-a]}
  EXTRA[haven-network]=" --consume-url 127.0.0.1:$b"
}

start_haven() {
  port_free "$HAVEN_PORT" || { log "port $HAVEN_PORT is busy"; return 1; }
  mkdir -p "$WORK/haven-data"
  "$HAVEN_BIN" run --data "$WORK/haven-data" --stomp "127.0.0.1:$HAVEN_PORT" >"$WORK/haven.log" 2>&1 &
  PIDS[haven]=$!
  RSS_PID[haven]=$!
  wait_port "$HAVEN_PORT" 20 "${PIDS[haven]}" || { log "Haven did not start; see $WORK/haven.log"; return 1; }
  URL[haven]="127.0.0.1:$HAVEN_PORT"
}

start_rabbitmq() {
  if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
    log "installing RabbitMQ from Debian (package rabbitmq-server)"
    apt_install rabbitmq-server
  fi
  if [ -z "${PIDS[rabbitmq]:-}" ]; then
    port_free "$RABBIT_PORT" || { log "port $RABBIT_PORT is busy"; return 1; }
    port_free 4369 && EPMD_STARTED=1
    local base="$WORK/rabbitmq"
    mkdir -p "$base"
    sed "s/61615/$RABBIT_PORT/" "$ROOT/bench/rabbitmq/rabbitmq.conf" >"$base/rabbitmq.conf"
    # Run as the invoking user in the foreground (the script traps TERM and stops the node).
    RABBITMQ_CONFIG_FILE="$base/rabbitmq.conf" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$ROOT/bench/rabbitmq/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$base/mnesia" RABBITMQ_LOG_BASE="$base/log" \
    RABBITMQ_NODENAME=havenbench@localhost RABBITMQ_DIST_PORT=25673 ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
      /usr/lib/rabbitmq/bin/rabbitmq-server >"$WORK/rabbitmq.log" 2>&1 &
    PIDS[rabbitmq]=$!
    wait_port "$RABBIT_PORT" 60 "${PIDS[rabbitmq]}" || { log "RabbitMQ did not start; see $WORK/rabbitmq.log"; return 1; }
    # The Erlang VM is the script's child; its RSS is the broker's.
    RSS_PID[rabbitmq]=$(ps -o pid= --ppid "${PIDS[rabbitmq]}" | head -1 | tr -d ' ')
  fi
  URL[rabbitmq]="127.0.0.1:$RABBIT_PORT"
}

# Same RabbitMQ node, quorum queues (declared by the x-queue-type header on SEND and SUBSCRIBE).
start_rabbitmq-quorum() {
  start_rabbitmq || return 1
  URL[rabbitmq-quorum]="127.0.0.1:$RABBIT_PORT"
  RSS_PID[rabbitmq-quorum]=${RSS_PID[rabbitmq]}
  local h
  for h in x-queue-type:quorum durable:true auto-delete:false; do
    EXTRA[rabbitmq-quorum]+=" --send-header $h --subscribe-header $h"
  done
}

STARTED=""
for b in $BROKERS; do
  log "starting $b"
  if "start_$b"; then STARTED="$STARTED $b"; else log "$b skipped: it did not start"; fi
done
[ -n "$STARTED" ] || { log "no broker started"; exit 1; }

# --- runs -------------------------------------------------------------------------------------
RAW="$WORK/results.jsonl"
: >"$RAW"
log "fdatasync probe in $WORK"
[ "$PAUSE" = 1 ] && signal_all STOP
"${BENCH[@]}" --fsync-probe "$WORK/fsync-probe" --fsync-count 2000 --json >>"$RAW"

# Duration-based scenarios: their flags are in bench/scenarios.sh.
# shellcheck source=bench/scenarios.sh
source "$ROOT/bench/scenarios.sh"

rss_reset() { echo 5 >"/proc/$1/clear_refs" 2>/dev/null || true; } # resets VmHWM (Linux >= 4.0)
rss_peak_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# Adds the run's broker, scenario, rep and peak RSS (unless empty: the line has it) to a bench
# JSON line.
annotate() { # json broker scenario rep rss_kib
  echo "$1" | python3 -c 'import json,sys
d = json.loads(sys.stdin.read())
d["broker"], d["scenario"], d["rep"] = sys.argv[1], sys.argv[2], int(sys.argv[3])
if sys.argv[4] != "": d["rss_kib"] = int(sys.argv[4] or 0)
print(json.dumps(d))' "$2" "$3" "$4" "$5"
}

# A bench run's output if it is a JSON line (a failed accounting still prints one, ok:false),
# otherwise a stub that says the run failed.
json_or_stub() { # output label
  case "$1" in
    '{'*) echo "$1" ;;
    *) printf '{"kind":"load","label":"%s","ok":false}\n' "$2" ;;
  esac
}

# Scenario (e): BACKLOG_N persistent 1 KiB messages from one producer with no consumer attached,
# then one consumer drains them (`--drain-only`, same --run-id), which checks that every
# message arrives exactly once. The fill asks a RECEIPT every 100 SENDs, window 16, like (b):
# the fill is then (b)'s producer without its consumer, and its rate compares with (b)'s sent
# rate (every 1000, as bench/backlog.sh does, would let 16,000 unconfirmed messages queue up
# and measure a different producer). The drain is (b)'s consumer (ack auto, broker-default
# prefetch), so "drain within 20% of (b)" compares like with like. No warm-up: every message
# of the backlog counts. Each rep gets its own queue, so a failed drain leaves nothing behind
# for the next one. Prints one JSON line: the drain's, with the fill's figures and each
# phase's peak RSS added.
BACKLOG_ARGS=(--size 1024 --producers 1 --persistent true --receipt-every 100 --warmup 0 --count "$BACKLOG_N")
run_backlog() { # broker rep
  local b=$1 rep=$2 pid=${RSS_PID[$1]} run_id dest fill="" drain="" t0 t1 t2
  local fill_status=0 drain_status=0 fill_rss=0 drain_rss=0
  run_id=$(( ($(date +%s%N) ^ ($$ << 40)) & 0x7fffffffffffffff ))
  dest="/queue/bench.$b.e.$rep"
  rss_reset "$pid"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  fill=$(timeout --foreground -k 10 "$BACKLOG_PHASE_TIMEOUT_S" "${BENCH[@]}" --url "${URL[$b]}" \
    --destination "$dest" --run-id "$run_id" --json --label "$b/e/$rep/fill" \
    "${BACKLOG_ARGS[@]}" --consumers 0 ${EXTRA[$b]:-}) || fill_status=$?
  t1=$(date +%s.%N)
  fill_rss=$(rss_peak_kib "$pid")
  [ $fill_status -eq 0 ] || log "fill $b/e/$rep failed (exit $fill_status; 124 = timed out)"
  fill=$(json_or_stub "$fill" "$b/e/$rep/fill")
  if [ $fill_status -eq 0 ]; then
    if [ "$b" = haven-replicated ]; then
      find_repl_leader 30 || log "haven-replicated has no leader; the drain will fail"
      pid=${RSS_PID[$b]}
    fi
    rss_reset "$pid"
    # shellcheck disable=SC2086
    drain=$(timeout --foreground -k 10 "$BACKLOG_PHASE_TIMEOUT_S" "${BENCH[@]}" --url "${URL[$b]}" \
      --destination "$dest" --run-id "$run_id" --json --label "$b/e/$rep/drain" \
      "${BACKLOG_ARGS[@]}" --drain-only --consumers 1 ${EXTRA[$b]:-}) || drain_status=$?
    drain_rss=$(rss_peak_kib "$pid")
    [ $drain_status -eq 0 ] || log "drain $b/e/$rep failed (exit $drain_status; 124 = timed out)"
  else
    drain_status=1
  fi
  t2=$(date +%s.%N)
  drain=$(json_or_stub "$drain" "$b/e/$rep/drain")
  python3 - "$fill" "$drain" "$fill_status" "$drain_status" "$fill_rss" "$drain_rss" "$t0" "$t1" "$t2" "$BACKLOG_N" <<'PY'
import json, sys
fill, drain = json.loads(sys.argv[1]), json.loads(sys.argv[2])
fill_status, drain_status, fill_rss, drain_rss = (int(x or 0) for x in sys.argv[3:7])
t0, t1, t2 = (float(x) for x in sys.argv[7:10])
n = int(sys.argv[10])
d = dict(drain)
d["kind"] = "backlog"
d["count"] = n
# Every message of the fill was receipted (the fill exits 0 only then) and arrived exactly once.
d["ok"] = (fill_status == 0 and drain_status == 0 and bool(drain.get("ok"))
           and fill.get("receipts", 0) > 0 and drain.get("unique") == n)
d["fill"] = {k: fill.get(k) for k in ("ok", "sent", "receipts", "send_seconds", "send_rate",
                                      "receipt_latency_us")}
d["fill"]["exit"] = fill_status
d["drain_exit"] = drain_status
d["send_rate"] = fill.get("send_rate")
d["rss_fill_kib"], d["rss_drain_kib"] = fill_rss, drain_rss
d["rss_kib"] = max(fill_rss, drain_rss)
d["fill_wall_s"], d["drain_wall_s"] = round(t1 - t0, 3), round(t2 - t1, 3)
print(json.dumps(d))
PY
}

# Scenario (e) keeps a whole backlog on each broker's disk at once: check there is room for
# it (twice the payload plus framing, as bench/backlog.sh asks) before spending the time.
case " $SCENARIOS " in
  *" e "*)
    need_kib=$(( BACKLOG_N * (1024 + 256) * 2 / 1024 ))
    free_kib=$(df -Pk "$WORK" | awk 'NR == 2 { print $4 }')
    [ "$free_kib" -ge "$need_kib" ] \
      || { log "$WORK has $((free_kib / 1024)) MiB free; scenario (e) needs about $((need_kib / 1024)) MiB"; exit 1; }
    ;;
esac

# (a)'s bound is the disk's p99 sync, which moves from hour to hour on a shared machine (130 to
# 343 us on one day here): one probe at the start judged every (a) run by that moment's disk.
# Each repetition of (a) is preceded by a probe of its own, and the bound takes the median.
probe_disk() { # label
  [ "$PAUSE" = 1 ] && signal_all STOP
  "${BENCH[@]}" --fsync-probe "$WORK/fsync-probe-$1" --fsync-count 2000 --json --label "$1" >>"$RAW"
  rm -rf "$WORK/fsync-probe-$1"
}

order=($STARTED)
for rep in $(seq "$REPS"); do
  for s in $SCENARIOS; do
    [ "$s" = a ] && probe_disk "before-a-$rep"
    for b in "${order[@]}"; do
      measure_only "$b"
      if [ "$b" = haven-replicated ]; then
        find_repl_leader 30 || log "haven-replicated has no leader; this run will fail"
      fi
      pid=${RSS_PID[$b]}
      if [ "$s" = e ]; then
        log "rep $rep scenario (e) $b: fill $BACKLOG_N, then drain"
        line=$(run_backlog "$b" "$rep")
        kill -0 "$pid" 2>/dev/null || { log "$b died during $s; see $WORK/$b.log"; }
        annotate "$line" "$b" "$s" "$rep" "" >>"$RAW"
        continue
      fi
      rss_reset "$pid"
      log "rep $rep scenario ($s) $b"
      status=0
      # shellcheck disable=SC2046
      line=$("${BENCH[@]}" --url "${URL[$b]}" --duration-s "$DURATION_S" \
        --destination "/queue/bench.$b.$s" --json --label "$b/$s/$rep" $(scenario_args "$s") ${EXTRA[$b]:-}) || status=$?
      if [ $status -ne 0 ]; then
        log "run $b/$s/$rep failed (exit $status)"
        line=$(json_or_stub "$line" "$b/$s/$rep")
      fi
      kill -0 "$pid" 2>/dev/null || { log "$b died during $s; see $WORK/$b.log"; }
      annotate "$line" "$b" "$s" "$rep" "$(rss_peak_kib "$pid")" >>"$RAW"
    done
  done
  # Alternate which broker goes first.
  order=($(printf '%s\n' "${order[@]}" | tac))
done

# --- table ------------------------------------------------------------------------------------
mkdir -p "$ROOT/bench/results"
COMMAND="bench/compare.sh --reps $REPS --duration-s $DURATION_S --scenarios \"$SCENARIOS\" --brokers \"$BROKERS\""
case " $SCENARIOS " in *" e "*) COMMAND+=" --backlog-n $BACKLOG_N" ;; esac
[ "$PAUSE" = 1 ] || COMMAND+=" --no-pause"
python3 "$ROOT/bench/summarize.py" "$RAW" --command "$COMMAND" \
  --commit "$(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown)" \
  | tee "$ROOT/bench/results/latest.md"
cp "$RAW" "$ROOT/bench/results/latest.jsonl"
if [ "$RECORD" = 1 ]; then
  python3 "$ROOT/bench/record.py" "$ROOT/BENCHMARKS.md" "$ROOT/bench/results/latest.md"
  log "recorded in BENCHMARKS.md (\"Last recorded run\")"
fi

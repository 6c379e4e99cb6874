#!/usr/bin/env bash
# Haven vs ActiveMQ Classic 5.17 (and optionally RabbitMQ) on loopback, same machine, same run.
#
#   bench/compare.sh [--reps N] [--duration-s S] [--scenarios "a b c d"] [--brokers "haven activemq"]
#
# Installs ActiveMQ from Debian if missing, starts each broker with the config kept in bench/,
# runs the disk's fdatasync probe, then every scenario against every broker, alternating the
# broker order each repetition, and writes medians, ratios and peak RSS as a markdown table to
# stdout and bench/results/latest.md (raw JSON lines beside it). Stops everything it started.
#
# Brokers: haven, activemq (required by issue 2), rabbitmq (classic durable queues),
# rabbitmq-quorum (quorum queues, same node), haven-replicated (3 Raft replicas on this
# machine) and haven-network (two brokers A -> B with a network connector: producers on A,
# consumers on B, the bridge carries every message); e.g. --brokers "haven haven-network".
# Environment: HAVEN_BIN (default: build target/release/haven), HAVEN_PORT (61613),
# AMQ_PORT (61614), AMQ_OPENWIRE_PORT (61616), RABBIT_PORT (61615), REPL_PORT (61623..5),
# REPL_RAFT_PORT (61720..2), NET_PORT (61633..4), KEEP_WORK=1 keeps the scratch directory.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=3
DURATION_S=10
SCENARIOS="a b c d"
BROKERS="haven activemq"
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --duration-s) DURATION_S=$2; shift 2 ;;
    --scenarios) SCENARIOS=$2; shift 2 ;;
    --brokers) BROKERS=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
HAVEN_PORT=${HAVEN_PORT:-61613}
AMQ_PORT=${AMQ_PORT:-61614}
AMQ_OPENWIRE_PORT=${AMQ_OPENWIRE_PORT:-61616}
RABBIT_PORT=${RABBIT_PORT:-61615}

log() { echo "[compare] $*" >&2; }

# --- scratch space and cleanup --------------------------------------------------------------
# Scratch lives on the same file system as the repo (not tmpfs), so brokers sync to a real disk.
WORK=$(mktemp -d "$ROOT/target/bench-compare.XXXXXX" 2>/dev/null || mktemp -d)
declare -A PIDS=() URL=() RSS_PID=() EXTRA=()
EPMD_STARTED=0
cleanup() {
  local status=$?
  local name pid
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
  cp "$ROOT/bench/activemq/activemq.xml" "$ROOT/bench/activemq/log4j2.properties" "$base/conf/"
  # The java command line of Debian's /usr/bin/activemq, with Debian's heap options
  # (/usr/share/activemq/activemq-options), run in the foreground so we own the pid.
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
  local i j cfg members=""
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
  # Followers do not listen: the one port that opens is the leader's.
  for _ in $(seq 300); do
    for j in 0 1 2; do
      if ! port_free $((REPL_PORT + j)); then
        URL[haven-replicated]="127.0.0.1:$((REPL_PORT + j))"
        RSS_PID[haven-replicated]=${PIDS[haven-replicated-$j]}
        log "haven-replicated: member $((j + 1)) leads"
        return 0
      fi
    done
    sleep 0.1
  done
  log "the replicated group elected no leader; see $WORK/replica-*.log"
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
"${BENCH[@]}" --fsync-probe "$WORK/fsync-probe" --fsync-count 2000 --json >>"$RAW"

scenario_args() {
  case "$1" in
    a) echo "--producers 1 --consumers 1 --persistent true --receipt-every 1 --warmup 200" ;;
    b) echo "--producers 1 --consumers 1 --persistent true --receipt-every 100 --warmup 2000" ;;
    c) echo "--producers 4 --consumers 4 --persistent true --receipt-every 100 --warmup 1000" ;;
    d) echo "--producers 1 --consumers 1 --persistent false --receipt-every 100 --warmup 2000" ;;
    *) log "unknown scenario $1"; exit 2 ;;
  esac
}

rss_reset() { echo 5 >"/proc/$1/clear_refs" 2>/dev/null || true; } # resets VmHWM (Linux >= 4.0)
rss_peak_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

order=($STARTED)
for rep in $(seq "$REPS"); do
  for s in $SCENARIOS; do
    for b in "${order[@]}"; do
      pid=${RSS_PID[$b]}
      rss_reset "$pid"
      log "rep $rep scenario ($s) $b"
      status=0
      # shellcheck disable=SC2046
      line=$("${BENCH[@]}" --url "${URL[$b]}" --size 1024 --duration-s "$DURATION_S" \
        --destination "/queue/bench.$b.$s" --json --label "$b/$s/$rep" $(scenario_args "$s") ${EXTRA[$b]:-}) || status=$?
      if [ $status -ne 0 ]; then
        log "run $b/$s/$rep failed (exit $status)"
        # A failed accounting still prints its JSON line (ok:false); anything else gets a stub.
        case "$line" in
          '{'*) ;;
          *) line=$(printf '{"kind":"load","label":"%s/%s/%s","ok":false}' "$b" "$s" "$rep") ;;
        esac
      fi
      kill -0 "$pid" 2>/dev/null || { log "$b died during $s; see $WORK/$b.log"; }
      rss=$(rss_peak_kib "$pid")
      echo "$line" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["broker"],d["scenario"],d["rep"],d["rss_kib"]=sys.argv[1],sys.argv[2],int(sys.argv[3]),int(sys.argv[4] or 0); print(json.dumps(d))' \
        "$b" "$s" "$rep" "$rss" >>"$RAW"
    done
  done
  # Alternate which broker goes first.
  order=($(printf '%s\n' "${order[@]}" | tac))
done

# --- table ------------------------------------------------------------------------------------
mkdir -p "$ROOT/bench/results"
COMMAND="bench/compare.sh --reps $REPS --duration-s $DURATION_S --scenarios \"$SCENARIOS\" --brokers \"$BROKERS\""
python3 "$ROOT/bench/summarize.py" "$RAW" --command "$COMMAND" \
  --commit "$(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown)" \
  | tee "$ROOT/bench/results/latest.md"
cp "$RAW" "$ROOT/bench/results/latest.jsonl"

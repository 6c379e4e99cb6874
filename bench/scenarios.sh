# The `haven bench` flags of the duration-based scenarios of BENCHMARKS.md ("Scenarios"), for
# every script that runs them (compare.sh, ab.sh, carryover.sh), so they cannot drift apart.
# (e) is count-based and has its own phases in compare.sh.
#
# The warm-up is per producer: it lets ActiveMQ's JIT compile the message path and every broker
# write its first journal/store files before the clock starts.

# Prints scenario $1's flags; fails (status 2) for a name that is not one.
scenario_args() {
  case "$1" in
    a) echo "--size 1024 --producers 1 --consumers 1 --persistent true --receipt-every 1 --warmup 200" ;;
    # (a) without the disk: the same round trips, non-persistent. Not one of issue 9's targets:
    # it measures, per broker and in the same run, what a RECEIPT costs besides the sync, so
    # (a)'s p99 can be read against the disk's p99 plus this.
    a0) echo "--size 1024 --producers 1 --consumers 1 --persistent false --receipt-every 1 --warmup 200" ;;
    b) echo "--size 1024 --producers 1 --consumers 1 --persistent true --receipt-every 100 --warmup 2000" ;;
    c) echo "--size 1024 --producers 4 --consumers 4 --persistent true --receipt-every 100 --warmup 1000" ;;
    d) echo "--size 1024 --producers 1 --consumers 1 --persistent false --receipt-every 100 --warmup 2000" ;;
    # (b)'s shape with 64 KiB bodies. 500 warm-up messages are 31 MiB, 15 times (b)'s warm-up
    # in bytes: the brokers' first store files get written and their per-byte paths (copies,
    # checksums) hot; (b)'s 2,000 would send 125 MiB before the clock starts.
    f) echo "--size 65536 --producers 1 --consumers 1 --persistent true --receipt-every 100 --warmup 500" ;;
    # 100 queues, each with its own producer and consumer (producer i and consumer i on queue
    # <destination>.i). A small warm-up per producer: 100 producers x 50 = 5,000 messages,
    # about (c)'s total, and the producers leave warm-up at nearly the same time.
    g) echo "--size 1024 --producers 100 --consumers 100 --queues 100 --persistent true --receipt-every 100 --warmup 50" ;;
    *) echo "unknown scenario $1 (a a0 b c d f g)" >&2; return 2 ;;
  esac
}

#!/usr/bin/env python3
"""What one thread waking another costs on this machine: the floor under every hand-off in a
broker's round trip (client -> broker worker -> journal writer -> broker worker -> client).

Two processes pass one byte back and forth over two pipes, ROUNDS times, and the round trip
(two wake-ups) is timed:
  - same CPU: both pinned to CPU 0, so each wake-up is a switch on a running CPU;
  - cross CPU: pinned to CPU 0 and CPU 1, each blocking in read(), so each wake-up finds the
    other CPU idle (on a VM whose guest does not poll before halting, an idle vCPU has
    halted and the wake-up is an interrupt the host must deliver);
  - cross CPU, partner polling: as above, but the partner never blocks (non-blocking reads in
    a loop), so only one of the two wake-ups can find a halted CPU.
Also prints the guest's halt-polling setting when the kernel has one
(/sys/module/haltpoll/parameters/guest_halt_poll_ns: 0 means an idle vCPU halts at once).

    python3 bench/wake_latency.py [ROUNDS]

docs/PERFORMANCE.md ("Where (a)'s time went") has the figures of the benchmark machine.
"""
import fcntl
import os
import sys
import time

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
WARMUP = 200


def percentiles(samples_ns):
    samples_ns.sort()
    n = len(samples_ns)
    return tuple(samples_ns[min(n - 1, n * p // 100)] / 1e3 for p in (50, 90, 99))


def round_trips(parent_cpu, child_cpu, child_polls):
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    if child_polls:
        fcntl.fcntl(to_child_r, fcntl.F_SETFL, os.O_NONBLOCK)
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setaffinity(0, {child_cpu})
            answered = 0
            while answered < ROUNDS + WARMUP:
                try:
                    os.read(to_child_r, 1)
                except BlockingIOError:
                    continue
                os.write(to_parent_w, b"x")
                answered += 1
        finally:
            os._exit(0)
    os.sched_setaffinity(0, {parent_cpu})
    samples = []
    for i in range(ROUNDS + WARMUP):
        start = time.perf_counter_ns()
        os.write(to_child_w, b"x")
        os.read(to_parent_r, 1)
        if i >= WARMUP:
            samples.append(time.perf_counter_ns() - start)
    os.waitpid(pid, 0)
    for fd in (to_child_r, to_child_w, to_parent_r, to_parent_w):
        os.close(fd)
    return percentiles(samples)


def main():
    cpus = sorted(os.sched_getaffinity(0))
    halt_poll = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"
    if os.path.exists(halt_poll):
        with open(halt_poll) as f:
            print(f"guest_halt_poll_ns: {f.read().strip()}")
    else:
        print("guest_halt_poll_ns: (no haltpoll module)")
    cases = [("same CPU", cpus[0], cpus[0], False)]
    if len(cpus) >= 2:
        cases += [
            ("cross CPU", cpus[0], cpus[1], False),
            ("cross CPU, partner polling", cpus[0], cpus[1], True),
        ]
    print(f"pipe round trip (two wake-ups), {ROUNDS} rounds, microseconds:")
    for name, parent_cpu, child_cpu, polls in cases:
        p50, p90, p99 = round_trips(parent_cpu, child_cpu, polls)
        print(f"  {name:28s} p50 {p50:6.1f}  p90 {p90:6.1f}  p99 {p99:6.1f}")


if __name__ == "__main__":
    main()

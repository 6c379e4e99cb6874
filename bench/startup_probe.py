#!/usr/bin/env python3
"""Start-up timing for bench/startup.sh: from the exec of a broker to its first CONNECTED
frame, both ends read on CLOCK_MONOTONIC (one clock for every process on the machine).

  startup_probe.py exec STAMP -- CMD [ARG...]
      Writes "<pid> <CLOCK_MONOTONIC ns>" to STAMP, then execs CMD in this same process, so
      the caller's $! is the broker's pid and the time is taken just before execve.
  startup_probe.py wait STAMP --port P [--ready FILE] [--timeout-s S]
      Polls 127.0.0.1:P about every millisecond: a TCP connect, then a STOMP CONNECT. When a
      CONNECTED comes back, prints "<ready ms> <listen ms> <connect attempts>": ready = exec to
      CONNECTED, listen = exec to the first accepted TCP connection. Start it before the broker
      and wait until it has created --ready (it is polling then), so that Python's own start-up
      is not in the figure. Exits 1 if the broker answers ERROR, exits or does not answer in
      time.

Standard library only.
"""
import argparse
import os
import socket
import sys
import time

POLL_S = 0.001  # between connection attempts while nothing listens
CONNECT_FRAME = b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:/\nheart-beat:0,0\n\n\x00"


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def cmd_exec(stamp, argv):
    if not argv:
        sys.exit("startup_probe.py exec: no command")
    # Written whole, then renamed: the waiter never reads half a stamp.
    tmp = f"{stamp}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {now_ns()}\n")
    os.replace(tmp, stamp)
    os.execvp(argv[0], argv)


def read_stamp(stamp):
    try:
        with open(stamp) as f:
            pid, t0 = f.read().split()
        return int(pid), int(t0)
    except (FileNotFoundError, ValueError):
        return None


def alive(pid):
    """False once the process has exited (a zombie waiting for its parent counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


def stomp_connect(sock, deadline):
    """Sends CONNECT; returns the answering frame's command, or None if the connection closed."""
    sock.sendall(CONNECT_FRAME)
    buf = b""
    while b"\x00" not in buf:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = sock.recv(4096)
        if not chunk:
            return None, buf
        buf += chunk
    frame = buf.split(b"\x00", 1)[0].lstrip(b"\r\n")
    return frame.split(b"\n", 1)[0].strip().decode(errors="replace"), frame


def cmd_wait(stamp, port, ready, timeout_s):
    deadline = time.monotonic() + timeout_s
    if ready:
        open(ready, "w").close()
    attempts = 0
    listen_ns = None
    while True:
        if time.monotonic() > deadline:
            sys.exit(f"startup_probe.py: no CONNECTED on port {port} within {timeout_s} s")
        st = read_stamp(stamp)
        if st and not alive(st[0]):
            sys.exit(f"startup_probe.py: the broker (pid {st[0]}) exited before answering")
        attempts += 1
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(1.0)
            try:
                sock.connect(("127.0.0.1", port))
            except (ConnectionRefusedError, socket.timeout):
                time.sleep(POLL_S)
                continue
            if listen_ns is None:
                listen_ns = now_ns()
            try:
                command, frame = stomp_connect(sock, deadline)
            except (ConnectionResetError, BrokenPipeError):
                command, frame = None, b""
            except socket.timeout:
                continue  # the deadline check above ends it
        finally:
            sock.close()
        t1 = now_ns()
        if command == "CONNECTED":
            st = read_stamp(stamp)
            if st is None:
                sys.exit(f"startup_probe.py: CONNECTED, but no stamp in {stamp}")
            t0 = st[1]
            print(f"{(t1 - t0) / 1e6:.3f} {(listen_ns - t0) / 1e6:.3f} {attempts}")
            return
        if command == "ERROR":
            sys.exit(f"startup_probe.py: the broker answered ERROR: {frame.decode(errors='replace')!r}")
        # Closed before answering (still starting): try again.
        time.sleep(POLL_S)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "exec":
        # Everything after "--" is the command, passed through untouched.
        args = sys.argv[2:]
        if len(args) < 2 or args[1] != "--":
            sys.exit("usage: startup_probe.py exec STAMP -- CMD [ARG...]")
        cmd_exec(args[0], args[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait")
    w.add_argument("stamp")
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--ready", help="file created once polling has begun")
    w.add_argument("--timeout-s", type=float, default=60.0)
    sub.add_parser("exec", help="exec STAMP -- CMD [ARG...]")
    a = ap.parse_args()
    cmd_wait(a.stamp, a.port, a.ready, a.timeout_s)


if __name__ == "__main__":
    main()

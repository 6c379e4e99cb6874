"""Fixtures for the interop suite: a real `haven` broker process per test, and helpers around
stomp.py (a STOMP client this project did not write).

HAVEN_BIN names the broker binary (default: target/debug/haven under the repo root). Each test
gets a fresh data directory and a free port; the broker is stopped when the test ends, and its
log tail is printed (pytest shows it when the test fails).
"""

import os
import pathlib
import queue
import signal
import socket
import subprocess
import threading
import time
import uuid

import pytest
import stomp

REPO = pathlib.Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10
WAIT_S = 10  # bound on any single wait for the broker in a test


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_frame(sock, timeout=WAIT_S):
    """Reads one frame from a raw socket: returns (command, headers dict, body bytes), or
    None when the peer closed first. Leading heart-beat EOLs are skipped."""
    sock.settimeout(timeout)
    buf = b""
    while True:
        stripped = buf.lstrip(b"\r\n")
        if b"\0" in stripped:
            raw = stripped[: stripped.index(b"\0")]
            break
        chunk = sock.recv(4096)
        if not chunk:
            return None
        buf += chunk
    head, _, body = raw.partition(b"\n\n")
    lines = head.decode("utf-8", "replace").split("\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers.setdefault(k, v)
    return lines[0].rstrip("\r"), headers, body


def stomp_probe(port, timeout=1.0):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"CONNECT\naccept-version:1.2,1.1,1.0\nhost:localhost\n\n\0")
            frame = read_frame(s, timeout)
            return frame is not None and frame[0] == "CONNECTED"
    except OSError:
        return False


class Broker:
    def __init__(self, bin_path, root):
        self.bin = str(bin_path)
        self.data = root / "data"
        self.log_path = root / "broker.log"
        self.port = free_port()
        self.proc = None

    def start(self):
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        log = open(self.log_path, "ab")
        log.write(b"=== start ===\n")
        log.flush()
        self.proc = subprocess.Popen(
            [self.bin, "run", "--data", str(self.data), "--stomp", f"127.0.0.1:{self.port}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            if stomp_probe(self.port):
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"broker not ready in {READY_TIMEOUT_S}s:\n{self.log_tail()}")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self):
        self.stop()
        self.start()

    def log_tail(self, n=4000):
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError as e:
            return f"(no log: {e})"


@pytest.fixture
def broker(tmp_path):
    bin_path = pathlib.Path(os.environ.get("HAVEN_BIN", REPO / "target" / "debug" / "haven"))
    assert bin_path.exists(), f"broker binary {bin_path} missing: cargo build -p haven-cli, or set HAVEN_BIN"
    b = Broker(bin_path, tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()
        b.kill()
        print("---- broker log tail ----\n" + b.log_tail())


class Collector(stomp.ConnectionListener):
    """Collects what one stomp.py connection receives, with bounded waits."""

    def __init__(self):
        self.messages = queue.Queue()
        self.errors = []
        self.receipts = set()
        self.cv = threading.Condition()

    def on_message(self, frame):
        self.messages.put(frame)

    def on_error(self, frame):
        self.errors.append(frame)

    def on_receipt(self, frame):
        with self.cv:
            self.receipts.add(frame.headers.get("receipt-id"))
            self.cv.notify_all()

    def get(self, timeout=WAIT_S):
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout}s (errors: {[e.headers for e in self.errors]})")

    def assert_none(self, within=1.0):
        try:
            frame = self.messages.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message: {frame.headers} {frame.body!r}")

    def wait_receipt(self, rid, timeout=WAIT_S):
        with self.cv:
            ok = self.cv.wait_for(lambda: rid in self.receipts, timeout=timeout)
        assert ok, f"no RECEIPT {rid} within {timeout}s (errors: {[e.headers for e in self.errors]})"


class Client:
    """A stomp.py 1.2 connection plus its collector, with receipted helpers."""

    def __init__(self, broker, client_id=None):
        self.conn = stomp.Connection12([("127.0.0.1", broker.port)], heartbeats=(0, 0))
        self.col = Collector()
        self.conn.set_listener("collector", self.col)
        headers = {"client-id": client_id} if client_id else {}
        self.conn.connect("guest", "guest", wait=True, headers=headers)

    def _rid(self):
        return "r-" + uuid.uuid4().hex

    def send(self, destination, body, **headers):
        """SEND and wait for its RECEIPT (on Haven: stored durably)."""
        rid = self._rid()
        self.conn.send(destination, body, headers=dict(headers, receipt=rid))
        self.col.wait_receipt(rid)

    def subscribe(self, destination, sub_id, ack="auto", **headers):
        rid = self._rid()
        self.conn.subscribe(destination, sub_id, ack=ack, headers=dict(headers, receipt=rid))
        self.col.wait_receipt(rid)

    def unsubscribe(self, sub_id, **headers):
        rid = self._rid()
        self.conn.unsubscribe(sub_id, headers=dict(headers, receipt=rid))
        self.col.wait_receipt(rid)

    def ack(self, frame):
        rid = self._rid()
        self.conn.ack(frame.headers["ack"], receipt=rid)
        self.col.wait_receipt(rid)

    def nack(self, frame):
        rid = self._rid()
        self.conn.nack(frame.headers["ack"], receipt=rid)
        self.col.wait_receipt(rid)

    def get(self, timeout=WAIT_S):
        return self.col.get(timeout)

    def close(self):
        """DISCONNECT and wait for its RECEIPT: the broker sends it only after the connection
        is closed (its client-id free again), so a test may reconnect with the same id at once.
        stomp.py's own disconnect() returns before that RECEIPT arrives."""
        if self.conn.is_connected():
            rid = self._rid()
            self.conn.disconnect(receipt=rid)
            self.col.wait_receipt(rid)


@pytest.fixture
def clients(broker):
    """Factory of connected clients; all are disconnected at the end of the test."""
    made = []

    def make(client_id=None):
        c = Client(broker, client_id)
        made.append(c)
        return c

    yield make
    for c in made:
        try:
            c.close()
        except Exception:
            pass

//! BrokerProcess against a stand-in broker (a small Python script that answers CONNECT), so the
//! process handling is tested without depending on the real broker being finished.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use haven_testkit::{free_addr, stomp_connect_probe, BrokerOpts, BrokerProcess, TestkitError};

const FAKE_BROKER: &str = r#"#!/usr/bin/env python3
import socket, sys, threading, os
args = sys.argv[1:]
assert args[0] == "run", args
addr = args[args.index("--stomp") + 1]
data = args[args.index("--data") + 1]
host, port = addr.rsplit(":", 1)
print("fake broker pid", os.getpid(), "data", data, "args", args, flush=True)
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((host, int(port))); srv.listen(16)
def serve(c):
    buf = b""
    while b"\0" not in buf:
        d = c.recv(4096)
        if not d: return
        buf += d
    c.sendall(b"CONNECTED\nversion:1.2\n\n\0")
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

fn fake_broker(dir: &Path) -> PathBuf {
    let path = dir.join("fake-haven");
    std::fs::write(&path, FAKE_BROKER).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn start_waits_for_connected_and_stop_ends_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOpts {
        config_toml: Some("# empty\n".into()),
        ..BrokerOpts::new(
            fake_broker(dir.path()),
            dir.path().join("data"),
            free_addr(),
        )
    };
    let mut broker = BrokerProcess::start(opts).expect("start");
    assert!(broker.is_running());
    assert_eq!(
        stomp_connect_probe(broker.addr(), Duration::from_secs(2)).unwrap(),
        "CONNECTED"
    );
    assert!(broker.data_dir().is_dir());
    let log = std::fs::read_to_string(broker.log_path()).unwrap();
    assert!(log.contains("=== haven-testkit start 1 ==="), "{log}");
    assert!(
        log.contains("--config"),
        "config file must be passed: {log}"
    );
    let status = broker.stop().expect("stop");
    assert!(!status.success(), "SIGTERM ends the fake broker by signal");
    assert!(!broker.is_running());
    assert!(stomp_connect_probe(broker.addr(), Duration::from_millis(500)).is_err());
}

#[test]
fn kill9_then_restart_serves_again_on_the_same_address() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOpts::new(
        fake_broker(dir.path()),
        dir.path().join("data"),
        free_addr(),
    );
    let mut broker = BrokerProcess::start(opts).expect("start");
    let first_pid = broker.pid().unwrap();
    broker.kill9().unwrap();
    assert!(!broker.is_running());
    assert!(matches!(broker.kill9(), Err(TestkitError::NotRunning)));
    broker.restart().expect("restart");
    assert_ne!(broker.pid().unwrap(), first_pid);
    assert_eq!(broker.starts(), 2);
    assert!(std::fs::read_to_string(broker.log_path())
        .unwrap()
        .contains("start 2"));
}

#[test]
fn sigstop_freezes_and_sigcont_thaws() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOpts::new(
        fake_broker(dir.path()),
        dir.path().join("data"),
        free_addr(),
    );
    let mut broker = BrokerProcess::start(opts).expect("start");
    broker.sigstop().unwrap();
    assert!(
        stomp_connect_probe(broker.addr(), Duration::from_millis(300)).is_err(),
        "a frozen broker answers nothing"
    );
    broker.sigcont().unwrap();
    assert_eq!(
        stomp_connect_probe(broker.addr(), Duration::from_secs(2)).unwrap(),
        "CONNECTED"
    );
    // Stopping a frozen broker works too (stop thaws it before SIGTERM).
    broker.sigstop().unwrap();
    broker.stop().unwrap();
    assert!(!broker.is_running());
}

#[test]
fn a_broker_that_exits_at_start_is_reported_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("failing-haven");
    std::fs::write(
        &bin,
        "#!/bin/sh\necho 'config: unknown key foo' >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = BrokerProcess::start(BrokerOpts::new(bin, dir.path().join("data"), free_addr()))
        .unwrap_err();
    match err {
        TestkitError::ExitedEarly { log_tail, .. } => {
            assert!(log_tail.contains("unknown key foo"), "{log_tail}")
        }
        other => panic!("expected ExitedEarly, got {other}"),
    }
}

#[test]
fn drop_kills_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BrokerOpts::new(
        fake_broker(dir.path()),
        dir.path().join("data"),
        free_addr(),
    );
    let broker = BrokerProcess::start(opts).expect("start");
    let addr = broker.addr();
    drop(broker);
    // Drop killed and reaped it: nothing answers on its address any more.
    assert!(stomp_connect_probe(addr, Duration::from_millis(500)).is_err());
}

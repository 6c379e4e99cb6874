//! Ports and a minimal STOMP readiness probe (raw bytes, no client crate: the probe must not
//! share bugs with the code under test).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Lowest port `free_port` hands out: above the well-known and registered services a test
/// machine may run.
const TEST_PORT_MIN: u16 = 10_000;
/// Candidates `free_port` tries before it falls back to a port the OS picks.
const TEST_PORT_TRIES_MAX: u32 = 64;

/// A TCP port on 127.0.0.1 that was free a moment ago. Another process can take it before the
/// broker binds, so it is chosen below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`): a port the OS picks for `bind(0)` comes from that range,
/// which is also where every outgoing connection of every process gets its local port, and a
/// test broker then lost its freed port to some client's connect (seen in the network tests
/// under load). Below the range only another test's pick can collide, and the choice is random.
/// Within one test process a port is handed out once: tests run on parallel threads, and two
/// of them given the same port, each before its broker bound it, talked to each other's
/// brokers (seen once in CI: replicated tests saw "two brokers serve the same store" and
/// messages the other test had sent).
pub fn free_port() -> u16 {
    for _ in 0..ISSUE_TRIES_MAX {
        let port = free_port_once();
        let mut issued = ISSUED_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        if issued.insert(port) {
            return port;
        }
    }
    panic!("no port left that this process has not handed out already");
}

/// Fresh picks `free_port` tries before it gives up on finding a port not handed out yet.
const ISSUE_TRIES_MAX: u32 = 1_000;

/// Every port `free_port` has handed out in this process.
static ISSUED_PORTS: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn free_port_once() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let ephemeral_min = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_min > TEST_PORT_MIN + 1_000 {
        let span = u64::from(ephemeral_min - TEST_PORT_MIN);
        // std's randomly keyed hasher: a different sequence in every process and call.
        let random = std::collections::hash_map::RandomState::new();
        for attempt in 0..TEST_PORT_TRIES_MAX {
            let mut h = random.build_hasher();
            h.write_u32(attempt);
            let port = TEST_PORT_MIN + (h.finish() % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local_addr").port()
}

/// `127.0.0.1:<free_port()>`.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// Connects, sends CONNECT and returns the broker's first frame's command line (`CONNECTED`,
/// `ERROR`, ...) within `timeout`. `Err` when nothing listens or nothing came back.
pub fn stomp_connect_probe(addr: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream
        .write_all(b"CONNECT\naccept-version:1.2,1.1,1.0\nhost:localhost\nheart-beat:0,0\n\n\0")?;
    let mut got = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    // Read up to the first frame's end (skipping leading heart-beat EOLs).
    while !got
        .iter()
        .skip_while(|b| **b == b'\n' || **b == b'\r')
        .any(|b| *b == 0)
    {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&chunk[..n]);
        if got.len() > 64 * 1024 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    let command = text
        .trim_start_matches(['\n', '\r'])
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    if command.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "no frame in answer to CONNECT",
        ));
    }
    Ok(command)
}

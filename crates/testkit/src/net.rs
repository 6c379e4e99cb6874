//! Ports and a minimal STOMP readiness probe (raw bytes, no client crate: the probe must not
//! share bugs with the code under test).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it). Another process can
/// take it before the broker binds; tests that cannot tolerate that retry with a new port.
pub fn free_port() -> u16 {
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

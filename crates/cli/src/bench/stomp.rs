//! The bench's own minimal STOMP 1.0–1.2 client side: frame parsing, frame encoding and the
//! CONNECT handshake, straight on a tokio `TcpStream`.
//!
//! Why not `haven-client`: a load generator must cost as little as possible and must behave the
//! same against every broker it compares. Owning the bytes lets producers batch many SENDs into
//! one `write` (no per-frame allocation: frames are encoded into one reused `BytesMut`) and lets
//! consumers ACK cumulatively after draining the socket. It also keeps the bench independent
//! of the client under test: a bug in `haven-client` cannot hide a broker bug or flatter a
//! number. Header values the broker sends (e.g. `ack`, `message-id`) are kept in their escaped
//! wire form and sent back verbatim, which is exactly right for 1.1/1.2 escaping.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::error::{BenchError, Result};

/// Largest frame the bench accepts from a broker; a bigger one is a protocol error.
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Bytes reserved per socket read.
const READ_CHUNK_BYTES: usize = 64 << 10;
/// How long CONNECT may take before the broker is declared unresponsive.
pub const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// A decoded frame. All parts are slices of one shared buffer (no copy per header).
#[derive(Debug)]
pub struct Frame {
    pub command: Bytes,
    headers: Vec<(Bytes, Bytes)>,
    pub body: Bytes,
}

impl Frame {
    pub fn is(&self, command: &str) -> bool {
        self.command == command.as_bytes()
    }

    /// First occurrence wins, as STOMP 1.2 requires for repeated headers.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(k, _)| k == name.as_bytes())
            .map(|(_, v)| &v[..])
    }

    pub fn header_u64(&self, name: &str) -> Option<u64> {
        parse_u64(self.header(name)?)
    }

    /// `message` header and body of an ERROR frame, for humans.
    pub fn error_text(&self) -> String {
        let message = self
            .header("message")
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        let body = String::from_utf8_lossy(&self.body);
        let body = body.trim();
        if body.is_empty() {
            message.into_owned()
        } else {
            format!("{message}: {body}")
        }
    }
}

pub fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(n)
}

/// Decodes one frame from the front of `buf`, or returns `None` if more bytes are needed.
/// Leading EOLs (heart-beats) are skipped.
pub fn parse(buf: &mut BytesMut) -> Result<Option<Frame>> {
    while matches!(buf.first(), Some(b'\n' | b'\r')) {
        buf.advance(1);
    }
    if buf.is_empty() {
        return Ok(None);
    }
    let Some((head_len, body_start)) = find_blank_line(buf) else {
        if buf.len() > FRAME_BYTES_MAX {
            return Err(BenchError::Protocol(format!(
                "no end of headers in {} bytes",
                buf.len()
            )));
        }
        return Ok(None);
    };
    // Header block: lines of buf[..head_len]; remember ranges, slice after freezing.
    let mut lines = Vec::with_capacity(16);
    let mut start = 0;
    while start < head_len {
        let end = buf[start..head_len]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(head_len, |i| start + i);
        let trimmed_end = if end > start && buf[end - 1] == b'\r' {
            end - 1
        } else {
            end
        };
        lines.push((start, trimmed_end));
        start = end + 1;
    }
    let (command_start, command_end) = lines[0];
    let mut header_ranges = Vec::with_capacity(lines.len() - 1);
    let mut content_length = None;
    for &(s, e) in &lines[1..] {
        let Some(colon) = buf[s..e].iter().position(|&b| b == b':') else {
            return Err(BenchError::Protocol("header line without ':'".into()));
        };
        let (ks, ke, vs, ve) = (s, s + colon, s + colon + 1, e);
        if content_length.is_none() && &buf[ks..ke] == b"content-length" {
            let n = parse_u64(&buf[vs..ve])
                .ok_or_else(|| BenchError::Protocol("bad content-length".into()))?;
            content_length = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
        header_ranges.push((ks, ke, vs, ve));
    }
    let body_end = match content_length {
        Some(n) => {
            if n > FRAME_BYTES_MAX {
                return Err(BenchError::Protocol(format!(
                    "content-length {n} over {FRAME_BYTES_MAX}"
                )));
            }
            if buf.len() < body_start + n + 1 {
                return Ok(None);
            }
            if buf[body_start + n] != 0 {
                return Err(BenchError::Protocol("body not followed by NUL".into()));
            }
            body_start + n
        }
        None => match buf[body_start..].iter().position(|&b| b == 0) {
            Some(i) => body_start + i,
            None if buf.len() > FRAME_BYTES_MAX => {
                return Err(BenchError::Protocol("no NUL terminator".into()));
            }
            None => return Ok(None),
        },
    };
    let bytes = buf.split_to(body_end + 1).freeze();
    let headers = header_ranges
        .into_iter()
        .map(|(ks, ke, vs, ve)| (bytes.slice(ks..ke), bytes.slice(vs..ve)))
        .collect();
    Ok(Some(Frame {
        command: bytes.slice(command_start..command_end),
        headers,
        body: bytes.slice(body_start..body_end),
    }))
}

/// Returns (length of the header block without the blank line, index where the body starts).
fn find_blank_line(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buf.len() {
        let nl = i + buf[i..].iter().position(|&b| b == b'\n')?;
        match buf.get(nl + 1) {
            Some(b'\n') => return Some((nl, nl + 2)),
            Some(b'\r') if buf.get(nl + 2) == Some(&b'\n') => return Some((nl, nl + 3)),
            None => return None,
            _ => i = nl + 1,
        }
    }
    None
}

/// Frame encoding into a caller-owned, reused buffer: `begin`, any number of `header`, `end`.
pub fn begin(buf: &mut BytesMut, command: &str) {
    buf.extend_from_slice(command.as_bytes());
    buf.extend_from_slice(b"\n");
}

pub fn header(buf: &mut BytesMut, name: &str, value: impl std::fmt::Display) {
    // Writing to a BytesMut cannot fail.
    writeln!(buf, "{name}:{value}").expect("BytesMut write");
}

pub fn header_raw(buf: &mut BytesMut, name: &str, value: &[u8]) {
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b":");
    buf.extend_from_slice(value);
    buf.extend_from_slice(b"\n");
}

pub fn end(buf: &mut BytesMut, body: &[u8]) {
    buf.extend_from_slice(b"\n");
    buf.extend_from_slice(body);
    buf.extend_from_slice(b"\0");
}

/// Reading side of a connection. `fill` is cancel-safe (bytes already read stay in `buf`),
/// so it can sit in a `select!`.
pub struct FrameReader {
    rd: OwnedReadHalf,
    buf: BytesMut,
}

impl FrameReader {
    pub fn try_next(&mut self) -> Result<Option<Frame>> {
        parse(&mut self.buf)
    }

    /// Reads more bytes from the socket; `false` at end of stream.
    pub async fn fill(&mut self) -> Result<bool> {
        self.buf.reserve(READ_CHUNK_BYTES);
        Ok(self.rd.read_buf(&mut self.buf).await? > 0)
    }

    pub async fn next(&mut self) -> Result<Option<Frame>> {
        loop {
            if let Some(frame) = self.try_next()? {
                return Ok(Some(frame));
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V10,
    V11,
    V12,
}

#[derive(Clone, Debug)]
pub struct ConnectOptions {
    pub addr: String,
    pub login: Option<String>,
    pub passcode: Option<String>,
    /// STOMP `host` header; RabbitMQ reads it as the virtual host, so "/" is the safe default.
    pub host: String,
}

pub struct Connection {
    pub reader: FrameReader,
    pub writer: OwnedWriteHalf,
    pub version: Version,
}

/// Opens a TCP connection (`TCP_NODELAY`: the latency scenario sends one frame at a time),
/// sends CONNECT without heart-beats and waits for CONNECTED.
pub async fn connect(options: &ConnectOptions) -> Result<Connection> {
    let stream = TcpStream::connect(&options.addr)
        .await
        .map_err(|source| BenchError::Connect {
            addr: options.addr.clone(),
            source,
        })?;
    stream.set_nodelay(true)?;
    let (rd, mut writer) = stream.into_split();
    let mut buf = BytesMut::with_capacity(256);
    begin(&mut buf, "CONNECT");
    header(&mut buf, "accept-version", "1.0,1.1,1.2");
    header(&mut buf, "host", &options.host);
    header(&mut buf, "heart-beat", "0,0");
    if let Some(login) = &options.login {
        header(&mut buf, "login", login);
    }
    if let Some(passcode) = &options.passcode {
        header(&mut buf, "passcode", passcode);
    }
    end(&mut buf, b"");
    writer.write_all(&buf).await?;
    let mut reader = FrameReader {
        rd,
        buf: BytesMut::with_capacity(READ_CHUNK_BYTES),
    };
    let reply = tokio::time::timeout(Duration::from_millis(CONNECT_TIMEOUT_MS), reader.next())
        .await
        .map_err(|_| {
            BenchError::Timeout(format!(
                "no CONNECTED from {} within {CONNECT_TIMEOUT_MS} ms",
                options.addr
            ))
        })??;
    let frame = reply.ok_or(BenchError::Closed("during CONNECT"))?;
    if frame.is("ERROR") {
        return Err(BenchError::Broker(frame.error_text()));
    }
    if !frame.is("CONNECTED") {
        return Err(BenchError::Protocol(format!(
            "expected CONNECTED, got {}",
            String::from_utf8_lossy(&frame.command)
        )));
    }
    let version = match frame.header("version") {
        Some(b"1.2") => Version::V12,
        Some(b"1.1") => Version::V11,
        _ => Version::V10,
    };
    Ok(Connection {
        reader,
        writer,
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Vec<Frame> {
        let mut buf = BytesMut::from(bytes);
        let mut frames = Vec::new();
        while let Some(f) = parse(&mut buf).unwrap() {
            frames.push(f);
        }
        assert!(buf.is_empty(), "left over: {:?}", buf);
        frames
    }

    #[test]
    fn parses_frames_with_and_without_content_length_and_heartbeats() {
        let frames = parse_all(b"\n\r\nRECEIPT\nreceipt-id:7\n\n\0\nMESSAGE\r\ncontent-length:3\r\na:1\r\na:2\r\n\r\nx\0y\0");
        assert_eq!(frames.len(), 2);
        assert!(frames[0].is("RECEIPT"));
        assert_eq!(frames[0].header_u64("receipt-id"), Some(7));
        assert!(frames[1].is("MESSAGE"));
        assert_eq!(
            frames[1].header("a"),
            Some(&b"1"[..]),
            "first repeated header wins"
        );
        assert_eq!(&frames[1].body[..], b"x\0y");
    }

    #[test]
    fn waits_for_more_bytes_at_every_cut() {
        let whole = b"MESSAGE\ncontent-length:2\nid:1\n\nab\0";
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert!(parse(&mut buf).unwrap().is_none(), "cut at {cut}");
        }
    }

    #[test]
    fn encodes_what_it_parses() {
        let mut buf = BytesMut::new();
        begin(&mut buf, "SEND");
        header(&mut buf, "destination", "/queue/a");
        header(&mut buf, "content-length", 2);
        end(&mut buf, b"hi");
        let frames = parse_all(&buf);
        assert_eq!(frames[0].header("destination"), Some(&b"/queue/a"[..]));
        assert_eq!(&frames[0].body[..], b"hi");
    }
}

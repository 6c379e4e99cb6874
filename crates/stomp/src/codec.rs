//! The STOMP frame codec: bytes in, `Item`s out, and back.
//!
//! The decoder is an incremental state machine over the connection's read buffer. It
//! consumes each command and header line as soon as the line is complete, and remembers how
//! far it has searched for the next delimiter (`scanned_bytes`), so a frame arriving in many
//! small reads costs O(frame) rather than O(frame²). Every phase has a bound: a partial
//! command line is at most a command name, a partial header line at most
//! `header_bytes_max`, and a frame at most `frame_bytes_max`; past any bound decoding fails
//! at once instead of buffering more. The buffer therefore never holds more than one
//! frame's worth of undecoded bytes (plus a couple of bytes of EOL).
//!
//! Bodies are split off the read buffer without copying (`BytesMut::split_to`).
//!
//! After a decode error the codec resets to "between frames", but the connection's bytes
//! are no longer trustworthy: the caller is expected to send an ERROR frame and close.

use crate::error::{quote, DecodeError};
use crate::escape::{escape_into, unescape_into, Escaping, Part, Unencodable};
use crate::frame::{Command, Frame, Item};
use crate::version::Version;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use haven_headers::{Decimal, Headers};
use std::io;
use tokio_util::codec::{Decoder, Encoder};

/// Size bounds on decoded frames. Every one is enforced before the bytes are buffered.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Whole frame, command line through NUL terminator, in bytes.
    pub frame_bytes_max: usize,
    /// Headers per frame.
    pub header_count_max: usize,
    /// One header line (name, colon and value as on the wire, EOL excluded), in bytes.
    pub header_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            frame_bytes_max: 10 * 1024 * 1024,
            header_count_max: 1000,
            header_bytes_max: 10 * 1024,
        }
    }
}

/// Where the decoder is inside the byte stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Between frames: EOLs here are heart-beats.
    Idle,
    /// Reading the command line.
    Command,
    /// Reading header lines of a frame with this command.
    Headers(Command),
    /// Reading the body; `content_length` from the first `content-length` header.
    Body {
        command: Command,
        content_length: Option<usize>,
    },
}

/// tokio-util codec for STOMP frames. Decodes to `Item`, encodes `&Frame`, `Frame` and
/// `Item`. Owns only the framing state of one connection; it does no I/O itself.
#[derive(Debug)]
pub struct StompCodec {
    limits: Limits,
    version: Version,
    phase: Phase,
    /// Headers of the frame being decoded.
    headers: Headers,
    /// Bytes of the current frame already consumed from the buffer (command and header
    /// lines), counted against `frame_bytes_max`.
    head_bytes: usize,
    /// How many bytes at the front of the buffer are known not to contain the delimiter
    /// the current phase looks for (LF for lines, NUL for bodies). Reset whenever bytes are
    /// consumed.
    scanned_bytes: usize,
}

impl StompCodec {
    /// Starts with STOMP 1.0 rules (no escaping): the CONNECT/CONNECTED exchange is never
    /// escaped, and the version is only known once it is done.
    pub fn new(limits: Limits) -> Self {
        StompCodec {
            limits,
            version: Version::V1_0,
            phase: Phase::Idle,
            headers: Default::default(),
            head_bytes: 0,
            scanned_bytes: 0,
        }
    }

    /// Switches escaping rules, normally right after CONNECTED is sent or received.
    pub fn set_version(&mut self, v: Version) {
        self.version = v;
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn reset(&mut self) {
        self.phase = Phase::Idle;
        self.headers.clear();
        self.head_bytes = 0;
        self.scanned_bytes = 0;
    }

    /// Finds the next complete line at the front of `src`. Returns the index of its LF, or
    /// None after checking that the partial line is still within `line_bytes_max`
    /// (`too_long` says what to report otherwise) and the frame limit.
    fn find_line(
        &mut self,
        src: &BytesMut,
        line_bytes_max: usize,
        too_long: impl FnOnce(&[u8]) -> DecodeError,
    ) -> Result<Option<usize>, DecodeError> {
        debug_assert!(self.scanned_bytes <= src.len());
        // memchr, here and for the colon, backslash and NUL: the byte-at-a-time scans it
        // replaced were 3.7% of a broker's instructions in scenario (c) (docs/PERFORMANCE.md).
        if let Some(i) = memchr::memchr(b'\n', &src[self.scanned_bytes..]) {
            return Ok(Some(self.scanned_bytes + i));
        }
        self.scanned_bytes = src.len();
        // +1: the partial line may end in the CR of a CRLF, which is not part of the line.
        if src.len() > line_bytes_max + 1 {
            return Err(too_long(src));
        }
        // +2: the line still needs at least its LF and the frame its NUL.
        if self.head_bytes + src.len() + 2 > self.limits.frame_bytes_max {
            return Err(self.too_large());
        }
        Ok(None)
    }

    /// Consumes the line ending at `lf` (and its LF), accounting it to the frame.
    fn consume_line(&mut self, src: &mut BytesMut, lf: usize) -> Result<(), DecodeError> {
        self.head_bytes += lf + 1;
        self.scanned_bytes = 0;
        src.advance(lf + 1);
        // +1: the frame still needs its NUL.
        if self.head_bytes + 1 > self.limits.frame_bytes_max {
            return Err(self.too_large());
        }
        Ok(())
    }

    fn too_large(&self) -> DecodeError {
        DecodeError::FrameTooLarge {
            limit_bytes: self.limits.frame_bytes_max,
        }
    }

    fn decode_inner(&mut self, src: &mut BytesMut) -> Result<Option<Item>, DecodeError> {
        loop {
            match self.phase {
                Phase::Idle => match src.first() {
                    None => return Ok(None),
                    Some(b'\n') => {
                        src.advance(1);
                        return Ok(Some(Item::Heartbeat));
                    }
                    Some(b'\r') => match src.get(1) {
                        None => return Ok(None),
                        Some(b'\n') => {
                            src.advance(2);
                            return Ok(Some(Item::Heartbeat));
                        }
                        // A stray CR starts a (bad) command line; let that phase report it.
                        Some(_) => self.phase = Phase::Command,
                    },
                    Some(_) => self.phase = Phase::Command,
                },
                Phase::Command => {
                    let Some(lf) = self.find_line(src, Command::NAME_BYTES_MAX, |partial| {
                        DecodeError::UnknownCommand(quote(partial))
                    })?
                    else {
                        return Ok(None);
                    };
                    let line = strip_cr(&src[..lf]);
                    let command = Command::parse(line)
                        .ok_or_else(|| DecodeError::UnknownCommand(quote(line)))?;
                    self.consume_line(src, lf)?;
                    self.phase = Phase::Headers(command);
                }
                Phase::Headers(command) => {
                    let limit_bytes = self.limits.header_bytes_max;
                    let Some(lf) = self.find_line(src, limit_bytes, |_| {
                        DecodeError::HeaderTooLong { limit_bytes }
                    })?
                    else {
                        return Ok(None);
                    };
                    let line = strip_cr(&src[..lf]);
                    if line.is_empty() {
                        let content_length = self.content_length()?;
                        self.consume_line(src, lf)?;
                        if let Some(n) = content_length {
                            // Known now, so refuse now rather than after buffering it.
                            if self.head_bytes.saturating_add(n).saturating_add(1)
                                > self.limits.frame_bytes_max
                            {
                                return Err(self.too_large());
                            }
                        }
                        self.phase = Phase::Body {
                            command,
                            content_length,
                        };
                        continue;
                    }
                    if line.len() > limit_bytes {
                        return Err(DecodeError::HeaderTooLong { limit_bytes });
                    }
                    if self.headers.len() >= self.limits.header_count_max {
                        return Err(DecodeError::TooManyHeaders {
                            limit: self.limits.header_count_max,
                        });
                    }
                    push_header(
                        &mut self.headers,
                        line,
                        Escaping::for_frame(self.version, command),
                    )?;
                    self.consume_line(src, lf)?;
                }
                Phase::Body {
                    command,
                    content_length: Some(n),
                } => {
                    let needed = n + 1;
                    if src.len() < needed {
                        // One allocation for the rest of the body instead of many as it
                        // trickles in; bounded because n passed the frame limit.
                        src.reserve(needed - src.len());
                        return Ok(None);
                    }
                    if src[n] != 0 {
                        return Err(DecodeError::ContentLength {
                            reason: format!("the {n}-byte body is not followed by a NUL byte"),
                        });
                    }
                    let body = split_body(src, n);
                    return Ok(Some(self.finish(command, body)));
                }
                Phase::Body {
                    command,
                    content_length: None,
                } => {
                    debug_assert!(self.scanned_bytes <= src.len());
                    match memchr::memchr(0, &src[self.scanned_bytes..]) {
                        Some(i) => {
                            let body_len = self.scanned_bytes + i;
                            // The whole frame may have arrived in one read; still bounded.
                            if self.head_bytes + body_len + 1 > self.limits.frame_bytes_max {
                                return Err(self.too_large());
                            }
                            let body = split_body(src, body_len);
                            return Ok(Some(self.finish(command, body)));
                        }
                        None => {
                            self.scanned_bytes = src.len();
                            if self.head_bytes + src.len() + 1 > self.limits.frame_bytes_max {
                                return Err(self.too_large());
                            }
                            return Ok(None);
                        }
                    }
                }
            }
        }
    }

    /// The first `content-length` header, parsed.
    fn content_length(&self) -> Result<Option<usize>, DecodeError> {
        let Some(value) = self.headers.get("content-length") else {
            return Ok(None);
        };
        // Digits only: `usize::from_str` would also take a leading '+'.
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(DecodeError::ContentLength {
                reason: format!("{:?} is not a byte count", quote(value.as_bytes())),
            });
        }
        match value.parse::<usize>() {
            Ok(n) => Ok(Some(n)),
            // Only overflow is left, which is certainly over any frame limit.
            Err(_) => Err(self.too_large()),
        }
    }

    fn finish(&mut self, command: Command, body: Bytes) -> Item {
        // Frames on a connection tend to look alike; size the next one like this one.
        let next = Headers::with_capacity(self.headers.len(), self.headers.text_bytes());
        let headers = std::mem::replace(&mut self.headers, next);
        self.reset();
        Item::Frame(Frame {
            command,
            headers,
            body,
        })
    }

    fn encode_frame(&self, frame: &Frame, dst: &mut BytesMut) -> io::Result<()> {
        let start = dst.len();
        let result = self.write_frame(frame, dst);
        if result.is_err() {
            // Never leave half a frame in the write buffer.
            dst.truncate(start);
        }
        result
    }

    fn write_frame(&self, frame: &Frame, dst: &mut BytesMut) -> io::Result<()> {
        self.write_parts(frame.command, frame.headers.iter(), &frame.body, dst)
    }

    /// Encodes a frame from borrowed parts without building a [`Frame`] — the broker's hot
    /// path for MESSAGE frames. Same rules and guarantees as the `Frame` encoder: on error
    /// nothing is left in `dst`.
    pub fn encode_parts<'a, I>(
        &self,
        command: Command,
        headers: I,
        body: &[u8],
        dst: &mut BytesMut,
    ) -> io::Result<()>
    where
        I: Iterator<Item = (&'a str, &'a str)> + Clone,
    {
        let start = dst.len();
        let result = self.write_parts(command, headers, body, dst);
        if result.is_err() {
            dst.truncate(start);
        }
        result
    }

    fn write_parts<'a, I>(
        &self,
        command: Command,
        headers: I,
        body: &[u8],
        dst: &mut BytesMut,
    ) -> io::Result<()>
    where
        I: Iterator<Item = (&'a str, &'a str)> + Clone,
    {
        let mode = Escaping::for_frame(self.version, command);
        let body_len = body.len();
        let mut has_content_length = false;
        // Exact when nothing needs escaping, which is the usual case.
        let mut size = command.as_str().len() + 1;
        for (name, value) in headers.clone() {
            size += name.len() + value.len() + 2;
            if name == "content-length" && !has_content_length {
                has_content_length = true;
                // The decoder trusts the first one, so a wrong one would corrupt the stream.
                if value.parse::<usize>().ok() != Some(body_len) || value.starts_with('+') {
                    return Err(invalid(format!(
                        "content-length header {value:?} does not match the {body_len}-byte body"
                    )));
                }
            }
        }
        let add_content_length = body_len > 0 && !has_content_length;
        if add_content_length {
            size += "content-length:".len() + 20 + 1;
        }
        size += 1 + body_len + 1;
        dst.reserve(size);

        dst.put_slice(command.as_str().as_bytes());
        dst.put_u8(b'\n');
        for (name, value) in headers {
            escape_into(dst, name, Part::Name, mode).map_err(unencodable)?;
            dst.put_u8(b':');
            escape_into(dst, value, Part::Value, mode).map_err(unencodable)?;
            dst.put_u8(b'\n');
        }
        if add_content_length {
            // So a binary body (one holding NULs) survives, and the peer need not scan it.
            dst.put_slice(b"content-length:");
            dst.put_slice(Decimal::new(body_len as u64).as_bytes());
            dst.put_u8(b'\n');
        }
        dst.put_u8(b'\n');
        dst.put_slice(body);
        dst.put_u8(0);
        Ok(())
    }
}

/// Drops the CR of a CRLF line ending; accepted in every version.
fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Takes `len` body bytes and the NUL after them off `src`, the body as a copy of its own.
fn split_body(src: &mut BytesMut, len: usize) -> Bytes {
    debug_assert_eq!(src[len], 0, "body must be followed by its NUL");
    // A copy of exactly the body, not a slice of the read buffer: a slice would keep the
    // whole buffer allocation alive for as long as the message lives (a queued 64 KiB body
    // held the 128 KiB buffer it arrived in, and the next frame's start with it), and the
    // buffer could never be reused for the next read.
    let body = if len == 0 {
        Bytes::new()
    } else {
        Bytes::copy_from_slice(&src[..len])
    };
    src.advance(len + 1);
    body
}

/// Appends the header on `line` to `headers`, unescaped.
fn push_header(headers: &mut Headers, line: &[u8], mode: Escaping) -> Result<(), DecodeError> {
    // Split at the first colon: in 1.1+ a colon inside a name or value is escaped (\c), and
    // in 1.0 a value may hold raw colons (URLs, host:port). Lenient about raw colons in 1.1+
    // values too, as many clients send them.
    let Some(colon) = memchr::memchr(b':', line) else {
        return Err(DecodeError::HeaderWithoutColon { line: quote(line) });
    };
    // One UTF-8 check for the line (escapes are ASCII, so checking before unescaping is
    // checking the result) and one look for a backslash: most lines have none and are
    // copied as they are.
    let line = std::str::from_utf8(line).map_err(|_| DecodeError::InvalidUtf8)?;
    // ':' is ASCII, so the byte index is a character boundary.
    let (raw_name, raw_value) = (&line[..colon], &line[colon + 1..]);
    let backslash = match mode {
        Escaping::Off => None,
        _ => memchr::memchr(b'\\', line.as_bytes()),
    };
    let Some(backslash) = backslash else {
        headers.push(raw_name, raw_value);
        return Ok(());
    };
    headers
        .push_with(
            // Usually only the value has escapes (an id's colons): the name is copied.
            |text| {
                if backslash > colon {
                    text.push_str(raw_name);
                    Ok(())
                } else {
                    unescape_into(raw_name, mode, text)
                }
            },
            |text| unescape_into(raw_value, mode, text),
        )
        .map_err(|_| DecodeError::BadEscape {
            header: quote(raw_name.as_bytes()),
        })
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn unencodable(e: Unencodable) -> io::Error {
    invalid(e.0.to_owned())
}

impl Decoder for StompCodec {
    type Item = Item;
    type Error = DecodeError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Item>, DecodeError> {
        let result = self.decode_inner(src);
        if result.is_err() {
            self.reset();
        }
        result
    }

    /// At end of stream any leftover byte, or a frame whose head was already consumed,
    /// is a frame cut short.
    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Item>, DecodeError> {
        match self.decode(src)? {
            Some(item) => Ok(Some(item)),
            None if src.is_empty() && self.phase == Phase::Idle => Ok(None),
            None => {
                self.reset();
                src.clear();
                Err(DecodeError::MissingNul)
            }
        }
    }
}

/// Encoding errors are `io::Error` (`InvalidInput`): the frame cannot be written under the
/// current version's rules (e.g. a newline in a 1.0 header, or a `content-length` that
/// disagrees with the body). Nothing is written in that case.
impl Encoder<&Frame> for StompCodec {
    type Error = io::Error;

    fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> io::Result<()> {
        self.encode_frame(frame, dst)
    }
}

impl Encoder<Frame> for StompCodec {
    type Error = io::Error;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> io::Result<()> {
        self.encode_frame(&frame, dst)
    }
}

impl Encoder<Item> for StompCodec {
    type Error = io::Error;

    fn encode(&mut self, item: Item, dst: &mut BytesMut) -> io::Result<()> {
        match item {
            Item::Frame(frame) => self.encode_frame(&frame, dst),
            Item::Heartbeat => {
                dst.put_u8(b'\n');
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(version: Version) -> StompCodec {
        let mut c = StompCodec::new(Limits::default());
        c.set_version(version);
        c
    }

    /// Decodes everything in `bytes` (then EOF), returning items or the first error.
    fn decode_all(c: &mut StompCodec, bytes: &[u8]) -> Result<Vec<Item>, DecodeError> {
        let mut buf = BytesMut::from(bytes);
        let mut items = Vec::new();
        while let Some(item) = c.decode_eof(&mut buf)? {
            items.push(item);
        }
        Ok(items)
    }

    fn one_frame(version: Version, bytes: &[u8]) -> Frame {
        match decode_all(&mut codec(version), bytes).unwrap().as_slice() {
            [Item::Frame(f)] => f.clone(),
            other => panic!("expected one frame, got {other:?}"),
        }
    }

    fn decode_err(version: Version, bytes: &[u8]) -> DecodeError {
        decode_all(&mut codec(version), bytes).unwrap_err()
    }

    fn encode(c: &mut StompCodec, f: &Frame) -> BytesMut {
        let mut dst = BytesMut::new();
        c.encode(f, &mut dst).unwrap();
        dst
    }

    #[test]
    fn decodes_a_simple_frame() {
        let f = one_frame(
            Version::V1_2,
            b"SEND\ndestination:/queue/a\nreceipt:1\n\nhello\0",
        );
        assert_eq!(f.command, Command::Send);
        assert_eq!(f.header("destination"), Some("/queue/a"));
        assert_eq!(f.header("receipt"), Some("1"));
        assert_eq!(&f.body[..], b"hello");
    }

    #[test]
    fn crlf_line_endings_are_accepted_in_every_version() {
        for v in Version::ALL {
            let f = one_frame(v, b"SEND\r\ndestination:/q\r\n\r\nbody\0");
            assert_eq!(f.command, Command::Send);
            assert_eq!(f.headers, Headers::from_pairs(&[("destination", "/q")]));
            assert_eq!(&f.body[..], b"body");
        }
    }

    #[test]
    fn heartbeats_between_frames_are_yielded_one_per_eol() {
        let items = decode_all(
            &mut codec(Version::V1_2),
            b"\n\r\nSEND\n\nA\0\n\nSEND\n\nB\0\r\n",
        )
        .unwrap();
        let kinds: Vec<String> = items
            .iter()
            .map(|i| match i {
                Item::Heartbeat => "hb".to_owned(),
                Item::Frame(f) => String::from_utf8(f.body.to_vec()).unwrap(),
            })
            .collect();
        assert_eq!(kinds, ["hb", "hb", "A", "hb", "hb", "B", "hb"]);
    }

    #[test]
    fn content_length_body_may_hold_nuls() {
        let f = one_frame(Version::V1_2, b"SEND\ncontent-length:5\n\na\0b\0c\0");
        assert_eq!(&f.body[..], b"a\0b\0c");
        // Round trip: the encoder adds content-length, so binary survives.
        let mut c = codec(Version::V1_2);
        let sent = Frame::new(Command::Message).with_body(&b"\0\0x\0"[..]);
        let wire = encode(&mut c, &sent);
        let got = one_frame(Version::V1_2, &wire);
        assert_eq!(got.body, sent.body);
        assert_eq!(got.header("content-length"), Some("4"));
    }

    #[test]
    fn repeated_headers_are_kept_and_first_wins() {
        let f = one_frame(Version::V1_2, b"MESSAGE\nfoo:1\nfoo:2\n\n\0");
        assert_eq!(f.header("foo"), Some("1"));
        assert_eq!(f.headers.len(), 2);
        // The first content-length is the one that frames the body.
        let f = one_frame(
            Version::V1_2,
            b"SEND\ncontent-length:1\ncontent-length:9\n\n\0\0",
        );
        assert_eq!(&f.body[..], b"\0");
    }

    #[test]
    fn escaped_headers_round_trip_in_1_1_and_1_2() {
        let nasty = "a:b\\c\nd";
        for v in [Version::V1_1, Version::V1_2] {
            let mut c = codec(v);
            let f = Frame::new(Command::Send).with_header(nasty, nasty);
            let wire = encode(&mut c, &f);
            assert!(wire.starts_with(b"SEND\na\\cb\\\\c\\nd:a\\cb\\\\c\\nd\n\n\0"));
            assert_eq!(one_frame(v, &wire), f);
        }
        let f = Frame::new(Command::Send).with_header("cr", "x\r");
        let wire = encode(&mut codec(Version::V1_2), &f);
        assert_eq!(&wire[..], b"SEND\ncr:x\\r\n\n\0");
        assert_eq!(one_frame(Version::V1_2, &wire), f);
    }

    /// A line with a backslash unescapes only the parts that have one: the name is copied
    /// when its escapes (if any) are all in the value, and vice versa.
    #[test]
    fn escapes_are_found_in_either_part_of_a_line() {
        for v in [Version::V1_1, Version::V1_2] {
            let f = one_frame(
                v,
                b"SEND\norigin:s/ID\\chaven-1\na\\cb:plain\nc\\\\:d\\n\n\n\0",
            );
            let headers: Vec<_> = f.headers.iter().collect();
            assert_eq!(
                headers,
                [("origin", "s/ID:haven-1"), ("a:b", "plain"), ("c\\", "d\n")]
            );
            assert!(matches!(
                decode_err(v, b"SEND\nx\\t:v\n\n\0"),
                DecodeError::BadEscape { .. }
            ));
            assert!(matches!(
                decode_err(v, b"SEND\nx:v\\\n\n\0"),
                DecodeError::BadEscape { .. }
            ));
        }
    }

    #[test]
    fn version_1_0_takes_header_bytes_literally() {
        let f = one_frame(Version::V1_0, b"SEND\nurl:tcp://h:1\\c\n\n\0");
        assert_eq!(f.header("url"), Some("tcp://h:1\\c"));
        let wire = encode(&mut codec(Version::V1_0), &f);
        assert_eq!(&wire[..], b"SEND\nurl:tcp://h:1\\c\n\n\0");
    }

    #[test]
    fn connect_and_connected_are_never_escaped() {
        for v in Version::ALL {
            let f = one_frame(v, b"CONNECT\nlogin:a\\b\npasscode:x:y\n\n\0");
            assert_eq!(f.header("login"), Some("a\\b"));
            assert_eq!(f.header("passcode"), Some("x:y"));
            let connected = Frame::new(Command::Connected).with_header("server", "haven\\1:2");
            let wire = encode(&mut codec(v), &connected);
            assert_eq!(&wire[..], b"CONNECTED\nserver:haven\\1:2\n\n\0");
        }
    }

    #[test]
    fn encoder_refuses_headers_that_would_break_framing() {
        let mut c = codec(Version::V1_0);
        let mut dst = BytesMut::from(&b"prefix"[..]);
        let f = Frame::new(Command::Message).with_header("destination", "/q\nSEND");
        let err = c.encode(&f, &mut dst).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(&dst[..], b"prefix", "nothing of a refused frame is written");
        // Same header is fine once escaping is on.
        c.set_version(Version::V1_1);
        c.encode(&f, &mut dst).unwrap();
    }

    #[test]
    fn encoder_refuses_a_wrong_content_length() {
        let mut c = codec(Version::V1_2);
        let mut dst = BytesMut::new();
        let f = Frame::new(Command::Send)
            .with_header("content-length", "3")
            .with_body("hello");
        assert!(c.encode(&f, &mut dst).is_err());
        assert!(dst.is_empty());
        let f = Frame::new(Command::Send)
            .with_header("content-length", "5")
            .with_body("hello");
        c.encode(&f, &mut dst).unwrap();
        assert_eq!(&dst[..], b"SEND\ncontent-length:5\n\nhello\0");
    }

    #[test]
    fn encoder_writes_heartbeats_and_omits_content_length_for_empty_body() {
        let mut c = codec(Version::V1_2);
        let mut dst = BytesMut::new();
        c.encode(Item::Heartbeat, &mut dst).unwrap();
        c.encode(Item::Frame(Frame::new(Command::Disconnect)), &mut dst)
            .unwrap();
        c.encode(Frame::new(Command::Send).with_body("hi"), &mut dst)
            .unwrap();
        assert_eq!(
            &dst[..],
            b"\nDISCONNECT\n\n\0SEND\ncontent-length:2\n\nhi\0"
        );
    }

    #[test]
    fn unknown_command_is_reported() {
        let err = decode_err(Version::V1_2, b"FROB\n\n\0");
        assert!(
            matches!(&err, DecodeError::UnknownCommand(c) if c == "FROB"),
            "{err}"
        );
        assert!(err.to_string().contains("FROB"));
        // Lower case is a different command.
        assert!(matches!(
            decode_err(Version::V1_2, b"send\n\n\0"),
            DecodeError::UnknownCommand(_)
        ));
        // A long garbage first line is refused before its end arrives.
        let mut c = codec(Version::V1_2);
        let mut buf = BytesMut::from(&[b'A'; 100][..]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(DecodeError::UnknownCommand(_))
        ));
    }

    #[test]
    fn bad_escape_is_reported_with_header_name() {
        let err = decode_err(Version::V1_2, b"SEND\ndestination:/q\\t\n\n\0");
        assert!(matches!(&err, DecodeError::BadEscape { header } if header == "destination"));
        assert!(err.to_string().contains("destination"));
        // \r is only an escape in 1.2.
        assert!(matches!(
            decode_err(Version::V1_1, b"SEND\nx:\\r\n\n\0"),
            DecodeError::BadEscape { .. }
        ));
        // In 1.0 a backslash is just a byte.
        one_frame(Version::V1_0, b"SEND\nx:\\t\n\n\0");
    }

    #[test]
    fn header_without_colon_is_reported_truncated() {
        let err = decode_err(Version::V1_2, b"SEND\nnocolon\n\n\0");
        assert!(matches!(&err, DecodeError::HeaderWithoutColon { line } if line == "nocolon"));
        let mut long = b"SEND\n".to_vec();
        long.extend_from_slice(&[b'x'; 500]);
        long.extend_from_slice(b"\n\n\0");
        match decode_err(Version::V1_2, &long) {
            DecodeError::HeaderWithoutColon { line } => assert!(line.len() <= 64),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn eof_mid_frame_is_missing_nul() {
        for cut in [&b"SEN"[..], b"SEND\n", b"SEND\nx:y\n\nbody", b"\r"] {
            assert!(
                matches!(decode_err(Version::V1_2, cut), DecodeError::MissingNul),
                "{cut:?}"
            );
        }
        // Clean EOF between frames is fine.
        assert_eq!(
            decode_all(&mut codec(Version::V1_2), b"SEND\n\n\0\n")
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn content_length_errors() {
        for bad in [&b"abc"[..], b"-1", b"+1", b"", b" 1"] {
            let mut wire = b"SEND\ncontent-length:".to_vec();
            wire.extend_from_slice(bad);
            wire.extend_from_slice(b"\n\nx\0");
            let err = decode_err(Version::V1_2, &wire);
            assert!(
                matches!(err, DecodeError::ContentLength { .. }),
                "{bad:?}: {err:?}"
            );
        }
        let err = decode_err(Version::V1_2, b"SEND\ncontent-length:2\n\nabc\0");
        assert!(matches!(err, DecodeError::ContentLength { .. }));
        assert!(err.to_string().contains("NUL"), "{err}");
    }

    #[test]
    fn oversized_frames_are_refused_before_buffering() {
        let limits = Limits {
            frame_bytes_max: 100,
            ..Limits::default()
        };
        // Declared length over the limit: refused from the headers alone.
        let mut c = StompCodec::new(limits);
        let mut buf = BytesMut::from(&b"SEND\ncontent-length:1000\n\n"[..]);
        let err = c.decode(&mut buf).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::FrameTooLarge { limit_bytes: 100 }
        ));
        assert!(err.to_string().contains("100"));
        // Overflowing length too.
        let mut c = StompCodec::new(limits);
        let mut buf = BytesMut::from(&b"SEND\ncontent-length:99999999999999999999999\n\n"[..]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(DecodeError::FrameTooLarge { .. })
        ));
        // No content-length and no NUL yet: refused once the buffer passes the limit.
        let mut c = StompCodec::new(limits);
        let mut buf = BytesMut::from(&b"SEND\n\n"[..]);
        assert!(c.decode(&mut buf).unwrap().is_none());
        let mut fed = 0;
        let err = loop {
            buf.extend_from_slice(b"xxxxxxxxxx");
            fed += 10;
            match c.decode(&mut buf) {
                Ok(None) => assert!(buf.len() <= 100),
                Ok(Some(item)) => panic!("{item:?}"),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, DecodeError::FrameTooLarge { .. }));
        assert!(fed <= 100);
        // Exactly at the limit is accepted.
        let mut wire = b"SEND\n\n".to_vec();
        wire.resize(99, b'y');
        wire.push(0);
        assert_eq!(wire.len(), 100);
        let items = decode_all(&mut StompCodec::new(limits), &wire).unwrap();
        assert_eq!(items.len(), 1);
        wire.insert(7, b'y');
        assert!(decode_all(&mut StompCodec::new(limits), &wire).is_err());
    }

    #[test]
    fn too_many_headers_is_reported() {
        let limits = Limits {
            header_count_max: 2,
            ..Limits::default()
        };
        let mut c = StompCodec::new(limits);
        assert!(decode_all(&mut c, b"SEND\na:1\nb:2\n\n\0").is_ok());
        let err = decode_all(&mut c, b"SEND\na:1\nb:2\nc:3\n\n\0").unwrap_err();
        assert!(matches!(err, DecodeError::TooManyHeaders { limit: 2 }));
        assert!(err.to_string().contains('2'));
    }

    #[test]
    fn header_too_long_is_reported_before_the_line_ends() {
        let limits = Limits {
            header_bytes_max: 16,
            ..Limits::default()
        };
        let mut c = StompCodec::new(limits);
        // 16 bytes exactly, with CRLF, is fine.
        assert!(decode_all(&mut c, b"SEND\n0123456789abcd:f\r\n\n\0").is_ok());
        let err = decode_all(&mut c, b"SEND\n0123456789abcd:fg\n\n\0").unwrap_err();
        assert!(matches!(
            err,
            DecodeError::HeaderTooLong { limit_bytes: 16 }
        ));
        // An unterminated line is refused as soon as it is too long.
        let mut buf = BytesMut::from(&b"SEND\n"[..]);
        buf.extend_from_slice(&[b'h'; 40]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(DecodeError::HeaderTooLong { .. })
        ));
    }

    #[test]
    fn invalid_utf8_is_reported() {
        for v in Version::ALL {
            assert!(matches!(
                decode_err(v, b"SEND\nk\xff:v\n\n\0"),
                DecodeError::InvalidUtf8
            ));
            assert!(matches!(
                decode_err(v, b"SEND\nk:\xc3\n\n\0"),
                DecodeError::InvalidUtf8
            ));
        }
        // The body is bytes, not text.
        let f = one_frame(Version::V1_2, b"SEND\n\n\xff\xfe\0");
        assert_eq!(&f.body[..], b"\xff\xfe");
    }

    #[test]
    fn io_errors_convert() {
        let e: DecodeError = io::Error::other("boom").into();
        assert!(e.to_string().contains("boom"));
    }

    #[test]
    fn decoder_recovers_state_after_an_error() {
        // The connection should be closed, but the codec itself must stay sane.
        let mut c = codec(Version::V1_2);
        assert!(decode_all(&mut c, b"SEND\nbad\n\n\0").is_err());
        assert!(decode_all(&mut c, b"SEND\n\n\0").is_ok());
    }

    #[test]
    fn a_body_owns_its_bytes_and_leaves_the_read_buffer_reusable() {
        let mut c = codec(Version::V1_2);
        let mut buf = BytesMut::with_capacity(64);
        buf.extend_from_slice(b"SEND\n\nhello\0");
        let capacity = buf.capacity();
        let Some(Item::Frame(f)) = c.decode(&mut buf).unwrap() else {
            panic!()
        };
        assert_eq!(&f.body[..], b"hello");
        // Nothing else holds the buffer's allocation, so it takes the next read in place
        // while the message lives on.
        assert!(
            buf.try_reclaim(capacity),
            "the body still pins the read buffer"
        );
        assert_eq!(&f.body[..], b"hello");
    }
}

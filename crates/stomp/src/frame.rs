//! Commands, frames and the items a decoder yields.
//!
//! A `Frame` is plain data: headers are kept exactly as they arrived (order and repeats
//! preserved, already unescaped) so the broker can forward them untouched. Interpretation of
//! particular headers (destination, ack, receipt, ...) belongs to the server, not here.

use bytes::Bytes;
use haven_headers::Headers;

/// A STOMP command: the first line of a frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Command {
    // Client frames.
    Connect,
    Stomp,
    Send,
    Subscribe,
    Unsubscribe,
    Ack,
    Nack,
    Begin,
    Commit,
    Abort,
    Disconnect,
    // Server frames.
    Connected,
    Message,
    Receipt,
    Error,
}

impl Command {
    /// Every command, for tests and tables.
    pub const ALL: [Command; 15] = [
        Command::Connect,
        Command::Stomp,
        Command::Send,
        Command::Subscribe,
        Command::Unsubscribe,
        Command::Ack,
        Command::Nack,
        Command::Begin,
        Command::Commit,
        Command::Abort,
        Command::Disconnect,
        Command::Connected,
        Command::Message,
        Command::Receipt,
        Command::Error,
    ];

    /// Length of the longest command name ("UNSUBSCRIBE"). The decoder uses it to reject a
    /// garbage first line early instead of buffering it.
    pub(crate) const NAME_BYTES_MAX: usize = 11;

    /// The wire name, e.g. `"SEND"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Command::Connect => "CONNECT",
            Command::Stomp => "STOMP",
            Command::Connected => "CONNECTED",
            Command::Send => "SEND",
            Command::Subscribe => "SUBSCRIBE",
            Command::Unsubscribe => "UNSUBSCRIBE",
            Command::Ack => "ACK",
            Command::Nack => "NACK",
            Command::Begin => "BEGIN",
            Command::Commit => "COMMIT",
            Command::Abort => "ABORT",
            Command::Disconnect => "DISCONNECT",
            Command::Message => "MESSAGE",
            Command::Receipt => "RECEIPT",
            Command::Error => "ERROR",
        }
    }

    /// Parses a wire name. Case-sensitive, as the spec requires; no surrounding whitespace.
    pub fn parse(bytes: &[u8]) -> Option<Command> {
        Some(match bytes {
            b"CONNECT" => Command::Connect,
            b"STOMP" => Command::Stomp,
            b"CONNECTED" => Command::Connected,
            b"SEND" => Command::Send,
            b"SUBSCRIBE" => Command::Subscribe,
            b"UNSUBSCRIBE" => Command::Unsubscribe,
            b"ACK" => Command::Ack,
            b"NACK" => Command::Nack,
            b"BEGIN" => Command::Begin,
            b"COMMIT" => Command::Commit,
            b"ABORT" => Command::Abort,
            b"DISCONNECT" => Command::Disconnect,
            b"MESSAGE" => Command::Message,
            b"RECEIPT" => Command::Receipt,
            b"ERROR" => Command::Error,
            _ => return None,
        })
    }

    /// CONNECT, STOMP and CONNECTED are exchanged before a version is agreed, so the spec
    /// exempts them from header escaping in every version.
    pub fn is_handshake(&self) -> bool {
        matches!(self, Command::Connect | Command::Stomp | Command::Connected)
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One STOMP frame. Headers are unescaped text, in wire order, repeats kept.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    pub command: Command,
    pub headers: Headers,
    pub body: Bytes,
}

impl Frame {
    pub fn new(command: Command) -> Frame {
        Frame {
            command,
            headers: Default::default(),
            body: Bytes::new(),
        }
    }

    /// The value of the first header called `name` (case-sensitive). STOMP 1.2 says only
    /// the first of repeated headers counts; later ones are kept for forwarding only.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }

    /// Appends a header (builder form). Does not replace an existing one of the same name.
    pub fn with_header(mut self, name: impl AsRef<str>, value: impl AsRef<str>) -> Frame {
        self.push_header(name, value);
        self
    }

    /// Appends a header. Does not replace an existing one of the same name.
    pub fn push_header(&mut self, name: impl AsRef<str>, value: impl AsRef<str>) {
        self.headers.push(name.as_ref(), value.as_ref());
    }

    pub fn with_body(mut self, body: impl Into<Bytes>) -> Frame {
        self.body = body.into();
        self
    }
}

/// What the decoder yields: a frame, or a heart-beat (a bare EOL where a frame could start).
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Frame(Frame),
    Heartbeat,
}

impl From<Frame> for Item {
    fn from(frame: Frame) -> Item {
        Item::Frame(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_names_round_trip() {
        for c in Command::ALL {
            assert_eq!(Command::parse(c.as_str().as_bytes()), Some(c));
            assert!(c.as_str().len() <= Command::NAME_BYTES_MAX);
        }
        assert_eq!(Command::parse(b"send"), None);
        assert_eq!(Command::parse(b"SEND "), None);
        assert_eq!(Command::parse(b""), None);
    }

    #[test]
    fn first_of_repeated_headers_wins() {
        let f = Frame::new(Command::Send)
            .with_header("destination", "/queue/a")
            .with_header("destination", "/queue/b");
        assert_eq!(f.header("destination"), Some("/queue/a"));
        assert_eq!(f.headers.len(), 2);
        assert_eq!(f.header("Destination"), None);
    }

    #[test]
    fn builder_sets_body_and_headers() {
        let mut f = Frame::new(Command::Message).with_body("hi");
        f.push_header("k", "v");
        assert_eq!(&f.body[..], b"hi");
        assert_eq!(f.header("k"), Some("v"));
    }
}

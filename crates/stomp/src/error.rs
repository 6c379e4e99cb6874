//! Decode errors.
//!
//! Every variant is a fault of the peer's bytes (or the socket), never of this crate. The
//! `Display` text is written for the peer: the server copies it into the ERROR frame's
//! `message` header before closing, so it names the limit or the offending line.

/// Longest excerpt of peer input quoted back in an error, in bytes. Bounded so an error
/// frame stays small and a hostile peer cannot make us echo megabytes.
pub(crate) const QUOTE_BYTES_MAX: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    #[error("invalid escape sequence in header {header:?} (allowed: \\\\ \\n \\c, and \\r in STOMP 1.2)")]
    BadEscape { header: String },
    #[error("header line without a colon: {line:?}")]
    HeaderWithoutColon { line: String },
    #[error("connection closed in the middle of a frame (no NUL terminator)")]
    MissingNul,
    #[error("bad content-length: {reason}")]
    ContentLength { reason: String },
    #[error("frame too large: the limit is {limit_bytes} bytes")]
    FrameTooLarge { limit_bytes: usize },
    #[error("too many headers: the limit is {limit}")]
    TooManyHeaders { limit: usize },
    #[error("header line too long: the limit is {limit_bytes} bytes")]
    HeaderTooLong { limit_bytes: usize },
    #[error("header or command is not valid UTF-8")]
    InvalidUtf8,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Lossy, truncated rendering of peer bytes for an error message. Truncates on a char
/// boundary so the result is always valid UTF-8.
pub(crate) fn quote(bytes: &[u8]) -> String {
    let lossy = String::from_utf8_lossy(&bytes[..bytes.len().min(QUOTE_BYTES_MAX)]);
    // Lossy decoding can grow the text (each bad byte becomes a 3-byte U+FFFD); cut again.
    let mut end = lossy.len().min(QUOTE_BYTES_MAX);
    while !lossy.is_char_boundary(end) {
        end -= 1;
    }
    lossy[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_is_bounded_and_valid_utf8() {
        assert_eq!(quote(b"abc"), "abc");
        assert_eq!(quote(&[b'x'; 1000]).len(), QUOTE_BYTES_MAX);
        let q = quote(&[0xff; 1000]);
        assert!(q.len() <= QUOTE_BYTES_MAX && !q.is_empty());
        let q = quote("é".repeat(100).as_bytes());
        assert!(q.len() <= QUOTE_BYTES_MAX && q.chars().all(|c| c == 'é'));
    }
}

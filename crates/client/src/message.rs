//! A MESSAGE frame as the application sees it.

use bytes::Bytes;
use haven_stomp::Headers;

/// A delivered message. `headers` are in wire order; [`Message::header`] returns the first
/// occurrence (STOMP's "first wins" rule for repeated headers).
#[derive(Debug, Clone)]
pub struct Message {
    pub headers: Headers,
    pub body: Bytes,
    pub destination: String,
    pub message_id: String,
    pub subscription: String,
    pub redelivered: bool,
    /// Which connection of a failover client delivered it (0 for a plain `Connection`): an ACK
    /// is only meaningful on the connection that delivered the message.
    pub(crate) generation: u64,
}

impl Message {
    /// A message as a MESSAGE frame with these headers and body would arrive (for tests and
    /// tools that build deliveries by hand).
    pub fn from_headers(headers: Headers, body: Bytes) -> Message {
        let first = |name: &str| headers.get(name).unwrap_or_default().to_string();
        let destination = first("destination");
        let message_id = first("message-id");
        let subscription = first("subscription");
        let redelivered = first("redelivered") == "true";
        Message {
            headers,
            body,
            destination,
            message_id,
            subscription,
            redelivered,
            generation: 0,
        }
    }

    /// The first value of header `name`, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }

    /// The id to put in an ACK/NACK: the `ack` header (STOMP 1.2), else `message-id`.
    pub fn ack_id(&self) -> &str {
        self.header("ack").unwrap_or(&self.message_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Headers {
        Headers::from_pairs(pairs)
    }

    #[test]
    fn first_header_wins_and_ack_id_prefers_ack_header() {
        let m = Message::from_headers(
            h(&[
                ("destination", "/queue/a"),
                ("message-id", "m1"),
                ("subscription", "s"),
                ("ack", "a1"),
                ("x", "first"),
                ("x", "second"),
                ("redelivered", "true"),
            ]),
            Bytes::from_static(b"hi"),
        );
        assert_eq!(m.header("x"), Some("first"));
        assert_eq!(m.ack_id(), "a1");
        assert!(m.redelivered);
        assert_eq!(m.destination, "/queue/a");
        let n = Message::from_headers(h(&[("message-id", "m2")]), Bytes::new());
        assert_eq!(n.ack_id(), "m2");
        assert!(!n.redelivered);
    }
}

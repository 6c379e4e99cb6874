//! A stored message. Shared (`Arc`) between every queue that holds it, so a topic message
//! fanned out to many subscriptions is kept once.

use crate::types::Destination;
use bytes::Bytes;
use haven_headers::Headers;

/// The priority of a message whose SEND names none (JMS's and ActiveMQ's default).
pub const PRIORITY_DEFAULT: u8 = 4;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Broker-wide arrival number: orders messages FIFO within a priority and keys them in the
    /// log. Unique for the life of the store.
    pub seq: u64,
    /// The `message-id` header value. Stable across restarts for persistent messages.
    pub id: String,
    /// Where the producer sent it.
    pub destination: Destination,
    /// The producer's own headers, passed through unchanged, in order.
    pub headers: Headers,
    pub body: Bytes,
    pub persistent: bool,
    /// 0–9, higher first.
    pub priority: u8,
    /// Milliseconds since the Unix epoch after which it is never delivered; 0 = never expires.
    pub expires_ms: u64,
    /// Milliseconds since the Unix epoch when the broker accepted it.
    pub timestamp_ms: u64,
    /// Already moved to a dead-letter queue once. A topic message has one copy per
    /// subscription; when another copy fails too, it is dropped instead of dead-lettered
    /// again, so the DLQ holds a message at most once for as long as any copy lives, even
    /// after the DLQ copy was consumed. Logged (`Store` tag 16, the spill flag byte), so it
    /// outlives paging, compaction and restarts.
    pub dead_lettered: bool,
}

impl Message {
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_ms != 0 && now_ms >= self.expires_ms
    }

    /// `JMSXGroupID`: messages of one group go to one consumer at a time, in order.
    pub fn group(&self) -> Option<&str> {
        self.header("JMSXGroupID").filter(|g| !g.is_empty())
    }

    /// `JMSXGroupSeq`; `-1` closes the group (its next message may go to another consumer).
    pub fn group_seq(&self) -> Option<i64> {
        self.header("JMSXGroupSeq")
            .and_then(|v| v.trim().parse().ok())
    }

    /// Whether a network bridge forwarded it here from `broker`, or through it: `broker` is
    /// one of the comma-separated names in `haven-net-path` (the brokers it was on before this
    /// one). The return rule of network consumers reads it.
    pub fn has_been_on(&self, broker: &str) -> bool {
        self.header(NET_PATH_HEADER)
            .is_some_and(|path| path.split(',').any(|b| b.trim() == broker))
    }

    /// The first occurrence of a producer header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }

    /// Approximate memory the message costs while held in memory, for the memory budget and
    /// the destination byte limits: the body, each header's two strings and their slots, and
    /// the fixed structures (the message itself, its id, queue and index entries). Calibrated
    /// against the broker's resident memory holding many 1 KiB messages with a few headers.
    pub fn size_bytes(&self) -> usize {
        self.body.len()
            + self.headers.text_bytes()
            + self.headers.len() * HEADER_OVERHEAD_BYTES
            + self.id.len()
            + MESSAGE_OVERHEAD_BYTES
    }
}

/// The brokers a forwarded message was on before this one, oldest first, joined by `,`
/// (set by the bridge that forwards it).
pub(crate) const NET_PATH_HEADER: &str = "haven-net-path";

/// Memory a header costs beyond its text: its two offsets (`Headers`). When headers were two
/// `String`s each this was 96.
const HEADER_OVERHEAD_BYTES: usize = 8;
/// Memory a held message costs beyond its body and headers.
const MESSAGE_OVERHEAD_BYTES: usize = 768;

#[cfg(test)]
impl Message {
    /// A persistent message `seq` on `/queue/q`, for unit tests.
    pub(crate) fn for_test(seq: u64, headers: Headers, body: Bytes) -> Message {
        Message {
            seq,
            id: format!("ID:haven-1-{seq}"),
            destination: Destination::Queue("q".into()),
            headers,
            body,
            persistent: true,
            priority: 4,
            expires_ms: 0,
            timestamp_ms: 0,
            dead_lettered: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_path(path: &str) -> Message {
        Message::for_test(
            1,
            Headers::from_pairs(&[(NET_PATH_HEADER, path)]),
            Bytes::new(),
        )
    }

    #[test]
    fn the_path_names_whole_brokers() {
        let m = with_path("A,B");
        assert!(m.has_been_on("A") && m.has_been_on("B"));
        assert!(!m.has_been_on("AB") && !m.has_been_on(""));
        assert!(
            with_path("A, B").has_been_on("B"),
            "spaces around names are ignored"
        );
        let mut local = with_path("A");
        local.headers = Headers::default();
        assert!(!local.has_been_on("A"), "a message sent here has no path");
    }
}

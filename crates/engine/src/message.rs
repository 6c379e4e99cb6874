//! A stored message. Shared (`Arc`) between every queue that holds it, so a topic message
//! fanned out to many subscriptions is kept once.

use crate::types::Destination;
use bytes::Bytes;

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
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    pub persistent: bool,
    /// 0–9, higher first.
    pub priority: u8,
    /// Milliseconds since the Unix epoch after which it is never delivered; 0 = never expires.
    pub expires_ms: u64,
    /// Milliseconds since the Unix epoch when the broker accepted it.
    pub timestamp_ms: u64,
}

impl Message {
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expires_ms != 0 && now_ms >= self.expires_ms
    }

    /// Approximate memory/disk footprint, for limits and statistics.
    pub fn size_bytes(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>()
            + 64
    }
}

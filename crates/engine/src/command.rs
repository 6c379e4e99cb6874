//! What the edges ask of the engine. One command per client frame that changes broker state,
//! plus connection lifecycle and flow-control credit.

use crate::types::{AckMode, ConnId, Destination};
use bytes::Bytes;
use haven_headers::Headers;

/// A SEND's content before the broker has numbered it.
#[derive(Clone, Debug)]
pub struct NewMessage {
    pub headers: Headers,
    pub body: Bytes,
    pub persistent: bool,
    pub priority: u8,
    pub expires_ms: u64,
}

/// A SEND's or COMMIT's `haven-producer` / `haven-seq` headers, parsed by the edge (the
/// engine never reads headers for them): exactly-once sends, see `producers.rs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerSeq {
    /// Non-empty, at most `PRODUCER_ID_BYTES_MAX` bytes.
    pub producer: String,
    /// At least 1.
    pub seq: u64,
}

/// ActiveMQ consumer options from SUBSCRIBE headers.
#[derive(Clone, Debug, Default)]
pub struct SubscribeOptions {
    /// `activemq.exclusive:true`: while this consumer is subscribed, it alone receives the
    /// queue's messages; when it leaves, the next exclusive consumer (in subscription order)
    /// takes over, or all consumers if none is exclusive.
    pub exclusive: bool,
    /// `activemq.priority` (0–127): consumers of higher priority with prefetch room are served
    /// first; equal priorities share round-robin.
    pub priority: u8,
    /// `selector`: only messages it selects are delivered to this subscription.
    pub selector: Option<crate::selector::Selector>,
    /// `browser:true` on a queue: a copy of the waiting messages (at most
    /// `EngineConfig::browse_messages_max`), without consuming them, then a MESSAGE with the
    /// header `browser:end`. Nothing more is delivered to it.
    pub browser: bool,
    /// Set when a network bridge subscribes on behalf of consumers on other brokers
    /// (`haven-net-demand` on SUBSCRIBE); None for an application's consumer.
    pub network: Option<NetworkConsumer>,
}

/// What a network bridge's subscription stands for: demand for this destination that
/// reached this broker from consumers elsewhere in the network of brokers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkConsumer {
    /// The brokers the demand came through, the consumers' own broker first and the broker
    /// this subscription forwards to last. Never empty.
    pub demand_path: Vec<String>,
    /// Subtracted from `priority` when choosing among consumers
    /// (`decreaseNetworkConsumerPriority`): local consumers with room are served first.
    pub priority_penalty: u8,
}

impl NetworkConsumer {
    /// The broker this subscription forwards to.
    pub fn to(&self) -> &str {
        self.demand_path
            .last()
            .expect("a demand path is never empty")
    }
}

/// Which delivery an ACK or NACK names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckRef {
    /// STOMP 1.2: the `ack` header of the MESSAGE, a per-connection delivery tag.
    Tag(u64),
    /// STOMP 1.0/1.1: `message-id`, and in 1.1 the `subscription`.
    MessageId {
        message_id: String,
        subscription: Option<String>,
    },
}

impl std::fmt::Display for AckRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AckRef::Tag(tag) => write!(f, "ack id '{tag}'"),
            AckRef::MessageId {
                message_id,
                subscription: Some(s),
            } => write!(f, "message-id '{message_id}' on subscription '{s}'"),
            AckRef::MessageId {
                message_id,
                subscription: None,
            } => write!(f, "message-id '{message_id}'"),
        }
    }
}

#[derive(Clone, Debug)]
pub enum Command {
    /// A connection finished the CONNECT handshake.
    Connect {
        conn: ConnId,
        client_id: Option<String>,
        /// `haven-producer`: this connection takes the producer over (older sessions that
        /// claimed it are fenced); the caller reads [`crate::Engine::producer_hwm`] after.
        producer: Option<String>,
        /// `haven-session` (0 when absent): orders the CONNECTs of one client, so that a
        /// late one cannot take the producer from a newer session.
        session: u64,
    },
    /// The connection is gone (socket closed, ERROR sent, or DISCONNECT). Idempotent. Unacked
    /// messages are redelivered, transactions rolled back, temporary destinations deleted.
    Close {
        conn: ConnId,
        receipt: Option<String>,
    },
    Subscribe {
        conn: ConnId,
        sub_id: String,
        destination: Destination,
        ack: AckMode,
        /// Most unacknowledged messages dispatched to this subscription at once.
        prefetch: u32,
        /// `activemq.subscriptionName` on a topic: a durable subscription.
        durable_name: Option<String>,
        options: SubscribeOptions,
        receipt: Option<String>,
    },
    Unsubscribe {
        conn: ConnId,
        sub_id: String,
        /// With `activemq.subscriptionName`, the durable subscription is removed for good.
        durable_name: Option<String>,
        receipt: Option<String>,
    },
    Send {
        conn: ConnId,
        destination: Destination,
        message: NewMessage,
        transaction: Option<String>,
        receipt: Option<String>,
        /// Exactly-once: a `seq` at or below the producer's mark is answered, not stored.
        /// Always None inside a transaction (the COMMIT carries it there).
        producer: Option<ProducerSeq>,
    },
    Ack {
        conn: ConnId,
        ack: AckRef,
        transaction: Option<String>,
        receipt: Option<String>,
    },
    Nack {
        conn: ConnId,
        ack: AckRef,
        transaction: Option<String>,
        receipt: Option<String>,
    },
    Begin {
        conn: ConnId,
        transaction: String,
        receipt: Option<String>,
    },
    Commit {
        conn: ConnId,
        transaction: String,
        receipt: Option<String>,
        /// Exactly-once: a `seq` at or below the producer's mark rolls the transaction back
        /// and is answered as if committed.
        producer: Option<ProducerSeq>,
    },
    Abort {
        conn: ConnId,
        transaction: String,
        receipt: Option<String>,
    },
    /// The connection wrote every MESSAGE frame of this auto-ack subscription up to and
    /// including delivery tag `up_to_tag` to its socket: those are acknowledged, and their
    /// prefetch credit returns. A tag, not a count, so credit that arrives after the
    /// subscription id was reused can never acknowledge a newer delivery not yet written.
    Credit {
        conn: ConnId,
        sub_id: String,
        up_to_tag: u64,
    },
    /// A frame that changes nothing but asked for a receipt (kept in order with the rest).
    Receipt { conn: ConnId, receipt: String },
}

impl Command {
    pub fn conn(&self) -> ConnId {
        match self {
            Command::Connect { conn, .. }
            | Command::Close { conn, .. }
            | Command::Subscribe { conn, .. }
            | Command::Unsubscribe { conn, .. }
            | Command::Send { conn, .. }
            | Command::Ack { conn, .. }
            | Command::Nack { conn, .. }
            | Command::Begin { conn, .. }
            | Command::Commit { conn, .. }
            | Command::Abort { conn, .. }
            | Command::Credit { conn, .. }
            | Command::Receipt { conn, .. } => *conn,
        }
    }
}

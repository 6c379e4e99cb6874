//! Engine settings; the server maps `haven.toml` onto these.

/// Where messages go after too many failed deliveries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DlqPolicy {
    /// One queue for everything (ActiveMQ's default `ActiveMQ.DLQ`).
    Shared(String),
    /// `<prefix><destination name>`, e.g. `DLQ.orders` (ActiveMQ's individual DLQ strategy).
    PerDestination { prefix: String },
}

/// Redelivery settings for the destinations a pattern matches (ActiveMQ's per-destination
/// redelivery policy). The first matching policy applies; otherwise the broker-wide settings.
#[derive(Clone, Debug)]
pub struct RedeliveryPolicy {
    /// A queue or topic name, wildcards (`*`, `>`) allowed; matched against where the message
    /// was sent.
    pub destination: crate::types::Destination,
    pub redeliveries_max: u32,
    pub delay_initial_ms: u64,
    pub backoff_multiplier: f64,
    pub delay_max_ms: u64,
}

/// Limits for the destinations a pattern matches (ActiveMQ's per-destination policy entries).
/// The first matching entry applies; unset fields fall back to the broker-wide values.
#[derive(Clone, Debug)]
pub struct DestinationLimits {
    /// A queue or topic name, wildcards (`*`, `>`) allowed. For a durable subscription, its
    /// topic is matched.
    pub destination: crate::types::Destination,
    /// Bytes of waiting messages kept in memory before later ones are paged out to the log.
    pub memory_bytes_max: Option<u64>,
    /// Messages held (waiting, in flight, paged out) at which producers are held back.
    pub messages_max: Option<u64>,
    /// Bytes of waiting messages (in memory or paged out) at which producers are held back.
    pub bytes_max: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// A delivery that fails (NACK, or the connection closed before ACK) is retried this many
    /// times; the next failure moves the message to the DLQ. ActiveMQ's default is 6.
    pub redeliveries_max: u32,
    pub dlq: DlqPolicy,
    /// Expired messages go to the DLQ instead of being dropped (ActiveMQ's default is the DLQ).
    pub expired_to_dlq: bool,
    /// Redelivery delay after the first failed delivery, in ms (0 = redeliver at once).
    pub redelivery_delay_initial_ms: u64,
    /// Each further failure multiplies the delay by this (1 = constant delay).
    pub redelivery_backoff_multiplier: f64,
    /// Upper bound on the delay, in ms.
    pub redelivery_delay_max_ms: u64,
    /// Per-destination overrides of the four settings above, first match wins.
    pub redelivery_policies: Vec<RedeliveryPolicy>,
    /// Prefetch when SUBSCRIBE has no `activemq.prefetchSize`.
    pub prefetch_default: u32,
    /// Upper bound on `activemq.prefetchSize`.
    pub prefetch_max: u32,
    /// Bytes of messages (`Message::size_bytes`) one subscription may have in flight, besides
    /// its prefetch count: a subscription at or over it gets no more until some are
    /// acknowledged (or, for `auto`, written). One message always goes, however large.
    pub prefetch_bytes_max: u64,
    /// SENDs plus ACKs one transaction may hold.
    pub transaction_ops_max: usize,
    /// Body and header bytes one transaction's SENDs may hold: its commit is one log record.
    pub transaction_bytes_max: usize,
    pub transactions_per_connection_max: usize,
    pub subscriptions_per_connection_max: usize,
    /// Messages buffered for one non-durable topic subscriber that is not keeping up; beyond
    /// this the oldest are discarded (they are not stored anywhere else).
    pub topic_subscriber_pending_max: usize,
    /// Most messages one browsing subscription is sent.
    pub browse_messages_max: usize,
    /// Largest record the log takes; a SEND or COMMIT that would need more is refused.
    pub record_bytes_max: usize,
    /// Distinguishes non-persistent message ids across restarts.
    pub boot_id: u64,
    /// Bytes of waiting messages held in memory over all queues; beyond it (or a queue's own
    /// limit) messages stay only in the log and are read back when consumers reach them.
    /// `u64::MAX` = never page (also the case while no loader is installed).
    pub memory_bytes_max: u64,
    /// Per-destination limits, first match wins.
    pub destination_limits: Vec<DestinationLimits>,
    /// Scheduled messages (`AMQ_SCHEDULED_*`) held at once; each is kept in memory.
    pub scheduled_messages_max: usize,
    /// A producer whose sequence mark was last raised this long ago is forgotten (a later
    /// resend of its old sequence numbers is stored again). At least 1.
    pub producer_idle_ms_max: u64,
    /// Producers remembered at once; a new one beyond it forgets the least recently seen.
    pub producers_max: usize,
    /// Network origins (`haven-net-origin`: one per message a bridge forwarded here)
    /// remembered at once, in a table apart from `producers_max`; a new one beyond it forgets
    /// the least recently seen. At least 1.
    pub network_origins_max: usize,
    /// A network origin seen this long ago is forgotten: a bridge resending the message later
    /// than this stores it again. At least 1.
    pub network_origin_idle_ms_max: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            redeliveries_max: 6,
            dlq: DlqPolicy::Shared("ActiveMQ.DLQ".to_string()),
            expired_to_dlq: false,
            redelivery_delay_initial_ms: 0,
            redelivery_backoff_multiplier: 1.0,
            redelivery_delay_max_ms: 3_600_000,
            redelivery_policies: Vec::new(),
            prefetch_default: 1000,
            prefetch_max: 65_536,
            prefetch_bytes_max: 16 << 20,
            transaction_ops_max: 100_000,
            transaction_bytes_max: 16 * 1024 * 1024,
            transactions_per_connection_max: 1_000,
            subscriptions_per_connection_max: 10_000,
            topic_subscriber_pending_max: 100_000,
            browse_messages_max: 10_000,
            record_bytes_max: 32 * 1024 * 1024,
            memory_bytes_max: u64::MAX,
            destination_limits: Vec::new(),
            scheduled_messages_max: 100_000,
            producer_idle_ms_max: 7 * 24 * 3_600_000,
            producers_max: 100_000,
            network_origins_max: 100_000,
            network_origin_idle_ms_max: 600_000,
            boot_id: 0,
        }
    }
}

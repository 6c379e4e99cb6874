//! Errors a client command can cause. Each is the client's mistake, reported to it in an ERROR
//! frame; the engine's state is unchanged when one is returned.

use crate::types::DestinationError;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("connection is not known to the engine")]
    UnknownConnection,
    #[error("client-id '{0}' is already connected")]
    ClientIdInUse(String),
    #[error("subscription id '{0}' is already in use on this connection")]
    DuplicateSubscription(String),
    #[error("no subscription with id '{0}' on this connection")]
    UnknownSubscription(String),
    #[error("a durable subscription needs a client-id on CONNECT")]
    DurableNeedsClientId,
    #[error("durable subscriptions are for topics; '{0}' is not a topic")]
    DurableNotTopic(String),
    #[error("durable subscription '{0}' is already active on another connection")]
    DurableInUse(String),
    #[error("no durable subscription named '{0}'")]
    UnknownDurable(String),
    #[error("ACK/NACK names a message that is not awaiting acknowledgement here: {0}")]
    UnknownAck(String),
    #[error("transaction '{0}' is already open")]
    TransactionExists(String),
    #[error("no open transaction '{0}'")]
    UnknownTransaction(String),
    #[error("transaction '{0}' holds more than {1} operations")]
    TransactionTooLarge(String, usize),
    #[error("transaction '{0}' holds more than {1} bytes of messages")]
    TransactionBytesTooLarge(String, usize),
    #[error("the message (with one entry per durable subscriber) or transaction needs a {bytes}-byte log record; the limit is {max}")]
    RecordTooLarge { bytes: usize, max: usize },
    #[error("too many subscriptions on this connection (limit {0})")]
    TooManySubscriptions(usize),
    #[error("too many open transactions on this connection (limit {0})")]
    TooManyTransactions(usize),
    #[error("browsing is for queues; '{0}' is not a queue")]
    BrowseNotQueue(String),
    #[error("'{0}' is a wildcard: messages are sent to one concrete destination")]
    WildcardSend(String),
    #[error("'{0}': a wildcard queue consumer cannot browse or be durable")]
    WildcardQueue(String),
    #[error("bad schedule: {0}")]
    BadSchedule(String),
    #[error("too many scheduled messages held (limit {0})")]
    TooManyScheduled(usize),
    #[error("scheduled messages (AMQ_SCHEDULED_*) cannot be sent in a transaction")]
    ScheduledInTransaction,
    #[error("producer '{0}' was taken over by a newer connection (CONNECT with haven-producer); this session may no longer send for it")]
    ProducerTakenOver(String),
    #[error("producer '{0}' is in use by a newer session of its client (a CONNECT that arrived late); this connection is refused")]
    StaleSession(String),
    #[error("producer id '{0}' names a network origin (prefix '{prefix}'); a CONNECT cannot claim it", prefix = crate::NETWORK_ORIGIN_PREFIX)]
    NetworkOriginClaimed(String),
    #[error("temporary destination belongs to another connection")]
    NotOwner,
    #[error(transparent)]
    Destination(#[from] DestinationError),
}

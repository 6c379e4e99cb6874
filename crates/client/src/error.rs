//! Errors a client call can return. All are `Clone`: when a connection ends, every waiter
//! (receipts, subscriptions, later calls) gets the same cause.

use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The address could not be parsed or names a transport this client does not speak yet.
    #[error("bad address {addr:?}: {reason}")]
    BadAddress { addr: String, reason: String },
    /// Socket error (connect, read or write).
    #[error("i/o error: {0}")]
    Io(Arc<std::io::Error>),
    /// The broker answered CONNECT with an ERROR frame (wrong login, standby broker, ...).
    #[error("connection refused by broker: {message}")]
    Refused { message: String },
    /// The broker sent an ERROR frame on an established connection; the connection is closed.
    #[error("broker error: {message}")]
    Server {
        message: String,
        body: String,
        /// The `receipt-id` of the ERROR: which frame the broker refused, when it says.
        receipt_id: Option<String>,
    },
    /// The broker sent something this client cannot accept (bad frame, unexpected command).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// No bytes from the broker within the negotiated heart-beat window (with slack).
    #[error("no heart-beat from broker for {silent_ms} ms")]
    HeartbeatTimeout { silent_ms: u64 },
    /// A bounded wait expired (connect handshake, receipt wait in `disconnect`).
    #[error("timed out after {ms} ms waiting for {what}")]
    Timeout { what: &'static str, ms: u64 },
    /// The connection is closed (by `disconnect`, by the broker, or by dropping it).
    #[error("connection closed")]
    Closed,
    /// The failover transport used up `startupMaxReconnectAttempts` or `maxReconnectAttempts`
    /// without reaching a broker; `last_error` is what the last attempt saw.
    #[error("no broker reachable after {passes} passes over {brokers:?}: {last_error}")]
    NoBroker {
        brokers: Vec<String>,
        passes: u64,
        last_error: String,
    },
    /// The connection carrying this transaction was lost before COMMIT was sent (or the broker
    /// says the COMMIT never took effect): the broker rolled it back. Its sends are not stored
    /// and its acks did not happen.
    #[error("transaction {transaction:?} was rolled back: {reason}")]
    TransactionRolledBack { transaction: String, reason: String },
    /// The frame reached a broker that was then lost, and nothing can tell whether it took
    /// effect (a broker without producer sequences, or a `timeout` that expired while the
    /// frame waited to be sent again).
    #[error("outcome unknown for {what}: the connection was lost after it was sent")]
    OutcomeUnknown { what: String },
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        ClientError::Io(Arc::new(e))
    }
}

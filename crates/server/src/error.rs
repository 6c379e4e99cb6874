//! Why the server could not start or had to stop.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("data directory {dir}: {reason}")]
    DataDir { dir: PathBuf, reason: String },
    #[error("journal: {0}")]
    Journal(#[from] haven_journal::JournalError),
    #[error("recovery: {0}")]
    Recovery(String),
    /// A write or fsync failed: the broker stops (fsync errors cannot be retried safely).
    #[error("journal failed, broker stopped: {0}")]
    JournalFailed(String),
    /// Shared-store modes: this broker can no longer prove it is master; it stopped at once.
    #[error("no longer master, stopped serving: {0}")]
    Fenced(String),
    /// Replicated mode: this member's consensus stopped on an error it cannot go on from
    /// (its Raft log or state could not be written); restarted, it recovers from its disk.
    #[error("replication stopped: {0}")]
    ReplicationStopped(String),
    #[error("cannot start the network bridges' thread: {0}")]
    BridgeThread(std::io::Error),
}

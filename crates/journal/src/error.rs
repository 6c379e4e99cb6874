//! Errors of the journal.
//!
//! `JournalError` is what `open`, `close` and `Reader` return. `JournalFailure` is the fatal,
//! sticky state of the writer thread after a failed write or fsync: it is published on the
//! durable watch channel and never cleared, because after a failed fsync the kernel may have
//! dropped the dirty pages and a retry could report success for data that is gone
//! ("fsyncgate"). The only way out is to stop and recover from the files.

use std::path::PathBuf;

use crate::Lsn;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal config invalid: {0}")]
    Config(String),
    #[error("journal I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Damage that is not a torn tail: a bad record in a sealed segment, a bad record followed by
    /// a valid one, or an LSN gap. Never skipped silently; an operator has to look.
    #[error("journal corrupt in {segment} at offset {offset}: {reason}")]
    Corrupt {
        segment: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The `on_record` callback of `open` refused a record.
    #[error("journal replay aborted: {0}")]
    Replay(String),
    /// The writer thread failed (see `JournalFailure`).
    #[error("journal writer failed: {0}")]
    Failed(JournalFailure),
    /// Shared journal directory: a newer master has written this journal; this one is deposed.
    #[error("journal was written by a newer master (epoch {found}); this broker's epoch {mine} is stale")]
    StaleEpoch { mine: u32, found: u32 },
    #[error("journal writer thread panicked")]
    WriterPanicked,
    /// `Reader::read`: no segment file holds this LSN. Either it was released (its segment was
    /// deleted by `release_before`) or it was never written (0, or beyond the end of the log;
    /// the caller may read only LSNs reported durable).
    #[error("journal has no record with LSN {lsn}")]
    NotFound { lsn: Lsn },
}

impl JournalError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> JournalError {
        JournalError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Why the writer stopped. Sticky: once published, the journal never reports durability again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op} on {path} failed: {message}")]
pub struct JournalFailure {
    /// The operation that failed: "write", "fdatasync", "rename", "fsync dir", ...
    pub op: &'static str,
    pub path: PathBuf,
    pub message: String,
}

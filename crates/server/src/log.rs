//! The durable log the core appends to, behind a trait.
//!
//! Why a trait: the plan runs every topology over a different durable log (a local journal, a
//! journal in a shared directory, PostgreSQL, Raft), and the deterministic simulation
//! (`crates/sim`) runs this same core over a simulated disk whose unsynced writes a crash can
//! lose. The core's contract with any log is the journal's: `append` numbers a record at once,
//! `flush` hands everything appended to the writer, and the `durable` watch publishes the
//! highest LSN that survives a crash, or the failure that stopped the log for good.

use haven_engine::MessageLoader;
use haven_journal::{Journal, JournalConfig, JournalError, JournalFailure, Lsn, SegmentInfo};
use std::path::PathBuf;
use tokio::sync::watch;

/// Confirms that this broker still leads its store: state read before the returned future
/// is started was current if it yields `true` (a read index, as Raft's).
pub type LeadershipCheck = std::sync::Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> + Send + Sync,
>;

/// Called for every record in order while a log is opened: (lsn, payload).
pub type OnRecord<'a> = &'a mut dyn FnMut(Lsn, &[u8]) -> Result<(), String>;

/// A log that can be opened: recovery replays what it holds, then it is appended to.
pub trait LogStore: Send {
    /// Where paged-out messages are read back from. Given to the engine before replay.
    fn loader(&self) -> Box<dyn MessageLoader>;
    /// The largest payload `append` accepts.
    fn record_bytes_max(&self) -> usize;
    /// Replays every record through `on_record`, then returns the log to append to.
    fn open(self: Box<Self>, on_record: OnRecord<'_>) -> Result<Box<dyn DurableLog>, JournalError>;
    /// For log lines.
    fn describe(&self) -> String;
    /// For a store whose master can be deposed before it knows (a Raft leader frozen while
    /// another was elected): the check to run before answering from its state what a client
    /// acts on (the producer mark in CONNECTED). `None` where a master that is deposed stops
    /// at once (a lock or lease it holds) or cannot be (one broker).
    fn leadership_check(&self) -> Option<LeadershipCheck> {
        None
    }
}

/// An open log. Only the core task uses it.
pub trait DurableLog: Send {
    /// Numbers and buffers one record; it is durable once `durable` passes its LSN.
    fn append(&mut self, payload: &[u8]) -> Lsn;
    /// The LSN the next `append` returns.
    fn next_lsn(&self) -> Lsn;
    /// Hands everything appended so far to the writer (group commit: returns at once).
    fn flush(&mut self);
    /// The highest durable LSN, or the failure that stopped the log (sticky).
    fn durable(&self) -> watch::Receiver<Result<Lsn, JournalFailure>>;
    fn durable_lsn(&self) -> Result<Lsn, JournalFailure>;
    /// The segments, oldest first (for retention and compaction).
    fn segments(&self) -> Vec<SegmentInfo>;
    fn segment_bytes(&self) -> u64;
    /// Deletes whole sealed segments below `lsn`; returns how many.
    fn release_before(&mut self, lsn: Lsn) -> usize;
    /// Free bytes where the log lives, if it lives on a file system.
    fn free_bytes(&self) -> Option<u64>;
    /// Makes everything appended durable and stops the writer. Blocking.
    fn close(self: Box<Self>) -> Result<(), JournalError>;
    /// The broker has gone idle: give back buffer capacity a burst grew. The default does
    /// nothing, for logs that keep no such buffers.
    fn release_idle_buffers(&mut self) {}
}

/// The local journal in the data directory.
pub(crate) struct JournalStore {
    pub config: JournalConfig,
    pub faults: Option<std::sync::Arc<crate::Faults>>,
}

impl LogStore for JournalStore {
    fn loader(&self) -> Box<dyn MessageLoader> {
        Box::new(crate::loader::JournalLoader::new(self.config.dir.clone()))
    }

    fn record_bytes_max(&self) -> usize {
        self.config.record_bytes_max()
    }

    fn open(self: Box<Self>, on_record: OnRecord<'_>) -> Result<Box<dyn DurableLog>, JournalError> {
        let dir = self.config.dir.clone();
        let journal = match self.faults {
            #[cfg(feature = "fault-injection")]
            Some(faults) => Journal::open_with_faults(self.config, faults, on_record)?,
            #[cfg(not(feature = "fault-injection"))]
            Some(never) => match *never {},
            None => Journal::open(self.config, on_record)?,
        };
        Ok(Box::new(LocalJournal { journal, dir }))
    }

    fn describe(&self) -> String {
        self.config.dir.display().to_string()
    }
}

struct LocalJournal {
    journal: Journal,
    dir: PathBuf,
}

impl DurableLog for LocalJournal {
    fn append(&mut self, payload: &[u8]) -> Lsn {
        self.journal.append(payload)
    }
    fn next_lsn(&self) -> Lsn {
        self.journal.next_lsn()
    }
    fn flush(&mut self) {
        self.journal.flush()
    }
    fn durable(&self) -> watch::Receiver<Result<Lsn, JournalFailure>> {
        self.journal.durable()
    }
    fn durable_lsn(&self) -> Result<Lsn, JournalFailure> {
        self.journal.durable_lsn()
    }
    fn segments(&self) -> Vec<SegmentInfo> {
        self.journal.segments()
    }
    fn segment_bytes(&self) -> u64 {
        self.journal.config().segment_bytes
    }
    fn release_before(&mut self, lsn: Lsn) -> usize {
        self.journal.release_before(lsn)
    }
    fn free_bytes(&self) -> Option<u64> {
        free_bytes(&self.dir)
    }
    fn close(self: Box<Self>) -> Result<(), JournalError> {
        self.journal.close()
    }
    fn release_idle_buffers(&mut self) {
        self.journal.release_idle_buffers()
    }
}

/// Free bytes for an unprivileged user on the file system holding `dir`.
pub fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `path` is a valid NUL-terminated string and `st` a writable statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

//! The Raft log, kept in a Haven journal of its own (`<data>/raft-log`).
//!
//! The journal is append-only, so the log's three mutations are records: an entry, a
//! truncation (drop every entry from an index on, after a conflict with a new leader) and a
//! purge (drop every entry up to a log id, once a snapshot covers them). Replaying them in
//! order gives the log back after a restart. Whole journal segments are deleted once no kept
//! entry is in them. The vote is one small file replaced atomically (`vote`).
//!
//! Recent entries stay in memory (replication reads them right after they are appended); older
//! ones are read back from the journal by LSN, so a long log does not have to fit in memory.

use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use haven_journal::{Journal, JournalConfig, Lsn, Reader};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogId, RaftLogReader};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Entries kept in memory after they are durable, for followers that are only a little behind.
const CACHE_BYTES_MAX: usize = 64 << 20;
/// Most payload bytes one AppendEntries carries (at least one entry is always sent). openraft
/// gives an AppendEntries one heartbeat interval to be answered, follower fsync included.
const APPEND_BYTES_MAX: usize = 2 << 20;

#[derive(Serialize, Deserialize)]
enum LogRecord {
    Entry(Entry),
    Truncate { since: u64 },
    Purge { upto: LogId },
}

struct Slot {
    log_id: LogId,
    lsn: Lsn,
    /// In memory while recent; `None` once evicted (read back from the journal).
    cached: Option<(Entry, usize)>,
}

struct Inner {
    journal: Journal,
    /// Kept entries, consecutive indexes, oldest first.
    slots: VecDeque<Slot>,
    last_purged: Option<LogId>,
    /// Where the last purge record is: kept, so a restart still knows what was purged.
    purge_lsn: Lsn,
    cached_bytes: usize,
    buf: Vec<u8>,
}

/// The Raft log storage: one per node, shared with its readers.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    dir: PathBuf,
    /// A witness's log: entries are stored without their records (`witness::strip`).
    witness: bool,
    durable: watch::Receiver<Result<Lsn, haven_journal::JournalFailure>>,
}

fn io_err(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl LogStore {
    /// Opens (or creates) the log in `dir`; a witness's (`witness`) keeps no records.
    pub fn open(
        dir: &Path,
        segment_bytes: u64,
        witness: bool,
    ) -> Result<LogStore, haven_journal::JournalError> {
        let mut slots: VecDeque<Slot> = VecDeque::new();
        let mut last_purged: Option<LogId> = None;
        let mut purge_lsn: Lsn = 0;
        let mut config = JournalConfig::new(dir.join("raft-log"));
        config.segment_bytes = segment_bytes;
        config.sparse_segments = true;
        let journal = Journal::open(config, |lsn, payload| {
            let record: LogRecord =
                postcard::from_bytes(payload).map_err(|e| format!("raft log record {lsn}: {e}"))?;
            match record {
                LogRecord::Entry(entry) => {
                    let index = entry.log_id.index;
                    // A truncation is always logged before the entry that replaces one.
                    if let Some(last) = slots.back() {
                        if index != last.log_id.index + 1 {
                            return Err(format!(
                                "raft log record {lsn}: entry {index} after {}",
                                last.log_id.index
                            ));
                        }
                    }
                    slots.push_back(Slot {
                        log_id: entry.log_id,
                        lsn,
                        cached: None,
                    });
                }
                LogRecord::Truncate { since } => {
                    while slots.back().is_some_and(|s| s.log_id.index >= since) {
                        slots.pop_back();
                    }
                }
                LogRecord::Purge { upto } => {
                    while slots.front().is_some_and(|s| s.log_id.index <= upto.index) {
                        slots.pop_front();
                    }
                    last_purged = Some(upto);
                    purge_lsn = lsn;
                }
            }
            Ok(())
        })?;
        let durable = journal.durable();
        Ok(LogStore {
            inner: Arc::new(Mutex::new(Inner {
                journal,
                slots,
                last_purged,
                purge_lsn,
                cached_bytes: 0,
                buf: Vec::new(),
            })),
            dir: dir.to_path_buf(),
            witness,
            durable,
        })
    }

    fn vote_path(&self) -> PathBuf {
        self.dir.join("vote")
    }

    async fn wait_durable(&self, lsn: Lsn) -> std::io::Result<()> {
        wait_durable(self.durable.clone(), lsn).await
    }
}

async fn wait_durable(
    mut durable: watch::Receiver<Result<Lsn, haven_journal::JournalFailure>>,
    lsn: Lsn,
) -> std::io::Result<()> {
    loop {
        match &*durable.borrow_and_update() {
            Ok(d) if *d >= lsn => return Ok(()),
            Ok(_) => {}
            Err(f) => return Err(io_err(f)),
        }
        if durable.changed().await.is_err() {
            return Err(io_err("the raft log's writer stopped"));
        }
    }
}

impl Inner {
    fn append_record(&mut self, record: &LogRecord) -> Lsn {
        self.buf.clear();
        postcard::to_io(record, &mut self.buf).expect("encoding to a Vec cannot fail");
        let buf = std::mem::take(&mut self.buf);
        let lsn = self.journal.append(&buf);
        self.buf = buf;
        lsn
    }

    /// Drops cached payloads, oldest first, beyond the cache's budget; only durable ones (the
    /// journal can read those back).
    fn evict(&mut self) {
        let durable = self.journal.durable_lsn().unwrap_or(0);
        for slot in self.slots.iter_mut() {
            if self.cached_bytes <= CACHE_BYTES_MAX || slot.lsn > durable {
                break;
            }
            if let Some((_, bytes)) = slot.cached.take() {
                self.cached_bytes -= bytes;
            }
        }
    }

    /// Deletes journal segments that hold nothing still kept.
    fn release(&mut self) {
        let first_kept = self.slots.front().map_or(Lsn::MAX, |s| s.lsn);
        self.journal.release_before(first_kept.min(self.purge_lsn));
    }
}

fn entry_bytes(entry: &Entry) -> usize {
    match &entry.payload {
        openraft::EntryPayload::Normal(crate::types::Command::Records { records, .. }) => {
            records.0.len() + 64
        }
        _ => 64,
    }
}

/// A reader for replication streams: its own journal file descriptors.
pub struct LogReader {
    inner: Arc<Mutex<Inner>>,
    dir: PathBuf,
    reader: Option<Reader>,
}

impl LogReader {
    fn read(
        &mut self,
        range: (Bound<u64>, Bound<u64>),
        bytes_max: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        let wanted: Vec<(LogId, Lsn, Option<Entry>)> = {
            let inner = self.inner.lock().unwrap();
            let mut out = Vec::new();
            let mut bytes = 0usize;
            // Slots hold consecutive indexes: the range starts at a computed position.
            let first = inner.slots.front().map_or(0, |s| s.log_id.index);
            let start = match range.0 {
                Bound::Included(i) => i,
                Bound::Excluded(i) => i + 1,
                Bound::Unbounded => first,
            };
            let skip = start.saturating_sub(first) as usize;
            for slot in inner.slots.iter().skip(skip) {
                if !range.contains(&slot.log_id.index) {
                    break;
                }
                let cached = slot.cached.as_ref().map(|(e, _)| e.clone());
                bytes += cached.as_ref().map_or(4096, entry_bytes);
                out.push((slot.log_id, slot.lsn, cached));
                if bytes >= bytes_max {
                    break;
                }
            }
            out
        };
        let mut entries = Vec::with_capacity(wanted.len());
        for (log_id, lsn, cached) in wanted {
            let entry = match cached {
                Some(e) => e,
                None => {
                    if self.reader.is_none() {
                        let r = Reader::open(&self.dir.join("raft-log")).map_err(|e| {
                            StorageError::from_io_error(
                                openraft::ErrorSubject::Logs,
                                openraft::ErrorVerb::Read,
                                io_err(e),
                            )
                        })?;
                        self.reader = Some(r);
                    }
                    let payload = match self.reader.as_mut().expect("opened").read(lsn) {
                        Ok(p) => p,
                        // Purged while we read: a reader may miss entries.
                        Err(haven_journal::JournalError::NotFound { .. }) => break,
                        Err(e) => {
                            return Err(StorageError::from_io_error(
                                openraft::ErrorSubject::Log(log_id),
                                openraft::ErrorVerb::Read,
                                io_err(e),
                            ))
                        }
                    };
                    match postcard::from_bytes::<LogRecord>(&payload) {
                        Ok(LogRecord::Entry(e)) if e.log_id == log_id => e,
                        _ => {
                            return Err(StorageError::from_io_error(
                                openraft::ErrorSubject::Log(log_id),
                                openraft::ErrorVerb::Read,
                                io_err(format!("raft log record {lsn} is not entry {log_id}")),
                            ))
                        }
                    }
                }
            };
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let r = (range.start_bound().cloned(), range.end_bound().cloned());
        self.read(r, usize::MAX)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read(
            (Bound::Included(start), Bound::Excluded(end)),
            APPEND_BYTES_MAX,
        )
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let mut reader = self.get_log_reader().await;
        reader.try_get_log_entries(range).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let inner = self.inner.lock().unwrap();
        let last = inner.slots.back().map(|s| s.log_id).or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            inner: self.inner.clone(),
            dir: self.dir.clone(),
            reader: None,
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = postcard::to_allocvec(vote).expect("encoding to a Vec cannot fail");
        crate::files::write_atomically(&self.vote_path(), &bytes).map_err(|e| {
            StorageError::from_io_error(openraft::ErrorSubject::Vote, openraft::ErrorVerb::Write, e)
        })
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        match std::fs::read(self.vote_path()) {
            Ok(bytes) => postcard::from_bytes(&bytes).map(Some).map_err(|e| {
                StorageError::from_io_error(
                    openraft::ErrorSubject::Vote,
                    openraft::ErrorVerb::Read,
                    io_err(e),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::from_io_error(
                openraft::ErrorSubject::Vote,
                openraft::ErrorVerb::Read,
                e,
            )),
        }
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let last_lsn = {
            let mut inner = self.inner.lock().unwrap();
            let mut last_lsn = 0;
            for mut entry in entries {
                if self.witness {
                    crate::witness::strip(&mut entry);
                }
                if let Some(back) = inner.slots.back() {
                    assert_eq!(
                        entry.log_id.index,
                        back.log_id.index + 1,
                        "openraft appends consecutive entries"
                    );
                }
                let record = LogRecord::Entry(entry);
                let lsn = inner.append_record(&record);
                let LogRecord::Entry(entry) = record else {
                    unreachable!()
                };
                let bytes = entry_bytes(&entry);
                inner.cached_bytes += bytes;
                inner.slots.push_back(Slot {
                    log_id: *entry.get_log_id(),
                    lsn,
                    cached: Some((entry, bytes)),
                });
                last_lsn = lsn;
            }
            inner.journal.flush();
            inner.evict();
            last_lsn
        };
        let durable = self.durable.clone();
        tokio::spawn(async move {
            let result = wait_durable(durable, last_lsn).await;
            callback.log_io_completed(result);
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let lsn = {
            let mut inner = self.inner.lock().unwrap();
            while inner
                .slots
                .back()
                .is_some_and(|s| s.log_id.index >= log_id.index)
            {
                let slot = inner.slots.pop_back().expect("checked");
                if let Some((_, bytes)) = slot.cached {
                    inner.cached_bytes -= bytes;
                }
            }
            let lsn = inner.append_record(&LogRecord::Truncate {
                since: log_id.index,
            });
            inner.journal.flush();
            lsn
        };
        self.wait_durable(lsn).await.map_err(|e| {
            StorageError::from_io_error(openraft::ErrorSubject::Logs, openraft::ErrorVerb::Write, e)
        })
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut inner = self.inner.lock().unwrap();
        while inner
            .slots
            .front()
            .is_some_and(|s| s.log_id.index <= log_id.index)
        {
            let slot = inner.slots.pop_front().expect("checked");
            if let Some((_, bytes)) = slot.cached {
                inner.cached_bytes -= bytes;
            }
        }
        inner.last_purged = Some(log_id);
        inner.purge_lsn = inner.append_record(&LogRecord::Purge { upto: log_id });
        inner.journal.flush();
        inner.release();
        Ok(())
    }
}

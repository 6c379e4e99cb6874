//! The state machine: each member's own state journal (`<data>/state`), in the standalone
//! broker's format, holding exactly the records of the committed entries, numbered alike on
//! every member.
//!
//! Followers do not run the engine; they only apply committed records to their journal. A
//! member that becomes leader recovers the engine from its state journal exactly as a
//! standalone broker recovers from its own, then proposes its records through Raft.
//!
//! Applying is idempotent by LSN: after a restart openraft applies again every entry after the
//! last snapshot, and the records already in the journal are skipped. So the journal itself
//! records how far it got, and the snapshot (whose meta is the only "applied" mark kept on
//! disk) only has to be durable before the log it replaces is purged.

use crate::snapshot::{self, SnapshotFiles};
use crate::types::{
    Command, Entry, LogId, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use haven_journal::{Journal, JournalConfig, Lsn, SegmentInfo};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{watch, Notify};

fn sm_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::from_io_error(
        openraft::ErrorSubject::StateMachine,
        openraft::ErrorVerb::Write,
        std::io::Error::other(e.to_string()),
    )
}

/// Where the leader's core learns that its records are durable: the state journal's durable
/// LSN, unless a record from another term landed at or after `start_lsn` (a newer leader's, so
/// this core's own records at those LSNs were never committed). From then on it reports only
/// a failure, so the core never acknowledges a record it did not write.
pub(crate) struct Tap {
    pub term: u64,
    pub start_lsn: Lsn,
    pub poisoned: Arc<AtomicBool>,
    pub poke: Arc<Notify>,
}

pub(crate) struct Inner {
    pub journal: Option<Journal>,
    pub journal_config: JournalConfig,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub tap: Option<Tap>,
    pub snapshot_seq: u64,
}

/// The state machine, shared between openraft's state machine task and the broker's core
/// when this member leads.
pub struct Shared {
    pub(crate) inner: Mutex<Inner>,
    pub(crate) files: SnapshotFiles,
    /// The last applied log id, for waiting on.
    pub(crate) applied: watch::Sender<Option<LogId>>,
    /// A witness's state machine: it applies no records and keeps no snapshot data.
    pub(crate) witness: bool,
    /// The task handing the leader's entries to Raft (`leader::propose`), of the latest
    /// serving: a next serving waits for it (`ReplicatedStore::acquire`).
    pub(crate) proposer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Clone)]
pub struct StateMachine {
    pub(crate) shared: Arc<Shared>,
}

impl StateMachine {
    /// Opens the state journal and the latest snapshot under `data_dir`.
    pub fn open(
        data_dir: &Path,
        segment_bytes: u64,
        witness: bool,
    ) -> Result<StateMachine, String> {
        let files = SnapshotFiles::new(data_dir);
        files
            .finish_interrupted_install()
            .map_err(|e| e.to_string())?;
        let (last_applied, membership) = match files.current_meta().map_err(|e| e.to_string())? {
            Some(meta) => (meta.last_log_id, meta.last_membership),
            None => (None, StoredMembership::default()),
        };
        let mut journal_config = JournalConfig::new(files.state_dir());
        journal_config.segment_bytes = segment_bytes;
        journal_config.sparse_segments = true;
        // Not synced: the Raft log (synced) and the last snapshot hold everything in it, and
        // a state journal a power loss damaged is rebuilt from them below.
        journal_config.sync_writes = false;
        let journal = match Journal::open(journal_config.clone(), |_, _| Ok(())) {
            Ok(j) => j,
            Err(e) => {
                tracing::error!(
                    "state journal damaged ({e}); rebuilding it from the last snapshot and the \
                     Raft log"
                );
                crate::snapshot::rebuild_state(&files)
                    .map_err(|e| format!("rebuilding the state journal: {e}"))?;
                Journal::open(journal_config.clone(), |_, _| Ok(()))
                    .map_err(|e| format!("state journal after rebuilding: {e}"))?
            }
        };
        let (applied, _) = watch::channel(last_applied);
        Ok(StateMachine {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    journal: Some(journal),
                    journal_config,
                    last_applied,
                    membership,
                    tap: None,
                    snapshot_seq: 0,
                }),
                files,
                applied,
                proposer: Mutex::new(None),
                witness,
            }),
        })
    }
}

impl Inner {
    pub(crate) fn journal(&mut self) -> &mut Journal {
        self.journal
            .as_mut()
            .expect("the state journal is open except during an install")
    }

    fn apply_one(&mut self, entry: &Entry, witness: bool) -> Result<(), StorageError> {
        match &entry.payload {
            EntryPayload::Blank => {}
            // A witness keeps no records (its log stores none either).
            EntryPayload::Normal(_) if witness => {}
            EntryPayload::Membership(m) => {
                self.membership = StoredMembership::new(Some(entry.log_id), m.clone());
            }
            EntryPayload::Normal(Command::Records { first_lsn, records }) => {
                let records = records
                    .records()
                    .map_err(|e| sm_err(format!("entry {}: {e}", entry.log_id)))?;
                let count = records.len() as u64;
                let next = self.journal().next_lsn();
                assert!(
                    *first_lsn <= next,
                    "entry {} starts at LSN {first_lsn} but the state journal is at {next}: a gap",
                    entry.log_id
                );
                if first_lsn + count > next {
                    if let Some(tap) = &self.tap {
                        if entry.log_id.leader_id.term != tap.term
                            && first_lsn + count > tap.start_lsn
                        {
                            // Set before the records are appended: whoever sees them durable
                            // sees the poison too.
                            tap.poisoned.store(true, Ordering::SeqCst);
                            tap.poke.notify_one();
                        }
                    }
                    let skip = (next - first_lsn) as usize;
                    let journal = self.journal();
                    for payload in &records[skip..] {
                        journal.append(payload);
                    }
                }
            }
            EntryPayload::Normal(Command::Release { before_lsn }) => {
                let journal = self.journal();
                // What the release makes garbage may be superseded by records appended just
                // before it: the writer syncs those before it deletes anything queued after.
                journal.flush();
                journal.release_before(*before_lsn);
            }
        }
        self.last_applied = Some(entry.log_id);
        Ok(())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = snapshot::Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let inner = self.shared.inner.lock().unwrap();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        let last = {
            let mut inner = self.shared.inner.lock().unwrap();
            for entry in entries {
                out.push(inner.apply_one(&entry, self.shared.witness)?);
            }
            inner.journal().flush();
            inner.last_applied
        };
        self.shared.applied.send_replace(last);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> snapshot::Builder {
        snapshot::Builder::capture(self.shared.clone()).await
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let file = if self.shared.witness {
            crate::witness::discarding_file().await
        } else {
            self.shared.files.receiving_file().await
        };
        let file = file.map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::Snapshot(None),
                openraft::ErrorVerb::Write,
                e,
            )
        })?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        let shared = self.shared.clone();
        let meta = meta.clone();
        drop(snapshot);
        let result = tokio::task::spawn_blocking(move || {
            if shared.witness {
                snapshot::install_meta(&shared, &meta)
            } else {
                snapshot::install(&shared, &meta)
            }
        })
        .await
        .expect("the install task does not panic");
        result.map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::Snapshot(None),
                openraft::ErrorVerb::Write,
                e,
            )
        })?;
        let last = self.shared.inner.lock().unwrap().last_applied;
        self.shared.applied.send_replace(last);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        self.shared.files.current().await.map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::Snapshot(None),
                openraft::ErrorVerb::Read,
                e,
            )
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for snapshot::Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        self.build().await.map_err(|e| {
            StorageError::from_io_error(
                openraft::ErrorSubject::Snapshot(None),
                openraft::ErrorVerb::Write,
                e,
            )
        })
    }
}

/// The state journal's segments, for the leader's core.
pub(crate) fn segments(shared: &Shared) -> Vec<SegmentInfo> {
    shared.inner.lock().unwrap().journal().segments()
}

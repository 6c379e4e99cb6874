//! The log the broker's core uses while this member leads: records are numbered here,
//! proposed through Raft in batches (one entry per flush, pipelined), and reported durable
//! once committed by a majority and applied to this member's state journal.

use crate::state::{segments, Shared, Tap};
use crate::types::{pack_record, Blob, Command, Raft};
use haven_journal::{Journal, JournalError, JournalFailure, Lsn, SegmentInfo};
use haven_server::{DurableLog, LogStore, OnRecord};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Notify};

/// An entry is cut once its records reach this many bytes, even before the core flushes.
const ENTRY_BYTES_TARGET: usize = 256 << 10;
/// How long `close` waits for the last proposals to commit.
const CLOSE_WAIT_MS: u64 = 5_000;

/// Tells the broker to stop serving (the `lost` watch of `Mastership`).
#[derive(Clone)]
pub(crate) struct Lost(pub Arc<watch::Sender<Option<String>>>);

impl Lost {
    pub fn fire(&self, reason: String) {
        self.0.send_if_modified(|v| {
            if v.is_some() {
                return false;
            }
            tracing::warn!("leadership lost: {reason}");
            *v = Some(reason);
            true
        });
    }
}

/// Handed to the core as its `LogStore` when this member becomes leader of `term`.
pub(crate) struct LeaderStore {
    pub sm: Arc<Shared>,
    pub raft: Raft,
    pub term: u64,
    pub node_id: u64,
    pub data_dir: PathBuf,
    pub lost: Lost,
}

impl LogStore for LeaderStore {
    fn loader(&self) -> Box<dyn haven_engine::MessageLoader> {
        Box::new(haven_server::JournalLoader::new(self.sm.files.state_dir()))
    }

    fn leadership_check(&self) -> Option<haven_server::LeadershipCheck> {
        let raft = self.raft.clone();
        let term = self.term;
        // Heartbeats to a majority and back: a leader that cannot get them in two election
        // timeouts is cut off or deposed.
        let wait = Duration::from_millis(2 * raft.config().election_timeout_max);
        Some(Arc::new(move || {
            let raft = raft.clone();
            Box::pin(async move {
                let confirmed = tokio::time::timeout(wait, raft.ensure_linearizable()).await;
                matches!(confirmed, Ok(Ok(_))) && raft.metrics().borrow().current_term == term
            })
        }))
    }

    fn record_bytes_max(&self) -> usize {
        // Well inside one Raft frame (`network::FRAME_BYTES_MAX`).
        self.sm
            .inner
            .lock()
            .unwrap()
            .journal_config
            .record_bytes_max()
            .min(16 << 20)
    }

    fn open(self: Box<Self>, on_record: OnRecord<'_>) -> Result<Box<dyn DurableLog>, JournalError> {
        let mut inner = self.sm.inner.lock().unwrap();
        // Recover exactly as a standalone broker does: close the state journal (everything
        // applied is made durable) and open it again, replaying every record.
        let journal = inner.journal.take().expect("the state journal is open");
        journal.close()?;
        let journal = Journal::open(inner.journal_config.clone(), on_record)?;
        let start_lsn = journal.next_lsn();
        let journal_durable = journal.durable();
        inner.journal = Some(journal);
        let poisoned = Arc::new(AtomicBool::new(false));
        let poke = Arc::new(Notify::new());
        inner.tap = Some(Tap {
            term: self.term,
            start_lsn,
            poisoned: poisoned.clone(),
            poke: poke.clone(),
        });
        drop(inner);
        let (durable_tx, durable_rx) = watch::channel(journal_durable.borrow().clone());
        tokio::spawn(forward_durable(
            journal_durable,
            durable_tx,
            poisoned,
            poke,
            self.lost.clone(),
        ));
        let (proposals, rx) = mpsc::unbounded_channel();
        let proposer = tokio::spawn(propose(self.raft.clone(), rx, self.lost.clone()));
        *self.sm.proposer.lock().unwrap() = Some(proposer);
        tracing::info!(
            term = self.term,
            next_lsn = start_lsn,
            "leader: state journal recovered"
        );
        Ok(Box::new(LeaderLog {
            sm: self.sm.clone(),
            next_lsn: start_lsn,
            buf: Vec::new(),
            buf_first: start_lsn,
            proposals,
            durable: durable_rx,
            data_dir: self.data_dir.clone(),
        }))
    }

    fn describe(&self) -> String {
        format!(
            "raft member {} (leader of term {})",
            self.node_id, self.term
        )
    }
}

/// Publishes the state journal's durable LSN to the core until a record of another term is
/// applied; from then on only a failure.
async fn forward_durable(
    mut journal: watch::Receiver<Result<Lsn, JournalFailure>>,
    tx: watch::Sender<Result<Lsn, JournalFailure>>,
    poisoned: Arc<AtomicBool>,
    poke: Arc<Notify>,
    lost: Lost,
) {
    loop {
        // Read the durable value first, then the poison: a durable value that covers another
        // term's record was published after the poison was set.
        let d = journal.borrow_and_update().clone();
        if poisoned.load(Ordering::SeqCst) {
            let reason =
                "another leader's record was applied: this member no longer leads".to_string();
            lost.fire(reason.clone());
            let _ = tx.send(Err(JournalFailure {
                op: "raft",
                path: PathBuf::new(),
                message: reason,
            }));
            return;
        }
        if tx.send(d).is_err() {
            return;
        }
        tokio::select! {
            changed = journal.changed() => if changed.is_err() { return },
            _ = poke.notified() => {}
            _ = tx.closed() => return,
        }
    }
}

/// Hands entries to Raft in the order the core flushed them.
async fn propose(raft: Raft, mut rx: mpsc::UnboundedReceiver<Command>, lost: Lost) {
    while let Some(command) = rx.recv().await {
        match raft.client_write_ff(command).await {
            Ok(answer) => {
                let lost = lost.clone();
                tokio::spawn(async move {
                    match answer.await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => lost.fire(format!("a proposal was refused: {e}")),
                        Err(_) => lost.fire("raft stopped before answering a proposal".to_string()),
                    }
                });
            }
            Err(fatal) => {
                lost.fire(format!("raft stopped: {fatal}"));
                return;
            }
        }
    }
}

struct LeaderLog {
    sm: Arc<Shared>,
    next_lsn: Lsn,
    /// Records appended since the last proposal, packed (`types::pack_record`).
    buf: Vec<u8>,
    buf_first: Lsn,
    proposals: mpsc::UnboundedSender<Command>,
    durable: watch::Receiver<Result<Lsn, JournalFailure>>,
    data_dir: PathBuf,
}

impl LeaderLog {
    fn propose(&mut self, command: Command) {
        // The proposer only stops when Raft does; `lost` has fired then, and the core stops.
        let _ = self.proposals.send(command);
    }
}

impl DurableLog for LeaderLog {
    fn append(&mut self, payload: &[u8]) -> Lsn {
        if self.buf.is_empty() {
            self.buf_first = self.next_lsn;
        }
        pack_record(&mut self.buf, payload);
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        if self.buf.len() >= ENTRY_BYTES_TARGET {
            self.flush();
        }
        lsn
    }

    fn next_lsn(&self) -> Lsn {
        self.next_lsn
    }

    fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let records = Blob(std::mem::take(&mut self.buf).into());
        let first_lsn = self.buf_first;
        self.propose(Command::Records { first_lsn, records });
    }

    fn durable(&self) -> watch::Receiver<Result<Lsn, JournalFailure>> {
        self.durable.clone()
    }

    fn durable_lsn(&self) -> Result<Lsn, JournalFailure> {
        self.durable.borrow().clone()
    }

    fn segments(&self) -> Vec<SegmentInfo> {
        segments(&self.sm)
    }

    fn segment_bytes(&self) -> u64 {
        self.sm.inner.lock().unwrap().journal_config.segment_bytes
    }

    fn release_before(&mut self, lsn: Lsn) -> usize {
        // Every member deletes its own segments when it applies this, after every record
        // proposed before it.
        self.flush();
        self.propose(Command::Release { before_lsn: lsn });
        self.segments()
            .iter()
            .take_while(|s| s.sealed && s.end_lsn <= lsn)
            .count()
    }

    fn free_bytes(&self) -> Option<u64> {
        haven_server::log::free_bytes(&self.data_dir)
    }

    fn close(mut self: Box<Self>) -> Result<(), JournalError> {
        self.flush();
        let want = self.next_lsn - 1;
        let deadline = Instant::now() + Duration::from_millis(CLOSE_WAIT_MS);
        loop {
            match &*self.durable.borrow() {
                Ok(d) if *d >= want => return Ok(()),
                Ok(_) => {}
                Err(f) => return Err(JournalError::Failed(f.clone())),
            }
            if Instant::now() >= deadline {
                return Err(JournalError::Failed(JournalFailure {
                    op: "raft",
                    path: PathBuf::new(),
                    message: format!(
                        "records up to LSN {want} were not committed within {CLOSE_WAIT_MS} ms"
                    ),
                }));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

//! Reads paged-out messages back from the journal for the engine (see the engine's `paging`).
//!
//! The engine reads in batches, in arrival order, on the core task. To keep that task free for
//! dispatch, the engine hints the next batch (`prefetch`) and a worker thread reads and decodes
//! it ahead with its own journal reader; `load` then finds most messages decoded already, and
//! reads the rest itself.

use haven_engine::hash::IdHash;
use haven_engine::{Message, MessageLoader, Record};
use haven_journal::Reader;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Decoded messages waiting for `load`, at most: one batch ahead, plus slack. Beyond it the
/// worker drops what was never asked for (consumers went away).
const PREFETCHED_MESSAGES_MAX: usize = 16_384;
/// The same bound in bytes of messages (`Message::size_bytes`): 8 MiB, what one read-ahead
/// hint names at most (the engine's `PREFETCH_HINT_BYTES_MAX`). Counted in messages alone,
/// 64 KiB messages could hold a gigabyte here; at 64 MiB, scenario (f) of BENCHMARKS.md
/// peaked 50–80 MiB higher at the same rate.
const PREFETCHED_BYTES_MAX: usize = 8 << 20;
/// Hints waiting for the worker at most. The engine sends one per page-in and one per sync
/// batch that pages messages out, each within the next page-in's window, so the queue stays
/// short; one hint at most (as this once was) dropped most of the second kind.
const HINTS_QUEUED_MAX: usize = 1_024;

/// Messages read ahead, by (lsn, seq), each with its `size_bytes` (summed on the worker that
/// decoded it, not again on the core that takes it), and the sum of those.
///
/// Over a bound the oldest go first: they are the ones a consumer that went away never asked
/// for. (Dropping all of them, as this once did, threw away what was about to be taken when
/// large messages filled the bound: the core then read them again itself, and scenario (f) of
/// BENCHMARKS.md with a 16 MiB prefetch window spent 7% of its worker on such reads.)
#[derive(Default)]
struct Prefetched {
    // The keys are the broker's own numbers, so they need no keyed hash (`IdHash`).
    messages: HashMap<(u64, u64), (Arc<Message>, usize), IdHash>,
    /// Keys in the order they were inserted; some already taken.
    order: VecDeque<(u64, u64)>,
    bytes: usize,
    /// Messages the core read itself (`load` found them missing) that the worker may still
    /// be about to read from a hint: it skips them, or drops its copy, instead of leaving one
    /// nobody will take. The engine hints a page-in's window just before it loads the first
    /// messages, so the core often reads those before the worker starts. Oldest first in
    /// `read_by_core_order`, at most `PREFETCHED_MESSAGES_MAX`.
    read_by_core: HashSet<(u64, u64), IdHash>,
    read_by_core_order: VecDeque<(u64, u64)>,
}

impl Prefetched {
    fn insert(&mut self, key: (u64, u64), msg: Arc<Message>) {
        let size = msg.size_bytes();
        // Keys taken already leave the front as the core takes messages in order; a key the
        // core skipped ages out with the bound on `order`.
        while let Some(front) = self.order.front() {
            let full = self.messages.len() >= PREFETCHED_MESSAGES_MAX
                || self.bytes + size > PREFETCHED_BYTES_MAX
                || self.order.len() >= 2 * PREFETCHED_MESSAGES_MAX;
            if self.messages.contains_key(front) && !full {
                break;
            }
            let front = self.order.pop_front().expect("just seen");
            if let Some((_, old)) = self.messages.remove(&front) {
                self.bytes -= old;
            }
        }
        if let Some((_, old)) = self.messages.insert(key, (msg, size)) {
            self.bytes -= old;
        }
        self.bytes += size;
        self.order.push_back(key);
    }

    fn clear(&mut self) {
        *self = Prefetched::default();
    }

    /// The core read `key` itself.
    fn note_read_by_core(&mut self, key: (u64, u64)) {
        if self.read_by_core.insert(key) {
            self.read_by_core_order.push_back(key);
        }
        while self.read_by_core_order.len() > PREFETCHED_MESSAGES_MAX {
            let old = self.read_by_core_order.pop_front().expect("over the bound");
            self.read_by_core.remove(&old);
        }
    }

    /// Whether the worker should read hinted `key`: not if it holds it already or the core
    /// read it (which it then forgets: a key is hinted once).
    fn wanted(&mut self, key: &(u64, u64)) -> bool {
        !self.messages.contains_key(key) && !self.read_by_core.remove(key)
    }

    /// Keeps what the worker read, unless the core read it meanwhile.
    fn offer(&mut self, key: (u64, u64), msg: Arc<Message>) {
        if !self.read_by_core.remove(&key) {
            self.insert(key, msg);
        }
    }

    fn remove(&mut self, key: &(u64, u64)) -> Option<Arc<Message>> {
        let (msg, size) = self.messages.remove(key)?;
        self.bytes -= size;
        Some(msg)
    }
}

/// How long the read-ahead thread waits for a hint before it counts as idle: then it drops
/// what it decoded and nobody took, and gives its freed memory back (`idle`).
const READ_AHEAD_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

type Decoded = Arc<Mutex<Prefetched>>;

/// Opens its readers on first use: the engine gets the loader before replay (so a deep backlog
/// is recovered paged out), but reads only once the broker serves.
pub struct JournalLoader {
    dir: PathBuf,
    reader: Option<Reader>,
    decoded: Decoded,
    hints: Option<SyncSender<Vec<(u64, u64)>>>,
}

impl JournalLoader {
    pub fn new(dir: PathBuf) -> JournalLoader {
        JournalLoader {
            dir,
            reader: None,
            decoded: Arc::default(),
            hints: None,
        }
    }

    fn start_worker(&mut self) -> Option<SyncSender<Vec<(u64, u64)>>> {
        // Hints are kept in order (each names messages after the last one's); beyond
        // `HINTS_QUEUED_MAX` waiting a new one is dropped, and the core reads those itself.
        let (tx, rx) = mpsc::sync_channel::<Vec<(u64, u64)>>(HINTS_QUEUED_MAX);
        let dir = self.dir.clone();
        let decoded = self.decoded.clone();
        let spawned = std::thread::Builder::new()
            .name("haven-prefetch".into())
            .spawn(move || {
                let mut reader: Option<Reader> = None;
                // Whether a hint came since the thread last went idle: the timeout below is a
                // whole quiet second already, so one is enough to count as idle.
                let mut worked = true;
                // Ends when the loader (the engine) is dropped.
                loop {
                    let batch = match rx.recv_timeout(READ_AHEAD_IDLE) {
                        Ok(batch) => batch,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            if std::mem::take(&mut worked) {
                                // What nobody took for that long is read again if asked.
                                decoded.lock().expect("prefetch map").clear();
                                crate::idle::idle();
                            }
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    };
                    worked = true;
                    for (lsn, seq) in batch {
                        if !decoded.lock().expect("prefetch map").wanted(&(lsn, seq)) {
                            continue;
                        }
                        // A failure here is not reported: `load` reads again and reports it.
                        let Ok(msg) = read_message(&mut reader, &dir, lsn, seq) else {
                            break;
                        };
                        decoded.lock().expect("prefetch map").offer((lsn, seq), msg);
                    }
                }
            });
        match spawned {
            Ok(_) => Some(tx),
            Err(e) => {
                tracing::warn!(error = %e, "no read-ahead thread; paged-out messages are read on demand");
                None
            }
        }
    }
}

fn read_message(
    reader: &mut Option<Reader>,
    dir: &Path,
    lsn: u64,
    seq: u64,
) -> Result<Arc<Message>, String> {
    if reader.is_none() {
        *reader = Some(Reader::open(dir).map_err(|e| e.to_string())?);
    }
    let reader = reader.as_mut().expect("just opened");
    let payload = reader.read(lsn).map_err(|e| e.to_string())?;
    Record::decode_message_owned(payload, lsn, seq)
}

impl MessageLoader for JournalLoader {
    fn load(&mut self, lsn: u64, seq: u64) -> Result<Arc<Message>, String> {
        {
            let mut decoded = self.decoded.lock().expect("prefetch map");
            if let Some(msg) = decoded.remove(&(lsn, seq)) {
                return Ok(msg);
            }
            decoded.note_read_by_core((lsn, seq));
        }
        read_message(&mut self.reader, &self.dir, lsn, seq)
    }

    fn prefetch(&mut self, next: &[(u64, u64)]) {
        if self.hints.is_none() {
            self.hints = self.start_worker();
        }
        let Some(tx) = &self.hints else {
            return;
        };
        match tx.try_send(next.to_vec()) {
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => self.hints = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haven_engine::{Destination, Headers};

    fn msg(seq: u64, body_bytes: usize) -> Arc<Message> {
        Arc::new(Message {
            seq,
            id: format!("ID:haven-1-{seq}"),
            destination: Destination::Queue("q".into()),
            headers: Headers::default(),
            body: bytes::Bytes::from(vec![0u8; body_bytes]),
            persistent: true,
            priority: 4,
            expires_ms: 0,
            timestamp_ms: 0,
            dead_lettered: false,
        })
    }

    /// Large messages fill the byte bound: the oldest go, the newest stay, the sum holds.
    #[test]
    fn over_the_byte_bound_the_oldest_go_first() {
        let mut p = Prefetched::default();
        let body = PREFETCHED_BYTES_MAX / 4;
        for seq in 1..=6 {
            p.insert((seq, seq), msg(seq, body));
            assert!(p.bytes <= PREFETCHED_BYTES_MAX, "{} bytes", p.bytes);
        }
        assert!(
            p.remove(&(1, 1)).is_none()
                && p.remove(&(2, 2)).is_none()
                && p.remove(&(3, 3)).is_none()
        );
        for seq in 4..=6 {
            assert!(p.remove(&(seq, seq)).is_some(), "seq {seq} was dropped");
        }
        assert_eq!(p.bytes, 0);
    }

    /// A message the core read itself is not kept when the worker reads it too, before or
    /// after: the worker skips it, or drops its copy; and the record of such reads is bounded.
    #[test]
    fn what_the_core_read_itself_is_not_kept_again() {
        let mut p = Prefetched::default();
        p.note_read_by_core((1, 1));
        assert!(
            !p.wanted(&(1, 1)),
            "read by the core before the worker reached it"
        );
        assert!(p.wanted(&(2, 2)));
        p.note_read_by_core((2, 2));
        p.offer((2, 2), msg(2, 10));
        assert!(
            p.remove(&(2, 2)).is_none(),
            "read by the core while the worker read it"
        );
        p.offer((3, 3), msg(3, 10));
        assert!(p.remove(&(3, 3)).is_some());
        for seq in 10..(3 * PREFETCHED_MESSAGES_MAX as u64) {
            p.note_read_by_core((seq, seq));
        }
        assert!(p.read_by_core.len() <= PREFETCHED_MESSAGES_MAX);
        assert!(p.read_by_core_order.len() <= PREFETCHED_MESSAGES_MAX);
    }

    /// Taken messages leave no trace: the order list stays bounded even if none is ever
    /// dropped, and one the core skipped ages out.
    #[test]
    fn taken_keys_do_not_pile_up() {
        let mut p = Prefetched::default();
        p.insert((0, 0), msg(0, 10)); // never taken
        for seq in 1..(5 * PREFETCHED_MESSAGES_MAX as u64) {
            p.insert((seq, seq), msg(seq, 10));
            assert!(p.remove(&(seq, seq)).is_some());
            assert!(p.order.len() <= 2 * PREFETCHED_MESSAGES_MAX);
        }
        assert!(p.remove(&(0, 0)).is_none(), "the skipped message aged out");
        assert_eq!((p.messages.len(), p.bytes), (0, 0));
    }
}

//! Reads paged-out messages back from the journal for the engine (see the engine's `paging`).
//!
//! The engine reads in batches, in arrival order, on the core task. To keep that task free for
//! dispatch, the engine hints the next batch (`prefetch`) and a worker thread reads and decodes
//! it ahead with its own journal reader; `load` then finds most messages decoded already, and
//! reads the rest itself.

use haven_engine::read_ahead::{ReadAhead, HINTS_QUEUED_MAX};
use haven_engine::{Message, MessageLoader, Record};
use haven_journal::Reader;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// How long the read-ahead thread waits for a hint before it counts as idle: then it drops
/// what it decoded and nobody took, and gives its freed memory back (`idle`).
const READ_AHEAD_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

type Decoded = Arc<Mutex<ReadAhead>>;

/// Opens its readers on first use: the engine gets the loader before replay (so a deep backlog
/// is recovered paged out), but reads only once the broker serves.
pub struct JournalLoader {
    dir: PathBuf,
    reader: Option<Reader>,
    decoded: Decoded,
    hints: Option<SyncSender<Vec<(u64, u64)>>>,
    /// Set by the read-ahead thread when it drops what nobody took (`MessageLoader::forgot`).
    forgotten: Arc<AtomicBool>,
}

impl JournalLoader {
    pub fn new(dir: PathBuf) -> JournalLoader {
        JournalLoader {
            dir,
            reader: None,
            decoded: Arc::default(),
            hints: None,
            forgotten: Arc::default(),
        }
    }

    fn start_worker(&mut self) -> Option<SyncSender<Vec<(u64, u64)>>> {
        // Hints are kept in order (each names messages after the last one's); beyond
        // `HINTS_QUEUED_MAX` waiting a new one is dropped, and the core reads those itself.
        let (tx, rx) = mpsc::sync_channel::<Vec<(u64, u64)>>(HINTS_QUEUED_MAX);
        let dir = self.dir.clone();
        let decoded = self.decoded.clone();
        let forgotten = self.forgotten.clone();
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
                                // What nobody took for that long is read again if asked,
                                // and the engine names it again (`forgot`).
                                decoded.lock().expect("prefetch map").clear();
                                forgotten.store(true, Ordering::Release);
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

    fn forgot(&mut self) -> bool {
        self.forgotten.swap(false, Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read-ahead thread dropping what nobody took is reported once, so the engine names
    /// its windows again.
    #[test]
    fn an_idle_read_ahead_reports_that_it_forgot() {
        let dir = tempfile::tempdir().unwrap();
        let mut loader = JournalLoader::new(dir.path().to_path_buf());
        assert!(!loader.forgot(), "nothing was read ahead yet");
        // No journal here: the read fails, and the thread goes idle after its hint.
        loader.prefetch(&[(1, 1)]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !loader.forgot() {
            assert!(std::time::Instant::now() < deadline, "never went idle");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!loader.forgot(), "reported once");
    }
}

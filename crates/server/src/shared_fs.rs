//! Shared file system master/slave: the journal directory is on storage every broker of the
//! group mounts (NFSv4, or one local disk for brokers on one machine), guarded by a lock file
//! and an epoch file.
//!
//! - **Lock** (`<dir>/lock`, an OFD `fcntl` lock, see `lock.rs`): the broker that takes it is
//!   master. Slaves wait for it blocked in the kernel (no polling gap: they get it the moment
//!   the master's process dies), or try it every `lock_poll_ms` where blocking locks are not
//!   trusted.
//! - **Epoch** (`<dir>/epoch`): each new master bumps it (write a temp file, fsync, rename,
//!   fsync the directory) before it reads the journal, and stamps it into the journal's
//!   segments. The writer checks the file before every write (`Fence`), and a keep-alive task
//!   re-proves the lock every `keepalive_ms`; the moment either fails, the broker stops
//!   serving without writing another record. This is what protects the store from a master
//!   that was paused or cut off while another took over (an NFS lease that expired): file
//!   locks alone are not re-checked by anyone.
//! - **Who is master** (`<dir>/master`): name, epoch and pid of the current master, for the
//!   slaves' log lines.

use crate::config::Config;
use crate::error::ServerError;
use crate::ha::{Acquiring, Mastership, SharedStore};
use crate::lock::{DirLock, Wait};
use haven_journal::{Fence, JournalConfig};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

const EPOCH_FILE: &str = "epoch";
const MASTER_FILE: &str = "master";
/// How often a waiting slave logs who holds the lock, when it has not changed.
const HOLDER_LOG_INTERVAL_MS: u64 = 30_000;
/// How often a waiting slave looks at who holds the lock (to log a change).
const HOLDER_CHECK_INTERVAL_MS: u64 = 1_000;

/// The journal directory shared by a group of brokers.
pub struct SharedFsStore {
    dir: PathBuf,
    journal: JournalConfig,
    lock_poll_ms: u64,
    keepalive_ms: u64,
    /// Written to `<dir>/master` while this broker is master.
    me: String,
}

impl SharedFsStore {
    pub fn new(config: &Config) -> SharedFsStore {
        let dir = config.journal.dir.clone();
        let mut journal = JournalConfig::new(dir.clone());
        journal.segment_bytes = config.journal.segment_bytes;
        journal.batch_bytes_max = config.journal.batch_bytes_max;
        journal.slow_sync_warn_ms = config.journal.slow_sync_warn_ms;
        SharedFsStore {
            dir,
            journal,
            lock_poll_ms: config.ha.lock_poll_ms,
            keepalive_ms: config.ha.keepalive_ms,
            me: format!(
                "{} (stomp {}, pid {})",
                config.broker.name,
                config.stomp.listen,
                std::process::id()
            ),
        }
    }

    async fn wait_for_lock(&self) -> Result<DirLock, ServerError> {
        let mut holder_check =
            tokio::time::interval(Duration::from_millis(HOLDER_CHECK_INTERVAL_MS));
        let mut last_logged: Option<(String, tokio::time::Instant)> = None;
        let mut log_holder = |dir: &Path| {
            let holder = read_master(dir);
            let now = tokio::time::Instant::now();
            let due = match &last_logged {
                Some((h, at)) => {
                    *h != holder || now - *at >= Duration::from_millis(HOLDER_LOG_INTERVAL_MS)
                }
                None => true,
            };
            if due {
                tracing::info!(dir = %dir.display(), holder = %holder,
                    "slave: waiting for the lock; master is {holder}");
                last_logged = Some((holder, now));
            }
        };
        if self.lock_poll_ms == 0 {
            // The blocking wait runs on its own thread. If this future is dropped (the broker
            // is stopping), the thread still gets the lock eventually, finds nobody to hand it
            // to, and drops it at once.
            let (tx, mut rx) = oneshot::channel();
            let dir = self.dir.clone();
            std::thread::Builder::new()
                .name("haven-lock-wait".into())
                .spawn(move || {
                    let _ = tx.send(DirLock::take(&dir, Wait::Block));
                })
                .map_err(|e| ServerError::DataDir {
                    dir: self.dir.clone(),
                    reason: format!("cannot start the lock-wait thread: {e}"),
                })?;
            loop {
                tokio::select! {
                    biased;
                    taken = &mut rx => {
                        let taken = taken.expect("lock-wait thread answers");
                        return Ok(taken?.expect("a blocking lock is taken or fails"));
                    }
                    _ = holder_check.tick() => log_holder(&self.dir),
                }
            }
        }
        let mut poll = tokio::time::interval(Duration::from_millis(self.lock_poll_ms));
        loop {
            poll.tick().await;
            if let Some(lock) = DirLock::take(&self.dir, Wait::No)? {
                return Ok(lock);
            }
            log_holder(&self.dir);
        }
    }
}

impl SharedStore for SharedFsStore {
    fn acquire(&self) -> Acquiring<'_> {
        Box::pin(async move {
            std::fs::create_dir_all(&self.dir).map_err(|e| data_dir(&self.dir, e.to_string()))?;
            let lock = self.wait_for_lock().await?;
            let epoch = bump_epoch(&self.dir)?;
            write_master(&self.dir, &format!("{} epoch {epoch}", self.me))?;
            let store_id = crate::store_id::load_or_create(&self.dir)?;
            tracing::info!(epoch, dir = %self.dir.display(), "took the lock: master of epoch {epoch}");
            let (lost_tx, lost_rx) = watch::channel(None);
            let lock = Arc::new(lock);
            let keepalive = tokio::spawn(keep_alive(
                lock.clone(),
                self.dir.clone(),
                epoch,
                Duration::from_millis(self.keepalive_ms),
                lost_tx,
            ));
            let mut journal = self.journal.clone();
            journal.epoch = u32::try_from(epoch).expect("epochs fit in u32 (checked when bumped)");
            let dir = self.dir.clone();
            journal.fence = Some(Fence(Arc::new(move || check_epoch(&dir, epoch))));
            Ok(Mastership {
                epoch,
                log: Box::new(crate::log::JournalStore {
                    config: journal,
                    faults: None,
                }),
                store_id,
                lost: lost_rx,
                hold: Box::new(Hold {
                    _lock: lock,
                    keepalive,
                }),
            })
        })
    }

    fn describe(&self) -> String {
        format!("shared directory {}", self.dir.display())
    }
}

/// Held while master: the lock, and the keep-alive task that re-proves it.
struct Hold {
    _lock: Arc<DirLock>,
    keepalive: tokio::task::JoinHandle<()>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        // The task holds the other reference to the lock; stopping it releases the lock.
        self.keepalive.abort();
    }
}

async fn keep_alive(
    lock: Arc<DirLock>,
    dir: PathBuf,
    epoch: u64,
    every: Duration,
    lost: watch::Sender<Option<String>>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let checked = lock.verify().and_then(|()| check_epoch(&dir, epoch));
        if let Err(reason) = checked {
            tracing::error!(
                epoch,
                "master can no longer prove it holds the store: {reason}"
            );
            let _ = lost.send(Some(reason));
            return;
        }
    }
}

/// `Ok` while the epoch file still holds `mine`; the reason otherwise.
fn check_epoch(dir: &Path, mine: u64) -> Result<(), String> {
    match read_epoch(dir) {
        Ok(found) if found == mine => Ok(()),
        Ok(found) => Err(format!(
            "epoch file says {found}, this master's epoch is {mine}: a newer master took over"
        )),
        Err(e) => Err(format!("cannot read the epoch file: {e}")),
    }
}

/// The epoch in `<dir>/epoch`; 0 when there is none yet.
fn read_epoch(dir: &Path) -> Result<u64, String> {
    let path = dir.join(EPOCH_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("{} holds {:?}, not an epoch number", path.display(), text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The epoch a standalone broker keeps using in a directory a shared-fs group used (0 if none).
pub(crate) fn current_epoch(dir: &Path) -> Result<u32, ServerError> {
    let epoch = read_epoch(dir).map_err(|r| data_dir(dir, r))?;
    u32::try_from(epoch).map_err(|_| data_dir(dir, format!("epoch {epoch} overflows")))
}

/// Makes this broker's epoch one above every earlier master's, durably, and returns it.
fn bump_epoch(dir: &Path) -> Result<u64, ServerError> {
    let current = read_epoch(dir).map_err(|r| data_dir(dir, r))?;
    let next = current + 1;
    if next > u64::from(u32::MAX) {
        return Err(data_dir(dir, format!("epoch {next} overflows")));
    }
    write_durably(dir, EPOCH_FILE, &format!("{next}\n"))?;
    Ok(next)
}

fn write_master(dir: &Path, who: &str) -> Result<(), ServerError> {
    write_durably(dir, MASTER_FILE, &format!("{who}\n"))
}

/// Who `<dir>/master` says is master, for log lines.
fn read_master(dir: &Path) -> String {
    match std::fs::read_to_string(dir.join(MASTER_FILE)) {
        Ok(text) => text.trim().to_string(),
        Err(_) => "unknown (no master file yet)".into(),
    }
}

/// Replaces `<dir>/<name>` atomically: temp file, fsync, rename, fsync of the directory.
fn write_durably(dir: &Path, name: &str, text: &str) -> Result<(), ServerError> {
    let tmp = dir.join(format!("{name}.tmp-{}", std::process::id()));
    let path = dir.join(name);
    let fail = |what: &str, e: std::io::Error| data_dir(dir, format!("{what} {name}: {e}"));
    let mut f = std::fs::File::create(&tmp).map_err(|e| fail("create", e))?;
    f.write_all(text.as_bytes()).map_err(|e| fail("write", e))?;
    f.sync_all().map_err(|e| fail("fsync", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| fail("rename", e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| fail("fsync directory for", e))
}

fn data_dir(dir: &Path, reason: String) -> ServerError {
    ServerError::DataDir {
        dir: dir.to_path_buf(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_increase_and_survive_rereading() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_epoch(dir.path()), Ok(0));
        assert_eq!(bump_epoch(dir.path()).unwrap(), 1);
        assert_eq!(bump_epoch(dir.path()).unwrap(), 2);
        assert_eq!(read_epoch(dir.path()), Ok(2));
        assert!(check_epoch(dir.path(), 2).is_ok());
        let err = check_epoch(dir.path(), 1).unwrap_err();
        assert!(err.contains("newer master"), "{err}");
    }

    #[test]
    fn a_damaged_epoch_file_is_refused_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(EPOCH_FILE), "garbage").unwrap();
        assert!(bump_epoch(dir.path()).is_err());
        assert!(check_epoch(dir.path(), 1).is_err());
    }

    #[test]
    fn the_lock_is_exclusive_and_verify_sees_it_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::take(dir.path(), Wait::No).unwrap().unwrap();
        // A second open file description conflicts, even in the same process (OFD lock).
        assert!(DirLock::take(dir.path(), Wait::No).unwrap().is_none());
        assert!(lock.verify().is_ok());
        std::fs::remove_file(dir.path().join(crate::lock::LOCK_FILE)).unwrap();
        assert!(lock.verify().unwrap_err().contains("gone"));
        std::fs::write(dir.path().join(crate::lock::LOCK_FILE), "").unwrap();
        assert!(lock.verify().unwrap_err().contains("replaced"));
        drop(lock);
    }

    #[test]
    fn a_released_lock_is_taken_by_a_blocked_waiter() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::take(dir.path(), Wait::No).unwrap().unwrap();
        let path = dir.path().to_path_buf();
        let waiter = std::thread::spawn(move || DirLock::take(&path, Wait::Block));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "waits while the lock is held");
        drop(lock);
        assert!(waiter.join().unwrap().unwrap().is_some());
    }
}

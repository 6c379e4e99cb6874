//! The lock on a data directory: an open-file-description (OFD) `fcntl` write lock on
//! `<dir>/lock`.
//!
//! Why OFD locks: they belong to the open file, not the process (so a second open in the same
//! process conflicts, unlike classic POSIX locks), the kernel drops them when the process dies,
//! even on `kill -9`, and NFSv4 carries them to the server as byte-range locks, which `flock`
//! does not do reliably. A standalone broker takes the lock without waiting (one broker per
//! directory); a shared-fs slave waits for it (`crate::shared_fs`).

use crate::error::ServerError;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub(crate) const LOCK_FILE: &str = "lock";

pub(crate) struct DirLock {
    file: File,
    path: PathBuf,
}

/// Whether to wait for a lock held by another.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    No,
    Block,
}

impl DirLock {
    /// Takes the lock or fails at once: one broker per data directory.
    pub fn acquire(dir: &Path) -> Result<DirLock, ServerError> {
        match DirLock::take(dir, Wait::No)? {
            Some(lock) => Ok(lock),
            None => Err(ServerError::DataDir {
                dir: dir.to_path_buf(),
                reason: "in use by another broker process (lock held)".into(),
            }),
        }
    }

    /// `Ok(None)`: held by another, and `wait` is `No`. Blocking: this thread waits until the
    /// holder releases it or dies.
    pub fn take(dir: &Path, wait: Wait) -> Result<Option<DirLock>, ServerError> {
        let path = dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| ServerError::DataDir {
                dir: dir.to_path_buf(),
                reason: format!("cannot open {}: {e}", path.display()),
            })?;
        let cmd = match wait {
            Wait::No => libc::F_OFD_SETLK,
            Wait::Block => libc::F_OFD_SETLKW,
        };
        loop {
            match set_lock(&file, cmd) {
                Ok(()) => return Ok(Some(DirLock { file, path })),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                    return Ok(None)
                }
                Err(e) => {
                    return Err(ServerError::DataDir {
                        dir: dir.to_path_buf(),
                        reason: format!("cannot lock {}: {e}", path.display()),
                    })
                }
            }
        }
    }

    /// Proves the lock is still ours: the lock file is still the file we locked (not deleted
    /// or replaced), and re-asserting the lock on our descriptor succeeds (on NFS, a client
    /// whose lease expired has lost its locks and another may hold it now).
    pub fn verify(&self) -> Result<(), String> {
        let ours = self
            .file
            .metadata()
            .map_err(|e| format!("fstat {}: {e}", self.path.display()))?;
        let now = std::fs::metadata(&self.path)
            .map_err(|e| format!("lock file {} is gone: {e}", self.path.display()))?;
        if (ours.dev(), ours.ino()) != (now.dev(), now.ino()) {
            return Err(format!(
                "lock file {} was replaced by another file",
                self.path.display()
            ));
        }
        set_lock(&self.file, libc::F_OFD_SETLK)
            .map_err(|e| format!("lock on {} is no longer ours: {e}", self.path.display()))
    }
}

fn set_lock(file: &File, cmd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: a zeroed flock is a valid value; every field the kernel reads is set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0; // the whole file
    fl.l_pid = 0; // required for OFD locks
                  // SAFETY: fcntl on a descriptor we own, with a pointer to a live, initialised flock.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

//! One broker per data directory: an exclusive `flock` on `<dir>/lock`, held for the life of
//! the process (the kernel releases it when the process dies, even on `kill -9`). Shared-store
//! master/slave builds its lock-and-epoch protocol on top of this later.

use crate::error::ServerError;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<DirLock, ServerError> {
        let path = dir.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| ServerError::DataDir {
                dir: dir.to_path_buf(),
                reason: format!("cannot open {}: {e}", path.display()),
            })?;
        // SAFETY: flock on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            return Err(ServerError::DataDir {
                dir: dir.to_path_buf(),
                reason: "in use by another broker process (lock held)".into(),
            });
        }
        Ok(DirLock { _file: file })
    }
}

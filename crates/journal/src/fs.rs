//! The file operations the writer thread performs, behind a small trait.
//!
//! Why a trait: the failure path (a write or fdatasync that fails) must be tested, and neither
//! a read-only directory (ignored by root) nor a full disk is a reliable way to get there. With
//! the `fault-injection` feature, `Faults` switches make the next write or sync fail, and
//! `Journal::open_with_faults` runs the real writer over them. Reading (recovery) uses std
//! directly: it has no failure mode that needs simulating beyond damaged bytes, which tests
//! make by editing the files.
//!
//! Implementations must guarantee: `sync_data` returns Ok only once the bytes written to that
//! file (and the size needed to read them) are on stable storage; `sync_dir` returns Ok only
//! once creations, renames and deletions in the directory are on stable storage.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub(crate) trait FileOps: Send + Sync + 'static {
    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync(2).
    fn sync_data(&self, file: &File) -> io::Result<()>;
    /// fsync(2).
    fn sync_all(&self, file: &File) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The real file system.
pub(crate) struct RealFs;

impl FileOps for RealFs {
    fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        file.write_all_at(buf, offset)
    }
    fn sync_data(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }
    fn sync_all(&self, file: &File) -> io::Result<()> {
        file.sync_all()
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

#[cfg(feature = "fault-injection")]
pub use fault::Faults;

#[cfg(feature = "fault-injection")]
mod fault {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Fault switches shared between a test and the writer thread. Each switch stays on until
    /// turned off; the journal treats the first failure as fatal anyway.
    #[derive(Debug, Default)]
    pub struct Faults {
        fail_writes: AtomicBool,
        fail_syncs: AtomicBool,
        /// Added to every fdatasync of a segment: a slow disk.
        sync_delay_us: AtomicU64,
    }

    impl Faults {
        pub fn new() -> Arc<Faults> {
            Arc::new(Faults::default())
        }
        /// Every subsequent write fails with EIO.
        pub fn fail_writes(&self, on: bool) {
            self.fail_writes.store(on, Ordering::SeqCst);
        }
        /// Every subsequent fdatasync/fsync (files and directory) fails with EIO.
        pub fn fail_syncs(&self, on: bool) {
            self.fail_syncs.store(on, Ordering::SeqCst);
        }
        /// Every subsequent fdatasync of a segment takes `delay` longer (zero: no delay).
        pub fn delay_syncs(&self, delay: Duration) {
            let us = u64::try_from(delay.as_micros()).expect("a delay in range");
            self.sync_delay_us.store(us, Ordering::SeqCst);
        }
    }

    pub(crate) struct FaultyFs {
        pub(crate) faults: Arc<Faults>,
    }

    fn eio(what: &str) -> io::Error {
        io::Error::other(format!("injected {what} failure (EIO)"))
    }

    impl FileOps for FaultyFs {
        fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
            if self.faults.fail_writes.load(Ordering::SeqCst) {
                return Err(eio("write"));
            }
            RealFs.write_at(file, buf, offset)
        }
        fn sync_data(&self, file: &File) -> io::Result<()> {
            if self.faults.fail_syncs.load(Ordering::SeqCst) {
                return Err(eio("fdatasync"));
            }
            let delay_us = self.faults.sync_delay_us.load(Ordering::SeqCst);
            if delay_us > 0 {
                std::thread::sleep(Duration::from_micros(delay_us));
            }
            RealFs.sync_data(file)
        }
        fn sync_all(&self, file: &File) -> io::Result<()> {
            if self.faults.fail_syncs.load(Ordering::SeqCst) {
                return Err(eio("fsync"));
            }
            RealFs.sync_all(file)
        }
        fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
            RealFs.rename(from, to)
        }
        fn remove(&self, path: &Path) -> io::Result<()> {
            RealFs.remove(path)
        }
        fn sync_dir(&self, dir: &Path) -> io::Result<()> {
            if self.faults.fail_syncs.load(Ordering::SeqCst) {
                return Err(eio("fsync dir"));
            }
            RealFs.sync_dir(dir)
        }
    }
}

#[cfg(feature = "fault-injection")]
pub(crate) use fault::FaultyFs;

//! The store's own thread: a current-thread tokio runtime that runs every database
//! connection of one `PgSharedStore` (the slave's lease contention, the master's lease
//! renewal, the log writer and the paging reader).
//!
//! Why a thread of its own: the broker calls the log (`DurableLog`, `MessageLoader`,
//! `LogStore::open`) synchronously from its core task, and `open`, `close` and `load` must
//! wait for the database. If the connections ran on the broker's runtime, a blocking wait on a
//! current-thread runtime would wait for itself. Here the sync side only sends on channels and
//! waits on replies; the database side never blocks. Renewal also keeps its timing when the
//! broker's threads are busy.
//!
//! Lifetime: every handle that needs the thread (the store, an open log, a loader, a held
//! lease) holds an `Arc<PgRuntime>`; when the last one goes, the thread ends and its tasks and
//! connections are dropped. Tasks never hold an `Arc<PgRuntime>` themselves (that would keep
//! the thread alive for ever), except the bounded release task of a dropped lease.

use crate::error::PgError;
use std::future::Future;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub(crate) struct PgRuntime {
    handle: tokio::runtime::Handle,
    /// Dropped with the last `Arc<PgRuntime>`: the thread's `block_on` then returns.
    _stop: oneshot::Sender<()>,
}

impl PgRuntime {
    pub fn start(name: &str) -> Result<PgRuntime, PgError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(PgError::Thread)?;
        let handle = rt.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("haven-pg-{name}"))
            .spawn(move || {
                rt.block_on(async {
                    let _ = stopped.await;
                });
                // Dropping the runtime here (not in an async context) cancels what is left.
                drop(rt);
            })
            .map_err(PgError::Thread)?;
        Ok(PgRuntime {
            handle,
            _stop: stop,
        })
    }

    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(future)
    }
}

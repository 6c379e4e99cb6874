//! `haven-store-pg`: the shared-database store. Several brokers share one PostgreSQL database;
//! the one holding the lease is master and keeps the broker's log in a table. See
//! `docs/POSTGRES.md` for the protocol, the settings and what it survives.
//!
//! - `lease.rs`: taking, renewing and releasing the lease (epoch, database-clock expiry, the
//!   advisory lock that makes takeover after a crash immediate);
//! - `log.rs`: the log itself (`LogStore`/`DurableLog`): recovery, group-committed writes
//!   fenced by the epoch, virtual segments for compaction;
//! - `loader.rs`: reads paged-out messages back;
//! - `schema.rs`: the tables, created and version-checked at start;
//! - `runtime.rs`: the store's own thread, which runs every connection.
//!
//! Ownership: `PgSharedStore` owns the thread (through `Arc<PgRuntime>`). A `Mastership`
//! owns the lease keeper (through `hold`) and the log store; the open log owns its writer
//! task through a channel. Dropping `hold` releases the lease.

mod db;
mod error;
mod lease;
mod loader;
mod log;
mod runtime;
mod schema;
mod settings;

pub use error::PgError;
pub use lease::RELEASE_TIMEOUT_MS;
pub use log::{BATCH_BYTES_MAX, BATCH_RECORDS_MAX, SEGMENT_BYTES_NOMINAL, SEGMENT_RECORDS};
pub use schema::SCHEMA_VERSION;
pub use settings::CONNECT_TIMEOUT_MS_DEFAULT;

use haven_server::config::ConfigError;
use haven_server::ha::Acquiring;
use haven_server::{HaConfig, Mastership, ServerError, SharedStore};
use runtime::PgRuntime;
use settings::Settings;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A PostgreSQL database shared by several brokers (`[ha] mode = "shared-db"`).
pub struct PgSharedStore {
    s: Arc<Settings>,
    rt: Arc<PgRuntime>,
}

impl PgSharedStore {
    /// Checks the settings and starts the store's thread; connects only in `acquire`.
    /// `broker_name` is written into the lease row, so operators see who is master.
    /// `record_bytes_max` is the largest record the log accepts (as the journal's).
    pub fn new(
        ha: &HaConfig,
        broker_name: &str,
        record_bytes_max: usize,
    ) -> Result<PgSharedStore, PgError> {
        let s = Settings::new(ha, broker_name, record_bytes_max)?;
        let rt = PgRuntime::start(broker_name)?;
        Ok(PgSharedStore {
            s: Arc::new(s),
            rt: Arc::new(rt),
        })
    }
}

/// Releases the lease when dropped (`Mastership::hold`).
struct Hold {
    release: Option<tokio::sync::oneshot::Sender<()>>,
    keeper: Option<tokio::task::JoinHandle<()>>,
    rt: Option<Arc<PgRuntime>>,
    /// Keeps `Mastership::lost` open for as long as the broker may watch it.
    _lost: lease::Lost,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
        let (Some(keeper), Some(rt)) = (self.keeper.take(), self.rt.take()) else {
            return;
        };
        // Never block here (the caller may be an async task, or the process exiting): a task
        // waits for the release, bounded, and keeps the store's thread alive meanwhile.
        let keep_alive = rt.clone();
        rt.spawn(async move {
            let bound = Duration::from_millis(lease::RELEASE_TIMEOUT_MS * 2);
            let _ = tokio::time::timeout(bound, keeper).await;
            drop(keep_alive);
        });
    }
}

impl SharedStore for PgSharedStore {
    fn acquire(&self) -> Acquiring<'_> {
        let s = self.s.clone();
        let rt = self.rt.clone();
        Box::pin(async move {
            // Runs on the store's thread; aborted if the caller stops waiting (a lease won
            // meanwhile is released by the dropped hold).
            let task = rt.spawn({
                let s = s.clone();
                let rt = rt.clone();
                async move {
                    let won = lease::acquire(&s).await?;
                    let (lost_tx, lost_rx) = watch::channel(None);
                    let lost: lease::Lost = Arc::new(lost_tx);
                    let epoch = won.epoch;
                    let store_id = won.store_id.clone();
                    let keeper = lease::keep(&rt, s.clone(), won, lost.clone());
                    let hold = Hold {
                        release: Some(keeper.release),
                        keeper: Some(keeper.task),
                        rt: Some(rt.clone()),
                        _lost: lost.clone(),
                    };
                    let log = log::PgLogStore { s, rt, epoch, lost };
                    Ok::<_, PgError>(Mastership {
                        epoch,
                        log: Box::new(log),
                        store_id,
                        lost: lost_rx,
                        hold: Box::new(hold),
                    })
                }
            });
            let abort = AbortOnDrop(task.abort_handle());
            let result = task.await;
            drop(abort);
            match result {
                Ok(Ok(mastership)) => Ok(mastership),
                Ok(Err(e)) => Err(fatal(&s, e)),
                Err(join) => Err(ServerError::Recovery(format!(
                    "shared store {}: the lease task ended: {join}",
                    s.describe
                ))),
            }
        })
    }

    fn describe(&self) -> String {
        self.s.describe.clone()
    }
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `acquire` returns only errors waiting cannot fix.
fn fatal(s: &Settings, e: PgError) -> ServerError {
    assert!(e.is_fatal(), "acquire retries what waiting can fix: {e}");
    match e {
        PgError::Url(reason) => ServerError::Config(ConfigError::Invalid {
            file: "haven.toml".into(),
            key: "ha.db_url",
            reason,
        }),
        e => ServerError::Recovery(format!("shared store {}: {e}", s.describe)),
    }
}

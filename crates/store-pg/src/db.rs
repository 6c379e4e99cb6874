//! Connections and bounded calls: every call to the database has a deadline, because an
//! unreachable database answers nothing, not an error.

use crate::error::PgError;
use crate::settings::Settings;
use std::future::Future;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_postgres::{Client, NoTls};

/// One connection and the signal that it closed (the server went away, or was restarted, or
/// terminated the session).
pub(crate) struct Conn {
    pub client: Client,
    /// Resolves with the reason once the connection has ended.
    pub closed: oneshot::Receiver<String>,
}

/// Connects within the connect timeout (or `db_timeout_ms`, whichever is longer), then
/// applies the session settings every store connection needs.
/// What a connection is for: it decides how long a statement may wait for a row or advisory
/// lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Contending for and renewing the lease: a lock wait is "not now", retried after
    /// `poll_ms`, so waits are short.
    Lease,
    /// Writing and reading the log: a lock wait (behind a renewal or a takeover attempt on
    /// the lease row) is normal and short; only `db_timeout_ms` bounds it.
    Log,
}

pub(crate) async fn connect(s: &Settings, role: Role) -> Result<Conn, PgError> {
    let bound =
        s.pg.get_connect_timeout()
            .copied()
            .unwrap_or(s.db_timeout())
            .max(s.db_timeout());
    let (client, connection) = timed(bound, "connect", s.pg.connect(NoTls)).await?;
    let (closed_tx, closed) = oneshot::channel();
    // The connection's I/O runs as its own task on the store's runtime.
    tokio::spawn(async move {
        let reason = match connection.await {
            Ok(()) => "connection closed".to_string(),
            Err(e) => crate::error::describe(&e),
        };
        let _ = closed_tx.send(reason);
    });
    // statement_timeout: the server gives up on a statement the client gave up on (a write
    // that timed out here must not commit long after). idle_in_transaction: a broker paused
    // inside a transaction (SIGSTOP) must not hold the lease row's lock for ever, or no slave
    // could take over. lock_timeout: see `Role`.
    let sql = format!(
        "SET statement_timeout = {st}; SET idle_in_transaction_session_timeout = {it}; \
         SET lock_timeout = {lt}",
        st = s.db_timeout_ms + s.poll_ms,
        it = s.db_timeout_ms,
        lt = match role {
            Role::Lease => s.poll_ms,
            Role::Log => s.db_timeout_ms,
        },
    );
    timed(
        s.db_timeout(),
        "session settings",
        client.batch_execute(&sql),
    )
    .await?;
    // "Durable" means the commit is on the server's disk. The server's own setting is kept
    // (`on`, `remote_write`, `remote_apply`, `local` all flush locally before COMMIT returns)
    // unless it is `off`, which acknowledges commits that a server crash loses.
    let sync: String = timed(
        s.db_timeout(),
        "synchronous_commit",
        client.query_one("SHOW synchronous_commit", &[]),
    )
    .await?
    .get(0);
    if sync == "off" {
        tracing::warn!(
            store = %s.describe,
            "synchronous_commit is off on the server: using on for the broker's sessions"
        );
        timed(
            s.db_timeout(),
            "synchronous_commit",
            client.batch_execute("SET synchronous_commit = on"),
        )
        .await?;
    }
    Ok(Conn { client, closed })
}

/// `fut` within `bound`, or `PgError::Timeout`.
pub(crate) async fn timed<T, E>(
    bound: Duration,
    what: &'static str,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, PgError>
where
    PgError: From<E>,
{
    match tokio::time::timeout(bound, fut).await {
        Ok(r) => r.map_err(PgError::from),
        Err(_) => Err(PgError::Timeout {
            what,
            ms: bound.as_millis() as u64,
        }),
    }
}

/// Logs at most once per `interval`: a database that is down for an hour must not fill the
/// log with one line per retry.
pub(crate) struct RateLimit {
    interval: Duration,
    last: Option<tokio::time::Instant>,
    pub suppressed: u64,
}

impl RateLimit {
    pub fn new(interval: Duration) -> RateLimit {
        RateLimit {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// True when a line may be logged now (then the suppressed count restarts).
    pub fn ready(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if self.last.is_some_and(|l| now - l < self.interval) {
            self.suppressed += 1;
            return false;
        }
        self.last = Some(now);
        true
    }
}

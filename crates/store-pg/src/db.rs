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

/// Connects within the connect timeout (and `db_timeout_ms` at most), then applies the
/// session settings every store connection needs.
pub(crate) async fn connect(s: &Settings) -> Result<Conn, PgError> {
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
    // could take over. synchronous_commit: "durable" means the commit is on the server's disk,
    // whatever the database's default is.
    let sql = format!(
        "SET statement_timeout = {st}; SET idle_in_transaction_session_timeout = {it}; \
         SET synchronous_commit = on; SET lock_timeout = {lt}",
        st = s.db_timeout_ms + s.poll_ms,
        it = s.db_timeout_ms,
        lt = s.poll_ms,
    );
    timed(
        s.db_timeout(),
        "session settings",
        client.batch_execute(&sql),
    )
    .await?;
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

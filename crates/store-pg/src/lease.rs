//! The lease: which broker is master, timed by the database's clock, with a fencing epoch.
//!
//! Taking it is one statement that bumps the epoch, allowed only when the lease has expired
//! by the database's `now()` (never a broker's clock), or when the holder's database session
//! is provably gone:
//!
//! ```sql
//! UPDATE haven_lease SET epoch = epoch + 1, holder = $1, expires_at = now() + lease, ...
//!  WHERE id = 1 AND (expires_at <= now() OR ($got_lock AND holder_has_lock)) RETURNING epoch
//! ```
//!
//! **Fast takeover.** A master holds a session-level advisory lock (key derived from the store
//! id) on its lease connection for as long as it is master, and says so in the row
//! (`holder_has_lock`). A slave waits for that lock with a blocking `pg_advisory_lock` bounded
//! by `lock_timeout = poll_ms`. When the master process dies, the kernel closes its socket,
//! the server ends its session and releases the lock, and the waiting slave gets it at once:
//! the holder's session is gone, so it may take the lease without waiting for expiry. When the
//! wait times out (a paused or cut-off master still holds the lock), the slave checks expiry
//! and waits again: so expiry is checked every `poll_ms`, and a dead master is replaced within
//! milliseconds rather than within `poll_ms`.
//!
//! A master that took the lease by expiry does not hold the lock (the old, paused session
//! does); it records `holder_has_lock = false`, so no slave may fast-take-over from it, and
//! tries for the lock at each renewal. Safety never rests on the advisory lock: it rests on the
//! epoch check inside every write (see `log.rs`). The lock only makes failover fast.
//!
//! **Renewal.** Every `renew_ms` the master sets `expires_at = now() + lease_ms` where the
//! epoch is still its own. It remembers when (its monotonic clock) it *sent* the last renewal
//! that succeeded; once `lease_ms - lease_margin_ms` has passed since then it declares the
//! lease lost, before the database can give it to another broker (the database started the
//! lease no earlier than the send). A renewal that finds another epoch, or a lease connection
//! that closes, loses it at once.

use crate::db::{self, Conn, RateLimit};
use crate::error::PgError;
use crate::runtime::PgRuntime;
use crate::schema;
use crate::settings::Settings;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// Between connection attempts while the database is unreachable.
const CONNECT_RETRY_MS: u64 = 1_000;
/// At most one "cannot reach the database" line per this interval.
const CONNECT_ERROR_LOG_INTERVAL_MS: u64 = 5_000;
/// A slave logs who holds the lease when the holder changes, and at least this often.
const SLAVE_STATUS_LOG_INTERVAL_MS: u64 = 30_000;
/// How long a dropped lease may spend releasing itself (the process may be exiting).
pub const RELEASE_TIMEOUT_MS: u64 = 2_000;

const TAKE_SQL: &str = "
UPDATE haven_lease
   SET epoch = epoch + 1, holder = $1,
       expires_at = now() + $2::bigint * interval '1 millisecond',
       renewed_at = now(), holder_has_lock = $3
 WHERE id = 1 AND (expires_at <= now() OR ($3 AND holder_has_lock))
RETURNING epoch";

const PEEK_SQL: &str = "
SELECT epoch, holder, holder_has_lock,
       GREATEST(0, floor(extract(epoch FROM (expires_at - now())) * 1000))::bigint
  FROM haven_lease WHERE id = 1";

const RENEW_SQL: &str = "
UPDATE haven_lease
   SET expires_at = now() + $2::bigint * interval '1 millisecond', renewed_at = now(),
       holder_has_lock = holder_has_lock OR $3
 WHERE id = 1 AND epoch = $1
RETURNING epoch";

const RELEASE_SQL: &str = "
UPDATE haven_lease SET expires_at = now(), holder_has_lock = false
 WHERE id = 1 AND epoch = $1";

/// Shared by the lease keeper, the log writer and the hold: set once, never cleared.
pub(crate) type Lost = Arc<watch::Sender<Option<String>>>;

/// Sets `lost` if it is not set yet (the first reason wins); logs it.
pub(crate) fn lose(lost: &Lost, epoch: u64, reason: String) {
    let first = lost.send_if_modified(|l| {
        if l.is_some() {
            return false;
        }
        *l = Some(reason.clone());
        true
    });
    if first {
        tracing::error!(epoch, "master: lease lost: {reason}");
    }
}

/// A lease just taken.
pub(crate) struct Won {
    pub epoch: u64,
    pub store_id: String,
    pub lock_key: i64,
    pub conn: Conn,
    /// The lease connection holds the advisory lock.
    pub has_lock: bool,
    /// When the statement that took the lease was sent (the lease runs from no earlier).
    pub sent: Instant,
}

/// Waits as a slave until this broker holds the lease. Retries connection failures for ever
/// (logging them at a bounded rate); returns only a lease or an error waiting cannot fix.
pub(crate) async fn acquire(s: &Settings) -> Result<Won, PgError> {
    let mut errors = RateLimit::new(Duration::from_millis(CONNECT_ERROR_LOG_INTERVAL_MS));
    let mut status = SlaveStatus::default();
    loop {
        match contend(s, &mut status).await {
            Ok(won) => return Ok(won),
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => {
                if errors.ready() {
                    tracing::warn!(
                        store = %s.describe,
                        retries_not_logged = errors.suppressed,
                        "slave: cannot use the database, retrying: {e}"
                    );
                    errors.suppressed = 0;
                }
                tokio::time::sleep(Duration::from_millis(CONNECT_RETRY_MS)).await;
            }
        }
    }
}

#[derive(Default)]
struct SlaveStatus {
    seen: Option<(u64, String)>,
    logged_at: Option<Instant>,
}

impl SlaveStatus {
    fn report(&mut self, epoch: u64, holder: String, has_lock: bool, expires_in_ms: i64) {
        let now = Instant::now();
        let changed = self.seen.as_ref() != Some(&(epoch, holder.clone()));
        let due = self
            .logged_at
            .is_none_or(|t| now - t >= Duration::from_millis(SLAVE_STATUS_LOG_INTERVAL_MS));
        if changed || due {
            tracing::info!(
                epoch,
                holder = %holder,
                expires_in_ms,
                holder_session_locked = has_lock,
                "slave: lease held by {holder} epoch {epoch}, expires in {expires_in_ms} ms"
            );
            self.seen = Some((epoch, holder));
            self.logged_at = Some(now);
        }
    }
}

/// One connection's worth of contention: connect, set up the schema, then wait for the
/// advisory lock or the lease's expiry until the lease is ours.
async fn contend(s: &Settings, status: &mut SlaveStatus) -> Result<Won, PgError> {
    let mut conn = db::connect(s, db::Role::Lease).await?;
    let bound = s.db_timeout() + s.poll();
    let store_id = db::timed(bound, "schema setup", schema::prepare(&mut conn.client)).await?;
    let key = schema::lock_key(&store_id);
    let client = &conn.client;
    let lock = client.prepare("SELECT pg_advisory_lock($1)").await?;
    let unlock = client.prepare("SELECT pg_advisory_unlock($1)").await?;
    let take = client.prepare(TAKE_SQL).await?;
    let peek = client.prepare(PEEK_SQL).await?;
    let lease_ms = s.lease_ms as i64;
    loop {
        // Blocks until the holder's session ends, or `lock_timeout` (poll_ms) passes.
        let got = match db::timed(bound, "advisory lock", client.query_one(&lock, &[&key])).await {
            Ok(_) => true,
            Err(e) if e.is_lock_timeout() => false,
            Err(e) => return Err(e),
        };
        let sent = Instant::now();
        let taken = db::timed(
            bound,
            "take the lease",
            client.query_opt(&take, &[&s.broker_name, &lease_ms, &got]),
        )
        .await;
        match taken {
            Ok(Some(row)) => {
                let epoch: i64 = row.get(0);
                assert!(epoch > 0, "the lease's epoch must grow from 0");
                tracing::info!(
                    epoch,
                    holds_session_lock = got,
                    store = %s.describe,
                    "master: lease taken"
                );
                return Ok(Won {
                    epoch: epoch as u64,
                    store_id,
                    lock_key: key,
                    conn,
                    has_lock: got,
                    sent,
                });
            }
            Ok(None) => {}
            // The row is locked by an in-flight write of the master: not expired, try again.
            Err(e) if e.is_lock_timeout() => {}
            Err(e) => return Err(e),
        }
        if got {
            // The holder took the lease by expiry and so never held the lock: it is not proof
            // of anything. Give it back so that the master can take it, and poll.
            db::timed(bound, "advisory unlock", client.query_one(&unlock, &[&key])).await?;
        }
        let row = db::timed(bound, "read the lease", client.query_one(&peek, &[])).await?;
        let epoch: i64 = row.get(0);
        status.report(epoch as u64, row.get(1), row.get(2), row.get(3));
        if got {
            tokio::time::sleep(s.poll()).await;
        }
    }
}

/// The master's side, from the moment it took the lease until the hold is dropped.
pub(crate) struct Keeper {
    pub release: oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Starts renewing `won` on the store's runtime. `lost` becomes `Some` when the lease can no
/// longer be trusted.
pub(crate) fn keep(rt: &PgRuntime, s: Arc<Settings>, won: Won, lost: Lost) -> Keeper {
    let (release, released) = oneshot::channel();
    let task = rt.spawn(renew_loop(s, won, lost, released));
    Keeper { release, task }
}

async fn renew_loop(s: Arc<Settings>, won: Won, lost: Lost, mut released: oneshot::Receiver<()>) {
    let Won {
        epoch,
        lock_key,
        conn,
        mut has_lock,
        sent,
        ..
    } = won;
    let Conn { client, mut closed } = conn;
    let mut trusted_until = sent + s.trusted;
    let lease_ms = s.lease_ms as i64;
    let epoch_i = epoch as i64;
    loop {
        tokio::select! {
            biased;
            _ = &mut released => {
                // Clean handover: expire the lease now and free the lock, so a slave takes
                // over at once. Best effort and bounded; the process may be exiting.
                let release = async {
                    client.execute(RELEASE_SQL, &[&epoch_i]).await?;
                    client.execute("SELECT pg_advisory_unlock_all()", &[]).await
                };
                match db::timed(
                    Duration::from_millis(RELEASE_TIMEOUT_MS),
                    "release the lease",
                    release,
                )
                .await
                {
                    Ok(_) => tracing::info!(epoch, "master: lease released"),
                    Err(e) => tracing::warn!(epoch, "master: lease not released ({e}); it expires by itself"),
                }
                return;
            }
            reason = &mut closed, if lost.borrow().is_none() => {
                let reason = reason.unwrap_or_else(|_| "connection task ended".into());
                lose(&lost, epoch, format!("the lease connection closed ({reason})"));
            }
            _ = tokio::time::sleep_until(trusted_until), if lost.borrow().is_none() => {
                lose(&lost, epoch, format!(
                    "not renewed for {} ms (lease_ms - lease_margin_ms): the database may give \
                     the lease to another broker",
                    s.trusted.as_millis()
                ));
            }
            _ = tokio::time::sleep(s.renew), if lost.borrow().is_none() => {
                let sent = Instant::now();
                if !has_lock {
                    // Took the lease by expiry: the old session may be gone by now.
                    if let Ok(Ok(row)) = tokio::time::timeout_at(
                        trusted_until,
                        client.query_one("SELECT pg_try_advisory_lock($1)", &[&lock_key]),
                    )
                    .await
                    {
                        has_lock = row.get(0);
                    }
                }
                let renewed = tokio::time::timeout_at(
                    trusted_until,
                    client.query_opt(RENEW_SQL, &[&epoch_i, &lease_ms, &has_lock]),
                )
                .await;
                match renewed {
                    // The deadline branch fires on the next round.
                    Err(_) => {}
                    Ok(Ok(Some(_))) => trusted_until = sent + s.trusted,
                    Ok(Ok(None)) => lose(
                        &lost,
                        epoch,
                        "another broker took the lease (a newer epoch)".into(),
                    ),
                    Ok(Err(e)) => {
                        let e = PgError::from(e);
                        if !e.is_lock_timeout() {
                            tracing::warn!(epoch, "master: renewal failed, retrying until the lease can no longer be trusted: {e}");
                        }
                    }
                }
            }
        }
        if lost.borrow().is_some() {
            // Nothing to renew any more; hold the connection (and the lock, if any) until
            // the hold is dropped, when the broker has stopped: a slave must not start
            // recovering while this broker's core may still be running.
            let _ = (&mut released).await;
            let _ = db::timed(
                Duration::from_millis(RELEASE_TIMEOUT_MS),
                "release the lease",
                client.execute(RELEASE_SQL, &[&epoch_i]),
            )
            .await;
            return;
        }
    }
}

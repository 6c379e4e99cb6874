//! The store's tables, created and migrated by the broker at start.
//!
//! - `haven_meta(key, value)`: `schema_version` and `store_id` (a random id created once,
//!   announced to clients as `haven-store`, the same for every master of this store).
//! - `haven_lease`: one row (`id = 1`): the fencing `epoch`, who holds it, until when (by the
//!   database's clock), and whether the holder's session holds the store's advisory lock.
//!   `epoch` has a unique index (`haven_lease_epoch_key`) of its own. It is what the fence
//!   rests on: it makes `epoch` a key column, so a takeover (which changes it) conflicts with
//!   the `FOR KEY SHARE` lock every write takes on the row, while a renewal (which changes no
//!   key column) does not, and a master's renewal never waits for its own writes (`log.rs`).
//!   The index came after schema version 1 without a version bump: a start creates it if no
//!   such index is there, and a broker built before it fences with `FOR SHARE`, which
//!   conflicts with every update and needs no index, so the two may share a store.
//! - `haven_log(lsn, epoch, payload)`: the broker's log; each record carries the epoch of the
//!   master that wrote it.
//!
//! Two brokers starting at once must not race their `CREATE TABLE`s (that fails with a unique
//! violation in the catalogue), so setup runs in one transaction under a transaction-level
//! advisory lock. A version newer than this broker knows is refused before anything is
//! touched.

use crate::error::PgError;
use tokio_postgres::Client;

/// The schema this broker writes. Bump it (and add a migration step) when a table changes.
pub const SCHEMA_VERSION: i64 = 1;
/// Serialises schema setup between brokers: any fixed 64-bit number ("HAVENSCH").
const SCHEMA_LOCK_KEY: i64 = 0x4841_5645_4E53_4348;

const CREATE_SQL: &str = "
CREATE TABLE IF NOT EXISTS haven_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS haven_lease (
    id              INT PRIMARY KEY CHECK (id = 1),
    epoch           BIGINT NOT NULL CHECK (epoch >= 0),
    holder          TEXT NOT NULL,
    expires_at      TIMESTAMPTZ NOT NULL,
    renewed_at      TIMESTAMPTZ,
    holder_has_lock BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS haven_log (
    lsn     BIGINT PRIMARY KEY CHECK (lsn > 0),
    epoch   BIGINT NOT NULL CHECK (epoch > 0),
    payload BYTEA NOT NULL
);
INSERT INTO haven_meta (key, value)
    VALUES ('store_id', 'pg-' || substr(md5(random()::text || clock_timestamp()::text
                                            || pg_backend_pid()::text), 1, 16))
    ON CONFLICT (key) DO NOTHING;
";

const EPOCH_KEY_SQL: &str =
    "CREATE UNIQUE INDEX IF NOT EXISTS haven_lease_epoch_key ON haven_lease (epoch)";

/// Whether `epoch` is a key column of `haven_lease` for row locking: PostgreSQL counts the
/// columns of unique indexes that are immediate, valid, and neither partial nor on
/// expressions (the indexes a foreign key could use).
const EPOCH_IS_A_KEY_SQL: &str = "
SELECT EXISTS (
  SELECT 1 FROM pg_index i
   WHERE i.indrelid = 'haven_lease'::regclass AND i.indisunique AND i.indimmediate
     AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnatts = 1
     AND i.indkey[0] = (SELECT attnum FROM pg_attribute
                         WHERE attrelid = 'haven_lease'::regclass AND attname = 'epoch'))";

/// Creates or checks the schema; returns the store id.
pub(crate) async fn prepare(client: &mut Client) -> Result<String, PgError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK_KEY])
        .await?;
    let exists: bool = tx
        .query_one("SELECT to_regclass('haven_meta') IS NOT NULL", &[])
        .await?
        .get(0);
    if exists {
        let row = tx
            .query_opt(
                "SELECT value FROM haven_meta WHERE key = 'schema_version'",
                &[],
            )
            .await?;
        if let Some(row) = row {
            let text: String = row.get(0);
            let found: i64 = text
                .parse()
                .map_err(|_| PgError::Schema(format!("haven_meta.schema_version is {text:?}")))?;
            if found > SCHEMA_VERSION {
                return Err(PgError::SchemaTooNew {
                    found,
                    known: SCHEMA_VERSION,
                });
            }
            // Versions below SCHEMA_VERSION would be migrated here, step by step.
            if found < 1 {
                return Err(PgError::Schema(format!(
                    "haven_meta.schema_version is {found}"
                )));
            }
        }
    }
    tx.batch_execute(CREATE_SQL).await?;
    // Created only when missing: `CREATE INDEX`, even one that exists, takes a share lock on
    // the table until this transaction ends, and that would hold the running master's
    // renewals for as long as this broker takes to start (or is paused). `IF NOT EXISTS` goes
    // by the name, so an index of that name that is not a plain unique index on `epoch` alone
    // is refused: the takeover would be free to pass a write's fence.
    let mut fenced: bool = tx.query_one(EPOCH_IS_A_KEY_SQL, &[]).await?.get(0);
    if !fenced {
        tx.batch_execute(EPOCH_KEY_SQL).await?;
        fenced = tx.query_one(EPOCH_IS_A_KEY_SQL, &[]).await?.get(0);
    }
    if !fenced {
        return Err(PgError::Schema(
            "haven_lease has no plain unique index on epoch alone (haven_lease_epoch_key \
             exists but is another index); writes cannot be fenced without it"
                .into(),
        ));
    }
    let lease_row = tx
        .query_opt("SELECT epoch FROM haven_lease WHERE id = 1", &[])
        .await?;
    if lease_row.is_none() {
        // A new store, or the row was deleted by hand: epochs must still only grow, or a
        // new master's writes would look older than the records already in the log (and
        // recovery would refuse them). Scans the log, but only when the row is missing.
        let max: i64 = tx
            .query_one("SELECT coalesce(max(epoch), 0) FROM haven_log", &[])
            .await?
            .get(0);
        tx.execute(
            "INSERT INTO haven_lease (id, epoch, holder, expires_at, renewed_at, holder_has_lock)
             VALUES (1, $1, '', '-infinity', NULL, false)",
            &[&max],
        )
        .await?;
    }
    tx.execute(
        "INSERT INTO haven_meta (key, value) VALUES ('schema_version', $1)
         ON CONFLICT (key) DO NOTHING",
        &[&SCHEMA_VERSION.to_string()],
    )
    .await?;
    let store_id: String = tx
        .query_one("SELECT value FROM haven_meta WHERE key = 'store_id'", &[])
        .await?
        .get(0);
    tx.commit().await?;
    if store_id.is_empty() {
        return Err(PgError::Schema("haven_meta.store_id is empty".into()));
    }
    Ok(store_id)
}

/// The store's advisory lock key, derived from its id (FNV-1a), so that two stores in one
/// database (different schemas) do not share a lock.
pub(crate) fn lock_key(store_id: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in store_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

#[cfg(test)]
mod tests {
    #[test]
    fn lock_keys_differ_per_store_and_are_stable() {
        assert_eq!(super::lock_key("pg-a"), super::lock_key("pg-a"));
        assert_ne!(super::lock_key("pg-a"), super::lock_key("pg-b"));
    }
}

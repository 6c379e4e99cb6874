//! Why the PostgreSQL store could not be set up, or a database call failed.

/// `is_fatal` tells the two kinds apart: errors that waiting cannot fix (a bad URL, a schema
/// newer than this broker) end `acquire`; the others (no connection, a timeout, an SQL error)
/// are retried until the database is back.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// `ha.db_url` does not parse, or asks for something this build cannot do.
    #[error("ha.db_url: {0}")]
    Url(String),
    /// Lease timings that the protocol cannot work with (the server's config validation
    /// refuses them too).
    #[error("[ha] settings: {0}")]
    Settings(String),
    /// The store was created or migrated by a newer broker: refusing to touch it.
    #[error(
        "the store's schema version is {found}, newer than this broker knows ({known}): \
         upgrade the broker"
    )]
    SchemaTooNew { found: i64, known: i64 },
    /// The store's tables are not what this broker's schema version says they are.
    #[error("the store's schema is damaged: {0}")]
    Schema(String),
    #[error("database: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    /// A database call did not complete within `ha.db_timeout_ms` (or the connect timeout).
    #[error("database did not answer within {ms} ms ({what})")]
    Timeout { what: &'static str, ms: u64 },
    /// The store's own thread (which runs the database connections) is gone.
    #[error("the database thread stopped")]
    ThreadGone,
    #[error("cannot start the database thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl PgError {
    /// Errors that retrying cannot fix.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            PgError::Url(_)
                | PgError::Settings(_)
                | PgError::SchemaTooNew { .. }
                | PgError::Schema(_)
        )
    }

    /// The server refused to wait for a lock longer than `lock_timeout` (SQLSTATE 55P03):
    /// "not now", not a failure.
    pub(crate) fn is_lock_timeout(&self) -> bool {
        matches!(self, PgError::Db(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE))
    }
}

/// tokio-postgres displays a server error as just "db error": say what the server said.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

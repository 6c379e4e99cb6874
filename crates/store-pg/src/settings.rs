//! The store's settings, taken from `[ha]` (already validated by the server's config) and
//! turned into durations once.

use crate::error::PgError;
use std::time::Duration;
use tokio_postgres::config::{Host, SslMode};

/// How long connecting may take when the URL does not say (`connect_timeout`).
pub const CONNECT_TIMEOUT_MS_DEFAULT: u64 = 5_000;

#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub pg: tokio_postgres::Config,
    /// Written into the lease row as `holder`, so operators see who is master.
    pub broker_name: String,
    pub lease_ms: u64,
    pub renew: Duration,
    /// `lease_ms - lease_margin_ms`: how long after sending a renewal the master still trusts
    /// its lease.
    pub trusted: Duration,
    pub poll_ms: u64,
    pub db_timeout_ms: u64,
    pub record_bytes_max: usize,
    /// `host:port/dbname`, never the password.
    pub describe: String,
}

impl Settings {
    pub fn new(
        ha: &haven_server::HaConfig,
        broker_name: &str,
        record_bytes_max: usize,
    ) -> Result<Settings, PgError> {
        let mut pg: tokio_postgres::Config = ha
            .db_url
            .parse()
            .map_err(|e: tokio_postgres::Error| PgError::Url(e.to_string()))?;
        if pg.get_ssl_mode() == SslMode::Require {
            // This build links no TLS library: refuse rather than connect in clear text.
            return Err(PgError::Url(
                "sslmode=require: this build has no TLS support; use a local or tunnelled \
                 connection, or sslmode=disable"
                    .into(),
            ));
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS_DEFAULT));
        }
        if pg.get_application_name().is_none() {
            pg.application_name(format!("haven {broker_name}"));
        }
        // The server's config validation guarantees these; the lease protocol depends on
        // them, so check again rather than trust a caller that built HaConfig by hand.
        let trusted_ms = ha.lease_ms.saturating_sub(ha.lease_margin_ms);
        if ha.lease_margin_ms == 0 || trusted_ms < 2 * ha.renew_ms || ha.renew_ms == 0 {
            return Err(PgError::Settings(format!(
                "lease_ms - lease_margin_ms ({trusted_ms}) must be at least twice renew_ms ({})",
                ha.renew_ms
            )));
        }
        if ha.poll_ms == 0 || ha.db_timeout_ms == 0 {
            return Err(PgError::Settings(
                "poll_ms and db_timeout_ms must be at least 1".into(),
            ));
        }
        assert!(record_bytes_max > 0, "record_bytes_max must be positive");
        let hosts: Vec<String> = pg
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(h) => h.clone(),
                Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let describe = format!(
            "postgresql {}:{port}/{}",
            hosts.join(","),
            pg.get_dbname().unwrap_or("(default)")
        );
        Ok(Settings {
            pg,
            broker_name: broker_name.to_string(),
            lease_ms: ha.lease_ms,
            renew: Duration::from_millis(ha.renew_ms),
            trusted: Duration::from_millis(trusted_ms),
            poll_ms: ha.poll_ms,
            db_timeout_ms: ha.db_timeout_ms,
            record_bytes_max,
            describe,
        })
    }

    pub fn db_timeout(&self) -> Duration {
        Duration::from_millis(self.db_timeout_ms)
    }

    pub fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_ms)
    }
}

//! Shared-store master/slave: several brokers share one store, and only the one holding the
//! store's lock (shared file system) or lease (PostgreSQL) serves clients.
//!
//! A broker in a shared mode runs `run_shared`: it waits as a slave (no listener open, so
//! failover clients move on at once) until `SharedStore::acquire` makes it master, then
//! recovers the store and serves, exactly as a standalone broker does, until it stops or loses
//! mastership. Losing it — the lock cannot be proven, a newer epoch appeared, the lease was not
//! renewed in time, the database is gone — stops the broker at once, without writing another
//! record, and it goes back to waiting as a slave. So failback is automatic: a restarted or
//! recovered old master simply becomes a slave.

use crate::clock::Clock;
use crate::config::Config;
use crate::error::ServerError;
use crate::log::LogStore;
use crate::net::Network;
use crate::{Env, Server};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// After losing mastership, how long a broker waits before competing for it again, so that a
/// healthy slave wins the store rather than the broker that just failed on it.
const STEP_DOWN_PAUSE_MS: u64 = 1_000;

/// A claim on the shared store: this broker is master while it holds it.
pub struct Mastership {
    /// Issued with the claim: higher than that of every earlier master of this store.
    pub epoch: u64,
    /// The store to recover from and append to; its writes are fenced by `epoch`.
    pub log: Box<dyn LogStore>,
    /// Announced as `haven-store` in CONNECTED: the same for every master of this store.
    pub store_id: String,
    /// Becomes `Some(reason)` the moment this broker can no longer prove it is master. The
    /// broker then stops at once, writing nothing more.
    pub lost: watch::Receiver<Option<String>>,
    /// Held while master. Dropped after the broker has stopped: releases the lock or lease.
    pub hold: Box<dyn Send>,
}

pub type Acquiring<'a> = Pin<Box<dyn Future<Output = Result<Mastership, ServerError>> + Send + 'a>>;

/// A store several brokers share, with the lock or lease that makes one of them master.
pub trait SharedStore: Send + Sync {
    /// Waits, as a slave, until this broker is master. While waiting it logs who holds the
    /// store. Errors are for what waiting longer cannot fix (a bad directory or URL).
    fn acquire(&self) -> Acquiring<'_>;
    /// For log lines: where the store is.
    fn describe(&self) -> String;
}

/// What a broker in a shared mode is doing, for tests and (later) the admin API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Waiting for the lock or lease.
    Slave,
    /// Serving clients on this address, as master of `epoch`.
    Master {
        epoch: u64,
        addr: std::net::SocketAddr,
    },
    /// Stopped for good (`stop` was set, or an error waiting cannot fix).
    Stopped,
}

/// Runs a broker over a shared store until `stop` becomes true: slave, then master, then slave
/// again whenever mastership is lost. `role` tells where it is. Returns an error only for
/// what retrying cannot fix.
pub async fn run_shared(
    config: Config,
    store: Arc<dyn SharedStore>,
    stop: watch::Receiver<bool>,
    role: watch::Sender<Role>,
) -> Result<(), ServerError> {
    let edges = Edges {
        network: Arc::new(crate::net::TcpNetwork),
        clock: Arc::new(crate::clock::SystemClock),
    };
    run_shared_with(config, store, stop, role, edges).await
}

/// The network and clock each term's broker runs over (see `Env`); the simulation passes its
/// own.
#[derive(Clone)]
pub struct Edges {
    pub network: Arc<dyn Network>,
    pub clock: Arc<dyn Clock>,
}

/// `run_shared` over the given edges.
pub async fn run_shared_with(
    config: Config,
    store: Arc<dyn SharedStore>,
    mut stop: watch::Receiver<bool>,
    role: watch::Sender<Role>,
    edges: Edges,
) -> Result<(), ServerError> {
    let result = serve_terms(&config, &*store, &mut stop, &role, &edges).await;
    let _ = role.send(Role::Stopped);
    result
}

async fn serve_terms(
    config: &Config,
    store: &dyn SharedStore,
    stop: &mut watch::Receiver<bool>,
    role: &watch::Sender<Role>,
    edges: &Edges,
) -> Result<(), ServerError> {
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        let _ = role.send(Role::Slave);
        tracing::info!(store = %store.describe(), "slave: waiting to become master");
        let term = tokio::select! {
            biased;
            _ = stop.changed() => return Ok(()),
            term = store.acquire() => term?,
        };
        let Mastership {
            epoch,
            log,
            store_id,
            lost,
            hold,
        } = term;
        tracing::info!(epoch, store = %store.describe(), "master: recovering the store");
        let env = Env {
            network: edges.network.clone(),
            clock: edges.clock.clone(),
            log,
            store_id,
            lost: Some(lost.clone()),
        };
        let server = match Server::start_with(config.clone(), env).await {
            Ok(server) => server,
            Err(e @ (ServerError::Config(_) | ServerError::Bind { .. })) => return Err(e),
            Err(e) => {
                // A store that cannot be recovered, or lost while recovering: let another
                // broker try, then compete again.
                drop(hold);
                tracing::error!(epoch, "master could not start: {e}; stepping down");
                pause(stop).await;
                continue;
            }
        };
        let _ = role.send(Role::Master {
            epoch,
            addr: server.local_addr(),
        });
        let stopper = server.stopper();
        let mut stop_watch = stop.clone();
        let forward = tokio::spawn(async move {
            while stop_watch.changed().await.is_ok() {
                if *stop_watch.borrow() {
                    let _ = stopper.send(true);
                    return;
                }
            }
        });
        let result = server.wait().await;
        forward.abort();
        // No longer serving: say so now, not after the pause below.
        let _ = role.send(Role::Slave);
        drop(hold);
        if *stop.borrow() {
            return result;
        }
        match result {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::error!(epoch, "master stopped: {e}; stepping down to slave");
                pause(stop).await;
            }
        }
    }
}

async fn pause(stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        biased;
        _ = stop.changed() => {}
        _ = tokio::time::sleep(Duration::from_millis(STEP_DOWN_PAUSE_MS)) => {}
    }
}

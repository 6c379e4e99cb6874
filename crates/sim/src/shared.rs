//! A broker host in the shared-store mode: the slave → master → slave loop of
//! `haven_server::ha::run_shared`, over the simulation's network and clock.
//!
//! Why a copy: `run_shared` builds its `Env` with TCP and the system clock. It is the same
//! small loop (acquire, `Server::start_with` with the mastership's `lost` watch, wait, drop the
//! hold, pause, again); `haven_server::ha` should grow a variant that takes the network and
//! the clock so that the simulation runs the real one. Until then, keep the two in step.
//!
//! Each host also reports its role to [`Roles`], which the run checks at every step: at most
//! one broker serves per epoch, and each serves only an epoch the lease granted to it.

use crate::edges::{SimClock, SimNetwork};
use crate::lease::SimSharedStore;
use haven_server::ha::{Mastership, SharedStore};
use haven_server::{Config, Env, Server, ServerError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// After losing mastership, how long a broker waits before competing again (as
/// `haven_server::ha`'s `STEP_DOWN_PAUSE_MS`).
const STEP_DOWN_PAUSE_MS: u64 = 1_000;

/// What a host is doing, as the run's invariants see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Crashed, or not started yet.
    Down,
    /// Waiting for the lease, or between terms.
    Slave,
    /// Listening and acknowledging as master of `epoch`.
    Serving { epoch: u64 },
}

/// Every host's role. Written by the hosts (and by the run when it crashes one).
#[derive(Clone)]
pub struct Roles(Arc<Mutex<Vec<Role>>>);

impl Roles {
    pub fn new(hosts: usize) -> Roles {
        Roles(Arc::new(Mutex::new(vec![Role::Down; hosts])))
    }

    pub fn set(&self, host: usize, role: Role) {
        self.0.lock().expect("roles")[host] = role;
    }

    pub fn get(&self) -> Vec<Role> {
        self.0.lock().expect("roles").clone()
    }

    /// Hosts serving now, with their epochs.
    pub fn serving(&self) -> Vec<(usize, u64)> {
        self.get()
            .iter()
            .enumerate()
            .filter_map(|(h, r)| match r {
                Role::Serving { epoch } => Some((h, *epoch)),
                _ => None,
            })
            .collect()
    }
}

/// Runs host `store.host` until its host is crashed: slave, master, slave again. Returns an
/// error only for what retrying cannot fix (as `run_shared`).
pub async fn serve_shared(
    config: Config,
    store: SimSharedStore,
    clock: SimClock,
    roles: Roles,
    trace: impl Fn(String),
) -> Result<(), ServerError> {
    let host = store.host;
    loop {
        roles.set(host, Role::Slave);
        let Mastership {
            epoch,
            log,
            store_id,
            lost,
            hold,
        } = store.acquire().await?;
        trace(format!("broker{host} took the lease: epoch {epoch}"));
        let env = Env {
            network: Arc::new(SimNetwork),
            clock: Arc::new(clock.clone()),
            log,
            store_id,
            lost: Some(lost),
        };
        let server = match Server::start_with(config.clone(), env).await {
            Ok(server) => server,
            Err(e @ (ServerError::Config(_) | ServerError::Bind { .. })) => return Err(e),
            Err(e) => {
                drop(hold);
                trace(format!(
                    "broker{host} could not start as master of epoch {epoch}: {e}"
                ));
                tokio::time::sleep(Duration::from_millis(STEP_DOWN_PAUSE_MS)).await;
                continue;
            }
        };
        roles.set(host, Role::Serving { epoch });
        trace(format!("broker{host} serving as master of epoch {epoch}"));
        let result = server.wait().await;
        roles.set(host, Role::Slave);
        drop(hold);
        match result {
            // Nothing in the simulation stops a broker in order.
            Ok(()) => return Ok(()),
            Err(e) => {
                trace(format!("broker{host} stepped down from epoch {epoch}: {e}"));
                tokio::time::sleep(Duration::from_millis(STEP_DOWN_PAUSE_MS)).await;
            }
        }
    }
}

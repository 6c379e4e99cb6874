//! A broker host in the shared-store mode: `haven_server::ha::run_shared_with`, the loop the
//! broker runs in production (slave, master, slave again), over the simulation's network and
//! clock.
//!
//! Each host's role is read from that loop's own role channel, which the run checks at every
//! step: at most one broker serves per epoch, and each serves only an epoch the lease granted
//! to it.

use crate::edges::{SimClock, SimNetwork};
use crate::lease::SimSharedStore;
use haven_server::ha::{self, Edges};
use haven_server::{Config, ServerError};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

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

/// Every host's role: the role channel of the loop it runs, none while it is down.
#[derive(Clone)]
pub struct Roles(Arc<Mutex<Hosts>>);

struct Hosts {
    running: Vec<Option<watch::Receiver<ha::Role>>>,
    /// The roles last traced.
    traced: Vec<Role>,
}

impl Roles {
    pub fn new(hosts: usize) -> Roles {
        Roles(Arc::new(Mutex::new(Hosts {
            running: vec![None; hosts],
            traced: vec![Role::Down; hosts],
        })))
    }

    /// Host `host` was crashed: its loop is gone.
    pub fn down(&self, host: usize) {
        self.0.lock().expect("roles").running[host] = None;
    }

    fn running(&self, host: usize, role: watch::Receiver<ha::Role>) {
        self.0.lock().expect("roles").running[host] = Some(role);
    }

    pub fn get(&self) -> Vec<Role> {
        self.0
            .lock()
            .expect("roles")
            .running
            .iter()
            .map(|r| match r.as_ref().map(|r| r.borrow().clone()) {
                None | Some(ha::Role::Stopped) => Role::Down,
                Some(ha::Role::Slave) => Role::Slave,
                Some(ha::Role::Master { epoch, .. }) => Role::Serving { epoch },
            })
            .collect()
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

    /// A trace line for each host whose role changed since the last call.
    pub fn changes(&self) -> Vec<String> {
        let now = self.get();
        let mut hosts = self.0.lock().expect("roles");
        let mut lines = Vec::new();
        for (host, (was, is)) in hosts.traced.iter().zip(&now).enumerate() {
            if was != is {
                lines.push(format!("broker{host} {is:?}"));
            }
        }
        hosts.traced = now;
        lines
    }
}

/// Runs host `store.host` until the host is crashed. Returns an error only for what retrying
/// cannot fix (as `run_shared`).
pub async fn serve_shared(
    config: Config,
    store: SimSharedStore,
    clock: SimClock,
    roles: Roles,
) -> Result<(), ServerError> {
    let host = store.host;
    // Nothing in the simulation stops a broker in order; the sender lives as long as the loop,
    // so the loop never sees it gone.
    let (_stop_tx, stop) = watch::channel(false);
    let (role_tx, role_rx) = watch::channel(ha::Role::Slave);
    roles.running(host, role_rx);
    let edges = Edges {
        network: Arc::new(SimNetwork),
        clock: Arc::new(clock),
    };
    ha::run_shared_with(config, Arc::new(store), stop, role_tx, edges).await
}

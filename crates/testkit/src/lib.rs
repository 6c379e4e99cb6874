//! `haven-testkit`: support for tests that run the real `haven` binary as a process.
//!
//! The API is synchronous (std::process, std::net) so it works the same from a plain `#[test]`
//! and from a tokio test body (which runs on its own thread under `block_on`). Every process a
//! test starts is owned by a [`BrokerProcess`] and killed when it is dropped, so a failing test
//! never leaves a broker behind. [`History`] is the no-loss / no-duplicate checker, and
//! [`Proxy`] a fault-injecting TCP proxy (delay, black hole, reset) to put between processes.
//! [`NetLab`] puts brokers in network namespaces and partitions them with firewall rules
//! (root only; [`NetLab::skip_reason`] says why not elsewhere).

mod broker;
mod checker;
mod error;
mod net;
mod netns;
mod pg;
mod proc_status;
mod proxy;
mod scenario;

pub use broker::{BrokerOpts, BrokerProcess, READY_TIMEOUT_MS, STOP_TIMEOUT_MS};
pub use checker::{Duplicates, History, Report, SendOutcome};
pub use error::TestkitError;
pub use net::{free_addr, free_port, stomp_connect_probe};
pub use netns::{
    Firewall, HostId, NetLab, Peer, COMMAND_TIMEOUT_MS, HOSTS_PER_LAB_MAX, STOMP_PORT,
};
pub use pg::{PgCluster, PG_INITDB_TIMEOUT_MS, PG_READY_TIMEOUT_MS};
pub use proc_status::{rss_bytes, rss_peak_bytes};
pub use proxy::{Fault, Proxy, ProxyStats};
pub use scenario::{run as run_scenario, Action, Ran, Step};

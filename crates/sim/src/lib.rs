//! Deterministic simulation of Haven (issue 5): brokers and failover clients in one process on
//! turmoil's simulated network and time, over simulated disks that lose unsynced writes when
//! a broker crashes.
//!
//! The code under test is the production code: `haven_server::Server::start_with` runs the
//! real core, engine and STOMP connections over the edges in [`edges`] (network, clock) and
//! [`disk`] (the durable log); `haven_client::Client` runs its real failover logic over the
//! simulated network. [`run`] drives one seeded run: a fault phase (crashes, held and
//! partitioned links, clock jumps, failing disks), then a healing phase that must finish
//! (liveness), then the checker. A seed replays its run exactly.

pub mod disk;
pub mod edges;
pub mod lease;
mod panics;
pub mod raft;
pub mod raft_clock;
mod run;
pub mod shared;

pub use run::{run, FaultCounts, Mode, Outcome, SharedStats, SimConfig};

//! haven-raft: shared-nothing replication. Each member keeps its own journal; the Raft leader
//! (openraft, pinned exactly, used only through this crate) replicates every record the broker
//! writes to a majority before the broker acts on it.
//!
//! The pieces:
//! - `log_store`: the Raft log in a journal of its own (`<data>/raft-log`), the vote in a file.
//! - `state`: the state machine, each member's state journal (`<data>/state`) in the
//!   standalone broker's format, with the same LSNs on every member.
//! - `snapshot`: snapshots as files of journal segments, streamed to members that fell behind.
//! - `leader`: the log the broker's core writes to while this member leads.
//! - `network`, `admin`, `client`: the Raft port, for peers and for `haven admin cluster`.
//! - `handover`: moving leadership to a chosen member (`transfer-leader`).
//! - `witness`: the bodiless third member of a two-broker group, and the leader's gate for it.
//! - `runtime`: openraft's async runtime, tokio with a floor under RPC timeouts.
//! - `repair`: a member whose Raft log is damaged catches up from its peers, not voting meanwhile.
//! - `split_vote`: a member whose vote split steps back a random time before standing again.
//! - `node`: one replica, as a `SharedStore`, so `haven_server::run_shared` serves while it leads.

// openraft's `StorageError` is large; it is what its traits return, so it is returned as is.
#![allow(clippy::result_large_err)]

pub mod admin;
pub mod client;
mod files;
mod handover;
mod leader;
mod log_store;
pub mod network;
mod node;
mod repair;
pub mod runtime;
mod snapshot;
pub mod split_vote;
mod state;
pub mod types;
mod witness;

pub use admin::{AdminRequest, AdminResponse, Status};
pub use node::ReplicatedStore;
pub use types::{Member, NodeId};

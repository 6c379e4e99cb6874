//! Stepping back after a split vote, so that members who keep standing at the same moment
//! stop doing so.
//!
//! openraft 0.9 draws a member's election timeout once, when the member starts, and checks it
//! on a tick every 1.5 heartbeats, each tick set from the moment the last one fired. Members
//! whose ticks fire within one network delay of each other, with timeouts that round up to the
//! same tick, stand at the same moment every time: each votes for itself, the requests cross,
//! every vote is split, and no one leads until the scheduler's delays move their ticks apart.
//! The deterministic simulation, whose clock has no such delays, found a group of three doing
//! that for 30 s (docs/RELIABILITY.md). Raft's remedy is a fresh random timeout for every
//! election; openraft 0.9 has no way to set one, so this gives the same effect from outside: a
//! member that stood, and stands again with no leader in between, does not stand on its own
//! timer for a random [`pause`](step_back) of up to `pause_max_ms`. It still votes for others
//! meanwhile, and an election asked for explicitly (`transfer-leader`) is not held back.
//!
//! The same function runs in Haven's replicas (`node.rs`) and in the simulation of them
//! (`haven-sim`, `sim/src/raft.rs`), generic over the Raft type so that the simulation's seeded
//! runtime draws the pauses.

use openraft::{AsyncRuntime, RaftTypeConfig, ServerState};
use rand::Rng;
use std::time::Duration;

/// The longest pause after a split vote, in election timeouts. openraft's election timers are
/// quantised to ticks of 1.5 heartbeats (0.75 of an election timeout at Haven's defaults), so
/// a pause up to 3 election timeouts moves a member's next candidacy by up to 4 ticks, and two
/// members in step are apart after a split more often than not.
pub const PAUSE_MAX_ELECTION_TIMEOUTS: u64 = 3;

/// Runs for the life of `raft`; `may_stand` says whether this member may stand on its own
/// timer at all right now (it may not while repairing its log, `repair.rs`, which turns
/// elections back on itself when done). Never started on a witness, which never stands.
pub async fn step_back<C: RaftTypeConfig>(
    raft: openraft::Raft<C>,
    pause_max_ms: u64,
    may_stand: impl Fn() -> bool,
) {
    assert!(pause_max_ms > 0, "a pause needs a range");
    // The server metrics change only with the vote, the role, the leader or the membership;
    // `metrics()` is sent on every turn of openraft's loop, thousands of times a second on a
    // busy leader.
    let mut metrics = raft.server_metrics();
    // The term this member last stood in, if no leader has been seen since.
    let mut stood_in: Option<u64> = None;
    loop {
        let (state, term, led) = {
            let m = metrics.borrow_and_update();
            (
                m.state,
                m.vote.leader_id().get_term(),
                m.current_leader.is_some(),
            )
        };
        if led {
            stood_in = None;
        } else if state == ServerState::Candidate && stood_in != Some(term) {
            if stood_in.is_some() && may_stand() {
                let pause_ms = C::AsyncRuntime::thread_rng().gen_range(0..pause_max_ms);
                tracing::info!(
                    term,
                    pause_ms,
                    "standing again with no leader elected (a split vote): not standing on this \
                     member's timer for a while, still voting"
                );
                raft.runtime_config().elect(false);
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                if may_stand() {
                    raft.runtime_config().elect(true);
                }
            }
            stood_in = Some(term);
        }
        if metrics.changed().await.is_err() {
            return; // Raft stopped.
        }
    }
}

//! Moving leadership to a chosen member for maintenance (`haven admin cluster
//! transfer-leader`). openraft 0.9 has no call for it, so the leader steers an election:
//!
//! 1. It stops serving (clients fail over) and will not serve this term again.
//! 2. It waits until the target holds its whole log (at most `CATCH_UP_WAIT_MS`), then stops
//!    its heartbeats: with no client writes and no heartbeats, nothing else reaches the
//!    followers.
//! 3. It waits out openraft's leader lease (the maximum election timeout), after which the
//!    followers grant votes again, and tells the target to stand at once. The others would
//!    stand only a full election timeout later, so the target, holding every entry, wins.
//! 4. It waits to see the target lead. If the target cannot win (unreachable, or another
//!    member stood first), heartbeats resume and whoever leads serves: the group is never left
//!    without a leader for longer than an ordinary election.
//!
//! Nothing is lost either way: what the old leader had not had committed was never receipted,
//! and failover clients resend it (producer sequences drop what did get committed).

use crate::admin::AdminResponse;
use crate::leader::Lost;
use crate::types::{NodeId, Raft};
use openraft::ServerState;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bound on the target catching up with the leader's log before it is told to stand.
pub const CATCH_UP_WAIT_MS: u64 = 10_000;
/// How often the leader looks at its replication metrics meanwhile.
const POLL_MS: u64 = 5;
/// Elections the target is given to win, in maximum election timeouts.
const ELECTIONS_WAITED: u64 = 5;

/// Which term this member serves, and which one it handed over (and must not serve again).
#[derive(Default)]
pub(crate) struct Handover {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    serving: Option<(u64, Lost)>,
    surrendered: Option<u64>,
}

impl Handover {
    /// The broker serves as leader of `term` until `lost` fires.
    pub fn serving(&self, term: u64, lost: Lost) {
        self.state.lock().unwrap().serving = Some((term, lost));
    }

    pub fn stopped_serving(&self) {
        self.state.lock().unwrap().serving = None;
    }

    /// The term the broker serves in, if it serves.
    pub fn serving_term(&self) -> Option<u64> {
        self.state.lock().unwrap().serving.as_ref().map(|(t, _)| *t)
    }

    /// Whether leadership of `term` is being handed over: the member must not serve in it.
    pub fn surrendered(&self, term: u64) -> bool {
        self.state.lock().unwrap().surrendered == Some(term)
    }

    fn surrender(&self, term: u64, reason: String) {
        let mut s = self.state.lock().unwrap();
        s.surrendered = Some(term);
        if let Some((t, lost)) = &s.serving {
            if *t == term {
                lost.fire(reason);
            }
        }
    }

    fn resume(&self) {
        self.state.lock().unwrap().surrendered = None;
    }
}

/// The group's timing, from `[ha]`.
#[derive(Clone, Copy)]
pub(crate) struct Timing {
    pub election_timeout_ms: u64,
}

impl Timing {
    /// openraft's leader lease: its maximum election timeout (`node.rs` sets it to twice the
    /// configured one).
    fn lease_ms(self) -> u64 {
        2 * self.election_timeout_ms
    }
}

/// Hands leadership to `to` (or to the voter that holds most of the log). Run on the leader.
pub(crate) async fn transfer(
    raft: &Raft,
    handover: &Handover,
    to: Option<NodeId>,
    timing: Timing,
) -> AdminResponse {
    let m = raft.metrics().borrow().clone();
    assert_eq!(m.state, ServerState::Leader, "checked by the caller");
    let term = m.current_term;
    let membership = m.membership_config.membership().clone();
    let matched = |id: NodeId| {
        m.replication
            .as_ref()
            .and_then(|r| r.get(&id).copied().flatten())
            .map(|l| l.index)
    };
    let is_witness = |id: NodeId| membership.get_node(&id).is_some_and(|n| n.witness);
    let target = match to {
        Some(id) if id == m.id => {
            return AdminResponse::Failed(format!("member {id} already leads"));
        }
        Some(id) if !membership.voter_ids().any(|v| v == id) => {
            return AdminResponse::Failed(format!("member {id} is not a voter"));
        }
        Some(id) if is_witness(id) => {
            return AdminResponse::Failed(format!("member {id} is a witness: it never leads"));
        }
        Some(id) => id,
        None => match membership
            .voter_ids()
            .filter(|&v| v != m.id && !is_witness(v))
            .max_by_key(|&v| matched(v))
        {
            Some(id) => id,
            None => return AdminResponse::Failed("no other voter to lead".into()),
        },
    };
    let addr = membership
        .get_node(&target)
        .expect("a voter is a member")
        .raft
        .clone();
    handover.surrender(term, format!("handing leadership to member {target}"));
    let outcome = steer(raft, term, target, &addr, timing).await;
    raft.runtime_config().heartbeat(true);
    handover.resume();
    match outcome {
        Ok(done) => {
            tracing::info!(target, "{done}");
            AdminResponse::Done(done)
        }
        Err(why) => {
            tracing::warn!(target, "leadership transfer failed: {why}");
            AdminResponse::Failed(why)
        }
    }
}

async fn steer(
    raft: &Raft,
    term: u64,
    target: NodeId,
    addr: &str,
    timing: Timing,
) -> Result<String, String> {
    let mut metrics = raft.metrics();
    let deadline = Instant::now() + Duration::from_millis(CATCH_UP_WAIT_MS);
    loop {
        let m = metrics.borrow_and_update().clone();
        if m.state != ServerState::Leader || m.current_term != term {
            return Err(format!("leadership of term {term} was lost meanwhile"));
        }
        let held = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&target).copied().flatten())
            .map(|l| l.index);
        if held.is_some() && held == m.last_log_index {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "member {target} did not catch up within {CATCH_UP_WAIT_MS} ms \
                 (holds {held:?} of {:?})",
                m.last_log_index
            ));
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
    // Heartbeats stop only now: while the target caught up they kept the others from
    // standing. No client writes and no heartbeats: nothing more reaches the followers, so
    // the target still holds the whole log, and every follower heard from this leader last
    // at about now. A quarter of the shortest election timeout past the lease they grant
    // votes, and none stands of its own accord.
    raft.runtime_config().heartbeat(false);
    let wait = timing.lease_ms() + timing.election_timeout_ms / 4;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    crate::client::elect(addr, term)
        .await
        .map_err(|e| format!("telling member {target} to stand: {e}"))?;
    let deadline = Instant::now() + Duration::from_millis(ELECTIONS_WAITED * timing.lease_ms());
    loop {
        {
            let m = metrics.borrow_and_update();
            match m.current_leader {
                Some(l) if l == target && m.current_term > term => {
                    return Ok(format!("member {target} leads in term {}", m.current_term))
                }
                Some(l) if m.current_term > term => {
                    return Err(format!(
                        "member {l} was elected in term {} instead of {target}",
                        m.current_term
                    ))
                }
                _ => {}
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("member {target} was not elected in time"));
        }
        let _ = tokio::time::timeout(left, metrics.changed()).await;
    }
}

//! The witness: the third member of a group with two data brokers. It votes and acknowledges
//! entries, so either data broker plus the witness is a majority; but it keeps no message
//! bodies (its log stores each entry's id with an empty payload, its state journal stays empty,
//! a snapshot sent to it is read and discarded) and it never stands for election.
//!
//! The danger it brings: a witness holds only entry ids, so it cannot give a data broker the
//! entries that broker lacks. If data broker A led and its entries were committed by A and the
//! witness alone, then with A dead the witness must refuse to vote for B (B's log is shorter),
//! and the group waits for A. To keep that from happening in the normal case, the leader's
//! replication to the witness is *gated*: an append reaches the witness only once every other
//! data member holds its entries. While B is healthy, whatever the witness acknowledged B
//! holds too, so B can always be elected when A dies. Only if B is behind and has not moved
//! for an election timeout (down, stalled, or being sent a snapshot) does the witness
//! acknowledge alone, and A and the witness go on without B; if A dies before B has caught up
//! again, the group waits for A (two failures in a group of three; nothing committed is lost,
//! nothing splits).

use crate::types::{Command, Entry, NodeId};
use openraft::{EntryPayload, RaftMetrics};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub(crate) type Metrics = watch::Receiver<RaftMetrics<NodeId, crate::types::Member>>;

/// Drops what a witness must not keep: the records and releases of an entry (its id, and
/// membership changes, stay).
pub(crate) fn strip(entry: &mut Entry) {
    if let EntryPayload::Normal(Command::Records { .. } | Command::Release { .. }) = entry.payload {
        entry.payload = EntryPayload::Blank;
    }
}

/// Holds the leader's appends to a witness until the other data members have their entries.
pub(crate) struct Gate {
    /// The leader's own metrics, set once Raft has started (the network is made before it).
    metrics: Arc<OnceLock<Metrics>>,
    election_timeout_ms: u64,
    /// The least index the other data members hold, and since when: if it stops moving for an
    /// election timeout while they are behind, they are taken for down (or stalled).
    progress: Option<(Option<u64>, Instant)>,
}

impl Gate {
    pub fn new(metrics: Arc<OnceLock<Metrics>>, election_timeout_ms: u64) -> Gate {
        Gate {
            metrics,
            election_timeout_ms,
            progress: None,
        }
    }

    /// Returns once every data member but this leader holds entry `index`, or once what they
    /// hold has not moved for an election timeout (then at once, until it moves again).
    pub async fn admit(&mut self, index: u64) {
        let Some(metrics) = self.metrics.get() else {
            return;
        };
        let mut metrics = metrics.clone();
        loop {
            let held = {
                let m = metrics.borrow_and_update();
                let Some(matched) = &m.replication else {
                    return; // Not leading: nothing to hold back.
                };
                let membership = m.membership_config.membership();
                membership
                    .voter_ids()
                    .filter(|id| *id != m.id)
                    .filter(|id| membership.get_node(id).is_some_and(|n| !n.witness))
                    .map(|id| matched.get(&id).copied().flatten().map(|l| l.index))
                    .min()
                    .unwrap_or(Some(u64::MAX)) // No other data member: nothing to wait for.
            };
            let now = Instant::now();
            let since = match self.progress {
                Some((before, since)) if before == held => since,
                _ => {
                    self.progress = Some((held, now));
                    now
                }
            };
            if held.is_some_and(|h| h >= index) {
                return;
            }
            let deadline = since + Duration::from_millis(self.election_timeout_ms);
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return; // Behind and not moving: down or stalled.
            }
            if let Ok(Err(_)) = tokio::time::timeout(left, metrics.changed()).await {
                return; // Raft stopped.
            }
        }
    }
}

/// Where a witness receives a snapshot: nowhere. Only the meta (sent beside the data) is kept.
pub(crate) async fn discarding_file() -> std::io::Result<tokio::fs::File> {
    tokio::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .await
}

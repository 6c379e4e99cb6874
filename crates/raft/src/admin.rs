//! Admin requests on the Raft port: status, and membership changes made online
//! (`haven admin cluster status|add|remove|transfer-leader`).

use crate::handover::{Handover, Timing};
use crate::types::{Member, NodeId, Raft};
use openraft::{ChangeMembers, ServerState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AdminRequest {
    Status,
    /// Adds a member: first as a learner that catches up (from the log or a snapshot), then
    /// as a voter.
    Add {
        id: NodeId,
        member: Member,
    },
    /// Removes a voter (or learner). Removing the leader makes it step down once the change
    /// is committed.
    Remove {
        id: NodeId,
    },
    /// Moves leadership to member `to` (or to the voter holding most of the log), for
    /// maintenance of the current leader. See `handover.rs`.
    TransferLeader {
        to: Option<NodeId>,
    },
    /// Sent by a leader handing over to the member it hands over to: stand for election now,
    /// if still in `term`.
    Elect {
        term: u64,
    },
    /// Sent by the member that initialised a new group to each member it had found empty:
    /// nothing existed before, so the member (if still the process that answered, by
    /// `incarnation`) stops abstaining from votes (`repair.rs`).
    NewGroup {
        incarnation: u64,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub id: NodeId,
    /// `Leader`, `Follower`, `Candidate` or `Learner`: openraft's role. A member restarted from
    /// its disk can show `Leader` of the term it led before it stopped, until it hears of a
    /// later one; it does not serve in it (see `serving`).
    pub state: String,
    /// This member's broker serves clients as the leader of `term`: a majority confirmed the
    /// term (`ensure_linearizable`). At most one member of a group in the same term does.
    #[serde(default)]
    pub serving: bool,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub last_log_index: Option<u64>,
    pub last_applied_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    pub voters: BTreeMap<NodeId, Member>,
    pub learners: BTreeMap<NodeId, Member>,
    /// On the leader: the last log index each member is known to hold.
    pub matched: BTreeMap<NodeId, Option<u64>>,
    /// Drawn at random when the process starts: tells a restarted member from the process
    /// that answered before (see `AdminRequest::NewGroup`).
    #[serde(default)]
    pub incarnation: u64,
    /// Abstaining from votes until it has caught up: its log was damaged, or its data
    /// directory was empty when it started (`repair.rs`).
    #[serde(default)]
    pub repairing: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AdminResponse {
    Status(Status),
    Done(String),
    /// Membership changes are made by the leader; ask it.
    NotLeader {
        leader: Option<(NodeId, Member)>,
    },
    Failed(String),
}

pub struct Admin {
    pub raft: Raft,
    pub(crate) handover: std::sync::Arc<Handover>,
    pub(crate) timing: Timing,
    /// This member is a witness (`witness.rs`).
    pub(crate) witness: bool,
    /// Set while this member repairs a damaged log (`repair.rs`).
    pub(crate) repair: std::sync::Arc<crate::repair::Repair>,
    /// This process's `Status::incarnation`.
    pub incarnation: u64,
}

impl Admin {
    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let mut v = BTreeMap::new();
        let mut l = BTreeMap::new();
        for (id, node) in membership.nodes() {
            if voters.contains(id) {
                v.insert(*id, node.clone());
            } else {
                l.insert(*id, node.clone());
            }
        }
        let matched = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .map(|(id, log)| (*id, log.map(|l| l.index)))
                    .collect()
            })
            .unwrap_or_default();
        Status {
            id: m.id,
            state: format!("{:?}", m.state),
            serving: m.state == ServerState::Leader
                && self.handover.serving_term() == Some(m.current_term),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            last_applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            voters: v,
            learners: l,
            matched,
            incarnation: self.incarnation,
            repairing: self.repair.active(),
        }
    }

    fn not_leader(&self) -> Option<AdminResponse> {
        let m = self.raft.metrics().borrow().clone();
        if m.state == ServerState::Leader {
            return None;
        }
        let leader = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| (id, n.clone()))
        });
        Some(AdminResponse::NotLeader { leader })
    }

    pub async fn handle(&self, req: AdminRequest) -> AdminResponse {
        match req {
            AdminRequest::Status => AdminResponse::Status(self.status()),
            AdminRequest::Add { id, member } => {
                if let Some(r) = self.not_leader() {
                    return r;
                }
                tracing::info!(id, %member, "adding a member: catching it up as a learner");
                if let Err(e) = self.raft.add_learner(id, member.clone(), true).await {
                    return AdminResponse::Failed(format!("adding {id} as a learner: {e}"));
                }
                let voters = BTreeSet::from([id]);
                match self
                    .raft
                    .change_membership(ChangeMembers::AddVoterIds(voters), false)
                    .await
                {
                    Ok(r) => AdminResponse::Done(format!(
                        "member {id} ({member}) is a voter at log {}",
                        r.log_id
                    )),
                    Err(e) => AdminResponse::Failed(format!("making {id} a voter: {e}")),
                }
            }
            AdminRequest::TransferLeader { to } => {
                if let Some(r) = self.not_leader() {
                    return r;
                }
                crate::handover::transfer(&self.raft, &self.handover, to, self.timing).await
            }
            AdminRequest::Elect { term } => {
                if self.witness {
                    return AdminResponse::Failed("a witness never leads".into());
                }
                if self.repair.active() {
                    return AdminResponse::Failed(
                        "catching up a lost (damaged or wiped) raft log: not standing until caught up".into(),
                    );
                }
                let now = self.raft.metrics().borrow().current_term;
                if now != term {
                    return AdminResponse::Failed(format!(
                        "asked to stand in term {term}, but this member is in term {now}"
                    ));
                }
                tracing::info!(term, "standing for election: the leader hands over");
                match self.raft.trigger().elect().await {
                    Ok(()) => AdminResponse::Done(format!("standing after term {term}")),
                    Err(e) => AdminResponse::Failed(format!("cannot stand: {e}")),
                }
            }
            AdminRequest::NewGroup { incarnation } => {
                if incarnation != self.incarnation {
                    return AdminResponse::Failed(format!(
                        "this member restarted (incarnation {:x}, not {incarnation:x})",
                        self.incarnation
                    ));
                }
                match crate::repair::end_for_new_group(&self.raft, &self.repair, !self.witness) {
                    Ok(()) => AdminResponse::Done("votes in the new group".into()),
                    Err(e) => AdminResponse::Failed(format!("cannot remove the marker: {e}")),
                }
            }
            AdminRequest::Remove { id } => {
                if let Some(r) = self.not_leader() {
                    return r;
                }
                let m = self.raft.metrics().borrow().clone();
                let membership = m.membership_config.membership();
                let is_voter = membership.voter_ids().any(|v| v == id);
                let change = if is_voter {
                    ChangeMembers::RemoveVoters(BTreeSet::from([id]))
                } else if membership.get_node(&id).is_some() {
                    ChangeMembers::RemoveNodes(BTreeSet::from([id]))
                } else {
                    return AdminResponse::Failed(format!("{id} is not a member"));
                };
                tracing::info!(id, "removing a member");
                match self.raft.change_membership(change, false).await {
                    Ok(r) => {
                        AdminResponse::Done(format!("member {id} removed at log {}", r.log_id))
                    }
                    Err(e) => AdminResponse::Failed(format!("removing {id}: {e}")),
                }
            }
        }
    }
}

//! A member whose Raft log fails its checksum in the middle repairs from its peers.
//!
//! The damaged log cannot be trusted from the damage on, and the member may have acknowledged
//! entries there: a leader may have counted it toward a majority. Raft's quorums intersect only
//! if acknowledged entries stay on disk, so such a member must not vote (or stand) until it
//! holds again everything it might have acknowledged. While it abstains, no candidate lacking
//! a committed entry can win: the entry is on a majority counting this member, so every other
//! majority includes one of the members that still hold it, and they refuse.
//!
//! The repair:
//! 1. A marker file (`repairing`, phase "wiping") is written first, so a crash at any point
//!    resumes the repair rather than trusting half-removed data.
//! 2. The damaged log is set aside as `raft-log.damaged` (for the operator to inspect; the
//!    previous one is replaced), the state journal and snapshots are removed. The vote file is
//!    kept: it is small, replaced atomically, and forgetting it could mean voting twice in a
//!    term.
//! 3. The marker's phase becomes "catching-up", and the member starts as a wiped one does: the
//!    leader sends it the log or a snapshot. It refuses every vote request and never stands.
//! 4. Once the leader no longer counts entries this member lost (the leader's matched index
//!    for it is within its log) and it has applied everything the leader held at that moment,
//!    the marker is removed and the member votes again.
//!
//! If no leader can be elected without this member's vote (say, the damaged member and one
//! other are all that is left of three), the group waits, and the member logs why.

use crate::types::{NodeId, Raft};
use openraft::raft::VoteResponse;
use openraft::ServerState;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const MARKER: &str = "repairing";
const WIPING: &[u8] = b"wiping";
const CATCHING_UP: &[u8] = b"catching-up";
/// How often the repairing member asks the leader how far it must catch up.
const POLL_MS: u64 = 200;
/// How often it says why it is still not voting.
const EXPLAIN_MS: u64 = 10_000;

/// Whether this member is repairing (abstains from votes and elections).
pub(crate) struct Repair {
    active: AtomicBool,
    data_dir: PathBuf,
}

impl Repair {
    /// Finishes an interrupted wipe, if the marker says one was under way. Call before the
    /// log is opened.
    pub fn resume(data_dir: &Path) -> io::Result<Repair> {
        let active = match std::fs::read(data_dir.join(MARKER)) {
            Ok(phase) if phase == WIPING => {
                wipe(data_dir)?;
                true
            }
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        Ok(Repair {
            active: AtomicBool::new(active),
            data_dir: data_dir.to_path_buf(),
        })
    }

    /// Starts abstaining because this member's data directory is empty (`never_held_state`):
    /// it may be a new group's member, or one whose disk was lost or wiped. Wiped, it may have
    /// acknowledged entries it no longer holds, so it must not vote until it knows which:
    /// `unless_new_group` ends this at once for a new group, `watch` once it has caught up.
    pub fn begin_empty(&self) -> io::Result<()> {
        tracing::warn!(
            "the data directory holds no raft log: not voting until this member knows the \
             group is new or has caught up with a leader (its disk may have been lost with \
             entries it acknowledged)"
        );
        crate::files::write_atomically(&self.data_dir.join(MARKER), CATCHING_UP)?;
        self.active.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Starts a repair: the log at `data_dir` is damaged (`why`).
    pub fn begin(&self, why: &str) -> io::Result<()> {
        tracing::error!(
            "raft log damaged ({why}): setting it aside as raft-log.damaged and repairing from \
             the other members; this member will not vote until it has caught up"
        );
        crate::files::write_atomically(&self.data_dir.join(MARKER), WIPING)?;
        wipe(&self.data_dir)?;
        self.active.store(true, Ordering::SeqCst);
        Ok(())
    }

    pub fn active(&self) -> bool {
        self.active.load(Ordering::SeqCst)
    }

    /// Ends the repair. `Ok(false)` if it had already ended.
    fn finish(&self) -> io::Result<bool> {
        if !self.active() {
            return Ok(false);
        }
        match std::fs::remove_file(self.data_dir.join(MARKER)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        crate::files::sync_dir(&self.data_dir)?;
        Ok(self.active.swap(false, Ordering::SeqCst))
    }
}

/// Whether `data_dir` has never held this member's Raft state: no log, no vote, no repair
/// under way. Call before the log is opened (opening creates it).
pub(crate) fn never_held_state(data_dir: &Path) -> bool {
    ["raft-log", "vote", MARKER]
        .iter()
        .all(|name| !data_dir.join(name).exists())
}

/// Whether a member's status shows a group that has stored nothing yet: no entry beyond the
/// initial membership (index 0) and no snapshot.
fn holds_nothing(s: &crate::admin::Status) -> bool {
    s.last_log_index.is_none_or(|i| i == 0) && s.snapshot_index.is_none()
}

/// Ends the repair and lets this member stand again (unless it never does). `Ok(false)` if
/// the repair had already ended.
fn end(raft: &Raft, repair: &Repair, can_elect: bool) -> io::Result<bool> {
    let ended = repair.finish()?;
    if ended && can_elect {
        raft.runtime_config().elect(true);
    }
    Ok(ended)
}

/// Ends the repair (if under way) because the group is new: no member holds anything.
pub(crate) fn end_for_new_group(raft: &Raft, repair: &Repair, can_elect: bool) -> io::Result<()> {
    if end(raft, repair, can_elect)? {
        tracing::info!("no member holds an entry yet: a new group; this member votes");
    }
    Ok(())
}

/// Runs while repairing: ends the repair at once if every other member (`peers`, their Raft
/// addresses) answers and none holds anything beyond the initial membership. Then the group
/// is new (or lost every disk): nothing was committed that this member could have
/// acknowledged and lost, and its vote may be needed to elect the first leader. Otherwise
/// `watch` ends it once this member has caught up.
pub(crate) async fn unless_new_group(
    raft: Raft,
    repair: std::sync::Arc<Repair>,
    peers: Vec<String>,
    can_elect: bool,
) {
    while repair.active() {
        let mut all_new = true;
        for addr in &peers {
            match crate::client::status(addr).await {
                Ok(s) if holds_nothing(&s) => {}
                _ => {
                    all_new = false;
                    break;
                }
            }
        }
        if all_new {
            match end_for_new_group(&raft, &repair, can_elect) {
                Ok(()) => return,
                Err(e) => tracing::error!("repair: cannot remove the marker: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Sets the damaged log aside, removes the state it fed, and moves the marker on.
fn wipe(data_dir: &Path) -> io::Result<()> {
    let log = data_dir.join("raft-log");
    let aside = data_dir.join("raft-log.damaged");
    if log.exists() {
        if aside.exists() {
            std::fs::remove_dir_all(&aside)?;
        }
        std::fs::rename(&log, &aside)?;
    }
    for dir in ["state", "state.new", "state.old", "snapshots"] {
        let path = data_dir.join(dir);
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
    }
    crate::files::sync_dir(data_dir)?;
    crate::files::write_atomically(&data_dir.join(MARKER), CATCHING_UP)
}

/// The answer to a vote request while repairing: refused, with this member's vote unchanged.
pub(crate) fn refusal(raft: &Raft) -> VoteResponse<NodeId> {
    let m = raft.metrics().borrow().clone();
    VoteResponse {
        vote: m.vote,
        vote_granted: false,
        // Not claimed: after the wipe this member's log says nothing about what was committed.
        last_log_id: None,
    }
}

/// Runs while repairing: ends the repair once this member holds everything the leader held
/// when the leader stopped counting this member's lost entries. Then it votes (and, unless a
/// witness, stands) again.
pub(crate) async fn watch(raft: Raft, repair: std::sync::Arc<Repair>, can_elect: bool) {
    let me = raft.metrics().borrow().id;
    let mut explained = Instant::now();
    // `(leader, term, index)`: what to hold, fixed once that leader stopped counting lost entries.
    let mut goal: Option<(NodeId, u64, u64)> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        if !repair.active() {
            return; // Ended by `unless_new_group`.
        }
        let m = raft.metrics().borrow().clone();
        let leader = m.current_leader.filter(|l| *l != me).and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| (l, n.raft.clone()))
        });
        if goal.is_some_and(|(l, term, _)| {
            Some(l) != leader.as_ref().map(|(l, _)| *l) || term != m.current_term
        }) {
            goal = None; // The leader changed: ask the new one.
        }
        if goal.is_none() {
            if let Some((l, addr)) = &leader {
                if let Ok(s) = crate::client::status(addr).await {
                    // The leader's view of this member is within what it now holds: it no
                    // longer counts entries this member lost.
                    let honest = s
                        .matched
                        .get(&me)
                        .is_some_and(|x| x.is_some() && *x <= m.last_log_index);
                    if s.state == format!("{:?}", ServerState::Leader)
                        && s.term == m.current_term
                        && honest
                    {
                        goal = s.last_log_index.map(|i| (*l, s.term, i));
                    }
                }
            }
        }
        if let Some((l, _, index)) = goal {
            if m.last_applied.is_some_and(|a| a.index >= index) {
                match end(&raft, &repair, can_elect) {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        tracing::error!("repair: cannot remove the marker: {e}");
                        continue;
                    }
                }
                tracing::info!(
                    leader = l,
                    index,
                    "raft log repaired from the other members: this member votes again"
                );
                return;
            }
        }
        if explained.elapsed() >= Duration::from_millis(EXPLAIN_MS) {
            explained = Instant::now();
            tracing::warn!(
                leader = ?leader.map(|(l, _)| l),
                applied = ?m.last_applied.map(|l| l.index),
                goal = ?goal.map(|(_, _, i)| i),
                "catching up a lost (damaged or wiped) raft log: not voting until caught up \
                 with a leader; if no leader can be elected without this member, the group \
                 waits for the members that hold the lost entries"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn populated(dir: &Path) {
        for sub in ["raft-log", "state", "snapshots"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            std::fs::write(dir.join(sub).join("x"), sub).unwrap();
        }
        std::fs::write(dir.join("vote"), "v").unwrap();
    }

    #[test]
    fn a_repair_sets_the_log_aside_wipes_the_state_and_keeps_the_vote() {
        let dir = tempfile::tempdir().unwrap();
        populated(dir.path());
        let repair = Repair::resume(dir.path()).unwrap();
        assert!(!repair.active(), "no marker: no repair");
        repair.begin("test damage").unwrap();
        assert!(repair.active());
        let d = dir.path();
        assert_eq!(
            std::fs::read_to_string(d.join("raft-log.damaged/x")).unwrap(),
            "raft-log"
        );
        assert!(!d.join("raft-log").exists());
        assert!(!d.join("state").exists() && !d.join("snapshots").exists());
        assert_eq!(std::fs::read_to_string(d.join("vote")).unwrap(), "v");
        assert_eq!(std::fs::read(d.join(MARKER)).unwrap(), CATCHING_UP);
        // Restarted while catching up: still repairing, and what it has caught up is kept.
        populated(d);
        let again = Repair::resume(d).unwrap();
        assert!(again.active());
        assert!(d.join("raft-log/x").exists() && d.join("state/x").exists());
        again.finish().unwrap();
        assert!(!again.active() && !d.join(MARKER).exists());
        assert!(!Repair::resume(d).unwrap().active());
    }

    /// An empty directory abstains, and the abstention survives a restart until it ends;
    /// ending it twice (two of the ways racing) is harmless.
    #[test]
    fn an_empty_directory_abstains_until_the_repair_ends() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(never_held_state(d));
        let repair = Repair::resume(d).unwrap();
        assert!(!repair.active());
        repair.begin_empty().unwrap();
        assert!(repair.active() && !never_held_state(d));
        assert_eq!(std::fs::read(d.join(MARKER)).unwrap(), CATCHING_UP);
        assert!(
            Repair::resume(d).unwrap().active(),
            "restarted: still abstains"
        );
        assert!(repair.finish().unwrap());
        assert!(!repair.finish().unwrap(), "already ended");
        assert!(!Repair::resume(d).unwrap().active());
        std::fs::create_dir_all(d.join("raft-log")).unwrap();
        assert!(!never_held_state(d), "a log: not empty");
    }

    #[test]
    fn only_a_member_with_nothing_beyond_the_initial_membership_holds_nothing() {
        let status = |last_log_index, snapshot_index| crate::admin::Status {
            last_log_index,
            snapshot_index,
            ..Default::default()
        };
        assert!(holds_nothing(&status(None, None)));
        assert!(holds_nothing(&status(Some(0), None)));
        assert!(!holds_nothing(&status(Some(1), None)));
        assert!(!holds_nothing(&status(None, Some(40))));
    }

    #[test]
    fn a_crash_in_the_middle_of_the_wipe_finishes_it_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        populated(d);
        // The marker was written, then the process died before (or while) wiping.
        crate::files::write_atomically(&d.join(MARKER), WIPING).unwrap();
        let repair = Repair::resume(d).unwrap();
        assert!(repair.active());
        assert!(d.join("raft-log.damaged/x").exists());
        assert!(!d.join("raft-log").exists() && !d.join("state").exists());
        assert_eq!(std::fs::read(d.join(MARKER)).unwrap(), CATCHING_UP);
    }
}

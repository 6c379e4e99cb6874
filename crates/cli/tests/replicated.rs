//! Shared-nothing replication with real `haven` processes (`[ha] mode = "replicated"`): each
//! member has its own data directory; the Raft leader serves, the others do not listen.
//!
//! 1. The leader is killed with `kill -9` again and again under load; each time another member
//!    leads and the killed one is started again and catches up. Exactly once holds.
//! 2. The leader is frozen (SIGSTOP) while a client waits on it; the others elect a new leader;
//!    the old one, resumed, acknowledges nothing it did not get committed.
//! 3. A member's data directory is wiped while the others go on (snapshots purge their logs),
//!    and it rejoins: it catches up from a streamed snapshot, and its state journal holds the
//!    same records at the same LSNs as the leader's.
//! 4. Membership changes under load: a fourth member is added (it catches up as a learner, then
//!    votes), then the leader itself is removed; exactly once holds throughout.
//! 5. A rolling restart under load: each member in turn (the leader too) is stopped gracefully,
//!    started again and caught up; exactly once holds.
//! 6. Leadership is transferred under load, to a named member and then to whichever holds most
//!    of the log; each time that member leads, the old leader stops serving, and exactly once
//!    holds. A transfer to the leader itself or to a non-member is refused; one to a member
//!    that is down fails, and a leader serves again.
//! 7. Two data brokers and a witness: the leader is killed under load again and again and the
//!    other data broker always takes over (the witness's acknowledgements wait for it);
//!    either the other data broker or the witness can be down while the leader goes on; the
//!    witness's files never hold a message body. Exactly once.
//! 8. Damaged journals under load: a follower's Raft log fails its checksum in the middle (it
//!    sets the log aside, catches up from the others without voting, then votes again), and
//!    another follower's state journal does (it is rebuilt from the snapshot and the log). The
//!    leader is then killed and one of the repaired members leads. Exactly once, and both hold
//!    the leader's records.
//! 9. Five members, each in its own network namespace: the leader and one follower are cut off
//!    from the other three by the kernel's firewall. The minority accepts nothing (a SEND to
//!    the cut-off leader is never receipted, and it stops serving); the majority elects a
//!    leader and goes on; once healed, every member holds the majority's records, LSN by LSN.
//!
//! Kill intervals are random but seeded (printed; HAVEN_RAFT_SEED replays them).

#[path = "support/group.rs"]
mod group;
#[path = "support/traffic.rs"]
mod traffic;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use group::*;
use haven_client::{ConnectOptions, Connection};
use haven_testkit::{free_addr, BrokerOpts, BrokerProcess, NetLab, Peer};
use rand::{Rng, SeedableRng};
use tokio::sync::Mutex;
use traffic::*;

const QUEUE: &str = "/queue/replicated";
const KILL_AFTER_MS: std::ops::Range<u64> = 300..1_000;
/// Generous for debug builds on a loaded 2-core machine: a slow follower fsync must not look
/// like a dead leader. (Failover time is measured in release builds, in the benchmark.)
const TIMING: &str = "heartbeat_ms = 200\nelection_timeout_ms = 800\n";
const CATCH_UP_WAIT_MS: u64 = 60_000;

#[derive(Clone, Copy)]
struct Spec {
    id: u64,
    raft: SocketAddr,
    /// Where it would serve; a witness never does (nothing listens there).
    stomp: SocketAddr,
    witness: bool,
}

fn config(me: u64, members: &[Spec], extra_ha: &str) -> String {
    let mut s = format!(
        "[broker]\nname = \"r{me}\"\n\n[ha]\nmode = \"replicated\"\nnode_id = {me}\n\
         cluster_name = \"test\"\n{TIMING}{extra_ha}\n"
    );
    for m in members {
        s += &format!("[[ha.members]]\nid = {}\nraft = \"{}\"\n", m.id, m.raft);
        if m.witness {
            s += "witness = true\n\n";
        } else {
            s += &format!("stomp = \"{}\"\n\n", m.stomp);
        }
    }
    s
}

fn specs(n: u64) -> Vec<Spec> {
    (1..=n)
        .map(|id| Spec {
            id,
            raft: free_addr(),
            stomp: free_addr(),
            witness: false,
        })
        .collect()
}

fn opts(dir: &std::path::Path, me: &Spec, members: &[Spec], extra_ha: &str) -> BrokerOpts {
    let mut o = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.join(format!("r{}", me.id)),
        me.stomp,
    );
    o.config_toml = Some(config(me.id, members, extra_ha));
    o
}

/// Starts `members` (all of them) and waits for a leader.
fn start_cluster(dir: &std::path::Path, members: &[Spec], extra_ha: &str) -> Vec<BrokerProcess> {
    let mut brokers: Vec<BrokerProcess> = members
        .iter()
        .map(|m| BrokerProcess::spawn(opts(dir, m, members, extra_ha)).expect("member starts"))
        .collect();
    wait_master(&mut brokers);
    brokers
}

fn status(raft: SocketAddr) -> Option<haven_raft::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(haven_raft::client::status(&raft.to_string()))
        .ok()
}

/// Waits until member `raft` has applied what the leader at `leader_raft` had applied when
/// the wait began; fails after `CATCH_UP_WAIT_MS`, saying how far each got. The target does
/// not move: under traffic a live follower is always a few entries behind the leader, and
/// sampling both until they matched could miss for as long as the traffic lasted.
fn try_wait_caught_up(raft: SocketAddr, leader_raft: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_millis(CATCH_UP_WAIT_MS);
    let mut target = None;
    loop {
        let theirs = status(leader_raft);
        if target.is_none() {
            target = theirs.as_ref().and_then(|s| s.last_applied_index);
        }
        let member = status(raft);
        let applied = member.as_ref().and_then(|s| s.last_applied_index);
        if target.is_some() && applied >= target {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "member {raft} did not catch up: {applied:?} < {target:?}\n\
                 its status: {member:?}\nthe leader's: {theirs:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// [`try_wait_caught_up`], panicking on failure.
fn wait_caught_up(raft: SocketAddr, leader_raft: SocketAddr) {
    try_wait_caught_up(raft, leader_raft).unwrap_or_else(|e| panic!("{e}"));
}

/// [`try_wait_caught_up`], panicking on failure with the tails of the members' logs.
fn wait_caught_up_or_logs(b: &[BrokerProcess], raft: SocketAddr, leader_raft: SocketAddr) {
    try_wait_caught_up(raft, leader_raft).unwrap_or_else(|e| panic!("{e}\n{}", logs(b)));
}

/// How long the leader's applied index must stay still for the group to count as quiet.
const QUIET_MS: u64 = 500;

/// Waits until the leader at `leader_raft` has applied nothing new for `QUIET_MS` (trailing
/// records, such as a closed subscription's, have landed) and every member of `rafts` has
/// applied what it has: then their state journals can be compared.
fn wait_quiet_and_caught_up(rafts: &[SocketAddr], leader_raft: SocketAddr) {
    let deadline = Instant::now() + Duration::from_millis(CATCH_UP_WAIT_MS);
    loop {
        let before = status(leader_raft).and_then(|s| s.last_applied_index);
        for &raft in rafts {
            wait_caught_up(raft, leader_raft);
        }
        std::thread::sleep(Duration::from_millis(QUIET_MS));
        if status(leader_raft).and_then(|s| s.last_applied_index) == before {
            return;
        }
        assert!(Instant::now() < deadline, "the group never went quiet");
    }
}

/// `start_cluster` off the async threads.
async fn start(
    dir: &std::path::Path,
    members: &[Spec],
    extra_ha: &'static str,
) -> Vec<BrokerProcess> {
    let (dir, members) = (dir.to_path_buf(), members.to_vec());
    blocking(move || start_cluster(&dir, &members, extra_ha)).await
}

/// Waits for `n` more receipts than there are now.
async fn more_receipts(receipts: &std::sync::atomic::AtomicU64, n: u64) {
    wait_progress(
        receipts,
        receipts.load(std::sync::atomic::Ordering::Relaxed),
        n,
    )
    .await;
}

/// Something was sent, every SEND was confirmed, and exactly once held.
fn assert_exactly_once(report: &haven_testkit::Report, brokers: &[BrokerProcess]) {
    assert!(report.receipted > 0, "{report}");
    assert_eq!(report.unknown, 0, "every SEND was confirmed: {report}");
    assert!(report.is_ok(), "{report}\n{}", logs(brokers));
}

/// Failover traffic on `brokers` (receipted producers, two pipelined ones, a consumer), with
/// the brokers shared for the tasks that kill and restart them.
async fn under_load(
    brokers: Vec<BrokerProcess>,
) -> (
    Arc<Mutex<Vec<BrokerProcess>>>,
    Traffic,
    Vec<tokio::task::JoinHandle<Vec<String>>>,
) {
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let t = Traffic::start(&uri, QUEUE).await;
    let pipelined = t.spawn_pipelined(QUEUE, 2);
    (Arc::new(Mutex::new(brokers)), t, pipelined)
}

fn stop_all(brokers: &mut [BrokerProcess]) {
    for b in brokers.iter_mut() {
        if b.is_running() {
            b.stop().expect("member stops");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_killed_repeatedly_under_load_another_member_leads_exactly_once() {
    const KILLS: usize = 4;
    let seed = seed("HAVEN_RAFT_SEED");
    let dir = tempfile::tempdir().unwrap();
    let members = specs(3);
    let brokers = start(dir.path(), &members, "").await;
    let (report, mut b) = kill_masters_under_load(brokers, QUEUE, KILLS, KILL_AFTER_MS, seed).await;
    eprintln!("replicated, {KILLS} leader kills: {report}");
    if !report.is_ok() {
        eprintln!("{}", logs(&b));
    }
    assert_exactly_once(&report, &b);
    stop_all(&mut b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_acknowledges_nothing_after_another_member_leads() {
    const STORED: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let members = specs(3);
    let mut brokers = start(dir.path(), &members, "").await;
    let old = wait_master_async(&mut brokers).await;
    let conn = Connection::connect(&brokers[old].addr().to_string(), ConnectOptions::default())
        .await
        .expect("connect to the leader");
    for i in 0..STORED {
        conn.send_receipted(QUEUE, &[], format!("before-{i}"))
            .await
            .expect("stored");
    }
    brokers[old].sigstop().expect("SIGSTOP");
    // The other two elect a leader among themselves.
    let others: Vec<usize> = (0..brokers.len()).filter(|&i| i != old).collect();
    let new = tokio::task::block_in_place(|| wait_master_among(&mut brokers, &others));
    // The new leader stores something, so the old leader's log has a conflicting suffix to
    // meet when it wakes.
    let c2 = Connection::connect(&brokers[new].addr().to_string(), ConnectOptions::default())
        .await
        .expect("connect to the new leader");
    c2.send_receipted(QUEUE, &[], "on-the-new-leader")
        .await
        .expect("stored by the new leader");
    brokers[old].sigcont().expect("SIGCONT");
    // It wakes believing it leads; a SEND to it must not be receipted.
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        conn.send_receipted(QUEUE, &[], "after-losing-leadership"),
    )
    .await
    .expect("the old leader answers or closes");
    assert!(
        refused.is_err(),
        "a deposed leader receipted a SEND:\n{}",
        logs(&brokers)
    );
    let log = std::fs::read_to_string(brokers[old].log_path()).unwrap();
    assert!(log.contains("leadership lost"), "{log}");
    // Everything receipted is on the new leader, once, and the refused SEND is not.
    let (mut sub, got) = receive_bodies(&c2, QUEUE, STORED + 1).await;
    assert!(
        nothing_more(&mut sub).await,
        "an unreceipted SEND was stored"
    );
    let mut want: Vec<String> = (0..STORED).map(|i| format!("before-{i}")).collect();
    want.push("on-the-new-leader".into());
    assert_eq!(got, want);
    stop_all(&mut brokers);
}

/// Every record of a state journal, by LSN.
fn state_records(data_dir: &std::path::Path) -> Vec<(u64, Vec<u8>)> {
    let state = data_dir.join("state");
    let mut reader = haven_journal::Reader::open(&state).expect("state journal");
    let mut names: Vec<u64> = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".seg")?.parse().ok()
        })
        .collect();
    names.sort_unstable();
    let mut out = Vec::new();
    let mut lsn = *names.first().expect("a segment");
    while let Ok(p) = reader.read(lsn) {
        out.push((lsn, p));
        lsn += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_member_catches_up_from_a_snapshot_and_holds_the_same_records() {
    let dir = tempfile::tempdir().unwrap();
    let members = specs(3);
    // Small snapshots and a short log, so the wiped member cannot catch up from the log alone.
    let extra = "snapshot_entries = 50\n";
    let brokers = start(dir.path(), &members, extra).await;
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let brokers = Arc::new(Mutex::new(brokers));
    let t = Traffic::start(&uri, QUEUE).await;
    let receipts = t.receipts.clone();
    wait_progress(&receipts, 0, 50).await;
    // Kill a follower and wipe its data.
    let victim = {
        let mut b = brokers.lock().await;
        let leader = wait_master_async(&mut b).await;
        let victim = (leader + 1) % 3;
        b[victim].kill9().expect("kill -9");
        std::fs::remove_dir_all(b[victim].data_dir()).expect("wipe");
        victim
    };
    // The others go on without it, snapshotting and purging their logs.
    more_receipts(&receipts, 300).await;
    brokers.lock().await[victim]
        .respawn()
        .expect("respawn the wiped member");
    {
        let b = brokers.clone();
        let victim_raft = members[victim].raft;
        let rafts: Vec<SocketAddr> = members.iter().map(|m| m.raft).collect();
        blocking(move || {
            let mut b = b.blocking_lock();
            let leader = wait_master(&mut b);
            wait_caught_up_or_logs(&b, victim_raft, rafts[leader]);
        })
        .await;
    }
    let report = t.finish_exactly_once(Vec::new()).await;
    eprintln!("replicated, wiped member rejoined: {report}");
    let mut b = brokers.lock().await;
    assert!(report.is_ok(), "{report}\n{}", logs(&b));
    let log = std::fs::read_to_string(b[victim].log_path()).unwrap();
    assert!(log.contains("snapshot installed"), "{log}");
    // Quiet now: every member has applied everything; the wiped one's journal matches.
    let leader = wait_master_async(&mut b).await;
    let (victim_raft, leader_raft) = (members[victim].raft, members[leader].raft);
    blocking(move || wait_quiet_and_caught_up(&[victim_raft], leader_raft)).await;
    stop_all(&mut b);
    let theirs = state_records(b[victim].data_dir());
    let ours = state_records(b[leader].data_dir());
    assert!(!theirs.is_empty());
    let first = theirs[0].0.max(ours[0].0);
    let a: Vec<_> = theirs.iter().filter(|(l, _)| *l >= first).collect();
    let o: Vec<_> = ours.iter().filter(|(l, _)| *l >= first).collect();
    assert_eq!(
        a.len(),
        o.len(),
        "the rejoined member's journal has as many records"
    );
    assert!(
        a == o,
        "the rejoined member's records differ from the leader's"
    );
}

/// A member whose disk was lost must not vote before it has caught up: it may have
/// acknowledged entries the others lack. Here a stored message is held by the leader and by
/// the member that then loses its disk. With the leader down, the third member lacks the
/// message, and only the wiped member's vote could make it leader, losing the message. It
/// must not lead; once the leader is back, it leads and the message is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wiped_member_does_not_vote_before_it_has_caught_up() {
    // Several election timeouts (`TIMING`): time enough for an election to happen.
    const NO_LEADER_MS: u64 = 4_000;
    let dir = tempfile::tempdir().unwrap();
    let members = specs(3);
    let mut b = start(dir.path(), &members, "").await;
    let leader = wait_master_async(&mut b).await;
    let (behind, wiped) = ((leader + 1) % 3, (leader + 2) % 3);
    store_one(&mut b, "before".into()).await;
    // One member goes down; the leader and the other store the next message.
    tokio::task::block_in_place(|| b[behind].kill9()).expect("kill -9");
    store_one(&mut b, "held-by-two".into()).await;
    // The leader goes down, and the other member that holds the message loses its disk.
    tokio::task::block_in_place(|| {
        b[leader].kill9().expect("kill -9 the leader");
        b[wiped].kill9().expect("kill -9");
        std::fs::remove_dir_all(b[wiped].data_dir()).expect("wipe");
        b[behind]
            .respawn()
            .expect("respawn the member that lacks the message");
        b[wiped].respawn().expect("respawn the wiped member");
    });
    let deadline = Instant::now() + Duration::from_millis(NO_LEADER_MS);
    while Instant::now() < deadline {
        let serving = tokio::task::block_in_place(|| serving_among(&mut b, &[behind, wiped]));
        assert!(
            serving.is_empty(),
            "member {} leads without the stored message, elected by the wiped member:\n{}",
            members[behind].id,
            logs(&b)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(b[wiped].log_path()).unwrap();
    assert!(log.contains("not voting until"), "{log}");
    // The leader is back: it leads (the others lack entries it holds), and nothing is lost.
    tokio::task::block_in_place(|| b[leader].respawn()).expect("respawn the leader");
    let now = wait_master_async(&mut b).await;
    assert_eq!(now, leader, "{}", logs(&b));
    let conn = Connection::connect(&b[now].addr().to_string(), ConnectOptions::default())
        .await
        .expect("connect to the leader");
    let (mut sub, got) = receive_bodies(&conn, QUEUE, 2).await;
    assert_eq!(got, ["before", "held-by-two"]);
    assert!(nothing_more(&mut sub).await);
    drop(sub);
    // The wiped member catches up and votes again.
    tokio::task::block_in_place(|| wait_logged(&b[wiped], "this member votes again"));
    stop_all(&mut b);
}

/// Every member of a new group starts with an empty data directory, so each abstains from
/// voting at first (it cannot tell a new group from a lost disk); seeing that no member holds
/// anything yet, it votes, and the group elects its first leader. A member that looks only
/// after the leader has written abstains until it has caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_group_elects_a_leader_though_its_empty_members_abstain_at_first() {
    let dir = tempfile::tempdir().unwrap();
    let members = specs(3);
    let mut b = start(dir.path(), &members, "").await;
    let leader = wait_master_async(&mut b).await;
    let log = std::fs::read_to_string(b[leader].log_path()).unwrap();
    assert!(
        log.contains("the data directory holds no raft log"),
        "{log}"
    );
    store_one(&mut b, "stored".into()).await;
    tokio::task::block_in_place(|| {
        for m in &b {
            let deadline = Instant::now() + Duration::from_millis(CATCH_UP_WAIT_MS);
            loop {
                let log = std::fs::read_to_string(m.log_path()).unwrap_or_default();
                if log.contains("a new group; this member votes")
                    || log.contains("this member votes again")
                {
                    break;
                }
                assert!(Instant::now() < deadline, "never votes:\n{log}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    });
    stop_all(&mut b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_added_and_the_leader_removed_under_load_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let all = specs(4);
    let first_three = all[..3].to_vec();
    let mut brokers = start(dir.path(), &first_three, "").await;
    // The fourth member knows all four; the others learn of it from the log.
    let fourth = BrokerProcess::spawn(opts(dir.path(), &all[3], &all, "")).expect("fourth starts");
    brokers.push(fourth);
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let t = Traffic::start(&uri, QUEUE).await;
    let receipts = t.receipts.clone();
    wait_progress(&receipts, 0, 50).await;
    let any = all[0].raft.to_string();
    let done = haven_raft::client::change(
        &any,
        haven_raft::AdminRequest::Add {
            id: 4,
            member: haven_raft::Member::data(all[3].raft.to_string(), all[3].stomp.to_string()),
        },
    )
    .await
    .expect("add member 4");
    eprintln!("{done}");
    more_receipts(&receipts, 50).await;
    let leader = wait_master_async(&mut brokers).await;
    let leader_id = all[leader].id;
    let done = haven_raft::client::change(&any, haven_raft::AdminRequest::Remove { id: leader_id })
        .await
        .expect("remove the leader");
    eprintln!("{done}");
    // Another member leads; the removed one stops serving.
    let deadline = Instant::now() + Duration::from_millis(TAKEOVER_WAIT_MS);
    loop {
        let now = wait_master_async(&mut brokers).await;
        if now != leader {
            break;
        }
        assert!(Instant::now() < deadline, "the removed leader still leads");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = haven_raft::client::status(&all[3].raft.to_string())
        .await
        .expect("status of member 4");
    assert!(s.voters.contains_key(&4), "{s:?}");
    assert!(!s.voters.contains_key(&leader_id), "{s:?}");
    let report = t.finish_exactly_once(Vec::new()).await;
    eprintln!("replicated, member added and leader removed: {report}");
    assert!(report.is_ok(), "{report}\n{}", logs(&brokers));
    stop_all(&mut brokers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_of_every_member_under_load_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let members = specs(3);
    let brokers = start(dir.path(), &members, "").await;
    let (brokers, t, pipelined) = under_load(brokers).await;
    let receipts = t.receipts.clone();
    // One member at a time, the leader among them: stop it gracefully, start it again, and
    // wait until it has caught up before the next, as an operator upgrading the group would.
    for i in 0..members.len() {
        more_receipts(&receipts, 20).await;
        let b = brokers.clone();
        let rafts: Vec<SocketAddr> = members.iter().map(|m| m.raft).collect();
        blocking(move || {
            let mut b = b.blocking_lock();
            let status = b[i].stop().expect("member stops");
            assert!(
                status.success(),
                "member {i} did not stop cleanly: {status}"
            );
            let leader = wait_master(&mut b);
            b[i].respawn().expect("member starts again");
            wait_caught_up_or_logs(&b, rafts[i], rafts[leader]);
        })
        .await;
    }
    let report = t.finish_exactly_once(pipelined).await;
    eprintln!("replicated, rolling restart: {report}");
    let mut b = brokers.lock().await;
    assert_exactly_once(&report, &b);
    stop_all(&mut b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_cut_off_with_a_minority_accepts_nothing_and_the_majority_goes_on() {
    const MEMBERS: usize = 5;
    const STORED: usize = 20;
    const RAFT_PORT: u16 = 61700;
    // Declared first, dropped last: the brokers leave its namespaces before they go.
    let Some(mut lab) = NetLab::for_test(
        "a_leader_cut_off_with_a_minority_accepts_nothing_and_the_majority_goes_on",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let hosts: Vec<_> = (0..MEMBERS)
        .map(|_| lab.add_host().expect("lab host"))
        .collect();
    let members: Vec<Spec> = hosts
        .iter()
        .zip(1..)
        .map(|(&h, id)| Spec {
            id,
            raft: SocketAddr::from((lab.addr(Peer::Host(h)), RAFT_PORT)),
            stomp: lab.stomp_addr(h),
            witness: false,
        })
        .collect();
    let mut brokers: Vec<BrokerProcess> = hosts
        .iter()
        .zip(&members)
        .map(|(&h, m)| {
            let mut o = lab.broker_opts(
                h,
                env!("CARGO_BIN_EXE_haven"),
                dir.path().join(format!("r{}", m.id)),
            );
            o.config_toml = Some(config(m.id, &members, ""));
            BrokerProcess::spawn(o).expect("member starts in its namespace")
        })
        .collect();
    let old = wait_master_async(&mut brokers).await;
    let conn = Connection::connect(&brokers[old].addr().to_string(), ConnectOptions::default())
        .await
        .expect("connect to the leader");
    for i in 0..STORED {
        conn.send_receipted(QUEUE, &[], format!("before-{i}"))
            .await
            .expect("stored");
    }
    // The leader and the next member on one side, the other three on the other. The tester
    // still reaches everyone.
    let minority = [old, (old + 1) % MEMBERS];
    let majority: Vec<usize> = (0..MEMBERS).filter(|i| !minority.contains(i)).collect();
    tokio::task::block_in_place(|| {
        for &a in &minority {
            for &b in &majority {
                lab.partition(Peer::Host(hosts[a]), Peer::Host(hosts[b]))
                    .expect("cut");
            }
        }
    });
    // A SEND to the cut-off leader, while it still believes it leads: it cannot reach a quorum.
    let minority_send = {
        let conn = conn.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                Duration::from_secs(30),
                conn.send_receipted(QUEUE, &[], "on-the-minority"),
            )
            .await
        })
    };
    // The majority elects one of its own.
    let new = tokio::task::block_in_place(|| wait_master_among(&mut brokers, &majority));
    let c2 = Connection::connect(&brokers[new].addr().to_string(), ConnectOptions::default())
        .await
        .expect("connect to the majority's leader");
    for i in 0..STORED {
        c2.send_receipted(QUEUE, &[], format!("majority-{i}"))
            .await
            .expect("stored by the majority");
    }
    let refused = minority_send.await.expect("send task");
    assert!(
        !matches!(refused, Ok(Ok(()))),
        "the cut-off leader receipted a SEND:\n{}",
        logs(&brokers)
    );
    // The minority steps down and serves no one while cut off.
    let deadline = Instant::now() + Duration::from_millis(TAKEOVER_WAIT_MS);
    while !tokio::task::block_in_place(|| serving_among(&mut brokers, &minority)).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the minority still serves:\n{}",
            logs(&brokers)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(brokers[old].log_path()).unwrap();
    assert!(log.contains("leadership lost"), "{log}");
    // What `haven admin cluster status` tells an operator now: only the majority's leader
    // serves, though the cut-off one may still be openraft's leader of its own term.
    let rafts: Vec<SocketAddr> = members.iter().map(|m| m.raft).collect();
    let statuses = blocking(move || rafts.into_iter().map(status).collect::<Vec<_>>()).await;
    let serving: Vec<usize> = (0..MEMBERS)
        .filter(|&i| statuses[i].as_ref().is_some_and(|s| s.serving))
        .collect();
    assert_eq!(serving, vec![new], "statuses: {statuses:#?}");
    println!(
        "the cut-off leader's status: {:?}",
        statuses[old]
            .as_ref()
            .map(|s| (&s.state, s.term, s.serving))
    );
    // Healed, the old leader's uncommitted entry gives way to the majority's log.
    tokio::task::block_in_place(|| lab.heal()).expect("heal");
    let leader_raft = members[new].raft;
    for m in &members {
        let raft = m.raft;
        blocking(move || wait_caught_up(raft, leader_raft)).await;
    }
    let (mut sub, got) = receive_bodies(&c2, QUEUE, 2 * STORED).await;
    assert!(
        nothing_more(&mut sub).await,
        "a SEND nobody receipted was stored"
    );
    let want: Vec<String> = (0..STORED)
        .map(|i| format!("before-{i}"))
        .chain((0..STORED).map(|i| format!("majority-{i}")))
        .collect();
    assert_eq!(got, want);
    drop(sub);
    // Every member, the two that were cut off too, holds the same records at the same LSNs.
    let leader_raft = members[wait_master_async(&mut brokers).await].raft;
    let rafts: Vec<SocketAddr> = members.iter().map(|m| m.raft).collect();
    blocking(move || wait_quiet_and_caught_up(&rafts, leader_raft)).await;
    stop_all(&mut brokers);
    let reference = state_records(brokers[new].data_dir());
    for &i in &minority {
        let theirs = state_records(brokers[i].data_dir());
        assert!(
            theirs == reference,
            "member {} (cut off) holds different records: {} against {}",
            members[i].id,
            theirs.len(),
            reference.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leadership_transferred_under_load_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let members = specs(3);
    let mut brokers = start(dir.path(), &members, "").await;
    let any = members[0].raft.to_string();
    let leader = wait_master_async(&mut brokers).await;
    for (bad, why) in [(members[leader].id, "already leads"), (9, "not a voter")] {
        let refused = haven_raft::client::change(
            &any,
            haven_raft::AdminRequest::TransferLeader { to: Some(bad) },
        )
        .await
        .expect_err("refused");
        assert!(refused.to_string().contains(why), "{refused}");
    }
    // A transfer to a member that is down fails, and the leader serves again.
    let down = (leader + 2) % 3;
    brokers[down].kill9().expect("kill -9");
    let failed = haven_raft::client::change(
        &any,
        haven_raft::AdminRequest::TransferLeader {
            to: Some(members[down].id),
        },
    )
    .await
    .expect_err("a member that is down cannot take over");
    // It held the whole log when it died (nothing was being written), so it is the call
    // telling it to stand that fails; had it been behind, the wait for it would have.
    let named = format!("member {}", members[down].id);
    assert!(failed.to_string().contains(&named), "{failed}");
    // The group is not left without a leader.
    let leader = wait_master_async(&mut brokers).await;
    brokers[down].respawn().expect("respawn");
    let (raft, leader_raft) = (members[down].raft, members[leader].raft);
    blocking(move || wait_caught_up(raft, leader_raft)).await;
    let uri = quick_failover(&brokers.iter().map(url_of).collect::<Vec<_>>());
    let t = Traffic::start(&uri, QUEUE).await;
    let pipelined = t.spawn_pipelined(QUEUE, 2);
    let receipts = t.receipts.clone();
    let named = members[(leader + 1) % 3].id;
    for to in [Some(named), None] {
        more_receipts(&receipts, 50).await;
        let before = wait_master_async(&mut brokers).await;
        let done =
            haven_raft::client::change(&any, haven_raft::AdminRequest::TransferLeader { to })
                .await
                .unwrap_or_else(|e| panic!("transfer to {to:?}: {e}\n{}", logs(&brokers)));
        eprintln!("{done}");
        let after = wait_master_async(&mut brokers).await;
        assert_ne!(after, before, "{done}");
        if let Some(id) = to {
            assert_eq!(members[after].id, id, "{done}");
        }
        assert!(
            done.contains(&format!("member {} leads", members[after].id)),
            "{done}"
        );
    }
    let report = t.finish_exactly_once(pipelined).await;
    eprintln!("replicated, two leadership transfers: {report}");
    assert_exactly_once(&report, &brokers);
    stop_all(&mut brokers);
}

/// Whether any file under `dir` contains `needle`.
fn files_contain(dir: &std::path::Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().any(|e| {
        let path = e.unwrap().path();
        if path.is_dir() {
            files_contain(&path, needle)
        } else {
            let bytes = std::fs::read(&path).unwrap_or_default();
            bytes.windows(needle.len()).any(|w| w == needle)
        }
    })
}

/// Sends one receipted message to whichever data broker leads; panics if none takes it.
async fn store_one(brokers: &mut Vec<BrokerProcess>, body: String) {
    let leader = wait_master_async(brokers).await;
    let conn = Connection::connect(
        &brokers[leader].addr().to_string(),
        ConnectOptions::default(),
    )
    .await
    .expect("connect to the leader");
    conn.send_receipted(QUEUE, &[], body)
        .await
        .unwrap_or_else(|e| panic!("the leader stored nothing: {e}\n{}", logs(brokers)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_data_brokers_and_a_witness_fail_over_exactly_once_and_the_witness_keeps_no_bodies() {
    const KILLS: usize = 3;
    let seed = seed("HAVEN_RAFT_SEED");
    let dir = tempfile::tempdir().unwrap();
    let mut members = specs(3);
    members[2].witness = true;
    let brokers = start(dir.path(), &members, "").await;
    // The leader killed under load, again and again: the other data broker must take over
    // each time (a witness ahead of it would refuse it its vote). Two brokers and a witness
    // survive one failure at a time: the killed broker is caught up before the next kill.
    let (brokers, t, pipelined) = under_load(brokers).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(KILL_AFTER_MS))).await;
        let b = brokers.clone();
        let rafts: Vec<SocketAddr> = members.iter().map(|m| m.raft).collect();
        blocking(move || {
            let mut b = b.blocking_lock();
            let leader = wait_master(&mut b);
            b[leader].kill9().expect("kill -9");
            let next = wait_master(&mut b);
            assert_ne!(next, leader);
            b[leader].respawn().expect("respawn");
            wait_caught_up_or_logs(&b, rafts[leader], rafts[next]);
        })
        .await;
    }
    let report = t.finish_exactly_once(pipelined).await;
    let mut b = Arc::try_unwrap(brokers)
        .unwrap_or_else(|_| panic!("the kill tasks have finished"))
        .into_inner();
    eprintln!("2 data + witness, {KILLS} leader kills: {report}");
    assert_exactly_once(&report, &b);
    let witness_log = std::fs::read_to_string(b[2].log_path()).unwrap();
    assert!(
        !witness_log.contains("leader: serving clients"),
        "{witness_log}"
    );
    // Either data broker's partner may be down: the leader goes on with the witness...
    let leader = wait_master_async(&mut b).await;
    let other = 1 - leader;
    b[other].kill9().expect("kill -9 the other data broker");
    store_one(&mut b, "with-the-witness".into()).await;
    b[other].respawn().expect("respawn");
    // ...or with the other data broker while the witness is down.
    b[2].kill9().expect("kill -9 the witness");
    store_one(&mut b, "without-the-witness".into()).await;
    b[2].respawn().expect("respawn the witness");
    // A distinctive body, applied everywhere: on the data brokers' disks, not the witness's.
    let marker = format!("WITNESS-MUST-NOT-KEEP-{seed:x}-").repeat(64);
    store_one(&mut b, marker.clone()).await;
    let leader = wait_master_async(&mut b).await;
    for m in &members {
        let (raft, leader_raft) = (m.raft, members[leader].raft);
        blocking(move || wait_caught_up(raft, leader_raft)).await;
    }
    stop_all(&mut b);
    let other = 1 - leader;
    assert!(
        files_contain(b[other].data_dir(), marker.as_bytes()),
        "the other data broker holds the body (the check can see it)"
    );
    assert!(
        !files_contain(b[2].data_dir(), marker.as_bytes()),
        "the witness holds a message body"
    );
}

/// Flips a byte in the payload of the first record of journal `dir`'s first segment: damage
/// with valid records after it, which the journal reports as corrupt (not a torn tail).
fn damage_first_record(dir: &std::path::Path) {
    use std::os::unix::fs::FileExt;
    let mut segments: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let base = path
                .file_name()?
                .to_str()?
                .strip_suffix(".seg")?
                .parse()
                .ok()?;
            Some((base, path))
        })
        .collect();
    segments.sort();
    let (_, first) = segments.first().expect("a segment");
    let offset =
        haven_journal::SEGMENT_HEADER_BYTES + haven_journal::RECORD_HEADER_BYTES as u64 + 2;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(first)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], offset).unwrap();
}

/// Waits until `b`'s log contains `line`.
fn wait_logged(b: &BrokerProcess, line: &str) {
    let deadline = Instant::now() + Duration::from_millis(CATCH_UP_WAIT_MS);
    loop {
        let log = std::fs::read_to_string(b.log_path()).unwrap_or_default();
        if log.contains(line) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never logged {line:?}:\n{}",
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn damaged_journals_are_repaired_from_the_other_members_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let members = specs(3);
    let brokers = start(dir.path(), &members, "").await;
    let (brokers, t, pipelined) = under_load(brokers).await;
    let receipts = t.receipts.clone();
    let rafts: Vec<SocketAddr> = members.iter().map(|m| m.raft).collect();
    for journal in ["raft-log", "state"] {
        more_receipts(&receipts, 100).await;
        let b = brokers.clone();
        let rafts = rafts.clone();
        blocking(move || {
            let mut b = b.blocking_lock();
            let leader = wait_master(&mut b);
            let victim = if journal == "raft-log" {
                (leader + 1) % 3
            } else {
                (leader + 2) % 3
            };
            b[victim].kill9().expect("kill -9");
            damage_first_record(&b[victim].data_dir().join(journal));
            b[victim].respawn().expect("respawn the damaged member");
            if journal == "raft-log" {
                wait_logged(&b[victim], "raft log repaired from the other members");
                assert!(b[victim].data_dir().join("raft-log.damaged").exists());
            } else {
                wait_logged(&b[victim], "state journal damaged");
            }
            let leader = wait_master(&mut b);
            wait_caught_up_or_logs(&b, rafts[victim], rafts[leader]);
        })
        .await;
    }
    // The leader dies: one of the two repaired members leads, elected by the other.
    {
        let b = brokers.clone();
        blocking(move || kill_master_and_rejoin(&mut b.blocking_lock())).await;
    }
    let report = t.finish_exactly_once(pipelined).await;
    eprintln!("replicated, damaged journals repaired: {report}");
    let mut b = brokers.lock().await;
    assert_exactly_once(&report, &b);
    let leader = wait_master_async(&mut b).await;
    let leader_raft = rafts[leader];
    blocking(move || wait_quiet_and_caught_up(&rafts, leader_raft)).await;
    stop_all(&mut b);
    let reference = state_records(b[leader].data_dir());
    for (i, m) in b.iter().enumerate() {
        if i != leader {
            assert!(
                state_records(m.data_dir()) == reference,
                "member {i}'s state journal differs from the leader's"
            );
        }
    }
}

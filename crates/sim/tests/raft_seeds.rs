//! The replicated mode's consensus in simulation (`haven_sim::raft`): fixed seeds and a few
//! random ones, each 20 simulated seconds of members crashing, links cut one way and both, and
//! messages delayed and lost; one leader per term, no acknowledged write lost and the same
//! write at every applied index, at every step; then healing, catch-up and exactly-once.
//!
//! Overnight: `cargo run --release -p haven-sim -- --raft --first 1000 --seeds 10000`.

use haven_sim::raft::{run_raft, run_raft_with, RaftOutcome};

/// Seeds every CI run checks.
const FIXED_SEEDS: std::ops::Range<u64> = 1..21;
/// Random seeds per CI run (printed, so a failure can be rerun).
const RANDOM_SEEDS: usize = 3;

fn check(outcome: &RaftOutcome) {
    println!("{outcome}");
    assert!(outcome.ok(), "{outcome}");
    assert!(
        outcome.acknowledged > 200,
        "too few writes: the run tested nothing\n{outcome}"
    );
}

#[test]
fn raft_invariants_hold_on_the_fixed_seeds() {
    let (mut crashes, mut cuts, mut leaders, mut sizes) = (0, 0, 0, Vec::new());
    for seed in FIXED_SEEDS {
        let outcome = run_raft(seed);
        check(&outcome);
        crashes += outcome.crashes;
        cuts += outcome.cuts;
        leaders += outcome.leaders;
        sizes.push(outcome.members);
    }
    // The faults did happen, and both group sizes ran.
    assert!(crashes > 50 && cuts > 50, "{crashes} crashes, {cuts} cuts");
    assert!(
        leaders > 2 * FIXED_SEEDS.count() as u64,
        "{leaders} terms with a leader"
    );
    assert!(sizes.contains(&3) && sizes.contains(&5), "{sizes:?}");
}

/// Seeds that once failed, kept so that what they found stays fixed.
///
/// 13823266037043373702: member 0 led term 42, crashed and restarted still leading term 42
/// (openraft restores a committed vote for itself as leadership), took writes in term 42 and
/// committed them after winning term 49. Member 1, restarted as the leader of term 43 it had
/// been, lacked them: rightly, as they were committed after term 43. The checker had judged
/// writes by their entry's term instead of the term that committed them.
///
/// 15000012324: after healing, member 0 (restarted, as above, into the leadership of a term
/// long over) was the first member in the leader state, and catch-up was measured against its
/// log, shorter than the group's: the wait ended before member 0 had caught up, and the final
/// check found 265 acknowledged writes it had not yet applied. Catch-up is now measured
/// against the leader every member follows, in its term.
const REGRESSION_SEEDS: [u64; 2] = [13823266037043373702, 15000012324];

#[test]
fn raft_invariants_hold_on_the_seeds_that_once_failed() {
    for seed in REGRESSION_SEEDS {
        check(&run_raft(seed));
    }
}

#[test]
fn raft_invariants_hold_on_random_seeds() {
    for _ in 0..RANDOM_SEEDS {
        let seed = rand::random::<u64>();
        println!("random seed {seed} (rerun: haven-sim --raft --first {seed} --seeds 1)");
        check(&run_raft(seed));
    }
}

/// The invariants can fail: members whose logs lose unapplied entries at a crash (a store that
/// acknowledges before its data is durable) lose acknowledged writes, and the checker says so.
#[test]
fn a_log_that_loses_entries_at_a_crash_is_caught() {
    let caught = FIXED_SEEDS
        .filter(|&seed| !run_raft_with(seed, true).ok())
        .count();
    assert!(caught > 0, "no seed caught a lossy log");
}

/// A seed replays its run: the same faults, the same writes acknowledged, the same elections.
#[test]
fn a_raft_seed_replays_exactly() {
    for seed in [3, 11] {
        let (a, b) = (run_raft(seed).to_string(), run_raft(seed).to_string());
        assert_eq!(a, b, "seed {seed} did not replay");
    }
}

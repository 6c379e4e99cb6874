//! The replicated mode's consensus in simulation (`haven_sim::raft`): fixed seeds and a few
//! random ones, each 20 simulated seconds of members crashing, links cut one way and both, and
//! messages delayed and lost; one leader per term, no acknowledged write lost and the same
//! write at every applied index, at every step; then healing, catch-up and exactly-once.
//!
//! Overnight: `cargo run --release -p haven-sim -- --raft --first 1000 --seeds 10000`.

use haven_sim::raft::{
    elect_from_a_standing_start, run_raft, run_raft_with, Clock, Model, RaftOutcome,
};

/// Seeds every CI run checks.
const FIXED_SEEDS: std::ops::Range<u64> = 1..21;
/// Random seeds per CI run (printed, so a failure can be rerun).
const RANDOM_SEEDS: usize = 3;

/// Every invariant held.
fn check_invariants(outcome: &RaftOutcome) {
    println!("{outcome}");
    assert!(outcome.ok(), "{outcome}");
}

/// Every invariant held, and the run wrote enough to have tested them.
fn check(outcome: &RaftOutcome) {
    check_invariants(outcome);
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

/// Seeds that once failed, kept so that what they found stays fixed. Both were found under the
/// former model (`Model::FORMER`) and replay their runs only under it.
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
        check(&run_raft_with(seed, false, Model::FORMER));
    }
}

/// The floor on acknowledged writes applies to the random seeds together, not to each: a
/// seed's faults may keep a majority down for nearly the whole run. Seed
/// 11933045663016830210 had two or three of its three members down for most of its 20 s (it
/// crashes more often than it restarts) and acknowledged 49 writes; 2 of seeds 1-300 stay
/// under 200, so a per-seed floor failed about one CI run in fifty while every invariant held.
#[test]
fn raft_invariants_hold_on_random_seeds() {
    let mut acknowledged = 0;
    for _ in 0..RANDOM_SEEDS {
        let seed = rand::random::<u64>();
        println!("random seed {seed} (rerun: haven-sim --raft --first {seed} --seeds 1)");
        let outcome = run_raft(seed);
        check_invariants(&outcome);
        acknowledged += outcome.acknowledged;
    }
    assert!(
        acknowledged > 200,
        "too few writes over {RANDOM_SEEDS} random seeds ({acknowledged}): the runs tested nothing"
    );
}

/// The seed that once failed the per-seed floor: every invariant holds, with few writes.
#[test]
fn a_seed_whose_majority_is_down_most_of_the_run_still_holds_the_invariants() {
    check_invariants(&run_raft(11933045663016830210));
}

/// The invariants can fail: members whose logs lose unapplied entries at a crash (a store that
/// acknowledges before its data is durable) lose acknowledged writes, and the checker says so.
#[test]
fn a_log_that_loses_entries_at_a_crash_is_caught() {
    let caught = FIXED_SEEDS
        .filter(|&seed| !run_raft_with(seed, true, Model::HAVEN).ok())
        .count();
    assert!(caught > 0, "no seed caught a lossy log");
}

/// Seed 40000003388 under the former model: after healing, the three members' ticks fell on
/// the same millisecond and their election timeouts (100, 125 and 150 ms) all rounded up to the
/// second tick (75 ms apart), so every 150 ms all three stood at once, each voted for itself
/// and refused the others, and no one was elected for 30 s. The liveness check catches it.
#[test]
fn a_group_that_elects_no_one_after_healing_fails_the_liveness_check() {
    let former = run_raft_with(40000003388, false, Model::FORMER);
    println!("{former}");
    assert!(
        former
            .violations
            .iter()
            .any(|v| v.contains("no leader with every member caught up")),
        "{former}"
    );
}

/// Members that stand in step elect a leader because they step back after a split vote
/// (`haven_raft::split_vote`). Each group starts with every member initialised at the same
/// instant, so every member stands at once with an equal log. On an exact clock (ticks never
/// late, timeouts that round to the same tick) the former model elects no one in 30 s on any
/// seed; stepping back elects a leader on every one, on that clock and on the real one.
#[test]
fn members_in_step_elect_a_leader_because_they_step_back_after_a_split_vote() {
    const SEEDS: std::ops::RangeInclusive<u64> = 1..=10;
    let exact_stepping_back = Model {
        clock: Clock::Exact,
        step_back: true,
    };
    for members in [3, 5] {
        for seed in SEEDS {
            assert_eq!(
                elect_from_a_standing_start(seed, members, Model::FORMER),
                None,
                "seed {seed}, {members} members: the former model elected someone, so the \
                 start was not in step"
            );
            for model in [exact_stepping_back, Model::HAVEN] {
                let elected = elect_from_a_standing_start(seed, members, model);
                println!("seed {seed}, {members} members, {model:?}: elected after {elected:?} ms");
                assert!(
                    elected.is_some(),
                    "seed {seed}, {members} members, {model:?}: no leader"
                );
            }
        }
    }
}

/// A seed replays its run: the same faults, the same writes acknowledged, the same elections.
#[test]
fn a_raft_seed_replays_exactly() {
    for seed in [3, 11] {
        let (a, b) = (run_raft(seed).to_string(), run_raft(seed).to_string());
        assert_eq!(a, b, "seed {seed} did not replay");
    }
}

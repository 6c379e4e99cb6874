//! Fault scenarios as data: a list of timed steps against broker processes and proxies, so a
//! new scenario is a literal, not new code.
//!
//! ```text
//! let steps = [
//!     Step::at(500, Action::Proxy(0, Fault::BlackHole)),
//!     Step::at(2_000, Action::Proxy(0, Fault::Pass)),
//!     Step::at(2_500, Action::Kill9(1)),
//!     Step::at(3_000, Action::Restart(1)),
//! ];
//! run(&steps, &mut brokers, &proxies)?;
//! ```
//!
//! Times are from the start of `run`; steps run in the order given (a step due earlier than
//! the one before it runs right after it). `run` blocks the calling thread: call it from a
//! plain thread or `spawn_blocking`, while the workload runs elsewhere.

use std::time::{Duration, Instant};

use crate::{BrokerProcess, Fault, Proxy, TestkitError};

/// One fault or repair. Indexes name brokers and proxies in the slices given to [`run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Proxy(usize, Fault),
    Kill9(usize),
    /// Starts a killed or stopped broker again on its data directory (waits until it serves).
    Restart(usize),
    /// SIGSTOP: the process keeps its sockets but does nothing.
    Pause(usize),
    /// SIGCONT.
    Resume(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
    pub action: Action,
}

impl Step {
    pub fn at(at_ms: u64, action: Action) -> Step {
        Step { at_ms, action }
    }
}

/// What `run` did, for the test's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ran {
    /// Each step with the time it actually ran (ms after the start).
    pub steps: Vec<(u64, Action)>,
}

/// Runs `steps` against `brokers` and `proxies`. A step naming a broker or proxy that does
/// not exist is a bug in the scenario: it panics before anything runs.
pub fn run(
    steps: &[Step],
    brokers: &mut [BrokerProcess],
    proxies: &[Proxy],
) -> Result<Ran, TestkitError> {
    for s in steps {
        let ok = match s.action {
            Action::Proxy(i, _) => i < proxies.len(),
            Action::Kill9(i) | Action::Restart(i) | Action::Pause(i) | Action::Resume(i) => {
                i < brokers.len()
            }
        };
        assert!(
            ok,
            "scenario step {s:?} names a broker or proxy that does not exist"
        );
    }
    let start = Instant::now();
    let mut ran = Ran::default();
    for s in steps {
        let due = start + Duration::from_millis(s.at_ms);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        match s.action {
            Action::Proxy(i, fault) => proxies[i].set(fault),
            Action::Kill9(i) => brokers[i].kill9()?,
            Action::Restart(i) => {
                if brokers[i].is_running() {
                    // A paused broker cannot stop gracefully: make sure it can exit.
                    let _ = brokers[i].sigcont();
                }
                brokers[i].restart()?
            }
            Action::Pause(i) => brokers[i].sigstop()?,
            Action::Resume(i) => brokers[i].sigcont()?,
        }
        ran.steps
            .push((start.elapsed().as_millis() as u64, s.action));
    }
    Ok(ran)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn steps_run_in_order_not_before_their_time() {
        let upstream = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let proxies = [Proxy::start(upstream).unwrap()];
        let steps = [
            Step::at(50, Action::Proxy(0, Fault::BlackHole)),
            Step::at(120, Action::Proxy(0, Fault::Delay { ms: 5 })),
            Step::at(10, Action::Proxy(0, Fault::Pass)),
        ];
        let ran = run(&steps, &mut [], &proxies).unwrap();
        let times: Vec<u64> = ran.steps.iter().map(|(t, _)| *t).collect();
        assert!(
            times[0] >= 50 && times[1] >= 120 && times[2] >= times[1],
            "{times:?}"
        );
        assert_eq!(proxies[0].fault(), Fault::Pass);
    }

    #[test]
    #[should_panic(expected = "does not exist")]
    fn a_step_naming_a_missing_broker_is_a_bug() {
        let _ = run(&[Step::at(0, Action::Kill9(3))], &mut [], &[]);
    }
}

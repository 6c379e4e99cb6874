//! A no-loss / no-duplicate checker over the history a test recorded (Jepsen's "total queue"
//! check, for STOMP).
//!
//! A test records, for each message id it tried to send, the outcome of the SEND (receipted,
//! failed, or unknown — the connection died first), and every delivery the application saw
//! (with `redelivered`) and every ACK it made. [`History::check`] then reports:
//! - **lost**: receipted messages never delivered;
//! - **duplicated**: messages delivered more than once in a way the rules in force forbid;
//! - **unexpected**: deliveries of ids never sent;
//! - **order**: per-producer order violations among first deliveries (ids `producer-seq`);
//! - counts, including how many unknown-outcome sends arrived anyway ("recovered").
//!
//! The history is thread-safe (one mutex): producers and consumers record from any task.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// What became of one SEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// The broker sent a RECEIPT: it owes one delivery.
    Receipted,
    /// The client knows it was not stored (refused, or never left the client).
    Failed,
    /// It may or may not have been stored.
    Unknown,
}

/// Which second deliveries count as duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duplicates {
    /// Exactly once: the application sees each id at most once.
    Forbidden,
    /// At least once, as a STOMP broker promises: a second delivery is a duplicate only if it
    /// lacks `redelivered:true`, or comes after the application acked the id.
    UnlessRedelivered,
    /// Counted, never a failure (brokers with separate stores after a failover).
    Counted,
}

#[derive(Default)]
struct Record {
    outcome: Option<SendOutcome>,
    attempted: bool,
    /// `redelivered` flag of each delivery, in order.
    deliveries: Vec<bool>,
    /// Deliveries seen before the first ACK of it.
    deliveries_before_ack: Option<usize>,
}

/// The recorded history of one run.
#[derive(Default)]
pub struct History {
    records: Mutex<HashMap<String, Record>>,
    /// First-delivery order of ids first delivered without `redelivered`, for the order check.
    /// A message whose first delivery to the application is flagged may have been delivered
    /// before, to a connection that was lost (a partitioned consumer whose broker has not
    /// noticed yet), while newer messages went to its new connection. JMS and STOMP brokers
    /// promise order only for messages not redelivered, and so does this check.
    first_deliveries: Mutex<Vec<String>>,
}

/// The verdict. `Display` lists the first few offenders of each kind.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub attempted: usize,
    pub receipted: usize,
    pub failed: usize,
    pub unknown: usize,
    /// Unknown-outcome sends that were delivered (stored after all).
    pub recovered: usize,
    /// Distinct ids delivered.
    pub delivered: usize,
    /// All deliveries, including repeats.
    pub deliveries: usize,
    pub lost: Vec<String>,
    pub duplicated: Vec<String>,
    /// Ids delivered more than once, whether or not the rules allow it.
    pub repeated: usize,
    pub unexpected: Vec<String>,
    /// Sends the client was told failed (refused, or in a transaction reported rolled back)
    /// that were delivered anyway: an atomicity violation.
    pub resurrected: Vec<String>,
    pub order_violations: Vec<String>,
}

/// Offenders listed per kind by `Display`.
const SHOWN_MAX: usize = 10;

impl History {
    pub fn new() -> History {
        History::default()
    }

    fn with<R>(&self, id: &str, f: impl FnOnce(&mut Record) -> R) -> R {
        let mut records = self.records.lock().expect("history poisoned");
        f(records.entry(id.to_string()).or_default())
    }

    /// Call before the SEND leaves the client.
    pub fn attempted(&self, id: &str) {
        self.with(id, |r| r.attempted = true);
    }

    /// The SEND's outcome; a later call overrides an earlier `Unknown`.
    pub fn outcome(&self, id: &str, outcome: SendOutcome) {
        self.with(id, |r| {
            assert!(r.attempted, "outcome of {id} recorded before its attempt");
            r.outcome = match (r.outcome, outcome) {
                (Some(SendOutcome::Receipted), _) => Some(SendOutcome::Receipted),
                (_, o) => Some(o),
            };
        });
    }

    /// The application received `id`.
    pub fn delivered(&self, id: &str, redelivered: bool) {
        let first = self.with(id, |r| {
            r.deliveries.push(redelivered);
            r.deliveries.len() == 1
        });
        if first && !redelivered {
            self.first_deliveries
                .lock()
                .expect("history poisoned")
                .push(id.to_string());
        }
    }

    /// The application acked `id` (the first ACK counts).
    pub fn acked(&self, id: &str) {
        self.with(id, |r| {
            if r.deliveries_before_ack.is_none() {
                r.deliveries_before_ack = Some(r.deliveries.len());
            }
        });
    }

    /// Ids that are owed (receipted) and not delivered yet: what a drain still waits for.
    pub fn missing(&self) -> usize {
        let records = self.records.lock().expect("history poisoned");
        records
            .values()
            .filter(|r| r.outcome == Some(SendOutcome::Receipted) && r.deliveries.is_empty())
            .count()
    }

    pub fn check(&self, duplicates: Duplicates, check_order: bool) -> Report {
        let records = self.records.lock().expect("history poisoned");
        let mut report = Report::default();
        let mut ids: Vec<&String> = records.keys().collect();
        ids.sort();
        for id in ids {
            let r = &records[id];
            if r.attempted {
                report.attempted += 1;
            }
            match r.outcome {
                Some(SendOutcome::Receipted) => report.receipted += 1,
                Some(SendOutcome::Failed) => report.failed += 1,
                Some(SendOutcome::Unknown) | None if r.attempted => {
                    report.unknown += 1;
                    if !r.deliveries.is_empty() {
                        report.recovered += 1;
                    }
                }
                _ => {}
            }
            if !r.deliveries.is_empty() {
                report.delivered += 1;
                report.deliveries += r.deliveries.len();
            }
            if !r.attempted && !r.deliveries.is_empty() {
                report.unexpected.push(id.clone());
            }
            if r.outcome == Some(SendOutcome::Failed) && !r.deliveries.is_empty() {
                report.resurrected.push(id.clone());
            }
            if r.outcome == Some(SendOutcome::Receipted) && r.deliveries.is_empty() {
                report.lost.push(id.clone());
            }
            if r.deliveries.len() > 1 {
                report.repeated += 1;
                let forbidden = match duplicates {
                    Duplicates::Forbidden => true,
                    Duplicates::Counted => false,
                    Duplicates::UnlessRedelivered => {
                        let unflagged = r.deliveries[1..].iter().any(|redelivered| !redelivered);
                        let after_ack = r
                            .deliveries_before_ack
                            .is_some_and(|n| r.deliveries.len() > n);
                        unflagged || after_ack
                    }
                };
                if forbidden {
                    report.duplicated.push(id.clone());
                }
            }
        }
        if check_order {
            let firsts = self.first_deliveries.lock().expect("history poisoned");
            let mut last: BTreeMap<&str, u64> = BTreeMap::new();
            for id in firsts.iter() {
                let Some((producer, seq)) = id
                    .rsplit_once('-')
                    .and_then(|(p, s)| Some((p, s.parse::<u64>().ok()?)))
                else {
                    continue;
                };
                if let Some(prev) = last.get(producer) {
                    if seq < *prev {
                        report
                            .order_violations
                            .push(format!("{id} after {producer}-{prev}"));
                    }
                }
                let entry = last.entry(producer).or_insert(seq);
                *entry = (*entry).max(seq);
            }
        }
        report
    }
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.unexpected.is_empty()
            && self.resurrected.is_empty()
            && self.order_violations.is_empty()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "attempted {} receipted {} failed {} unknown {} (recovered {}), delivered {} ids in {} deliveries ({} repeated); lost {}, duplicated {}, unexpected {}, resurrected {}, order violations {}",
            self.attempted,
            self.receipted,
            self.failed,
            self.unknown,
            self.recovered,
            self.delivered,
            self.deliveries,
            self.repeated,
            self.lost.len(),
            self.duplicated.len(),
            self.unexpected.len(),
            self.resurrected.len(),
            self.order_violations.len()
        )?;
        for (name, list) in [
            ("lost", &self.lost),
            ("duplicated", &self.duplicated),
            ("unexpected", &self.unexpected),
            ("resurrected", &self.resurrected),
            ("order", &self.order_violations),
        ] {
            if !list.is_empty() {
                let shown: Vec<&String> = list.iter().take(SHOWN_MAX).collect();
                write!(f, "\n  {name}: {shown:?}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(h: &History, id: &str, outcome: SendOutcome) {
        h.attempted(id);
        h.outcome(id, outcome);
    }

    #[test]
    fn clean_history_passes() {
        let h = History::new();
        for i in 1..=3 {
            let id = format!("p1-{i}");
            sent(&h, &id, SendOutcome::Receipted);
            h.delivered(&id, false);
            h.acked(&id);
        }
        let r = h.check(Duplicates::Forbidden, true);
        assert!(r.is_ok(), "{r}");
        assert_eq!((r.receipted, r.delivered, r.deliveries), (3, 3, 3));
    }

    #[test]
    fn lost_unexpected_and_unknown_are_told_apart() {
        let h = History::new();
        sent(&h, "p1-1", SendOutcome::Receipted);
        sent(&h, "p1-2", SendOutcome::Unknown);
        sent(&h, "p1-3", SendOutcome::Unknown);
        sent(&h, "p1-4", SendOutcome::Failed);
        h.delivered("p1-3", false);
        h.delivered("ghost-1", false);
        assert_eq!(h.missing(), 1);
        let r = h.check(Duplicates::Forbidden, false);
        assert_eq!(r.lost, vec!["p1-1"]);
        assert_eq!(r.unexpected, vec!["ghost-1"]);
        assert_eq!((r.unknown, r.recovered, r.failed), (2, 1, 1));
        assert!(!r.is_ok());
        assert!(r.to_string().contains("lost: [\"p1-1\"]"));
    }

    #[test]
    fn duplicate_rules() {
        let h = History::new();
        sent(&h, "a-1", SendOutcome::Receipted);
        h.delivered("a-1", false);
        h.delivered("a-1", true); // flagged redelivery before any ack: allowed at least once
        sent(&h, "a-2", SendOutcome::Receipted);
        h.delivered("a-2", false);
        h.delivered("a-2", false); // unflagged second delivery
        sent(&h, "a-3", SendOutcome::Receipted);
        h.delivered("a-3", false);
        h.acked("a-3");
        h.delivered("a-3", true); // after the ack
        let r = h.check(Duplicates::UnlessRedelivered, false);
        assert_eq!(r.duplicated, vec!["a-2", "a-3"]);
        assert_eq!(r.repeated, 3);
        assert_eq!(h.check(Duplicates::Forbidden, false).duplicated.len(), 3);
        let counted = h.check(Duplicates::Counted, false);
        assert!(counted.duplicated.is_empty() && counted.repeated == 3);
    }

    #[test]
    fn a_failed_send_that_is_delivered_is_reported() {
        let h = History::new();
        sent(&h, "p1-1", SendOutcome::Failed);
        sent(&h, "p1-2", SendOutcome::Failed);
        h.delivered("p1-2", false);
        let r = h.check(Duplicates::Counted, false);
        assert_eq!(r.resurrected, vec!["p1-2"]);
        assert!(!r.is_ok());
    }

    #[test]
    fn order_is_checked_per_producer_on_first_deliveries() {
        let h = History::new();
        for id in ["p1-1", "p2-1", "p1-2", "p2-3", "p2-2", "p1-3"] {
            sent(&h, id, SendOutcome::Receipted);
            h.delivered(id, false);
        }
        h.delivered("p1-1", true); // a redelivery does not count for order
        sent(&h, "p1-0", SendOutcome::Receipted);
        h.delivered("p1-0", true); // neither does a first delivery flagged as redelivered
        let r = h.check(Duplicates::Counted, true);
        assert_eq!(r.order_violations, vec!["p2-2 after p2-3"]);
    }
}

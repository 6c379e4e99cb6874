//! The producer table: per `haven-producer` id, the high-water mark of its `haven-seq`, so a
//! resend of a SEND (or COMMIT) that was already accepted is answered and not stored again.
//!
//! Each entry has two views. The in-memory mark (`hwm`) is what duplicates are judged by; it
//! also moves for messages that are never logged (non-persistent, or persistent with nowhere
//! durable to go), because while the broker runs such a message is as accepted as any other.
//! The durable mark is what the log says: the newest record carrying this producer (a store or
//! commit with a producer, or a `ProducerState` re-logged by compaction) and its LSN. Replay
//! rebuilds exactly the durable marks ("the newest record wins"), so after a restart a resend
//! of a non-persistent message is accepted again — it is gone, so it is a duplicate of nothing.
//!
//! The table is bounded: a producer whose mark was last raised `idle_ms_max` ago is forgotten
//! (on `tick`, by the caller's clock), and a new producer beyond `producers_max` forgets the
//! least recently raised one (`by_seen`, O(log n)). Forgetting writes no record: the old
//! records simply stop being live, so compaction does not re-log them; replay may bring a
//! forgotten producer back from records still in the log, and the same rules applied after
//! replay (the next tick; eviction during replay) forget it again. "Seen" means "raised the
//! mark": a producer that only resends duplicates is not refreshed, which keeps the in-memory
//! time equal to the logged one and forgetting deterministic across restarts.
//!
//! Fencing is volatile and lives here too: the connection that most recently CONNECTed with
//! `haven-producer: P` owns P; an older session that claimed P may no longer use it.
//!
//! Network origins (ids starting with `NETWORK_ORIGIN_PREFIX`: one per message a bridge
//! forwarded, always `seq` 1, so the mark says "this message arrived") follow the same rules
//! in a table of their own (`crate::origins`), with their own limits and no owners: no CONNECT
//! may claim one. Both answer the engine through [`MarkTable`].

use crate::hash::HashMap;
use crate::record::ProducerMark;
use crate::types::ConnId;
use crate::EngineError;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A producer id as the table keeps it: one allocation shared by the map, the idle index and
/// the engine's live set.
pub(crate) type Id = Arc<str>;

/// Longest `haven-producer` id, in bytes: ids are kept in memory and in every record.
pub const PRODUCER_ID_BYTES_MAX: usize = 128;

/// Producer ids with this prefix are network origins: a message a bridge forwarded, named by
/// the store and message id it had on the broker it came from (`haven-net-origin`). They are
/// judged by their own table (no ownership), so a bridge's traffic never evicts the marks of
/// applications' producers.
pub const NETWORK_ORIGIN_PREFIX: &str = "haven-net:";

/// Whether `id` names a network origin rather than an application's producer.
pub(crate) fn is_network_origin(id: &str) -> bool {
    id.starts_with(NETWORK_ORIGIN_PREFIX)
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Producer {
    /// Its own id, the same allocation as its key.
    id: Id,
    /// Highest sequence accepted; every `seq <= hwm` is a duplicate.
    hwm: u64,
    /// When `hwm` was last raised (ms since the epoch): the key of idle forgetting.
    seen_ms: u64,
    /// What the log says, if any record carries this producer.
    durable: Option<Durable>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Durable {
    seq: u64,
    seen_ms: u64,
    /// The record that describes it: a live object until superseded or forgotten.
    lsn: u64,
}

/// Counters for the operator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Producers remembered now.
    pub producers: usize,
    /// SENDs and COMMITs answered as duplicates since start.
    pub duplicates_dropped_total: u64,
    /// Producers forgotten since start, idle or evicted by `producers_max`.
    pub forgotten_total: u64,
    /// Of those, forgotten to make room for a new one (`producers_max`): a producer still
    /// within its idle window lost its mark, so a resend from it would be stored again.
    pub forgotten_for_room_total: u64,
    /// For the producer most recently forgotten for room: how long before its eviction it
    /// had last raised its mark (ms). The table's effective window: a client away longer
    /// than this, under the same churn of producer ids, comes back forgotten.
    pub room_window_ms: Option<u64>,
}

/// What both mark tables keep besides their marks: how they forget, and what they counted.
#[derive(Debug)]
pub(crate) struct Forgetting {
    /// A mark last raised this long ago (ms) is forgotten.
    pub idle_ms_max: u64,
    /// Marks remembered at most; a new one beyond forgets the oldest.
    pub entries_max: usize,
    pub duplicates_dropped_total: u64,
    pub forgotten_total: u64,
    /// Of `forgotten_total`, forgotten to make room for a new mark rather than for idleness.
    pub forgotten_for_room_total: u64,
}

impl Forgetting {
    pub fn new(idle_ms_max: u64, entries_max: usize) -> Forgetting {
        assert!(
            idle_ms_max >= 1 && entries_max >= 1,
            "mark table limits must be at least 1"
        );
        Forgetting {
            idle_ms_max,
            entries_max,
            duplicates_dropped_total: 0,
            forgotten_total: 0,
            forgotten_for_room_total: 0,
        }
    }

    /// Whether a mark last raised at `seen_ms` is to be forgotten at `now_ms`.
    pub fn is_idle(&self, seen_ms: u64, now_ms: u64) -> bool {
        seen_ms.saturating_add(self.idle_ms_max) <= now_ms
    }

    pub fn stats(&self, remembered: usize) -> ProducerStats {
        ProducerStats {
            producers: remembered,
            duplicates_dropped_total: self.duplicates_dropped_total,
            forgotten_total: self.forgotten_total,
            forgotten_for_room_total: self.forgotten_for_room_total,
            room_window_ms: None,
        }
    }
}

/// Durable marks that stopped being live: the caller removes the producer mark at each LSN
/// from its live set (a record carries at most one).
pub(crate) type Released = Vec<u64>;

/// What the engine asks of a table of sequence marks, whichever ids it holds: applications'
/// producers (`Producers`) or network origins (`crate::origins::Origins`).
pub(crate) trait MarkTable {
    /// The high-water mark of `id`; 0 if unknown (sequences start at 1).
    fn hwm(&self, id: &str) -> u64;

    fn is_duplicate(&self, id: &str, seq: u64) -> bool;

    fn count_duplicate(&mut self);

    /// A SEND or COMMIT with `(id, seq)` was accepted at `now_ms`; `lsn` is the record that
    /// carries the mark, or None if nothing was logged (the mark is in memory only). Returns
    /// the table's id if the mark was logged (for the caller's live set) and the marks that
    /// stopped being live.
    fn accept(
        &mut self,
        id: &str,
        seq: u64,
        now_ms: u64,
        lsn: Option<u64>,
    ) -> (Option<Id>, Released);

    /// Replay: the record at `lsn` says the producer's mark is exactly `mark` (the newest
    /// record wins). Returns the table's id and the marks no longer live.
    fn replay(&mut self, mark: &ProducerMark, lsn: u64) -> (Id, Released);

    /// Compaction: the durable mark of `id`, to be re-logged. None if only in memory.
    fn durable_mark(&self, id: &str) -> Option<ProducerMark>;

    /// Compaction re-logged the durable mark of `id` at `lsn`; returns the old LSN.
    fn relogged(&mut self, id: &str, lsn: u64) -> u64;
}

#[derive(Debug)]
pub(crate) struct Producers {
    entries: HashMap<Id, Producer>,
    /// (seen_ms, id) of every entry: oldest first, for forgetting.
    by_seen: BTreeSet<(u64, Id)>,
    /// Producer id → the connection that most recently claimed it at CONNECT.
    /// Who owns each producer now: (connection, its `haven-session`).
    owners: HashMap<String, (ConnId, u64)>,
    forgetting: Forgetting,
    /// `ProducerStats::room_window_ms`.
    room_window_ms: Option<u64>,
}

impl Producers {
    pub fn new(idle_ms_max: u64, producers_max: usize) -> Producers {
        Producers {
            entries: HashMap::default(),
            by_seen: BTreeSet::new(),
            owners: HashMap::default(),
            forgetting: Forgetting::new(idle_ms_max, producers_max),
            room_window_ms: None,
        }
    }

    /// Forgets every producer whose mark was last raised `idle_ms_max` or more ago.
    pub fn forget_idle(&mut self, now_ms: u64) -> Released {
        let mut released = Vec::new();
        while let Some((seen_ms, id)) = self.by_seen.first().cloned() {
            if !self.forgetting.is_idle(seen_ms, now_ms) {
                break;
            }
            self.forget(&id, &mut released);
        }
        released
    }

    /// Adds a producer the table does not know, making room first so it is never its own
    /// victim.
    fn insert_new(
        &mut self,
        id: &str,
        hwm: u64,
        seen_ms: u64,
        durable: Option<Durable>,
        released: &mut Released,
    ) -> Id {
        while self.entries.len() >= self.forgetting.entries_max {
            let (victim_seen_ms, victim) = self.by_seen.first().cloned().expect("table not empty");
            self.forget(&victim, released);
            self.forgetting.forgotten_for_room_total += 1;
            self.room_window_ms = Some(seen_ms.saturating_sub(victim_seen_ms));
        }
        let id: Id = Arc::from(id);
        self.by_seen.insert((seen_ms, id.clone()));
        let producer = Producer {
            id: id.clone(),
            hwm,
            seen_ms,
            durable,
        };
        let previous = self.entries.insert(id.clone(), producer);
        assert!(previous.is_none(), "a new producer was known");
        id
    }

    fn forget(&mut self, id: &str, released: &mut Released) {
        let p = self
            .entries
            .remove(id)
            .expect("forgetting a known producer");
        let found = self.by_seen.remove(&(p.seen_ms, p.id.clone()));
        assert!(found, "producer {id} missing from the idle index");
        if let Some(d) = p.durable {
            released.push(d.lsn);
        }
        self.forgetting.forgotten_total += 1;
    }

    // ----------------------------------------------------------------------------------------
    // Fencing

    /// `conn` CONNECTed with `haven-producer: id` and `haven-session: session` (0: none):
    /// it owns `id` from now on, unless the current owner is a newer session of the same
    /// client. A CONNECT held up in the network (a black-holed link that heals) arrives after
    /// the client's live session and must not fence it; it gets an ERROR instead.
    pub fn claim(&mut self, id: &str, conn: ConnId, session: u64) -> Result<(), EngineError> {
        if let Some(&(owner, owner_session)) = self.owners.get(id) {
            if session > 0 && owner_session > session && owner != conn {
                return Err(EngineError::StaleSession(id.to_string()));
            }
        }
        self.owners.insert(id.to_string(), (conn, session));
        Ok(())
    }

    /// `conn`, which claimed `id`, is gone.
    pub fn release_claim(&mut self, id: &str, conn: ConnId) {
        if self.owners.get(id).map(|o| o.0) == Some(conn) {
            self.owners.remove(id);
        }
    }

    /// Whether `conn` (which claimed `claimed` at CONNECT, if anything) may no longer use
    /// producer `id`: it claimed it, and a newer connection claimed it since (or claimed it
    /// and left: the old session's frames must still not slip in).
    pub fn taken_over(&self, id: &str, conn: ConnId, claimed: Option<&str>) -> bool {
        claimed == Some(id) && self.owners.get(id).map(|o| o.0) != Some(conn)
    }

    // ----------------------------------------------------------------------------------------
    // Inspection

    pub fn stats(&self) -> ProducerStats {
        ProducerStats {
            room_window_ms: self.room_window_ms,
            ..self.forgetting.stats(self.entries.len())
        }
    }

    /// Producer → (seq, seen_ms) as the log has it: equal before a crash and after replay.
    pub fn durable_marks(&self) -> BTreeMap<String, (u64, u64)> {
        self.entries
            .iter()
            .filter_map(|(id, p)| p.durable.map(|d| (id.to_string(), (d.seq, d.seen_ms))))
            .collect()
    }

    /// Producers with a durable mark (each is one live object).
    pub fn durable_count(&self) -> usize {
        self.entries
            .values()
            .filter(|p| p.durable.is_some())
            .count()
    }

    /// The live object of each durable mark: (lsn, id), for the caller's cross-check.
    pub fn durable_lsns(&self) -> impl Iterator<Item = (u64, &str)> {
        self.entries
            .iter()
            .filter_map(|(id, p)| p.durable.map(|d| (d.lsn, &**id)))
    }

    pub fn check_invariants(&self) {
        assert_eq!(self.entries.len(), self.by_seen.len());
        assert!(self.entries.len() <= self.forgetting.entries_max);
        for (id, p) in &self.entries {
            assert_eq!(id, &p.id, "an entry under another producer's id");
            assert!(self.by_seen.contains(&(p.seen_ms, id.clone())));
            assert!(!id.is_empty() && id.len() <= PRODUCER_ID_BYTES_MAX);
            if let Some(d) = p.durable {
                assert!(d.seq <= p.hwm, "durable mark above the in-memory one");
            }
        }
    }
}

impl MarkTable for Producers {
    fn hwm(&self, id: &str) -> u64 {
        self.entries.get(id).map_or(0, |p| p.hwm)
    }

    fn is_duplicate(&self, id: &str, seq: u64) -> bool {
        assert!(seq >= 1, "haven-seq 0 is refused at the edge");
        seq <= self.hwm(id)
    }

    fn count_duplicate(&mut self) {
        self.forgetting.duplicates_dropped_total += 1;
    }

    fn accept(
        &mut self,
        id: &str,
        seq: u64,
        now_ms: u64,
        lsn: Option<u64>,
    ) -> (Option<Id>, Released) {
        let mut released = Vec::new();
        let new_durable = lsn.map(|lsn| Durable {
            seq,
            seen_ms: now_ms,
            lsn,
        });
        // The common case for applications' producers, a known one sending again: update in
        // place, and touch the idle index only when the time moved (many SENDs share a
        // millisecond), so a SEND costs no allocation here.
        if let Some(p) = self.entries.get_mut(id) {
            assert!(seq > p.hwm, "duplicate accepted");
            if let (Some(new), Some(old)) = (new_durable, p.durable) {
                assert!(old.lsn < new.lsn, "producer mark logged out of order");
                released.push(old.lsn);
            }
            let durable = new_durable.or(p.durable);
            update(&mut self.by_seen, p, seq, now_ms, durable);
            return (lsn.map(|_| p.id.clone()), released);
        }
        let id = self.insert_new(id, seq, now_ms, new_durable, &mut released);
        (lsn.map(|_| id), released)
    }

    /// Live handling only ever logs a higher mark, or a first one after the producer was
    /// forgotten, so the newest record is the mark.
    fn replay(&mut self, mark: &ProducerMark, lsn: u64) -> (Id, Released) {
        let mut released = Vec::new();
        let durable = Some(Durable {
            seq: mark.seq,
            seen_ms: mark.seen_ms,
            lsn,
        });
        if let Some(p) = self.entries.get_mut(mark.producer.as_str()) {
            if let Some(d) = p.durable {
                released.push(d.lsn);
            }
            update(&mut self.by_seen, p, mark.seq, mark.seen_ms, durable);
            return (p.id.clone(), released);
        }
        let id = self.insert_new(
            &mark.producer,
            mark.seq,
            mark.seen_ms,
            durable,
            &mut released,
        );
        (id, released)
    }

    fn durable_mark(&self, id: &str) -> Option<ProducerMark> {
        let d = self.entries.get(id)?.durable?;
        Some(ProducerMark {
            producer: id.to_string(),
            seq: d.seq,
            seen_ms: d.seen_ms,
        })
    }

    fn relogged(&mut self, id: &str, lsn: u64) -> u64 {
        let d = self
            .entries
            .get_mut(id)
            .and_then(|p| p.durable.as_mut())
            .expect("re-logged producer has a durable mark");
        assert!(d.lsn < lsn, "re-logged below its own record");
        std::mem::replace(&mut d.lsn, lsn)
    }
}

/// Sets known producer `p`'s mark, moving it in the idle index `by_seen` only when the time
/// moved (many SENDs share a millisecond).
fn update(
    by_seen: &mut BTreeSet<(u64, Id)>,
    p: &mut Producer,
    hwm: u64,
    seen_ms: u64,
    durable: Option<Durable>,
) {
    if p.seen_ms != seen_ms {
        let found = by_seen.remove(&(p.seen_ms, p.id.clone()));
        assert!(found, "producer {} missing from the idle index", p.id);
        by_seen.insert((seen_ms, p.id.clone()));
    }
    p.hwm = hwm;
    p.seen_ms = seen_ms;
    p.durable = durable;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(p: &mut Producers, id: &str, seq: u64, now_ms: u64, lsn: Option<u64>) -> Released {
        let (kept, released) = p.accept(id, seq, now_ms, lsn);
        assert_eq!(kept.as_deref(), lsn.map(|_| id));
        released
    }

    #[test]
    fn a_gap_is_accepted_and_everything_up_to_the_mark_is_a_duplicate() {
        let mut p = Producers::new(1_000, 10);
        assert!(accept(&mut p, "a", 1, 5, Some(1)).is_empty());
        assert_eq!(accept(&mut p, "a", 5, 6, Some(2)), vec![1]);
        assert!(p.is_duplicate("a", 1) && p.is_duplicate("a", 3) && p.is_duplicate("a", 5));
        assert!(!p.is_duplicate("a", 6) && !p.is_duplicate("b", 1));
        p.check_invariants();
    }

    #[test]
    fn in_memory_marks_keep_the_durable_one() {
        let mut p = Producers::new(1_000, 10);
        accept(&mut p, "a", 2, 5, Some(7));
        assert!(accept(&mut p, "a", 3, 6, None).is_empty());
        assert_eq!(p.hwm("a"), 3);
        assert_eq!(p.durable_marks()["a"], (2, 5));
    }

    #[test]
    fn idle_producers_are_forgotten_oldest_first() {
        let mut p = Producers::new(100, 10);
        accept(&mut p, "a", 1, 0, Some(1));
        accept(&mut p, "b", 1, 50, None);
        assert_eq!(p.forget_idle(99), vec![]);
        assert_eq!(p.forget_idle(100), vec![1]);
        assert_eq!(p.hwm("a"), 0);
        assert_eq!(p.forget_idle(150), vec![]);
        assert_eq!(p.stats().producers, 0);
        assert_eq!(p.stats().forgotten_total, 2);
    }

    #[test]
    fn a_new_producer_beyond_the_limit_evicts_the_least_recently_seen() {
        let mut p = Producers::new(1_000, 2);
        accept(&mut p, "a", 1, 10, Some(1));
        accept(&mut p, "b", 1, 5, Some(2));
        accept(&mut p, "a", 2, 20, Some(3));
        assert_eq!(p.stats().forgotten_for_room_total, 0);
        let released = accept(&mut p, "c", 1, 30, Some(4));
        assert_eq!(released, vec![2]);
        assert_eq!((p.hwm("a"), p.hwm("b"), p.hwm("c")), (2, 0, 1));
        // b last raised its mark at 5 and was forgotten for room at 30.
        let stats = p.stats();
        assert_eq!(
            (stats.forgotten_for_room_total, stats.room_window_ms),
            (1, Some(25))
        );
        // Forgetting for idleness is not forgetting for room.
        assert_eq!(p.forget_idle(1_020).len(), 1);
        let stats = p.stats();
        assert_eq!(
            (stats.forgotten_total, stats.forgotten_for_room_total),
            (2, 1)
        );
        p.check_invariants();
    }

    #[test]
    fn only_the_newest_claim_owns_a_producer() {
        let mut p = Producers::new(1_000, 2);
        p.claim("a", 1, 0).unwrap();
        p.claim("a", 2, 0).unwrap();
        assert!(p.taken_over("a", 1, Some("a")));
        assert!(!p.taken_over("a", 2, Some("a")));
        // A connection that never claimed it just deduplicates.
        assert!(!p.taken_over("a", 3, None) && !p.taken_over("a", 3, Some("b")));
        p.release_claim("a", 1); // not the owner: no effect
        assert!(!p.taken_over("a", 2, Some("a")));
        p.release_claim("a", 2);
        assert!(
            p.taken_over("a", 1, Some("a")),
            "the old session stays fenced"
        );
    }

    #[test]
    fn a_late_connect_of_an_older_session_cannot_take_the_producer() {
        let mut p = Producers::new(1_000, 2);
        p.claim("a", 1, 10).unwrap();
        p.claim("a", 2, 12).unwrap(); // the client's newer session
        assert!(matches!(
            p.claim("a", 3, 11), // its CONNECT from an attempt that timed out, arriving late
            Err(EngineError::StaleSession(_))
        ));
        assert!(
            !p.taken_over("a", 2, Some("a")),
            "the live session keeps it"
        );
        // Without a session number, the newest CONNECT wins as before.
        p.claim("a", 4, 0).unwrap();
        assert!(p.taken_over("a", 2, Some("a")));
        // Once the owner is gone, any session may claim it.
        p.release_claim("a", 4);
        p.claim("a", 5, 1).unwrap();
        assert!(!p.taken_over("a", 5, Some("a")));
    }
}

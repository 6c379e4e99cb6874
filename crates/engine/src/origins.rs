//! The network-origin table: which forwarded messages (`haven-net-origin`) this broker has
//! already accepted, so a bridge's resend is answered and not stored twice.
//!
//! It keeps the rules of the producer table (`producers`) for ids with
//! `NETWORK_ORIGIN_PREFIX` — the in-memory and the durable mark, forgetting by idle time and
//! by count, the durable mark re-logged by compaction — but an origin is a producer of exactly
//! one message: its only sequence number is 1, and it is seen once (a resend is a duplicate and
//! refreshes nothing). A bridge's traffic makes one origin per forwarded message, so the
//! general table's per-entry costs showed: an idle index ordered by (time, id) whose eviction
//! compared cold 60-byte strings, and SipHash over the id for every lookup. Origins were about a
//! fifth of a receiving broker's CPU (docs/PERFORMANCE.md, "Networks of brokers").
//!
//! Origins are kept per source: an id is split into the text before its trailing number and
//! the number (`haven-net:<store>/ID:haven-<boot>-` and `42`: a bridge forwards one broker's
//! message ids, which that broker numbers in order). Each source queues its origins in the
//! order they were accepted, which for an origin is the order it was last seen, so its oldest
//! is at the front, and keeps an ordered map of their numbers. A bridge's traffic adds numbers
//! near the top of one map and forgets them from the bottom, so every operation touches memory
//! it touched a moment ago, where a hash table of 100,000 ids missed the cache on every
//! eviction. Ids without a trailing number are their own source. The table keeps no string per
//! origin: the caller's live set keeps the id of each logged origin (compaction re-logs it by
//! that id), and an id is rebuilt from prefix and number for inspection.
//!
//! Forgetting by count takes from the source that holds the most origins, its oldest first,
//! not from the oldest origin overall. What a source may resend is what it had in flight when
//! its bridge broke: its newest origins. A hub that several brokers forward to goes on
//! accepting the others' traffic while one bridge is down, and a table that forgot the oldest
//! overall let that traffic push out what the silent source was about to resend (100,000
//! origins are one second at 100,000 msg/s). Taking from the largest, a source keeps at least
//! its newest `origins_max / sources` origins, however busy the others are. Of sources holding
//! as many, the one whose oldest origin is older goes first, so ids of one origin per source
//! (an application's idempotency keys) are forgotten oldest first, as in one queue.
//!
//! One departure from the general table: when compaction re-logs an origin's mark, the origin
//! moves to the back of its source's queue (its record is now the newest). Its seen time stays,
//! so idle forgetting, which stops at a source's first origin that is not idle, may keep it up
//! to one more idle period. Remembering longer is always safe; what matters is that the durable
//! origins are in the same order live and after replay, so both forget the same ones: live,
//! each is appended when its record is logged (a new one, or a re-log); replay appends them
//! in log order. Origins of messages that were not logged (non-persistent ones) count toward
//! the limit live and are gone after a restart, so then the two may forget different ones.

use crate::hash::HashMap;
use crate::producers::{Forgetting, Id, MarkTable, Released, PRODUCER_ID_BYTES_MAX};
use crate::record::ProducerMark;
use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// The only sequence number an origin has.
const ORIGIN_SEQ: u64 = 1;

/// No source was looked up yet (or the last one was forgotten).
const NO_SOURCE: u32 = u32::MAX;

/// Splits an origin id into the text before its trailing decimal number and the number
/// (`haven-net:<store>/ID:haven-<boot>-` and `42`). An id without one in canonical form (at
/// least one digit after a non-digit, no leading zero, within u64) is its own prefix, with
/// number 0. `join` undoes it exactly: a prefix never ends in a digit.
fn split(id: &str) -> (&str, u64) {
    let digits = id.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (prefix, tail) = id.split_at(id.len() - digits);
    if prefix.is_empty() || tail.is_empty() || tail.starts_with('0') {
        return (id, 0);
    }
    match tail.parse::<u64>() {
        Ok(number) => (prefix, number),
        Err(_) => (id, 0),
    }
}

fn join(prefix: &str, number: u64) -> String {
    if number == 0 {
        prefix.to_string()
    } else {
        format!("{prefix}{number}")
    }
}

/// The origins that share a prefix: in practice one store and boot of one broker.
#[derive(Debug)]
struct Source {
    prefix: Arc<str>,
    /// Number → serial of its slot. Its length is how many origins the source holds.
    numbers: BTreeMap<u64, u64>,
    /// Its origins, oldest first. `None` is the place an origin left when it moved to the back
    /// (a re-log); it is dropped when it reaches the front.
    slots: VecDeque<Option<Slot>>,
    /// The serial of `slots[0]`; a slot's serial is fixed while it is in the queue.
    front_serial: u64,
}

impl Source {
    fn held(&self) -> usize {
        self.numbers.len()
    }

    fn position(&self, serial: u64) -> usize {
        let position = serial
            .checked_sub(self.front_serial)
            .expect("an indexed slot behind the front");
        usize::try_from(position).expect("queue position fits in usize")
    }

    fn slot(&self, serial: u64) -> Slot {
        self.slots[self.position(serial)].expect("the index names a vacant slot")
    }

    /// Appends `slot` at the back and indexes it there.
    fn push(&mut self, slot: Slot) {
        let serial = self.front_serial + self.slots.len() as u64;
        let previous = self.numbers.insert(slot.number, serial);
        assert!(previous.is_none(), "an origin indexed twice");
        self.slots.push_back(Some(slot));
    }

    fn drop_vacant_front(&mut self) {
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.front_serial += 1;
        }
    }

    /// The oldest origin, if any (dropping vacant places before it).
    fn front(&mut self) -> Option<Slot> {
        self.drop_vacant_front();
        self.slots.front().copied().flatten()
    }

    /// Unindexes and returns the oldest origin; the source holds one.
    fn pop_front(&mut self) -> Slot {
        self.drop_vacant_front();
        let slot = self
            .slots
            .pop_front()
            .flatten()
            .expect("forgetting from a source with no origins");
        self.front_serial += 1;
        let indexed = self.numbers.remove(&slot.number);
        assert!(indexed.is_some(), "origin missing from its source's index");
        slot
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    number: u64,
    /// When it took this place, counted over all sources: the oldest front is the smallest.
    stamp: u64,
    /// When it was accepted (ms since the epoch): the key of idle forgetting.
    seen_ms: u64,
    /// The record that carries it, if it was logged: a live object until forgotten.
    lsn: Option<u64>,
}

/// What the origin table holds and has done, for the broker's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OriginStats {
    /// Origins remembered.
    pub remembered: usize,
    /// Sources they come from (one run of one broker each, for bridges).
    pub sources: usize,
    /// Resends recognised: answered and not stored.
    pub duplicates_dropped_total: u64,
    /// Origins forgotten, for idleness or for room.
    pub forgotten_total: u64,
    /// Of those, forgotten for room: a table that forgets for room may forget what a source
    /// would still resend (`network_origins_max` is then too small for the traffic).
    pub forgotten_for_room_total: u64,
}

/// (origins held, Reverse(stamp of the oldest), index).
type SizeKey = (usize, Reverse<u64>, u32);

/// (seen time of the oldest, index).
type IdleKey = (u64, u32);

/// A source's places in `by_size` and `by_idle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Keys {
    size: SizeKey,
    idle: IdleKey,
}

#[derive(Debug)]
pub(crate) struct Origins {
    /// Origins remembered, over all sources.
    len: usize,
    /// By index; a source is dropped when its last origin is forgotten, and its index reused.
    sources: Vec<Option<Source>>,
    free_sources: Vec<u32>,
    /// Every source's key in the order forgetting by count takes from them, the last first:
    /// the most origins held, and of sources holding as many, the oldest front (so sources of
    /// one origin each, as ids without a trailing number are, go oldest first). Kept only
    /// while there are two sources or more: a broker fed by one bridge has one, and keeping
    /// its key in step cost a third more per origin.
    by_size: BTreeSet<SizeKey>,
    /// Every source's key in the order idle forgetting looks at them: its oldest origin's
    /// seen time first. Kept with `by_size`: with many sources (an application's idempotency
    /// keys are a source each) a look at every source per tick would cost a scan of them all.
    by_idle: BTreeSet<IdleKey>,
    /// The next slot's stamp.
    next_stamp: u64,
    /// Prefix → index in `sources` (keyed hashing: clients choose origins).
    by_prefix: HashMap<Arc<str>, u32>,
    /// The source of the last lookup: a bridge's traffic names the same one message after
    /// message, and comparing the prefix is cheaper than hashing it.
    last_source: Cell<u32>,
    forgetting: Forgetting,
}

impl Origins {
    pub fn new(idle_ms_max: u64, origins_max: usize) -> Origins {
        Origins {
            len: 0,
            sources: Vec::new(),
            free_sources: Vec::new(),
            by_size: BTreeSet::new(),
            by_idle: BTreeSet::new(),
            next_stamp: 0,
            by_prefix: HashMap::default(),
            last_source: Cell::new(NO_SOURCE),
            forgetting: Forgetting::new(idle_ms_max, origins_max),
        }
    }

    fn source(&self, index: u32) -> &Source {
        self.sources[index as usize]
            .as_ref()
            .expect("a slot names a dropped source")
    }

    fn source_mut(&mut self, index: u32) -> &mut Source {
        self.sources[index as usize]
            .as_mut()
            .expect("a slot names a dropped source")
    }

    fn find_source(&self, prefix: &str) -> Option<u32> {
        let last = self.last_source.get();
        if last != NO_SOURCE && &*self.source(last).prefix == prefix {
            return Some(last);
        }
        let found = *self.by_prefix.get(prefix)?;
        self.last_source.set(found);
        Some(found)
    }

    /// The source of `prefix`, added with no origins if new: the caller pushes one at once.
    fn find_or_add_source(&mut self, prefix: &str) -> u32 {
        if let Some(found) = self.find_source(prefix) {
            return found;
        }
        let prefix: Arc<str> = Arc::from(prefix);
        let source = Some(Source {
            prefix: prefix.clone(),
            numbers: BTreeMap::new(),
            slots: VecDeque::new(),
            front_serial: 0,
        });
        let index = match self.free_sources.pop() {
            Some(index) => {
                self.sources[index as usize] = source;
                index
            }
            None => {
                self.sources.push(source);
                u32::try_from(self.sources.len() - 1).expect("sources fit in u32")
            }
        };
        assert!(index != NO_SOURCE, "too many sources");
        self.by_prefix.insert(prefix, index);
        if self.by_prefix.len() == 2 {
            // Sizes are kept from now on: the other source's key first.
            let other = self.sources.iter().enumerate().find_map(|(other, source)| {
                let other = u32::try_from(other).expect("sources fit in u32");
                (other != index && source.is_some()).then_some(other)
            });
            let keys = self.keys(other.expect("two sources")).expect("not empty");
            self.by_size.insert(keys.size);
            self.by_idle.insert(keys.idle);
        }
        index
    }

    fn sizes_kept(&self) -> bool {
        self.by_prefix.len() >= 2
    }

    /// The source forgetting by count takes from.
    fn largest(&self) -> u32 {
        if self.sizes_kept() {
            self.by_size.last().expect("sizes are kept").2
        } else {
            *self
                .by_prefix
                .values()
                .next()
                .expect("a full table has a source")
        }
    }

    /// Source `index`'s keys (`None` once it holds no origin).
    fn keys(&mut self, index: u32) -> Option<Keys> {
        let source = self.sources[index as usize].as_mut()?;
        let oldest = source.front()?;
        Some(Keys {
            size: (source.held(), Reverse(oldest.stamp), index),
            idle: (oldest.seen_ms, index),
        })
    }

    /// Source `index`'s keys before a change, if they are kept.
    fn key_before(&mut self, index: u32) -> Option<Keys> {
        if self.sizes_kept() {
            self.keys(index)
        } else {
            None
        }
    }

    /// Moves a source in `by_size` and `by_idle` from `before` to its keys now, if they are
    /// kept.
    fn rekey(&mut self, index: u32, before: Option<Keys>) {
        if !self.sizes_kept() {
            return;
        }
        let after = self.keys(index);
        if let Some(keys) = before {
            if after.is_none_or(|a| a.size != keys.size) {
                let indexed = self.by_size.remove(&keys.size);
                assert!(indexed, "a source missing from the size order");
            }
            if after.is_none_or(|a| a.idle != keys.idle) {
                let indexed = self.by_idle.remove(&keys.idle);
                assert!(indexed, "a source missing from the idle order");
            }
        }
        if let Some(keys) = after {
            if before.is_none_or(|b| b.size != keys.size) {
                self.by_size.insert(keys.size);
            }
            if before.is_none_or(|b| b.idle != keys.idle) {
                self.by_idle.insert(keys.idle);
            }
        }
    }

    fn stamp(&mut self) -> u64 {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        stamp
    }

    /// (source, serial of its slot) of origin `id`, if remembered.
    fn find(&self, id: &str) -> Option<(u32, u64)> {
        let (prefix, number) = split(id);
        let source = self.find_source(prefix)?;
        let serial = *self.source(source).numbers.get(&number)?;
        Some((source, serial))
    }

    /// Forgets, in every source, the oldest origins while they were accepted `idle_ms_max` or
    /// more ago.
    pub fn forget_idle(&mut self, now_ms: u64) -> Released {
        let mut released = Vec::new();
        loop {
            let (seen_ms, index) = if self.sizes_kept() {
                *self.by_idle.first().expect("sizes are kept")
            } else {
                let Some(&index) = self.by_prefix.values().next() else {
                    break;
                };
                let oldest = self
                    .source_mut(index)
                    .front()
                    .expect("a kept source holds one");
                (oldest.seen_ms, index)
            };
            if !self.forgetting.is_idle(seen_ms, now_ms) {
                break;
            }
            self.forget_front(index, &mut released);
        }
        released
    }

    fn insert_new(&mut self, id: &str, seen_ms: u64, lsn: Option<u64>, released: &mut Released) {
        assert!(!id.is_empty() && id.len() <= PRODUCER_ID_BYTES_MAX);
        // Make room first, so a new origin is never its own victim (nor its source dropped
        // under it).
        while self.len >= self.forgetting.entries_max {
            let largest = self.largest();
            self.forget_front(largest, released);
            self.forgetting.forgotten_for_room_total += 1;
        }
        let (prefix, number) = split(id);
        let index = self.find_or_add_source(prefix);
        let before = self.key_before(index);
        let stamp = self.stamp();
        self.source_mut(index).push(Slot {
            number,
            stamp,
            seen_ms,
            lsn,
        });
        self.rekey(index, before);
        self.len += 1;
    }

    /// Moves the origin in slot `serial` of source `index` to the back, now carried by the
    /// record at `lsn` (and seen at `seen_ms`, if given), leaving its place vacant. Returns its
    /// old record's LSN.
    fn move_to_back(
        &mut self,
        index: u32,
        serial: u64,
        lsn: u64,
        seen_ms: Option<u64>,
    ) -> Option<u64> {
        let before = self.key_before(index);
        let stamp = self.stamp();
        let source = self.source_mut(index);
        let position = source.position(serial);
        let slot = source.slots[position].take().expect("moving a vacant slot");
        source.numbers.remove(&slot.number);
        source.push(Slot {
            stamp,
            lsn: Some(lsn),
            seen_ms: seen_ms.unwrap_or(slot.seen_ms),
            ..slot
        });
        self.rekey(index, before);
        slot.lsn
    }

    /// Forgets the oldest origin of source `index`, which holds one.
    fn forget_front(&mut self, index: u32, released: &mut Released) {
        let before = self.key_before(index);
        let slot = self.source_mut(index).pop_front();
        self.rekey(index, before);
        self.len -= 1;
        if self.source(index).held() == 0 {
            let prefix = self.source(index).prefix.clone();
            self.by_prefix.remove(&prefix);
            self.sources[index as usize] = None;
            self.free_sources.push(index);
            if self.last_source.get() == index {
                self.last_source.set(NO_SOURCE);
            }
            if self.by_prefix.len() == 1 {
                self.by_size.clear();
                self.by_idle.clear();
            }
        }
        if let Some(lsn) = slot.lsn {
            released.push(lsn);
        }
        self.forgetting.forgotten_total += 1;
    }

    /// Every origin remembered, as (source, slot): by source, oldest first in each.
    fn remembered(&self) -> impl Iterator<Item = (&Source, &Slot)> {
        self.sources
            .iter()
            .flatten()
            .flat_map(|source| source.slots.iter().flatten().map(move |o| (source, o)))
    }

    // ----------------------------------------------------------------------------------------
    // Inspection

    pub fn stats(&self) -> OriginStats {
        let counts = self.forgetting.stats(self.len);
        OriginStats {
            remembered: self.len,
            sources: self.by_prefix.len(),
            duplicates_dropped_total: counts.duplicates_dropped_total,
            forgotten_total: counts.forgotten_total,
            forgotten_for_room_total: counts.forgotten_for_room_total,
        }
    }

    /// Origin → (1, seen_ms) as the log has it: equal before a crash and after replay.
    pub fn durable_marks(&self) -> BTreeMap<String, (u64, u64)> {
        self.remembered()
            .filter(|(_, o)| o.lsn.is_some())
            .map(|(s, o)| (join(&s.prefix, o.number), (ORIGIN_SEQ, o.seen_ms)))
            .collect()
    }

    /// Origins with a durable mark (each is one live object).
    pub fn durable_count(&self) -> usize {
        self.remembered().filter(|(_, o)| o.lsn.is_some()).count()
    }

    /// The live object of each durable mark: (lsn, id), for the caller's cross-check.
    pub fn durable_lsns(&self) -> Vec<(u64, String)> {
        self.remembered()
            .filter_map(|(s, o)| o.lsn.map(|lsn| (lsn, join(&s.prefix, o.number))))
            .collect()
    }

    pub fn check_invariants(&self) {
        assert!(self.len <= self.forgetting.entries_max);
        assert_eq!(self.len, self.remembered().count());
        let indexed: usize = self.sources.iter().flatten().map(Source::held).sum();
        assert_eq!(indexed, self.len, "an origin indexed but not in the queue");
        assert_eq!(self.by_prefix.len(), self.sources.iter().flatten().count());
        if self.sizes_kept() {
            assert_eq!(self.by_size.len(), self.by_prefix.len());
            assert_eq!(self.by_idle.len(), self.by_prefix.len());
        } else {
            assert!(
                self.by_size.is_empty() && self.by_idle.is_empty(),
                "keys for one source"
            );
        }
        for (index, source) in self.sources.iter().enumerate() {
            let Some(source) = source else {
                assert!(self.free_sources.contains(&(index as u32)));
                continue;
            };
            assert!(!source.numbers.is_empty(), "an empty source kept");
            assert_eq!(self.by_prefix.get(&source.prefix), Some(&(index as u32)));
            let oldest = source.slots.iter().flatten().next().expect("not empty");
            assert!(
                !self.sizes_kept()
                    || self
                        .by_size
                        .contains(&(source.held(), Reverse(oldest.stamp), index as u32))
                        && self.by_idle.contains(&(oldest.seen_ms, index as u32)),
                "a source's keys are stale"
            );
            let mut last_lsn = 0;
            let mut last_stamp = None;
            for (position, slot) in source.slots.iter().enumerate() {
                let Some(o) = slot else { continue };
                let serial = source.front_serial + position as u64;
                assert_eq!(source.numbers.get(&o.number), Some(&serial));
                let id = join(&source.prefix, o.number);
                assert_eq!(split(&id), (&*source.prefix, o.number));
                assert!(
                    last_stamp < Some(o.stamp),
                    "a source's origins out of order"
                );
                assert!(o.stamp < self.next_stamp);
                last_stamp = Some(o.stamp);
                if let Some(lsn) = o.lsn {
                    assert!(
                        lsn > last_lsn,
                        "a source's durable origins out of log order"
                    );
                    last_lsn = lsn;
                }
            }
        }
    }
}

impl MarkTable for Origins {
    /// 1 once `id` was accepted and not forgotten, else 0.
    fn hwm(&self, id: &str) -> u64 {
        if self.find(id).is_some() {
            ORIGIN_SEQ
        } else {
            0
        }
    }

    fn is_duplicate(&self, id: &str, seq: u64) -> bool {
        assert_eq!(seq, ORIGIN_SEQ, "an origin's only sequence number is 1");
        self.find(id).is_some()
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
        assert_eq!(seq, ORIGIN_SEQ, "an origin's only sequence number is 1");
        // A duplicate accepted (a caller's bug: it asks `is_duplicate` first) is caught by
        // `push`'s index, unless making room forgot that very origin first. A second lookup
        // here, to catch that case too, cost a fifth of accepting an origin.
        let mut released = Vec::new();
        self.insert_new(id, now_ms, lsn, &mut released);
        // Only a logged origin is a live object, which the caller's live set names by id.
        (lsn.map(|_| Arc::from(id)), released)
    }

    /// The record at `lsn` carries origin `mark.producer`: its message's store record, or
    /// compaction's re-log of it, which moves it to the back as the re-log did live.
    fn replay(&mut self, mark: &ProducerMark, lsn: u64) -> (Id, Released) {
        assert_eq!(
            mark.seq, ORIGIN_SEQ,
            "an origin's only sequence number is 1"
        );
        let mut released = Vec::new();
        match self.find(&mark.producer) {
            Some((source, serial)) => {
                released.extend(self.move_to_back(source, serial, lsn, Some(mark.seen_ms)))
            }
            None => self.insert_new(&mark.producer, mark.seen_ms, Some(lsn), &mut released),
        }
        (Arc::from(mark.producer.as_str()), released)
    }

    fn durable_mark(&self, id: &str) -> Option<ProducerMark> {
        let (source, serial) = self.find(id)?;
        let slot = self.source(source).slot(serial);
        slot.lsn?;
        Some(ProducerMark {
            producer: id.to_string(),
            seq: ORIGIN_SEQ,
            seen_ms: slot.seen_ms,
        })
    }

    /// The origin moves to the back: its record is now the newest.
    fn relogged(&mut self, id: &str, lsn: u64) -> u64 {
        let (source, serial) = self.find(id).expect("re-logged origin is remembered");
        let old = self
            .move_to_back(source, serial, lsn, None)
            .expect("re-logged origin has a durable mark");
        assert!(old < lsn, "re-logged below its own record");
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(t: &mut Origins, id: &str, now_ms: u64, lsn: Option<u64>) -> Released {
        let (kept, released) = t.accept(id, 1, now_ms, lsn);
        assert_eq!(kept.as_deref(), lsn.map(|_| id));
        t.check_invariants();
        released
    }

    fn mark(id: &str, seen_ms: u64) -> ProducerMark {
        ProducerMark {
            producer: id.to_string(),
            seq: 1,
            seen_ms,
        }
    }

    #[test]
    fn an_accepted_origin_is_a_duplicate_until_forgotten() {
        let mut t = Origins::new(1_000, 10);
        assert!(!t.is_duplicate("haven-net:s/1", 1));
        accept(&mut t, "haven-net:s/1", 5, Some(3));
        assert!(t.is_duplicate("haven-net:s/1", 1));
        assert!(!t.is_duplicate("haven-net:s/2", 1));
        assert_eq!((t.hwm("haven-net:s/1"), t.hwm("haven-net:s/2")), (1, 0));
        assert_eq!(t.durable_marks()["haven-net:s/1"], (1, 5));
    }

    #[test]
    fn beyond_the_limit_the_oldest_is_forgotten_and_its_record_released() {
        let mut t = Origins::new(1_000, 2);
        accept(&mut t, "a", 1, Some(1));
        accept(&mut t, "b", 2, None);
        assert_eq!(accept(&mut t, "c", 3, Some(5)), vec![1]);
        // "b" was only in memory: forgetting it releases no record.
        assert!(accept(&mut t, "d", 4, Some(6)).is_empty());
        assert_eq!(
            (t.hwm("a"), t.hwm("b"), t.hwm("c"), t.hwm("d")),
            (0, 0, 1, 1)
        );
        assert_eq!(t.stats().forgotten_total, 2);
        assert_eq!(t.stats().remembered, 2);
    }

    #[test]
    fn idle_origins_are_forgotten_from_the_front() {
        let mut t = Origins::new(100, 10);
        accept(&mut t, "a", 0, Some(1));
        accept(&mut t, "b", 50, None);
        assert!(t.forget_idle(99).is_empty());
        assert_eq!(t.forget_idle(100), vec![1]);
        assert!(t.forget_idle(149).is_empty());
        assert!(t.forget_idle(150).is_empty(), "b had no record");
        assert_eq!(t.stats().remembered, 0);
        t.check_invariants();
    }

    #[test]
    fn forgetting_by_count_takes_from_the_largest_source_oldest_first() {
        let mut t = Origins::new(1_000, 5);
        accept(&mut t, "q/1", 0, Some(1));
        accept(&mut t, "b/1", 1, Some(2));
        accept(&mut t, "b/2", 2, Some(3));
        accept(&mut t, "c/1", 3, Some(4));
        accept(&mut t, "c/2", 4, Some(5));
        // b and c hold two each, and b's oldest is the older: b/1 goes.
        assert_eq!(accept(&mut t, "b/3", 5, Some(6)), vec![2]);
        // A tie again (b/2, b/3 and c/1, c/2): b/2 is the oldest of the two fronts.
        assert_eq!(accept(&mut t, "c/3", 6, Some(7)), vec![3]);
        // c holds three now: its oldest goes, whoever is the newcomer.
        assert_eq!(accept(&mut t, "b/4", 7, Some(8)), vec![4]);
        assert_eq!(accept(&mut t, "d/1", 8, Some(9)), vec![5]);
        // The quiet source kept its one origin through all of it.
        assert!(t.is_duplicate("q/1", 1));
        assert_eq!(t.forgetting.forgotten_total, 4);
    }

    #[test]
    fn idle_forgetting_looks_at_every_sources_oldest() {
        let mut t = Origins::new(100, 10);
        accept(&mut t, "a/1", 0, Some(1));
        accept(&mut t, "b/1", 10, Some(2));
        accept(&mut t, "a/2", 50, None);
        accept(&mut t, "b/2", 120, Some(3));
        assert_eq!(t.forget_idle(110), vec![1, 2]);
        assert!(t.forget_idle(150).is_empty(), "a/2 had no record");
        assert_eq!(t.stats().remembered, 1);
        assert!(t.is_duplicate("b/2", 1));
        assert_eq!(t.forget_idle(220), vec![3]);
        assert_eq!(t.stats().remembered, 0);
        t.check_invariants();
    }

    #[test]
    fn a_relogged_origin_moves_to_the_back_keeping_its_time() {
        let mut t = Origins::new(100, 2);
        accept(&mut t, "a", 0, Some(1));
        accept(&mut t, "b", 10, Some(2));
        assert_eq!(t.relogged("a", 7), 1);
        t.check_invariants();
        assert_eq!(t.durable_mark("a"), Some(mark("a", 0)));
        // "b" is now the oldest in the queue: the next new origin evicts it.
        assert_eq!(accept(&mut t, "c", 20, Some(8)), vec![2]);
        // Idle forgetting stops at the front ("a" is idle at 100, and goes).
        assert_eq!(t.forget_idle(100), vec![7]);
        assert_eq!(t.stats().remembered, 1);
    }

    #[test]
    fn replay_rebuilds_the_durable_origins_in_the_same_order() {
        let mut live = Origins::new(1_000, 3);
        accept(&mut live, "a", 0, Some(1));
        accept(&mut live, "n", 1, None);
        accept(&mut live, "b", 2, Some(3));
        let old = live.relogged("a", 4);
        assert_eq!(old, 1);
        // The log now holds: 1 store(a), 3 store(b), 4 re-log(a).
        let mut replayed = Origins::new(1_000, 3);
        assert!(replayed.replay(&mark("a", 0), 1).1.is_empty());
        assert!(replayed.replay(&mark("b", 2), 3).1.is_empty());
        let (_, released) = replayed.replay(&mark("a", 0), 4);
        assert_eq!(released, vec![1]);
        replayed.check_invariants();
        assert_eq!(live.durable_marks(), replayed.durable_marks());
        assert_eq!(live.durable_lsns(), replayed.durable_lsns());
        // Both forget "b" first.
        let l = accept(&mut live, "c", 5, Some(5));
        let r = accept(&mut replayed, "c", 5, Some(5));
        assert!(r.is_empty(), "the replayed table had room");
        assert_eq!(l, vec![]);
        // The live table's next eviction was its in-memory origin; both then forget "b".
        assert_eq!(accept(&mut live, "d", 6, Some(6)), vec![3]);
        assert_eq!(accept(&mut replayed, "d", 6, Some(6)), vec![3]);
        assert_eq!(live.durable_marks(), replayed.durable_marks());
    }

    #[test]
    fn an_id_splits_into_prefix_and_number_and_joins_back_exactly() {
        for (id, prefix, number) in [
            ("haven-net:s/ID:haven-1f-42", "haven-net:s/ID:haven-1f-", 42),
            ("haven-net:s/ID:7", "haven-net:s/ID:", 7),
            ("abc", "abc", 0),
            ("x0", "x0", 0),
            ("x007", "x007", 0),
            ("123", "123", 0),
            ("a99999999999999999999", "a99999999999999999999", 0),
            ("a18446744073709551615", "a", u64::MAX),
            ("", "", 0),
        ] {
            assert_eq!(split(id), (prefix, number), "{id}");
            assert_eq!(join(prefix, number), id);
        }
    }

    #[test]
    fn origins_of_many_sources_and_odd_ids_are_told_apart() {
        let mut t = Origins::new(1_000, 100);
        let ids = [
            "s1/ID:1", "s1/ID:2", "s2/ID:1", "s1/ID:01", "plain", "s1/ID:", "7",
        ];
        for (n, id) in ids.iter().enumerate() {
            assert!(!t.is_duplicate(id, 1), "{id}");
            accept(&mut t, id, 0, Some(n as u64 + 1));
        }
        for id in ids {
            assert!(t.is_duplicate(id, 1), "{id}");
        }
        assert!(!t.is_duplicate("s1/ID:3", 1) && !t.is_duplicate("s3/ID:1", 1));
        let marks: Vec<String> = t.durable_marks().into_keys().collect();
        let mut expected: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        expected.sort();
        assert_eq!(marks, expected);
        // Forgetting a source's last origin drops the source; a new one reuses its place.
        let mut small = Origins::new(1_000, 1);
        accept(&mut small, "a/1", 0, Some(1));
        assert_eq!(accept(&mut small, "b/1", 0, Some(2)), vec![1]);
        assert_eq!(accept(&mut small, "a/2", 0, Some(3)), vec![2]);
        assert!(!small.is_duplicate("a/1", 1) && !small.is_duplicate("b/1", 1));
        assert_eq!(small.sources.len(), 1, "the freed place was reused");
    }

    /// An op of the random test: accept a new origin of a source (numbers of a source rise,
    /// with gaps), re-log the `pick`-th remembered durable origin, or let time pass and
    /// forget idle origins.
    #[derive(Clone, Debug)]
    enum Op {
        Accept {
            source: usize,
            gap: u64,
            durable: bool,
        },
        Relog {
            pick: usize,
        },
        Advance {
            ms: u64,
        },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..4usize, 1..4u64, proptest::bool::weighted(0.8))
                .prop_map(|(source, gap, durable)| Op::Accept { source, gap, durable }),
            1 => (0..64usize).prop_map(|pick| Op::Relog { pick }),
            1 => (0..40u64).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    /// The test's plain model of a remembered origin.
    struct Remembered {
        id: String,
        source: usize,
        /// Orders origins as the table queues them (a re-log takes a new place).
        place: u64,
        lsn: Option<u64>,
        seen_ms: u64,
    }

    proptest::proptest! {
        /// Against a plain list that forgets the oldest origin of the source holding the most
        /// (of two holding as many, the one whose oldest is older), and each source's oldest
        /// while it is idle: the same origins are remembered and the same records released
        /// after every op; and the log replayed (when every origin was logged and none was
        /// forgotten for idleness) rebuilds the same table.
        #[test]
        fn forgetting_matches_a_plain_model_and_replay(
            ops in proptest::collection::vec(op(), 1..300),
            max in 1..12usize,
        ) {
            const IDLE_MS: u64 = 100;
            let mut t = Origins::new(IDLE_MS, max);
            let mut now = 0u64;
            let mut model: Vec<Remembered> = Vec::new();
            let mut next = [0u64; 4];
            let mut place = 0u64;
            let mut lsn = 0u64;
            let mut log: Vec<(ProducerMark, u64)> = Vec::new();
            let mut replayable = true;
            let mut ids: Vec<String> = Vec::new();
            let oldest_of = |model: &[Remembered], s: usize| {
                model.iter().filter(|o| o.source == s).map(|o| o.place).min()
            };
            for op in ops {
                let mut expected = Vec::new();
                let mut released = match op {
                    Op::Accept { source, gap, durable } => {
                        next[source] += gap;
                        let id = format!("s{source}/ID:{}", next[source]);
                        while model.len() >= max {
                            let held = |s: usize| model.iter().filter(|o| o.source == s).count();
                            let victim = (0..4)
                                .filter(|&s| held(s) > 0)
                                .max_by_key(|&s| {
                                    (held(s), std::cmp::Reverse(oldest_of(&model, s)))
                                })
                                .unwrap();
                            let oldest = oldest_of(&model, victim);
                            let at = model.iter().position(|o| Some(o.place) == oldest).unwrap();
                            expected.extend(model.remove(at).lsn);
                        }
                        replayable &= durable;
                        let at = durable.then(|| {
                            lsn += 1;
                            lsn
                        });
                        if let Some(at) = at {
                            log.push((mark(&id, now), at));
                        }
                        place += 1;
                        model.push(Remembered { id: id.clone(), source, place, lsn: at, seen_ms: now });
                        ids.push(id.clone());
                        accept(&mut t, &id, now, at)
                    }
                    Op::Relog { pick } => {
                        let durable: Vec<usize> =
                            (0..model.len()).filter(|&i| model[i].lsn.is_some()).collect();
                        if durable.is_empty() {
                            continue;
                        }
                        let o = &mut model[durable[pick % durable.len()]];
                        lsn += 1;
                        place += 1;
                        o.place = place;
                        let old = o.lsn.replace(lsn).unwrap();
                        log.push((mark(&o.id, o.seen_ms), lsn));
                        proptest::prop_assert_eq!(t.relogged(&o.id, lsn), old);
                        t.check_invariants();
                        Vec::new()
                    }
                    Op::Advance { ms } => {
                        now += ms;
                        while let Some(at) = (0..model.len()).find(|&i| {
                            let o = &model[i];
                            oldest_of(&model, o.source) == Some(o.place)
                                && o.seen_ms + IDLE_MS <= now
                        }) {
                            expected.extend(model.remove(at).lsn);
                            replayable = false;
                        }
                        let released = t.forget_idle(now);
                        t.check_invariants();
                        released
                    }
                };
                released.sort();
                expected.sort();
                proptest::prop_assert_eq!(released, expected);
                for id in &ids {
                    let known = model.iter().any(|o| &o.id == id);
                    proptest::prop_assert_eq!(t.is_duplicate(id, 1), known, "{}", id);
                }
            }
            if replayable {
                let mut replayed = Origins::new(IDLE_MS, max);
                for (m, at) in &log {
                    replayed.replay(m, *at);
                    replayed.check_invariants();
                }
                proptest::prop_assert_eq!(replayed.durable_marks(), t.durable_marks());
                let mut a = replayed.durable_lsns();
                let mut b = t.durable_lsns();
                a.sort();
                b.sort();
                proptest::prop_assert_eq!(a, b);
            }
        }
    }

    #[test]
    #[should_panic(expected = "an origin indexed twice")]
    fn accepting_a_known_origin_is_a_bug() {
        let mut t = Origins::new(1_000, 10);
        t.accept("a", 1, 0, None);
        t.accept("a", 1, 0, None);
    }
}

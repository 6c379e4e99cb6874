//! The paged-out part of a queue: for each message only in the log, where to read it back.
//!
//! With millions of messages paged out this is most of the memory a deep backlog costs, so it
//! is a deque of fixed-size chunks of 24-byte entries sorted by seq (arrival order) rather than
//! a B-tree (whose half-full nodes cost about 3× as much for appends at one end). Entries
//! leave almost always from the front; a removal elsewhere leaves a tombstone that is dropped
//! when the front reaches it. Each chunk knows its lowest and highest LSN, so the log's
//! retention (lowest live LSN) and compaction (entries below an LSN) skip most chunks.

use std::cell::Cell;
use std::collections::VecDeque;

/// Entries per chunk: large enough that per-chunk overhead is negligible, small enough that an
/// insertion in the middle (rare: replay of a compacted message) shifts little.
const CHUNK_ENTRIES_MAX: usize = 4096;

/// LSN marking a removed entry.
const TOMBSTONE_LSN: u64 = u64::MAX;

/// A waiting message whose only copy is in the log (paged out): where to read it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColdRef {
    /// The record describing the message (a `Store`, `Commit`, `Spill` or `Fire`).
    pub lsn: u64,
    /// Its `size_bytes`, so limits can count it without reading it.
    pub bytes: u32,
    /// A non-persistent message spilled to the log: gone after a restart.
    pub spilled: bool,
    /// Recovered from the log after a restart: may have been delivered before.
    pub recovered: bool,
}

impl ColdRef {
    /// The reference to a message of `size_bytes` (`Message::size_bytes`), described by the
    /// record at `lsn`.
    pub fn new(lsn: u64, size_bytes: u64, spilled: bool, recovered: bool) -> ColdRef {
        ColdRef {
            lsn,
            bytes: u32::try_from(size_bytes).unwrap_or(u32::MAX),
            spilled,
            recovered,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    seq: u64,
    cref: ColdRef,
}

impl Entry {
    fn is_live(&self) -> bool {
        self.cref.lsn != TOMBSTONE_LSN
    }
}

#[derive(Debug, Default)]
struct Chunk {
    entries: Vec<Entry>,
    /// Entries before this index are tombstones the front of the queue has passed. They stay
    /// until the chunk empties: removing them at once would shift the whole chunk on every
    /// message taken from the front (a 4096-entry memmove per message, 7% of a draining
    /// broker's CPU when measured).
    head: usize,
    /// Lowest and highest LSN among live entries, recomputed lazily (`stale`) after the entry
    /// holding one is removed or moved: a range that is too wide costs only a scan.
    lsn_min: Cell<u64>,
    lsn_max: Cell<u64>,
    stale: Cell<bool>,
}

impl Chunk {
    fn new() -> Chunk {
        Chunk {
            entries: Vec::with_capacity(CHUNK_ENTRIES_MAX),
            head: 0,
            lsn_min: Cell::new(u64::MAX),
            lsn_max: Cell::new(0),
            stale: Cell::new(false),
        }
    }

    fn note_lsn(&mut self, lsn: u64) {
        self.lsn_min.set(self.lsn_min.get().min(lsn));
        self.lsn_max.set(self.lsn_max.get().max(lsn));
    }

    /// An entry with `lsn` left: the range may now be too wide.
    fn forget_lsn(&self, lsn: u64) {
        if lsn == self.lsn_min.get() || lsn == self.lsn_max.get() {
            self.stale.set(true);
        }
    }

    /// (lowest, highest) LSN of the live entries; (MAX, 0) if none.
    fn range(&self) -> (u64, u64) {
        if self.stale.get() {
            let (mut lo, mut hi) = (u64::MAX, 0);
            for e in self.entries.iter().filter(|e| e.is_live()) {
                lo = lo.min(e.cref.lsn);
                hi = hi.max(e.cref.lsn);
            }
            self.lsn_min.set(lo);
            self.lsn_max.set(hi);
            self.stale.set(false);
        }
        (self.lsn_min.get(), self.lsn_max.get())
    }

    fn first_seq(&self) -> u64 {
        self.entries[0].seq
    }

    /// Entries from the first one not yet passed.
    fn current(&self) -> &[Entry] {
        &self.entries[self.head..]
    }

    /// Drops the passed tombstones, so entries can be inserted anywhere.
    fn compact(&mut self) {
        self.entries.drain(..self.head);
        self.head = 0;
    }
}

#[derive(Debug, Default)]
pub(crate) struct ColdQueue {
    chunks: VecDeque<Chunk>,
    /// Live entries.
    len: usize,
    /// Sum of live entries' `bytes`.
    bytes: u64,
}

impl ColdQueue {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// (chunk, index) of `seq`'s entry, live or tombstone.
    fn position(&self, seq: u64) -> Option<(usize, usize)> {
        let c = self.chunk_for(seq)?;
        let i = self.chunks[c]
            .entries
            .binary_search_by_key(&seq, |e| e.seq)
            .ok()?;
        Some((c, i))
    }

    /// The chunk whose range would hold `seq` (the last chunk starting at or before it).
    fn chunk_for(&self, seq: u64) -> Option<usize> {
        let n = self.chunks.partition_point(|c| c.first_seq() <= seq);
        n.checked_sub(1)
    }

    pub fn get(&self, seq: u64) -> Option<&ColdRef> {
        let (c, i) = self.position(seq)?;
        let e = &self.chunks[c].entries[i];
        e.is_live().then_some(&e.cref)
    }

    pub fn contains(&self, seq: u64) -> bool {
        self.get(seq).is_some()
    }

    /// Points a live entry at another record (compaction re-logged it).
    pub fn set_lsn(&mut self, seq: u64, lsn: u64) {
        assert_ne!(lsn, TOMBSTONE_LSN);
        let (c, i) = self.position(seq).expect("entry to move exists");
        let chunk = &mut self.chunks[c];
        assert!(chunk.entries[i].is_live(), "moving a removed entry");
        chunk.forget_lsn(chunk.entries[i].cref.lsn);
        chunk.entries[i].cref.lsn = lsn;
        chunk.note_lsn(lsn);
    }

    pub fn insert(&mut self, seq: u64, cref: ColdRef) {
        assert_ne!(cref.lsn, TOMBSTONE_LSN);
        self.len += 1;
        self.bytes += u64::from(cref.bytes);
        let entry = Entry { seq, cref };
        let append = self
            .chunks
            .back()
            .is_none_or(|c| c.entries.last().is_none_or(|l| l.seq < seq));
        if append {
            if self
                .chunks
                .back()
                .is_none_or(|c| c.entries.len() >= CHUNK_ENTRIES_MAX)
            {
                self.chunks.push_back(Chunk::new());
            }
            let chunk = self.chunks.back_mut().expect("just ensured");
            chunk.entries.push(entry);
            chunk.note_lsn(cref.lsn);
            return;
        }
        // Out of order (replay of a compacted message whose earlier record is gone).
        let c = self.chunk_for(seq).unwrap_or(0);
        let chunk = &mut self.chunks[c];
        chunk.compact();
        match chunk.entries.binary_search_by_key(&seq, |e| e.seq) {
            Ok(i) => {
                assert!(!chunk.entries[i].is_live(), "message paged out twice");
                chunk.entries[i] = entry;
            }
            Err(i) => chunk.entries.insert(i, entry),
        }
        chunk.note_lsn(cref.lsn);
        if chunk.entries.len() > 2 * CHUNK_ENTRIES_MAX {
            let rest = chunk.entries.split_off(CHUNK_ENTRIES_MAX);
            chunk.stale.set(true);
            let tail = Chunk::new();
            tail.stale.set(true);
            let mut tail = tail;
            tail.entries = rest;
            self.chunks.insert(c + 1, tail);
        }
    }

    pub fn remove(&mut self, seq: u64) -> Option<ColdRef> {
        let (c, i) = self.position(seq)?;
        let e = self.chunks[c].entries[i];
        if !e.is_live() {
            return None;
        }
        self.len -= 1;
        self.bytes -= u64::from(e.cref.bytes);
        self.chunks[c].entries[i].cref.lsn = TOMBSTONE_LSN;
        self.chunks[c].forget_lsn(e.cref.lsn);
        self.drop_leading_tombstones();
        Some(e.cref)
    }

    fn drop_leading_tombstones(&mut self) {
        while let Some(chunk) = self.chunks.front_mut() {
            let dead = chunk.current().iter().take_while(|e| !e.is_live()).count();
            chunk.head += dead;
            if chunk.head == chunk.entries.len() {
                self.chunks.pop_front();
                continue;
            }
            break;
        }
    }

    /// The earliest entry (the next to page in).
    pub fn first(&self) -> Option<(u64, ColdRef)> {
        let e = self.chunks.front()?.current().first()?;
        assert!(e.is_live(), "leading tombstones are passed");
        Some((e.seq, e.cref))
    }

    /// The seq of the last entry (a removed one's, if it was removed: never below the last
    /// live entry's).
    pub fn last_seq(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let e = self.chunks.back()?.entries.last()?;
        Some(e.seq)
    }

    /// Every live entry, in seq order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, ColdRef)> + '_ {
        self.chunks
            .iter()
            .flat_map(|c| c.current().iter())
            .filter(|e| e.is_live())
            .map(|e| (e.seq, e.cref))
    }

    pub fn take_all(&mut self) -> Vec<(u64, ColdRef)> {
        let all = self.iter().collect();
        *self = ColdQueue::default();
        all
    }

    /// Lowest LSN any entry needs kept.
    pub fn lsn_min(&self) -> Option<u64> {
        self.chunks
            .iter()
            .map(|c| c.range().0)
            .filter(|&lo| lo != u64::MAX)
            .min()
    }

    /// Up to `max` (lsn, seq) of entries described below `lsn_limit`.
    pub fn below(&self, lsn_limit: u64, max: usize) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for chunk in self.chunks.iter().filter(|c| c.range().0 < lsn_limit) {
            for e in chunk.entries.iter().filter(|e| e.cref.lsn < lsn_limit) {
                if out.len() >= max {
                    return out;
                }
                out.push((e.cref.lsn, e.seq));
            }
        }
        out
    }

    /// Entries described by records in `lo..hi`.
    pub fn count_in(&self, lo: u64, hi: u64) -> usize {
        self.chunks
            .iter()
            .filter(|c| {
                let (min, max) = c.range();
                min < hi && max >= lo
            })
            .flat_map(|c| c.entries.iter())
            .filter(|e| (lo..hi).contains(&e.cref.lsn))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cref(lsn: u64) -> ColdRef {
        ColdRef {
            lsn,
            bytes: 10,
            spilled: false,
            recovered: false,
        }
    }

    /// Random operations against a BTreeMap model (deterministic LCG).
    #[test]
    fn behaves_like_an_ordered_map() {
        let mut rng = 12345u64;
        let mut next = || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            rng >> 33
        };
        let mut q = ColdQueue::default();
        let mut model: BTreeMap<u64, ColdRef> = BTreeMap::new();
        let mut seq = 0u64;
        for step in 0..200_000u64 {
            match next() % 10 {
                0..=4 => {
                    seq += 1 + next() % 3;
                    q.insert(seq, cref(step));
                    model.insert(seq, cref(step));
                }
                5..=6 => {
                    if let Some((&s, _)) = model.first_key_value() {
                        assert_eq!(q.remove(s), model.remove(&s));
                    }
                }
                7 => {
                    let s = next() % (seq + 1);
                    assert_eq!(q.remove(s), model.remove(&s));
                }
                8 => {
                    // Re-insert something removed, out of order.
                    let s = next() % (seq + 1);
                    if !model.contains_key(&s) && s > 0 {
                        q.insert(s, cref(step));
                        model.insert(s, cref(step));
                    }
                }
                _ => {
                    if let Some((&s, _)) = model.iter().nth((next() % 8) as usize) {
                        q.set_lsn(s, step + 1_000_000);
                        model.get_mut(&s).unwrap().lsn = step + 1_000_000;
                    }
                }
            }
            assert_eq!(q.len(), model.len());
            assert_eq!(q.first(), model.first_key_value().map(|(s, c)| (*s, *c)));
            if step % 5_000 == 0 {
                let all: Vec<(u64, ColdRef)> = model.iter().map(|(s, c)| (*s, *c)).collect();
                assert_eq!(q.iter().collect::<Vec<_>>(), all);
                assert_eq!(q.lsn_min(), model.values().map(|c| c.lsn).min());
                assert_eq!(q.bytes(), 10 * model.len() as u64);
                let limit = step / 2;
                let below: Vec<(u64, u64)> = q.below(limit, usize::MAX);
                let want: Vec<(u64, u64)> = model
                    .iter()
                    .filter(|(_, c)| c.lsn < limit)
                    .map(|(s, c)| (c.lsn, *s))
                    .collect();
                assert_eq!(below, want);
                assert_eq!(
                    q.count_in(limit / 2, limit),
                    want.iter().filter(|(l, _)| *l >= limit / 2).count()
                );
            }
        }
    }

    /// Taking from the front passes tombstones instead of shifting the chunk: a drain of a
    /// deep backlog costs O(1) per message, not O(chunk).
    #[test]
    fn taking_from_the_front_does_not_shift_the_chunk() {
        let mut q = ColdQueue::default();
        let n = CHUNK_ENTRIES_MAX as u64 + 10;
        for seq in 1..=n {
            q.insert(seq, cref(seq));
        }
        for seq in 1..=100 {
            assert_eq!(q.remove(seq), Some(cref(seq)));
            assert_eq!(
                q.chunks[0].entries.len(),
                CHUNK_ENTRIES_MAX,
                "chunk shifted"
            );
            assert_eq!(q.first(), Some((seq + 1, cref(seq + 1))));
        }
        // An out-of-order insertion into the front chunk drops what was passed first.
        q.remove(102);
        q.insert(102, cref(7));
        assert_eq!(q.chunks[0].entries.len(), CHUNK_ENTRIES_MAX - 100);
        assert_eq!(q.first(), Some((101, cref(101))));
        for seq in 101..=CHUNK_ENTRIES_MAX as u64 {
            q.remove(seq);
        }
        assert_eq!(q.chunks.len(), 1, "an emptied chunk is dropped");
        assert_eq!(q.len(), 10);
    }
}

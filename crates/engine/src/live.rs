//! Which log positions still matter.
//!
//! Every durable object — a stored message, a durable subscription — is described in full by
//! one record at a known LSN. The lowest such LSN bounds what the log must keep: segments
//! wholly below it can be deleted, and compaction re-logs the objects in an old, sparse
//! segment so that segment can go too. Spilled non-persistent messages (see `paging`) count
//! too while their only copy is in the log, and so do producers' sequence marks (the newest
//! record carrying each, see `producers`).
//!
//! Messages are kept as bare `(lsn, seq)` pairs: with a deep backlog paged out to disk this set
//! is most of the memory a message costs (about 20 bytes each in the B-tree).

use crate::producers::Id;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum LiveObject {
    Message(u64),
    DurableSub {
        client_id: String,
        name: String,
    },
    /// A declared queue (a virtual topic's consumer queue): exists even while empty.
    Queue(String),
    /// A producer's durable sequence mark (exactly-once sends): the producer table's own id.
    Producer(Id),
}

#[derive(Default, Debug)]
pub(crate) struct LiveSet {
    messages: BTreeSet<(u64, u64)>,
    subs: BTreeSet<(u64, String, String)>,
    queues: BTreeSet<(u64, String)>,
    /// A record carries at most one producer's mark, so the LSN alone names it (and a bridge's
    /// traffic, one mark per message, removes by LSN without building a key).
    producers: BTreeMap<u64, Id>,
}

impl LiveSet {
    pub fn insert(&mut self, lsn: u64, object: LiveObject) {
        let fresh = match object {
            LiveObject::Message(seq) => self.messages.insert((lsn, seq)),
            LiveObject::DurableSub { client_id, name } => self.subs.insert((lsn, client_id, name)),
            LiveObject::Queue(name) => self.queues.insert((lsn, name)),
            LiveObject::Producer(id) => self.producers.insert(lsn, id).is_none(),
        };
        assert!(fresh, "live object recorded twice at one lsn");
    }

    pub fn remove(&mut self, lsn: u64, object: &LiveObject) {
        let found = match object {
            LiveObject::Message(seq) => self.messages.remove(&(lsn, *seq)),
            LiveObject::DurableSub { client_id, name } => {
                self.subs.remove(&(lsn, client_id.clone(), name.clone()))
            }
            LiveObject::Queue(name) => self.queues.remove(&(lsn, name.clone())),
            LiveObject::Producer(id) => self.remove_producer(lsn, id),
        };
        assert!(found, "live object {object:?} not at lsn {lsn}");
    }

    /// Removes the producer mark recorded at `lsn`, whoever's it is (a record carries at most
    /// one): the producer tables name a released mark by its LSN alone.
    pub fn remove_producer_at(&mut self, lsn: u64) {
        let found = self.producers.remove(&lsn);
        assert!(found.is_some(), "no live producer mark at lsn {lsn}");
    }

    /// Removes the mark of producer `id` recorded at `lsn`; false if there is none.
    fn remove_producer(&mut self, lsn: u64, id: &Id) -> bool {
        match self.producers.get(&lsn) {
            // The same allocation, unless compaction or replay built the id anew.
            Some(live) if Arc::ptr_eq(live, id) || live == id => {
                self.producers.remove(&lsn);
                true
            }
            _ => false,
        }
    }

    pub fn min_lsn(&self) -> Option<u64> {
        let m = self.messages.first().map(|(lsn, _)| *lsn);
        let s = self.subs.first().map(|(lsn, _, _)| *lsn);
        let q = self.queues.first().map(|(lsn, _)| *lsn);
        let p = self.producers.first_key_value().map(|(lsn, _)| *lsn);
        [m, s, q, p].into_iter().flatten().min()
    }

    pub fn len(&self) -> usize {
        self.messages.len() + self.subs.len() + self.queues.len() + self.producers.len()
    }

    /// The producer marks, (lsn, id): for the engine's cross-check.
    pub fn producers(&self) -> BTreeSet<(u64, String)> {
        self.producers
            .iter()
            .map(|(lsn, id)| (*lsn, id.to_string()))
            .collect()
    }

    /// Up to `max` objects whose describing record is below `lsn`, durable subscriptions first
    /// (a re-logged message may name one as a holder).
    pub fn below(&self, lsn: u64, max: usize) -> Vec<(u64, LiveObject)> {
        let mut out: Vec<(u64, LiveObject)> = self
            .subs
            .range(..(lsn, String::new(), String::new()))
            .map(|(l, c, n)| {
                let sub = LiveObject::DurableSub {
                    client_id: c.clone(),
                    name: n.clone(),
                };
                (*l, sub)
            })
            .collect();
        out.extend(
            self.queues
                .range(..(lsn, String::new()))
                .map(|(l, n)| (*l, LiveObject::Queue(n.clone()))),
        );
        out.extend(
            self.producers
                .range(..lsn)
                .map(|(l, id)| (*l, LiveObject::Producer(id.clone()))),
        );
        let room = max.saturating_sub(out.len());
        out.extend(
            self.messages
                .range(..(lsn, 0))
                .take(room)
                .map(|(l, seq)| (*l, LiveObject::Message(*seq))),
        );
        out.truncate(max.max(1));
        out
    }

    pub fn count_in(&self, lo: u64, hi: u64) -> usize {
        let m = self.messages.range((lo, 0)..(hi, 0)).count();
        let s = self
            .subs
            .range((lo, String::new(), String::new())..(hi, String::new(), String::new()))
            .count();
        let q = self
            .queues
            .range((lo, String::new())..(hi, String::new()))
            .count();
        let p = self.producers.range(lo..hi).count();
        m + s + q + p
    }
}

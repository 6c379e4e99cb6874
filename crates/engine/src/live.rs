//! Which log positions still matter.
//!
//! Every durable object — a stored message, a durable subscription — is described in full by
//! one record at a known LSN. The lowest such LSN bounds what the log must keep: segments
//! wholly below it can be deleted, and compaction re-logs the objects in an old, sparse
//! segment so that segment can go too.

use std::collections::BTreeSet;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum LiveObject {
    Message(u64),
    DurableSub { client_id: String, name: String },
}

#[derive(Default, Debug)]
pub(crate) struct LiveSet {
    by_lsn: BTreeSet<(u64, LiveObject)>,
}

impl LiveSet {
    pub fn insert(&mut self, lsn: u64, object: LiveObject) {
        let fresh = self.by_lsn.insert((lsn, object));
        assert!(fresh, "live object recorded twice at one lsn");
    }

    pub fn remove(&mut self, lsn: u64, object: &LiveObject) {
        let found = self.by_lsn.remove(&(lsn, object.clone()));
        assert!(found, "live object {object:?} not at lsn {lsn}");
    }

    pub fn min_lsn(&self) -> Option<u64> {
        self.by_lsn.first().map(|(lsn, _)| *lsn)
    }

    pub fn len(&self) -> usize {
        self.by_lsn.len()
    }

    /// Up to `max` objects whose describing record is below `lsn`, durable subscriptions first
    /// (a re-logged message may name one as a holder).
    pub fn below(&self, lsn: u64, max: usize) -> Vec<(u64, LiveObject)> {
        let mut subs = Vec::new();
        let mut messages = Vec::new();
        for (l, o) in self.by_lsn.range(..(lsn, LiveObject::Message(0))) {
            match o {
                LiveObject::DurableSub { .. } => subs.push((*l, o.clone())),
                LiveObject::Message(_) if messages.len() < max => messages.push((*l, o.clone())),
                LiveObject::Message(_) => {}
            }
        }
        subs.extend(messages);
        subs.truncate(max.max(1));
        subs
    }

    pub fn count_in(&self, lo: u64, hi: u64) -> usize {
        self.by_lsn
            .range((lo, LiveObject::Message(0))..(hi, LiveObject::Message(0)))
            .count()
    }
}

//! One queue of messages: a named queue, a durable subscription, a non-durable topic
//! subscriber's buffer or a temporary queue — they differ only in who consumes and whether
//! the log knows them.

use crate::message::Message;
use crate::selector::Selector;
use crate::types::{ConnId, QueueKey};
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub(crate) type QueueId = usize;

#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub msg: Arc<Message>,
    /// Times handed to a consumer so far.
    pub deliveries: u32,
    /// May have been delivered before this broker knew (recovered from the log).
    pub redelivered: bool,
}

#[derive(Debug)]
pub(crate) struct InFlight {
    pub entry: Entry,
    pub conn: ConnId,
    pub tag: u64,
}

#[derive(Debug)]
pub(crate) struct Queue {
    pub key: QueueKey,
    /// Waiting for a consumer: highest priority first, then arrival order.
    ready: BTreeMap<(Reverse<u8>, u64), Entry>,
    /// Handed to a consumer, not yet acknowledged.
    pub inflight: HashMap<u64, InFlight>,
    /// (connection, subscription id), in the order they subscribed.
    pub consumers: Vec<(ConnId, String)>,
    /// Round-robin position in `consumers`.
    pub next_consumer: usize,
    /// Durable subscriptions: the topic (None only transiently during replay, when a re-logged
    /// message names the subscription before its own record is seen) and its record's LSN.
    pub topic: Option<String>,
    pub record_lsn: u64,
    /// Topic subscriptions (durable or not): only messages this selects are copied in.
    pub selector: Option<Selector>,
    /// Message groups (`JMSXGroupID`) → the consumer that owns each: all of a group's messages
    /// go to its owner, in order, until the owner leaves or the group is closed. Unbounded in
    /// count (no hash buckets that merge groups), bounded by the groups actually in use.
    pub groups: HashMap<String, (ConnId, String)>,
    /// Waiting messages that carry a group: dispatch takes the group-aware path while any do.
    pub grouped_waiting: usize,
    /// Failed deliveries held back by the redelivery delay: (due time, seq) → entry.
    delayed: BTreeMap<(u64, u64), Entry>,
    delayed_at: HashMap<u64, u64>,
}

impl Queue {
    pub fn new(key: QueueKey) -> Queue {
        Queue {
            key,
            ready: BTreeMap::new(),
            inflight: HashMap::new(),
            consumers: Vec::new(),
            next_consumer: 0,
            topic: None,
            record_lsn: 0,
            selector: None,
            groups: HashMap::new(),
            grouped_waiting: 0,
            delayed: BTreeMap::new(),
            delayed_at: HashMap::new(),
        }
    }

    pub fn push(&mut self, entry: Entry) {
        let key = (Reverse(entry.msg.priority), entry.msg.seq);
        if entry.msg.group().is_some() {
            self.grouped_waiting += 1;
        }
        let old = self.ready.insert(key, entry);
        assert!(old.is_none(), "message queued twice");
    }

    pub fn pop(&mut self) -> Option<Entry> {
        let e = self.ready.pop_first().map(|(_, e)| e)?;
        self.note_taken(&e);
        Some(e)
    }

    pub fn remove_ready(&mut self, msg: &Message) -> Option<Entry> {
        let e = self.ready.remove(&(Reverse(msg.priority), msg.seq))?;
        self.note_taken(&e);
        Some(e)
    }

    fn note_taken(&mut self, e: &Entry) {
        if e.msg.group().is_some() {
            self.grouped_waiting -= 1;
        }
    }

    pub fn contains(&self, msg: &Message) -> bool {
        self.ready.contains_key(&(Reverse(msg.priority), msg.seq))
            || self.inflight.contains_key(&msg.seq)
            || self.delayed_at.contains_key(&msg.seq)
    }

    /// Holds a failed delivery back until `ready_at_ms` (redelivery delay).
    pub fn delay(&mut self, entry: Entry, ready_at_ms: u64) {
        let seq = entry.msg.seq;
        let old = self.delayed_at.insert(seq, ready_at_ms);
        assert!(old.is_none(), "message delayed twice");
        self.delayed.insert((ready_at_ms, seq), entry);
    }

    /// Moves every delayed message due at `now_ms` back to waiting; returns how many.
    pub fn release_due(&mut self, now_ms: u64) -> usize {
        let mut n = 0;
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let e = entry.remove();
            self.delayed_at.remove(&e.msg.seq);
            self.push(e);
            n += 1;
        }
        n
    }

    pub fn has_delayed(&self) -> bool {
        !self.delayed.is_empty()
    }

    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    pub fn is_ready_empty(&self) -> bool {
        self.ready.is_empty()
    }

    /// The first `max` waiting messages, in delivery order.
    pub fn ready_head(&self, max: usize) -> Vec<Arc<Message>> {
        self.ready
            .values()
            .take(max)
            .map(|e| e.msg.clone())
            .collect()
    }

    pub fn ready_entries_mut(&mut self) -> impl Iterator<Item = &mut Entry> {
        self.ready.values_mut()
    }

    /// Every message held, waiting or in flight.
    pub fn drain_all(&mut self) -> Vec<Entry> {
        let mut all: Vec<Entry> = std::mem::take(&mut self.ready).into_values().collect();
        all.extend(std::mem::take(&mut self.delayed).into_values());
        self.delayed_at.clear();
        self.grouped_waiting = 0;
        self.groups.clear();
        all.extend(self.inflight.drain().map(|(_, f)| f.entry));
        all
    }
}

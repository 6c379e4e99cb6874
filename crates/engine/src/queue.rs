//! One queue of messages: a named queue, a durable subscription, a non-durable topic
//! subscriber's buffer or a temporary queue — they differ only in who consumes and whether
//! the log knows them.

use crate::cold::ColdQueue;
pub(crate) use crate::cold::ColdRef;
use crate::hash::{HashMap, IdMap};
use crate::message::Message;
use crate::selector::Selector;
use crate::types::{ConnId, QueueKey};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) type QueueId = usize;

#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub msg: Arc<Message>,
    /// `msg.size_bytes()`, computed once: the queue, the prefetch window and paging count it
    /// several times per message, and summing its headers each time was 5% of a forwarding
    /// broker's worker (the headers are cold by then).
    pub size_bytes: u64,
    /// `msg.group().is_some()`, for the same reason: the queue counts grouped messages as
    /// each one comes and goes, and the lookup walks the headers.
    pub grouped: bool,
    /// Times handed to a consumer so far.
    pub deliveries: u32,
    /// May have been delivered before this broker knew (recovered from the log).
    pub redelivered: bool,
}

impl Entry {
    /// A message not yet handed to anyone here. `redelivered`: it may have been delivered
    /// before (recovered from the log, or moved from another queue after failing there).
    pub fn new(msg: Arc<Message>, redelivered: bool) -> Entry {
        let size_bytes = msg.size_bytes() as u64;
        Entry::sized(msg, size_bytes, redelivered)
    }

    /// `new` with the size already known (a topic message entering several queues).
    pub fn sized(msg: Arc<Message>, size_bytes: u64, redelivered: bool) -> Entry {
        debug_assert_eq!(size_bytes, msg.size_bytes() as u64);
        Entry {
            grouped: msg.group().is_some(),
            msg,
            size_bytes,
            deliveries: 0,
            redelivered,
        }
    }
}

/// A message that arrived while the queue was paging, kept in memory until its record is
/// durable (and so readable back) or until consumers reach it.
#[derive(Debug)]
pub(crate) struct TailEntry {
    pub entry: Entry,
    /// The `Spill` record of a non-persistent message; persistent ones are found in `stored`.
    pub spill_lsn: Option<u64>,
}

/// Where the next message in arrival order behind the in-memory window is.
pub(crate) enum Paged {
    Tail(u64),
    Cold(u64, ColdRef),
}

#[derive(Debug)]
pub(crate) struct InFlight {
    pub entry: Entry,
    pub conn: ConnId,
    pub tag: u64,
}

/// What a queue counts about a consumer it attaches; the same at attach and detach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConsumerKind {
    /// A network bridge's (`SubscribeOptions::network`).
    pub network: bool,
    /// With a selector of its own (`Sub::selector`).
    pub selector: bool,
}

#[derive(Debug)]
pub(crate) struct Queue {
    pub key: QueueKey,
    /// Waiting for a consumer: highest priority first, then arrival order.
    ready: BTreeMap<(Reverse<u8>, u64), Entry>,
    /// Handed to a consumer, not yet acknowledged.
    pub inflight: IdMap<InFlight>,
    /// (connection, subscription id), in the order they subscribed. Changed only through
    /// `add_consumer` / `remove_consumer`, which keep the counts below.
    pub consumers: Vec<(ConnId, String)>,
    /// How many of `consumers` are network bridges' (`SubscribeOptions::network`); the rest
    /// are local. Dispatch applies the return rule only while both kinds are present.
    network_consumers: usize,
    /// How many of `consumers` have a selector of their own: dispatch takes the selective
    /// path while any does (counted here so that dispatch need not look each one up).
    selector_consumers: usize,
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
    delayed_at: IdMap<u64>,
    /// Paged out, by seq (arrival order): they come after everything in `ready`.
    pub cold: ColdQueue,
    /// Arrived while paging, by seq; merged with `cold` in seq order when paged in.
    pub tail: BTreeMap<u64, TailEntry>,
    /// The highest seq of `cold` named to the loader in a read-ahead hint: every paged-out
    /// message up to it was (see `Engine::hint_window`). None when nothing was, when the
    /// last consumer left (the loader may drop what nobody took; a new one is hinted anew), or
    /// when the loader said it dropped its read-ahead (`MessageLoader::forgot`).
    pub hinted_through: Option<u64>,
    /// `size_bytes` of the messages in `ready`.
    ready_bytes: u64,
    /// `size_bytes` of the messages in `tail`.
    tail_bytes: u64,
    /// Bytes of waiting messages in memory (`ready` and `tail`), summed over every queue of
    /// the engine (shared counter).
    hot_bytes_total: Arc<AtomicU64>,
}

impl Queue {
    pub fn new(key: QueueKey, hot_bytes_total: Arc<AtomicU64>) -> Queue {
        Queue {
            key,
            ready: BTreeMap::new(),
            inflight: IdMap::default(),
            consumers: Vec::new(),
            network_consumers: 0,
            selector_consumers: 0,
            next_consumer: 0,
            topic: None,
            record_lsn: 0,
            selector: None,
            groups: HashMap::default(),
            grouped_waiting: 0,
            delayed: BTreeMap::new(),
            delayed_at: IdMap::default(),
            cold: ColdQueue::default(),
            tail: BTreeMap::new(),
            hinted_through: None,
            ready_bytes: 0,
            tail_bytes: 0,
            hot_bytes_total,
        }
    }

    pub fn add_consumer(&mut self, conn: ConnId, sub_id: String, kind: ConsumerKind) {
        debug_assert!(
            !self
                .consumers
                .iter()
                .any(|(c, s)| *c == conn && *s == sub_id),
            "consumer attached twice"
        );
        self.consumers.push((conn, sub_id));
        self.network_consumers += usize::from(kind.network);
        self.selector_consumers += usize::from(kind.selector);
    }

    /// Detaches a consumer (which must be attached): its message groups go to whichever
    /// consumer gets their next message, and round-robin starts over.
    pub fn remove_consumer(&mut self, conn: ConnId, sub_id: &str, kind: ConsumerKind) {
        let before = self.consumers.len();
        self.consumers.retain(|(c, s)| !(*c == conn && s == sub_id));
        assert_eq!(self.consumers.len() + 1, before, "consumer attached once");
        if kind.network {
            assert!(
                self.network_consumers > 0,
                "network consumer count underflow"
            );
            self.network_consumers -= 1;
        }
        if kind.selector {
            assert!(
                self.selector_consumers > 0,
                "selector consumer count underflow"
            );
            self.selector_consumers -= 1;
        }
        self.groups.retain(|_, (c, s)| !(*c == conn && s == sub_id));
        self.next_consumer = 0;
        if self.consumers.is_empty() {
            self.hinted_through = None;
        }
    }

    pub fn network_consumers(&self) -> usize {
        self.network_consumers
    }

    /// Whether a consumer with a selector of its own is attached.
    pub fn has_selector_consumer(&self) -> bool {
        self.selector_consumers > 0
    }

    /// Whether a consumer that is not a network bridge's is attached.
    pub fn has_local_consumer(&self) -> bool {
        self.consumers.len() > self.network_consumers
    }

    fn add_ready_bytes(&mut self, bytes: u64) {
        self.ready_bytes += bytes;
        self.hot_bytes_total.fetch_add(bytes, Ordering::Relaxed);
    }

    fn sub_ready_bytes(&mut self, bytes: u64) {
        assert!(self.ready_bytes >= bytes, "ready bytes underflow");
        self.ready_bytes -= bytes;
        self.hot_bytes_total.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub fn ready_bytes(&self) -> u64 {
        self.ready_bytes
    }

    pub fn insert_tail(&mut self, seq: u64, t: TailEntry) -> Option<TailEntry> {
        let bytes = t.entry.size_bytes;
        self.tail_bytes += bytes;
        self.hot_bytes_total.fetch_add(bytes, Ordering::Relaxed);
        self.tail.insert(seq, t)
    }

    pub fn remove_tail(&mut self, seq: &u64) -> Option<TailEntry> {
        let t = self.tail.remove(seq)?;
        let bytes = t.entry.size_bytes;
        self.tail_bytes -= bytes;
        self.hot_bytes_total.fetch_sub(bytes, Ordering::Relaxed);
        Some(t)
    }

    /// Bytes of waiting messages, in memory or paged out (what a destination's `bytes_max`
    /// limits).
    pub fn waiting_bytes(&self) -> u64 {
        self.ready_bytes + self.tail_bytes + self.cold.bytes()
    }

    /// Messages wait behind paged-out ones: new arrivals must queue in `tail`.
    pub fn is_paging(&self) -> bool {
        !self.cold.is_empty() || !self.tail.is_empty()
    }

    /// The earliest paged message (cold or tail), by arrival order.
    pub fn next_paged(&self) -> Option<Paged> {
        let c = self.cold.first();
        let t = self.tail.first_key_value().map(|(s, _)| *s);
        match (c, t) {
            (Some((cs, r)), Some(ts)) if cs < ts => Some(Paged::Cold(cs, r)),
            (_, Some(ts)) => Some(Paged::Tail(ts)),
            (Some((cs, r)), None) => Some(Paged::Cold(cs, r)),
            (None, None) => None,
        }
    }

    /// Messages held in any state.
    pub fn held_len(&self) -> usize {
        self.ready.len()
            + self.inflight.len()
            + self.delayed.len()
            + self.cold.len()
            + self.tail.len()
    }

    pub fn push(&mut self, entry: Entry) {
        let key = (Reverse(entry.msg.priority), entry.msg.seq);
        if entry.grouped {
            self.grouped_waiting += 1;
        }
        self.add_ready_bytes(entry.size_bytes);
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

    /// Takes a waiting in-memory message out, from `ready` or the paging tail.
    pub fn remove_waiting(&mut self, msg: &Message) -> Option<Entry> {
        if let Some(e) = self.remove_ready(msg) {
            return Some(e);
        }
        let t = self.remove_tail(&msg.seq)?;
        assert!(
            t.spill_lsn.is_none(),
            "a spilled message leaves through paging"
        );
        Some(t.entry)
    }

    fn note_taken(&mut self, e: &Entry) {
        if e.grouped {
            self.grouped_waiting -= 1;
        }
        self.sub_ready_bytes(e.size_bytes);
    }

    pub fn contains(&self, msg: &Message) -> bool {
        self.holds(msg.seq, msg.priority)
    }

    /// `contains` for the message with this seq and priority.
    pub fn holds(&self, seq: u64, priority: u8) -> bool {
        self.ready.contains_key(&(Reverse(priority), seq))
            || self.inflight.contains_key(&seq)
            || self.delayed_at.contains_key(&seq)
            || self.cold.contains(seq)
            || self.tail.contains_key(&seq)
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

    /// Waiting for a consumer, in memory or paged out.
    pub fn waiting_len(&self) -> usize {
        self.ready.len() + self.cold.len() + self.tail.len()
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

    /// Every message held, waiting or in flight, in memory; and those paged out.
    pub fn drain_all(&mut self) -> Drained {
        let ready = std::mem::take(&mut self.ready);
        let bytes = self.ready_bytes;
        self.sub_ready_bytes(bytes);
        let mut entries: Vec<Entry> = ready.into_values().collect();
        entries.extend(std::mem::take(&mut self.delayed).into_values());
        self.delayed_at.clear();
        self.grouped_waiting = 0;
        self.groups.clear();
        entries.extend(self.inflight.drain().map(|(_, f)| f.entry));
        let mut spilled = Vec::new();
        for (seq, t) in std::mem::take(&mut self.tail) {
            if let Some(lsn) = t.spill_lsn {
                spilled.push((lsn, seq));
            }
            entries.push(t.entry);
        }
        let cold = self.cold.take_all();
        self.hot_bytes_total
            .fetch_sub(self.tail_bytes, Ordering::Relaxed);
        self.tail_bytes = 0;
        Drained {
            entries,
            spilled,
            cold,
        }
    }
}

/// What `Queue::drain_all` took out.
pub(crate) struct Drained {
    pub entries: Vec<Entry>,
    /// (lsn, seq) of spilled messages among `entries` whose record is still live.
    pub spilled: Vec<(u64, u64)>,
    pub cold: Vec<(u64, ColdRef)>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        // The shared total must not keep counting a queue that is gone.
        self.hot_bytes_total
            .fetch_sub(self.ready_bytes + self.tail_bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BRIDGE: ConsumerKind = ConsumerKind {
        network: true,
        selector: false,
    };
    const APP: ConsumerKind = ConsumerKind {
        network: false,
        selector: false,
    };
    const SELECTIVE_APP: ConsumerKind = ConsumerKind {
        network: false,
        selector: true,
    };

    #[test]
    fn local_network_and_selective_consumers_are_counted_apart() {
        let mut q = Queue::new(QueueKey::Queue("q".into()), Arc::default());
        q.add_consumer(1, "bridge".into(), BRIDGE);
        assert!(q.network_consumers() == 1 && !q.has_local_consumer());
        q.add_consumer(2, "app".into(), APP);
        assert!(q.has_local_consumer() && !q.has_selector_consumer());
        q.add_consumer(3, "picky".into(), SELECTIVE_APP);
        assert!(q.has_selector_consumer());
        q.groups.insert("g".into(), (2, "app".into()));
        q.next_consumer = 1;
        q.remove_consumer(2, "app", APP);
        assert!(q.has_local_consumer() && q.network_consumers() == 1);
        assert!(q.groups.is_empty(), "its groups are released");
        assert_eq!(q.next_consumer, 0);
        q.remove_consumer(3, "picky", SELECTIVE_APP);
        assert!(!q.has_local_consumer() && !q.has_selector_consumer());
        q.remove_consumer(1, "bridge", BRIDGE);
        assert_eq!((q.consumers.len(), q.network_consumers()), (0, 0));
    }
}

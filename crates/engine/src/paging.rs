//! Deep backlogs: waiting messages beyond a queue's (or the broker's) memory budget live only in
//! the log, and are read back in batches when consumers reach them.
//!
//! A queue that pages keeps three runs of waiting messages, in arrival order:
//! `ready` (in memory, dispatchable), then `cold` (only in the log: seq → where to read it) and
//! `tail` (arrived while paging, in memory until its record is durable). New arrivals go to the
//! tail while anything is paged out, so FIFO order holds across the boundary; priority is
//! honoured within the in-memory window only (as ActiveMQ does without `prioritizedMessages`).
//!
//! What can be paged: messages held by exactly one named queue or durable subscription.
//! Persistent ones are read back from their own `Store`/`Commit` record; non-persistent ones are
//! first written as a `Spill` record (the log doubles as the temporary store), which replay
//! ignores. A persistent message shared by several durable subscriptions stays in memory.
//!
//! Reading is the one input the engine cannot compute: the caller installs a
//! [`MessageLoader`] and tells the engine how far the log is durable (only durable records can
//! be read back). Without a loader nothing is paged. A read failure is fatal
//! ([`Engine::take_fatal`]): a record the log acknowledged cannot be read back.

use super::{Ctx, Engine, Stored};
use crate::effect::Output;
use crate::live::LiveObject;
use crate::message::Message;
use crate::queue::{ColdRef, Entry, Paged, QueueId, TailEntry};
use crate::types::{wildcard_matches, Destination, QueueKey};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A queue with fewer waiting messages in memory than this reads more back from the log.
const PAGE_IN_LOW_MESSAGES: usize = 1_000;
/// One page-in brings the in-memory window up to this many messages (or the byte budget).
const PAGE_IN_HIGH_MESSAGES: usize = 4_000;
/// Producers are held back when messages in memory reach this multiple of the budget (only
/// when paging cannot keep up or cannot apply).
const MEMORY_HARD_FACTOR: u64 = 2;

/// Bytes of messages one read-ahead hint names at most: 8 MiB (and never more than the
/// queue's budget). The read-ahead holds them decoded outside the budget until consumed.
/// 8 rather than 16 (with the page-in window and the loader's bound): scenario (f) of
/// BENCHMARKS.md peaked at 123-132 MiB instead of 141-151 at the same rate, 4 runs each
/// (docs/PERFORMANCE.md); 1 KiB messages are bounded by the counts, not by this.
const PREFETCH_HINT_BYTES_MAX: u64 = 8 << 20;

/// Bytes of messages one page-in brings the in-memory window up to at most (and never more
/// than the queue's budget): with large messages the count bounds above allow the whole
/// budget, which a consumer working through the window does not need. 8 MiB is 128 messages
/// of 64 KiB, ahead of the consumer's own prefetch window.
const PAGE_IN_WINDOW_BYTES_MAX: u64 = 8 << 20;

/// Tail entries one call looks at when moving durable ones out of memory.
const PAGE_OUT_SCAN_MAX: usize = 8_192;

/// Reads a paged-out message back from the log.
pub trait MessageLoader: Send {
    /// The message numbered `seq` as described by the record at `lsn` (a `Store`, `Commit`,
    /// `Spill` or `Fire`). An error means the log cannot give back what it acknowledged.
    fn load(&mut self, lsn: u64, seq: u64) -> Result<Arc<Message>, String>;

    /// The (lsn, seq) pairs `load` will most likely be asked for after those of earlier hints,
    /// in order: a loader may read and decode them ahead, off the caller's thread. Each hint
    /// names only messages no earlier one did (the engine extends the read-ahead as the next
    /// page-in's window grows, by at most that window), so a loader that reads ahead keeps
    /// every hint, not just the newest. A hint only; the default ignores it.
    fn prefetch(&mut self, _next: &[(u64, u64)]) {}

    /// Whether the loader dropped messages it was hinted and had not yet been asked for, since
    /// this was last called (a loader that frees its read-ahead when nobody loads for a
    /// while). The engine then names its windows again, as hints name each message only once.
    fn forgot(&mut self) -> bool {
        false
    }

    /// Messages read ahead and waiting for `load` now (0 for a loader that does not read
    /// ahead): lets a test see that a whole hint was read.
    fn prefetched_len(&self) -> usize {
        0
    }
}

/// How much of the waiting backlog is in memory and how much only in the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of waiting messages in memory (dispatchable, or arrived while paging and not
    /// yet paged out), over all queues.
    pub hot_bytes: u64,
    /// Messages paged out (only in the log).
    pub paged_out: u64,
    /// Messages read back from the log since start.
    pub paged_in_total: u64,
}

impl Engine {
    /// Installs the reader of paged-out messages; paging is off until one is installed.
    /// Install it before replay so that recovering a deep backlog stays within memory.
    pub fn set_loader(&mut self, loader: Box<dyn MessageLoader>) {
        self.loader = Some(loader);
    }

    /// Every record below `lsn` is durable (readable back): tail messages whose record now is
    /// leave memory at once (this emits nothing, so it needs no call context). This is the
    /// only place tails are paged out: once per sync batch, not per command.
    ///
    /// Returns whether a queue's page-in waited for a record that is now durable: the caller
    /// must then call [`Engine::resume_page_ins`], or its messages wait for the next command
    /// that happens to dispatch the queue (with idle producers, none may come).
    #[must_use]
    pub fn set_durable_lsn(&mut self, lsn: u64) -> bool {
        self.durable_lsn = self.durable_lsn.max(lsn);
        if !self.paging_queues.is_empty() {
            self.page_out_tails();
        }
        self.page_ins_waiting
            .values()
            .any(|&waited| waited < self.durable_lsn)
    }

    /// Dispatches the queues whose page-in waited for a record that is now durable (see
    /// [`Engine::set_durable_lsn`]).
    pub fn resume_page_ins(&mut self, ctx: Ctx, out: &mut Vec<Output>) {
        assert!(self.out.is_empty() && self.removes.is_empty() && self.to_dispatch.is_empty());
        self.lsn = ctx.next_lsn;
        self.now_ms = ctx.now_ms;
        self.take_resumable_page_ins();
        self.finish();
        out.append(&mut self.out);
    }

    /// Moves the waiting page-ins whose record is durable to the call's dispatch set (a
    /// removed queue's entry went with it: `remove_queue`).
    fn take_resumable_page_ins(&mut self) {
        let durable = self.durable_lsn;
        let to_dispatch = &mut self.to_dispatch;
        self.page_ins_waiting.retain(|&q, &mut waited| {
            let due = waited < durable;
            if due {
                to_dispatch.insert(q);
            }
            !due
        });
    }

    /// A fatal error met while paging (the log could not give a message back).
    pub fn take_fatal(&mut self) -> Option<String> {
        self.fatal.take()
    }

    pub fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            hot_bytes: self.hot_bytes_total.load(Ordering::Relaxed),
            paged_out: self
                .queues
                .iter()
                .flatten()
                .map(|q| q.cold.len() as u64)
                .sum(),
            paged_in_total: self.paged_in_total,
        }
    }

    /// The limits entry for a queue: matched on the queue name, or a durable subscription's
    /// topic.
    pub(super) fn limits_for(&self, q: QueueId) -> Option<&crate::config::DestinationLimits> {
        let queue = self.queue(q);
        let (topic, name) = match (&queue.key, &queue.topic) {
            (QueueKey::Queue(n), _) => (false, n.as_str()),
            (QueueKey::Durable { .. }, Some(t)) => (true, t.as_str()),
            _ => return None,
        };
        self.cfg
            .destination_limits
            .iter()
            .find(|l| match (&l.destination, topic) {
                (Destination::Queue(p), false) | (Destination::Topic(p), true) => {
                    wildcard_matches(p, name)
                }
                _ => false,
            })
    }

    /// In-memory budget for waiting messages of queue `q`.
    pub(super) fn queue_memory_bytes_max(&self, q: QueueId) -> u64 {
        if !self.queue(q).key.is_durable_kind() {
            return u64::MAX;
        }
        let own = self.limits_for(q).and_then(|l| l.memory_bytes_max);
        own.unwrap_or(u64::MAX).min(self.cfg.memory_bytes_max)
    }

    /// Whether a message arriving in queue `q` must wait behind paged-out messages, or would
    /// take the queue or the broker over its memory budget.
    pub(super) fn should_page(&self, q: QueueId, size_bytes: u64) -> bool {
        if self.loader.is_none() {
            return false;
        }
        let queue = self.queue(q);
        if !queue.key.is_durable_kind() {
            return false;
        }
        if queue.is_paging() {
            return true;
        }
        queue.ready_bytes() + size_bytes > self.queue_memory_bytes_max(q)
            || self.hot_bytes_total.load(Ordering::Relaxed) + size_bytes > self.cfg.memory_bytes_max
    }

    /// Puts an arriving message behind the paged-out ones. `spill_lsn`: its `Spill` record,
    /// for a non-persistent message.
    pub(super) fn push_tail(&mut self, q: QueueId, entry: Entry, spill_lsn: Option<u64>) {
        let seq = entry.msg.seq;
        if let Some(lsn) = spill_lsn {
            self.live.insert(lsn, LiveObject::Message(seq));
        }
        let old = self
            .queue_mut(q)
            .insert_tail(seq, TailEntry { entry, spill_lsn });
        assert!(old.is_none(), "message in a tail twice");
        self.paging_queues.insert(q);
    }

    /// Moves tail messages whose record is durable out of memory.
    pub(super) fn page_out_tails(&mut self) {
        let queues: Vec<QueueId> = self.paging_queues.iter().copied().collect();
        for q in queues {
            if self.queues.get(q).is_none_or(Option::is_none) {
                self.paging_queues.remove(&q);
                continue;
            }
            let mut cold = Vec::new();
            for (seq, t) in self.queue(q).tail.iter().take(PAGE_OUT_SCAN_MAX) {
                let (lsn, spilled) = match t.spill_lsn {
                    Some(lsn) => (lsn, true),
                    None => match self.stored.get(seq) {
                        // Shared by several durable subscriptions: stays in memory.
                        Some(s) if s.holders.len() == 1 => {
                            // Paging it out drops its bookkeeping: only its holder may.
                            assert_eq!(
                                s.holders[0],
                                self.queue(q).key,
                                "a queue paged out a message another queue holds"
                            );
                            (s.lsn, false)
                        }
                        _ => continue,
                    },
                };
                if lsn >= self.durable_lsn {
                    // Later arrivals are (almost always) later in the log too.
                    break;
                }
                let cref = ColdRef::new(lsn, t.entry.size_bytes, spilled, t.entry.redelivered);
                cold.push((*seq, cref));
            }
            let queue = self.queue(q);
            let before = (queue.cold.len(), queue.cold.bytes(), queue.cold.last_seq());
            for &(seq, cref) in &cold {
                let queue = self.queue_mut(q);
                let t = queue.remove_tail(&seq).expect("scanned");
                assert_eq!(
                    t.entry.deliveries, 0,
                    "a delivered message is never paged out"
                );
                queue.cold.insert(seq, cref);
                // The log is now its only copy; the cold entry keeps its record alive (the
                // live set holds only what is in memory).
                self.live.remove(cref.lsn, &LiveObject::Message(seq));
                if !cref.spilled {
                    let s = self
                        .stored
                        .remove(&seq)
                        .expect("persistent tail entry is stored");
                    assert_eq!(s.lsn, cref.lsn);
                }
            }
            if !cold.is_empty() && !self.queue(q).consumers.is_empty() {
                self.hint_arrivals(q, before, &cold);
            }
            if !self.queue(q).is_paging() {
                self.paging_queues.remove(&q);
            }
        }
    }

    /// Names to the loader the messages just paged out of `q`'s tail (`arrived`, in seq
    /// order, all durable) that fall in the next page-in's window, when everything paged out
    /// before them was named already. `before`: the paged-out run's length, bytes and last
    /// seq before they joined it.
    ///
    /// Without it a store whose syncs lag the producers (PostgreSQL's group commit) left the
    /// window short when it was hinted, most of the backlog still waiting in the tail, and the
    /// next page-in read the rest one blocking query each: 1,300-1,700 in a row, the core
    /// waiting on each, RECEIPTs held for up to a second (docs/POSTGRES.md).
    fn hint_arrivals(
        &mut self,
        q: QueueId,
        before: (usize, u64, Option<u64>),
        arrived: &[(u64, ColdRef)],
    ) {
        let (mut count, mut bytes, last_seq) = before;
        let bytes_max = self.hint_bytes_max(q);
        let through = self.queue(q).hinted_through;
        let all_named = match (last_seq, through) {
            (None, _) => true,
            (Some(last), Some(t)) => t >= last,
            (Some(_), None) => false,
        };
        if !all_named {
            // The window's front is not named yet: the next page-in names it in order.
            return;
        }
        let mut next = Vec::new();
        for &(seq, cref) in arrived {
            if count >= PAGE_IN_HIGH_MESSAGES || bytes >= bytes_max {
                break;
            }
            count += 1;
            bytes += u64::from(cref.bytes);
            if through.is_none_or(|t| seq > t) {
                next.push((cref.lsn, seq));
            }
        }
        self.send_hint(q, next);
    }

    /// Brings paged messages of `q` back into memory, in arrival order, when the in-memory
    /// window runs low (only called when the queue has consumers).
    pub(super) fn page_in(&mut self, q: QueueId) {
        let queue = self.queue(q);
        if !queue.is_paging() || queue.ready_len() >= PAGE_IN_LOW_MESSAGES {
            return;
        }
        let budget = self.queue_memory_bytes_max(q);
        let window_bytes = budget.min(PAGE_IN_WINDOW_BYTES_MAX);
        if self.loader.as_mut().is_some_and(|l| l.forgot()) {
            // Without this, what was named before would be read here one blocking read each.
            let queues: Vec<QueueId> = self.paging_queues.iter().copied().collect();
            for other in queues {
                self.queue_mut(other).hinted_through = None;
            }
        }
        let queue = self.queue(q);
        if let Some((front, _)) = queue.cold.first() {
            if queue.hinted_through.is_none_or(|t| t < front) {
                // Nothing of this window was named (the first page-in of a backlog filled
                // while nobody consumed, or after the last consumer left): name it before
                // reading, so the loader reads it in batches, not one blocking read each.
                self.hint_window(q);
            }
        }
        while self.fatal.is_none() {
            let queue = self.queue(q);
            if queue.ready_len() >= PAGE_IN_HIGH_MESSAGES
                || (queue.ready_len() > 0 && queue.ready_bytes() >= window_bytes)
            {
                break;
            }
            match queue.next_paged() {
                None => break,
                Some(Paged::Tail(seq)) => {
                    let t = self.queue_mut(q).remove_tail(&seq).expect("next paged");
                    if let Some(lsn) = t.spill_lsn {
                        // Back in memory: the spill record is no longer needed.
                        self.live.remove(lsn, &LiveObject::Message(seq));
                    }
                    self.queue_mut(q).push(t.entry);
                }
                Some(Paged::Cold(seq, cref)) => {
                    if cref.lsn >= self.durable_lsn {
                        // Relocated and not yet durable: read it once it is.
                        self.page_ins_waiting.insert(q, cref.lsn);
                        break;
                    }
                    let loader = self.loader.as_mut().expect("cold messages need a loader");
                    let msg = match loader.load(cref.lsn, seq) {
                        Ok(m) => m,
                        Err(e) => {
                            self.fatal = Some(format!(
                                "reading paged-out message {seq} at lsn {}: {e}",
                                cref.lsn
                            ));
                            return;
                        }
                    };
                    assert_eq!(msg.seq, seq, "loader returned another message");
                    self.paged_in_total += 1;
                    let queue = self.queue_mut(q);
                    queue.cold.remove(seq);
                    let key = queue.key.clone();
                    // A spilled message back in memory needs its record no more; a persistent
                    // one is tracked like any stored message again.
                    if !cref.spilled {
                        self.live.insert(cref.lsn, LiveObject::Message(seq));
                        let stored = Stored {
                            msg: msg.clone(),
                            lsn: cref.lsn,
                            holders: vec![key],
                        };
                        let old = self.stored.insert(seq, stored);
                        assert!(old.is_none(), "paged-out message was also stored");
                    }
                    self.queue_mut(q)
                        .push(Entry::sized(msg, cref.bytes as u64, cref.recovered));
                }
            }
        }
        if !self.queue(q).is_paging() {
            self.paging_queues.remove(&q);
            return;
        }
        // Let the loader read the next batch ahead while consumers work through this one.
        self.hint_window(q);
    }

    /// Bytes the next page-in's window (and so one read-ahead) covers at most.
    fn hint_bytes_max(&self, q: QueueId) -> u64 {
        self.queue_memory_bytes_max(q).min(PREFETCH_HINT_BYTES_MAX)
    }

    /// Names to the loader the durable messages of the next page-in's window (the first
    /// `PAGE_IN_HIGH_MESSAGES` paged-out ones, within the hint's bytes, counting the one that
    /// crosses them, as a page-in loads it) that no earlier hint named. A hint names each
    /// message once, so a loader keeps what it was told before: the window fills from two
    /// sides, the front moving on as consumers take messages (here) and the back growing as
    /// tails become durable (`page_out_tails`).
    fn hint_window(&mut self, q: QueueId) {
        let bytes_max = self.hint_bytes_max(q);
        let durable = self.durable_lsn;
        let queue = self.queue(q);
        let through = queue.hinted_through;
        let mut window_bytes = 0u64;
        let next: Vec<(u64, u64)> = queue
            .cold
            .iter()
            .take(PAGE_IN_HIGH_MESSAGES)
            .take_while(|(_, c)| {
                let before = window_bytes;
                window_bytes += u64::from(c.bytes);
                before < bytes_max && c.lsn < durable
            })
            .filter(|(seq, _)| through.is_none_or(|t| *seq > t))
            .map(|(seq, c)| (c.lsn, seq))
            .collect();
        self.send_hint(q, next);
    }

    fn send_hint(&mut self, q: QueueId, next: Vec<(u64, u64)>) {
        let Some(&(_, last)) = next.last() else {
            return;
        };
        self.queue_mut(q).hinted_through = Some(last);
        if let Some(loader) = self.loader.as_mut() {
            loader.prefetch(&next);
        }
    }

    /// The queue holding paged message `seq` (cold, or spilled in a tail), if any. Looks at
    /// `hint` first; the others only when it is not there (a rare path: compaction, or replay
    /// of a message that moved to a DLQ).
    pub(super) fn find_paged(&self, seq: u64, hint: &[QueueId]) -> Option<QueueId> {
        let holds = |q: QueueId| {
            self.queues[q]
                .as_ref()
                .is_some_and(|queue| queue.cold.contains(seq) || queue.tail.contains_key(&seq))
        };
        if let Some(&q) = hint.iter().find(|&&q| holds(q)) {
            return Some(q);
        }
        self.paging_queues.iter().copied().find(|&q| holds(q))
    }

    /// A persistent message about to gain a holder (a dead-letter move) while its only durable
    /// copy is paged out in another queue: that copy comes back to memory first, so the move
    /// is logged with every holder, exactly as when nothing is paged. `msg` is the message
    /// itself (a non-durable topic subscription's copy of it), so nothing is read from the log.
    /// It goes to its queue's tail, which keeps its place in arrival order (`next_paged`), and
    /// stays in memory while it has two holders. No-op when no queue has it paged out.
    pub(super) fn unpage(&mut self, msg: &Arc<Message>) {
        let seq = msg.seq;
        assert!(!self.stored.contains_key(&seq), "unpaging a stored message");
        // Not `find_paged`: another queue may hold the message in its tail without being its
        // holder (the proptest regression `2fddc1fb…` fails that way).
        let cold_in = |queue: &crate::queue::Queue| queue.cold.get(seq).is_some_and(|c| !c.spilled);
        let Some(q) = self
            .paging_queues
            .iter()
            .copied()
            .find(|&q| self.queues[q].as_ref().is_some_and(cold_in))
        else {
            return;
        };
        let queue = self.queue_mut(q);
        let cref = queue.cold.remove(seq).expect("found there");
        let key = queue.key.clone();
        self.live.insert(cref.lsn, LiveObject::Message(seq));
        let stored = Stored {
            msg: msg.clone(),
            lsn: cref.lsn,
            holders: vec![key],
        };
        self.stored.insert(seq, stored);
        let entry = Entry::sized(msg.clone(), cref.bytes as u64, cref.recovered);
        self.push_tail(q, entry, None);
    }

    /// Compaction of a paged message `seq`, described at `old_lsn`: read it back, re-log it,
    /// keep it in the tail until the new record is durable. Returns its size in bytes.
    pub(super) fn relocate_paged(&mut self, seq: u64, old_lsn: u64) -> u64 {
        // A non-persistent message copied into several queues has one spill record in each:
        // find the copy this record describes.
        let at = |q: &QueueId| {
            self.queues[*q].as_ref().is_some_and(|queue| {
                queue.cold.get(seq).is_some_and(|c| c.lsn == old_lsn)
                    || queue
                        .tail
                        .get(&seq)
                        .is_some_and(|t| t.spill_lsn == Some(old_lsn))
            })
        };
        let q = *self
            .paging_queues
            .iter()
            .find(|q| at(q))
            .expect("live message is stored or paged");
        if let Some(t) = self.queue_mut(q).tail.get(&seq) {
            // A spilled message still in memory: write it again.
            assert_eq!(t.spill_lsn, Some(old_lsn));
            let message = t.entry.msg.clone();
            let bytes = message.size_bytes() as u64;
            let lsn = self.log(crate::record::Record::Spill { message });
            self.live.remove(old_lsn, &LiveObject::Message(seq));
            self.live.insert(lsn, LiveObject::Message(seq));
            self.queue_mut(q)
                .tail
                .get_mut(&seq)
                .expect("present")
                .spill_lsn = Some(lsn);
            return bytes;
        }
        let cref = *self.queue(q).cold.get(seq).expect("found there");
        assert_eq!(cref.lsn, old_lsn);
        let loader = self.loader.as_mut().expect("cold messages need a loader");
        let msg = match loader.load(cref.lsn, seq) {
            Ok(m) => m,
            Err(e) => {
                self.fatal = Some(format!("compacting paged-out message {seq}: {e}"));
                return 0;
            }
        };
        let bytes = msg.size_bytes() as u64;
        // Written again and left paged out, pointing at the new record (not read back until
        // that record is durable: see `page_in`).
        let lsn = if cref.spilled {
            self.log(crate::record::Record::Spill { message: msg })
        } else {
            let holders = vec![self.queue(q).key.clone()];
            self.log(crate::record::Record::Store {
                message: msg,
                holders,
                producer: None,
            })
        };
        self.queue_mut(q).cold.set_lsn(seq, lsn);
        bytes
    }

    /// Replay: a persistent message newly held by `q` alone goes straight to the log-only
    /// state if the queue is over its budget. Returns whether it did.
    pub(super) fn replay_page_out(&mut self, q: QueueId, msg: &Message, lsn: u64) -> bool {
        let size_bytes = msg.size_bytes() as u64;
        if !self.should_page(q, size_bytes) {
            return false;
        }
        self.queue_mut(q)
            .cold
            .insert(msg.seq, ColdRef::new(lsn, size_bytes, false, true));
        self.paging_queues.insert(q);
        true
    }

    /// Spilled messages in tails, for the invariant check (the live set holds their records).
    pub(super) fn paged_live_count(&self) -> usize {
        self.queues
            .iter()
            .flatten()
            .map(|q| q.tail.values().filter(|t| t.spill_lsn.is_some()).count())
            .sum()
    }

    /// Lowest LSN a paged-out message needs kept.
    pub(super) fn cold_lsn_min(&self) -> Option<u64> {
        self.paging_queues
            .iter()
            .filter_map(|&q| self.queues[q].as_ref()?.cold.lsn_min())
            .min()
    }

    /// Paged-out messages described by records in `lo..hi`.
    pub(super) fn cold_count_in(&self, lo: u64, hi: u64) -> usize {
        self.paging_queues
            .iter()
            .filter_map(|&q| self.queues[q].as_ref())
            .map(|queue| queue.cold.count_in(lo, hi))
            .sum()
    }

    /// Up to `max` (lsn, seq) of paged-out messages described below `lsn_limit`.
    pub(super) fn cold_below(&self, lsn_limit: u64, max: usize) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for &q in &self.paging_queues {
            let Some(queue) = self.queues[q].as_ref() else {
                continue;
            };
            out.extend(queue.cold.below(lsn_limit, max - out.len()));
            if out.len() >= max {
                break;
            }
        }
        out
    }
}

impl Engine {
    /// Producer flow control: `Err` names the limit a SEND to `destination` would exceed now
    /// (a queue it reaches holds `messages_max` messages or `bytes_max` bytes). The caller
    /// holds the SEND back and retries; the engine itself never refuses for this.
    pub fn admission(&self, destination: &Destination) -> Result<(), String> {
        // Paging keeps memory near the budget; what it cannot move out (messages shared by
        // several durable subscriptions, a burst not yet on disk) must not grow without bound.
        let hot = self.hot_bytes_total.load(Ordering::Relaxed);
        let hard_max = self.cfg.memory_bytes_max.saturating_mul(MEMORY_HARD_FACTOR);
        if hot >= hard_max {
            return Err(format!(
                "{hot} bytes of messages are held in memory and cannot be paged out \
                 (twice limits.memory_bytes_max = {})",
                self.cfg.memory_bytes_max
            ));
        }
        if self.cfg.destination_limits.is_empty() {
            // Nothing per destination to check: no target lookup on every SEND.
            return Ok(());
        }
        let targets: Vec<QueueId> = match destination {
            Destination::Queue(name) => self
                .queue_ids
                .get(&QueueKey::Queue(name.clone()))
                .copied()
                .into_iter()
                .collect(),
            Destination::Topic(_) => self
                .topic_targets(destination)
                .into_iter()
                .filter(|&q| self.queue(q).key.is_durable_kind())
                .collect(),
            Destination::TempQueue { .. } | Destination::TempTopic { .. } => Vec::new(),
        };
        for q in targets {
            let Some(limits) = self.limits_for(q) else {
                continue;
            };
            let queue = self.queue(q);
            if let Some(max) = limits.messages_max {
                if queue.held_len() as u64 >= max {
                    return Err(format!(
                        "{} holds {} messages (limit messages_max = {max} for {})",
                        queue.key,
                        queue.held_len(),
                        limits.destination
                    ));
                }
            }
            if let Some(max) = limits.bytes_max {
                if queue.waiting_bytes() >= max {
                    return Err(format!(
                        "{} holds {} bytes of waiting messages (limit bytes_max = {max} for {})",
                        queue.key,
                        queue.waiting_bytes(),
                        limits.destination
                    ));
                }
            }
        }
        Ok(())
    }
}

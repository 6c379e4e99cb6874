//! Durable log records and their binary encoding.
//!
//! A record describes a change to durable state in terms that replay without context: a
//! `Store` names every queue that holds the message after it, so a message can be re-logged
//! (compaction) or moved (dead-letter queue) by writing it again. The log's own framing adds
//! length and CRC32C; this encoding is versioned by the leading tag byte.

use crate::message::Message;
use crate::types::{Destination, QueueKey};
use bytes::Bytes;
use haven_headers::Headers;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// After this record, `message` is held by exactly `holders` (empty = gone). Written for a
    /// persistent SEND, a move to the DLQ, and when compaction re-logs a live message.
    Store {
        message: Arc<Message>,
        holders: Vec<QueueKey>,
        /// The producer sequence of the SEND that stored it (exactly-once sends): replay sets
        /// the producer's high-water mark from it. Only the SEND's own record carries it;
        /// re-logs (compaction, DLQ moves) do not, or replay would move the mark back. A store
        /// with a producer has its own tag, so stores without keep their encoding.
        producer: Option<ProducerMark>,
    },
    /// Messages no longer held by `queue` (acknowledged, expired).
    Remove {
        queue: QueueKey,
        seqs: Vec<u64>,
    },
    /// A committed transaction: all of its stores, removes and scheduled messages, atomically.
    Commit {
        stores: Vec<(Arc<Message>, Vec<QueueKey>)>,
        removes: Vec<(QueueKey, u64)>,
        /// A commit with schedules has its own tag, so commits without keep their encoding.
        schedules: Vec<(Arc<Message>, ScheduleState)>,
        /// COMMIT's producer sequence: the mark is durable with the transaction, atomically.
        /// Own tag (with every list present), so older commits keep their encoding.
        producer: Option<ProducerMark>,
    },
    DurableSubscribe {
        client_id: String,
        name: String,
        topic: String,
        /// JMS selector text; only matching messages are kept for the subscription.
        selector: Option<String>,
    },
    DurableUnsubscribe {
        client_id: String,
        name: String,
    },
    /// Keeps the message numbering monotonic after old segments are deleted.
    Checkpoint {
        next_seq: u64,
    },
    /// A non-persistent message paged out of memory (the log as temporary store). Replay
    /// ignores it: non-persistent messages do not survive a restart.
    Spill {
        message: Arc<Message>,
    },
    /// A scheduled message (`AMQ_SCHEDULED_*`), held by the scheduler until `due_ms`.
    Schedule {
        message: Arc<Message>,
        state: ScheduleState,
        /// The SEND's `haven-producer`/`haven-seq` (tag 15), so that the schedule and the
        /// producer's mark are durable together. Never set on a compaction re-log.
        producer: Option<ProducerMark>,
    },
    /// A producer's high-water mark, re-logged by compaction so that it outlives the records
    /// of the messages that set it. Replay: the producer's mark is exactly this (the newest record wins).
    ProducerState {
        mark: ProducerMark,
    },
    /// A queue that must exist even while empty (a virtual topic's consumer queue: messages
    /// sent to the topic are copied into it whether or not a consumer is connected).
    DeclareQueue {
        name: String,
    },
    /// Schedule `schedule` fired: `message` (a fresh copy) is now held by `holders`, and the
    /// schedule continues with `next` or, if None, is finished. One record, so a crash can
    /// neither lose a firing nor repeat it.
    Fire {
        schedule: u64,
        message: Arc<Message>,
        holders: Vec<QueueKey>,
        next: Option<ScheduleState>,
    },
}

/// A producer's sequence as the log keeps it (see `producers.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerMark {
    /// The `haven-producer` id.
    pub producer: String,
    /// Its high-water mark: every `haven-seq` up to this one was accepted.
    pub seq: u64,
    /// When the broker accepted it, ms since the Unix epoch: what idle forgetting measures.
    pub seen_ms: u64,
}

/// Where a scheduled message's timetable stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleState {
    /// When it fires next, ms since the Unix epoch.
    pub due_ms: u64,
    /// Firings left after the next one in this round (`AMQ_SCHEDULED_REPEAT`); -1 = forever.
    pub repeats_left: i64,
    /// For cron schedules, the cron time that started this round (the next round starts at the
    /// first cron time after it); 0 otherwise.
    pub anchor_ms: u64,
}

const TAG_STORE: u8 = 1;
const TAG_REMOVE: u8 = 2;
const TAG_COMMIT: u8 = 3;
const TAG_DURABLE_SUBSCRIBE: u8 = 4;
const TAG_DURABLE_UNSUBSCRIBE: u8 = 5;
const TAG_CHECKPOINT: u8 = 6;
const TAG_SPILL: u8 = 7;
const TAG_SCHEDULE: u8 = 8;
const TAG_FIRE: u8 = 9;
const TAG_COMMIT_SCHEDULED: u8 = 10;
const TAG_DECLARE_QUEUE: u8 = 11;
const TAG_STORE_PRODUCED: u8 = 12;
const TAG_COMMIT_PRODUCED: u8 = 13;
const TAG_PRODUCER_STATE: u8 = 14;
const TAG_SCHEDULE_PRODUCED: u8 = 15;
/// A `Store` whose message was dead-lettered (`Message::dead_lettered`); never has a producer.
const TAG_STORE_DEAD_LETTERED: u8 = 16;

/// The flag byte in front of a message that may be non-persistent: bit 0 persistent, bit 1
/// dead-lettered (bit 1 is newer; records without it read as before).
const FLAG_PERSISTENT: u8 = 1;
const FLAG_DEAD_LETTERED: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("undecodable log record at byte {offset}: {reason}")]
pub struct RecordError {
    pub offset: usize,
    pub reason: &'static str,
}

impl Record {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Store {
                message,
                holders,
                producer,
            } => {
                out.push(match (producer, message.dead_lettered) {
                    (Some(_), false) => TAG_STORE_PRODUCED,
                    (None, false) => TAG_STORE,
                    (None, true) => TAG_STORE_DEAD_LETTERED,
                    (Some(_), true) => unreachable!("a SEND's own record is not a DLQ move"),
                });
                put_message(out, message);
                put_holders(out, holders);
                if let Some(mark) = producer {
                    put_mark(out, mark);
                }
            }
            Record::Remove { queue, seqs } => {
                out.push(TAG_REMOVE);
                put_queue(out, queue);
                put_u32(out, seqs.len() as u32);
                for s in seqs {
                    put_u64(out, *s);
                }
            }
            Record::Commit {
                stores,
                removes,
                schedules,
                producer,
            } => {
                out.push(match (producer, schedules.is_empty()) {
                    (Some(_), _) => TAG_COMMIT_PRODUCED,
                    (None, true) => TAG_COMMIT,
                    (None, false) => TAG_COMMIT_SCHEDULED,
                });
                put_u32(out, stores.len() as u32);
                for (m, h) in stores {
                    // A transaction stores what it sends; moves to the DLQ are never part of one.
                    assert!(!m.dead_lettered, "dead-lettered message in a commit");
                    put_message(out, m);
                    put_holders(out, h);
                }
                put_u32(out, removes.len() as u32);
                for (q, s) in removes {
                    put_queue(out, q);
                    put_u64(out, *s);
                }
                if !schedules.is_empty() || producer.is_some() {
                    put_u32(out, schedules.len() as u32);
                    for (m, state) in schedules {
                        put_any_message(out, m);
                        put_schedule(out, state);
                    }
                }
                if let Some(mark) = producer {
                    put_mark(out, mark);
                }
            }
            Record::ProducerState { mark } => {
                out.push(TAG_PRODUCER_STATE);
                put_mark(out, mark);
            }
            Record::DurableSubscribe {
                client_id,
                name,
                topic,
                selector,
            } => {
                out.push(TAG_DURABLE_SUBSCRIBE);
                put_str(out, client_id);
                put_str(out, name);
                put_str(out, topic);
                match selector {
                    None => out.push(0),
                    Some(text) => {
                        out.push(1);
                        put_str(out, text);
                    }
                }
            }
            Record::DurableUnsubscribe { client_id, name } => {
                out.push(TAG_DURABLE_UNSUBSCRIBE);
                put_str(out, client_id);
                put_str(out, name);
            }
            Record::Checkpoint { next_seq } => {
                out.push(TAG_CHECKPOINT);
                put_u64(out, *next_seq);
            }
            Record::DeclareQueue { name } => {
                out.push(TAG_DECLARE_QUEUE);
                put_str(out, name);
            }
            Record::Spill { message } => {
                out.push(TAG_SPILL);
                put_any_message(out, message);
            }
            Record::Schedule {
                message,
                state,
                producer,
            } => {
                out.push(if producer.is_some() {
                    TAG_SCHEDULE_PRODUCED
                } else {
                    TAG_SCHEDULE
                });
                put_any_message(out, message);
                put_schedule(out, state);
                if let Some(mark) = producer {
                    put_mark(out, mark);
                }
            }
            Record::Fire {
                schedule,
                message,
                holders,
                next,
            } => {
                out.push(TAG_FIRE);
                put_u64(out, *schedule);
                put_any_message(out, message);
                put_holders(out, holders);
                match next {
                    None => out.push(0),
                    Some(state) => {
                        out.push(1);
                        put_schedule(out, state);
                    }
                }
            }
        }
    }

    /// Decodes the record at `lsn` and returns its message numbered `seq`: what every
    /// `MessageLoader` does with the bytes it read. The error names the LSN.
    pub fn decode_message(payload: &[u8], lsn: u64, seq: u64) -> Result<Arc<Message>, String> {
        let record = Record::decode(payload).map_err(|e| format!("lsn {lsn}: {e}"))?;
        Self::carried(&record, lsn, seq)
    }

    /// `decode_message` of a payload the caller gives away. A message alone in its record
    /// keeps its body as a slice of the payload rather than a copy: a paged-out message is
    /// read back, decoded and delivered once, and the copy was an allocation and a `memcpy`
    /// of its body on the read-ahead thread. A transaction's records are copied as before, so
    /// one message's body never keeps a whole transaction's buffer alive.
    pub fn decode_message_owned(
        payload: Vec<u8>,
        lsn: u64,
        seq: u64,
    ) -> Result<Arc<Message>, String> {
        let payload = Bytes::from(payload);
        let record =
            Record::decode_from(&payload, Some(&payload)).map_err(|e| format!("lsn {lsn}: {e}"))?;
        Self::carried(&record, lsn, seq)
    }

    fn carried(record: &Record, lsn: u64, seq: u64) -> Result<Arc<Message>, String> {
        record
            .message_with_seq(seq)
            .cloned()
            .ok_or_else(|| format!("record {lsn} does not carry message {seq}"))
    }

    /// The message numbered `seq` that this record carries, if any: what a paged-out message
    /// is read back from.
    pub fn message_with_seq(&self, seq: u64) -> Option<&Arc<Message>> {
        match self {
            Record::Store { message, .. }
            | Record::Spill { message }
            | Record::Schedule { message, .. }
            | Record::Fire { message, .. } => Some(message).filter(|m| m.seq == seq),
            Record::Commit {
                stores, schedules, ..
            } => stores
                .iter()
                .map(|(m, _)| m)
                .chain(schedules.iter().map(|(m, _)| m))
                .find(|m| m.seq == seq),
            _ => None,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(256);
        self.encode(&mut v);
        v
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, RecordError> {
        Record::decode_from(bytes, None)
    }

    /// `decode`; with `shared` (the same bytes as a `Bytes`), the body of a record's only
    /// message is a slice of it.
    fn decode_from(bytes: &[u8], shared: Option<&Bytes>) -> Result<Record, RecordError> {
        let mut r = Reader {
            bytes,
            pos: 0,
            shared,
        };
        let tag = r.u8()?;
        if matches!(tag, TAG_COMMIT | TAG_COMMIT_SCHEDULED | TAG_COMMIT_PRODUCED) {
            r.shared = None;
        }
        let record = match tag {
            tag @ (TAG_STORE | TAG_STORE_PRODUCED | TAG_STORE_DEAD_LETTERED) => {
                let message = Arc::new(Message {
                    dead_lettered: tag == TAG_STORE_DEAD_LETTERED,
                    ..r.message()?
                });
                let holders = r.holders()?;
                let producer = match tag {
                    TAG_STORE_PRODUCED => Some(r.mark()?),
                    _ => None,
                };
                Record::Store {
                    message,
                    holders,
                    producer,
                }
            }
            TAG_REMOVE => {
                let queue = r.queue()?;
                let n = r.count(8)?;
                let mut seqs = Vec::with_capacity(n);
                for _ in 0..n {
                    seqs.push(r.u64()?);
                }
                Record::Remove { queue, seqs }
            }
            tag @ (TAG_COMMIT | TAG_COMMIT_SCHEDULED | TAG_COMMIT_PRODUCED) => {
                let n = r.count(16)?;
                let mut stores = Vec::with_capacity(n);
                for _ in 0..n {
                    let m = Arc::new(r.message()?);
                    stores.push((m, r.holders()?));
                }
                let n = r.count(9)?;
                let mut removes = Vec::with_capacity(n);
                for _ in 0..n {
                    let q = r.queue()?;
                    removes.push((q, r.u64()?));
                }
                let mut schedules = Vec::new();
                if tag != TAG_COMMIT {
                    let n = r.count(16)?;
                    schedules.reserve(n);
                    for _ in 0..n {
                        let m = Arc::new(r.any_message()?);
                        schedules.push((m, r.schedule()?));
                    }
                }
                let producer = match tag {
                    TAG_COMMIT_PRODUCED => Some(r.mark()?),
                    _ => None,
                };
                Record::Commit {
                    stores,
                    removes,
                    schedules,
                    producer,
                }
            }
            TAG_PRODUCER_STATE => Record::ProducerState { mark: r.mark()? },
            TAG_DURABLE_SUBSCRIBE => Record::DurableSubscribe {
                client_id: r.string()?,
                name: r.string()?,
                topic: r.string()?,
                selector: match r.u8()? {
                    0 => None,
                    1 => Some(r.string()?),
                    _ => return Err(r.err("bad selector flag")),
                },
            },
            TAG_DURABLE_UNSUBSCRIBE => Record::DurableUnsubscribe {
                client_id: r.string()?,
                name: r.string()?,
            },
            TAG_CHECKPOINT => Record::Checkpoint { next_seq: r.u64()? },
            TAG_DECLARE_QUEUE => Record::DeclareQueue { name: r.string()? },
            TAG_SPILL => Record::Spill {
                message: Arc::new(r.any_message()?),
            },
            tag @ (TAG_SCHEDULE | TAG_SCHEDULE_PRODUCED) => Record::Schedule {
                message: Arc::new(r.any_message()?),
                state: r.schedule()?,
                producer: match tag {
                    TAG_SCHEDULE_PRODUCED => Some(r.mark()?),
                    _ => None,
                },
            },
            TAG_FIRE => Record::Fire {
                schedule: r.u64()?,
                message: Arc::new(r.any_message()?),
                holders: r.holders()?,
                next: match r.u8()? {
                    0 => None,
                    1 => Some(r.schedule()?),
                    _ => return Err(r.err("bad schedule flag")),
                },
            },
            _ => return Err(r.err("unknown record tag")),
        };
        if r.pos != bytes.len() {
            return Err(r.err("trailing bytes after record"));
        }
        Ok(record)
    }
}

fn put_mark(out: &mut Vec<u8>, m: &ProducerMark) {
    assert!(
        !m.producer.is_empty() && m.seq >= 1,
        "invalid producer mark {m:?}"
    );
    put_str(out, &m.producer);
    put_u64(out, m.seq);
    put_u64(out, m.seen_ms);
}

fn put_schedule(out: &mut Vec<u8>, s: &ScheduleState) {
    put_u64(out, s.due_ms);
    put_u64(out, s.repeats_left as u64);
    put_u64(out, s.anchor_ms);
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

fn put_queue(out: &mut Vec<u8>, q: &QueueKey) {
    match q {
        QueueKey::Queue(n) => {
            out.push(1);
            put_str(out, n);
        }
        QueueKey::Durable { client_id, name } => {
            out.push(2);
            put_str(out, client_id);
            put_str(out, name);
        }
        QueueKey::TopicSub { .. } | QueueKey::Temp { .. } => {
            unreachable!("volatile queue {q:?} must never be logged")
        }
    }
}

fn put_holders(out: &mut Vec<u8>, holders: &[QueueKey]) {
    put_u32(out, holders.len() as u32);
    for h in holders {
        put_queue(out, h);
    }
}

fn put_message(out: &mut Vec<u8>, m: &Message) {
    assert!(m.persistent, "only persistent messages are stored");
    put_message_fields(out, m);
}

/// A message that may be non-persistent (spilled, scheduled, a scheduled copy): flag first.
fn put_any_message(out: &mut Vec<u8>, m: &Message) {
    let mut flags = 0;
    if m.persistent {
        flags |= FLAG_PERSISTENT;
    }
    if m.dead_lettered {
        flags |= FLAG_DEAD_LETTERED;
    }
    out.push(flags);
    put_message_fields(out, m);
}

fn put_message_fields(out: &mut Vec<u8>, m: &Message) {
    put_u64(out, m.seq);
    put_str(out, &m.id);
    match &m.destination {
        Destination::Queue(n) => {
            out.push(1);
            put_str(out, n);
        }
        Destination::Topic(n) => {
            out.push(2);
            put_str(out, n);
        }
        Destination::TempQueue { .. } | Destination::TempTopic { .. } => {
            unreachable!("messages to temporary destinations are never logged")
        }
    }
    put_u32(out, m.headers.len() as u32);
    for (k, v) in &m.headers {
        put_str(out, k);
        put_str(out, v);
    }
    put_u32(out, m.body.len() as u32);
    out.extend_from_slice(&m.body);
    out.push(m.priority);
    put_u64(out, m.expires_ms);
    put_u64(out, m.timestamp_ms);
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// `bytes` as a `Bytes`, when bodies may be slices of it instead of copies.
    shared: Option<&'a Bytes>,
}

impl<'a> Reader<'a> {
    fn err(&self, reason: &'static str) -> RecordError {
        RecordError {
            offset: self.pos,
            reason,
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        if self.bytes.len() - self.pos < n {
            return Err(self.err("record truncated"));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// A count of items that each take at least `item_bytes_min`: bounded by what is left, so
    /// a damaged count cannot make us allocate wildly.
    fn count(&mut self, item_bytes_min: usize) -> Result<usize, RecordError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item_bytes_min) > self.bytes.len() - self.pos {
            return Err(self.err("count larger than the record"));
        }
        Ok(n)
    }
    fn string(&mut self) -> Result<String, RecordError> {
        self.str().map(str::to_string)
    }
    fn str(&mut self) -> Result<&'a str, RecordError> {
        let n = self.u32()? as usize;
        let b = self.take(n)?;
        std::str::from_utf8(b).map_err(|_| self.err("invalid UTF-8"))
    }
    fn queue(&mut self) -> Result<QueueKey, RecordError> {
        match self.u8()? {
            1 => Ok(QueueKey::Queue(self.string()?)),
            2 => Ok(QueueKey::Durable {
                client_id: self.string()?,
                name: self.string()?,
            }),
            _ => Err(self.err("unknown queue kind")),
        }
    }
    fn schedule(&mut self) -> Result<ScheduleState, RecordError> {
        Ok(ScheduleState {
            due_ms: self.u64()?,
            repeats_left: self.u64()? as i64,
            anchor_ms: self.u64()?,
        })
    }

    fn mark(&mut self) -> Result<ProducerMark, RecordError> {
        let producer = self.string()?;
        let seq = self.u64()?;
        if producer.is_empty() || seq == 0 {
            return Err(self.err("invalid producer mark"));
        }
        Ok(ProducerMark {
            producer,
            seq,
            seen_ms: self.u64()?,
        })
    }

    fn holders(&mut self) -> Result<Vec<QueueKey>, RecordError> {
        let n = self.count(5)?;
        (0..n).map(|_| self.queue()).collect()
    }
    fn any_message(&mut self) -> Result<Message, RecordError> {
        let flags = self.u8()?;
        if flags & !(FLAG_PERSISTENT | FLAG_DEAD_LETTERED) != 0 {
            return Err(self.err("bad message flags"));
        }
        Ok(Message {
            persistent: flags & FLAG_PERSISTENT != 0,
            dead_lettered: flags & FLAG_DEAD_LETTERED != 0,
            ..self.message()?
        })
    }

    fn message(&mut self) -> Result<Message, RecordError> {
        let seq = self.u64()?;
        let id = self.string()?;
        let destination = match self.u8()? {
            1 => Destination::Queue(self.string()?),
            2 => Destination::Topic(self.string()?),
            _ => return Err(self.err("unknown destination kind")),
        };
        let n = self.count(8)?;
        // Two passes: the first sizes the text, so the headers are allocated once.
        let start = self.pos;
        let mut text_bytes = 0;
        for _ in 0..2 * n {
            let len = self.u32()? as usize;
            self.take(len)?;
            text_bytes += len;
        }
        self.pos = start;
        let mut headers = Headers::with_capacity(n, text_bytes);
        for _ in 0..n {
            let name = self.str()?;
            headers.push(name, self.str()?);
        }
        let len = self.u32()? as usize;
        let start = self.pos;
        let raw = self.take(len)?;
        let body = match self.shared {
            Some(all) => all.slice(start..start + len),
            None => Bytes::copy_from_slice(raw),
        };
        let priority = self.u8()?;
        if priority > 9 {
            return Err(self.err("priority above 9"));
        }
        Ok(Message {
            seq,
            id,
            destination,
            headers,
            body,
            persistent: true,
            priority,
            expires_ms: self.u64()?,
            timestamp_ms: self.u64()?,
            dead_lettered: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn msg(seq: u64, body: Vec<u8>, headers: Vec<(String, String)>) -> Arc<Message> {
        Arc::new(Message {
            seq,
            id: format!("ID:haven-{seq}"),
            destination: Destination::Queue("q".into()),
            headers: headers.into_iter().collect(),
            body: Bytes::from(body),
            persistent: true,
            priority: (seq % 10) as u8,
            expires_ms: seq.wrapping_mul(3),
            timestamp_ms: seq.wrapping_mul(7),
            dead_lettered: false,
        })
    }

    /// Where a decoded body's bytes live: inside `payload`'s buffer, or a copy.
    fn body_is_in(m: &Message, payload: &[u8]) -> bool {
        let range = payload.as_ptr_range();
        m.body.is_empty() || range.contains(&m.body.as_ptr())
    }

    #[test]
    fn an_owned_payload_lends_a_lone_message_its_body_and_copies_a_transactions() {
        let m = msg(7, vec![42; 1024], vec![("k".into(), "v".into())]);
        let store = Record::Store {
            message: m.clone(),
            holders: vec![QueueKey::Queue("q".into())],
            producer: None,
        }
        .to_bytes();
        let shared = Bytes::from(store.clone());
        let Record::Store { message, .. } = Record::decode_from(&shared, Some(&shared)).unwrap()
        else {
            panic!("a store record")
        };
        assert_eq!(message, m);
        assert!(body_is_in(&message, &shared), "a slice of the payload");
        let decoded = Record::decode_message_owned(store, 1, 7).unwrap();
        assert_eq!(decoded, m);
        let commit = Record::Commit {
            stores: vec![(m.clone(), vec![QueueKey::Queue("q".into())])],
            removes: Vec::new(),
            schedules: Vec::new(),
            producer: None,
        }
        .to_bytes();
        let shared = Bytes::from(commit.clone());
        let Record::Commit { stores, .. } = Record::decode_from(&shared, Some(&shared)).unwrap()
        else {
            panic!("a commit record")
        };
        assert_eq!(stores[0].0, m);
        assert!(!body_is_in(&stores[0].0, &shared), "a copy");
        assert_eq!(Record::decode_message_owned(commit, 2, 7).unwrap(), m);
        assert!(Record::decode_message_owned(vec![TAG_STORE], 3, 7).is_err());
    }

    proptest! {
        #[test]
        fn every_record_round_trips(seq in any::<u64>(), body in proptest::collection::vec(any::<u8>(), 0..300),
                                    hk in "[a-z]{0,8}", hv in "\\PC{0,16}", seqs in proptest::collection::vec(any::<u64>(), 0..20)) {
            let m = msg(seq, body, vec![(hk.clone(), hv.clone())]);
            let dead = Arc::new(Message { dead_lettered: true, ..(*m).clone() });
            let holders = vec![QueueKey::Queue("a".into()), QueueKey::Durable { client_id: hk.clone(), name: hv.clone() }];
            let mark = ProducerMark { producer: format!("p{hv}"), seq: seq.max(1), seen_ms: seq };
            let records = vec![
                Record::Store { message: m.clone(), holders: holders.clone(), producer: None },
                Record::Store { message: m.clone(), holders: holders.clone(), producer: Some(mark.clone()) },
                Record::Store { message: dead.clone(), holders: holders.clone(), producer: None },
                Record::Spill { message: dead.clone() },
                Record::Spill { message: Arc::new(Message { persistent: false, ..(*dead).clone() }) },
                Record::Remove { queue: QueueKey::Queue(hv.clone()), seqs: seqs.clone() },
                Record::Commit { stores: vec![(m.clone(), holders.clone())], removes: seqs.iter().map(|s| (QueueKey::Queue("a".into()), *s)).collect(), schedules: Vec::new(), producer: None },
                Record::Commit { stores: vec![(m.clone(), holders.clone())], removes: Vec::new(), schedules: vec![(m.clone(), ScheduleState { due_ms: 9, repeats_left: 2, anchor_ms: 0 })], producer: None },
                Record::Commit { stores: vec![(m.clone(), holders.clone())], removes: Vec::new(), schedules: Vec::new(), producer: Some(mark.clone()) },
                Record::Commit { stores: Vec::new(), removes: vec![(QueueKey::Queue("a".into()), 3)], schedules: vec![(m.clone(), ScheduleState { due_ms: 9, repeats_left: 2, anchor_ms: 0 })], producer: Some(mark.clone()) },
                Record::ProducerState { mark: mark.clone() },
                Record::DurableSubscribe { client_id: hk.clone(), name: hv.clone(), topic: "t".into(), selector: Some("a = 1".into()) },
                Record::DurableUnsubscribe { client_id: hk, name: hv },
                Record::Checkpoint { next_seq: seq },
                Record::Spill { message: m.clone() },
                Record::DeclareQueue { name: "Consumer.a.VirtualTopic.t".into() },
                Record::Schedule { message: m.clone(), state: ScheduleState { due_ms: seq, repeats_left: -1, anchor_ms: 7 }, producer: None },
                Record::Schedule { message: m.clone(), state: ScheduleState { due_ms: 1, repeats_left: 0, anchor_ms: 0 }, producer: Some(mark.clone()) },
                Record::Fire { schedule: seq, message: m.clone(), holders: vec![QueueKey::Queue("b".into())], next: None },
                Record::Fire { schedule: 1, message: m, holders: Vec::new(), next: Some(ScheduleState { due_ms: 5, repeats_left: 3, anchor_ms: 0 }) },
            ];
            for r in records {
                let bytes = r.to_bytes();
                prop_assert_eq!(Record::decode(&bytes).unwrap(), r.clone());
                // Decoding with the payload shared gives the same record.
                let shared = Bytes::from(bytes.clone());
                prop_assert_eq!(Record::decode_from(&shared, Some(&shared)).unwrap(), r.clone());
                // Every strict prefix fails cleanly rather than panicking.
                for cut in [0, bytes.len() / 2, bytes.len().saturating_sub(1)] {
                    if cut < bytes.len() {
                        prop_assert!(Record::decode(&bytes[..cut]).is_err());
                    }
                }
            }
        }

        /// Records written before producer sequences existed keep their bytes: a store or
        /// commit without a producer is encoded exactly as before (old logs stay readable, and
        /// a downgrade can read what a new broker wrote without producers).
        #[test]
        fn records_without_a_producer_keep_their_encoding(seq in any::<u64>(), body in proptest::collection::vec(any::<u8>(), 0..64)) {
            let m = msg(seq, body, Vec::new());
            let holders = vec![QueueKey::Queue("a".into())];
            let mut old = vec![TAG_STORE];
            put_message(&mut old, &m);
            put_holders(&mut old, &holders);
            prop_assert_eq!(Record::Store { message: m.clone(), holders: holders.clone(), producer: None }.to_bytes(), old);
            let mut old = vec![TAG_COMMIT];
            put_u32(&mut old, 1);
            put_message(&mut old, &m);
            put_holders(&mut old, &holders);
            put_u32(&mut old, 0);
            prop_assert_eq!(Record::Commit { stores: vec![(m, holders)], removes: Vec::new(), schedules: Vec::new(), producer: None }.to_bytes(), old);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Record::decode(&bytes);
        }
    }
}

//! Scheduled delivery with ActiveMQ's headers: `AMQ_SCHEDULED_DELAY` (ms before the first
//! delivery), `AMQ_SCHEDULED_PERIOD` (ms between repeats), `AMQ_SCHEDULED_REPEAT` (further
//! deliveries; negative = forever) and `AMQ_SCHEDULED_CRON` (five-field cron, UTC).
//!
//! A scheduled SEND is held by the scheduler, not by its destination: one `Schedule` record
//! describes it (always logged, whatever its `persistent` header, so it survives restarts and
//! is replicated like any record). Each firing numbers a fresh copy (its own `message-id`),
//! routes it like a SEND and logs one `Fire` record carrying both the copy and the schedule's
//! next state, so a crash can neither lose a firing nor repeat it.
//!
//! Timetable: without cron, the first delivery is at arrival + delay, then `repeat` more every
//! `period`. With cron, each cron time starts a round: a delivery at cron time + delay, then
//! `repeat` more every `period`; the next round starts at the first cron time after the
//! round's start that is not in the past (missed rounds while the broker was down are skipped;
//! an overdue delivery fires once, at start-up).

use super::Engine;
use crate::command::NewMessage;
use crate::cron::Cron;
use crate::error::EngineError;
use crate::live::LiveObject;
use crate::message::Message;
use crate::record::{Record, ScheduleState};
use crate::types::Destination;
use crate::ProducerMark;
use haven_headers::Headers;
use std::sync::Arc;

pub(super) const HEADER_DELAY: &str = "AMQ_SCHEDULED_DELAY";
pub(super) const HEADER_PERIOD: &str = "AMQ_SCHEDULED_PERIOD";
pub(super) const HEADER_REPEAT: &str = "AMQ_SCHEDULED_REPEAT";
pub(super) const HEADER_CRON: &str = "AMQ_SCHEDULED_CRON";
/// What the four names above start with.
const HEADER_PREFIX: &str = "AMQ_SCHEDULED_";

/// Firings handled per tick: bounds the work one tick adds after a long downtime.
const FIRES_PER_TICK_MAX: usize = 10_000;

/// Longest delay or period accepted: ten years, in ms (beyond it is surely a unit mistake).
const SCHEDULE_MS_MAX: u64 = 10 * 366 * 24 * 3_600_000;

/// A held scheduled message.
#[derive(Debug)]
pub(super) struct Scheduled {
    pub msg: Arc<Message>,
    pub state: ScheduleState,
    /// The record describing it (the `Schedule` record, or its compaction copy).
    pub lsn: u64,
}

/// What the `AMQ_SCHEDULED_*` headers ask for.
#[derive(Debug, PartialEq)]
pub(super) struct Timetable {
    pub delay_ms: u64,
    pub period_ms: u64,
    pub repeat: i64,
    pub cron: Option<Cron>,
}

fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers.get(name).map(str::trim)
}

fn parse_ms(headers: &Headers, name: &str) -> Result<u64, EngineError> {
    let Some(text) = header(headers, name) else {
        return Ok(0);
    };
    let v: i64 = text
        .parse()
        .map_err(|_| EngineError::BadSchedule(format!("{name} '{text}' is not an integer")))?;
    let v = u64::try_from(v.max(0)).expect("non-negative");
    if v > SCHEDULE_MS_MAX {
        return Err(EngineError::BadSchedule(format!(
            "{name} {v} ms is more than ten years"
        )));
    }
    Ok(v)
}

/// The timetable a SEND asks for, or None for an ordinary (immediate) SEND.
pub(super) fn timetable(headers: &Headers) -> Result<Option<Timetable>, EngineError> {
    // Every SEND asks; one pass answers for the many that name no schedule, where four
    // lookups by name cost 4% of a broker's worker.
    if !headers.iter().any(|(k, _)| k.starts_with(HEADER_PREFIX)) {
        return Ok(None);
    }
    let delay_ms = parse_ms(headers, HEADER_DELAY)?;
    let period_ms = parse_ms(headers, HEADER_PERIOD)?;
    let repeat = match header(headers, HEADER_REPEAT) {
        None => 0,
        Some(text) => text.parse::<i64>().map_err(|_| {
            EngineError::BadSchedule(format!("{HEADER_REPEAT} '{text}' is not an integer"))
        })?,
    };
    let cron = match header(headers, HEADER_CRON) {
        None | Some("") => None,
        Some(text) => Some(
            Cron::parse(text)
                .map_err(|e| EngineError::BadSchedule(format!("{HEADER_CRON}: {e}")))?,
        ),
    };
    let repeat = if cron.is_some() {
        repeat.max(0)
    } else {
        repeat
    };
    if repeat != 0 && period_ms == 0 {
        return Err(EngineError::BadSchedule(format!(
            "{HEADER_REPEAT} needs {HEADER_PERIOD} greater than 0"
        )));
    }
    if delay_ms == 0 && repeat == 0 && cron.is_none() {
        return Ok(None);
    }
    Ok(Some(Timetable {
        delay_ms,
        period_ms,
        repeat,
        cron,
    }))
}

impl Timetable {
    /// The first firing for a message accepted at `now_ms`; None if a cron never fires.
    fn first(&self, now_ms: u64) -> Option<ScheduleState> {
        match &self.cron {
            None => Some(ScheduleState {
                due_ms: now_ms + self.delay_ms,
                repeats_left: self.repeat,
                anchor_ms: 0,
            }),
            Some(cron) => {
                let anchor_ms = cron.next_after_ms(now_ms)?;
                Some(ScheduleState {
                    due_ms: anchor_ms + self.delay_ms,
                    repeats_left: self.repeat,
                    anchor_ms,
                })
            }
        }
    }

    /// The state after a firing from `state` at `now_ms`; None when the schedule is done.
    fn after(&self, state: ScheduleState, now_ms: u64) -> Option<ScheduleState> {
        if state.repeats_left != 0 {
            return Some(ScheduleState {
                due_ms: state.due_ms + self.period_ms,
                repeats_left: (state.repeats_left - 1).max(-1),
                anchor_ms: state.anchor_ms,
            });
        }
        let cron = self.cron.as_ref()?;
        let anchor_ms = cron.next_after_ms(state.anchor_ms.max(now_ms))?;
        Some(ScheduleState {
            due_ms: anchor_ms + self.delay_ms,
            repeats_left: self.repeat,
            anchor_ms,
        })
    }
}

impl Engine {
    /// A SEND with a timetable: held by the scheduler (logged) instead of routed. `producer`
    /// goes into the same record, so the schedule and the producer's mark are durable
    /// together. Returns the record's LSN.
    pub(super) fn schedule(
        &mut self,
        destination: Destination,
        message: NewMessage,
        table: Timetable,
        producer: Option<ProducerMark>,
    ) -> Result<u64, EngineError> {
        self.check_schedulable(&destination, &table, 1)?;
        let (msg, state) = self.new_schedule(destination, message, &table);
        let lsn = self.log(Record::Schedule {
            message: msg.clone(),
            state,
            producer,
        });
        self.apply_schedule(msg, state, lsn);
        Ok(lsn)
    }

    /// Refuses a schedule that can never be held: to a temporary destination, a cron that never
    /// fires, or `more` beyond the limit on held schedules.
    pub(super) fn check_schedulable(
        &self,
        destination: &Destination,
        table: &Timetable,
        more: usize,
    ) -> Result<(), EngineError> {
        if destination.is_temporary() {
            return Err(EngineError::BadSchedule(
                "scheduled delivery to a temporary destination is not supported".into(),
            ));
        }
        if self.schedules.len() + more > self.cfg.scheduled_messages_max {
            return Err(EngineError::TooManyScheduled(
                self.cfg.scheduled_messages_max,
            ));
        }
        if table.first(self.now_ms).is_none() {
            return Err(EngineError::BadSchedule(format!(
                "{HEADER_CRON} never fires in the next five years"
            )));
        }
        Ok(())
    }

    /// Numbers a scheduled message and computes its first firing; the caller logs it (alone,
    /// or in a transaction's commit) and then applies it.
    pub(super) fn new_schedule(
        &mut self,
        destination: Destination,
        message: NewMessage,
        table: &Timetable,
    ) -> (Arc<Message>, ScheduleState) {
        // Checked when the SEND was accepted; a cron that stopped firing since (five years on)
        // fires once now rather than never.
        let state = table.first(self.now_ms).unwrap_or(ScheduleState {
            due_ms: self.now_ms,
            repeats_left: 0,
            anchor_ms: 0,
        });
        let seq = self.next_seq;
        self.next_seq += 1;
        let msg = Arc::new(Message {
            seq,
            id: format!("ID:haven-{seq}"),
            destination,
            headers: message.headers,
            body: message.body,
            persistent: message.persistent,
            priority: message.priority.min(9),
            expires_ms: message.expires_ms,
            timestamp_ms: self.now_ms,
            dead_lettered: false,
        });
        (msg, state)
    }

    pub(super) fn apply_schedule(&mut self, msg: Arc<Message>, state: ScheduleState, lsn: u64) {
        let seq = msg.seq;
        if let Some(old) = self.schedules.remove(&seq) {
            self.schedule_due.remove(&(old.state.due_ms, seq));
            self.live.remove(old.lsn, &LiveObject::Message(seq));
        }
        self.schedule_due.insert((state.due_ms, seq));
        self.live.insert(lsn, LiveObject::Message(seq));
        self.schedules.insert(seq, Scheduled { msg, state, lsn });
    }

    /// Fires every schedule due at the current time (within the per-tick bound).
    pub(super) fn fire_due(&mut self) {
        for _ in 0..FIRES_PER_TICK_MAX {
            let Some(&(due_ms, seq)) = self.schedule_due.first() else {
                return;
            };
            if due_ms > self.now_ms {
                return;
            }
            self.schedule_due.pop_first();
            let s = self.schedules.get(&seq).expect("due schedule exists");
            let template = s.msg.clone();
            let state = s.state;
            let table = timetable(&template.headers)
                .ok()
                .flatten()
                .expect("a held schedule's headers were valid when accepted");
            let next = table.after(state, self.now_ms);
            let destination = template.destination.clone();
            let copy = NewMessage {
                headers: template.headers.clone(),
                body: template.body.clone(),
                persistent: template.persistent,
                priority: template.priority,
                expires_ms: template.expires_ms,
            };
            let msg = self.number(&destination, copy);
            let lsn = self.lsn;
            let holders = self.route(0, &destination, msg.clone(), lsn, false);
            let logged = self.log(Record::Fire {
                schedule: seq,
                message: msg,
                holders,
                next,
            });
            assert_eq!(logged, lsn);
            self.advance_schedule(seq, next);
        }
    }

    fn advance_schedule(&mut self, seq: u64, next: Option<ScheduleState>) {
        let Some(s) = self.schedules.get_mut(&seq) else {
            return;
        };
        self.schedule_due.remove(&(s.state.due_ms, seq));
        match next {
            Some(state) => {
                s.state = state;
                self.schedule_due.insert((state.due_ms, seq));
            }
            None => {
                let s = self.schedules.remove(&seq).expect("present");
                self.live.remove(s.lsn, &LiveObject::Message(seq));
            }
        }
    }

    pub(super) fn replay_schedule(&mut self, msg: Arc<Message>, state: ScheduleState, lsn: u64) {
        self.next_seq = self.next_seq.max(msg.seq + 1);
        self.apply_schedule(msg, state, lsn);
    }

    pub(super) fn replay_fire(&mut self, schedule: u64, next: Option<ScheduleState>, _lsn: u64) {
        // The schedule's own record may be gone (compaction re-logged it later, with this
        // firing already counted); then only the copy matters.
        self.advance_schedule(schedule, next);
    }

    /// Compaction: writes a schedule's current state as a new record.
    pub(super) fn relocate_schedule(&mut self, seq: u64) {
        let s = &self.schedules[&seq];
        let (msg, state) = (s.msg.clone(), s.state);
        let lsn = self.log(Record::Schedule {
            message: msg.clone(),
            state,
            producer: None,
        });
        self.apply_schedule(msg, state, lsn);
    }

    /// Scheduled messages held.
    pub fn scheduled_count(&self) -> usize {
        self.schedules.len()
    }

    /// When the next scheduled message is due, if any.
    pub fn next_schedule_due_ms(&self) -> Option<u64> {
        self.schedule_due.first().map(|(due, _)| *due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `timetable`'s shortcut skips only SENDs that name none of the schedule headers.
    #[test]
    fn every_schedule_header_starts_with_the_prefix() {
        for name in [HEADER_DELAY, HEADER_PERIOD, HEADER_REPEAT, HEADER_CRON] {
            assert!(name.starts_with(HEADER_PREFIX), "{name}");
        }
        let delayed = Headers::from_pairs(&[("x", "y"), (HEADER_DELAY, "1000")]);
        assert!(timetable(&delayed).unwrap().is_some());
        assert!(timetable(&Headers::from_pairs(&[("AMQ_SCHEDULED", "1")]))
            .unwrap()
            .is_none());
    }
}

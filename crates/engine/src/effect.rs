//! What the engine asks of the edges.

use crate::message::Message;
use crate::record::Record;
use crate::types::ConnId;
use std::sync::Arc;

/// One message handed to one subscription.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub sub_id: String,
    /// Per-connection delivery tag; the `ack` header in STOMP 1.2.
    pub ack_tag: u64,
    pub message: Arc<Message>,
    /// True when the message may have been delivered before (JMS semantics).
    pub redelivered: bool,
    /// 1 on first delivery.
    pub delivery_count: u32,
    /// Auto-ack subscription: the connection returns credit once written.
    pub auto_ack: bool,
}

#[derive(Clone, Debug)]
pub enum Effect {
    Deliver { conn: ConnId, delivery: Delivery },
    Receipt { conn: ConnId, receipt: String },
}

impl Effect {
    pub fn conn(&self) -> ConnId {
        match self {
            Effect::Deliver { conn, .. } | Effect::Receipt { conn, .. } => *conn,
        }
    }
}

/// The engine's ordered output for one call. The caller appends each `Log` record to the
/// durable log in order (they take consecutive LSNs starting at `Ctx::next_lsn`), and releases
/// each `Effect` only once every record before it is durable.
#[derive(Clone, Debug)]
pub enum Output {
    Log(Record),
    Effect(Effect),
}

//! The broker engine: a deterministic state machine that owns destinations, messages,
//! subscriptions, transactions, redelivery and the dead-letter queue.
//!
//! It does no I/O, reads no clock and uses no randomness: time and the next log position are
//! inputs ([`Ctx`]); commands go in, and an ordered list of [`Output`]s comes out — records to
//! append to the durable log and effects for the outside world (deliver a message, send a
//! receipt). Because it is deterministic, the same engine is rebuilt after a crash by
//! [`Engine::replay`]ing the log, and can later be applied on every replica.
//!
//! The engine applies a command to its in-memory state at once ("speculatively") and emits the
//! record that makes it durable, followed by the effects. The caller must not release an
//! effect to the outside world until every record emitted before it is durable; if the log
//! cannot be made durable the process must stop, which discards the speculative state. This
//! gives the rule of the architecture — nothing is acknowledged or dispatched before the log
//! has it — while one pipeline serves every topology.

mod advisory;
mod cold;
mod command;
mod config;
pub mod cron;
mod effect;
mod engine;
mod error;
pub mod hash;

mod live;
mod message;
mod origins;
pub use origins::OriginStats;
mod producers;
mod queue;
pub mod read_ahead;
pub mod record;
pub mod selector;
mod types;

pub use command::{AckRef, Command, NetworkConsumer, NewMessage, ProducerSeq, SubscribeOptions};
pub use config::{DestinationLimits, DlqPolicy, EngineConfig, RedeliveryPolicy};
pub use effect::{Delivery, Effect, Output};
pub use engine::{Ctx, Engine, MemoryStats, MessageLoader, QueueStats};
pub use error::EngineError;
pub use haven_headers::{Decimal, Headers};
pub use message::{Message, PRIORITY_DEFAULT};
pub use producers::{ProducerStats, NETWORK_ORIGIN_PREFIX, PRODUCER_ID_BYTES_MAX};
pub use record::{ProducerMark, Record, ScheduleState};
pub use types::{
    is_wildcard, virtual_topic_of, wildcard_matches, AckMode, ConnId, Destination,
    DestinationError, QueueKey,
};

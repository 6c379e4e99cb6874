//! `haven-client`: an async STOMP 1.0–1.2 client.
//!
//! A [`Connection`] owns one transport (one TCP socket) and two tasks: a *writer* that drains an
//! mpsc queue of outgoing frames (so any number of tasks can send concurrently through `&self`)
//! and a *reader* that demultiplexes what the broker sends: MESSAGE frames go to the
//! [`Subscription`] named by their `subscription` header, RECEIPT frames complete the waiter
//! registered under their `receipt-id`, and an ERROR frame (or a closed socket, or a silent
//! server) ends the connection and fails every waiter with the same [`ClientError`].
//!
//! A [`Client`] is the layer above: a session over `tcp://` or ActiveMQ's `failover:(...)` URIs
//! that owns a sequence of `Connection`s, restores subscriptions on each, sends unconfirmed
//! SENDs again with Haven's producer sequence (so a Haven broker stores each once), and drops
//! redeliveries of messages the application already acked (see `failover.rs`).

mod backoff;
mod connection;
mod dedup;
mod error;
mod failover;
mod message;
mod options;
mod reader;
mod shared;
mod subscription;
mod transport;
mod uri;
mod writer;

pub use connection::{Connection, FrameBatch, Receipt};
pub use error::ClientError;
pub use failover::{Client, ClientStats, ConnectionEvent};
pub use haven_stomp::{Command, Frame, Headers, Version};
pub use message::Message;
pub use options::{AckMode, ConnectOptions};
pub use subscription::Subscription;
pub use transport::{BoxFuture, Dial, Dialer, ReadHalf, WriteHalf};
pub use uri::{parse_uri, BrokerUri, FailoverOptions};

/// Result type of every fallible client call.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

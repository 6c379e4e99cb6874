//! `haven-client`: an async STOMP 1.0–1.2 client.
//!
//! A [`Connection`] owns one transport (one TCP socket) and two tasks: a *writer* that drains an
//! mpsc queue of outgoing frames (so any number of tasks can send concurrently through `&self`)
//! and a *reader* that demultiplexes what the broker sends: MESSAGE frames go to the
//! [`Subscription`] named by their `subscription` header, RECEIPT frames complete the waiter
//! registered under their `receipt-id`, and an ERROR frame (or a closed socket, or a silent
//! server) ends the connection and fails every waiter with the same [`ClientError`].
//!
//! The failover transport (ActiveMQ's `failover:(...)` URIs, resending unreceipted SENDs) is a
//! later layer: it will own a sequence of `Connection`s and replay subscriptions on each; nothing
//! here assumes the socket lives forever except that a closed `Connection` stays closed.

mod connection;
mod error;
mod message;
mod options;
mod reader;
mod shared;
mod subscription;
mod writer;

pub use connection::{Connection, Receipt};
pub use error::ClientError;
pub use haven_stomp::{Command, Frame, Version};
pub use message::Message;
pub use options::{AckMode, ConnectOptions};
pub use subscription::Subscription;

/// Result type of every fallible client call.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

//! Errors of `haven bench`. The broker under test is "the world": anything it does wrong
//! (refuses a connection, sends ERROR, closes early, loses or duplicates a message) is a typed
//! error here, never a panic. Panics are kept for bugs in the bench itself.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("i/o error talking to the broker: {0}")]
    Io(#[from] io::Error),
    #[error("broker sent ERROR: {0}")]
    Broker(String),
    #[error("malformed frame from the broker: {0}")]
    Protocol(String),
    #[error("broker closed the connection {0}")]
    Closed(&'static str),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("bad arguments: {0}")]
    Args(String),
    #[error("accounting failed: {lost} message(s) lost, {duplicates} duplicate deliveries")]
    Accounting { lost: u64, duplicates: u64 },
    #[error("fsync probe on {dir}: {source}")]
    Fsync { dir: String, source: io::Error },
}

pub type Result<T> = std::result::Result<T, BenchError>;

//! haven-stomp: the STOMP 1.0/1.1/1.2 wire format, and nothing else.
//!
//! This crate owns the bytes ↔ frames mapping: frame syntax, heart-beat EOLs, header
//! escaping per version, `content-length` bodies, version negotiation, and the size limits
//! that keep a hostile peer from making the broker buffer without bound. It does no I/O
//! and knows no broker semantics (destinations, acks, receipts are the server's): a
//! [`StompCodec`] plugs into `tokio_util::codec::Framed` on whatever transport the caller
//! owns. Keeping it pure makes it cheap to fuzz and to drive from simulation.
//!
//! Contract: decoding never panics on any input, never buffers more than one frame
//! (`Limits::frame_bytes_max`) plus a few bytes, and every error says what was wrong in
//! words fit for an ERROR frame's `message` header.

mod buffers;
mod codec;
mod error;
mod escape;
mod frame;
mod version;

pub use buffers::{is_empty_and_larger_than, release_large_read_buffer};
pub use codec::{Limits, StompCodec};
pub use error::DecodeError;
pub use frame::{Command, Frame, Item};
/// A frame's headers (also the engine's message headers): one buffer for all of them.
pub use haven_headers::Headers;
pub use version::Version;

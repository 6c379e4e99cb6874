//! Giving back the room a large frame made in a connection's read buffer.
//!
//! Why: the codec reserves room for a whole body at once (`Phase::Body`), so one 8 MiB SEND
//! grows its connection's read buffer to 8 MiB, and nothing shrank it again: the buffer is
//! reused for every later read, for as long as the connection lives. Measured: 20 idle
//! connections that had each sent one 8 MiB message held 195 MiB of a broker's memory after
//! the messages were consumed. A broker with many clients that now and then send a large
//! message would grow towards clients × `stomp.frame_bytes_max`.
//!
//! The rule is the one the broker's write buffers follow (`WRITE_BUFFER_KEEP_BYTES`): a buffer
//! whose allocation grew past `READ_BUFFER_KEEP_BYTES` is dropped once it holds nothing, and
//! the next read starts in a small one. A stream of large frames that straddle reads keeps its
//! buffer; one that stops gives it back after its last frame. Keeping 128 KiB lets a client of
//! 64 KiB messages (the suite's scenario (f)) reuse its buffer.

use bytes::BytesMut;

/// Read buffers whose allocation is larger than this are dropped once empty.
pub const READ_BUFFER_KEEP_BYTES: usize = 128 * 1024;
/// What a read buffer starts again with (tokio-util's `FramedRead` default).
pub const READ_BUFFER_BYTES_INITIAL: usize = 8 * 1024;

/// Replaces `buf` with a small one if it is empty and its allocation is larger than
/// `READ_BUFFER_KEEP_BYTES`. Call it between frames; it never drops unread bytes.
pub fn release_large_read_buffer(buf: &mut BytesMut) {
    // Consuming frames moves the buffer's start along its allocation, so `capacity()` is what
    // lies ahead of the start. Reclaiming the room behind it (free when nothing is buffered)
    // succeeds only if the whole allocation is larger than asked.
    if buf.is_empty() && buf.try_reclaim(READ_BUFFER_KEEP_BYTES + 1) {
        *buf = BytesMut::with_capacity(READ_BUFFER_BYTES_INITIAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Buf, BufMut};

    /// A buffer that held a frame of `frame` bytes, `consumed` of which were taken.
    fn after_frame(frame: usize, consumed: usize) -> BytesMut {
        let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES_INITIAL);
        // What the codec does for a body longer than what arrived.
        buf.reserve(frame);
        buf.put_bytes(b'x', frame);
        buf.advance(consumed);
        buf
    }

    #[test]
    fn an_empty_buffer_that_held_a_large_frame_is_replaced_by_a_small_one() {
        let mut buf = after_frame(8 << 20, 8 << 20);
        release_large_read_buffer(&mut buf);
        assert_eq!(buf.capacity(), READ_BUFFER_BYTES_INITIAL);
    }

    #[test]
    fn unread_bytes_keep_the_buffer() {
        let mut buf = after_frame(8 << 20, (8 << 20) - 10);
        release_large_read_buffer(&mut buf);
        assert_eq!(buf.len(), 10);
        assert!(buf.capacity() >= 10);
    }

    #[test]
    fn a_buffer_that_held_only_frames_within_the_keep_size_is_kept() {
        let mut buf = after_frame(64 * 1024, 64 * 1024);
        release_large_read_buffer(&mut buf);
        // Still the 64 KiB allocation: its room can be had without allocating.
        assert!(buf.try_reclaim(64 * 1024));
    }

    #[test]
    fn a_small_buffer_is_left_alone() {
        let mut buf = after_frame(100, 100);
        release_large_read_buffer(&mut buf);
        assert_eq!(buf.capacity(), READ_BUFFER_BYTES_INITIAL - 100);
    }
}

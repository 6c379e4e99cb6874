//! Giving back the room a large frame made in a connection's buffers.
//!
//! Why: a buffer grows to the largest frame it carries, and reusing it kept that size for the
//! connection's life. Reading, the codec reserves room for a whole body at once
//! (`Phase::Body`): 20 idle connections that had each sent one 8 MiB message held 195 MiB of a
//! broker's memory after the messages were consumed. Writing, a MESSAGE is encoded whole into
//! the connection's write buffer: 20 idle consumers that had each received one 8 MiB message
//! held 193 MiB. A broker whose clients now and then send or receive a large message would
//! grow towards connections × `stomp.frame_bytes_max`.
//!
//! The rule: a buffer whose allocation grew past a limit is dropped once it holds nothing, and
//! the next frame starts in a small one. A stream of large frames that straddle reads keeps
//! its buffer; one that stops gives it back after its last frame. Keeping 128 KiB lets a
//! client of 64 KiB messages (the suite's scenario (f)) reuse its read buffer.
//!
//! The allocation is not what `capacity()` says: consuming or writing out bytes moves the
//! buffer's start along its allocation, and `capacity()` counts only what lies ahead of the
//! start. A buffer that had just written 8 MiB out showed a few bytes of capacity, so the
//! write side's own check (`capacity() > keep`) never fired. Reclaiming the room behind the
//! start (free when nothing is buffered) succeeds only if the whole allocation is larger.

use bytes::BytesMut;

/// Read buffers whose allocation is larger than this are dropped once empty.
const READ_BUFFER_KEEP_BYTES: usize = 128 * 1024;
/// What a read buffer starts again with (tokio-util's `FramedRead` default).
const READ_BUFFER_BYTES_INITIAL: usize = 8 * 1024;

/// Whether `buf` holds nothing and its allocation is larger than `bytes_max`. It may move the
/// buffer's start back to the start of its allocation (no copy: there is nothing to move).
pub fn is_empty_and_larger_than(buf: &mut BytesMut, bytes_max: usize) -> bool {
    buf.is_empty() && buf.try_reclaim(bytes_max + 1)
}

/// Replaces `buf` with a small one if it is empty and its allocation is larger than
/// `READ_BUFFER_KEEP_BYTES`. Call it between frames; it never drops unread bytes.
pub fn release_large_read_buffer(buf: &mut BytesMut) {
    if is_empty_and_larger_than(buf, READ_BUFFER_KEEP_BYTES) {
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
    fn a_buffer_that_wrote_out_a_large_frame_counts_as_large() {
        // What a write buffer looks like after its socket took all of it.
        let mut buf = after_frame(8 << 20, 8 << 20);
        assert!(
            buf.capacity() < READ_BUFFER_KEEP_BYTES,
            "capacity() hides the allocation"
        );
        assert!(is_empty_and_larger_than(&mut buf, READ_BUFFER_KEEP_BYTES));
        assert!(!is_empty_and_larger_than(&mut buf, 16 << 20));
    }

    #[test]
    fn a_small_buffer_is_left_alone() {
        let mut buf = after_frame(100, 100);
        release_large_read_buffer(&mut buf);
        assert_eq!(buf.capacity(), READ_BUFFER_BYTES_INITIAL - 100);
    }
}

//! The record format, encoded and decoded in one place.
//!
//! ```text
//! [u32 len][u32 crc32c][u64 lsn][payload]      little endian, 16-byte header
//! len = 8 + payload.len()                       (the bytes the CRC covers: lsn ++ payload)
//! crc = crc32c(lsn.to_le_bytes() ++ payload)
//! ```
//! `len` counts the LSN too, so it is never zero even for an empty payload: a zero `len` where a
//! record should start means "end of log in this segment" (segments are preallocated with
//! zeros, and a recycled one gets a zero `len` written after each batch). The LSN is inside the CRC so a stale or misplaced record is detected, and the length
//! is validated against the segment bounds before any payload is read.

use crate::Lsn;

/// Bytes of the record header: len (4) + crc (4) + lsn (8).
pub const RECORD_HEADER_BYTES: usize = 16;
/// Bytes of the header that precede the CRC-covered part (len + crc).
const LEN_CRC_BYTES: usize = 8;

/// CRC32C over `lsn ++ payload`.
pub fn record_crc(lsn: Lsn, payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&lsn.to_le_bytes());
    crc32c::crc32c_append(crc, payload)
}

/// Total encoded bytes of a record with this payload length.
pub fn encoded_bytes(payload_bytes: usize) -> usize {
    RECORD_HEADER_BYTES + payload_bytes
}

/// Appends the encoded record to `buf`.
pub fn encode_into(buf: &mut Vec<u8>, lsn: Lsn, payload: &[u8]) {
    let len = u32::try_from(LEN_CRC_BYTES + payload.len()).expect("record length fits in u32");
    let crc = record_crc(lsn, payload);
    let start = buf.len();
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(&lsn.to_le_bytes());
    buf.extend_from_slice(payload);
    debug_assert_eq!(buf.len() - start, encoded_bytes(payload.len()));
}

/// A decoded record header. `len` is not validated here; see `payload_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub len: u32,
    pub crc: u32,
    pub lsn: Lsn,
}

impl RecordHeader {
    pub fn decode(bytes: &[u8; RECORD_HEADER_BYTES]) -> RecordHeader {
        RecordHeader {
            len: u32::from_le_bytes(bytes[0..4].try_into().unwrap()),
            crc: u32::from_le_bytes(bytes[4..8].try_into().unwrap()),
            lsn: u64::from_le_bytes(bytes[8..16].try_into().unwrap()),
        }
    }

    /// Payload length, or None if `len` is too small to be a record (0 = end of log).
    pub fn payload_bytes(&self) -> Option<usize> {
        (self.len as usize).checked_sub(LEN_CRC_BYTES)
    }

    /// Total encoded bytes, or None if `len` is too small to be a record.
    pub fn encoded_bytes(&self) -> Option<usize> {
        self.payload_bytes().map(encoded_bytes)
    }

    pub fn crc_matches(&self, payload: &[u8]) -> bool {
        record_crc(self.lsn, payload) == self.crc
    }
}

/// What the bytes at a record boundary of a segment say. The one definition of "where the log
/// in a segment ends" and "is this framing plausible", shared by recovery and the reader so the
/// two can never disagree about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// End of the log in this segment: no bytes left, or a zero `len` (the preallocated zeros).
    End,
    /// A header whose length is a record's and fits in what is left of the segment. Neither the
    /// CRC nor the LSN has been checked.
    Record {
        header: RecordHeader,
        /// Header plus payload.
        total_bytes: usize,
    },
    /// An incomplete header, or a length that is not a record's or runs past the segment.
    Bad(String),
}

/// Classifies a record boundary. `head` is the first `min(available_bytes, RECORD_HEADER_BYTES)`
/// bytes there; `available_bytes` is what is left of the segment from there.
pub fn frame(head: &[u8], available_bytes: u64) -> Frame {
    assert_eq!(
        head.len() as u64,
        available_bytes.min(RECORD_HEADER_BYTES as u64),
        "frame() gets exactly the header bytes that exist"
    );
    if available_bytes == 0 || head[..head.len().min(4)].iter().all(|&b| b == 0) {
        return Frame::End;
    }
    let Ok(head) = <&[u8; RECORD_HEADER_BYTES]>::try_from(head) else {
        return Frame::Bad(format!(
            "incomplete record header ({} of {RECORD_HEADER_BYTES} bytes)",
            head.len()
        ));
    };
    let header = RecordHeader::decode(head);
    let Some(total_bytes) = header.encoded_bytes() else {
        return Frame::Bad(format!("record length {} too small", header.len));
    };
    if total_bytes as u64 > available_bytes {
        return Frame::Bad(format!(
            "record length {} runs past the end of the segment ({available_bytes} bytes left)",
            header.len
        ));
    }
    Frame::Record {
        header,
        total_bytes,
    }
}

/// Walks a buffer of encoded records (the writer's batch). Checks each CRC again on the write
/// side in debug builds, so an encoding bug is caught before it reaches the disk.
pub fn next_record(buf: &[u8]) -> (RecordHeader, usize) {
    let header = RecordHeader::decode(buf[..RECORD_HEADER_BYTES].try_into().unwrap());
    let total = header
        .encoded_bytes()
        .expect("buffered record has a valid length");
    assert!(total <= buf.len(), "buffered record is complete");
    debug_assert!(
        header.crc_matches(&buf[RECORD_HEADER_BYTES..total]),
        "CRC of buffered record LSN {}",
        header.lsn
    );
    (header, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn encode_then_decode_round_trips(lsn in 1u64.., payload in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut buf = Vec::new();
            encode_into(&mut buf, lsn, &payload);
            let (header, total) = next_record(&buf);
            prop_assert_eq!(total, buf.len());
            prop_assert_eq!(header.lsn, lsn);
            prop_assert!(header.crc_matches(&buf[RECORD_HEADER_BYTES..]));
            prop_assert_eq!(&buf[RECORD_HEADER_BYTES..], &payload[..]);
        }

        #[test]
        fn any_flipped_bit_is_detected(payload in proptest::collection::vec(any::<u8>(), 1..64), bit in 0usize..(8 * 80)) {
            let mut buf = Vec::new();
            encode_into(&mut buf, 7, &payload);
            let bit = bit % (8 * (buf.len() - 4)) + 32; // not in len: len damage is caught by bounds
            buf[bit / 8] ^= 1 << (bit % 8);
            let header = RecordHeader::decode(buf[..RECORD_HEADER_BYTES].try_into().unwrap());
            prop_assert!(!header.crc_matches(&buf[RECORD_HEADER_BYTES..]));
        }
    }

    #[test]
    fn frame_tells_end_bad_and_records_apart() {
        let mut buf = Vec::new();
        encode_into(&mut buf, 9, b"abc");
        let total = buf.len() as u64;
        let head = &buf[..RECORD_HEADER_BYTES];
        assert!(matches!(
            frame(head, total),
            Frame::Record { header, total_bytes } if header.lsn == 9 && total_bytes == buf.len()
        ));
        assert_eq!(frame(&[], 0), Frame::End);
        assert_eq!(frame(&[0; RECORD_HEADER_BYTES], 100), Frame::End);
        assert_eq!(frame(&[0; 3], 3), Frame::End);
        assert!(matches!(frame(&head[..5], 5), Frame::Bad(r) if r.contains("incomplete")));
        assert!(matches!(frame(head, total - 1), Frame::Bad(r) if r.contains("runs past")));
        let mut short = [0u8; RECORD_HEADER_BYTES];
        short[0] = 7;
        assert!(matches!(frame(&short, 100), Frame::Bad(r) if r.contains("too small")));
    }

    #[test]
    fn empty_payload_has_nonzero_len() {
        let mut buf = Vec::new();
        encode_into(&mut buf, 1, &[]);
        assert_eq!(buf.len(), RECORD_HEADER_BYTES);
        assert_ne!(&buf[0..4], &[0, 0, 0, 0]);
    }
}

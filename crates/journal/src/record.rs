//! The record format, encoded and decoded in one place.
//!
//! ```text
//! [u32 len][u32 crc32c][u64 lsn][payload]      little endian, 16-byte header
//! len = 8 + payload.len()                       (the bytes the CRC covers: lsn ++ payload)
//! crc = crc32c(lsn.to_le_bytes() ++ payload)
//! ```
//! `len` counts the LSN too, so it is never zero even for an empty payload: a zero `len` where a
//! record should start means "end of log in this segment" (segments are preallocated with
//! zeros). The LSN is inside the CRC so a stale or misplaced record is detected, and the length
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
    fn empty_payload_has_nonzero_len() {
        let mut buf = Vec::new();
        encode_into(&mut buf, 1, &[]);
        assert_eq!(buf.len(), RECORD_HEADER_BYTES);
        assert_ne!(&buf[0..4], &[0, 0, 0, 0]);
    }
}

//! libFuzzer target for the STOMP decoder (`haven_stomp::StompCodec`).
//!
//! The input is read as: byte 0 picks the version; bytes 1..5 pick small limits (so the
//! fuzzer reaches every limit, not only the defaults' 10 MiB); bytes 5..9 seed the split of
//! the rest into reads of 1..=64 bytes, as a socket would deliver them. The rest is the
//! stream. For every input the decoder must:
//! - never panic (libFuzzer reports a panic as a crash);
//! - never yield a frame over its limits: header count, each header line, whole frame;
//! - never hold more than one frame's worth of undecoded bytes after asking for more;
//! - yield frames that survive encode -> decode unchanged (the encoder adds `content-length`
//!   to a non-empty body that had none), or that the encoder refuses without writing a byte.
#![no_main]

use bytes::BytesMut;
use haven_stomp::{Frame, Item, Limits, StompCodec, Version};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::{Decoder, Encoder};

/// Bytes of the input that configure the run rather than feed the decoder.
const CONFIG_BYTES: usize = 9;
/// The longest single read.
const READ_BYTES_MAX: usize = 64;

fuzz_target!(|data: &[u8]| {
    if data.len() < CONFIG_BYTES {
        return;
    }
    let (config, stream) = data.split_at(CONFIG_BYTES);
    let version = Version::ALL[config[0] as usize % Version::ALL.len()];
    let limits = Limits {
        frame_bytes_max: 8 + u16::from_le_bytes([config[1], config[2]]) as usize % 4096,
        header_count_max: config[3] as usize % 17,
        header_bytes_max: 1 + config[4] as usize % 256,
    };
    let mut split = u32::from_le_bytes([config[5], config[6], config[7], config[8]]) | 1;
    let mut codec = StompCodec::new(limits);
    codec.set_version(version);
    let mut buf = BytesMut::new();
    let mut rest = stream;
    // Bytes handed to the decoder since the last item it returned.
    let mut consumed_since_item = 0usize;
    while !rest.is_empty() {
        // xorshift32: a cheap, input-determined sequence of read sizes.
        split ^= split << 13;
        split ^= split >> 17;
        split ^= split << 5;
        let n = (1 + split as usize % READ_BYTES_MAX).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match codec.decode(&mut buf) {
                Ok(Some(item)) => {
                    consumed_since_item += before - buf.len();
                    check_item(&item, version, limits, consumed_since_item);
                    consumed_since_item = 0;
                }
                Ok(None) => {
                    consumed_since_item += before - buf.len();
                    // One frame at most is buffered (its undecoded part), plus an EOL's bytes.
                    assert!(
                        consumed_since_item + buf.len() <= limits.frame_bytes_max + 2,
                        "buffered {} + consumed {} bytes of one frame over the {}-byte limit",
                        buf.len(),
                        consumed_since_item,
                        limits.frame_bytes_max
                    );
                    break;
                }
                // A server sends ERROR and closes here: nothing more to decode.
                Err(_) => return,
            }
        }
    }
    if let Ok(Some(item)) = codec.decode_eof(&mut buf) {
        check_item(&item, version, limits, 0);
    }
});

fn check_item(item: &Item, version: Version, limits: Limits, consumed: usize) {
    let Item::Frame(frame) = item else {
        return;
    };
    assert!(
        consumed <= limits.frame_bytes_max,
        "a {consumed}-byte frame passed the {}-byte limit",
        limits.frame_bytes_max
    );
    assert!(frame.headers.len() <= limits.header_count_max);
    for (name, value) in &frame.headers {
        // Unescaping only shortens: the decoded line is no longer than the wire line.
        assert!(name.len() + 1 + value.len() <= limits.header_bytes_max);
    }
    assert!(frame.body.len() < limits.frame_bytes_max);
    round_trip(frame, version);
}

fn round_trip(frame: &Frame, version: Version) {
    let mut encoder = StompCodec::new(Limits::default());
    encoder.set_version(version);
    let mut wire = BytesMut::new();
    if encoder.encode(frame, &mut wire).is_err() {
        assert!(wire.is_empty(), "a refused frame left bytes in the buffer");
        return;
    }
    let mut expected = frame.clone();
    if !frame.body.is_empty() && frame.header("content-length").is_none() {
        expected.push_header("content-length", frame.body.len().to_string());
    }
    let mut decoder = StompCodec::new(Limits::default());
    decoder.set_version(version);
    let again = decoder
        .decode(&mut wire)
        .unwrap_or_else(|e| panic!("re-decoding {frame:?} failed: {e}"));
    assert_eq!(again, Some(Item::Frame(expected)), "encoded as {wire:?}");
    assert!(wire.is_empty(), "bytes left after re-decoding: {wire:?}");
}

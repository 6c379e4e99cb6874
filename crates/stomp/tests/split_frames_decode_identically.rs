//! A frame may arrive in any number of reads; where the reads split it must not matter.

use bytes::BytesMut;
use haven_stomp::{Command, DecodeError, Item, Limits, StompCodec, Version};
use tokio_util::codec::Decoder;

/// Heart-beats, CRLF lines, escapes, repeated headers, a binary content-length body and
/// a NUL-terminated body, back to back.
const STREAM: &[u8] = b"\n\r\n\
SEND\r\ndestination:/queue/a\r\nk\\cey:v\\\\al\\nue\\r\r\n\r\nhello\0\
\n\
MESSAGE\ncontent-length:6\nfoo:1\nfoo:2\n\n\0a\0b\r\n\0\
\r\n\r\n\
ACK\nid:7\n\n\0";

fn codec() -> StompCodec {
    let mut c = StompCodec::new(Limits::default());
    c.set_version(Version::V1_2);
    c
}

/// Feeds `chunks` in order, draining all items after each, then signals EOF.
fn decode_chunks<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<Item>, DecodeError> {
    let mut c = codec();
    let mut buf = BytesMut::new();
    let mut items = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        while let Some(item) = c.decode(&mut buf)? {
            items.push(item);
        }
    }
    while let Some(item) = c.decode_eof(&mut buf)? {
        items.push(item);
    }
    Ok(items)
}

fn expected() -> Vec<Item> {
    let items = decode_chunks([STREAM]).unwrap();
    let frames: Vec<_> = items
        .iter()
        .filter_map(|i| match i {
            Item::Frame(f) => Some(f),
            Item::Heartbeat => None,
        })
        .collect();
    assert_eq!(items.len(), 8, "{items:?}");
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[0].command, Command::Send);
    assert_eq!(frames[0].header("k:ey"), Some("v\\al\nue\r"));
    assert_eq!(&frames[0].body[..], b"hello");
    assert_eq!(frames[1].header("foo"), Some("1"));
    assert_eq!(&frames[1].body[..], b"\0a\0b\r\n");
    assert_eq!(frames[2].command, Command::Ack);
    items
}

#[test]
fn one_byte_at_a_time_gives_the_same_items() {
    let expected = expected();
    let got = decode_chunks(STREAM.chunks(1)).unwrap();
    assert_eq!(got, expected);
}

#[test]
fn every_two_way_split_gives_the_same_items() {
    let expected = expected();
    for at in 0..=STREAM.len() {
        let (a, b) = STREAM.split_at(at);
        let got = decode_chunks([a, b]).unwrap();
        assert_eq!(got, expected, "split at {at}");
    }
}

#[test]
fn every_three_way_split_gives_the_same_items() {
    let expected = expected();
    for i in 0..=STREAM.len() {
        for j in i..=STREAM.len() {
            let got = decode_chunks([&STREAM[..i], &STREAM[i..j], &STREAM[j..]]).unwrap();
            assert_eq!(got, expected, "split at {i},{j}");
        }
    }
}

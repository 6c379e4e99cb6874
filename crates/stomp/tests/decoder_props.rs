//! Property tests: encoding then decoding is the identity in every version, and arbitrary
//! bytes never panic the decoder nor make it buffer past the frame limit.

use bytes::{Bytes, BytesMut};
use haven_stomp::{Command, Frame, Item, Limits, StompCodec, Version};
use proptest::prelude::*;
use tokio_util::codec::{Decoder, Encoder};

fn command() -> impl Strategy<Value = Command> {
    prop::sample::select(Command::ALL.to_vec())
}

fn version() -> impl Strategy<Value = Version> {
    prop::sample::select(Version::ALL.to_vec())
}

/// Header text biased toward the bytes escaping cares about, plus some non-ASCII.
fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::char::range('a', 'z'),
            1 => prop::sample::select(vec![':', '\\', '\n', '\r', ' ', 'é', '✓', 'c', 'n', 'r']),
        ],
        0..12,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

/// Whether the encoder is able to carry this header under `version` for `command`
/// (1.0 and handshake frames are unescaped; 1.1 cannot carry a trailing CR).
fn representable(version: Version, command: Command, name: &str, value: &str) -> bool {
    if name == "content-length" {
        return false;
    }
    let escaped = version > Version::V1_0 && !command.is_handshake();
    let trailing_cr_ok = escaped && version == Version::V1_2;
    if !trailing_cr_ok && value.ends_with('\r') {
        return false;
    }
    escaped || !(name.contains('\n') || value.contains('\n') || name.contains(':'))
}

fn frame_for(version: Version) -> impl Strategy<Value = Frame> {
    (
        command(),
        prop::collection::vec((text(), text()), 0..6),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(move |(command, headers, body)| Frame {
            command,
            headers: headers
                .into_iter()
                .filter(|(n, v)| representable(version, command, n, v))
                .collect(),
            body: Bytes::from(body),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn encode_then_decode_is_identity(
        (version, frames) in version().prop_flat_map(|v| {
            (Just(v), prop::collection::vec(frame_for(v), 1..4))
        }),
        chunk in 1usize..40,
    ) {
        let mut codec = StompCodec::new(Limits::default());
        codec.set_version(version);
        let mut wire = BytesMut::new();
        for f in &frames {
            codec.encode(f, &mut wire).unwrap();
            codec.encode(Item::Heartbeat, &mut wire).unwrap();
        }
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for piece in wire.chunks(chunk) {
            buf.extend_from_slice(piece);
            while let Some(item) = codec.decode(&mut buf).unwrap() {
                got.push(item);
            }
        }
        prop_assert!(codec.decode_eof(&mut buf).unwrap().is_none());
        let mut expected = Vec::new();
        for f in &frames {
            let mut f = f.clone();
            if !f.body.is_empty() {
                // The encoder adds it so binary bodies survive.
                f.push_header("content-length", f.body.len().to_string());
            }
            expected.push(Item::Frame(f));
            expected.push(Item::Heartbeat);
        }
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn arbitrary_bytes_never_panic_or_overbuffer(
        version in version(),
        pieces in prop::collection::vec(
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..40),
                prop::sample::select(vec![
                    b"SEND\n".to_vec(), b"CONNECT\r\n".to_vec(), b"MESSAGE\n".to_vec(),
                    b"content-length:".to_vec(), b"content-length:5\n".to_vec(),
                    b"a:b\n".to_vec(), b"k:\\c\\n\\r\\\\\n".to_vec(), b"\n".to_vec(),
                    b"\r\n".to_vec(), b"\0".to_vec(), b"\\".to_vec(), b":".to_vec(),
                    vec![b'x'; 100],
                ]),
            ],
            0..30,
        ),
        chunk in 1usize..64,
    ) {
        let limits = Limits { frame_bytes_max: 256, header_count_max: 4, header_bytes_max: 48 };
        // Bytes that may sit in the buffer beyond the frame limit: a partial CRLF and the
        // like. The decoder guarantees far less than this; the slack is for the test only.
        const SLACK_BYTES: usize = 16;
        let mut codec = StompCodec::new(limits);
        codec.set_version(version);
        let stream: Vec<u8> = pieces.concat();
        let mut buf = BytesMut::new();
        'feed: for piece in stream.chunks(chunk) {
            buf.extend_from_slice(piece);
            loop {
                match codec.decode(&mut buf) {
                    Ok(Some(Item::Frame(f))) => {
                        prop_assert!(f.headers.len() <= limits.header_count_max);
                        prop_assert!(f.body.len() < limits.frame_bytes_max);
                    }
                    Ok(Some(Item::Heartbeat)) => {}
                    Ok(None) => break,
                    // A real server closes the connection here.
                    Err(e) => {
                        prop_assert!(!e.to_string().is_empty());
                        break 'feed;
                    }
                }
            }
            prop_assert!(
                buf.len() <= limits.frame_bytes_max + SLACK_BYTES,
                "buffered {} bytes", buf.len()
            );
        }
        let _ = codec.decode_eof(&mut buf);
    }
}

//! Header escaping (STOMP 1.1 and 1.2).
//!
//! 1.0 has no escaping, so a value cannot hold a newline. 1.1 escapes `\\`, `\n` and `:`
//! (as `\c`); 1.2 adds `\r`, because an EOL may be `\r\n` and a value ending in a raw CR
//! would otherwise lose it. Handshake frames (CONNECT, STOMP, CONNECTED) are never escaped:
//! they travel before a version is agreed.
//!
//! Both directions take a fast path when nothing needs escaping (the common case: header
//! values are usually plain ASCII), so the hot path copies bytes once, into the frame's one
//! header buffer.

use crate::frame::Command;
use crate::version::Version;
use bytes::{BufMut, BytesMut};

/// Which escaping rules apply to one frame's header lines.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Escaping {
    /// STOMP 1.0, or a handshake frame in any version: bytes are taken literally.
    Off,
    V1_1,
    V1_2,
}

impl Escaping {
    pub(crate) fn for_frame(version: Version, command: Command) -> Escaping {
        if command.is_handshake() {
            return Escaping::Off;
        }
        match version {
            Version::V1_0 => Escaping::Off,
            Version::V1_1 => Escaping::V1_1,
            Version::V1_2 => Escaping::V1_2,
        }
    }
}

/// Why a header's wire text could not be unescaped: an unknown escape, or a lone backslash at
/// its end. (Invalid UTF-8 is found before, once per header line.)
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BadEscape;

/// Appends the unescaped text of a header name or value as it was on the wire (`raw`, already
/// checked to be UTF-8) to `out` (the frame's header buffer: no allocation of its own). On
/// error `out` may hold part of it; the caller drops what it appended (`Headers::push_with`).
pub(crate) fn unescape_into(raw: &str, mode: Escaping, out: &mut String) -> Result<(), BadEscape> {
    let mut rest = raw;
    if mode != Escaping::Off {
        while let Some(i) = memchr::memchr(b'\\', rest.as_bytes()) {
            out.push_str(&rest[..i]);
            // A trailing lone backslash is as bad as an unknown escape.
            out.push(match rest.as_bytes().get(i + 1) {
                Some(b'\\') => '\\',
                Some(b'n') => '\n',
                Some(b'c') => ':',
                Some(b'r') if mode == Escaping::V1_2 => '\r',
                _ => return Err(BadEscape),
            });
            // The escape is two ASCII bytes, so this is a character boundary.
            rest = &rest[i + 2..];
        }
    }
    out.push_str(rest);
    Ok(())
}

/// A header that cannot be written under the frame's escaping rules without changing the
/// frame's structure (header injection). Carries a message for the caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Unencodable(pub(crate) &'static str);

/// Which part of a header line is being written: a name may not hold a raw colon.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Part {
    Name,
    Value,
}

fn needs_escape(b: u8, mode: Escaping) -> bool {
    match b {
        b'\\' | b'\n' | b':' => true,
        b'\r' => mode == Escaping::V1_2,
        _ => false,
    }
}

/// How many bytes `escape_into` checks at once.
const ESCAPE_CHUNK_BYTES: usize = 16;

/// Bytes 1.1 escapes (bit 0) and 1.2 escapes (bit 1), by value.
static ESCAPED: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'\\' as usize] = 0b11;
    t[b'\n' as usize] = 0b11;
    t[b':' as usize] = 0b11;
    t[b'\r' as usize] = 0b10;
    t
};

/// Whether any byte of `chunk` needs escaping: one table load per byte, or-ed without an early
/// exit or a branch (four comparisons per byte cost twice the instructions).
fn any_needs_escape(chunk: &[u8], mode: Escaping) -> bool {
    let bit = if mode == Escaping::V1_2 { 0b10 } else { 0b01 };
    chunk
        .iter()
        .fold(0u8, |found, &b| found | ESCAPED[b as usize])
        & bit
        != 0
}

/// Appends `text` to `dst` escaped for `mode`. On error `dst` may hold a partial write;
/// the caller truncates it.
///
/// The usual case — 1.1 or 1.2, nothing to escape or refuse — is inlined into the encoder's
/// loop: as a call, its entry and checks were a third of escaping's instructions in a broker
/// delivering 1 KiB messages (about 30 calls per MESSAGE).
#[inline]
pub(crate) fn escape_into(
    dst: &mut BytesMut,
    text: &str,
    part: Part,
    mode: Escaping,
) -> Result<(), Unencodable> {
    let bytes = text.as_bytes();
    if mode != Escaping::Off
        && (part == Part::Name || mode == Escaping::V1_2 || bytes.last() != Some(&b'\r'))
        && !any_needs_escape(bytes, mode)
    {
        dst.put_slice(bytes);
        return Ok(());
    }
    escape_slow(dst, text, part, mode)
}

/// `escape_into` for every case: refusals, 1.0 and handshakes, and text to escape.
#[inline(never)]
fn escape_slow(
    dst: &mut BytesMut,
    text: &str,
    part: Part,
    mode: Escaping,
) -> Result<(), Unencodable> {
    let bytes = text.as_bytes();
    // The decoder strips one CR before LF in every version, so a value ending in a raw CR
    // would come back without it; only 1.2 can escape it.
    if part == Part::Value && mode != Escaping::V1_2 && bytes.last() == Some(&b'\r') {
        return Err(Unencodable(
            "header value ends with CR, which this version cannot carry",
        ));
    }
    if mode == Escaping::Off {
        if bytes.contains(&b'\n') {
            return Err(Unencodable(
                "header contains a newline, which this version/frame cannot carry",
            ));
        }
        if part == Part::Name && bytes.contains(&b':') {
            return Err(Unencodable(
                "header name contains a colon, which this version/frame cannot carry",
            ));
        }
        dst.put_slice(bytes);
        return Ok(());
    }
    // Plain text took `escape_into`'s inlined way; here something needs escaping. Whole
    // chunks without it are still copied at once (byte at a time, this loop was 5% of a
    // broker delivering 1 KiB messages and 14% of a bridge's thread).
    let mut run_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        // Whole chunks without a byte to escape are skipped at once.
        if let Some(chunk) = bytes.get(i..i + ESCAPE_CHUNK_BYTES) {
            if !any_needs_escape(chunk, mode) {
                i += ESCAPE_CHUNK_BYTES;
                continue;
            }
        }
        let b = bytes[i];
        i += 1;
        if !needs_escape(b, mode) {
            continue;
        }
        dst.put_slice(&bytes[run_start..i - 1]);
        dst.put_slice(match b {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b':' => b"\\c",
            b'\r' => b"\\r",
            _ => unreachable!("needs_escape admitted {b:#x}"),
        });
        run_start = i;
    }
    dst.put_slice(&bytes[run_start..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unescape(raw: &[u8], mode: Escaping) -> Result<String, BadEscape> {
        let mut out = String::new();
        unescape_into(std::str::from_utf8(raw).unwrap(), mode, &mut out).map(|()| out)
    }

    fn esc(text: &str, part: Part, mode: Escaping) -> Result<String, Unencodable> {
        let mut dst = BytesMut::new();
        escape_into(&mut dst, text, part, mode)?;
        Ok(String::from_utf8(dst.to_vec()).unwrap())
    }

    /// The chunked scan finds a byte to escape wherever it is: before, inside, across and
    /// after whole chunks, alone or next to others.
    #[test]
    fn escaping_matches_a_byte_at_a_time_reference_at_every_position() {
        fn reference(text: &str, mode: Escaping) -> String {
            let mut out = String::new();
            for c in text.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    ':' => out.push_str("\\c"),
                    '\r' if mode == Escaping::V1_2 => out.push_str("\\r"),
                    c => out.push(c),
                }
            }
            out
        }
        for mode in [Escaping::V1_1, Escaping::V1_2] {
            for len in 0..(3 * ESCAPE_CHUNK_BYTES + 2) {
                for at in 0..len {
                    for special in ['\\', '\n', ':', '\r'] {
                        if special == '\r' && (mode == Escaping::V1_1 || at == len - 1) {
                            continue; // 1.1 passes a CR inside a value, refuses one at the end
                        }
                        let mut text: Vec<char> =
                            "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                .chars()
                                .take(len)
                                .collect();
                        text[at] = special;
                        if at + 1 < len {
                            text[at + 1] = ':'; // two in a row
                        }
                        let text: String = text.into_iter().collect();
                        let got = esc(&text, Part::Value, mode).unwrap();
                        assert_eq!(got, reference(&text, mode), "{text:?} in {mode:?}");
                    }
                }
            }
        }
    }

    /// The inlined fast path of `escape_into` gives what the general path gives, including
    /// its refusals, for plain text and for every kind of text it must not take.
    #[test]
    fn the_fast_path_agrees_with_the_general_one() {
        let texts = [
            "",
            "a",
            "destination",
            "/queue/a.b",
            "ID:haven-7",
            "x\\y",
            "a\nb",
            "ends\r",
            "mid\rdle",
            "\r",
            ":",
            "name:",
            "ünïcödé",
            "0123456789abcdef0123456789abcdef",
        ];
        let slow = |text: &str, part: Part, mode: Escaping| {
            let mut dst = BytesMut::new();
            escape_slow(&mut dst, text, part, mode)
                .map(|()| String::from_utf8(dst.to_vec()).unwrap())
        };
        for mode in [Escaping::Off, Escaping::V1_1, Escaping::V1_2] {
            for part in [Part::Name, Part::Value] {
                for text in texts {
                    assert_eq!(
                        esc(text, part, mode),
                        slow(text, part, mode),
                        "{text:?} as {part:?} in {mode:?}"
                    );
                }
            }
        }
        // The cases the fast path is for, and the ones it must leave alone.
        assert_eq!(
            esc("/queue/a.b", Part::Value, Escaping::V1_2).as_deref(),
            Ok("/queue/a.b")
        );
        assert_eq!(
            esc("mid\rdle", Part::Value, Escaping::V1_1).as_deref(),
            Ok("mid\rdle")
        );
        assert!(esc("ends\r", Part::Value, Escaping::V1_1).is_err());
        assert_eq!(
            esc("ends\r", Part::Value, Escaping::V1_2).as_deref(),
            Ok("ends\\r")
        );
        assert_eq!(
            esc("ID:haven-7", Part::Value, Escaping::V1_2).as_deref(),
            Ok("ID\\chaven-7")
        );
    }

    #[test]
    fn escapes_round_trip_in_each_version() {
        let nasty = "a\\b\nc:d\re";
        for mode in [Escaping::V1_1, Escaping::V1_2] {
            for part in [Part::Name, Part::Value] {
                let wire = esc(nasty, part, mode).unwrap();
                assert!(!wire.contains('\n') && !wire.contains(':'));
                assert_eq!(unescape(wire.as_bytes(), mode).unwrap(), nasty);
            }
        }
        assert_eq!(
            esc(nasty, Part::Value, Escaping::V1_1).unwrap(),
            "a\\\\b\\nc\\cd\re"
        );
        assert_eq!(
            esc(nasty, Part::Value, Escaping::V1_2).unwrap(),
            "a\\\\b\\nc\\cd\\re"
        );
        // 1.0 is literal: colons in values are fine, backslashes mean nothing.
        let plain = "tcp://h:1\\x";
        assert_eq!(esc(plain, Part::Value, Escaping::Off).unwrap(), plain);
        assert_eq!(unescape(plain.as_bytes(), Escaping::Off).unwrap(), plain);
    }

    #[test]
    fn unknown_escapes_are_rejected() {
        for mode in [Escaping::V1_1, Escaping::V1_2] {
            assert_eq!(unescape(b"a\\tb", mode), Err(BadEscape));
            assert_eq!(unescape(b"trailing\\", mode), Err(BadEscape));
        }
        // \r is a 1.2 addition.
        assert_eq!(unescape(b"\\r", Escaping::V1_1), Err(BadEscape));
        assert_eq!(unescape(b"\\r", Escaping::V1_2).unwrap(), "\r");
    }

    #[test]
    fn structure_breaking_headers_are_refused_not_written() {
        assert!(esc("a\nb", Part::Value, Escaping::Off).is_err());
        assert!(esc("a:b", Part::Name, Escaping::Off).is_err());
        assert!(esc("ab\r", Part::Value, Escaping::Off).is_err());
        assert!(esc("ab\r", Part::Value, Escaping::V1_1).is_err());
        assert!(esc("ab\r", Part::Value, Escaping::V1_2).is_ok());
        assert!(esc("a\rb", Part::Value, Escaping::V1_1).is_ok());
    }

    #[test]
    fn handshake_frames_are_never_escaped() {
        for v in Version::ALL {
            assert_eq!(Escaping::for_frame(v, Command::Connect), Escaping::Off);
            assert_eq!(Escaping::for_frame(v, Command::Stomp), Escaping::Off);
            assert_eq!(Escaping::for_frame(v, Command::Connected), Escaping::Off);
        }
        assert_eq!(
            Escaping::for_frame(Version::V1_0, Command::Send),
            Escaping::Off
        );
        assert_eq!(
            Escaping::for_frame(Version::V1_1, Command::Send),
            Escaping::V1_1
        );
        assert_eq!(
            Escaping::for_frame(Version::V1_2, Command::Send),
            Escaping::V1_2
        );
    }
}

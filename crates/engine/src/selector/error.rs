//! Why a selector was rejected, and where: the error carries the selector text and a caret
//! line so that the ERROR frame a client receives shows the failing character.

use std::iter;

/// A selector that cannot be parsed. Built only by the selector module, always with a
/// `position` inside (or just past the end of) `text`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid selector at position {position}: {message}\n{text}\n{caret}")]
pub struct SelectorError {
    /// 0-based offset, in characters (not bytes), of the character where parsing failed; equal
    /// to the number of characters in `text` when the selector ended too early.
    pub position: usize,
    /// What was wrong, in words meant for the client.
    pub message: String,
    /// The selector as given, with line breaks shown as spaces so that `caret` lines up under
    /// it. For a selector over the length limit, only the part within the limit.
    pub text: String,
    /// Spaces (tabs where `text` has tabs) up to `position`, then `^`.
    pub caret: String,
}

impl SelectorError {
    /// An error at byte offset `byte_pos` of `text`.
    pub(crate) fn at(text: &str, byte_pos: usize, message: impl Into<String>) -> SelectorError {
        assert!(
            byte_pos <= text.len() && text.is_char_boundary(byte_pos),
            "selector error position {byte_pos} is not a character boundary of the text"
        );
        let before = &text[..byte_pos];
        let caret: String = before
            .chars()
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .chain(iter::once('^'))
            .collect();
        let shown: String = text
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
            .collect();
        SelectorError {
            position: before.chars().count(),
            message: message.into(),
            text: shown,
            caret,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caret_points_at_the_failing_character() {
        let e = SelectorError::at("a = 'x", 4, "unterminated string literal");
        assert_eq!(e.position, 4);
        assert_eq!(e.caret, "    ^");
        assert_eq!(
            e.to_string(),
            "invalid selector at position 4: unterminated string literal\na = 'x\n    ^"
        );
    }

    #[test]
    fn position_counts_characters_not_bytes() {
        let text = "é = 1 +";
        let e = SelectorError::at(text, text.len(), "x");
        assert_eq!(e.position, 7);
        assert_eq!(e.caret.chars().count(), 8);
    }

    #[test]
    fn line_breaks_and_tabs_keep_the_caret_aligned() {
        let e = SelectorError::at("a\t=\n1 +", 7, "x");
        assert_eq!(e.text, "a\t= 1 +");
        assert_eq!(e.caret, " \t     ^");
    }
}

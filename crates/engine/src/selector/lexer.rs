//! Splits selector text into tokens. Keywords are case-insensitive; identifiers are not
//! (`JMSType` and `jmstype` are different headers), as in JMS.

use super::error::SelectorError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kw {
    And,
    Or,
    Not,
    Like,
    Escape,
    In,
    Between,
    Is,
    Null,
    True,
    False,
}

impl Kw {
    const ALL: [(Kw, &'static str); 11] = [
        (Kw::And, "AND"),
        (Kw::Or, "OR"),
        (Kw::Not, "NOT"),
        (Kw::Like, "LIKE"),
        (Kw::Escape, "ESCAPE"),
        (Kw::In, "IN"),
        (Kw::Between, "BETWEEN"),
        (Kw::Is, "IS"),
        (Kw::Null, "NULL"),
        (Kw::True, "TRUE"),
        (Kw::False, "FALSE"),
    ];

    fn from_word(word: &str) -> Option<Kw> {
        Kw::ALL
            .iter()
            .find(|(_, name)| name.eq_ignore_ascii_case(word))
            .map(|(kw, _)| *kw)
    }

    pub(crate) fn name(self) -> &'static str {
        Kw::ALL
            .iter()
            .find(|(kw, _)| *kw == self)
            .map(|(_, name)| *name)
            .expect("every keyword is in Kw::ALL")
    }
}

/// The largest integer literal magnitude: `2^63`, allowed only right after a unary minus.
pub(crate) const LONG_MAGNITUDE_MAX: u64 = 1 << 63;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    Str(String),
    /// An integer literal's magnitude, at most [`LONG_MAGNITUDE_MAX`].
    Long(u64),
    /// A finite approximate literal.
    Double(f64),
    Kw(Kw),
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Plus,
    Minus,
    Star,
    Slash,
    LParen,
    RParen,
    Comma,
    Eof,
}

impl Tok {
    /// How an error message names this token.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier `{s}`"),
            Tok::Str(s) => format!("string '{}'", s.replace('\'', "''")),
            Tok::Long(v) => format!("number {v}"),
            Tok::Double(d) => format!("number {d}"),
            Tok::Kw(k) => format!("keyword {}", k.name()),
            Tok::Eq => "'='".into(),
            Tok::Ne => "'<>'".into(),
            Tok::Lt => "'<'".into(),
            Tok::Le => "'<='".into(),
            Tok::Gt => "'>'".into(),
            Tok::Ge => "'>='".into(),
            Tok::Plus => "'+'".into(),
            Tok::Minus => "'-'".into(),
            Tok::Star => "'*'".into(),
            Tok::Slash => "'/'".into(),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::Comma => "','".into(),
            Tok::Eof => "end of selector".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    /// Byte offset of the token's first character in the selector text.
    pub(crate) start: usize,
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_' || c == '$'
}

fn is_ident_continue(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '$'
}

/// The tokens of `text`, ending with one `Eof` whose start is `text.len()`.
pub(crate) fn tokenize(text: &str) -> Result<Vec<Token>, SelectorError> {
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(c) = text[i..].chars().next() {
        let start = i;
        let next = text[i + c.len_utf8()..].chars().next();
        if c.is_whitespace() {
            i += c.len_utf8();
            continue;
        }
        let (tok, len) = match c {
            '\'' => {
                let (s, len) = lex_string(text, start)?;
                (Tok::Str(s), len)
            }
            '0'..='9' => lex_number(text, start)?,
            '.' if next.is_some_and(|n| n.is_ascii_digit()) => lex_number(text, start)?,
            c if is_ident_start(c) => {
                let len = text[start..]
                    .find(|c: char| !is_ident_continue(c))
                    .unwrap_or(text.len() - start);
                let word = &text[start..start + len];
                let tok = match Kw::from_word(word) {
                    Some(kw) => Tok::Kw(kw),
                    None => Tok::Ident(word.to_string()),
                };
                (tok, len)
            }
            '=' => (Tok::Eq, 1),
            '<' if next == Some('>') => (Tok::Ne, 2),
            '<' if next == Some('=') => (Tok::Le, 2),
            '<' => (Tok::Lt, 1),
            '>' if next == Some('=') => (Tok::Ge, 2),
            '>' => (Tok::Gt, 1),
            '+' => (Tok::Plus, 1),
            '-' => (Tok::Minus, 1),
            '*' => (Tok::Star, 1),
            '/' => (Tok::Slash, 1),
            '(' => (Tok::LParen, 1),
            ')' => (Tok::RParen, 1),
            ',' => (Tok::Comma, 1),
            '!' if next == Some('=') => {
                return Err(SelectorError::at(text, start, "use <> for 'not equal'"));
            }
            '"' => {
                return Err(SelectorError::at(
                    text,
                    start,
                    "strings are written in single quotes ('like this')",
                ));
            }
            c => {
                return Err(SelectorError::at(
                    text,
                    start,
                    format!("unexpected character {c:?}"),
                ));
            }
        };
        assert!(len > 0, "a token is never empty");
        tokens.push(Token { tok, start });
        i = start + len;
    }
    tokens.push(Token {
        tok: Tok::Eof,
        start: text.len(),
    });
    Ok(tokens)
}

/// A string literal starting with the quote at `start`: its value (`''` is one quote) and its
/// length in bytes including both quotes.
fn lex_string(text: &str, start: usize) -> Result<(String, usize), SelectorError> {
    let mut value = String::new();
    let mut i = start + 1;
    loop {
        let Some(q) = text[i..].find('\'') else {
            return Err(SelectorError::at(
                text,
                start,
                "unterminated string literal",
            ));
        };
        value.push_str(&text[i..i + q]);
        i += q + 1;
        if text[i..].starts_with('\'') {
            value.push('\'');
            i += 1;
        } else {
            return Ok((value, i - start));
        }
    }
}

/// A numeric literal at `start`: `digits[.digits][e[+-]digits]` or `.digits[e...]`. It has a
/// `.` or an exponent → double, else long.
fn lex_number(text: &str, start: usize) -> Result<(Tok, usize), SelectorError> {
    let b = text.as_bytes();
    let digits_from = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut i = digits_from(start);
    let mut double = false;
    if i < b.len() && b[i] == b'.' {
        double = true;
        i = digits_from(i + 1);
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if j < b.len() && b[j].is_ascii_digit() {
            double = true;
            i = digits_from(j);
        }
    }
    if let Some(c) = text[i..].chars().next() {
        if is_ident_continue(c) || c == '.' {
            return Err(SelectorError::at(text, start, "malformed number"));
        }
    }
    let literal = &text[start..i];
    let tok = if double {
        match literal.parse::<f64>() {
            Ok(d) if d.is_finite() => Tok::Double(d),
            _ => {
                return Err(SelectorError::at(
                    text,
                    start,
                    "number out of the range of a double",
                ))
            }
        }
    } else {
        match literal.parse::<u64>() {
            Ok(v) if v <= LONG_MAGNITUDE_MAX => Tok::Long(v),
            _ => {
                return Err(SelectorError::at(
                    text,
                    start,
                    "integer out of the range of a 64-bit long",
                ))
            }
        }
    };
    Ok((tok, i - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(text: &str) -> Vec<Tok> {
        tokenize(text).unwrap().into_iter().map(|t| t.tok).collect()
    }

    fn err_at(text: &str) -> (usize, String) {
        let e = tokenize(text).unwrap_err();
        (e.position, e.message)
    }

    #[test]
    fn keywords_are_case_insensitive_identifiers_are_not() {
        assert_eq!(
            toks("a and B Or nOt"),
            vec![
                Tok::Ident("a".into()),
                Tok::Kw(Kw::And),
                Tok::Ident("B".into()),
                Tok::Kw(Kw::Or),
                Tok::Kw(Kw::Not),
                Tok::Eof
            ]
        );
        assert_eq!(toks("$x_1"), vec![Tok::Ident("$x_1".into()), Tok::Eof]);
        assert_eq!(toks("andy"), vec![Tok::Ident("andy".into()), Tok::Eof]);
    }

    #[test]
    fn strings_double_their_quotes() {
        assert_eq!(toks("'it''s'"), vec![Tok::Str("it's".into()), Tok::Eof]);
        assert_eq!(toks("''"), vec![Tok::Str("".into()), Tok::Eof]);
        assert_eq!(toks("''''"), vec![Tok::Str("'".into()), Tok::Eof]);
    }

    #[test]
    fn numbers_are_exact_or_approximate() {
        assert_eq!(toks("57"), vec![Tok::Long(57), Tok::Eof]);
        assert_eq!(toks("1.5"), vec![Tok::Double(1.5), Tok::Eof]);
        assert_eq!(toks("1e3"), vec![Tok::Double(1000.0), Tok::Eof]);
        assert_eq!(toks("7."), vec![Tok::Double(7.0), Tok::Eof]);
        assert_eq!(toks(".5"), vec![Tok::Double(0.5), Tok::Eof]);
        assert_eq!(
            toks("-57.9E2"),
            vec![Tok::Minus, Tok::Double(5790.0), Tok::Eof]
        );
        assert_eq!(
            toks("9223372036854775808"),
            vec![Tok::Long(LONG_MAGNITUDE_MAX), Tok::Eof]
        );
    }

    #[test]
    fn operators() {
        assert_eq!(
            toks("=<><<=>>=+-*/(),"),
            vec![
                Tok::Eq,
                Tok::Ne,
                Tok::Lt,
                Tok::Le,
                Tok::Gt,
                Tok::Ge,
                Tok::Plus,
                Tok::Minus,
                Tok::Star,
                Tok::Slash,
                Tok::LParen,
                Tok::RParen,
                Tok::Comma,
                Tok::Eof
            ]
        );
    }

    #[test]
    fn unterminated_string_is_reported_at_its_opening_quote() {
        assert_eq!(err_at("a = 'x").0, 4);
        assert_eq!(err_at("a = 'x''").0, 4);
    }

    #[test]
    fn bad_characters_and_numbers_are_reported_where_they_start() {
        assert_eq!(err_at("a # 1"), (2, "unexpected character '#'".into()));
        assert_eq!(err_at("a != 1"), (2, "use <> for 'not equal'".into()));
        assert_eq!(err_at("a = \"x\"").0, 4);
        assert_eq!(err_at("a = 1abc").0, 4);
        assert_eq!(err_at("a = 1.2.3").0, 4);
        assert_eq!(err_at("a = 1e").0, 4);
        assert_eq!(err_at("a = 1e999").0, 4);
        assert_eq!(err_at("a = 9223372036854775809").0, 4);
        assert_eq!(err_at("a = .").0, 4);
    }
}

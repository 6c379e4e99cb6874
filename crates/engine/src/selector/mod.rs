//! JMS message selectors (the `selector` header of SUBSCRIBE): parsing, once per
//! subscription, into a compiled [`Selector`], and evaluating it against each message.
//!
//! The language is the SQL-92 subset JMS defines, as ActiveMQ accepts it over STOMP:
//!
//! * literals: strings `'it''s'`, exact numbers `42` (64-bit long), approximate numbers `1.5`,
//!   `1e3`, `.5` (double), `TRUE`, `FALSE`;
//! * identifiers: JMS fields (`JMSPriority`, `JMSType`, ... — see [`message_lookup`]) and
//!   message headers; case-sensitive. Keywords are case-insensitive;
//! * `=` `<>` `<` `>` `<=` `>=`, `AND` `OR` `NOT`, `+ - * /`, unary `-`/`+`, parentheses;
//! * `x [NOT] LIKE 'pat' [ESCAPE 'c']` (`%` any run, `_` one character),
//!   `x [NOT] IN ('a', 'b', 3)`, `x [NOT] BETWEEN a AND b`, `x IS [NOT] NULL`.
//!
//! Evaluation uses SQL three-valued logic: a missing header is NULL, a condition on NULL is
//! UNKNOWN, and only TRUE selects a message (details in `eval.rs`). Because STOMP headers are
//! strings, a header that is a number or a boolean is converted where the selector needs one,
//! as ActiveMQ does for STOMP: `price > 10` works on the header `price:12.5`, and `price > 10`
//! on `price:cheap` is UNKNOWN (details in `value.rs`). Division by zero is UNKNOWN.
//!
//! The design choice is to do all the work that does not depend on the message at parse time:
//! syntax, the types that can never work (`'a' + 1`), `LIKE` patterns compiled to a matcher
//! that cannot backtrack exponentially, and limits — [`SelectorLimits`] bounds the text length
//! and the nesting depth, so a hostile selector gets an error, never a stack overflow or a slow
//! broker. Every parse error says where the text stopped making sense ([`SelectorError`]).

mod ast;
mod error;
mod eval;
mod lexer;
mod like;
mod lookup;
mod parser;
mod value;

#[cfg(test)]
mod tests;

pub use error::SelectorError;
pub use lookup::message_lookup;
pub use value::Value;

use std::fmt;
use std::sync::Arc;

/// Longest selector accepted by default, in bytes.
pub const SELECTOR_BYTES_MAX: usize = 4096;
/// Deepest nesting accepted by default: parentheses, `NOT`s and unary signs inside each other,
/// and the height of the expression tree (so also the length of an arithmetic chain
/// `a + b + c ...`; `AND`/`OR` chains of any length count as one level).
pub const SELECTOR_NESTING_DEPTH_MAX: usize = 64;

/// Bounds on what [`Selector::parse_with_limits`] accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelectorLimits {
    pub selector_bytes_max: usize,
    pub nesting_depth_max: usize,
}

impl Default for SelectorLimits {
    fn default() -> Self {
        SelectorLimits {
            selector_bytes_max: SELECTOR_BYTES_MAX,
            nesting_depth_max: SELECTOR_NESTING_DEPTH_MAX,
        }
    }
}

/// A compiled selector. Cloning is cheap (shared), and evaluation allocates only for the
/// values the lookup returns (and for `LIKE`, the matched header's characters).
#[derive(Clone)]
pub struct Selector {
    text: Arc<str>,
    root: Arc<ast::Expr>,
}

impl Selector {
    /// Parses a JMS message selector with the default [`SelectorLimits`]. Empty or
    /// whitespace-only text is an error: the caller treats an absent or empty `selector`
    /// header as "no selector" before calling this.
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        Selector::parse_with_limits(text, SelectorLimits::default())
    }

    pub fn parse_with_limits(
        text: &str,
        limits: SelectorLimits,
    ) -> Result<Selector, SelectorError> {
        if text.len() > limits.selector_bytes_max {
            let mut cut = limits.selector_bytes_max;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            return Err(SelectorError::at(
                &text[..cut],
                cut,
                format!(
                    "selector is {} bytes long, more than the limit of {} bytes",
                    text.len(),
                    limits.selector_bytes_max
                ),
            ));
        }
        if text.trim().is_empty() {
            return Err(SelectorError::at(text, 0, "empty selector"));
        }
        let tokens = lexer::tokenize(text)?;
        let root = parser::Parser::new(text, tokens, limits.nesting_depth_max).parse_selector()?;
        Ok(Selector {
            text: text.into(),
            root: Arc::new(root),
        })
    }

    /// Whether the message `lookup` describes is selected: only TRUE selects, FALSE and
    /// UNKNOWN do not. `lookup` maps an identifier to its value, `None` when absent.
    pub fn matches(&self, lookup: &dyn Fn(&str) -> Option<Value>) -> bool {
        eval::truth(&self.root, lookup) == Some(true)
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Selector").field(&&*self.text).finish()
    }
}

//! Values a selector computes with, and the conversions between them.
//!
//! STOMP header values are always strings, so a selector written for JMS (`price > 10`) would
//! never match a STOMP message under the strict JMS rule (string compared with number is
//! UNKNOWN). ActiveMQ therefore converts STOMP header strings, and so does Haven, with one
//! rule: **wherever a number is expected, a string that is a number is that number**, and a
//! string that is not a number makes the result UNKNOWN. Numbers are expected by arithmetic,
//! unary `+`/`-`, the ordering operators `<` `>` `<=` `>=`, `BETWEEN`, and `=`/`<>`/`IN` when
//! the other side is a number. A string is a number when it is a decimal literal with an
//! optional sign (`42`, `-7`, `+3`, `1.5`, `.5`, `2.`, `1e3`, `-2.5E-3`; no spaces, no hex, no
//! `NaN`/`Infinity`): an integer that fits in 64 bits is a long, anything else a double.
//! Likewise, where a boolean is expected (`AND`, `OR`, `NOT`, the whole selector, `=` with
//! `TRUE`/`FALSE`), the strings `true` and `false` in any case are booleans and other strings
//! are UNKNOWN. Two strings compared with `=`/`<>` are compared as strings (`'1.0' = '1'` is
//! FALSE).
//!
//! Doubles are always finite inside the evaluator: a non-finite double from a lookup, and a
//! non-finite arithmetic result, are UNKNOWN.

use std::borrow::Cow;
use std::cmp::Ordering;

/// A value a message lookup returns for an identifier.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Long(i64),
    Double(f64),
    Bool(bool),
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Long(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Double(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

/// A number; a `Double` is always finite.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Num {
    Long(i64),
    Double(f64),
}

impl Num {
    pub(crate) fn double(d: f64) -> Option<Num> {
        d.is_finite().then_some(Num::Double(d))
    }

    pub(crate) fn as_f64(self) -> f64 {
        match self {
            Num::Long(v) => v as f64,
            Num::Double(d) => d,
        }
    }

    /// Long with long compares exactly; otherwise both are promoted to double, as Java does.
    pub(crate) fn compare(self, other: Num) -> Ordering {
        match (self, other) {
            (Num::Long(a), Num::Long(b)) => a.cmp(&b),
            (a, b) => {
                let (a, b) = (a.as_f64(), b.as_f64());
                a.partial_cmp(&b)
                    .expect("doubles in the evaluator are finite, so always ordered")
            }
        }
    }
}

/// A value during evaluation. Literals are borrowed from the compiled selector, so
/// evaluating `JMSType = 'order'` copies no string. NULL/UNKNOWN is `None` around it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val<'a> {
    Str(Cow<'a, str>),
    Num(Num),
    Bool(bool),
}

impl Val<'_> {
    /// A lookup result; a non-finite double is UNKNOWN.
    pub(crate) fn from_value(v: Value) -> Option<Val<'static>> {
        Some(match v {
            Value::Str(s) => Val::Str(Cow::Owned(s)),
            Value::Long(v) => Val::Num(Num::Long(v)),
            Value::Double(d) => Val::Num(Num::double(d)?),
            Value::Bool(b) => Val::Bool(b),
        })
    }

    /// This value where a number is expected (see the module comment).
    pub(crate) fn to_num(&self) -> Option<Num> {
        match self {
            Val::Num(n) => Some(*n),
            Val::Str(s) => parse_number(s),
            Val::Bool(_) => None,
        }
    }

    /// This value where a boolean is expected (see the module comment).
    pub(crate) fn to_bool(&self) -> Option<bool> {
        match self {
            Val::Bool(b) => Some(*b),
            Val::Str(s) => parse_bool(s),
            Val::Num(_) => None,
        }
    }
}

/// `true`/`false` in any case.
pub(crate) fn parse_bool(s: &str) -> Option<bool> {
    if s.eq_ignore_ascii_case("true") {
        Some(true)
    } else if s.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// A string that is a decimal number (see the module comment), else `None`.
pub(crate) fn parse_number(s: &str) -> Option<Num> {
    let numeric_chars = s
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E'));
    if s.is_empty() || !numeric_chars {
        return None;
    }
    if let Ok(v) = s.parse::<i64>() {
        return Some(Num::Long(v));
    }
    Num::double(s.parse::<f64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_strings_convert_to_numbers() {
        assert_eq!(parse_number("42"), Some(Num::Long(42)));
        assert_eq!(parse_number("-7"), Some(Num::Long(-7)));
        assert_eq!(parse_number("+3"), Some(Num::Long(3)));
        assert_eq!(parse_number("1.5"), Some(Num::Double(1.5)));
        assert_eq!(parse_number(".5"), Some(Num::Double(0.5)));
        assert_eq!(parse_number("2."), Some(Num::Double(2.0)));
        assert_eq!(parse_number("1e3"), Some(Num::Double(1000.0)));
        assert_eq!(parse_number("-2.5E-3"), Some(Num::Double(-0.0025)));
        assert_eq!(
            parse_number("9223372036854775808"),
            Some(Num::Double(9223372036854775808.0))
        );
    }

    #[test]
    fn other_strings_are_not_numbers() {
        for s in [
            "", " 1", "1 ", "abc", "0x10", "NaN", "inf", "Infinity", "1e999", "1e", "e5", ".",
            "+-1", "1_000", "--1",
        ] {
            assert_eq!(parse_number(s), None, "{s:?}");
        }
    }

    #[test]
    fn booleans_are_case_insensitive_true_and_false_only() {
        assert_eq!(parse_bool("TRUE"), Some(true));
        assert_eq!(parse_bool("False"), Some(false));
        assert_eq!(parse_bool("yes"), None);
        assert_eq!(parse_bool("1"), None);
    }

    #[test]
    fn long_and_double_compare_by_promotion() {
        assert_eq!(Num::Long(1).compare(Num::Double(1.0)), Ordering::Equal);
        assert_eq!(Num::Long(2).compare(Num::Double(1.5)), Ordering::Greater);
        assert_eq!(
            Num::Long(i64::MAX).compare(Num::Long(i64::MIN)),
            Ordering::Greater
        );
    }

    #[test]
    fn non_finite_lookup_doubles_are_unknown() {
        assert_eq!(Val::from_value(Value::Double(f64::NAN)), None);
        assert_eq!(Val::from_value(Value::Double(f64::INFINITY)), None);
    }
}

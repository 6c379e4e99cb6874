//! Selector conformance: table-driven evaluation (with NULL semantics) and parse errors with
//! their positions.

use super::eval::truth;
use super::*;

const T: Option<bool> = Some(true);
const F: Option<bool> = Some(false);
const U: Option<bool> = None;

/// Headers every row is evaluated against. `s*` are strings as STOMP delivers them.
fn headers(name: &str) -> Option<Value> {
    Some(match name {
        "long" => Value::Long(10),
        "dbl" => Value::Double(2.5),
        "yes" => Value::Bool(true),
        "no" => Value::Bool(false),
        "str" => Value::Str("abc".into()),
        "snum" => Value::Str("42".into()),
        "sdbl" => Value::Str("1.5".into()),
        "strue" => Value::Str("TRUE".into()),
        "empty" => Value::Str("".into()),
        "quote" => Value::Str("it's".into()),
        "pct" => Value::Str("100%".into()),
        "max" => Value::Long(i64::MAX),
        "nan" => Value::Double(f64::NAN),
        _ => return None,
    })
}

fn eval3(text: &str) -> Option<bool> {
    let s = Selector::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"));
    let t = truth(&s.root, &headers);
    assert_eq!(s.matches(&headers), t == Some(true), "{text}");
    t
}

fn check(table: &[(&str, Option<bool>)]) {
    for (text, expected) in table {
        assert_eq!(eval3(text), *expected, "{text}");
    }
}

#[test]
fn literals_and_comparisons() {
    check(&[
        ("TRUE", T),
        ("FALSE", F),
        ("true", T),
        ("1 = 1", T),
        ("1 <> 1", F),
        ("1 < 2", T),
        ("2 <= 2", T),
        ("3 > 2", T),
        ("2 >= 3", F),
        ("'a' = 'a'", T),
        ("'a' <> 'b'", T),
        ("'it''s' = quote", T),
        ("1 = 1.0", T),
        ("1.5 > 1", T),
        ("1e3 = 1000", T),
        (".5 = 0.5", T),
        ("-9223372036854775808 < 0", T),
        ("9223372036854775807 > 0", T),
        ("TRUE = TRUE", T),
        ("TRUE <> FALSE", T),
        ("(1 = 1) = TRUE", T),
    ]);
}

#[test]
fn identifiers_of_each_type() {
    check(&[
        ("long = 10", T),
        ("long > 9.5", T),
        ("dbl = 2.5", T),
        ("dbl < long", T),
        ("yes", T),
        ("no", F),
        ("yes = TRUE", T),
        ("str = 'abc'", T),
        ("str <> 'abd'", T),
        ("nan = 1", U),
        ("nan IS NULL", T),
    ]);
}

#[test]
fn stomp_string_headers_convert_where_a_number_or_boolean_is_needed() {
    check(&[
        ("snum = 42", T),
        ("snum = 42.0", T),
        ("snum > 41", T),
        ("snum + 1 = 43", T),
        ("-snum = -42", T),
        ("+snum = 42", T),
        ("sdbl < 2", T),
        ("snum BETWEEN 40 AND 50", T),
        ("snum IN (41, 42)", T),
        ("snum = '42'", T),
        ("snum = '42.0'", F),
        ("str = 1", U),
        ("str > 1", U),
        ("str + 1 = 2", U),
        ("str IN (1, 2)", U),
        ("str IN (1, 'abc')", T),
        ("empty = 0", U),
        ("strue", T),
        ("strue = TRUE", T),
        ("str", U),
        ("str = TRUE", U),
        ("str < snum", U),
        ("snum > sdbl", T),
    ]);
}

#[test]
fn incompatible_types_compare_as_unknown() {
    check(&[
        ("yes = 1", U),
        ("yes < 1", U),
        ("long = 'x'", U),
        ("long LIKE '1%'", U),
        ("long", U),
        ("NOT long", U),
    ]);
}

#[test]
fn arithmetic_promotes_and_follows_java() {
    check(&[
        ("1 + 2 * 3 = 7", T),
        ("(1 + 2) * 3 = 9", T),
        ("10 - 2 - 3 = 5", T),
        ("7 / 2 = 3", T),
        ("-7 / 2 = -3", T),
        ("7 / 2.0 = 3.5", T),
        ("long / 4 = 2", T),
        ("long * dbl = 25", T),
        ("- long = -10", T),
        ("- -long = 10", T),
        ("+long = 10", T),
        ("2 * -3 = -6", T),
        ("1 - -1 = 2", T),
    ]);
}

#[test]
fn division_by_zero_and_overflow_are_unknown() {
    check(&[
        ("1 / 0 = 0", U),
        ("NOT (1 / 0 = 0)", U),
        ("1.0 / 0 > 0", U),
        ("1 / 0.0 > 0", U),
        ("long / (long - 10) IS NULL", T),
        ("max + 1 > 0", U),
        ("max * 2 > 0", U),
        ("-9223372036854775808 / -1 > 0", U),
        ("-(-9223372036854775808) > 0", U),
        ("1e308 * 10 > 0", U),
    ]);
}

#[test]
fn missing_headers_are_null_and_propagate_as_unknown() {
    check(&[
        ("missing = 1", U),
        ("missing <> 1", U),
        ("missing = 'x'", U),
        ("missing + 1 = 1", U),
        ("-missing = 1", U),
        ("missing", U),
        ("NOT missing", U),
        ("NOT (missing = 1)", U),
        ("missing IS NULL", T),
        ("missing IS NOT NULL", F),
        ("long IS NULL", F),
        ("long IS NOT NULL", T),
        ("(missing + 1) IS NULL", T),
        ("(missing = 1) IS NULL", T),
        ("missing LIKE 'a%'", U),
        ("missing NOT LIKE 'a%'", U),
        ("missing IN ('a')", U),
        ("missing NOT IN ('a')", U),
        ("missing BETWEEN 1 AND 2", U),
        ("missing NOT BETWEEN 1 AND 2", U),
        ("5 BETWEEN missing AND 2", F),
        ("1 BETWEEN missing AND 2", U),
        ("1 NOT BETWEEN missing AND 2", U),
        ("5 NOT BETWEEN missing AND 2", T),
    ]);
}

#[test]
fn three_valued_and_or_not() {
    check(&[
        ("TRUE AND TRUE", T),
        ("TRUE AND FALSE", F),
        ("TRUE AND missing", U),
        ("FALSE AND missing", F),
        ("missing AND FALSE", F),
        ("missing AND missing", U),
        ("TRUE OR missing", T),
        ("missing OR TRUE", T),
        ("FALSE OR missing", U),
        ("FALSE OR FALSE", F),
        ("missing OR missing", U),
        ("NOT TRUE", F),
        ("NOT FALSE", T),
        ("NOT NOT TRUE", T),
        ("FALSE OR FALSE OR missing OR TRUE", T),
        ("TRUE AND TRUE AND missing AND FALSE", F),
    ]);
}

#[test]
fn precedence_is_sql() {
    check(&[
        ("NOT 1 = 2", T),
        ("TRUE OR TRUE AND FALSE", T),
        ("(TRUE OR TRUE) AND FALSE", F),
        ("NOT FALSE AND FALSE", F),
        ("NOT (FALSE AND FALSE)", T),
        ("1 BETWEEN 0 AND 2 AND 2 = 2", T),
        ("1 + 1 BETWEEN 2 AND 2", T),
    ]);
}

#[test]
fn like_with_wildcards_and_escape() {
    check(&[
        ("str LIKE 'a%'", T),
        ("str LIKE '_b_'", T),
        ("str LIKE 'abc'", T),
        ("str LIKE 'ab'", F),
        ("str NOT LIKE 'ab'", T),
        ("str LIKE '%'", T),
        ("empty LIKE '%'", T),
        ("empty LIKE '_'", F),
        ("quote LIKE 'it''_'", T),
        ("pct LIKE '100!%' ESCAPE '!'", T),
        ("snum LIKE '100!%' ESCAPE '!'", F),
        ("pct LIKE '%!%' escape '!'", T),
        ("str LIKE '%!%' ESCAPE '!'", F),
        ("'a_c' LIKE 'a\\_c' ESCAPE '\\'", T),
        ("'abc' LIKE 'a\\_c' ESCAPE '\\'", F),
    ]);
}

#[test]
fn in_and_between() {
    check(&[
        ("str IN ('x', 'abc')", T),
        ("str IN ('x')", F),
        ("str NOT IN ('x')", T),
        ("str NOT IN ('abc')", F),
        ("long IN (1, 10)", T),
        ("long IN (-1, 10.0)", T),
        ("long IN (+10)", T),
        ("long NOT IN (1)", T),
        ("long BETWEEN 10 AND 10", T),
        ("long BETWEEN 1 AND 9", F),
        ("long NOT BETWEEN 1 AND 9", T),
        ("long BETWEEN 11 AND 1", F),
        ("dbl BETWEEN 2 AND 3", T),
    ]);
}

#[test]
fn keywords_are_case_insensitive() {
    check(&[
        ("str like 'a%' and long between 1 and 20 or false", T),
        ("missing is null", T),
        ("long Not In (1)", T),
    ]);
}

#[test]
fn long_or_chains_do_not_count_as_nesting() {
    let text = (0..300)
        .map(|i| format!("long = {i}"))
        .collect::<Vec<_>>()
        .join(" OR ");
    assert!(text.len() < SELECTOR_BYTES_MAX);
    assert_eq!(eval3(&text), T);
}

fn error(text: &str) -> SelectorError {
    match Selector::parse(text) {
        Ok(s) => panic!("{text:?} should not parse, got {s:?}"),
        Err(e) => e,
    }
}

fn error_at(text: &str, position: usize, message_part: &str) {
    let e = error(text);
    assert_eq!(e.position, position, "{text:?}: {e}");
    assert!(
        e.message.contains(message_part),
        "{text:?}: message {:?} should contain {message_part:?}",
        e.message
    );
    assert_eq!(e.caret, format!("{}^", " ".repeat(position)), "{text:?}");
    assert_eq!(e.text, text);
}

#[test]
fn incomplete_selector_is_reported_at_its_end() {
    error_at(
        "JMSPriority > ",
        14,
        "expected an expression, found end of selector",
    );
    error_at("JMSPriority >", 13, "end of selector");
    error_at("a AND", 5, "end of selector");
    error_at("a BETWEEN 1", 11, "expected AND in BETWEEN");
    error_at("a IN ('x'", 9, "expected ',' or ')'");
    error_at("a IS", 4, "expected NULL");
    error_at("(a = 1", 6, "expected ')' to close the '(' at position 0");
    error_at("a LIKE", 6, "LIKE needs a string pattern");
}

#[test]
fn unterminated_string_is_reported_at_its_start() {
    error_at("a = 'x", 4, "unterminated string literal");
}

#[test]
fn empty_selector_is_an_error() {
    error_at("", 0, "empty selector");
    let e = error("   ");
    assert_eq!(e.position, 0);
}

#[test]
fn misplaced_tokens_are_reported_where_they_are() {
    error_at(
        "a = 1 b",
        6,
        "expected AND, OR or end of selector, found identifier `b`",
    );
    error_at("a = 1)", 5, "unmatched ')'");
    error_at("a = b = c", 6, "found '='");
    error_at("= 1", 0, "expected an expression, found '='");
    error_at("a = NULL", 4, "IS NULL");
    error_at("a NOT b", 6, "expected LIKE, IN or BETWEEN after NOT");
    error_at("a IS NOT 1", 9, "expected NULL");
    error_at("a IN ()", 6, "IN lists hold string or number literals");
    error_at("a IN (b)", 6, "IN lists hold string or number literals");
    error_at("a IN (-'x')", 7, "IN lists hold string or number literals");
    error_at("a IN 'x'", 5, "expected '(' after IN");
    error_at("a LIKE b", 7, "LIKE needs a string pattern");
    error_at("a LIKE 'x' ESCAPE 'ab'", 18, "exactly one character");
    error_at("a LIKE 'x' ESCAPE ''", 18, "exactly one character");
    error_at(
        "a LIKE 'x!y' ESCAPE '!'",
        7,
        "must be followed by %, _ or itself",
    );
    error_at("a = 9223372036854775808", 4, "out of the range");
    error_at("a != 1", 2, "use <>");
}

#[test]
fn types_that_can_never_work_are_reported_at_the_operand() {
    error_at("1", 0, "expected a condition, found a number");
    error_at("'x'", 0, "expected a condition, found a string");
    error_at("a + 1", 0, "expected a condition, found a number");
    error_at("a = 1 AND 5", 10, "expected a condition, found a number");
    error_at("NOT 'x'", 4, "expected a condition, found a string");
    error_at("'a' + 1 = 1", 0, "expected a number, found a string");
    error_at("1 + 'a' = 1", 4, "expected a number, found a string");
    error_at("-'a' = 1", 1, "expected a number, found a string");
    error_at("TRUE < 1", 0, "expected a number, found a condition");
    error_at("1 < (a = 1)", 4, "expected a number, found a condition");
    error_at(
        "a BETWEEN 'x' AND 2",
        10,
        "expected a number, found a string",
    );
    error_at("a < 'b'", 4, "expected a number, found a string");
    error_at("5 LIKE 'x'", 0, "LIKE needs a string");
    error_at("TRUE IN ('x')", 0, "IN needs a string or a number");
}

#[test]
fn over_long_selector_is_refused_with_its_limit() {
    let text = format!("a = '{}'", "x".repeat(SELECTOR_BYTES_MAX));
    let e = error(&text);
    assert_eq!(e.position, SELECTOR_BYTES_MAX);
    assert!(e.message.contains("4096 bytes"), "{}", e.message);
    assert_eq!(e.text.len(), SELECTOR_BYTES_MAX);
    let limits = SelectorLimits {
        selector_bytes_max: 10,
        ..SelectorLimits::default()
    };
    assert!(Selector::parse_with_limits("a = 'é'", limits).is_ok());
    let e = Selector::parse_with_limits("abcdefghié = 1", limits).unwrap_err();
    assert_eq!(e.position, 9, "cut back to a character boundary");
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let n = 3000;
    for text in [
        format!("{}a = 1{}", "(".repeat(n), ")".repeat(n)),
        format!("{}a", "NOT ".repeat(n)),
        format!("{}a = 1", "-".repeat(n)),
        format!("{}a = 1", "- +".repeat(n)),
        format!("a = {}", "1 + ".repeat(1000) + "1"),
        format!("a = {}", "1 * ".repeat(1000) + "1"),
        format!("{}a = 1", "(NOT ".repeat(n)),
    ] {
        let limits = SelectorLimits {
            selector_bytes_max: 1 << 20,
            ..SelectorLimits::default()
        };
        let e = Selector::parse_with_limits(&text, limits).unwrap_err();
        assert!(e.message.contains("nested more than 64"), "{}", e.message);
    }
    let ok = format!("{}a = 1{}", "(".repeat(60), ")".repeat(60));
    assert!(Selector::parse(&ok).is_ok());
    let ok = format!("{}a", "NOT ".repeat(60));
    assert!(Selector::parse(&ok).is_ok());
}

#[test]
fn nesting_limit_is_configurable() {
    let limits = SelectorLimits {
        nesting_depth_max: 3,
        ..SelectorLimits::default()
    };
    assert!(Selector::parse_with_limits("((a))", limits).is_ok());
    let e = Selector::parse_with_limits("((((a))))", limits).unwrap_err();
    assert_eq!(e.position, 3);
}

#[test]
fn error_display_shows_the_text_and_a_caret() {
    let e = error("JMSPriority > ");
    assert_eq!(
        e.to_string(),
        "invalid selector at position 14: expected an expression, found end of selector\n\
         JMSPriority > \n              ^"
    );
}

#[test]
fn selector_is_clone_debug_and_keeps_its_text() {
    let s = Selector::parse("a = 1").unwrap();
    let c = s.clone();
    assert_eq!(c.text(), "a = 1");
    assert_eq!(format!("{s:?}"), "Selector(\"a = 1\")");
}

//! Property tests of the selector language: random expression trees are rendered to text,
//! parsed back and evaluated against random headers, and the result must agree with a small
//! reference evaluator written here from the rules (three-valued logic, STOMP string
//! conversion, long/double promotion). Also: garbage text never panics, and the laws of
//! three-valued logic hold.

use haven_engine::selector::{Selector, Value};
use proptest::prelude::*;
use proptest::sample::select;
use std::cmp::Ordering;
use std::collections::HashMap;

type Headers = HashMap<&'static str, Value>;

/// One position of a LIKE pattern.
#[derive(Clone, Debug)]
enum PAtom {
    Lit(char),
    AnyOne,
    AnyRun,
    /// The escape character `!` followed by this character, which is then literal.
    Escaped(char),
}

#[derive(Clone, Debug)]
enum E {
    Ident(&'static str),
    Str(String),
    /// Non-negative; negative numbers are `Neg`.
    Long(i64),
    /// Non-negative and finite.
    Double(f64),
    Bool(bool),
    Neg(Box<E>),
    Arith(char, Box<E>, Box<E>),
    Cmp(&'static str, Box<E>, Box<E>),
    Not(Box<E>),
    And(Box<E>, Box<E>),
    Or(Box<E>, Box<E>),
    Between(Box<E>, Box<E>, Box<E>, bool),
    In(Box<E>, Vec<Value>, bool),
    Like(Box<E>, Vec<PAtom>, bool, bool),
    IsNull(Box<E>, bool),
}

// ---- rendering, with only the parentheses precedence needs ----

const OR: u8 = 1;
const AND: u8 = 2;
const NOT: u8 = 3;
const PRED: u8 = 4;
const SUM: u8 = 5;
const PRODUCT: u8 = 6;
const UNARY: u8 = 7;
const ATOM: u8 = 8;

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn literal(v: &Value) -> String {
    match v {
        Value::Str(s) => quote(s),
        Value::Long(l) => l.to_string(),
        Value::Double(d) => format!("{d:?}"),
        Value::Bool(b) => if *b { "TRUE" } else { "false" }.to_string(),
    }
}

fn wrap(e: &E, min_level: u8) -> String {
    let (text, level) = render_level(e);
    if level < min_level {
        format!("({text})")
    } else {
        text
    }
}

fn not_kw(negated: bool) -> &'static str {
    if negated {
        "NOT "
    } else {
        ""
    }
}

fn render_level(e: &E) -> (String, u8) {
    match e {
        E::Ident(n) => (n.to_string(), ATOM),
        E::Str(s) => (quote(s), ATOM),
        E::Long(v) => (v.to_string(), ATOM),
        E::Double(d) => (format!("{d:?}"), ATOM),
        E::Bool(b) => (literal(&Value::Bool(*b)), ATOM),
        E::Neg(x) => (format!("-{}", wrap(x, UNARY)), UNARY),
        E::Arith(op, a, b) => {
            let level = if matches!(op, '+' | '-') {
                SUM
            } else {
                PRODUCT
            };
            (
                format!("{} {op} {}", wrap(a, level), wrap(b, level + 1)),
                level,
            )
        }
        E::Cmp(op, a, b) => (format!("{} {op} {}", wrap(a, SUM), wrap(b, SUM)), PRED),
        E::Not(x) => (format!("NOT {}", wrap(x, NOT)), NOT),
        E::And(a, b) => (format!("{} AND {}", wrap(a, AND), wrap(b, AND + 1)), AND),
        E::Or(a, b) => (format!("{} or {}", wrap(a, OR), wrap(b, OR + 1)), OR),
        E::Between(v, l, h, neg) => (
            format!(
                "{} {}BETWEEN {} AND {}",
                wrap(v, SUM),
                not_kw(*neg),
                wrap(l, SUM),
                wrap(h, SUM)
            ),
            PRED,
        ),
        E::In(v, list, neg) => {
            let items: Vec<String> = list.iter().map(literal).collect();
            (
                format!("{} {}IN ({})", wrap(v, SUM), not_kw(*neg), items.join(", ")),
                PRED,
            )
        }
        E::Like(v, pattern, escape, neg) => {
            let p: String = pattern
                .iter()
                .map(|a| match a {
                    PAtom::Lit(c) => c.to_string(),
                    PAtom::AnyOne => "_".into(),
                    PAtom::AnyRun => "%".into(),
                    PAtom::Escaped(c) => format!("!{c}"),
                })
                .collect();
            let escape = if *escape { " ESCAPE '!'" } else { "" };
            (
                format!(
                    "{} {}LIKE {}{escape}",
                    wrap(v, SUM),
                    not_kw(*neg),
                    quote(&p)
                ),
                PRED,
            )
        }
        E::IsNull(v, neg) => (format!("{} IS {}NULL", wrap(v, SUM), not_kw(*neg)), PRED),
    }
}

fn render(e: &E) -> String {
    render_level(e).0
}

// ---- the reference evaluator: `None` is NULL / UNKNOWN ----

fn str_number(s: &str) -> Option<Value> {
    if s.is_empty() || !s.chars().all(|c| "0123456789+-.eE".contains(c)) {
        return None;
    }
    if let Ok(v) = s.parse::<i64>() {
        return Some(Value::Long(v));
    }
    s.parse::<f64>()
        .ok()
        .filter(|d| d.is_finite())
        .map(Value::Double)
}

fn str_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// The value as a number (`Long` or finite `Double`).
fn number(v: &Value) -> Option<Value> {
    match v {
        Value::Long(_) | Value::Double(_) => Some(v.clone()),
        Value::Str(s) => str_number(s),
        Value::Bool(_) => None,
    }
}

fn as_f64(v: &Value) -> f64 {
    match v {
        Value::Long(l) => *l as f64,
        Value::Double(d) => *d,
        _ => unreachable!("numbers only"),
    }
}

fn compare_numbers(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Long(x), Value::Long(y)) => x.cmp(y),
        _ => as_f64(a).partial_cmp(&as_f64(b)).unwrap(),
    }
}

fn ordering(a: &Value, b: &Value) -> Option<Ordering> {
    Some(compare_numbers(&number(a)?, &number(b)?))
}

fn equal(a: &Value, b: &Value) -> Option<bool> {
    use Value::*;
    match (a, b) {
        (Str(x), Str(y)) => Some(x == y),
        (Bool(x), Bool(y)) => Some(x == y),
        (Bool(_), Long(_) | Double(_)) | (Long(_) | Double(_), Bool(_)) => None,
        (Str(s), Bool(b)) | (Bool(b), Str(s)) => str_bool(s).map(|x| x == *b),
        _ => Some(compare_numbers(&number(a)?, &number(b)?) == Ordering::Equal),
    }
}

fn and3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

fn or3(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

fn negate_if(r: Option<bool>, negated: bool) -> Option<bool> {
    r.map(|b| b != negated)
}

fn like(s: &[char], p: &[PAtom]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((PAtom::AnyRun, rest)) => (0..=s.len()).any(|i| like(&s[i..], rest)),
        Some((PAtom::AnyOne, rest)) => !s.is_empty() && like(&s[1..], rest),
        Some((PAtom::Lit(c) | PAtom::Escaped(c), rest)) => {
            s.first() == Some(c) && like(&s[1..], rest)
        }
    }
}

fn truth(e: &E, h: &Headers) -> Option<bool> {
    match eval(e, h)? {
        Value::Bool(b) => Some(b),
        Value::Str(s) => str_bool(&s),
        _ => None,
    }
}

fn eval(e: &E, h: &Headers) -> Option<Value> {
    match e {
        E::Ident(n) => match h.get(n)? {
            Value::Double(d) if !d.is_finite() => None,
            v => Some(v.clone()),
        },
        E::Str(s) => Some(Value::Str(s.clone())),
        E::Long(v) => Some(Value::Long(*v)),
        E::Double(d) => Some(Value::Double(*d)),
        E::Bool(b) => Some(Value::Bool(*b)),
        E::Neg(x) => match number(&eval(x, h)?)? {
            Value::Long(v) => v.checked_neg().map(Value::Long),
            Value::Double(d) => Some(Value::Double(-d)),
            _ => unreachable!(),
        },
        E::Arith(op, a, b) => {
            let a = number(&eval(a, h)?)?;
            let b = number(&eval(b, h)?)?;
            if let (Value::Long(x), Value::Long(y)) = (&a, &b) {
                let r = match op {
                    '+' => x.checked_add(*y),
                    '-' => x.checked_sub(*y),
                    '*' => x.checked_mul(*y),
                    _ => x.checked_div(*y),
                };
                return r.map(Value::Long);
            }
            let (x, y) = (as_f64(&a), as_f64(&b));
            let r = match op {
                '+' => x + y,
                '-' => x - y,
                '*' => x * y,
                _ if y == 0.0 => return None,
                _ => x / y,
            };
            r.is_finite().then_some(Value::Double(r))
        }
        E::Cmp(op, a, b) => {
            let a = eval(a, h)?;
            let b = eval(b, h)?;
            let r = match *op {
                "=" => equal(&a, &b),
                "<>" => equal(&a, &b).map(|x| !x),
                "<" => ordering(&a, &b).map(|o| o.is_lt()),
                "<=" => ordering(&a, &b).map(|o| o.is_le()),
                ">" => ordering(&a, &b).map(|o| o.is_gt()),
                ">=" => ordering(&a, &b).map(|o| o.is_ge()),
                _ => unreachable!(),
            };
            r.map(Value::Bool)
        }
        E::Not(x) => truth(x, h).map(|b| Value::Bool(!b)),
        E::And(a, b) => and3(truth(a, h), truth(b, h)).map(Value::Bool),
        E::Or(a, b) => or3(truth(a, h), truth(b, h)).map(Value::Bool),
        E::Between(v, l, hi, neg) => {
            let (v, l, hi) = (eval(v, h), eval(l, h), eval(hi, h));
            let le = |a: &Option<Value>, b: &Option<Value>| match (a, b) {
                (Some(a), Some(b)) => ordering(a, b).map(|o| o.is_le()),
                _ => None,
            };
            negate_if(and3(le(&l, &v), le(&v, &hi)), *neg).map(Value::Bool)
        }
        E::In(v, list, neg) => {
            let v = eval(v, h)?;
            let results: Vec<Option<bool>> = list.iter().map(|item| equal(&v, item)).collect();
            let r = if results.contains(&Some(true)) {
                Some(true)
            } else if results.contains(&None) {
                None
            } else {
                Some(false)
            };
            negate_if(r, *neg).map(Value::Bool)
        }
        E::Like(v, pattern, _, neg) => match eval(v, h)? {
            Value::Str(s) => {
                let chars: Vec<char> = s.chars().collect();
                Some(Value::Bool(like(&chars, pattern) != *neg))
            }
            _ => None,
        },
        E::IsNull(v, neg) => Some(Value::Bool(eval(v, h).is_none() != *neg)),
    }
}

// ---- strategies ----

const IDENTS: [&str; 4] = ["a", "b", "c", "s"];

fn ident() -> impl Strategy<Value = &'static str> {
    select(IDENTS.to_vec())
}

fn string_value() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "",
            "1",
            "-2",
            "1.5",
            "1e3",
            "+3",
            " 1",
            ".5",
            "2.",
            "true",
            "FALSE",
            "abc",
            "0x10",
            "NaN",
            "inf",
            "9223372036854775808",
            "it's",
            "é"
        ])
        .prop_map(String::from),
        "[ab%_!1']{0,5}",
    ]
}

fn header_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-3i64..20).prop_map(Value::Long),
        select(vec![i64::MAX, i64::MIN, 0]).prop_map(Value::Long),
        select(vec![0.0, 0.5, -1.5, 2.0, 1e300, f64::NAN, f64::INFINITY]).prop_map(Value::Double),
        any::<bool>().prop_map(Value::Bool),
        string_value().prop_map(Value::Str),
    ]
}

fn headers() -> impl Strategy<Value = Headers> {
    prop::collection::vec(prop::option::of(header_value()), IDENTS.len()).prop_map(|values| {
        IDENTS
            .iter()
            .zip(values)
            .filter_map(|(k, v)| Some((*k, v?)))
            .collect()
    })
}

fn long_literal() -> impl Strategy<Value = i64> {
    prop_oneof![0i64..10, Just(i64::MAX), 0..=i64::MAX]
}

fn double_literal() -> impl Strategy<Value = f64> {
    prop_oneof![select(vec![0.0, 0.5, 1.5, 2.0, 1e300, 1e-7]), 0.0f64..100.0]
}

fn num_expr() -> BoxedStrategy<E> {
    let leaf = prop_oneof![
        ident().prop_map(E::Ident),
        long_literal().prop_map(E::Long),
        double_literal().prop_map(E::Double),
    ];
    leaf.prop_recursive(3, 12, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|x| E::Neg(Box::new(x))),
            (select(vec!['+', '-', '*', '/']), inner.clone(), inner)
                .prop_map(|(op, a, b)| E::Arith(op, Box::new(a), Box::new(b))),
        ]
    })
    .boxed()
}

fn str_expr() -> BoxedStrategy<E> {
    prop_oneof![ident().prop_map(E::Ident), string_value().prop_map(E::Str)].boxed()
}

fn value_expr() -> BoxedStrategy<E> {
    prop_oneof![num_expr(), str_expr(), any::<bool>().prop_map(E::Bool)].boxed()
}

fn in_literal() -> impl Strategy<Value = Value> {
    prop_oneof![
        string_value().prop_map(Value::Str),
        (-3i64..20).prop_map(Value::Long),
        Just(Value::Long(i64::MIN)),
        select(vec![-1.5, 0.0, 2.0]).prop_map(Value::Double),
    ]
}

/// A LIKE pattern and whether it is written with `ESCAPE '!'` (always, if it escapes).
fn pattern() -> impl Strategy<Value = (Vec<PAtom>, bool)> {
    let atom = prop_oneof![
        4 => select(vec!['a', 'b', '1', '\'', 'é']).prop_map(PAtom::Lit),
        2 => Just(PAtom::AnyOne),
        2 => Just(PAtom::AnyRun),
        1 => select(vec!['%', '_', '!']).prop_map(PAtom::Escaped),
    ];
    (prop::collection::vec(atom, 0..6), any::<bool>()).prop_map(|(atoms, escape)| {
        let escapes = atoms.iter().any(|a| matches!(a, PAtom::Escaped(_)));
        // Without ESCAPE, `!` is an ordinary character.
        let atoms = if escapes || escape {
            atoms
        } else {
            atoms
                .into_iter()
                .map(|a| match a {
                    PAtom::Escaped(_) => PAtom::Lit('!'),
                    a => a,
                })
                .collect()
        };
        (atoms, escapes || escape)
    })
}

fn bool_expr() -> BoxedStrategy<E> {
    let b = |x: E| Box::new(x);
    let leaf =
        prop_oneof![
            any::<bool>().prop_map(E::Bool),
            ident().prop_map(E::Ident),
            (select(vec!["=", "<>"]), value_expr(), value_expr())
                .prop_map(move |(op, x, y)| E::Cmp(op, b(x), b(y))),
            (select(vec!["<", "<=", ">", ">="]), num_expr(), num_expr())
                .prop_map(move |(op, x, y)| E::Cmp(op, b(x), b(y))),
            (num_expr(), num_expr(), num_expr(), any::<bool>())
                .prop_map(move |(v, l, h, n)| E::Between(b(v), b(l), b(h), n)),
            (
                prop_oneof![num_expr(), str_expr()],
                prop::collection::vec(in_literal(), 1..4),
                any::<bool>()
            )
                .prop_map(move |(v, list, n)| E::In(b(v), list, n)),
            (str_expr(), pattern(), any::<bool>()).prop_map(move |(v, (p, escape), n)| E::Like(
                b(v),
                p,
                escape,
                n
            )),
            (value_expr(), any::<bool>()).prop_map(move |(v, n)| E::IsNull(b(v), n)),
        ];
    leaf.prop_recursive(4, 24, 2, move |inner| {
        prop_oneof![
            inner.clone().prop_map(move |x| E::Not(b(x))),
            (inner.clone(), inner.clone()).prop_map(move |(x, y)| E::And(b(x), b(y))),
            (inner.clone(), inner.clone()).prop_map(move |(x, y)| E::Or(b(x), b(y))),
            (select(vec!["=", "<>"]), inner.clone(), inner.clone())
                .prop_map(move |(op, x, y)| E::Cmp(op, b(x), b(y))),
            (inner, any::<bool>()).prop_map(move |(x, n)| E::IsNull(b(x), n)),
        ]
    })
    .boxed()
}

fn parse(text: &str) -> Selector {
    Selector::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

fn selects(text: &str, h: &Headers) -> bool {
    parse(text).matches(&|name: &str| h.get(name).cloned())
}

/// A selector's three-valued result, read through `matches` on it and on its negation.
fn truth_via_matches(text: &str, h: &Headers) -> Option<bool> {
    let positive = selects(text, h);
    let negative = selects(&format!("NOT ({text})"), h);
    assert!(!(positive && negative), "{text:?} is both TRUE and FALSE");
    match (positive, negative) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    }
}

const FRAGMENTS: [&str; 40] = [
    "a",
    "JMSPriority",
    "'x'",
    "'",
    "''",
    "(",
    ")",
    "NOT",
    "AND",
    "OR",
    "=",
    "<>",
    "<",
    ">=",
    "1",
    "1.5",
    "1e",
    "e",
    ".",
    "-",
    "+",
    "*",
    "/",
    "LIKE",
    "IN",
    "BETWEEN",
    "IS",
    "NULL",
    "ESCAPE",
    ",",
    " ",
    "é",
    "\n",
    "\t",
    "%",
    "9223372036854775808",
    "!",
    "\"",
    "TRUE",
    "0.",
];

fn garbage() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(select(FRAGMENTS.to_vec()), 0..20).prop_map(|f| f.join(" ")),
        prop::collection::vec(select(FRAGMENTS.to_vec()), 0..20).prop_map(|f| f.concat()),
        any::<String>(),
    ]
}

/// In a module named `selector` so that `cargo test selector` runs them.
mod selector {
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn rendered_selectors_evaluate_like_the_reference(e in bool_expr(), h in headers()) {
            let text = render(&e);
            prop_assert_eq!(truth_via_matches(&text, &h), truth(&e, &h), "selector: {}", text);
        }

        #[test]
        fn not_not_is_identity(x in bool_expr(), h in headers()) {
            let x = render(&x);
            prop_assert_eq!(
                truth_via_matches(&format!("NOT NOT ({x})"), &h),
                truth_via_matches(&x, &h)
            );
        }

        #[test]
        fn de_morgan_holds_under_three_valued_logic(
            x in bool_expr(),
            y in bool_expr(),
            h in headers(),
        ) {
            let (x, y) = (render(&x), render(&y));
            prop_assert_eq!(
                truth_via_matches(&format!("NOT (({x}) AND ({y}))"), &h),
                truth_via_matches(&format!("NOT ({x}) OR NOT ({y})"), &h)
            );
            prop_assert_eq!(
                truth_via_matches(&format!("NOT (({x}) OR ({y}))"), &h),
                truth_via_matches(&format!("NOT ({x}) AND NOT ({y})"), &h)
            );
        }

        #[test]
        fn excluded_middle_fails_exactly_when_unknown(x in bool_expr(), h in headers()) {
            let x = render(&x);
            let t = truth_via_matches(&x, &h);
            prop_assert_eq!(selects(&format!("({x}) OR NOT ({x})"), &h), t.is_some());
            prop_assert_eq!(selects(&format!("({x}) AND NOT ({x})"), &h), false);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn garbage_never_panics_and_errors_point_inside_the_text(text in garbage(), h in headers()) {
            match Selector::parse(&text) {
                Ok(s) => {
                    s.matches(&|name: &str| h.get(name).cloned());
                }
                Err(e) => {
                    let chars = text.chars().count();
                    prop_assert!(e.position <= chars, "{:?}: {}", text, e);
                    prop_assert_eq!(e.text.chars().count(), chars);
                    prop_assert_eq!(e.caret.chars().count(), e.position + 1);
                    prop_assert!(e.caret.ends_with('^'));
                    prop_assert!(!e.message.is_empty());
                }
            }
        }
    }
}

//! Evaluates a compiled selector against one message with SQL three-valued logic.
//!
//! `None` is NULL: a missing header, and UNKNOWN, which is what NULL becomes in a condition.
//! NULL propagates through arithmetic and comparisons; `NOT UNKNOWN` is UNKNOWN;
//! `FALSE AND UNKNOWN` is FALSE and `TRUE OR UNKNOWN` is TRUE; `IS NULL` is never UNKNOWN.
//! A comparison that has no meaning for its operand types (a string with `<`, a boolean with a
//! number, a string that is not a number with a number) is UNKNOWN; see [`super::value`] for
//! the conversions. Arithmetic follows Java: long with long stays long (integer division
//! truncates), anything with a double is double. Division by zero (long or double), long
//! overflow and a non-finite double result are UNKNOWN rather than an error or a wrapped value:
//! a selector is evaluated per message, and a message that makes it meaningless is simply not
//! selected.
//!
//! Recursion here follows the tree, whose height the parser bounded.

use super::ast::{ArithOp, CmpOp, Expr};
use super::value::{parse_bool, parse_number, Num, Val, Value};
use std::cmp::Ordering;

pub(crate) type Lookup<'l> = &'l dyn Fn(&str) -> Option<Value>;

/// The truth of `e`: `Some(true)`, `Some(false)` or UNKNOWN (`None`).
pub(crate) fn truth(e: &Expr, lookup: Lookup<'_>) -> Option<bool> {
    eval(e, lookup)?.to_bool()
}

/// The value of `e`, or NULL.
pub(crate) fn eval<'e>(e: &'e Expr, lookup: Lookup<'_>) -> Option<Val<'e>> {
    match e {
        Expr::Literal(lit) => Some(lit.as_val()),
        Expr::Ident(name) => lookup(name).and_then(Val::from_value),
        Expr::Neg(x) => {
            let n = match eval(x, lookup)?.to_num()? {
                Num::Long(v) => Num::Long(v.checked_neg()?),
                Num::Double(d) => Num::Double(-d),
            };
            Some(Val::Num(n))
        }
        Expr::Plus(x) => Some(Val::Num(eval(x, lookup)?.to_num()?)),
        Expr::Arith(op, a, b) => {
            let a = eval(a, lookup)?.to_num()?;
            let b = eval(b, lookup)?.to_num()?;
            arith(*op, a, b).map(Val::Num)
        }
        Expr::Compare(op, a, b) => {
            let a = eval(a, lookup)?;
            let b = eval(b, lookup)?;
            compare(*op, &a, &b).map(Val::Bool)
        }
        Expr::Not(x) => truth(x, lookup).map(|b| Val::Bool(!b)),
        Expr::And(items) => all(items.iter().map(|x| truth(x, lookup))).map(Val::Bool),
        Expr::Or(items) => any(items.iter().map(|x| truth(x, lookup))).map(Val::Bool),
        Expr::Between { value, low, high } => {
            let v = eval(value, lookup);
            let low = eval(low, lookup);
            let high = eval(high, lookup);
            let both = |a: &Option<Val<'_>>, b: &Option<Val<'_>>| match (a, b) {
                (Some(a), Some(b)) => ordered(a, b),
                _ => None,
            };
            let above = both(&low, &v);
            let below = both(&v, &high);
            let in_range = |o: Option<Ordering>| o.map(|o| o != Ordering::Greater);
            all([in_range(above), in_range(below)].into_iter()).map(Val::Bool)
        }
        Expr::In { value, list } => {
            let v = eval(value, lookup)?;
            any(list.iter().map(|item| equal(&v, &item.as_val()))).map(Val::Bool)
        }
        Expr::Like { value, pattern } => match eval(value, lookup)? {
            Val::Str(s) => Some(Val::Bool(pattern.matches(&s))),
            Val::Num(_) | Val::Bool(_) => None,
        },
        Expr::IsNull(x) => Some(Val::Bool(eval(x, lookup).is_none())),
    }
}

/// Three-valued AND: FALSE if any is FALSE, else UNKNOWN if any is UNKNOWN, else TRUE.
fn all(items: impl Iterator<Item = Option<bool>>) -> Option<bool> {
    let mut unknown = false;
    for item in items {
        match item {
            Some(false) => return Some(false),
            None => unknown = true,
            Some(true) => {}
        }
    }
    (!unknown).then_some(true)
}

/// Three-valued OR: TRUE if any is TRUE, else UNKNOWN if any is UNKNOWN, else FALSE.
fn any(items: impl Iterator<Item = Option<bool>>) -> Option<bool> {
    all(items.map(|i| i.map(|b| !b))).map(|b| !b)
}

fn arith(op: ArithOp, a: Num, b: Num) -> Option<Num> {
    match (a, b) {
        (Num::Long(a), Num::Long(b)) => Some(Num::Long(match op {
            ArithOp::Add => a.checked_add(b)?,
            ArithOp::Sub => a.checked_sub(b)?,
            ArithOp::Mul => a.checked_mul(b)?,
            ArithOp::Div => a.checked_div(b)?,
        })),
        (a, b) => {
            let (a, b) = (a.as_f64(), b.as_f64());
            let r = match op {
                ArithOp::Add => a + b,
                ArithOp::Sub => a - b,
                ArithOp::Mul => a * b,
                ArithOp::Div if b == 0.0 => return None,
                ArithOp::Div => a / b,
            };
            Num::double(r)
        }
    }
}

fn compare(op: CmpOp, a: &Val<'_>, b: &Val<'_>) -> Option<bool> {
    match op {
        CmpOp::Eq => equal(a, b),
        CmpOp::Ne => equal(a, b).map(|e| !e),
        CmpOp::Lt => ordered(a, b).map(|o| o == Ordering::Less),
        CmpOp::Le => ordered(a, b).map(|o| o != Ordering::Greater),
        CmpOp::Gt => ordered(a, b).map(|o| o == Ordering::Greater),
        CmpOp::Ge => ordered(a, b).map(|o| o != Ordering::Less),
    }
}

/// `=`: strings as strings, booleans as booleans, numbers numerically; a string against a
/// number or boolean is converted to that type first.
fn equal(a: &Val<'_>, b: &Val<'_>) -> Option<bool> {
    match (a, b) {
        (Val::Str(x), Val::Str(y)) => Some(x == y),
        (Val::Bool(x), Val::Bool(y)) => Some(x == y),
        (Val::Num(x), Val::Num(y)) => Some(x.compare(*y) == Ordering::Equal),
        (Val::Str(s), Val::Num(n)) | (Val::Num(n), Val::Str(s)) => {
            Some(parse_number(s)?.compare(*n) == Ordering::Equal)
        }
        (Val::Str(s), Val::Bool(x)) | (Val::Bool(x), Val::Str(s)) => Some(parse_bool(s)? == *x),
        (Val::Bool(_), Val::Num(_)) | (Val::Num(_), Val::Bool(_)) => None,
    }
}

/// `<` and friends: numbers only (strings that are numbers included).
fn ordered(a: &Val<'_>, b: &Val<'_>) -> Option<Ordering> {
    Some(a.to_num()?.compare(b.to_num()?))
}

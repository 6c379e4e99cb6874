//! The compiled form of a selector: an expression tree whose height the parser has bounded, so
//! that evaluating (and dropping) it cannot overflow the stack.
//!
//! `NOT LIKE`, `NOT IN`, `NOT BETWEEN` and `IS NOT NULL` are `Not` around the positive form,
//! which has the same three-valued meaning. `AND`/`OR` chains are n-ary so that a long list of
//! alternatives (`id = 1 OR id = 2 OR ...`) does not count against the nesting limit.

use super::like::LikePattern;
use super::value::{Num, Val};
use std::borrow::Cow;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Lit {
    Str(Box<str>),
    Num(Num),
    Bool(bool),
}

impl Lit {
    pub(crate) fn as_val(&self) -> Val<'_> {
        match self {
            Lit::Str(s) => Val::Str(Cow::Borrowed(s)),
            Lit::Num(n) => Val::Num(*n),
            Lit::Bool(b) => Val::Bool(*b),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    /// `<` `>` `<=` `>=`: defined on numbers only.
    pub(crate) fn is_ordering(self) -> bool {
        !matches!(self, CmpOp::Eq | CmpOp::Ne)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Expr {
    Literal(Lit),
    Ident(Box<str>),
    Neg(Box<Expr>),
    /// Unary `+`: the operand read as a number.
    Plus(Box<Expr>),
    Arith(ArithOp, Box<Expr>, Box<Expr>),
    Compare(CmpOp, Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    /// Two or more operands.
    And(Vec<Expr>),
    /// Two or more operands.
    Or(Vec<Expr>),
    Between {
        value: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
    },
    /// A non-empty list of string and numeric literals.
    In {
        value: Box<Expr>,
        list: Vec<Lit>,
    },
    Like {
        value: Box<Expr>,
        pattern: LikePattern,
    },
    IsNull(Box<Expr>),
}

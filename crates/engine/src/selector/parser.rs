//! Recursive-descent parser from tokens to an [`Expr`], with static type checks and the
//! nesting limit.
//!
//! Grammar, loosest binding first (SQL precedence: `NOT` applies to a whole comparison, so
//! `NOT a = 1` is `NOT (a = 1)`; comparisons do not chain, so `a = b = c` is an error):
//!
//! ```text
//! or        := and (OR and)*
//! and       := not (AND not)*
//! not       := NOT not | predicate
//! predicate := sum [ ('=' | '<>' | '<' | '<=' | '>' | '>=') sum
//!                  | [NOT] LIKE string [ESCAPE string]
//!                  | [NOT] IN '(' literal (',' literal)* ')'
//!                  | [NOT] BETWEEN sum AND sum
//!                  | IS [NOT] NULL ]
//! sum       := product (('+' | '-') product)*
//! product   := unary (('*' | '/') unary)*
//! unary     := ('+' | '-') unary | primary
//! primary   := string | number | TRUE | FALSE | identifier | '(' or ')'
//! ```
//!
//! Each parsed node has a static kind (boolean, number, string, or "any" for an identifier,
//! whose type is known only per message). Kinds that can never work are rejected here, where
//! the client can be told where: `'a' + 1`, `NOT 5`, `TRUE < 1`, `5 LIKE 'x'`. Mixed kinds in
//! `=`/`<>` are allowed (they are UNKNOWN, or converted, at run time).
//!
//! Two bounds keep recursion finite: the parser's own recursion through `(`, `NOT` and unary
//! signs, and the height of the built tree (left-deep arithmetic such as `a+a+a+...`), are each
//! at most the nesting limit.

use super::ast::{ArithOp, CmpOp, Expr, Lit};
use super::error::SelectorError;
use super::lexer::{Kw, Tok, Token, LONG_MAGNITUDE_MAX};
use super::like::LikePattern;
use super::value::Num;

/// What a node can evaluate to, as far as the text shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Bool,
    Num,
    Str,
    /// An identifier: its type depends on the message.
    Any,
}

/// A parsed subexpression.
struct Node {
    expr: Expr,
    kind: Kind,
    /// Byte offset where its text starts, for errors about it.
    start: usize,
    /// Height of `expr` as a tree; a leaf is 1.
    height: usize,
}

pub(crate) struct Parser<'t> {
    text: &'t str,
    tokens: Vec<Token>,
    next: usize,
    depth: usize,
    nesting_depth_max: usize,
}

impl<'t> Parser<'t> {
    pub(crate) fn new(text: &'t str, tokens: Vec<Token>, nesting_depth_max: usize) -> Self {
        assert!(
            tokens.last().is_some_and(|t| t.tok == Tok::Eof),
            "the lexer ends every token list with Eof"
        );
        Parser {
            text,
            tokens,
            next: 0,
            depth: 0,
            nesting_depth_max,
        }
    }

    /// The whole selector: one boolean expression and nothing after it.
    pub(crate) fn parse_selector(mut self) -> Result<Expr, SelectorError> {
        let node = self.parse_or()?;
        let end = self.peek();
        match end.tok {
            Tok::Eof => {}
            Tok::RParen => return Err(self.error(end.start, "unmatched ')'")),
            _ => {
                let msg = format!(
                    "expected AND, OR or end of selector, found {}",
                    end.tok.describe()
                );
                return Err(self.error(end.start, msg));
            }
        }
        self.expect_bool(&node)?;
        assert_eq!(self.depth, 0, "every nesting level entered was left");
        Ok(node.expr)
    }

    fn error(&self, at: usize, message: impl Into<String>) -> SelectorError {
        SelectorError::at(self.text, at, message)
    }

    fn peek(&self) -> &Token {
        &self.tokens[self.next]
    }

    /// The next token, consumed (`Eof` is never consumed).
    fn bump(&mut self) -> Token {
        let t = self.tokens[self.next].clone();
        if t.tok != Tok::Eof {
            self.next += 1;
        }
        t
    }

    fn at_kw(&self, kw: Kw) -> bool {
        self.peek().tok == Tok::Kw(kw)
    }

    fn enter(&mut self, at: usize) -> Result<(), SelectorError> {
        self.depth += 1;
        if self.depth > self.nesting_depth_max {
            return Err(self.nesting_error(at));
        }
        Ok(())
    }

    fn leave(&mut self) {
        assert!(self.depth > 0);
        self.depth -= 1;
    }

    fn nesting_error(&self, at: usize) -> SelectorError {
        self.error(
            at,
            format!(
                "expression nested more than {} levels deep",
                self.nesting_depth_max
            ),
        )
    }

    /// A node over `children`, checking the tree height; `at` is the operator's position.
    fn node(
        &self,
        expr: Expr,
        kind: Kind,
        start: usize,
        children: &[usize],
        at: usize,
    ) -> Result<Node, SelectorError> {
        let height = 1 + children.iter().copied().max().unwrap_or(0);
        if height > self.nesting_depth_max {
            return Err(self.nesting_error(at));
        }
        Ok(Node {
            expr,
            kind,
            start,
            height,
        })
    }

    fn expect_bool(&self, n: &Node) -> Result<(), SelectorError> {
        match n.kind {
            Kind::Bool | Kind::Any => Ok(()),
            Kind::Num => Err(self.error(n.start, "expected a condition, found a number")),
            Kind::Str => Err(self.error(n.start, "expected a condition, found a string")),
        }
    }

    fn expect_num(&self, n: &Node) -> Result<(), SelectorError> {
        match n.kind {
            Kind::Num | Kind::Any => Ok(()),
            Kind::Bool => Err(self.error(n.start, "expected a number, found a condition")),
            Kind::Str => Err(self.error(n.start, "expected a number, found a string")),
        }
    }

    fn expect(&mut self, tok: Tok, what: &str) -> Result<Token, SelectorError> {
        let t = self.bump();
        if t.tok == tok {
            Ok(t)
        } else {
            Err(self.error(
                t.start,
                format!("expected {what}, found {}", t.tok.describe()),
            ))
        }
    }

    fn parse_or(&mut self) -> Result<Node, SelectorError> {
        self.parse_chain(Kw::Or)
    }

    fn parse_and(&mut self) -> Result<Node, SelectorError> {
        self.parse_chain(Kw::And)
    }

    /// `item (kw item)*` as one n-ary node; items are `and` under OR, `not` under AND.
    fn parse_chain(&mut self, kw: Kw) -> Result<Node, SelectorError> {
        let item = |p: &mut Self| {
            if kw == Kw::Or {
                p.parse_and()
            } else {
                p.parse_not()
            }
        };
        let first = item(self)?;
        if !self.at_kw(kw) {
            return Ok(first);
        }
        self.expect_bool(&first)?;
        let start = first.start;
        let mut heights = vec![first.height];
        let mut items = vec![first.expr];
        let mut last_op = start;
        while self.at_kw(kw) {
            last_op = self.bump().start;
            let n = item(self)?;
            self.expect_bool(&n)?;
            heights.push(n.height);
            items.push(n.expr);
        }
        let expr = if kw == Kw::Or {
            Expr::Or(items)
        } else {
            Expr::And(items)
        };
        self.node(expr, Kind::Bool, start, &heights, last_op)
    }

    fn parse_not(&mut self) -> Result<Node, SelectorError> {
        if !self.at_kw(Kw::Not) {
            return self.parse_predicate();
        }
        let not = self.bump();
        self.enter(not.start)?;
        let operand = self.parse_not()?;
        self.leave();
        self.expect_bool(&operand)?;
        self.node(
            Expr::Not(Box::new(operand.expr)),
            Kind::Bool,
            not.start,
            &[operand.height],
            not.start,
        )
    }

    fn parse_predicate(&mut self) -> Result<Node, SelectorError> {
        let left = self.parse_sum()?;
        let op = match self.peek().tok {
            Tok::Eq => CmpOp::Eq,
            Tok::Ne => CmpOp::Ne,
            Tok::Lt => CmpOp::Lt,
            Tok::Le => CmpOp::Le,
            Tok::Gt => CmpOp::Gt,
            Tok::Ge => CmpOp::Ge,
            Tok::Kw(Kw::Like | Kw::In | Kw::Between) => return self.parse_suffix(left),
            Tok::Kw(Kw::Not) => {
                let not = self.bump();
                if !matches!(self.peek().tok, Tok::Kw(Kw::Like | Kw::In | Kw::Between)) {
                    let t = self.peek();
                    let msg = format!(
                        "expected LIKE, IN or BETWEEN after NOT, found {}",
                        t.tok.describe()
                    );
                    return Err(self.error(t.start, msg));
                }
                let positive = self.parse_suffix(left)?;
                let start = positive.start;
                return self.node(
                    Expr::Not(Box::new(positive.expr)),
                    Kind::Bool,
                    start,
                    &[positive.height],
                    not.start,
                );
            }
            Tok::Kw(Kw::Is) => return self.parse_is_null(left),
            _ => return Ok(left),
        };
        let op_tok = self.bump();
        if op.is_ordering() {
            self.expect_num(&left)?;
        }
        let right = self.parse_sum()?;
        if op.is_ordering() {
            self.expect_num(&right)?;
        }
        let start = left.start;
        self.node(
            Expr::Compare(op, Box::new(left.expr), Box::new(right.expr)),
            Kind::Bool,
            start,
            &[left.height, right.height],
            op_tok.start,
        )
    }

    fn parse_is_null(&mut self, value: Node) -> Result<Node, SelectorError> {
        let is = self.bump();
        assert_eq!(is.tok, Tok::Kw(Kw::Is));
        let negated = self.at_kw(Kw::Not);
        if negated {
            self.bump();
        }
        self.expect(Tok::Kw(Kw::Null), "NULL")?;
        let mut node = self.node(
            Expr::IsNull(Box::new(value.expr)),
            Kind::Bool,
            value.start,
            &[value.height],
            is.start,
        )?;
        if negated {
            node = self.node(
                Expr::Not(Box::new(node.expr)),
                Kind::Bool,
                node.start,
                &[node.height],
                is.start,
            )?;
        }
        Ok(node)
    }

    /// `LIKE ...`, `IN (...)` or `BETWEEN ... AND ...` after `value`.
    fn parse_suffix(&mut self, value: Node) -> Result<Node, SelectorError> {
        let op = self.bump();
        let start = value.start;
        match op.tok {
            Tok::Kw(Kw::Like) => {
                if !matches!(value.kind, Kind::Str | Kind::Any) {
                    return Err(self.error(value.start, "LIKE needs a string to match"));
                }
                let pattern = self.bump();
                let Tok::Str(pattern_text) = &pattern.tok else {
                    let msg = format!(
                        "LIKE needs a string pattern, found {}",
                        pattern.tok.describe()
                    );
                    return Err(self.error(pattern.start, msg));
                };
                let mut escape = None;
                if self.at_kw(Kw::Escape) {
                    self.bump();
                    let e = self.bump();
                    let mut chars = match &e.tok {
                        Tok::Str(s) => s.chars(),
                        _ => "".chars(),
                    };
                    match (chars.next(), chars.next()) {
                        (Some(c), None) => escape = Some(c),
                        _ => {
                            return Err(self
                                .error(e.start, "ESCAPE needs a string of exactly one character"))
                        }
                    }
                }
                let pattern = LikePattern::compile(pattern_text, escape)
                    .map_err(|msg| self.error(pattern.start, msg))?;
                self.node(
                    Expr::Like {
                        value: Box::new(value.expr),
                        pattern,
                    },
                    Kind::Bool,
                    start,
                    &[value.height],
                    op.start,
                )
            }
            Tok::Kw(Kw::In) => {
                if value.kind == Kind::Bool {
                    return Err(self.error(value.start, "IN needs a string or a number"));
                }
                self.expect(Tok::LParen, "'(' after IN")?;
                let mut list = Vec::new();
                loop {
                    list.push(self.parse_in_item()?);
                    let t = self.bump();
                    match t.tok {
                        Tok::Comma => {}
                        Tok::RParen => break,
                        _ => {
                            let msg = format!(
                                "expected ',' or ')' in IN list, found {}",
                                t.tok.describe()
                            );
                            return Err(self.error(t.start, msg));
                        }
                    }
                }
                self.node(
                    Expr::In {
                        value: Box::new(value.expr),
                        list,
                    },
                    Kind::Bool,
                    start,
                    &[value.height],
                    op.start,
                )
            }
            Tok::Kw(Kw::Between) => {
                self.expect_num(&value)?;
                let low = self.parse_sum()?;
                self.expect_num(&low)?;
                self.expect(Tok::Kw(Kw::And), "AND in BETWEEN")?;
                let high = self.parse_sum()?;
                self.expect_num(&high)?;
                self.node(
                    Expr::Between {
                        value: Box::new(value.expr),
                        low: Box::new(low.expr),
                        high: Box::new(high.expr),
                    },
                    Kind::Bool,
                    start,
                    &[value.height, low.height, high.height],
                    op.start,
                )
            }
            _ => unreachable!("parse_suffix is called only at LIKE, IN or BETWEEN"),
        }
    }

    /// A string literal or an optionally signed numeric literal.
    fn parse_in_item(&mut self) -> Result<Lit, SelectorError> {
        let t = self.bump();
        let negative = t.tok == Tok::Minus;
        let number = if negative || t.tok == Tok::Plus {
            self.bump()
        } else {
            t.clone()
        };
        let lit = match number.tok {
            Tok::Str(ref s) if number.start == t.start => Some(Lit::Str(s.as_str().into())),
            Tok::Long(v) => self.long_literal(v, negative, number.start)?.map(Lit::Num),
            Tok::Double(d) => Some(Lit::Num(Num::Double(if negative { -d } else { d }))),
            _ => None,
        };
        lit.ok_or_else(|| {
            let msg = format!(
                "IN lists hold string or number literals, found {}",
                number.tok.describe()
            );
            self.error(number.start, msg)
        })
    }

    /// An integer literal of magnitude `v`: `2^63` only when negative.
    fn long_literal(
        &self,
        v: u64,
        negative: bool,
        at: usize,
    ) -> Result<Option<Num>, SelectorError> {
        assert!(v <= LONG_MAGNITUDE_MAX);
        let signed = if negative {
            (v as i128).wrapping_neg()
        } else {
            v as i128
        };
        match i64::try_from(signed) {
            Ok(v) => Ok(Some(Num::Long(v))),
            Err(_) => Err(self.error(at, "integer out of the range of a 64-bit long")),
        }
    }

    fn parse_sum(&mut self) -> Result<Node, SelectorError> {
        let mut left = self.parse_product()?;
        loop {
            let op = match self.peek().tok {
                Tok::Plus => ArithOp::Add,
                Tok::Minus => ArithOp::Sub,
                _ => return Ok(left),
            };
            left = self.parse_arith_rest(left, op, Self::parse_product)?;
        }
    }

    fn parse_product(&mut self) -> Result<Node, SelectorError> {
        let mut left = self.parse_unary()?;
        loop {
            let op = match self.peek().tok {
                Tok::Star => ArithOp::Mul,
                Tok::Slash => ArithOp::Div,
                _ => return Ok(left),
            };
            left = self.parse_arith_rest(left, op, Self::parse_unary)?;
        }
    }

    /// `left op right`, with the parser at `op`.
    fn parse_arith_rest(
        &mut self,
        left: Node,
        op: ArithOp,
        operand: fn(&mut Self) -> Result<Node, SelectorError>,
    ) -> Result<Node, SelectorError> {
        let op_tok = self.bump();
        self.expect_num(&left)?;
        let right = operand(self)?;
        self.expect_num(&right)?;
        let start = left.start;
        self.node(
            Expr::Arith(op, Box::new(left.expr), Box::new(right.expr)),
            Kind::Num,
            start,
            &[left.height, right.height],
            op_tok.start,
        )
    }

    fn parse_unary(&mut self) -> Result<Node, SelectorError> {
        let negative = match self.peek().tok {
            Tok::Minus => true,
            Tok::Plus => false,
            _ => return self.parse_primary(),
        };
        let sign = self.bump();
        if negative {
            if let Tok::Long(v) = self.peek().tok {
                // `-9223372036854775808` is a literal, though its magnitude is not.
                let number = self.bump();
                let n = self
                    .long_literal(v, true, number.start)?
                    .expect("a negated magnitude up to 2^63 fits in i64");
                return self.node(
                    Expr::Literal(Lit::Num(n)),
                    Kind::Num,
                    sign.start,
                    &[],
                    sign.start,
                );
            }
        }
        self.enter(sign.start)?;
        let operand = self.parse_unary()?;
        self.leave();
        self.expect_num(&operand)?;
        let expr = match (negative, operand.expr) {
            (true, Expr::Literal(Lit::Num(Num::Double(d)))) => {
                Expr::Literal(Lit::Num(Num::Double(-d)))
            }
            (true, Expr::Literal(Lit::Num(Num::Long(v)))) if v != i64::MIN => {
                Expr::Literal(Lit::Num(Num::Long(-v)))
            }
            (true, e) => Expr::Neg(Box::new(e)),
            (false, e @ Expr::Literal(Lit::Num(_))) => e,
            (false, e) => Expr::Plus(Box::new(e)),
        };
        let children = if matches!(expr, Expr::Literal(_)) {
            vec![]
        } else {
            vec![operand.height]
        };
        self.node(expr, Kind::Num, sign.start, &children, sign.start)
    }

    fn parse_primary(&mut self) -> Result<Node, SelectorError> {
        let t = self.bump();
        let leaf = |expr, kind| self.node(expr, kind, t.start, &[], t.start);
        match t.tok {
            Tok::Ident(ref name) => leaf(Expr::Ident(name.as_str().into()), Kind::Any),
            Tok::Str(ref s) => leaf(Expr::Literal(Lit::Str(s.as_str().into())), Kind::Str),
            Tok::Long(v) => {
                let n = self
                    .long_literal(v, false, t.start)?
                    .expect("long_literal returns a number or an error");
                leaf(Expr::Literal(Lit::Num(n)), Kind::Num)
            }
            Tok::Double(d) => leaf(Expr::Literal(Lit::Num(Num::Double(d))), Kind::Num),
            Tok::Kw(Kw::True) => leaf(Expr::Literal(Lit::Bool(true)), Kind::Bool),
            Tok::Kw(Kw::False) => leaf(Expr::Literal(Lit::Bool(false)), Kind::Bool),
            Tok::LParen => {
                self.enter(t.start)?;
                let inner = self.parse_or()?;
                self.leave();
                let close = self.bump();
                if close.tok != Tok::RParen {
                    let opened_at = self.text[..t.start].chars().count();
                    let msg = format!(
                        "expected ')' to close the '(' at position {opened_at}, found {}",
                        close.tok.describe()
                    );
                    return Err(self.error(close.start, msg));
                }
                Ok(Node {
                    start: t.start,
                    ..inner
                })
            }
            Tok::Kw(Kw::Null) => Err(self.error(
                t.start,
                "NULL can only be tested with IS NULL or IS NOT NULL",
            )),
            _ => {
                let msg = format!("expected an expression, found {}", t.tok.describe());
                Err(self.error(t.start, msg))
            }
        }
    }
}

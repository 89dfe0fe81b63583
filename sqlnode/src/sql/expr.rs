//! Bound expressions: column references are positions in the input row, aggregates are
//! positions in the aggregate results, session values were resolved at bind time. References to
//! an enclosing query's row (correlated subqueries) are [`Expr::Outer`], resolved through the
//! [`Outer`] chain at evaluation. Evaluation is pure (subqueries run over rows fetched before
//! the statement is evaluated) and never panics.

use std::sync::Arc;

use crate::error::{code, SqlError, SqlResult};
use crate::sql::subquery::SubPlan;
use crate::types::{parse_datetime, IntKind, WireType};
use crate::val::{arith, compare, like, ArithOp, Dec, Val};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `<=>`: equality that treats NULL as a value.
    NullSafeEq,
}

impl Cmp {
    /// The operator with its operands swapped (`a < b` ⇔ `b > a`).
    pub fn flip(self) -> Cmp {
        match self {
            Cmp::Lt => Cmp::Gt,
            Cmp::Le => Cmp::Ge,
            Cmp::Gt => Cmp::Lt,
            Cmp::Ge => Cmp::Le,
            other => other,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CastTo {
    Signed,
    Unsigned,
    Char,
    Binary,
    Double,
    Decimal { s: u8 },
    Date,
    Datetime,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Coalesce,
    IfNull,
    NullIf,
    If,
    Concat,
    ConcatWs,
    Length,
    CharLength,
    Upper,
    Lower,
    Abs,
    Round,
    Floor,
    Ceil,
    Mod,
    Substring,
    Trim,
    LTrim,
    RTrim,
    Left,
    Right,
    Replace,
    Greatest,
    Least,
    Sign,
    Hex,
    /// Math, string and date functions of [`crate::sql::func`].
    Lib(crate::sql::func::LibFn),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggKind {
    CountStar,
    Count,
    Sum,
    Min,
    Max,
    Avg,
    GroupConcat,
}

/// Longest GROUP_CONCAT result in bytes (MySQL's default `group_concat_max_len`; longer results
/// are cut, as MySQL does).
pub const GROUP_CONCAT_MAX_LEN: usize = 1024;

/// The rows of the enclosing queries while a subquery runs: `row` is the current row of the
/// query directly around it, `up` the chain further out.
#[derive(Clone, Copy, Debug)]
pub struct Outer<'a> {
    pub row: &'a [Val],
    pub up: Option<&'a Outer<'a>>,
}

impl<'a> Outer<'a> {
    /// The row `levels` queries out (1 = the enclosing query).
    fn at(&self, levels: usize) -> Option<&'a [Val]> {
        let mut o = *self;
        for _ in 1..levels {
            o = *o.up?;
        }
        Some(o.row)
    }
}

/// How a subquery's rows become a value.
#[derive(Clone, Debug)]
pub enum SubKind {
    /// `(SELECT x ...)`: NULL for no row, an error for more than one.
    Scalar,
    /// `EXISTS (SELECT ...)`.
    Exists,
    /// `x IN (SELECT ...)` (NOT IN is NOT over it: the same three-valued result, negated).
    In(Box<Expr>),
    /// `x <op> ANY|ALL (SELECT ...)`: (x, op, all).
    Quantified(Box<Expr>, Cmp, bool),
}

/// A subquery inside an expression. Plans compare by identity.
#[derive(Clone, Debug)]
pub struct Sub {
    pub plan: Arc<SubPlan>,
    pub kind: SubKind,
}

impl PartialEq for Sub {
    fn eq(&self, other: &Sub) -> bool {
        Arc::ptr_eq(&self.plan, &other.plan)
    }
}

/// One aggregate of a grouped query.
#[derive(Clone, Debug, PartialEq)]
pub struct AggSpec {
    pub kind: AggKind,
    pub arg: Option<Expr>,
    pub distinct: bool,
    /// GROUP_CONCAT: ORDER BY keys (expression, ascending) and the separator.
    pub order: Vec<(Expr, bool)>,
    pub separator: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Lit(Val),
    Col(usize),
    /// A column of an enclosing query's row: (levels out, 1 = the enclosing query; position).
    Outer(usize, usize),
    Agg(usize),
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Arith(ArithOp, Box<Expr>, Box<Expr>),
    Cmp(Cmp, Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Xor(Box<Expr>, Box<Expr>),
    IsNull(Box<Expr>, bool),
    /// `x IS [NOT] TRUE/FALSE`: (expr, wanted truth, negated).
    IsBool(Box<Expr>, bool, bool),
    InList(Box<Expr>, Vec<Expr>, bool),
    Between(Box<Expr>, Box<Expr>, Box<Expr>, bool),
    /// (text, pattern, escape, negated, case-insensitive)
    Like(Box<Expr>, Box<Expr>, char, bool, bool),
    Case {
        operand: Option<Box<Expr>>,
        whens: Vec<(Expr, Expr)>,
        otherwise: Option<Box<Expr>>,
    },
    Func(Func, Vec<Expr>),
    Cast(Box<Expr>, CastTo),
    Subquery(Sub),
    /// A window function of the SELECT list, by position in the plan's windows. The planner
    /// turns it into an [`Expr::Agg`] past the aggregates, where its value is at run time.
    Window(usize),
}

fn range_err(msg: String) -> SqlError {
    SqlError::new(code::DATA_OUT_OF_RANGE, msg)
}

fn b(e: Expr) -> Box<Expr> {
    Box::new(e)
}

impl Expr {
    pub fn and(a: Expr, c: Expr) -> Expr {
        Expr::And(b(a), b(c))
    }

    /// Splits an AND tree into its conjuncts.
    pub fn conjuncts(&self) -> Vec<&Expr> {
        match self {
            Expr::And(a, c) => {
                let mut v = a.conjuncts();
                v.extend(c.conjuncts());
                v
            }
            other => vec![other],
        }
    }

    pub fn has_agg(&self) -> bool {
        let mut found = false;
        self.walk(&mut |e| found |= matches!(e, Expr::Agg(_)));
        found
    }

    /// Visits every node.
    pub fn walk(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Lit(_) | Expr::Col(_) | Expr::Agg(_) | Expr::Outer(..) | Expr::Window(_) => {}
            // The subquery's own expressions belong to its scope; only its operand is ours.
            Expr::Subquery(sub) => match &sub.kind {
                SubKind::In(x) | SubKind::Quantified(x, ..) => x.walk(f),
                SubKind::Scalar | SubKind::Exists => {}
            },
            Expr::Neg(a) | Expr::Not(a) | Expr::IsNull(a, _) | Expr::IsBool(a, _, _) | Expr::Cast(a, _) => a.walk(f),
            Expr::Arith(_, a, c) | Expr::Cmp(_, a, c) | Expr::And(a, c) | Expr::Or(a, c) | Expr::Xor(a, c) => {
                a.walk(f);
                c.walk(f);
            }
            Expr::InList(a, l, _) => {
                a.walk(f);
                l.iter().for_each(|e| e.walk(f));
            }
            Expr::Between(a, l, h, _) => {
                a.walk(f);
                l.walk(f);
                h.walk(f);
            }
            Expr::Like(a, p, ..) => {
                a.walk(f);
                p.walk(f);
            }
            Expr::Case { operand, whens, otherwise } => {
                if let Some(o) = operand {
                    o.walk(f);
                }
                for (w, t) in whens {
                    w.walk(f);
                    t.walk(f);
                }
                if let Some(o) = otherwise {
                    o.walk(f);
                }
            }
            Expr::Func(_, args) => args.iter().for_each(|e| e.walk(f)),
        }
    }

    /// Visits every node mutably (not into subqueries' own plans).
    pub fn walk_mut(&mut self, f: &mut dyn FnMut(&mut Expr)) {
        f(self);
        match self {
            Expr::Lit(_) | Expr::Col(_) | Expr::Agg(_) | Expr::Outer(..) | Expr::Window(_) => {}
            Expr::Subquery(sub) => match &mut sub.kind {
                SubKind::In(x) | SubKind::Quantified(x, ..) => x.walk_mut(f),
                SubKind::Scalar | SubKind::Exists => {}
            },
            Expr::Neg(a) | Expr::Not(a) | Expr::IsNull(a, _) | Expr::IsBool(a, _, _) | Expr::Cast(a, _) => {
                a.walk_mut(f)
            }
            Expr::Arith(_, a, c) | Expr::Cmp(_, a, c) | Expr::And(a, c) | Expr::Or(a, c) | Expr::Xor(a, c) => {
                a.walk_mut(f);
                c.walk_mut(f);
            }
            Expr::InList(a, l, _) => {
                a.walk_mut(f);
                l.iter_mut().for_each(|e| e.walk_mut(f));
            }
            Expr::Between(a, l, h, _) => {
                a.walk_mut(f);
                l.walk_mut(f);
                h.walk_mut(f);
            }
            Expr::Like(a, p, ..) => {
                a.walk_mut(f);
                p.walk_mut(f);
            }
            Expr::Case { operand, whens, otherwise } => {
                if let Some(o) = operand {
                    o.walk_mut(f);
                }
                for (w, t) in whens {
                    w.walk_mut(f);
                    t.walk_mut(f);
                }
                if let Some(o) = otherwise {
                    o.walk_mut(f);
                }
            }
            Expr::Func(_, args) => args.iter_mut().for_each(|e| e.walk_mut(f)),
        }
    }

    /// Evaluates against an input row and the current aggregate results (no enclosing query).
    pub fn eval(&self, row: &[Val], aggs: &[Val]) -> SqlResult<Val> {
        self.eval_in(row, aggs, None)
    }

    /// Evaluates against an input row, the current aggregate results and the rows of the
    /// enclosing queries.
    pub fn eval_in(&self, row: &[Val], aggs: &[Val], outer: Option<&Outer<'_>>) -> SqlResult<Val> {
        Ok(match self {
            Expr::Lit(v) => v.clone(),
            Expr::Col(i) => row.get(*i).cloned().unwrap_or(Val::Null),
            Expr::Outer(levels, i) => {
                outer.and_then(|o| o.at(*levels)).and_then(|r| r.get(*i)).cloned().unwrap_or(Val::Null)
            }
            Expr::Subquery(sub) => crate::sql::subquery::eval(sub, row, aggs, outer)?,
            Expr::Window(_) => return Err(SqlError::internal("a window function outside a SELECT list")),
            Expr::Agg(i) => aggs.get(*i).cloned().unwrap_or(Val::Null),
            Expr::Neg(a) => match a.eval_in(row, aggs, outer)? {
                Val::Null => Val::Null,
                Val::Int(i) => Val::Int(
                    i.checked_neg().ok_or_else(|| range_err(format!("BIGINT value is out of range in '-({i})'")))?,
                ),
                Val::UInt(u) => {
                    let n = -i128::from(u);
                    Val::Int(
                        i64::try_from(n).map_err(|_| range_err(format!("BIGINT value is out of range in '-({u})'")))?,
                    )
                }
                Val::Dec(d) => Val::Dec(Dec::new(-d.m, d.s)),
                other => Val::Float(-other.to_f64().unwrap_or(0.0)),
            },
            Expr::Not(a) => match a.eval_in(row, aggs, outer)?.truth() {
                None => Val::Null,
                Some(t) => Val::bool(!t),
            },
            Expr::Arith(op, a, c) => {
                let (x, y) = (a.eval_in(row, aggs, outer)?, c.eval_in(row, aggs, outer)?);
                arith(*op, &x, &y).map_err(range_err)?
            }
            Expr::Cmp(op, a, c) => {
                let (x, y) = (a.eval_in(row, aggs, outer)?, c.eval_in(row, aggs, outer)?);
                cmp_vals(*op, &x, &y)
            }
            Expr::And(a, c) => {
                let x = a.eval_in(row, aggs, outer)?.truth();
                if x == Some(false) {
                    return Ok(Val::bool(false));
                }
                match (x, c.eval_in(row, aggs, outer)?.truth()) {
                    (_, Some(false)) => Val::bool(false),
                    (Some(true), Some(true)) => Val::bool(true),
                    _ => Val::Null,
                }
            }
            Expr::Or(a, c) => {
                let x = a.eval_in(row, aggs, outer)?.truth();
                if x == Some(true) {
                    return Ok(Val::bool(true));
                }
                match (x, c.eval_in(row, aggs, outer)?.truth()) {
                    (_, Some(true)) => Val::bool(true),
                    (Some(false), Some(false)) => Val::bool(false),
                    _ => Val::Null,
                }
            }
            Expr::Xor(a, c) => match (a.eval_in(row, aggs, outer)?.truth(), c.eval_in(row, aggs, outer)?.truth()) {
                (Some(x), Some(y)) => Val::bool(x != y),
                _ => Val::Null,
            },
            Expr::IsNull(a, neg) => Val::bool(a.eval_in(row, aggs, outer)?.is_null() != *neg),
            Expr::IsBool(a, want, neg) => Val::bool((a.eval_in(row, aggs, outer)?.truth() == Some(*want)) != *neg),
            Expr::InList(a, list, neg) => {
                let x = a.eval_in(row, aggs, outer)?;
                if x.is_null() {
                    return Ok(Val::Null);
                }
                let mut saw_null = false;
                for e in list {
                    let y = e.eval_in(row, aggs, outer)?;
                    match compare(&x, &y) {
                        Some(std::cmp::Ordering::Equal) => return Ok(Val::bool(!*neg)),
                        None => saw_null = true,
                        _ => {}
                    }
                }
                if saw_null {
                    Val::Null
                } else {
                    Val::bool(*neg)
                }
            }
            Expr::Between(a, lo, hi, neg) => {
                let x = a.eval_in(row, aggs, outer)?;
                let ge = cmp_vals(Cmp::Ge, &x, &lo.eval_in(row, aggs, outer)?).truth();
                let le = cmp_vals(Cmp::Le, &x, &hi.eval_in(row, aggs, outer)?).truth();
                let r = match (ge, le) {
                    (Some(false), _) | (_, Some(false)) => Some(false),
                    (Some(true), Some(true)) => Some(true),
                    _ => None,
                };
                match r {
                    None => Val::Null,
                    Some(t) => Val::bool(t != *neg),
                }
            }
            Expr::Like(a, p, esc, neg, ci) => {
                let (x, y) = (a.eval_in(row, aggs, outer)?, p.eval_in(row, aggs, outer)?);
                match (x.to_string_lossy(), y.to_string_lossy()) {
                    (Some(t), Some(p)) => {
                        let m = if *ci { like(&t.to_lowercase(), &p.to_lowercase(), *esc) } else { like(&t, &p, *esc) };
                        Val::bool(m != *neg)
                    }
                    _ => Val::Null,
                }
            }
            Expr::Case { operand, whens, otherwise } => {
                let op = match operand {
                    Some(o) => Some(o.eval_in(row, aggs, outer)?),
                    None => None,
                };
                for (w, t) in whens {
                    let wv = w.eval_in(row, aggs, outer)?;
                    let hit = match &op {
                        Some(o) => compare(o, &wv) == Some(std::cmp::Ordering::Equal),
                        None => wv.truth() == Some(true),
                    };
                    if hit {
                        return t.eval_in(row, aggs, outer);
                    }
                }
                match otherwise {
                    Some(o) => o.eval_in(row, aggs, outer)?,
                    None => Val::Null,
                }
            }
            Expr::Func(f, args) => {
                let mut vals = Vec::with_capacity(args.len());
                // IF and COALESCE-like functions evaluate lazily in MySQL; eager evaluation is
                // only observable through errors, which are rare in these arguments.
                for a in args {
                    vals.push(a.eval_in(row, aggs, outer)?);
                }
                call(*f, vals)?
            }
            Expr::Cast(a, to) => cast(a.eval_in(row, aggs, outer)?, *to)?,
        })
    }

    /// The result type when it is known statically (column metadata before any row is seen,
    /// and the type of a column whose values are all NULL). MySQL's rules for the common cases:
    /// integer arithmetic stays BIGINT, anything with a DECIMAL is DECIMAL (division adds
    /// `div_precision_increment` digits), anything with a float or a string is DOUBLE; SUM of
    /// exact numbers is DECIMAL, AVG adds four digits. None when unsure: the server then types
    /// the column from its values.
    pub fn wire_type(&self, cols: &[Option<WireType>], aggs: &[AggSpec]) -> Option<WireType> {
        let bigint = WireType::Int { kind: IntKind::Big, unsigned: false, width: None };
        let text = WireType::Str { len: 255 };
        let ty = |e: &Expr| e.wire_type(cols, aggs);
        match self {
            Expr::Col(i) => cols.get(*i).copied().flatten(),
            Expr::Outer(..) | Expr::Window(_) => None,
            Expr::Subquery(Sub { kind: SubKind::Scalar, plan }) => plan.plan.columns.first().and_then(|c| c.ty),
            Expr::Subquery(_) => Some(bigint),
            Expr::Lit(v) => Some(WireType::of_val(v)),
            Expr::Cmp(..)
            | Expr::And(..)
            | Expr::Or(..)
            | Expr::Xor(..)
            | Expr::Not(_)
            | Expr::IsNull(..)
            | Expr::IsBool(..)
            | Expr::InList(..)
            | Expr::Between(..)
            | Expr::Like(..) => Some(bigint),
            Expr::Neg(a) => match ty(a)? {
                WireType::Int { .. } => Some(bigint),
                t @ (WireType::Decimal { .. } | WireType::Double | WireType::Float) => Some(t),
                _ => Some(WireType::Double),
            },
            Expr::Arith(op, a, b) => arith_type(*op, ty(a)?, ty(b)?),
            Expr::Agg(i) => {
                let spec = aggs.get(*i)?;
                let arg = spec.arg.as_ref().and_then(ty);
                match spec.kind {
                    AggKind::Count | AggKind::CountStar => Some(bigint),
                    AggKind::GroupConcat => Some(WireType::Str { len: GROUP_CONCAT_MAX_LEN as u32 }),
                    AggKind::Min | AggKind::Max => arg,
                    AggKind::Sum => match num_kind(arg?)? {
                        NumKind::Int => Some(WireType::Decimal { p: 65, s: 0 }),
                        NumKind::Dec(s) => Some(WireType::Decimal { p: 65, s }),
                        NumKind::Float => Some(WireType::Double),
                    },
                    AggKind::Avg => match num_kind(arg?)? {
                        NumKind::Int => Some(WireType::Decimal { p: 65, s: DIV_SCALE }),
                        NumKind::Dec(s) => Some(WireType::Decimal { p: 65, s: (s + DIV_SCALE).min(30) }),
                        NumKind::Float => Some(WireType::Double),
                    },
                }
            }
            Expr::Cast(_, to) => Some(match to {
                CastTo::Signed => bigint,
                CastTo::Unsigned => WireType::Int { kind: IntKind::Big, unsigned: true, width: None },
                CastTo::Char => text,
                CastTo::Binary => WireType::Bytes { len: 255 },
                CastTo::Double => WireType::Double,
                CastTo::Decimal { s } => WireType::Decimal { p: 65, s: *s },
                CastTo::Date => WireType::Date,
                CastTo::Datetime => WireType::Datetime { fsp: 0, timestamp: false },
            }),
            Expr::Case { whens, otherwise, .. } => {
                same_type(whens.iter().map(|(_, t)| t).chain(otherwise.as_deref()).map(|e| (e, ty(e))))
            }
            Expr::Func(f, args) => match f {
                Func::Concat
                | Func::ConcatWs
                | Func::Upper
                | Func::Lower
                | Func::Hex
                | Func::Substring
                | Func::Trim
                | Func::LTrim
                | Func::RTrim
                | Func::Left
                | Func::Right
                | Func::Replace => Some(text),
                Func::Length | Func::CharLength | Func::Sign => Some(bigint),
                Func::Coalesce | Func::IfNull | Func::Greatest | Func::Least => {
                    same_type(args.iter().map(|e| (e, ty(e))))
                }
                Func::If => same_type(args.iter().skip(1).map(|e| (e, ty(e)))),
                Func::NullIf => ty(args.first()?),
                Func::Abs => match ty(args.first()?)? {
                    t @ (WireType::Int { .. } | WireType::Decimal { .. } | WireType::Double | WireType::Float) => {
                        Some(t)
                    }
                    _ => Some(WireType::Double),
                },
                Func::Floor | Func::Ceil => match num_kind(ty(args.first()?)?)? {
                    NumKind::Float => Some(WireType::Double),
                    _ => Some(bigint),
                },
                Func::Round => match num_kind(ty(args.first()?)?)? {
                    NumKind::Float => Some(WireType::Double),
                    NumKind::Int => Some(bigint),
                    NumKind::Dec(_) => None,
                },
                Func::Mod => arith_type(ArithOp::Mod, ty(args.first()?)?, ty(args.get(1)?)?),
                Func::Lib(lf) => crate::sql::func::result_type(*lf),
            },
        }
    }
}

/// Digits AVG and `/` add to their operand's (MySQL's `div_precision_increment`).
const DIV_SCALE: u8 = crate::val::DIV_PRECISION_INCREMENT;

#[derive(Clone, Copy)]
enum NumKind {
    Int,
    Dec(u8),
    Float,
}

/// How a column of this type computes: as an integer, an exact decimal of some scale, or a
/// double (strings and dates are read as numbers, so as doubles).
fn num_kind(t: WireType) -> Option<NumKind> {
    Some(match t {
        WireType::Int { .. } => NumKind::Int,
        WireType::Decimal { s, .. } => NumKind::Dec(s),
        WireType::Null => return None,
        _ => NumKind::Float,
    })
}

fn arith_type(op: ArithOp, a: WireType, b: WireType) -> Option<WireType> {
    let bigint = WireType::Int { kind: IntKind::Big, unsigned: false, width: None };
    let dec = |s: u8| Some(WireType::Decimal { p: 65, s: s.min(30) });
    Some(match (num_kind(a)?, num_kind(b)?) {
        (NumKind::Float, _) | (_, NumKind::Float) => match op {
            ArithOp::IntDiv => bigint,
            _ => WireType::Double,
        },
        (x, y) => {
            let scale = |k: NumKind| if let NumKind::Dec(s) = k { s } else { 0 };
            let (sx, sy) = (scale(x), scale(y));
            match op {
                ArithOp::IntDiv => bigint,
                ArithOp::Div => return dec(sx + DIV_SCALE),
                _ if matches!((x, y), (NumKind::Int, NumKind::Int)) => {
                    let unsigned = matches!(a, WireType::Int { unsigned: true, .. })
                        || matches!(b, WireType::Int { unsigned: true, .. });
                    // Unsigned results may come back signed (MySQL would refuse them): leave it
                    // to the values.
                    if unsigned {
                        return None;
                    }
                    bigint
                }
                ArithOp::Mul => return dec(sx + sy),
                _ => return dec(sx.max(sy)),
            }
        }
    })
}

/// The type all these branches share, ignoring NULL literals; None when they differ.
fn same_type<'e>(branches: impl Iterator<Item = (&'e Expr, Option<WireType>)>) -> Option<WireType> {
    let mut out: Option<WireType> = None;
    for (e, t) in branches {
        if matches!(e, Expr::Lit(Val::Null)) {
            continue;
        }
        let t = t?;
        match out {
            None => out = Some(t),
            Some(o) if o == t => {}
            Some(WireType::Int { .. }) if matches!(t, WireType::Int { .. }) => {
                out = Some(WireType::Int { kind: IntKind::Big, unsigned: false, width: None })
            }
            Some(_) => return None,
        }
    }
    out
}

fn cmp_vals(op: Cmp, x: &Val, y: &Val) -> Val {
    use std::cmp::Ordering::*;
    if op == Cmp::NullSafeEq {
        return Val::bool(match (x.is_null(), y.is_null()) {
            (true, true) => true,
            (false, false) => compare(x, y) == Some(Equal),
            _ => false,
        });
    }
    match compare(x, y) {
        None => Val::Null,
        Some(o) => Val::bool(match op {
            Cmp::Eq => o == Equal,
            Cmp::Ne => o != Equal,
            Cmp::Lt => o == Less,
            Cmp::Le => o != Greater,
            Cmp::Gt => o == Greater,
            Cmp::Ge => o != Less,
            Cmp::NullSafeEq => unreachable!("handled above"),
        }),
    }
}

fn text(v: &Val) -> Option<String> {
    v.to_string_lossy()
}

fn int_arg(v: &Val) -> Option<i64> {
    v.to_i64()
}

/// Calls a scalar function on evaluated arguments (arity was checked by the binder).
pub fn call(f: Func, a: Vec<Val>) -> SqlResult<Val> {
    let arg = |i: usize| a.get(i).cloned().unwrap_or(Val::Null);
    let any_null = a.iter().any(Val::is_null);
    Ok(match f {
        Func::Coalesce => a.into_iter().find(|v| !v.is_null()).unwrap_or(Val::Null),
        Func::IfNull => {
            if arg(0).is_null() {
                arg(1)
            } else {
                arg(0)
            }
        }
        Func::NullIf => {
            if compare(&arg(0), &arg(1)) == Some(std::cmp::Ordering::Equal) {
                Val::Null
            } else {
                arg(0)
            }
        }
        Func::If => {
            if arg(0).truth() == Some(true) {
                arg(1)
            } else {
                arg(2)
            }
        }
        Func::Concat => {
            if any_null {
                return Ok(Val::Null);
            }
            let mut bytes = vec![];
            let mut binary = false;
            for v in &a {
                binary |= matches!(v, Val::Bytes(_));
                bytes.extend(v.to_text().unwrap_or_default());
            }
            bytes_or_str(bytes, binary)
        }
        Func::ConcatWs => {
            let Some(sep) = text(&arg(0)) else { return Ok(Val::Null) };
            let parts: Vec<String> = a[1..].iter().filter_map(text).collect();
            Val::Str(parts.join(&sep))
        }
        Func::Length => match arg(0) {
            Val::Null => Val::Null,
            v => Val::Int(v.to_text().map_or(0, |t| t.len()) as i64),
        },
        Func::CharLength => match arg(0) {
            Val::Null => Val::Null,
            Val::Bytes(b) => Val::Int(b.len() as i64),
            v => Val::Int(text(&v).map_or(0, |t| t.chars().count()) as i64),
        },
        Func::Upper => map_text(arg(0), |s| s.to_uppercase()),
        Func::Lower => map_text(arg(0), |s| s.to_lowercase()),
        Func::Trim => map_text(arg(0), |s| s.trim_matches(' ').to_string()),
        Func::LTrim => map_text(arg(0), |s| s.trim_start_matches(' ').to_string()),
        Func::RTrim => map_text(arg(0), |s| s.trim_end_matches(' ').to_string()),
        Func::Abs => match arg(0) {
            Val::Null => Val::Null,
            Val::Int(i) => {
                Val::Int(i.checked_abs().ok_or_else(|| range_err("BIGINT value is out of range in 'abs'".into()))?)
            }
            Val::UInt(u) => Val::UInt(u),
            Val::Dec(d) => Val::Dec(Dec::new(d.m.abs(), d.s)),
            v => Val::Float(v.to_f64().unwrap_or(0.0).abs()),
        },
        Func::Sign => match arg(0) {
            Val::Null => Val::Null,
            v => Val::Int(match v.to_f64().unwrap_or(0.0) {
                x if x > 0.0 => 1,
                x if x < 0.0 => -1,
                _ => 0,
            }),
        },
        Func::Round => {
            let places = if a.len() > 1 { int_arg(&arg(1)).unwrap_or(0) } else { 0 };
            match arg(0) {
                Val::Null => Val::Null,
                v @ (Val::Int(_) | Val::UInt(_)) if places >= 0 => v,
                Val::Int(_) | Val::UInt(_) | Val::Dec(_) => {
                    let d = arg(0).to_dec().unwrap_or(Dec::new(0, 0));
                    let p = places.clamp(0, 30) as u8;
                    let r = d.rescale(p.min(d.s)).ok_or_else(|| range_err("value out of range in ROUND".into()))?;
                    Val::Dec(r)
                }
                v => {
                    let f = v.to_f64().unwrap_or(0.0);
                    let m = 10f64.powi(places.clamp(-30, 30) as i32);
                    Val::Float((f * m).round() / m)
                }
            }
        }
        Func::Floor | Func::Ceil => match arg(0) {
            Val::Null => Val::Null,
            v @ (Val::Int(_) | Val::UInt(_)) => v,
            Val::Dec(d) => {
                let p = 10i128.checked_pow(u32::from(d.s)).unwrap_or(1);
                let q = if f == Func::Floor { d.m.div_euclid(p) } else { -(-d.m).div_euclid(p) };
                Val::Int(i64::try_from(q).map_err(|_| range_err("value out of range".into()))?)
            }
            v => {
                let x = v.to_f64().unwrap_or(0.0);
                Val::Float(if f == Func::Floor { x.floor() } else { x.ceil() })
            }
        },
        Func::Mod => arith(ArithOp::Mod, &arg(0), &arg(1)).map_err(range_err)?,
        Func::Substring => {
            if any_null {
                return Ok(Val::Null);
            }
            let s: Vec<char> = text(&arg(0)).unwrap_or_default().chars().collect();
            let pos = int_arg(&arg(1)).unwrap_or(0);
            let len = if a.len() > 2 { int_arg(&arg(2)).unwrap_or(0) } else { i64::MAX };
            let n = s.len() as i64;
            let start = if pos > 0 {
                pos - 1
            } else if pos < 0 {
                n + pos
            } else {
                return Ok(Val::Str(String::new()));
            };
            if start < 0 || start >= n || len <= 0 {
                return Ok(Val::Str(String::new()));
            }
            let end = start.saturating_add(len).min(n);
            Val::Str(s[start as usize..end as usize].iter().collect())
        }
        Func::Left | Func::Right => {
            if any_null {
                return Ok(Val::Null);
            }
            let s: Vec<char> = text(&arg(0)).unwrap_or_default().chars().collect();
            let n = int_arg(&arg(1)).unwrap_or(0).clamp(0, s.len() as i64) as usize;
            Val::Str(if f == Func::Left { s[..n].iter().collect() } else { s[s.len() - n..].iter().collect() })
        }
        Func::Replace => {
            if any_null {
                return Ok(Val::Null);
            }
            let (s, from, to) = (
                text(&arg(0)).unwrap_or_default(),
                text(&arg(1)).unwrap_or_default(),
                text(&arg(2)).unwrap_or_default(),
            );
            Val::Str(if from.is_empty() { s } else { s.replace(&from, &to) })
        }
        Func::Greatest | Func::Least => {
            if any_null {
                return Ok(Val::Null);
            }
            let mut it = a.into_iter();
            let mut best = it.next().unwrap_or(Val::Null);
            for v in it {
                let o = compare(&v, &best);
                let better = if f == Func::Greatest {
                    o == Some(std::cmp::Ordering::Greater)
                } else {
                    o == Some(std::cmp::Ordering::Less)
                };
                if better {
                    best = v;
                }
            }
            best
        }
        Func::Lib(lf) => crate::sql::func::call(lf, &a)?,
        Func::Hex => match arg(0) {
            Val::Null => Val::Null,
            Val::Int(i) if i >= 0 => Val::Str(format!("{i:X}")),
            Val::UInt(u) => Val::Str(format!("{u:X}")),
            v => Val::Str(v.to_text().unwrap_or_default().iter().map(|b| format!("{b:02X}")).collect()),
        },
    })
}

fn map_text(v: Val, f: impl Fn(&str) -> String) -> Val {
    match v {
        Val::Null => Val::Null,
        Val::Bytes(b) => Val::Bytes(f(&String::from_utf8_lossy(&b)).into_bytes()),
        v => Val::Str(f(&text(&v).unwrap_or_default())),
    }
}

fn bytes_or_str(bytes: Vec<u8>, binary: bool) -> Val {
    if binary {
        return Val::Bytes(bytes);
    }
    match String::from_utf8(bytes) {
        Ok(s) => Val::Str(s),
        Err(e) => Val::Bytes(e.into_bytes()),
    }
}

/// CAST(v AS type).
pub fn cast(v: Val, to: CastTo) -> SqlResult<Val> {
    if v.is_null() {
        return Ok(Val::Null);
    }
    Ok(match to {
        CastTo::Signed => match &v {
            Val::Int(_) => v,
            Val::UInt(u) => Val::Int(*u as i64),
            Val::Str(s) => {
                Val::Int(crate::val::parse_num_prefix(s).trunc().clamp(i64::MIN as f64, i64::MAX as f64) as i64)
            }
            other => Val::Int(other.to_i64().unwrap_or(0)),
        },
        CastTo::Unsigned => match &v {
            Val::UInt(_) => v,
            Val::Int(i) => Val::UInt(*i as u64),
            other => Val::UInt(other.to_i64().unwrap_or(0) as u64),
        },
        CastTo::Char => Val::Str(v.to_string_lossy().unwrap_or_default()),
        CastTo::Binary => Val::Bytes(v.to_text().unwrap_or_default()),
        CastTo::Double => Val::Float(v.to_f64().unwrap_or(0.0)),
        CastTo::Decimal { s } => {
            let d = match &v {
                Val::Float(f) => Dec::from_f64(*f, s),
                Val::Str(t) => Dec::parse(t).or_else(|| Dec::from_f64(crate::val::parse_num_prefix(t), s)),
                other => other.to_dec(),
            };
            Val::Dec(d.and_then(|d| d.rescale(s)).ok_or_else(|| range_err("value out of range in CAST".into()))?)
        }
        CastTo::Date => match parse_datetime(&v.to_string_lossy().unwrap_or_default()) {
            Some(dt) => Val::Str(dt.date_string()),
            None => Val::Null,
        },
        CastTo::Datetime => match parse_datetime(&v.to_string_lossy().unwrap_or_default()) {
            Some(dt) => Val::Str(dt.datetime_string(0)),
            None => Val::Null,
        },
    })
}

/// Running state of one aggregate over one group.
#[derive(Clone, Debug)]
pub enum Acc {
    Count(i64),
    /// Exact sum of integers/decimals, or a float sum once a float is seen; and the count.
    Sum {
        exact: Option<Dec>,
        float: Option<f64>,
        n: i64,
    },
    MinMax(Val),
    /// GROUP_CONCAT: (ORDER BY keys, text) of every non-NULL value.
    Concat(Vec<(Vec<Val>, Vec<u8>)>),
}

impl Acc {
    pub fn new(kind: AggKind) -> Acc {
        match kind {
            AggKind::Count | AggKind::CountStar => Acc::Count(0),
            AggKind::Sum | AggKind::Avg => Acc::Sum { exact: None, float: None, n: 0 },
            AggKind::Min | AggKind::Max => Acc::MinMax(Val::Null),
            AggKind::GroupConcat => Acc::Concat(vec![]),
        }
    }

    /// Adds one GROUP_CONCAT value with its ORDER BY keys.
    pub fn add_keyed(&mut self, v: Val, keys: Vec<Val>) {
        if let (Acc::Concat(items), Some(t)) = (self, v.to_text()) {
            items.push((keys, t));
        }
    }

    /// Adds one input value (already evaluated; `None` for COUNT(*)).
    pub fn add(&mut self, kind: AggKind, v: Option<Val>) -> SqlResult<()> {
        match self {
            Acc::Count(n) => {
                if kind == AggKind::CountStar || v.as_ref().is_some_and(|v| !v.is_null()) {
                    *n += 1;
                }
            }
            Acc::Sum { exact, float, n } => {
                let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(()) };
                *n += 1;
                if float.is_none() {
                    // Integers, the usual SUM, add as they are: the general decimal addition
                    // below cost a 100-row SUM more than reading its rows. Beyond BIGINT's
                    // range the sum goes on as a decimal, as MySQL's does.
                    let int = match v {
                        Val::Int(i) => Some(i128::from(i)),
                        Val::UInt(u) => Some(i128::from(u)),
                        _ => None,
                    };
                    let cur = exact.unwrap_or(Dec::new(0, 0));
                    if let Some(m) = int.filter(|_| cur.s == 0).and_then(|i| { cur.m }.checked_add(i)) {
                        *exact = Some(Dec::new(m, 0));
                        return Ok(());
                    }
                    if let Some(d) = v.to_dec() {
                        let cur = exact.unwrap_or(Dec::new(0, d.s));
                        let sum = arith(ArithOp::Add, &Val::Dec(cur), &Val::Dec(d)).map_err(range_err)?;
                        *exact = sum.to_dec();
                        return Ok(());
                    }
                    *float = Some(exact.take().map_or(0.0, |d| d.to_f64()));
                }
                *float = Some(float.unwrap_or(0.0) + v.to_f64().unwrap_or(0.0));
            }
            Acc::Concat(_) => {
                if let Some(v) = v {
                    self.add_keyed(v, vec![]);
                }
            }
            Acc::MinMax(cur) => {
                let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(()) };
                let replace = cur.is_null()
                    || match compare(&v, cur) {
                        Some(std::cmp::Ordering::Less) => kind == AggKind::Min,
                        Some(std::cmp::Ordering::Greater) => kind == AggKind::Max,
                        _ => false,
                    };
                if replace {
                    *cur = v;
                }
            }
        }
        Ok(())
    }

    /// The aggregate's value; `spec` gives GROUP_CONCAT its order and separator.
    pub fn finish_spec(&self, spec: &AggSpec) -> Val {
        let Acc::Concat(items) = self else { return self.finish(spec.kind) };
        if items.is_empty() {
            return Val::Null;
        }
        let mut idx: Vec<usize> = (0..items.len()).collect();
        if !spec.order.is_empty() {
            idx.sort_by(|&a, &b| {
                for (i, (_, asc)) in spec.order.iter().enumerate() {
                    let o = crate::val::sort_cmp(&items[a].0[i], &items[b].0[i]);
                    let o = if *asc { o } else { o.reverse() };
                    if o != std::cmp::Ordering::Equal {
                        return o;
                    }
                }
                std::cmp::Ordering::Equal
            });
        }
        let mut out: Vec<u8> = vec![];
        for (n, i) in idx.into_iter().enumerate() {
            if n > 0 {
                out.extend_from_slice(spec.separator.as_bytes());
            }
            out.extend_from_slice(&items[i].1);
            if out.len() >= GROUP_CONCAT_MAX_LEN {
                break;
            }
        }
        if out.len() > GROUP_CONCAT_MAX_LEN {
            out.truncate(GROUP_CONCAT_MAX_LEN);
            // Never cut a character in two.
            if let Err(e) = std::str::from_utf8(&out) {
                if e.error_len().is_none() {
                    out.truncate(e.valid_up_to());
                }
            }
        }
        bytes_or_str(out, false)
    }

    pub fn finish(&self, kind: AggKind) -> Val {
        match self {
            Acc::Count(n) => Val::Int(*n),
            Acc::Concat(_) => Val::Null,
            Acc::MinMax(v) => v.clone(),
            Acc::Sum { exact, float, n } => {
                if *n == 0 {
                    return Val::Null;
                }
                let sum = match (exact, float) {
                    (_, Some(f)) => Val::Float(*f),
                    (Some(d), None) => Val::Dec(*d),
                    (None, None) => return Val::Null,
                };
                if kind == AggKind::Sum {
                    return sum;
                }
                arith(ArithOp::Div, &sum, &Val::Int(*n)).unwrap_or(Val::Null)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(v: Val) -> Box<Expr> {
        Box::new(Expr::Lit(v))
    }

    #[test]
    fn sums_of_integers_stay_exact_past_bigint() {
        let sum = |vals: Vec<Val>| {
            let mut acc = Acc::new(AggKind::Sum);
            for v in vals {
                acc.add(AggKind::Sum, Some(v)).unwrap();
            }
            acc.finish(AggKind::Sum)
        };
        let big = i128::from(i64::MAX);
        assert_eq!(sum(vec![Val::Int(i64::MAX), Val::Int(1), Val::Null]), Val::Dec(Dec::new(big + 1, 0)));
        assert_eq!(sum(vec![Val::UInt(u64::MAX), Val::Int(-1)]), Val::Dec(Dec::new(i128::from(u64::MAX) - 1, 0)));
        // Integers after a decimal, and a float after both.
        assert_eq!(sum(vec![Val::Int(1), Val::Dec(Dec::new(15, 1)), Val::Int(2)]), Val::Dec(Dec::new(45, 1)));
        assert_eq!(sum(vec![Val::Int(1), Val::Float(0.5), Val::Int(2)]), Val::Float(3.5));
        assert_eq!(sum(vec![Val::Null]), Val::Null);
    }

    #[test]
    fn three_valued_logic() {
        let null = || lit(Val::Null);
        let t = || lit(Val::Int(1));
        let f = || lit(Val::Int(0));
        assert_eq!(Expr::And(null(), f()).eval(&[], &[]).unwrap(), Val::Int(0));
        assert_eq!(Expr::And(null(), t()).eval(&[], &[]).unwrap(), Val::Null);
        assert_eq!(Expr::Or(null(), t()).eval(&[], &[]).unwrap(), Val::Int(1));
        assert_eq!(Expr::Not(null()).eval(&[], &[]).unwrap(), Val::Null);
        let in_list = Expr::InList(lit(Val::Int(3)), vec![Expr::Lit(Val::Int(1)), Expr::Lit(Val::Null)], false);
        assert_eq!(in_list.eval(&[], &[]).unwrap(), Val::Null);
        let in_list = Expr::InList(lit(Val::Int(1)), vec![Expr::Lit(Val::Int(1)), Expr::Lit(Val::Null)], false);
        assert_eq!(in_list.eval(&[], &[]).unwrap(), Val::Int(1));
        let between = Expr::Between(Box::new(Expr::Col(0)), lit(Val::Int(1)), lit(Val::Int(5)), false);
        assert_eq!(between.eval(&[Val::Int(5)], &[]).unwrap(), Val::Int(1));
        assert_eq!(between.eval(&[Val::Int(6)], &[]).unwrap(), Val::Int(0));
        assert_eq!(Expr::Cmp(Cmp::NullSafeEq, null(), null()).eval(&[], &[]).unwrap(), Val::Int(1));
    }

    #[test]
    fn functions() {
        let s = |x: &str| Val::Str(x.into());
        assert_eq!(call(Func::Concat, vec![s("a"), Val::Int(1)]).unwrap(), s("a1"));
        assert_eq!(call(Func::Concat, vec![s("a"), Val::Null]).unwrap(), Val::Null);
        assert_eq!(call(Func::Coalesce, vec![Val::Null, Val::Int(2)]).unwrap(), Val::Int(2));
        assert_eq!(call(Func::Length, vec![s("héllo")]).unwrap(), Val::Int(6));
        assert_eq!(call(Func::CharLength, vec![s("héllo")]).unwrap(), Val::Int(5));
        assert_eq!(call(Func::Upper, vec![s("abc")]).unwrap(), s("ABC"));
        assert_eq!(call(Func::Substring, vec![s("hello"), Val::Int(2), Val::Int(3)]).unwrap(), s("ell"));
        assert_eq!(call(Func::Substring, vec![s("hello"), Val::Int(-3)]).unwrap(), s("llo"));
        assert_eq!(call(Func::NullIf, vec![Val::Int(1), Val::Int(1)]).unwrap(), Val::Null);
        assert_eq!(call(Func::Floor, vec![Val::Dec(Dec::parse("-1.5").unwrap())]).unwrap(), Val::Int(-2));
        assert_eq!(call(Func::Ceil, vec![Val::Dec(Dec::parse("1.2").unwrap())]).unwrap(), Val::Int(2));
        assert_eq!(call(Func::Ceil, vec![Val::Dec(Dec::parse("-1.2").unwrap())]).unwrap(), Val::Int(-1));
        assert_eq!(
            call(Func::Round, vec![Val::Dec(Dec::parse("2.567").unwrap()), Val::Int(2)])
                .unwrap()
                .to_string_lossy()
                .unwrap(),
            "2.57"
        );
        assert_eq!(call(Func::Greatest, vec![Val::Int(1), Val::Int(3), Val::Int(2)]).unwrap(), Val::Int(3));
        assert_eq!(cast(s("12abc"), CastTo::Signed).unwrap(), Val::Int(12));
        assert_eq!(cast(Val::Int(-1), CastTo::Unsigned).unwrap(), Val::UInt(u64::MAX));
        assert_eq!(cast(s("2024-01-02 10:00:00"), CastTo::Date).unwrap(), s("2024-01-02"));
    }

    #[test]
    fn result_types_follow_mysql() {
        let int = WireType::Int { kind: IntKind::Int, unsigned: false, width: None };
        let big = WireType::Int { kind: IntKind::Big, unsigned: false, width: None };
        let dec = |s| WireType::Decimal { p: 65, s };
        assert_eq!(arith_type(ArithOp::Add, int, int), Some(big));
        assert_eq!(arith_type(ArithOp::Div, int, int), Some(dec(4)));
        assert_eq!(arith_type(ArithOp::Mul, WireType::Decimal { p: 8, s: 2 }, dec(1)), Some(dec(3)));
        assert_eq!(arith_type(ArithOp::Sub, WireType::Double, int), Some(WireType::Double));
        assert_eq!(arith_type(ArithOp::Add, WireType::Str { len: 5 }, int), Some(WireType::Double));
        assert_eq!(arith_type(ArithOp::Add, WireType::Null, int), None);
        let cols = [Some(int), Some(WireType::Double)];
        let sum = AggSpec {
            kind: AggKind::Sum,
            arg: Some(Expr::Col(0)),
            distinct: false,
            order: vec![],
            separator: String::new(),
        };
        let avg = AggSpec { kind: AggKind::Avg, ..sum.clone() };
        let aggs = [sum, avg];
        assert_eq!(Expr::Agg(0).wire_type(&cols, &aggs), Some(dec(0)));
        assert_eq!(Expr::Agg(1).wire_type(&cols, &aggs), Some(dec(4)));
        let case = Expr::Case {
            operand: None,
            whens: vec![(Expr::Lit(Val::Int(1)), Expr::Col(0))],
            otherwise: Some(lit(Val::Null)),
        };
        assert_eq!(case.wire_type(&cols, &aggs), Some(int));
    }

    #[test]
    fn aggregates() {
        let mut sum = Acc::new(AggKind::Sum);
        for v in [Val::Int(1), Val::Null, Val::Int(2)] {
            sum.add(AggKind::Sum, Some(v)).unwrap();
        }
        assert_eq!(sum.finish(AggKind::Sum).to_string_lossy().unwrap(), "3");
        assert_eq!(sum.finish(AggKind::Avg).to_string_lossy().unwrap(), "1.5000");
        let mut count = Acc::new(AggKind::Count);
        count.add(AggKind::Count, Some(Val::Null)).unwrap();
        count.add(AggKind::Count, Some(Val::Int(0))).unwrap();
        assert_eq!(count.finish(AggKind::Count), Val::Int(1));
        let mut max = Acc::new(AggKind::Max);
        for v in [Val::Int(3), Val::Int(9), Val::Null, Val::Int(4)] {
            max.add(AggKind::Max, Some(v)).unwrap();
        }
        assert_eq!(max.finish(AggKind::Max), Val::Int(9));
        assert_eq!(Acc::new(AggKind::Sum).finish(AggKind::Sum), Val::Null);
        let mut fsum = Acc::new(AggKind::Sum);
        fsum.add(AggKind::Sum, Some(Val::Int(1))).unwrap();
        fsum.add(AggKind::Sum, Some(Val::Float(0.5))).unwrap();
        assert_eq!(fsum.finish(AggKind::Sum), Val::Float(1.5));
    }
}

//! Subqueries inside expressions: scalar `(SELECT …)`, `EXISTS`, `IN (SELECT …)` and
//! `<op> ANY|ALL (SELECT …)`, uncorrelated or correlated.
//!
//! A subquery is planned like any query, with the scopes of its enclosing queries visible
//! ([`Expr::Outer`]). Its tables are read before the statement is evaluated (with the filters
//! that do not depend on the enclosing row pushed down), so evaluating it is a pure, in-memory
//! run of its plan: once per statement when it is uncorrelated (the rows are cached), once per
//! enclosing row when it is correlated. An uncorrelated `IN` also hashes its values once, so
//! testing a row costs a lookup, not a pass over the subquery's rows.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::error::{code, SqlError, SqlResult};
use crate::sql::expr::{Cmp, Expr, Outer, Sub, SubKind};
use crate::sql::query::QueryPlan;
use crate::val::{compare, Val};

/// A planned subquery and, when it does not depend on the enclosing rows, its cached rows.
#[derive(Debug)]
pub struct SubPlan {
    pub plan: QueryPlan,
    /// It reads a column of an enclosing query, so it runs once per enclosing row.
    pub correlated: bool,
    cache: OnceLock<Arc<Vec<Vec<Val>>>>,
    in_index: OnceLock<InIndex>,
}

/// The values of an uncorrelated `IN (SELECT …)` by hash: numbers by their double value, text
/// by its bytes (values that compare equal hash equal; candidates are confirmed by comparing).
#[derive(Debug, Default)]
struct InIndex {
    by_key: HashMap<Vec<u8>, Vec<usize>>,
    has_null: bool,
    /// Every non-NULL value is a number (or every one is text): lookups of that kind are exact.
    all_numbers: bool,
    all_text: bool,
}

/// A hash key that values comparing equal share, for numbers and text; None otherwise.
fn in_key(v: &Val) -> Option<Vec<u8>> {
    match v {
        Val::Int(_) | Val::UInt(_) | Val::Dec(_) | Val::Float(_) => {
            let f = v.to_f64()?;
            let f = if f == 0.0 { 0.0 } else { f };
            let mut k = vec![0];
            k.extend_from_slice(&f.to_bits().to_le_bytes());
            Some(k)
        }
        Val::Str(s) => Some([&[1u8][..], s.as_bytes()].concat()),
        Val::Bytes(b) => Some([&[1u8][..], b.as_slice()].concat()),
        Val::Null => None,
    }
}

impl InIndex {
    fn build(rows: &[Vec<Val>]) -> InIndex {
        let mut ix = InIndex { all_numbers: true, all_text: true, ..InIndex::default() };
        for (i, r) in rows.iter().enumerate() {
            let v = r.first().unwrap_or(&Val::Null);
            if v.is_null() {
                ix.has_null = true;
                continue;
            }
            ix.all_numbers &= v.is_numeric();
            ix.all_text &= matches!(v, Val::Str(_) | Val::Bytes(_));
            if let Some(k) = in_key(v) {
                ix.by_key.entry(k).or_default().push(i);
            }
        }
        ix
    }

    /// `x IN (rows)` when the index can decide it exactly.
    fn lookup(&self, x: &Val, rows: &[Vec<Val>]) -> Option<Val> {
        let exact = (x.is_numeric() && self.all_numbers) || (matches!(x, Val::Str(_) | Val::Bytes(_)) && self.all_text);
        if !exact || x.is_null() || rows.is_empty() {
            return None;
        }
        let hit = self.by_key.get(&in_key(x)?).is_some_and(|c| {
            c.iter().any(|&i| compare(x, rows[i].first().unwrap_or(&Val::Null)) == Some(Ordering::Equal))
        });
        Some(match (hit, self.has_null) {
            (true, _) => Val::bool(true),
            (false, true) => Val::Null,
            (false, false) => Val::bool(false),
        })
    }
}

impl SubPlan {
    pub fn new(plan: QueryPlan) -> SubPlan {
        let correlated = escapes(&plan, 0);
        SubPlan { plan, correlated, cache: OnceLock::new(), in_index: OnceLock::new() }
    }

    fn rows(&self, row: &[Val], outer: Option<&Outer<'_>>) -> SqlResult<Arc<Vec<Vec<Val>>>> {
        if self.correlated {
            let here = Outer { row, up: outer };
            return Ok(Arc::new(crate::sql::select::run(&self.plan, Some(&here))?));
        }
        if let Some(r) = self.cache.get() {
            return Ok(r.clone());
        }
        let rows = Arc::new(crate::sql::select::run(&self.plan, None)?);
        Ok(self.cache.get_or_init(|| rows).clone())
    }
}

/// True when the plan (at nesting `depth` below the subquery being asked about) reads a row of
/// a query outside that subquery.
fn escapes(plan: &QueryPlan, depth: usize) -> bool {
    let mut found = false;
    plan.each_expr(&mut |e| {
        e.walk(&mut |x| match x {
            Expr::Outer(levels, _) if *levels > depth => found = true,
            Expr::Subquery(s) if !found => found = escapes(&s.plan.plan, depth + 1),
            _ => {}
        })
    });
    found
}

/// The value of a subquery expression for the current row.
pub fn eval(sub: &Sub, row: &[Val], aggs: &[Val], outer: Option<&Outer<'_>>) -> SqlResult<Val> {
    let rows = sub.plan.rows(row, outer)?;
    Ok(match &sub.kind {
        SubKind::Exists => Val::bool(!rows.is_empty()),
        SubKind::Scalar => match rows.as_slice() {
            [] => Val::Null,
            [one] => one.first().cloned().unwrap_or(Val::Null),
            _ => return Err(SqlError::new(code::SUBQUERY_NO_1_ROW, "Subquery returns more than 1 row")),
        },
        SubKind::In(x) => {
            let x = x.eval_in(row, aggs, outer)?;
            let indexed = match sub.plan.correlated {
                true => None,
                false => sub.plan.in_index.get_or_init(|| InIndex::build(&rows)).lookup(&x, &rows),
            };
            match indexed {
                Some(v) => v,
                None => quantified(&x, Cmp::Eq, false, &rows),
            }
        }
        SubKind::Quantified(x, op, all) => {
            let x = x.eval_in(row, aggs, outer)?;
            quantified(&x, *op, *all, &rows)
        }
    })
}

/// `x <op> ANY (rows)` (IN is `= ANY`) or `x <op> ALL (rows)`, in three-valued logic: over no
/// rows ANY is false and ALL true; otherwise a NULL comparison that could decide makes the
/// result NULL.
fn quantified(x: &Val, op: Cmp, all: bool, rows: &[Vec<Val>]) -> Val {
    if rows.is_empty() {
        return Val::bool(all);
    }
    let mut unknown = false;
    for r in rows {
        let y = r.first().unwrap_or(&Val::Null);
        let hit = match compare(x, y) {
            None => {
                unknown = true;
                continue;
            }
            Some(o) => match op {
                Cmp::Eq | Cmp::NullSafeEq => o == Ordering::Equal,
                Cmp::Ne => o != Ordering::Equal,
                Cmp::Lt => o == Ordering::Less,
                Cmp::Le => o != Ordering::Greater,
                Cmp::Gt => o == Ordering::Greater,
                Cmp::Ge => o != Ordering::Less,
            },
        };
        if hit != all {
            // ANY found a match, or ALL found a counterexample.
            return Val::bool(!all);
        }
    }
    if unknown {
        Val::Null
    } else {
        Val::bool(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(vals: &[Val]) -> Vec<Vec<Val>> {
        vals.iter().map(|v| vec![v.clone()]).collect()
    }

    #[test]
    fn hashed_in_agrees_with_the_scan() {
        let vals = [Val::Int(1), Val::Dec(crate::val::Dec::parse("2.50").unwrap()), Val::Float(7.0), Val::Null];
        let rows = col(&vals);
        let ix = InIndex::build(&rows);
        for x in [Val::Int(1), Val::Float(2.5), Val::Int(7), Val::UInt(3), Val::Null] {
            let want = quantified(&x, Cmp::Eq, false, &rows);
            assert_eq!(ix.lookup(&x, &rows).unwrap_or_else(|| want.clone()), want, "{x:?}");
        }
        // Text against numbers is compared as numbers: left to the scan.
        assert_eq!(ix.lookup(&Val::Str("1".into()), &rows), None);
        let texts = col(&[Val::Str("a".into()), Val::Str("b".into())]);
        let ix = InIndex::build(&texts);
        assert_eq!(ix.lookup(&Val::Str("b".into()), &texts), Some(Val::Int(1)));
        assert_eq!(ix.lookup(&Val::Str("c".into()), &texts), Some(Val::Int(0)));
    }

    #[test]
    fn in_and_quantified_follow_three_valued_logic() {
        let (one, two, null) = (Val::Int(1), Val::Int(2), Val::Null);
        assert_eq!(quantified(&one, Cmp::Eq, false, &col(&[two.clone(), one.clone()])), Val::Int(1));
        assert_eq!(quantified(&one, Cmp::Eq, false, &col(std::slice::from_ref(&two))), Val::Int(0));
        assert_eq!(quantified(&one, Cmp::Eq, false, &col(&[two.clone(), null.clone()])), Val::Null);
        assert_eq!(quantified(&null, Cmp::Eq, false, &col(std::slice::from_ref(&two))), Val::Null);
        // Over no rows: IN is false even for NULL, ALL is true.
        assert_eq!(quantified(&null, Cmp::Eq, false, &[]), Val::Int(0));
        assert_eq!(quantified(&one, Cmp::Gt, true, &[]), Val::Int(1));
        assert_eq!(quantified(&two, Cmp::Gt, true, &col(std::slice::from_ref(&one))), Val::Int(1));
        assert_eq!(quantified(&two, Cmp::Gt, true, &col(&[one.clone(), two.clone()])), Val::Int(0));
        assert_eq!(quantified(&two, Cmp::Gt, true, &col(&[one.clone(), null])), Val::Null);
    }
}

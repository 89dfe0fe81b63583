//! Subqueries inside expressions: scalar `(SELECT …)`, `EXISTS`, `IN (SELECT …)` and
//! `<op> ANY|ALL (SELECT …)`, uncorrelated or correlated.
//!
//! A subquery is planned like any query, with the scopes of its enclosing queries visible
//! ([`Expr::Outer`]). Its tables are read before the statement is evaluated (with the filters
//! that do not depend on the enclosing row pushed down), so evaluating it is a pure, in-memory
//! run of its plan: once per statement when it is uncorrelated (the rows are cached), once per
//! enclosing row when it is correlated.

use std::cmp::Ordering;
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
}

impl SubPlan {
    pub fn new(plan: QueryPlan) -> SubPlan {
        let correlated = escapes(&plan, 0);
        SubPlan { plan, correlated, cache: OnceLock::new() }
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
            quantified(&x, Cmp::Eq, false, &rows)
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

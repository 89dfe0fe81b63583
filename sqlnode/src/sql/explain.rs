//! EXPLAIN of a query plan: one row per table read, saying how it is read (the access path and
//! the filters the data nodes evaluate) and what the SQL node does with it (joins, derived
//! tables, subqueries). Pure.

use crate::sql::agg_pushdown;
use crate::sql::bind::TableRef;
use crate::sql::expr::Expr;
use crate::sql::plan::{self, Access};
use crate::sql::query::{Body, From, JoinKind, QueryPlan, SetOp};

/// Column names of EXPLAIN's result.
pub const COLUMNS: &[&str] = &["table", "access", "pushed_filters", "in_sql_node"];

/// The pushed-down filters of an access path, as text.
pub fn pushed_text(t: &TableRef, a: &Access) -> String {
    a.filters()
        .iter()
        .map(|f| format!("{} {:?} {:?}", t.col_name(f.column as usize), f.op, f.value))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The rows of EXPLAIN for a query plan.
pub fn explain(plan: &QueryPlan) -> Vec<Vec<String>> {
    let mut out = vec![];
    query(plan, "", &mut out);
    out
}

fn query(plan: &QueryPlan, prefix: &str, out: &mut Vec<Vec<String>>) {
    match &plan.body {
        Body::Select(s) => {
            if matches!(s.from, From::Dual) {
                out.push(vec![format!("{prefix}NULL"), "no table".into(), String::new(), String::new()]);
            }
            match &s.from {
                // As `run_plan` reads a single-table SELECT: its WHERE, maybe in ORDER BY order.
                From::Scan(sc) => {
                    let t = &sc.table;
                    let a = plan::choose(t, s.filter.as_ref());
                    let a = crate::exec::index_order(s, t, &a).unwrap_or(a);
                    let name = t.alias.clone().unwrap_or_else(|| t.name.clone());
                    let implied = plan::filter_implied(t, s.filter.as_ref(), &a);
                    let note = match agg_pushdown::pushed(s, t, &a, implied) {
                        Some(_) => "aggregates computed in the data nodes",
                        None => "",
                    };
                    out.push(vec![format!("{prefix}{name}"), a.describe(), pushed_text(t, &a), note.into()]);
                }
                other => from(other, prefix, "", out),
            }
            let mut subs = 0;
            plan.each_expr(&mut |e| {
                e.walk(&mut |x| {
                    if let Expr::Subquery(sub) = x {
                        subs += 1;
                        let how = if sub.plan.correlated { "correlated: once per row" } else { "once per statement" };
                        let p = format!("{prefix}subquery {subs} ({how}) > ");
                        query(&sub.plan.plan, &p, out);
                    }
                })
            });
        }
        Body::Set { op, all, left, right, .. } => {
            let name = match op {
                SetOp::Union => "UNION",
                SetOp::Intersect => "INTERSECT",
                SetOp::Except => "EXCEPT",
            };
            let name = if *all { format!("{name} ALL") } else { name.to_string() };
            query(left, prefix, out);
            query(right, &format!("{prefix}{name} > "), out);
        }
        Body::Sorted { input, .. } => query(input, prefix, out),
        Body::Recursive(r) => {
            for seed in &r.seeds {
                query(seed, prefix, out);
            }
            let union = if r.distinct { "UNION" } else { "UNION ALL" };
            for step in &r.steps {
                query(step, &format!("{prefix}{union}, repeated until no new rows > "), out);
            }
        }
    }
}

fn from(f: &From, prefix: &str, note: &str, out: &mut Vec<Vec<String>>) {
    match f {
        From::Dual => {}
        From::Scan(s) => {
            let t = &s.table;
            let a = plan::choose(t, s.pushed.as_ref());
            let name = t.alias.clone().unwrap_or_else(|| t.name.clone());
            out.push(vec![format!("{prefix}{name}"), a.describe(), pushed_text(t, &a), note.to_string()]);
        }
        From::Values(v) => {
            out.push(vec![
                format!("{prefix}{}", v.name),
                "rows made in the SQL node (information_schema)".into(),
                String::new(),
                note.to_string(),
            ]);
        }
        From::Derived(d) => {
            out.push(vec![
                format!("{prefix}{}", d.name),
                "derived table: the rows of its query, computed once".into(),
                String::new(),
                note.to_string(),
            ]);
            query(&d.plan, &format!("{prefix}{} > ", d.name), out);
        }
        From::Work { name, .. } => {
            out.push(vec![
                format!("{prefix}{name}"),
                "recursive reference: the rows the previous round added".into(),
                String::new(),
                note.to_string(),
            ]);
        }
        From::Join(j) => {
            let kind = match j.kind {
                JoinKind::Inner => "inner join",
                JoinKind::Left => "left join",
                JoinKind::Right => "right join",
            };
            let how = if j.hash.is_empty() {
                "nested loops".to_string()
            } else {
                format!("hash on {} column(s)", j.hash.len())
            };
            from(&j.left, prefix, note, out);
            from(&j.right, prefix, &format!("{kind}, {how}"), out);
        }
    }
}

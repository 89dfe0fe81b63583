//! Aggregates computed in the data nodes: a SELECT over one table whose every output is an
//! aggregate — COUNT(*), COUNT(col), and SUM, AVG, MIN, MAX of integer columns — with no GROUP
//! BY or HAVING, whose rows a run of primary keys gives exactly (`Access::KeyRun` with the
//! WHERE clause implied: sysbench's `SELECT SUM(k) FROM sbtest1 WHERE id BETWEEN ? AND ?`),
//! asks the data nodes for the aggregates instead of the rows (`shoal_proto::aggregate`). Each
//! node folds its share where the rows are; the SQL node merges the shares into the
//! accumulators the row-by-row path would have built, and finishes them the same way, so the
//! answer is the same value of the same type.

use shoal_proto::aggregate::{Aggregate, AggregateKind, Partial};
use shoal_proto::ColumnType;

use crate::sql::bind::TableRef;
use crate::sql::expr::{Acc, AggKind, AggSpec, Expr};
use crate::sql::plan::Access;
use crate::sql::query::SelectPlan;
use crate::types::SqlType;
use crate::val::{Dec, Val};

/// The key run and the aggregates to ask the data nodes for (one per aggregate of the plan),
/// when the plan reads `access` of `t` and the data nodes can answer it: the rows are exactly
/// the key run's (`implied`: the WHERE clause holds for every row of the access path), and the
/// outputs need nothing but the aggregates.
pub fn pushed(sp: &SelectPlan, t: &TableRef, access: &Access, implied: bool) -> Option<(i128, u32, Vec<Aggregate>)> {
    match *access {
        Access::KeyRun { lo, count } if implied => Some((lo, count, pushable(sp, t)?)),
        _ => None,
    }
}

fn pushable(sp: &SelectPlan, t: &TableRef) -> Option<Vec<Aggregate>> {
    let only_aggregates = sp.outputs.iter().all(|e| matches!(e, Expr::Agg(_) | Expr::Lit(_)));
    if !sp.grouped || !sp.group_exprs.is_empty() || sp.having.is_some() || !sp.windows.is_empty() || !only_aggregates {
        return None;
    }
    sp.aggs.iter().map(|a| pushed_one(a, t)).collect()
}

fn pushed_one(a: &AggSpec, t: &TableRef) -> Option<Aggregate> {
    if a.distinct || !a.order.is_empty() {
        return None;
    }
    let column = match &a.arg {
        Some(Expr::Col(c)) => *c,
        None if a.kind == AggKind::CountStar => return Some(Aggregate { kind: AggregateKind::CountRows, column: 0 }),
        _ => return None,
    };
    let storage = t.table.spec.columns.get(column)?.ty;
    // SUM, AVG, MIN and MAX of columns whose SQL value is the stored integer (not DECIMAL's
    // scaled integers, nor dates).
    let integer =
        matches!(t.types.get(column)?, SqlType::Int { .. }) && matches!(storage, ColumnType::Int | ColumnType::Uint);
    let kind = match a.kind {
        AggKind::Count => AggregateKind::Count,
        AggKind::Sum | AggKind::Avg if integer => AggregateKind::Sum,
        AggKind::Min if integer => AggregateKind::Min,
        AggKind::Max if integer => AggregateKind::Max,
        _ => return None,
    };
    Some(Aggregate { kind, column: column as u32 })
}

/// The accumulators of the plan's aggregates holding the data nodes' merged `partials` (one
/// per aggregate, as [`pushed`] asked), as adding each row's value would have left them.
pub fn accumulators(sp: &SelectPlan, t: &TableRef, partials: &[Partial]) -> Vec<Acc> {
    sp.aggs
        .iter()
        .zip(partials)
        .map(|(a, p)| {
            let n = i64::try_from(p.n).unwrap_or(i64::MAX);
            match a.kind {
                AggKind::Sum | AggKind::Avg => Acc::Sum { exact: p.value.map(|s| Dec::new(s, 0)), float: None, n },
                AggKind::Min | AggKind::Max => Acc::MinMax(min_max_value(t, a, p.value)),
                _ => Acc::Count(n),
            }
        })
        .collect()
}

/// A MIN or MAX result as the column's SQL value, as reading the row would give it.
fn min_max_value(t: &TableRef, a: &AggSpec, v: Option<i128>) -> Val {
    let (Some(v), Some(Expr::Col(c))) = (v, &a.arg) else { return Val::Null };
    match t.table.spec.columns.get(*c).map(|c| c.ty) {
        Some(ColumnType::Uint) => u64::try_from(v).map_or(Val::Null, Val::UInt),
        _ => i64::try_from(v).map_or(Val::Null, Val::Int),
    }
}

//! Window functions: `f(...) OVER ([PARTITION BY …] [ORDER BY …] [frame])`.
//!
//! They are computed in the SQL node over the rows a SELECT produces after WHERE, GROUP BY and
//! HAVING, before DISTINCT, ORDER BY and LIMIT (MySQL's order). Each window sorts the rows'
//! indices by (partition, order keys) and walks each partition once; the values then join the
//! row's aggregate results, where the projection reads them ([`crate::sql::select`]).
//!
//! Functions: ROW_NUMBER, RANK, DENSE_RANK, PERCENT_RANK, CUME_DIST, NTILE, LAG, LEAD,
//! FIRST_VALUE, LAST_VALUE, and COUNT/SUM/AVG/MIN/MAX over the frame. Frames: MySQL's default
//! (with ORDER BY, from the partition's start to the current row's last peer; without, the
//! whole partition), `ROWS` frames with `UNBOUNDED`/`n` `PRECEDING`/`FOLLOWING`/`CURRENT ROW`,
//! and `RANGE` frames from `UNBOUNDED PRECEDING` to `CURRENT ROW` or `UNBOUNDED FOLLOWING`.
//! Aggregates over a frame are recomputed per row (partitions are bounded by the statement's
//! row bound). Named windows (`WINDOW w AS (…)`, `OVER w`, `OVER (w ORDER BY …)`) are resolved
//! into plain specifications before binding ([`named_windows`], [`resolve`]).

use std::cmp::Ordering;

use sqlparser::ast;

use crate::error::{code, SqlError, SqlResult};
use crate::sql::expr::{Acc, AggKind, AggSpec, Expr, Outer};
use crate::types::{IntKind, WireType};
use crate::val::{sort_cmp, Val};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WinFunc {
    RowNumber,
    Rank,
    DenseRank,
    PercentRank,
    CumeDist,
    Ntile,
    Lag,
    Lead,
    FirstValue,
    LastValue,
    Agg(AggKind),
}

/// One end of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    UnboundedPreceding,
    Preceding(u64),
    CurrentRow,
    Following(u64),
    UnboundedFollowing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Peers of the current row count as the current row (RANGE).
    Range(Bound, Bound),
    Rows(Bound, Bound),
}

/// One window function call of a SELECT.
#[derive(Clone, Debug, PartialEq)]
pub struct WinSpec {
    pub func: WinFunc,
    pub args: Vec<Expr>,
    pub partition: Vec<Expr>,
    pub order: Vec<(Expr, bool)>,
    pub frame: Frame,
}

impl WinSpec {
    /// MySQL's frame when none is written: with ORDER BY, the start of the partition to the
    /// current row's peers; without, the whole partition.
    pub fn default_frame(ordered: bool) -> Frame {
        if ordered {
            Frame::Range(Bound::UnboundedPreceding, Bound::CurrentRow)
        } else {
            Frame::Range(Bound::UnboundedPreceding, Bound::UnboundedFollowing)
        }
    }
}

/// The result type of a window function, for result metadata.
pub fn result_type(spec: &WinSpec, cols: &[Option<WireType>], aggs: &[AggSpec]) -> Option<WireType> {
    let bigint = WireType::Int { kind: IntKind::Big, unsigned: false, width: None };
    match spec.func {
        WinFunc::RowNumber | WinFunc::Rank | WinFunc::DenseRank | WinFunc::Ntile => Some(bigint),
        WinFunc::PercentRank | WinFunc::CumeDist => Some(WireType::Double),
        WinFunc::Lag | WinFunc::Lead | WinFunc::FirstValue | WinFunc::LastValue => {
            spec.args.first()?.wire_type(cols, aggs)
        }
        WinFunc::Agg(kind) => {
            // As the same aggregate over a group.
            let probe = AggSpec {
                kind,
                arg: spec.args.first().cloned(),
                distinct: false,
                order: vec![],
                separator: String::new(),
            };
            Expr::Agg(0).wire_type(cols, std::slice::from_ref(&probe))
        }
    }
}

/// Rows of one SELECT waiting for their window values: (input row, aggregate results).
pub type Pending = Vec<(Vec<Val>, Vec<Val>)>;

/// The value of every window function for every pending row: `out[row][window]`.
pub fn compute(specs: &[WinSpec], rows: &Pending, outer: Option<&Outer<'_>>) -> SqlResult<Vec<Vec<Val>>> {
    let mut out = vec![Vec::with_capacity(specs.len()); rows.len()];
    for spec in specs {
        let vals = one(spec, rows, outer)?;
        for (o, v) in out.iter_mut().zip(vals) {
            o.push(v);
        }
    }
    Ok(out)
}

fn cmp_keys(a: &[Val], b: &[Val], order: &[(Expr, bool)]) -> Ordering {
    for ((x, y), (_, asc)) in a.iter().zip(b).zip(order) {
        let o = sort_cmp(x, y);
        let o = if *asc { o } else { o.reverse() };
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

fn offset_arg(spec: &WinSpec, args: &[Val], i: usize, default: i64) -> SqlResult<i64> {
    match args.get(i) {
        None => Ok(default),
        Some(v) => match v.to_i64() {
            Some(n) if n >= 0 => Ok(n),
            _ => Err(SqlError::new(code::WRONG_ARGUMENTS, format!("Incorrect arguments to {:?}", spec.func))),
        },
    }
}

fn one(spec: &WinSpec, rows: &Pending, outer: Option<&Outer<'_>>) -> SqlResult<Vec<Val>> {
    let n = rows.len();
    let mut part_keys = Vec::with_capacity(n);
    let mut order_keys = Vec::with_capacity(n);
    let mut args = Vec::with_capacity(n);
    for (row, aggs) in rows {
        let mut k = vec![];
        for e in &spec.partition {
            e.eval_in(row, aggs, outer)?.group_key(&mut k);
        }
        part_keys.push(k);
        order_keys.push(spec.order.iter().map(|(e, _)| e.eval_in(row, aggs, outer)).collect::<SqlResult<Vec<_>>>()?);
        args.push(spec.args.iter().map(|e| e.eval_in(row, aggs, outer)).collect::<SqlResult<Vec<_>>>()?);
    }
    // Stable: rows equal in partition and order keep their order.
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| {
        part_keys[a].cmp(&part_keys[b]).then_with(|| cmp_keys(&order_keys[a], &order_keys[b], &spec.order))
    });
    let mut out = vec![Val::Null; n];
    let mut start = 0;
    while start < n {
        let mut end = start + 1;
        while end < n && part_keys[idx[end]] == part_keys[idx[start]] {
            end += 1;
        }
        partition(spec, &idx[start..end], &order_keys, &args, &mut out)?;
        start = end;
    }
    Ok(out)
}

/// Values for one partition; `p` holds its rows' indices in window order.
fn partition(spec: &WinSpec, p: &[usize], keys: &[Vec<Val>], args: &[Vec<Val>], out: &mut [Val]) -> SqlResult<()> {
    let len = p.len();
    // Peer groups: [first, last] positions of the rows equal to each position in order keys.
    let mut peer_start = vec![0; len];
    let mut peer_end = vec![0; len];
    let mut i = 0;
    while i < len {
        let mut j = i + 1;
        while j < len && cmp_keys(&keys[p[j]], &keys[p[i]], &spec.order) == Ordering::Equal {
            j += 1;
        }
        for k in i..j {
            peer_start[k] = i;
            peer_end[k] = j - 1;
        }
        i = j;
    }
    let mut dense = 0i64;
    for pos in 0..len {
        if peer_start[pos] == pos {
            dense += 1;
        }
        let a = &args[p[pos]];
        let arg = |i: usize| a.get(i).cloned().unwrap_or(Val::Null);
        out[p[pos]] = match spec.func {
            WinFunc::RowNumber => Val::Int(pos as i64 + 1),
            WinFunc::Rank => Val::Int(peer_start[pos] as i64 + 1),
            WinFunc::DenseRank => Val::Int(dense),
            WinFunc::PercentRank => Val::Float(if len > 1 { peer_start[pos] as f64 / (len - 1) as f64 } else { 0.0 }),
            WinFunc::CumeDist => Val::Float((peer_end[pos] + 1) as f64 / len as f64),
            WinFunc::Ntile => {
                let buckets = offset_arg(spec, a, 0, 1)?.max(1) as usize;
                // MySQL: the first len % buckets buckets get one row more.
                let (base, extra) = (len / buckets, len % buckets);
                let big = extra * (base + 1);
                let b = if pos < big { pos / (base + 1) } else { extra + (pos - big) / base.max(1) };
                Val::Int(b as i64 + 1)
            }
            WinFunc::Lag | WinFunc::Lead => {
                let off = offset_arg(spec, a, 1, 1)? as usize;
                let target = if spec.func == WinFunc::Lag { pos.checked_sub(off) } else { pos.checked_add(off) };
                match target.filter(|&t| t < len) {
                    Some(t) => args[p[t]].first().cloned().unwrap_or(Val::Null),
                    None => arg(2),
                }
            }
            WinFunc::FirstValue | WinFunc::LastValue | WinFunc::Agg(_) => {
                let (lo, hi) = frame(spec.frame, pos, len, &peer_start, &peer_end);
                match spec.func {
                    WinFunc::FirstValue => {
                        if lo <= hi {
                            args[p[lo]].first().cloned().unwrap_or(Val::Null)
                        } else {
                            Val::Null
                        }
                    }
                    WinFunc::LastValue => {
                        if lo <= hi {
                            args[p[hi]].first().cloned().unwrap_or(Val::Null)
                        } else {
                            Val::Null
                        }
                    }
                    WinFunc::Agg(kind) => {
                        let mut acc = Acc::new(kind);
                        if lo <= hi {
                            for &r in &p[lo..=hi] {
                                let v = if kind == AggKind::CountStar { None } else { args[r].first().cloned() };
                                acc.add(kind, v)?;
                            }
                        }
                        acc.finish(kind)
                    }
                    _ => Val::Null,
                }
            }
        };
    }
    Ok(())
}

/// The frame of the row at `pos` as inclusive positions (lo > hi: empty).
fn frame(f: Frame, pos: usize, len: usize, peer_start: &[usize], peer_end: &[usize]) -> (usize, usize) {
    let last = len - 1;
    let at = |b: Bound, is_start: bool, range: bool| -> i64 {
        match b {
            Bound::UnboundedPreceding => 0,
            Bound::UnboundedFollowing => last as i64,
            Bound::CurrentRow if range => {
                if is_start {
                    peer_start[pos] as i64
                } else {
                    peer_end[pos] as i64
                }
            }
            Bound::CurrentRow => pos as i64,
            Bound::Preceding(n) => pos as i64 - n.min(i64::MAX as u64) as i64,
            Bound::Following(n) => pos as i64 + n.min(i64::MAX as u64) as i64,
        }
    };
    let (lo, hi, range) = match f {
        Frame::Range(s, e) => (s, e, true),
        Frame::Rows(s, e) => (s, e, false),
    };
    let lo = at(lo, true, range).max(0);
    let hi = at(hi, false, range).min(last as i64);
    if lo > hi {
        (1, 0)
    } else {
        (lo as usize, hi as usize)
    }
}

/// A SELECT's `WINDOW` clause, each name with its specification resolved (a window defined on
/// another one inherits from it): what `OVER name` and `OVER (name …)` look up.
pub fn named_windows(defs: &[ast::NamedWindowDefinition]) -> SqlResult<Vec<(String, ast::WindowSpec)>> {
    for (i, d) in defs.iter().enumerate() {
        if defs[..i].iter().any(|o| o.0.value.eq_ignore_ascii_case(&d.0.value)) {
            return Err(SqlError::new(
                code::WINDOW_DUPLICATE_NAME,
                format!("Window '{}' is defined twice.", d.0.value),
            ));
        }
    }
    defs.iter().map(|d| Ok((d.0.value.clone(), named(defs, &d.0.value, 0)?))).collect()
}

/// The specification of the window named `name` in `defs`; `depth` counts the references
/// followed, which a cycle would follow forever.
fn named(defs: &[ast::NamedWindowDefinition], name: &str, depth: usize) -> SqlResult<ast::WindowSpec> {
    if depth > defs.len() {
        return Err(SqlError::new(
            code::WINDOW_CIRCULARITY_IN_WINDOW_GRAPH,
            "There is a circularity in the window dependency graph.",
        ));
    }
    let Some(d) = defs.iter().find(|d| d.0.value.eq_ignore_ascii_case(name)) else {
        return Err(no_such_window(name));
    };
    match &d.1 {
        ast::NamedWindowExpr::NamedWindow(other) => named(defs, &other.value, depth + 1),
        ast::NamedWindowExpr::WindowSpec(spec) => match &spec.window_name {
            None => Ok(spec.clone()),
            Some(base) => inherit(&named(defs, &base.value, depth + 1)?, &base.value, spec, &d.0.value),
        },
    }
}

fn no_such_window(name: &str) -> SqlError {
    SqlError::new(code::WINDOW_NO_SUCH_WINDOW, format!("Window name '{name}' is not defined."))
}

/// `OVER (...)` or `OVER name` as a plain specification, the named windows looked up.
pub fn resolve(over: &ast::WindowType, named: &[(String, ast::WindowSpec)]) -> SqlResult<ast::WindowSpec> {
    let find = |name: &str| {
        named.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, s)| s).ok_or_else(|| no_such_window(name))
    };
    match over {
        ast::WindowType::NamedWindow(name) => find(&name.value).cloned(),
        ast::WindowType::WindowSpec(spec) => match &spec.window_name {
            None => Ok(spec.clone()),
            Some(base) => inherit(find(&base.value)?, &base.value, spec, "<unnamed window>"),
        },
    }
}

/// Window `child` (named `child_name`) defined on window `base_name`: it takes the base's
/// partitioning and ordering and may add an ordering and a frame, as MySQL allows.
fn inherit(
    base: &ast::WindowSpec,
    base_name: &str,
    child: &ast::WindowSpec,
    child_name: &str,
) -> SqlResult<ast::WindowSpec> {
    if !child.partition_by.is_empty() {
        return Err(SqlError::new(
            code::WINDOW_NO_CHILD_PARTITIONING,
            "A window which depends on another cannot define partitioning.",
        ));
    }
    if base.window_frame.is_some() {
        return Err(SqlError::new(
            code::WINDOW_NO_INHERIT_FRAME,
            format!("Window '{base_name}' has a frame definition, so cannot be referenced by another window."),
        ));
    }
    if !base.order_by.is_empty() && !child.order_by.is_empty() {
        return Err(SqlError::new(
            code::WINDOW_NO_REDEFINE_ORDER_BY,
            format!("Window '{child_name}' cannot inherit '{base_name}' since both contain an ORDER BY clause."),
        ));
    }
    let mut spec = base.clone();
    spec.window_name = None;
    if !child.order_by.is_empty() {
        spec.order_by = child.order_by.clone();
    }
    spec.window_frame = child.window_frame.clone();
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The named windows of `SELECT … WINDOW …`, resolved, as text; or the error code.
    fn windows(sql: &str) -> Result<Vec<String>, u16> {
        let ast::Statement::Query(q) = crate::sql::parse::parse_one(sql).unwrap() else { panic!("not a query") };
        let ast::SetExpr::Select(s) = q.body.as_ref() else { panic!("not a select") };
        named_windows(&s.named_window).map(|w| w.iter().map(|(n, s)| format!("{n}: {s}")).collect()).map_err(|e| e.code)
    }

    #[test]
    fn named_windows_inherit_as_mysql_allows() {
        assert_eq!(
            windows("SELECT 1 FROM t WINDOW a AS (PARTITION BY x), b AS (a ORDER BY y), c AS (b)").unwrap(),
            ["a: PARTITION BY x", "b: PARTITION BY x ORDER BY y", "c: PARTITION BY x ORDER BY y"]
        );
        // Defined later than used is fine; a frame may be added by the inheriting window.
        assert_eq!(
            windows("SELECT 1 FROM t WINDOW b AS (a ROWS BETWEEN 1 PRECEDING AND CURRENT ROW), a AS (ORDER BY y)")
                .unwrap()[0],
            "b: ORDER BY y ROWS BETWEEN 1 PRECEDING AND CURRENT ROW"
        );
        let err = |sql: &str| windows(sql).unwrap_err();
        assert_eq!(err("SELECT 1 FROM t WINDOW a AS (), a AS ()"), code::WINDOW_DUPLICATE_NAME);
        assert_eq!(err("SELECT 1 FROM t WINDOW a AS (b)"), code::WINDOW_NO_SUCH_WINDOW);
        assert_eq!(err("SELECT 1 FROM t WINDOW a AS (b), b AS (a)"), code::WINDOW_CIRCULARITY_IN_WINDOW_GRAPH);
        assert_eq!(err("SELECT 1 FROM t WINDOW a AS (), b AS (a PARTITION BY x)"), code::WINDOW_NO_CHILD_PARTITIONING);
        assert_eq!(
            err("SELECT 1 FROM t WINDOW a AS (ORDER BY x), b AS (a ORDER BY y)"),
            code::WINDOW_NO_REDEFINE_ORDER_BY
        );
        assert_eq!(
            err("SELECT 1 FROM t WINDOW a AS (ROWS UNBOUNDED PRECEDING), b AS (a)"),
            code::WINDOW_NO_INHERIT_FRAME
        );

        let named = named_windows(&[]).unwrap();
        let over = ast::WindowType::NamedWindow(ast::Ident::new("w"));
        assert_eq!(resolve(&over, &named).unwrap_err().code, code::WINDOW_NO_SUCH_WINDOW);
    }

    fn run(func: WinFunc, args: Vec<Expr>, order: bool, frame: Option<Frame>, vals: &[i64]) -> Vec<String> {
        let spec = WinSpec {
            func,
            args,
            partition: vec![],
            order: if order { vec![(Expr::Col(0), true)] } else { vec![] },
            frame: frame.unwrap_or(WinSpec::default_frame(order)),
        };
        let rows: Pending = vals.iter().map(|&v| (vec![Val::Int(v)], vec![])).collect();
        one(&spec, &rows, None)
            .unwrap()
            .into_iter()
            .map(|v| v.to_string_lossy().unwrap_or_else(|| "NULL".into()))
            .collect()
    }

    #[test]
    fn ranking_functions() {
        let v = [10, 20, 20, 30];
        assert_eq!(run(WinFunc::RowNumber, vec![], true, None, &v), ["1", "2", "3", "4"]);
        assert_eq!(run(WinFunc::Rank, vec![], true, None, &v), ["1", "2", "2", "4"]);
        assert_eq!(run(WinFunc::DenseRank, vec![], true, None, &v), ["1", "2", "2", "3"]);
        assert_eq!(run(WinFunc::CumeDist, vec![], true, None, &v), ["0.25", "0.75", "0.75", "1"]);
        assert_eq!(
            run(WinFunc::Ntile, vec![Expr::Lit(Val::Int(3))], true, None, &[1, 2, 3, 4, 5]),
            ["1", "1", "2", "2", "3"]
        );
    }

    #[test]
    fn offsets_and_frames() {
        let v = [1, 2, 3, 4];
        let col = || Expr::Col(0);
        assert_eq!(run(WinFunc::Lag, vec![col()], true, None, &v), ["NULL", "1", "2", "3"]);
        assert_eq!(
            run(WinFunc::Lead, vec![col(), Expr::Lit(Val::Int(2)), Expr::Lit(Val::Int(0))], true, None, &v),
            ["3", "4", "0", "0"]
        );
        // Running sum by default with ORDER BY; peers count together.
        assert_eq!(run(WinFunc::Agg(AggKind::Sum), vec![col()], true, None, &[1, 2, 2, 4]), ["1", "5", "5", "9"]);
        // The whole partition without ORDER BY.
        assert_eq!(run(WinFunc::Agg(AggKind::Sum), vec![col()], false, None, &v), ["10", "10", "10", "10"]);
        let sliding = Frame::Rows(Bound::Preceding(1), Bound::Following(1));
        assert_eq!(run(WinFunc::Agg(AggKind::Sum), vec![col()], true, Some(sliding), &v), ["3", "6", "9", "7"]);
        assert_eq!(run(WinFunc::LastValue, vec![col()], true, None, &[1, 2, 2]), ["1", "2", "2"]);
        assert_eq!(run(WinFunc::Agg(AggKind::CountStar), vec![], true, None, &v), ["1", "2", "3", "4"]);
    }
}

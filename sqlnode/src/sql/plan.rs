//! Access paths: how rows of one table are found for a WHERE clause. Pure: takes the bound
//! WHERE and the table, returns the plan.
//!
//! - equality on every primary key column → one key read;
//! - a single-column primary key `IN (constants)` → one batched key read;
//! - a short bounded range of a single-column integer primary key (`id BETWEEN 5 AND 104`, at
//!   most [`MAX_RANGE_AS_KEYS`] values) → a read of every key in it: one call per data node
//!   instead of an index scan stream per partition (keys hash across them all), which names
//!   the run's first key and length rather than each key (`Client::read_key_range`);
//! - equality on every column of a unique index → a key read of its hidden table, then of the
//!   row (two single-partition reads instead of a scan of every partition);
//! - equality on leading columns of an ordered index (`PRIMARY` included) and/or a range on
//!   the next one → an index range scan (the filters are pushed down with it);
//! - otherwise a scan of every partition with the simple `column <op> constant` conjuncts pushed
//!   down as data-node filters.
//!
//! Pushed filters and key values are exact conversions of the SQL constants
//! ([`SqlType::exact_storage`]), so they never drop a row the WHERE clause would keep; the
//! executor evaluates the whole WHERE clause again on every row it gets.

use shoal_client::IndexRange;
use shoal_proto::filter::{CmpOp, Filter};
use shoal_proto::Value;

use crate::sql::bind::TableRef;
use crate::sql::expr::{Cmp, Expr};
use crate::val::Val;

/// Most keys one statement reads through a batched key read.
pub const MAX_KEY_READS: usize = 10_000;
/// Most keys a bounded range of a single-column integer primary key is read as, key by key.
pub const MAX_RANGE_AS_KEYS: i128 = 128;

#[derive(Clone, Debug, PartialEq)]
pub enum Access {
    /// No row can match (e.g. a key constant that does not fit the key column).
    Nothing,
    /// Primary key values in key order.
    Key(Vec<Value>),
    Keys(Vec<Vec<Value>>),
    /// The `count` consecutive values of the single integer primary key column from `lo` (in
    /// its storage: a DECIMAL key's scaled integers), in key order.
    KeyRun {
        lo: i128,
        count: u32,
    },
    /// The unique index named, at these values (in index column order).
    Unique(String, Vec<Value>),
    Scan(Vec<Filter>),
    /// A scan of the one partition every matching row lives in (equality on the whole
    /// partition key of a `PARTITION BY KEY` table), with filters.
    Partition(u32, Vec<Filter>),
    /// A range of an ordered index, in every partition or the one named, with filters.
    Range(IndexRange, Option<u32>, Vec<Filter>, Ordered),
}

/// Set when an index range also gives the query's ORDER BY: the rows arrive sorted, and the
/// query needs only the first `limit` (LIMIT + OFFSET) that pass its WHERE clause.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ordered {
    pub limit: u32,
}

impl Access {
    /// One line for EXPLAIN and logs.
    pub fn describe(&self) -> String {
        match self {
            Access::Nothing => "no rows (impossible WHERE)".into(),
            Access::Key(_) => "primary key read".into(),
            Access::Keys(k) => format!("batched primary key read of {} keys", k.len()),
            Access::KeyRun { count, .. } => format!("batched primary key read of {count} consecutive keys"),
            Access::Unique(ix, _) => format!("unique key read of index {ix}"),
            Access::Scan(f) if f.is_empty() => "full scan".into(),
            Access::Scan(f) => format!("scan with {} pushed-down filter(s)", f.len()),
            Access::Partition(p, f) => format!("scan of partition {p} with {} pushed-down filter(s)", f.len()),
            Access::Range(r, p, f, o) => format!(
                "{} of index {} ({}){} with {} pushed-down filter(s){}",
                if r.lower.is_empty() && r.upper.is_empty() { "ordered scan" } else { "range scan" },
                r.index,
                describe_range(r),
                p.map_or(String::new(), |p| format!(" in partition {p}")),
                f.len(),
                match o.limit {
                    0 => String::new(),
                    n => format!(", in ORDER BY order: stops after {n} row(s)"),
                }
            ),
        }
    }

    /// The data-node filters of a scan.
    pub fn filters(&self) -> &[Filter] {
        match self {
            Access::Scan(f) | Access::Partition(_, f) | Access::Range(_, _, f, _) => f,
            _ => &[],
        }
    }
}

fn cmp_op(c: Cmp) -> Option<CmpOp> {
    Some(match c {
        Cmp::Eq => CmpOp::Eq,
        Cmp::Ne => CmpOp::Ne,
        Cmp::Lt => CmpOp::Lt,
        Cmp::Le => CmpOp::Le,
        Cmp::Gt => CmpOp::Gt,
        Cmp::Ge => CmpOp::Ge,
        Cmp::NullSafeEq => return None,
    })
}

/// A comparison of a column with NULL (`col = NULL`, `col BETWEEN NULL AND x`): never true.
/// Preparing a statement runs it with NULL in every placeholder; this keeps that run from
/// scanning the whole table.
fn never_true(e: &Expr) -> bool {
    let null = |x: &Expr| matches!(x, Expr::Lit(v) if v.is_null());
    match e {
        Expr::Between(x, lo, hi, false) => matches!(x.as_ref(), Expr::Col(_)) && (null(lo) || null(hi)),
        _ => column_vs_const(e).is_some_and(|(_, op, v)| v.is_null() && op != Cmp::NullSafeEq),
    }
}

/// `col <op> constant` in either order, normalized to the column on the left.
fn column_vs_const(e: &Expr) -> Option<(usize, Cmp, &Val)> {
    match e {
        Expr::Cmp(op, a, b) => match (a.as_ref(), b.as_ref()) {
            (Expr::Col(c), Expr::Lit(v)) => Some((*c, *op, v)),
            (Expr::Lit(v), Expr::Col(c)) => Some((*c, op.flip(), v)),
            _ => None,
        },
        _ => None,
    }
}

/// The primary key a WHERE clause pins down, if that is all it says: every conjunct is an
/// equality of a primary-key column with a constant that converts exactly to the key. UPDATE
/// and DELETE of that one row need not read it first.
pub fn key_only(t: &TableRef, filter: Option<&Expr>) -> Option<Vec<Value>> {
    let conj = filter?.conjuncts();
    let pk = &t.table.spec.primary_key;
    if t.table.hidden_pk || conj.len() != pk.len() {
        return None;
    }
    let on_key = |e: &&Expr| matches!(column_vs_const(e), Some((c, Cmp::Eq, _)) if pk.contains(&(c as u32)));
    if !conj.iter().all(on_key) {
        return None;
    }
    match choose(t, filter) {
        Access::Key(k) => Some(k),
        _ => None,
    }
}

/// Whether every row `access` yields satisfies all of `filter`, so that the SQL node need not
/// evaluate it again: key reads made from every conjunct there is, on integer primary-key
/// columns (`k = c` for each key column, `k IN (...)`, `k BETWEEN a AND b`, or one lower and
/// one upper bound). A row found under such a key equals a constant the conjuncts accept.
/// Anything else (more conjuncts, other types, whose collation or rounding a storage equality
/// need not share) is evaluated again.
pub fn filter_implied(t: &TableRef, filter: Option<&Expr>, access: &Access) -> bool {
    let Some(filter) = filter else { return true };
    let pk = &t.table.spec.primary_key;
    if t.table.hidden_pk || !pk.iter().all(|&c| matches!(t.types[c as usize], crate::types::SqlType::Int { .. })) {
        return false;
    }
    // A key column compared with a constant that converts exactly to its storage.
    let exact = |c: usize, v: &Val| pk.contains(&(c as u32)) && t.types[c].exact_storage(v).is_some();
    let on_key = |e: &Expr| column_vs_const(e).filter(|&(c, _, v)| exact(c, v)).map(|(_, op, _)| op);
    let lit_on_key = |x: &Expr, e: &Expr| matches!((x, e), (Expr::Col(c), Expr::Lit(v)) if exact(*c, v));
    let conj = filter.conjuncts();
    match (access, conj.as_slice()) {
        // As many equalities as key columns: `choose` made the key of exactly them.
        (Access::Key(_), _) => conj.len() == pk.len() && conj.iter().all(|e| on_key(e) == Some(Cmp::Eq)),
        (Access::Keys(_), [Expr::InList(x, list, false)]) => {
            matches!(x.as_ref(), Expr::Col(c) if pk.contains(&(*c as u32)))
                && list.iter().all(|i| matches!(i, Expr::Lit(_)))
        }
        (Access::Keys(_) | Access::KeyRun { .. }, [Expr::Between(x, lo, hi, false)]) => {
            lit_on_key(x, lo) && lit_on_key(x, hi)
        }
        (Access::Keys(_) | Access::KeyRun { .. }, [a, b]) => {
            let lower = |op| matches!(op, Some(Cmp::Gt | Cmp::Ge));
            let upper = |op| matches!(op, Some(Cmp::Lt | Cmp::Le));
            let (a, b) = (on_key(a), on_key(b));
            (lower(a) && upper(b)) || (upper(a) && lower(b))
        }
        _ => false,
    }
}

pub fn choose(t: &TableRef, filter: Option<&Expr>) -> Access {
    let Some(filter) = filter else { return Access::Scan(vec![]) };
    let conj = filter.conjuncts();
    if conj.iter().any(|e| matches!(e, Expr::Lit(v) if v.truth() != Some(true)) || never_true(e)) {
        return Access::Nothing;
    }
    let pk: Vec<usize> = t.table.spec.primary_key.iter().map(|&k| k as usize).collect();
    let hidden = t.table.hidden_pk;

    // Full primary key equality.
    if !hidden {
        let mut key: Vec<Option<Value>> = vec![None; pk.len()];
        let mut impossible = false;
        for e in &conj {
            if let Some((c, Cmp::Eq, v)) = column_vs_const(e) {
                if let Some(pos) = pk.iter().position(|&k| k == c) {
                    match t.types[c].exact_storage(v) {
                        Some(sv) => key[pos] = Some(sv),
                        // `pk = 1.5` on an integer key, `pk = NULL`: no row has that key.
                        None if v.is_null() || v.is_numeric() => impossible = true,
                        None => {}
                    }
                }
            }
        }
        if impossible {
            return Access::Nothing;
        }
        if key.iter().all(Option::is_some) {
            return Access::Key(key.into_iter().flatten().collect());
        }
        // Single-column key IN (...).
        if pk.len() == 1 {
            for e in &conj {
                if let Expr::InList(x, list, false) = e {
                    if !matches!(x.as_ref(), Expr::Col(c) if *c == pk[0]) || list.len() > MAX_KEY_READS {
                        continue;
                    }
                    let mut keys: Vec<Vec<Value>> = vec![];
                    let mut all_exact = true;
                    for item in list {
                        match item {
                            Expr::Lit(v) if v.is_null() => {}
                            Expr::Lit(v) => match t.types[pk[0]].exact_storage(v) {
                                Some(sv) => {
                                    if !keys.iter().any(|k| k[0] == sv) {
                                        keys.push(vec![sv]);
                                    }
                                }
                                None if v.is_numeric() => {}
                                None => all_exact = false,
                            },
                            _ => all_exact = false,
                        }
                    }
                    if all_exact {
                        return if keys.is_empty() { Access::Nothing } else { Access::Keys(keys) };
                    }
                }
            }
            if let Some(a) = short_key_range(t, &conj, pk[0]) {
                return a;
            }
        }
    }

    // Equality on every column of a unique index. FLOAT columns are left to range scans:
    // their stored values need not equal a constant's exact conversion.
    for ix in t.table.unique_indexes() {
        // A prefix index's entry holds the value's prefix: the one row with that prefix is
        // read, and the WHERE clause, evaluated again on it, decides.
        let key: Option<Vec<Value>> = ix
            .columns
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let c = c as usize;
                if t.table.columns()[c].ty == shoal_proto::ColumnType::Float {
                    return None;
                }
                conj.iter().find_map(|e| match column_vs_const(e) {
                    Some((col, Cmp::Eq, v)) if col == c => t.types[c].exact_storage(v).map(|v| ix.cut(i, v)),
                    _ => None,
                })
            })
            .collect();
        if let Some(key) = key.filter(|k| !k.iter().any(|v| matches!(v, Value::Null))) {
            return Access::Unique(ix.name.clone(), key);
        }
    }

    // Equality on the whole partition key (when it is not the primary key): one partition.
    let part = &t.table.spec.partition_key;
    let mut partition = None;
    if !hidden && part.len() < pk.len() && !part.is_empty() {
        let mut key: Vec<Value> = vec![Value::Null; pk.len()];
        let mut found = 0;
        for &c in part {
            let c = c as usize;
            let v = conj.iter().find_map(|e| match column_vs_const(e) {
                Some((col, Cmp::Eq, v)) if col == c => t.types[c].exact_storage(v),
                _ => None,
            });
            if let (Some(v), Some(pos)) = (v, pk.iter().position(|&k| k == c)) {
                key[pos] = v;
                found += 1;
            }
        }
        if found == part.len() {
            partition = Some(shoal_proto::codec::partition_of_key(&t.table, &key));
        }
    }

    // Scan with pushed-down filters.
    let mut filters = vec![];
    for e in &conj {
        match e {
            Expr::IsNull(x, neg) => {
                if let Expr::Col(c) = x.as_ref() {
                    let op = if *neg { CmpOp::NotNull } else { CmpOp::IsNull };
                    filters.push(Filter { column: *c as u32, op, value: Value::Null });
                }
            }
            other => {
                if let Some((c, op, v)) = column_vs_const(other) {
                    if let (Some(op), Some(sv)) = (cmp_op(op), t.types[c].exact_storage(v)) {
                        filters.push(Filter { column: c as u32, op, value: sv });
                    }
                }
            }
        }
    }
    if let Some(range) = index_range(t, &conj) {
        return Access::Range(range, partition, filters, Ordered::default());
    }
    match partition {
        Some(p) => Access::Partition(p, filters),
        None => Access::Scan(filters),
    }
}

/// Turns `access` into an index walk in the order of `order` (table columns, ascending?) when
/// an ordered index gives that order: a range already chosen on that index (its columns
/// bound by equality may come first), or a full walk of an index instead of a plain scan.
/// `want` is LIMIT + OFFSET. None when no index gives the order.
pub fn order_by_index(t: &TableRef, access: &Access, order: &[(usize, bool)], want: u64) -> Option<Access> {
    let asc = order.first()?.1;
    if order.iter().any(|(_, a)| *a != asc) || want == 0 || want > u64::from(u32::MAX) {
        return None;
    }
    let cols: Vec<u32> = order.iter().map(|(c, _)| *c as u32).collect();
    // Where in the index the order columns may start: after any columns the range pins.
    // Entries sort by the index columns, then by primary key.
    let fits = |ix: &shoal_proto::IndexSpec, pinned: usize| {
        let mut sorted_by = ix.columns.clone();
        sorted_by.extend(t.table.spec.primary_key.iter().filter(|k| !ix.columns.contains(k)));
        (0..=pinned.min(ix.columns.len())).any(|k| sorted_by[k..].starts_with(&cols))
    };
    let ordered = Ordered { limit: want as u32 };
    match access {
        Access::Range(r, p, f, _) => {
            let ix = t.table.indexes.iter().find(|i| i.name == r.index)?;
            let pinned = r.lower.iter().zip(&r.upper).take_while(|(a, b)| a == b && !matches!(a, Value::Null)).count();
            fits(ix, pinned)
                .then(|| Access::Range(IndexRange { descending: !asc, ..r.clone() }, *p, f.clone(), ordered))
        }
        Access::Scan(f) | Access::Partition(_, f) => {
            let only = match access {
                Access::Partition(p, _) => Some(*p),
                _ => None,
            };
            let ix = t.table.indexes.iter().find(|ix| fits(ix, 0))?;
            let range = IndexRange { index: ix.name.clone(), descending: !asc, ..Default::default() };
            Some(Access::Range(range, only, f.clone(), ordered))
        }
        _ => None,
    }
}

/// `lower ≤ / < column`, `column ≤ / < upper` bounds of one column from the conjuncts (exact
/// storage values only); equal bounds from `=`.
#[derive(Default)]
struct Bounds {
    eq: Option<Value>,
    lower: Option<(Value, bool)>,
    upper: Option<(Value, bool)>,
}

fn bounds_of(t: &TableRef, conj: &[&Expr], col: usize) -> Bounds {
    let mut b = Bounds::default();
    let exact = |v: &Val| t.types[col].exact_storage(v);
    for e in conj {
        match e {
            Expr::Between(x, lo, hi, false) if matches!(x.as_ref(), Expr::Col(c) if *c == col) => {
                if let (Expr::Lit(lo), Expr::Lit(hi)) = (lo.as_ref(), hi.as_ref()) {
                    if let (Some(lo), Some(hi)) = (exact(lo), exact(hi)) {
                        b.lower.get_or_insert((lo, true));
                        b.upper.get_or_insert((hi, true));
                    }
                }
            }
            other => {
                let Some((c, op, v)) = column_vs_const(other) else { continue };
                if c != col {
                    continue;
                }
                let Some(sv) = exact(v) else { continue };
                match op {
                    Cmp::Eq => b.eq = Some(sv),
                    Cmp::Gt => {
                        b.lower.get_or_insert((sv, false));
                    }
                    Cmp::Ge => {
                        b.lower.get_or_insert((sv, true));
                    }
                    Cmp::Lt => {
                        b.upper.get_or_insert((sv, false));
                    }
                    Cmp::Le => {
                        b.upper.get_or_insert((sv, true));
                    }
                    Cmp::Ne | Cmp::NullSafeEq => {}
                }
            }
        }
    }
    b
}

/// Every key of a bounded range of the integer primary key column `col`, when there are few.
/// Exact for any integer storage (DECIMAL included: its stored integers are all its values).
fn short_key_range(t: &TableRef, conj: &[&Expr], col: usize) -> Option<Access> {
    let b = bounds_of(t, conj, col);
    let ((lo, lo_inclusive), (hi, hi_inclusive)) = (b.lower?, b.upper?);
    let int = |v: &Value| match v {
        Value::Int(i) => Some(i128::from(*i)),
        Value::Uint(u) => Some(i128::from(*u)),
        _ => None,
    };
    let lo = int(&lo)? + i128::from(!lo_inclusive);
    let hi = int(&hi)? - i128::from(!hi_inclusive);
    if lo > hi {
        return Some(Access::Nothing);
    }
    if hi - lo >= MAX_RANGE_AS_KEYS {
        return None;
    }
    Some(Access::KeyRun { lo, count: u32::try_from(hi - lo + 1).ok()? })
}

/// The best ordered-index range for the conjuncts: the index with the most leading columns
/// bound by equality, then a range on the next column. None when no index helps.
fn index_range(t: &TableRef, conj: &[&Expr]) -> Option<IndexRange> {
    let mut best: Option<(usize, IndexRange)> = None;
    for ix in &t.table.indexes {
        let mut prefix = vec![];
        let mut range = None;
        for &c in &ix.columns {
            let b = bounds_of(t, conj, c as usize);
            if let Some(v) = b.eq {
                prefix.push(v);
                continue;
            }
            if b.lower.is_some() || b.upper.is_some() {
                range = Some(b);
            }
            break;
        }
        let score = prefix.len() * 2 + usize::from(range.is_some());
        if score == 0 || best.as_ref().is_some_and(|(s, _)| *s >= score) {
            continue;
        }
        let mut r = IndexRange {
            index: ix.name.clone(),
            lower: prefix.clone(),
            lower_inclusive: true,
            upper: prefix,
            upper_inclusive: true,
            descending: false,
        };
        if let Some(b) = range {
            match b.lower {
                Some((v, inclusive)) => {
                    r.lower.push(v);
                    r.lower_inclusive = inclusive;
                }
                // `col < x` never matches NULL, which sorts first: start after the NULLs.
                None => {
                    r.lower.push(Value::Null);
                    r.lower_inclusive = false;
                }
            }
            if let Some((v, inclusive)) = b.upper {
                r.upper.push(v);
                r.upper_inclusive = inclusive;
            }
        }
        best = Some((score, r));
    }
    best.map(|(_, r)| r)
}

fn describe_range(r: &IndexRange) -> String {
    let one = |v: &Value| match v {
        Value::Null => "NULL".to_string(),
        Value::Int(i) => i.to_string(),
        Value::Uint(u) => u.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Text(t) => format!("'{t}'"),
        Value::Bytes(b) => format!("0x{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
    };
    let show = |vals: &[Value]| vals.iter().map(one).collect::<Vec<_>>().join(", ");
    let lo = if r.lower.is_empty() {
        "-inf".to_string()
    } else {
        format!("{}{}", if r.lower_inclusive { "[" } else { "(" }, show(&r.lower))
    };
    let hi = if r.upper.is_empty() {
        "+inf".to_string()
    } else {
        format!("{}{}", show(&r.upper), if r.upper_inclusive { "]" } else { ")" })
    };
    format!("{lo} .. {hi}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::{Column, ColumnType, Table, TableSpec};

    fn table(pk: Vec<u32>) -> TableRef {
        let mut cols = vec![
            Column::new("a", ColumnType::Int),
            Column::new("b", ColumnType::Text),
            Column::new("c", ColumnType::Int),
        ];
        cols[0].sql_type = "int".into();
        cols[1].sql_type = "varchar(10)".into();
        cols[2].sql_type = "int".into();
        let (spec, hidden_pk) = TableSpec { name: "d.t".into(), columns: cols, primary_key: pk, partition_key: vec![] }
            .normalize()
            .unwrap();
        TableRef::new(
            "d",
            "t",
            Table { id: 1, spec, partition_count: 8, schema_version: 1, hidden_pk, ..Default::default() },
        )
    }

    fn col(i: usize) -> Box<Expr> {
        Box::new(Expr::Col(i))
    }
    fn lit(v: Val) -> Box<Expr> {
        Box::new(Expr::Lit(v))
    }

    /// The WHERE clause is skipped only where the keys read are exactly what it accepts.
    #[test]
    fn a_filter_is_implied_only_by_keys_made_from_all_of_it() {
        let cmp = |op, c: usize, v: i64| Expr::Cmp(op, col(c), lit(Val::Int(v)));
        let and = |x: Expr, y: Expr| Expr::And(Box::new(x), Box::new(y));
        let between = |c: usize, a: Val, b: Val| Expr::Between(col(c), lit(a), lit(b), false);
        let t = table(vec![0]);
        let implied = |f: &Expr| filter_implied(&t, Some(f), &choose(&t, Some(f)));
        assert!(implied(&cmp(Cmp::Eq, 0, 5)));
        assert!(implied(&between(0, Val::Int(1), Val::Int(10))));
        assert!(implied(&and(cmp(Cmp::Gt, 0, 1), cmp(Cmp::Le, 0, 10))));
        assert!(implied(&Expr::InList(col(0), vec![Expr::Lit(Val::Int(1)), Expr::Lit(Val::Null)], false)));
        // A second bound on the same side: the keys come from the first only.
        assert!(!implied(&and(cmp(Cmp::Gt, 0, 1), cmp(Cmp::Gt, 0, 5))));
        assert!(!implied(&and(and(cmp(Cmp::Gt, 0, 1), cmp(Cmp::Lt, 0, 9)), cmp(Cmp::Ne, 0, 4))));
        // Another column, a negated range, a non-integer bound, a text key.
        assert!(!implied(&and(cmp(Cmp::Eq, 0, 5), cmp(Cmp::Eq, 2, 1))));
        assert!(!implied(&Expr::Between(col(0), lit(Val::Int(1)), lit(Val::Int(3)), true)));
        assert!(!implied(&between(0, Val::Float(0.5), Val::Int(3))));
        let t = table(vec![1]);
        let f = Expr::Cmp(Cmp::Eq, col(1), lit(Val::Str("x".into())));
        assert!(!filter_implied(&t, Some(&f), &choose(&t, Some(&f))));
        // Scans always evaluate it.
        let t = table(vec![0]);
        let f = cmp(Cmp::Gt, 2, 1);
        assert!(!filter_implied(&t, Some(&f), &choose(&t, Some(&f))));
    }

    #[test]
    fn key_only_is_the_whole_key_and_nothing_else() {
        let eq = |c: usize, v: Val| Expr::Cmp(Cmp::Eq, col(c), lit(v));
        let and = |x: Expr, y: Expr| Expr::And(Box::new(x), Box::new(y));
        let t = table(vec![0]);
        assert_eq!(key_only(&t, Some(&eq(0, Val::Int(5)))), Some(vec![Value::Int(5)]));
        let flipped = Expr::Cmp(Cmp::Eq, lit(Val::Int(5)), col(0));
        assert_eq!(key_only(&t, Some(&flipped)), Some(vec![Value::Int(5)]));
        // Anything more, or less, than the key: the row must be read and checked.
        assert_eq!(key_only(&t, Some(&and(eq(0, Val::Int(5)), eq(2, Val::Int(1))))), None);
        assert_eq!(key_only(&t, Some(&and(eq(0, Val::Int(5)), eq(0, Val::Int(6))))), None);
        assert_eq!(key_only(&t, Some(&Expr::Cmp(Cmp::Gt, col(0), lit(Val::Int(5))))), None);
        assert_eq!(key_only(&t, Some(&eq(0, Val::Float(1.5)))), None);
        assert_eq!(key_only(&t, None), None);
        // A composite key needs every column.
        let t = table(vec![0, 2]);
        assert_eq!(key_only(&t, Some(&eq(0, Val::Int(5)))), None);
        let both = and(eq(2, Val::Int(1)), eq(0, Val::Int(5)));
        assert_eq!(key_only(&t, Some(&both)), Some(vec![Value::Int(5), Value::Int(1)]));
        // A hidden key is no key a statement can name.
        assert_eq!(key_only(&table(vec![]), Some(&eq(0, Val::Int(5)))), None);
    }

    #[test]
    fn unique_index_equality_reads_two_keys() {
        let mut t = table(vec![0]);
        let ix = |name: &str, columns: Vec<u32>, unique| shoal_proto::IndexSpec {
            id: 2,
            name: name.into(),
            columns,
            unique,
            prefix_lens: vec![],
        };
        std::sync::Arc::make_mut(&mut t.table).indexes = vec![ix("bc", vec![1, 2], true), ix("c_only", vec![2], false)];
        let b = Expr::Cmp(Cmp::Eq, col(1), lit(Val::Str("x".into())));
        let c = Expr::Cmp(Cmp::Eq, lit(Val::Int(3)), col(2));
        let both = Expr::And(Box::new(b.clone()), Box::new(c.clone()));
        let key = vec![Value::Text("x".into()), Value::Int(3)];
        assert_eq!(choose(&t, Some(&both)), Access::Unique("bc".into(), key));
        // Part of the unique key, or a non-unique index: no single row is named.
        assert!(!matches!(choose(&t, Some(&c)), Access::Unique(..)));
        std::sync::Arc::make_mut(&mut t.table).indexes[1].unique = true;
        assert_eq!(choose(&t, Some(&c)), Access::Unique("c_only".into(), vec![Value::Int(3)]));
        // The primary key comes first.
        let pk = Expr::And(Box::new(Expr::Cmp(Cmp::Eq, col(0), lit(Val::Int(1)))), Box::new(c));
        assert_eq!(choose(&t, Some(&pk)), Access::Key(vec![Value::Int(1)]));
    }

    #[test]
    fn key_reads_and_scans() {
        let t = table(vec![0]);
        let eq = Expr::Cmp(Cmp::Eq, col(0), lit(Val::Int(5)));
        assert_eq!(choose(&t, Some(&eq)), Access::Key(vec![Value::Int(5)]));
        let flipped = Expr::Cmp(Cmp::Eq, lit(Val::Int(5)), col(0));
        assert_eq!(choose(&t, Some(&flipped)), Access::Key(vec![Value::Int(5)]));
        let half = Expr::Cmp(Cmp::Eq, col(0), lit(Val::Float(1.5)));
        assert_eq!(choose(&t, Some(&half)), Access::Nothing);
        // A short range of the integer key: every key in it; a long or open one: a range scan.
        let short = Expr::Between(col(0), lit(Val::Int(5)), lit(Val::Int(7)), false);
        assert_eq!(choose(&t, Some(&short)), Access::KeyRun { lo: 5, count: 3 });
        let open = Expr::And(
            Box::new(Expr::Cmp(Cmp::Gt, col(0), lit(Val::Int(5)))),
            Box::new(Expr::Cmp(Cmp::Lt, col(0), lit(Val::Int(7)))),
        );
        assert_eq!(choose(&t, Some(&open)), Access::KeyRun { lo: 6, count: 1 });
        let empty = Expr::Cmp(Cmp::Gt, col(0), lit(Val::Int(5)));
        let empty = Expr::And(Box::new(empty), Box::new(Expr::Cmp(Cmp::Le, col(0), lit(Val::Int(5)))));
        assert_eq!(choose(&t, Some(&empty)), Access::Nothing);
        let long = Expr::Between(col(0), lit(Val::Int(0)), lit(Val::Int(MAX_RANGE_AS_KEYS as i64)), false);
        assert!(matches!(choose(&t, Some(&long)), Access::Range(..) | Access::Scan(_)));
        // Comparisons with NULL (a statement prepared with NULL placeholders) read nothing.
        let between = Expr::Between(col(2), lit(Val::Null), lit(Val::Int(9)), false);
        assert_eq!(choose(&t, Some(&between)), Access::Nothing);
        assert_eq!(choose(&t, Some(&Expr::Cmp(Cmp::Lt, col(2), lit(Val::Null)))), Access::Nothing);
        let null_safe = Expr::Cmp(Cmp::NullSafeEq, col(2), lit(Val::Null));
        assert_ne!(choose(&t, Some(&null_safe)), Access::Nothing);
        let inl =
            Expr::InList(col(0), vec![Expr::Lit(Val::Int(1)), Expr::Lit(Val::Int(2)), Expr::Lit(Val::Int(1))], false);
        assert_eq!(choose(&t, Some(&inl)), Access::Keys(vec![vec![Value::Int(1)], vec![Value::Int(2)]]));
        let range = Expr::and(
            Expr::Cmp(Cmp::Gt, lit(Val::Int(3)), col(2)),
            Expr::Cmp(Cmp::Eq, col(1), lit(Val::Str("x".into()))),
        );
        assert_eq!(
            choose(&t, Some(&range)),
            Access::Scan(vec![
                Filter { column: 2, op: CmpOp::Lt, value: Value::Int(3) },
                Filter { column: 1, op: CmpOp::Eq, value: Value::Text("x".into()) },
            ])
        );
        // An OR is evaluated in the SQL node only.
        let or = Expr::Or(Box::new(eq.clone()), Box::new(Expr::Cmp(Cmp::Eq, col(2), lit(Val::Int(1)))));
        assert_eq!(choose(&t, Some(&or)), Access::Scan(vec![]));
        // A string compared with an int column is not pushed (MySQL compares as numbers).
        let s = Expr::Cmp(Cmp::Eq, col(2), lit(Val::Str("1".into())));
        assert_eq!(choose(&t, Some(&s)), Access::Scan(vec![]));
        assert_eq!(choose(&t, Some(&Expr::Lit(Val::Int(0)))), Access::Nothing);
    }

    #[test]
    fn equality_on_the_partition_key_scans_one_partition() {
        let mut t = table(vec![0, 2]);
        std::sync::Arc::make_mut(&mut t.table).spec.partition_key = vec![2];
        let on_c = Expr::Cmp(Cmp::Eq, col(2), lit(Val::Int(7)));
        let want = shoal_proto::codec::partition_of_key(&t.table, &[Value::Null, Value::Int(7)]);
        match choose(&t, Some(&on_c)) {
            Access::Partition(p, f) => {
                assert_eq!(p, want);
                assert_eq!(f.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        // The same rows hash to it when the whole key is known.
        assert_eq!(want, shoal_proto::codec::partition_of_key(&t.table, &[Value::Int(123), Value::Int(7)]));
        let on_a = Expr::Cmp(Cmp::Eq, col(0), lit(Val::Int(1)));
        assert!(matches!(choose(&t, Some(&on_a)), Access::Scan(_)));
    }

    #[test]
    fn composite_and_hidden_keys() {
        let t = table(vec![0, 2]);
        let one = Expr::Cmp(Cmp::Eq, col(0), lit(Val::Int(1)));
        assert!(matches!(choose(&t, Some(&one)), Access::Scan(f) if f.len() == 1));
        let both = Expr::and(one.clone(), Expr::Cmp(Cmp::Eq, col(2), lit(Val::Int(2))));
        assert_eq!(choose(&t, Some(&both)), Access::Key(vec![Value::Int(1), Value::Int(2)]));
        let hidden = table(vec![]);
        assert!(matches!(choose(&hidden, Some(&one)), Access::Scan(f) if f.len() == 1));
    }
}

//! Running a [`QueryPlan`] in the SQL node: rows of the FROM tree (scans read beforehand,
//! derived tables, joins in [`crate::sql::join`]), then WHERE, grouping and aggregates, HAVING,
//! projection, DISTINCT, ORDER BY and LIMIT ([`SelectRun`]), and set operations.
//!
//! Pure and synchronous: every base table the plan names was read before it runs (or, for the
//! single-table top-level query, is streamed into a [`SelectRun`] by the caller). Memory is
//! bounded by `MAX_BUFFERED_ROWS` rows per buffer and `MAX_GROUPS` groups; passing one is a
//! clear error (1038), not an unbounded allocation.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use crate::error::{code, SqlError, SqlResult};
use crate::sql::expr::{Acc, AggKind, Expr, Outer};
use crate::sql::query::{Body, From, QueryPlan, RecursivePlan, SelectPlan, SetOp, SortKey};
use crate::val::{sort_cmp, Val};

/// Most rows a statement holds in the SQL node at once per buffer (results, sort buffers, keys
/// to write, rows of a table read for a join or subquery).
pub const MAX_BUFFERED_ROWS: usize = 1_000_000;
/// Most groups of one GROUP BY.
pub const MAX_GROUPS: usize = 100_000;

pub fn too_many(what: &str, n: usize) -> SqlError {
    SqlError::new(
        code::OUT_OF_SORTMEMORY,
        format!("Out of sort memory: the statement needs more than {n} {what} in the SQL node; add a WHERE or LIMIT"),
    )
}

/// Runs a plan whose tables have been read; `outer` are the enclosing queries' rows.
pub fn run(plan: &QueryPlan, outer: Option<&Outer<'_>>) -> SqlResult<Vec<Vec<Val>>> {
    match &plan.body {
        Body::Select(sp) => {
            let mut run = SelectRun::new(sp, outer);
            each_row(&sp.from, outer, &mut |row| run.feed(row))?;
            run.finish()
        }
        Body::Set { op, all, left, right, text_cols } => {
            let mut l = run(left, outer)?;
            let mut r = run(right, outer)?;
            for row in l.iter_mut().chain(r.iter_mut()) {
                for &i in text_cols {
                    if let Some(v) = row.get_mut(i).filter(|v| v.is_numeric()) {
                        *v = Val::Str(v.to_string_lossy().unwrap_or_default());
                    }
                }
            }
            set_op(*op, *all, l, r)
        }
        Body::Sorted { input, order, limit, offset } => {
            let mut rows = run(input, outer)?;
            if !order.is_empty() {
                rows.sort_by(|a, b| {
                    for &(i, asc) in order {
                        let o = sort_cmp(&a[i], &b[i]);
                        let o = if asc { o } else { o.reverse() };
                        if o != Ordering::Equal {
                            return o;
                        }
                    }
                    Ordering::Equal
                });
            }
            let skip = (*offset).min(rows.len() as u64) as usize;
            let take = limit.map_or(usize::MAX, |l| l.min(usize::MAX as u64) as usize);
            Ok(rows.into_iter().skip(skip).take(take).collect())
        }
        Body::Recursive(r) => recursive(r),
    }
}

/// Most rounds a recursive CTE's steps run that still add rows, unless the session sets
/// `cte_max_recursion_depth` (MySQL's default); a query that needs more is stopped with an
/// error, which is what ends a runaway recursion early (the row bound would end it later).
pub const CTE_MAX_RECURSION_DEPTH: u64 = 1000;

/// Runs a recursive CTE: the seeds, then rounds of the steps over the previous round's new
/// rows, until a round adds none.
fn recursive(r: &RecursivePlan) -> SqlResult<Vec<Vec<Val>>> {
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut all: Vec<Vec<Val>> = vec![];
    let mut fresh: Vec<Vec<Val>> = vec![];
    let mut add = |rows: Vec<Vec<Val>>, fresh: &mut Vec<Vec<Val>>, total: usize| -> SqlResult<()> {
        for row in rows {
            if r.distinct && !seen.insert(row_key(&row)) {
                continue;
            }
            if total + fresh.len() >= MAX_BUFFERED_ROWS {
                return Err(too_many("rows", MAX_BUFFERED_ROWS));
            }
            fresh.push(row);
        }
        Ok(())
    };
    for seed in &r.seeds {
        add(run(seed, None)?, &mut fresh, 0)?;
    }
    let mut round = 0u64;
    while !fresh.is_empty() {
        if round > r.max_depth {
            return Err(SqlError::new(
                code::CTE_MAX_RECURSION_DEPTH,
                format!("Recursive query aborted after {round} iterations. Try increasing @@cte_max_recursion_depth to a larger value."),
            ));
        }
        round += 1;
        r.work.set(fresh.clone());
        all.append(&mut fresh);
        for step in &r.steps {
            add(run(step, None)?, &mut fresh, all.len())?;
        }
    }
    r.work.set(vec![]);
    Ok(all)
}

/// The columns of `table` a SELECT over it alone looks at (positions, ascending): what a key
/// read needs to fetch. Empty (= all) when a subquery or window function is in the plan (a
/// correlated subquery sees the whole row); the primary key when no column is looked at (the
/// rows still have to be found).
pub fn needed_columns(sp: &SelectPlan, table: &crate::sql::bind::TableRef) -> Vec<u32> {
    if !sp.windows.is_empty() {
        return vec![];
    }
    let mut used = vec![false; table.types.len()];
    let mut all = false;
    let mut visit = |e: &crate::sql::expr::Expr| {
        e.walk(&mut |x| match x {
            crate::sql::expr::Expr::Col(i) => match used.get_mut(*i) {
                Some(u) => *u = true,
                None => all = true,
            },
            crate::sql::expr::Expr::Subquery(_) => all = true,
            _ => {}
        })
    };
    sp.filter.iter().chain(&sp.outputs).chain(&sp.group_exprs).chain(&sp.having).for_each(&mut visit);
    for (k, _) in &sp.order {
        if let SortKey::Expr(e) = k {
            visit(e);
        }
    }
    for a in &sp.aggs {
        a.arg.iter().chain(a.order.iter().map(|(e, _)| e)).for_each(&mut visit);
    }
    if all {
        return vec![];
    }
    let cols: Vec<u32> = (0..used.len()).filter(|&i| used[i]).map(|i| i as u32).collect();
    if cols.is_empty() {
        return table.table.spec.primary_key.clone();
    }
    cols
}

fn row_key(row: &[Val]) -> Vec<u8> {
    let mut k = vec![];
    for v in row {
        v.group_key(&mut k);
    }
    k
}

/// UNION / INTERSECT / EXCEPT of two results (DISTINCT unless `all`).
fn set_op(op: SetOp, all: bool, l: Vec<Vec<Val>>, r: Vec<Vec<Val>>) -> SqlResult<Vec<Vec<Val>>> {
    if l.len().saturating_add(r.len()) > MAX_BUFFERED_ROWS {
        return Err(too_many("rows", MAX_BUFFERED_ROWS));
    }
    let mut seen = HashSet::new();
    Ok(match op {
        SetOp::Union if all => l.into_iter().chain(r).collect(),
        SetOp::Union => l.into_iter().chain(r).filter(|row| seen.insert(row_key(row))).collect(),
        SetOp::Intersect | SetOp::Except => {
            let right: HashSet<Vec<u8>> = r.iter().map(|row| row_key(row)).collect();
            let keep_in_right = op == SetOp::Intersect;
            l.into_iter()
                .filter(|row| {
                    let k = row_key(row);
                    right.contains(&k) == keep_in_right && (all || seen.insert(k))
                })
                .collect()
        }
    })
}

/// Calls `f` with every row of a FROM tree until it returns false; false when stopped.
pub fn each_row(
    from: &From,
    outer: Option<&Outer<'_>>,
    f: &mut dyn FnMut(Vec<Val>) -> SqlResult<bool>,
) -> SqlResult<bool> {
    match from {
        From::Dual => f(vec![]),
        From::Scan(s) => {
            let rows =
                s.rows.get().ok_or_else(|| SqlError::internal(format!("table {} was not read", s.table.name)))?;
            for r in rows {
                if !f(r.clone())? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        From::Values(v) => {
            for r in v.rows.iter() {
                if !f(r.clone())? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        From::Derived(d) => {
            for r in derived_rows(d)? {
                if !f(r.clone())? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        From::Join(j) => crate::sql::join::each(j, outer, f),
        From::Work { table, .. } => {
            for r in table.rows().iter() {
                if !f(r.clone())? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

/// A derived table's rows, computed on first use (it does not depend on enclosing rows).
pub fn derived_rows(d: &crate::sql::query::Derived) -> SqlResult<&Vec<Vec<Val>>> {
    if let Some(r) = d.rows.get() {
        return Ok(r);
    }
    let rows = run(&d.plan, None)?;
    Ok(d.rows.get_or_init(|| rows))
}

/// One group's accumulators, with the values already seen by DISTINCT aggregates.
struct Group {
    /// A row of the group: what non-aggregated expressions read.
    rep: Vec<Val>,
    accs: Vec<Acc>,
    seen: Vec<Option<HashSet<Vec<u8>>>>,
}

/// The SELECT pipeline's state: filtering, grouping, buffering for ORDER BY/DISTINCT, LIMIT.
pub struct SelectRun<'p> {
    plan: &'p SelectPlan,
    outer: Option<&'p Outer<'p>>,
    /// (sort keys that are no output column, output row): see `key_at`.
    buffer: Vec<(Vec<Val>, Vec<Val>)>,
    /// Where each ORDER BY key of a buffered row is: an output is not computed or copied
    /// again (the planner names a key that is an output's column by that output).
    key_at: Vec<KeyAt>,
    /// The ORDER BY keys that are no output, in order: `KeyAt::Extra` indexes them.
    extra_keys: Vec<&'p Expr>,
    /// The input column each output moves out of its row, where the output is that column and
    /// no other output is (a text value then moves instead of being copied).
    moves: Vec<Option<usize>>,
    /// The columns the outputs move out of, when every output does and in column order
    /// (`SELECT c` or `SELECT id, c`, no expression): the output row is then the input row's
    /// vector, compacted, not a new one.
    in_place: Option<Vec<usize>>,
    groups: HashMap<Vec<u8>, usize>,
    group_rows: Vec<Group>,
    /// Values held by DISTINCT aggregates, over all groups.
    distinct_values: usize,
    /// Values held by GROUP_CONCAT, over all groups.
    concat_values: usize,
    /// Rows past HAVING waiting for their window function values.
    pending: crate::sql::window::Pending,
    /// The input arrives in ORDER BY order (an index walk): no sort, stop at LIMIT + OFFSET.
    presorted: bool,
    /// Every input row satisfies the WHERE clause already (see `plan::filter_implied`).
    filtered: bool,
}

/// Where a buffered row's sort key is (see `SelectRun::key_at`).
#[derive(Clone, Copy)]
enum KeyAt {
    Out(usize),
    Extra(usize),
}

/// The value of a buffered row's sort key at `at` (NULL when the row has none there).
fn key(row: &(Vec<Val>, Vec<Val>), at: KeyAt) -> &Val {
    static NULL: Val = Val::Null;
    match at {
        KeyAt::Out(i) => row.1.get(i),
        KeyAt::Extra(i) => row.0.get(i),
    }
    .unwrap_or(&NULL)
}

/// The positions of `keys` in sorted order: NULL (None) first, then byte order, reversed when
/// not `asc`; equal keys keep their order. Each key is compared first by its first eight bytes
/// as one big-endian number (zero-padded), and by the whole bytes only when those tie: a
/// prefix that sorts lower belongs to a key that sorts lower, since a key that ends early
/// sorts before any longer one. Comparing the bytes alone (a `memcmp` call per comparison)
/// was two thirds of the cost of sorting sysbench's 100-row ranges by their `c`.
fn byte_order(keys: &[Option<&[u8]>], asc: bool) -> Vec<usize> {
    let prefix = |k: &[u8]| {
        let mut b = [0u8; 8];
        let n = k.len().min(8);
        b[..n].copy_from_slice(&k[..n]);
        u64::from_be_bytes(b)
    };
    let mut nulls = vec![];
    let mut keyed: Vec<(u64, usize)> = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        match k {
            Some(k) => keyed.push((prefix(k), i)),
            None => nulls.push(i),
        }
    }
    let full = |i: usize| keys[i].unwrap_or_default();
    // The position breaks ties, so an unstable sort keeps equal keys in their order. One
    // comparison per direction: a single one reversing by `asc` cost the sort half again.
    match asc {
        true => keyed.sort_unstable_by(|a, b| match a.0.cmp(&b.0) {
            Ordering::Equal => full(a.1).cmp(full(b.1)).then(a.1.cmp(&b.1)),
            o => o,
        }),
        false => keyed.sort_unstable_by(|a, b| match b.0.cmp(&a.0) {
            Ordering::Equal => full(b.1).cmp(full(a.1)).then(a.1.cmp(&b.1)),
            o => o,
        }),
    }
    let sorted = keyed.into_iter().map(|(_, i)| i);
    // NULL sorts first: before every key ascending, after them descending.
    match asc {
        true => nulls.into_iter().chain(sorted).collect(),
        false => sorted.chain(nulls).collect(),
    }
}

impl<'p> SelectRun<'p> {
    pub fn new(plan: &'p SelectPlan, outer: Option<&'p Outer<'p>>) -> SelectRun<'p> {
        let mut extra_keys = vec![];
        let key_at = plan
            .order
            .iter()
            .map(|(k, _)| match k {
                SortKey::Out(i) => KeyAt::Out(*i),
                SortKey::Expr(e) => {
                    extra_keys.push(e);
                    KeyAt::Extra(extra_keys.len() - 1)
                }
            })
            .collect();
        let column = |e: &Expr| match e {
            Expr::Col(i) => Some(*i),
            _ => None,
        };
        let moves: Vec<Option<usize>> = plan
            .outputs
            .iter()
            .map(|e| column(e).filter(|&i| plan.outputs.iter().filter(|o| column(o) == Some(i)).count() == 1))
            .collect();
        let in_place =
            moves.iter().copied().collect::<Option<Vec<usize>>>().filter(|cols| cols.windows(2).all(|w| w[0] < w[1]));
        SelectRun {
            plan,
            outer,
            key_at,
            extra_keys,
            moves,
            in_place,
            buffer: vec![],
            groups: HashMap::new(),
            group_rows: vec![],
            distinct_values: 0,
            concat_values: 0,
            pending: vec![],
            presorted: false,
            filtered: false,
        }
    }

    /// Says the rows will be fed in ORDER BY order (see `presorted`).
    pub fn presorted(&mut self) {
        self.presorted = true;
    }

    /// Says every row fed satisfies the WHERE clause (see `filtered`).
    pub fn filtered(&mut self) {
        self.filtered = true;
    }

    /// Takes the one group of a query without GROUP BY as aggregated elsewhere (the data
    /// nodes: `agg_pushdown`), instead of rows: `accs` are its finished accumulators. Only
    /// for plans whose outputs read aggregates alone, so its row's columns are never read.
    pub fn take_group(&mut self, accs: Vec<Acc>) {
        let mut g = self.new_group(vec![Val::Null; self.plan.width]);
        g.accs = accs;
        self.group_rows.push(g);
    }

    fn new_group(&self, rep: Vec<Val>) -> Group {
        let p = self.plan;
        Group {
            rep,
            accs: p.aggs.iter().map(|a| Acc::new(a.kind)).collect(),
            seen: p.aggs.iter().map(|a| a.distinct.then(HashSet::new)).collect(),
        }
    }

    /// The group `row` belongs to, made if it is the first of its group.
    fn group_of(&mut self, row: &[Val]) -> SqlResult<usize> {
        let mut key = vec![];
        for g in &self.plan.group_exprs {
            g.eval_in(row, &[], self.outer)?.group_key(&mut key);
        }
        Ok(match self.groups.get(&key) {
            Some(&i) => i,
            None => {
                if self.group_rows.len() >= MAX_GROUPS {
                    return Err(too_many("groups", MAX_GROUPS));
                }
                let g = self.new_group(row.to_vec());
                self.group_rows.push(g);
                self.groups.insert(key, self.group_rows.len() - 1);
                self.group_rows.len() - 1
            }
        })
    }

    /// Takes one input row; false = enough rows, stop reading.
    pub fn feed(&mut self, mut row: Vec<Val>) -> SqlResult<bool> {
        let p = self.plan;
        if let Some(f) = p.filter.as_ref().filter(|_| !self.filtered) {
            if f.eval_in(&row, &[], self.outer)?.truth() != Some(true) {
                return Ok(true);
            }
        }
        if p.grouped {
            let idx = if p.group_exprs.is_empty() && !self.group_rows.is_empty() {
                // Aggregates without GROUP BY: one group, no key to build and look up per row.
                0
            } else {
                self.group_of(&row)?
            };
            for (i, spec) in p.aggs.iter().enumerate() {
                let v = match &spec.arg {
                    Some(e) => Some(e.eval_in(&row, &[], self.outer)?),
                    None => None,
                };
                let keys = match (&v, spec.order.is_empty()) {
                    (Some(v), false) if !v.is_null() => spec
                        .order
                        .iter()
                        .map(|(e, _)| e.eval_in(&row, &[], self.outer))
                        .collect::<SqlResult<Vec<_>>>()?,
                    _ => vec![],
                };
                let g = &mut self.group_rows[idx];
                if let (Some(seen), Some(v)) = (&mut g.seen[i], &v) {
                    if v.is_null() {
                        continue;
                    }
                    let mut k = vec![];
                    v.group_key(&mut k);
                    if !seen.insert(k) {
                        continue;
                    }
                    self.distinct_values += 1;
                    if self.distinct_values > MAX_BUFFERED_ROWS {
                        return Err(too_many("distinct values", MAX_BUFFERED_ROWS));
                    }
                }
                if spec.kind == AggKind::GroupConcat {
                    if let Some(v) = v.filter(|v| !v.is_null()) {
                        self.concat_values += 1;
                        if self.concat_values > MAX_BUFFERED_ROWS {
                            return Err(too_many("GROUP_CONCAT values", MAX_BUFFERED_ROWS));
                        }
                        g.accs[i].add_keyed(v, keys);
                    }
                    continue;
                }
                g.accs[i].add(spec.kind, v)?;
            }
            return Ok(true);
        }
        let plain = p.having.is_none() && p.windows.is_empty();
        if let Some(cols) = self.in_place.as_deref().filter(|c| plain && c.last().is_none_or(|&i| i < row.len())) {
            // `emit_out` without a new vector: output `j` is swapped into place `j` (its
            // source is at or after `j`, and what the swap moves there no later output
            // needs), then the rest is cut off.
            let keys = self.sort_keys(&row, &[])?;
            for (j, &c) in cols.iter().enumerate() {
                row.swap(j, c);
            }
            row.truncate(cols.len());
            self.buffer.push((keys, row));
            return self.after_push();
        }
        self.emit(&mut row, &[])
    }

    /// The ORDER BY keys of a row that are no output column.
    fn sort_keys(&self, row: &[Val], aggs: &[Val]) -> SqlResult<Vec<Val>> {
        self.extra_keys.iter().map(|e| e.eval_in(row, aggs, self.outer)).collect()
    }

    /// Computes one output row from an input row (or group) and buffers it; the row's values
    /// may move into the output.
    fn emit(&mut self, row: &mut [Val], aggs: &[Val]) -> SqlResult<bool> {
        let p = self.plan;
        if let Some(h) = &p.having {
            if h.eval_in(row, aggs, self.outer)?.truth() != Some(true) {
                return Ok(true);
            }
        }
        if !p.windows.is_empty() {
            // Window functions need every row first.
            if self.pending.len() >= MAX_BUFFERED_ROWS {
                return Err(too_many("rows", MAX_BUFFERED_ROWS));
            }
            self.pending.push((row.to_vec(), aggs.to_vec()));
            return Ok(true);
        }
        self.emit_out(row, aggs)
    }

    /// The output row (and sort keys) of a row past HAVING, buffered; the row's values may
    /// move into it.
    fn emit_out(&mut self, row: &mut [Val], aggs: &[Val]) -> SqlResult<bool> {
        let p = self.plan;
        // Keys first: they may read columns the outputs then take.
        let keys = self.sort_keys(row, aggs)?;
        // The computed outputs next, then the columns that move: the computed ones may read them.
        let mut out = Vec::with_capacity(p.outputs.len());
        for (e, m) in p.outputs.iter().zip(&self.moves) {
            out.push(match m {
                Some(_) => Val::Null,
                None => e.eval_in(row, aggs, self.outer)?,
            });
        }
        for (o, m) in out.iter_mut().zip(&self.moves) {
            if let Some(v) = m.and_then(|i| row.get_mut(i)) {
                *o = std::mem::replace(v, Val::Null);
            }
        }
        self.buffer.push((keys, out));
        self.after_push()
    }

    /// LIMIT and the buffer's bounds after an output row went into the buffer: false when no
    /// more rows are wanted.
    fn after_push(&mut self) -> SqlResult<bool> {
        let p = self.plan;
        let wanted = p.limit.map(|l| l.saturating_add(p.offset) as usize);
        if (p.order.is_empty() || self.presorted) && !p.distinct && !p.grouped {
            if let Some(w) = wanted {
                return Ok(self.buffer.len() < w);
            }
        }
        if let (false, Some(w)) = (p.order.is_empty(), wanted) {
            // Top-k: keep the buffer near the rows that can still be in the result.
            if !p.distinct && self.buffer.len() > w.saturating_mul(2).max(1024) {
                self.sort();
                self.buffer.truncate(w);
            }
        }
        if self.buffer.len() > MAX_BUFFERED_ROWS {
            return Err(too_many("rows", MAX_BUFFERED_ROWS));
        }
        Ok(true)
    }

    /// Whether DISTINCT may keep the first of each run of equal rows after the ORDER BY sort:
    /// when the sort keys are exactly the outputs (each at least once, nothing else; see
    /// `key_at`), and each output holds values of one kind for which "compares equal" is
    /// "same DISTINCT key" (`Val::group_key`) and the order is total: integers, floats,
    /// strings, bytes, NULL. Mixed kinds (1 and '1' compare equal but are distinct) and
    /// decimals (compared through floats when rescaling overflows) keep the hashing.
    fn distinct_by_sorting(&self) -> bool {
        let width = self.plan.outputs.len();
        let keys_are_outputs = self.extra_keys.is_empty()
            && (0..width).all(|i| self.key_at.iter().any(|k| matches!(k, KeyAt::Out(j) if *j == i)));
        keys_are_outputs
            && (0..width).all(|i| {
                let mut kind = None;
                self.buffer.iter().all(|(_, out)| {
                    let k = match out.get(i) {
                        Some(Val::Null) => return true,
                        Some(Val::Int(_)) => 0,
                        Some(Val::UInt(_)) => 1,
                        Some(Val::Float(_)) => 2,
                        Some(Val::Str(_)) => 3,
                        Some(Val::Bytes(_)) => 4,
                        Some(Val::Dec(_)) | None => return false,
                    };
                    *kind.get_or_insert(k) == k
                })
            })
    }

    fn sort(&mut self) {
        let keys: Vec<(KeyAt, bool)> =
            self.key_at.iter().copied().zip(self.plan.order.iter().map(|(_, asc)| *asc)).collect();
        if let [(at, asc)] = keys[..] {
            if self.sort_by_bytes(at, asc) {
                return;
            }
        }
        self.buffer.sort_by(|a, b| {
            for (at, asc) in &keys {
                let o = sort_cmp(key(a, *at), key(b, *at));
                let o = if *asc { o } else { o.reverse() };
                if o != Ordering::Equal {
                    return o;
                }
            }
            Ordering::Equal
        });
    }

    /// Sorts by one key whose values are all text or bytes (or NULL) by comparing the bytes
    /// alone, as [`sort_cmp`] would (NULL first, then byte order; equal keys keep their
    /// order); false, with nothing done, for any other key. The general comparison looks up
    /// the key's place and matches both values' kinds on every comparison: sorting sysbench's
    /// 100-row ranges by their 120-character `c` that way was 7% of a SQL node's
    /// instructions per `oltp_read_write` transaction.
    fn sort_by_bytes(&mut self, at: KeyAt, asc: bool) -> bool {
        let mut keys: Vec<Option<&[u8]>> = Vec::with_capacity(self.buffer.len());
        for row in &self.buffer {
            keys.push(match key(row, at) {
                Val::Null => None,
                Val::Str(s) => Some(s.as_bytes()),
                Val::Bytes(b) => Some(b.as_slice()),
                _ => return false,
            });
        }
        let order = byte_order(&keys, asc);
        let mut rows: Vec<Option<(Vec<Val>, Vec<Val>)>> =
            std::mem::take(&mut self.buffer).into_iter().map(Some).collect();
        // `order` holds each position once, so every row is taken exactly once.
        self.buffer = order.into_iter().filter_map(|i| rows[i].take()).collect();
        true
    }

    pub fn finish(mut self) -> SqlResult<Vec<Vec<Val>>> {
        let p = self.plan;
        if p.grouped {
            if self.group_rows.is_empty() && p.group_exprs.is_empty() {
                // Aggregates over no rows still give one row (COUNT(*) = 0).
                let g = self.new_group(vec![Val::Null; p.width]);
                self.group_rows.push(g);
            }
            let groups = std::mem::take(&mut self.group_rows);
            for mut g in groups {
                let vals: Vec<Val> = p.aggs.iter().zip(&g.accs).map(|(s, a)| a.finish_spec(s)).collect();
                self.emit(&mut g.rep, &vals)?;
            }
        }
        if !p.windows.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            let values = crate::sql::window::compute(&p.windows, &pending, self.outer)?;
            for ((mut row, mut aggs), w) in pending.into_iter().zip(values) {
                aggs.resize(p.aggs.len(), Val::Null);
                aggs.extend(w);
                self.emit_out(&mut row, &aggs)?;
            }
        }
        let mut sorted = self.presorted;
        if p.distinct {
            if self.distinct_by_sorting() {
                // Sorted, equal rows are neighbours: dropping each row equal to the one kept
                // before it is DISTINCT without a key and a hash per row, and the sort is
                // stable, so the row kept is the first one, as below.
                self.sort();
                sorted = true;
                self.buffer.dedup_by(|b, a| b.1.iter().zip(&a.1).all(|(x, y)| sort_cmp(x, y) == Ordering::Equal));
            } else {
                let mut seen = HashSet::with_capacity(self.buffer.len());
                self.buffer.retain(|(_, out)| seen.insert(row_key(out)));
            }
        }
        if !p.order.is_empty() && !sorted {
            self.sort();
        }
        let rows = std::mem::take(&mut self.buffer);
        let skip = p.offset.min(rows.len() as u64) as usize;
        let take = p.limit.map_or(usize::MAX, |l| l.min(usize::MAX as u64) as usize);
        Ok(rows.into_iter().skip(skip).take(take).map(|(_, out)| out).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::byte_order;

    /// The order of `byte_order` is that of a stable sort of the keys themselves (Option's
    /// order puts None first), for keys that tie on their first eight bytes, end inside them,
    /// hold zero bytes, or are equal.
    #[test]
    fn byte_order_is_the_stable_order_of_the_bytes() {
        let texts: [&[u8]; 14] = [
            b"",
            b"\0",
            b"a",
            b"a\0",
            b"a\0x",
            b"abcdefgh",
            b"abcdefgh",
            b"abcdefgh\0",
            b"abcdefghi",
            b"abcdefgg\xff",
            b"\xff\xff",
            b"b",
            b"abcdefgi",
            b"abcdefgha",
        ];
        let mut keys: Vec<Option<&[u8]>> = texts.iter().map(|t| Some(*t)).collect();
        keys.insert(3, None);
        keys.push(None);
        // Several arrangements of the same keys: rotations and the reverse.
        for turn in 0..keys.len() {
            for reverse in [false, true] {
                let mut ks = keys.clone();
                ks.rotate_left(turn);
                if reverse {
                    ks.reverse();
                }
                for asc in [true, false] {
                    let mut want: Vec<usize> = (0..ks.len()).collect();
                    want.sort_by(|&a, &b| if asc { ks[a].cmp(&ks[b]) } else { ks[b].cmp(&ks[a]) });
                    assert_eq!(byte_order(&ks, asc), want, "turn {turn} reverse {reverse} asc {asc}");
                }
            }
        }
    }
}

//! Queries and DML over the cluster: SELECT, INSERT/REPLACE (VALUES or SELECT), UPDATE and
//! DELETE.
//!
//! A query is planned against the catalog ([`crate::sql::query`]), then its tables are read —
//! each through the access path [`crate::sql::plan`] picks for its pushed-down conditions —
//! and the plan runs in the SQL node ([`crate::sql::select`]). A SELECT over one base table
//! streams that table's rows into the pipeline as they arrive (LIMIT stops the scan early);
//! tables of joins, subqueries and derived tables are read first, within `MAX_BUFFERED_ROWS`.
//!
//! UPDATE and DELETE run inside the session's transaction, or one of their own under
//! autocommit (`Session::write_once`): they lock the rows they read, so they are atomic. One
//! row named by its whole primary key with literal values (or `col = col ± n`) is a single key
//! write instead (`update_by_key`, `delete_by_key`), atomic by itself. A plain multi-row INSERT
//! that fails part-way deletes the rows it had inserted before reporting the error.
//!
//! **AUTO_INCREMENT** (allowed only as the whole primary key): each SQL node keeps the next
//! value per table, starting from one scan for the column's maximum. Values are claimed by the
//! insert itself — the primary key makes a value taken by another SQL node fail with a duplicate
//! key — and on such a collision the node rescans and retries the statement (bounded), so values
//! are unique cluster-wide, increasing per SQL node, and not gap-free.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use shoal_client::{KeyOp, RowDecoder, Values};
use shoal_proto::{ErrorCode, ShoalError, TriggerEvent, Value};
use sqlparser::ast;
use tokio_stream::StreamExt;

use crate::error::{code, SqlError, SqlResult};
use crate::session::{object_parts, Outcome, ResultSet, Session};
use crate::sql::agg_pushdown;
use crate::sql::bind::{Binder, Scope, TableRef};
use crate::sql::expr::Expr;
use crate::sql::plan::{self, Access};
use crate::sql::query::{const_count, Body, Catalog, Entry, From, Planner, QueryPlan, Scan};
use crate::sql::select::{too_many, SelectRun};
pub use crate::sql::select::{MAX_BUFFERED_ROWS, MAX_GROUPS};
use crate::trigger::{has_triggers, RowPair};
use crate::types::{SqlRows, SqlType};
use crate::val::Val;

/// Tables of one statement read at the same time (joins, subqueries).
const MAX_PARALLEL_TABLE_READS: usize = 4;
/// Most distinct tables and views one statement names.
pub const MAX_NAMES_PER_STATEMENT: usize = 64;
/// Key operations sent to the cluster per batch.
pub const WRITE_BATCH: usize = 1000;
/// Attempts of one ON DUPLICATE KEY UPDATE row whose conflicting row keeps changing under it.
const UPSERT_ATTEMPTS: usize = 5;
/// Attempts of an INSERT whose AUTO_INCREMENT values collided with another SQL node's.
const AUTOINC_ATTEMPTS: usize = 5;

/// An UPDATE bound to its table: (column, new value) in assignment order, WHERE, ORDER BY
/// (expression, ascending) and LIMIT.
pub struct BoundUpdate {
    t: TableRef,
    sets: Vec<(usize, Expr)>,
    filter: Option<Expr>,
    order: Vec<(Expr, bool)>,
    limit: Option<u64>,
}

/// A DELETE bound to its table: WHERE, ORDER BY and LIMIT.
pub struct BoundDelete {
    t: TableRef,
    filter: Option<Expr>,
    order: Vec<(Expr, bool)>,
    limit: Option<u64>,
}

fn cluster_err(e: &ShoalError, t: &TableRef) -> SqlError {
    match e.code {
        ErrorCode::NoSuchTable => SqlError::no_such_table(&t.db, &t.name),
        _ => SqlError::from_cluster(e),
    }
}

fn dup_entry(t: &TableRef, row: &[Value]) -> SqlError {
    let key: Vec<String> = t
        .table
        .spec
        .primary_key
        .iter()
        .map(|&k| {
            let v = row.get(k as usize).map_or(Val::Null, |v| t.types[k as usize].load(v));
            v.to_string_lossy().unwrap_or_else(|| "NULL".into())
        })
        .collect();
    SqlError::new(code::DUP_ENTRY, format!("Duplicate entry '{}' for key '{}.PRIMARY'", key.join("-"), t.name))
}

impl Session {
    fn table_of(&self, f: &ast::TableFactor) -> SqlResult<(Vec<String>, Option<String>)> {
        match f {
            ast::TableFactor::Table { name, alias, args: None, .. } => {
                Ok((object_parts(name), alias.as_ref().map(|a| a.name.value.clone())))
            }
            _ => Err(SqlError::not_supported("derived tables and table functions")),
        }
    }

    /// Feeds every row the access path yields to `f` as (storage row, SQL values), until `f`
    /// returns false.
    pub async fn for_each_row(
        &self,
        t: &TableRef,
        access: Access,
        f: impl FnMut(&[Value], Vec<Val>) -> SqlResult<bool>,
    ) -> SqlResult<()> {
        self.rows_of(t, access, true, &[], f).await
    }

    /// Feeds every row the access path yields to `f` as SQL values, until `f` returns false.
    /// `columns`: the only columns `f` looks at (empty = all); the others may come as NULL.
    pub async fn for_each_val(
        &self,
        t: &TableRef,
        access: Access,
        columns: &[u32],
        mut f: impl FnMut(Vec<Val>) -> SqlResult<bool>,
    ) -> SqlResult<()> {
        self.rows_of(t, access, false, columns, |_, row| f(row)).await
    }

    /// [`Session::for_each_row`]; without `keep_stored` the storage row passed is empty and
    /// the values move into the SQL row instead of being copied (every SELECT row saves an
    /// allocation per text column).
    async fn rows_of(
        &self,
        t: &TableRef,
        access: Access,
        keep_stored: bool,
        columns: &[u32],
        mut take: impl FnMut(&[Value], Vec<Val>) -> SqlResult<bool>,
    ) -> SqlResult<()> {
        let name = &t.table.spec.name;
        let sql_rows = SqlRows::new(&t.table, &t.types, columns);
        let mut f = |row: Vec<Value>| -> SqlResult<bool> {
            if keep_stored {
                let vals = row.iter().zip(t.types.iter()).map(|(v, ty)| ty.load(v)).collect();
                take(&row, vals)
            } else {
                take(&[], sql_rows.convert(row))
            }
        };
        let keys = match access {
            Access::Nothing => return Ok(()),
            // Key reads take their keys (a short range's hundred keys are not copied).
            Access::Key(k) => vec![k],
            Access::Keys(keys) => keys,
            Access::KeyRun { lo, count } if keep_stored => {
                for row in self.kv_key_run(name, lo, count, columns, &Values).await.map_err(|e| cluster_err(&e, t))? {
                    if !f(row)? {
                        break;
                    }
                }
                return Ok(());
            }
            Access::KeyRun { lo, count } => {
                // The rows go straight into SQL values (sysbench's ranges: 400 rows a transaction).
                let rows =
                    self.kv_key_run(name, lo, count, columns, &sql_rows).await.map_err(|e| cluster_err(&e, t))?;
                for vals in rows {
                    if !take(&[], vals)? {
                        break;
                    }
                }
                return Ok(());
            }
            Access::Unique(ix, key) => {
                // The entry names the row; the caller checks the row against the WHERE clause
                // again, so a row that changed in between is not taken for a match.
                let Some(ix) = t.table.indexes.iter().find(|i| i.name == ix) else { return Ok(()) };
                let hidden = t.table.unique_table_name(ix);
                let entry = self.kv_get(&hidden, key).await.map_err(|e| cluster_err(&e, t))?;
                if let Some(entry) = entry {
                    let pk = entry[ix.columns.len()..].to_vec();
                    if let Some(row) = self.kv_get(name, pk).await.map_err(|e| cluster_err(&e, t))? {
                        f(row)?;
                    }
                }
                return Ok(());
            }
            scan => {
                let written = self.txn_written(name).await;
                let locking = self.read_lock() != shoal_client::LockMode::None && self.in_cluster_txn().await;
                return self.scan_rows(t, &scan, written, locking, &mut f).await;
            }
        };
        let rows = self.kv_batch_get(name, keys, columns).await.map_err(|e| cluster_err(&e, t))?;
        for row in rows.into_iter().flatten() {
            if !f(row)? {
                break;
            }
        }
        Ok(())
    }

    /// The rows of a scan access path. A scan reads committed rows at the data nodes; inside
    /// a transaction that wrote the keys `written` of the table, the rows at those keys come
    /// through the transaction instead (its pending images: an inserted row is there, a
    /// deleted one gone, an updated one new), each kept when it lies within the access path
    /// (its filters, partition and index range), and the scan's rows at those keys are
    /// skipped. `locking` (FOR UPDATE, or UPDATE and DELETE finding their rows inside a
    /// transaction): the scan only finds the keys, and every row is read again under its lock
    /// through the transaction. The transaction's rows come after the scan's, so an index
    /// range is not in index order then (`run_plan` does not take the index's order when the
    /// transaction wrote the table).
    async fn scan_rows(
        &self,
        t: &TableRef,
        access: &Access,
        written: Vec<Vec<Value>>,
        locking: bool,
        f: &mut impl FnMut(Vec<Value>) -> SqlResult<bool>,
    ) -> SqlResult<()> {
        let (name, table) = (&t.table.spec.name, &t.table);
        let encode = |key: &[Value]| shoal_proto::codec::encode_key_ref(table, key).ok();
        let mine: std::collections::HashSet<Vec<u8>> = written.iter().filter_map(|k| encode(k)).collect();
        let mut keys = vec![];
        let mut stream = self.scan_stream(name, access);
        while let Some(row) = stream.next().await {
            let row = row.map_err(|e| cluster_err(&e, t))?;
            if mine.is_empty() && !locking {
                if !f(row)? {
                    return Ok(());
                }
                continue;
            }
            let key = table.key_of(&row);
            if encode(&key).is_some_and(|k| mine.contains(&k)) {
                continue;
            }
            if locking {
                keys.push(key);
            } else if !f(row)? {
                return Ok(());
            }
        }
        drop(stream);
        keys.extend(written);
        for chunk in keys.chunks(500) {
            let rows = self.kv_batch_get(name, chunk.to_vec(), &[]).await.map_err(|e| cluster_err(&e, t))?;
            for row in rows.into_iter().flatten() {
                if within(table, access, &row) && !f(row)? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The rows a scan access path reads (every partition, or the one it names).
    fn scan_stream(
        &self,
        name: &str,
        access: &Access,
    ) -> tokio_stream::wrappers::ReceiverStream<Result<Vec<Value>, ShoalError>> {
        let only = match access {
            Access::Partition(p, _) => Some(*p),
            Access::Range(range, only, filters, ordered) => {
                // An ORDER BY … LIMIT walk needs about `limit` rows from each partition.
                let opts = shoal_client::IndexScanOptions {
                    filters: filters.clone(),
                    only: *only,
                    batch_hint: ordered.limit,
                    ..Default::default()
                };
                return self.client().scan_index(name, range.clone(), opts);
            }
            _ => None,
        };
        self.client().scan_partitions(name, only, access.filters().to_vec(), vec![])
    }

    // ----- SELECT -----

    /// Plans with a catalog snapshot that grows as the planner asks for names (see
    /// [`crate::sql::query`]): each round looks up the one name the planner missed.
    pub async fn plan<T>(&self, f: impl Fn(&Planner<'_>) -> SqlResult<T>) -> SqlResult<T> {
        self.plan_with(Catalog::new(self.db.clone()), f).await
    }

    /// Plans a query, with the base tables its outermost FROM clauses name looked up first (the
    /// common case then plans once).
    pub async fn plan_query<T>(&self, q: &ast::Query, f: impl Fn(&Planner<'_>) -> SqlResult<T>) -> SqlResult<T> {
        let mut catalog = Catalog::new(self.db.clone());
        let mut names = vec![];
        top_level_tables(&q.body, &mut names);
        for parts in names {
            let full = match parts.as_slice() {
                [t] => self.db.as_ref().map(|d| (d.clone(), t.clone())),
                [d, t] => Some((d.clone(), t.clone())),
                _ => None,
            };
            // A table the session may not use is left to the planner's lookup, which says 1142.
            if let Some((db, t)) = full.filter(|(db, _)| self.can_use_db(db)) {
                if let Some(table) = self.table_ref(&db, &t) {
                    catalog.insert(&db, &t, Entry::Table(table));
                }
            }
        }
        self.plan_with(catalog, f).await
    }

    async fn plan_with<T>(&self, mut catalog: Catalog, f: impl Fn(&Planner<'_>) -> SqlResult<T>) -> SqlResult<T> {
        let env = self.env();
        loop {
            let planner = Planner::new(&env, &catalog);
            let r = f(&planner);
            let wanted = planner.wanted.borrow_mut().take();
            match (r, wanted) {
                (Err(_), Some((db, name))) if catalog.len() < MAX_NAMES_PER_STATEMENT => {
                    let entry = self.lookup_name(&db, &name).await?;
                    catalog.insert(&db, &name, entry);
                }
                (Err(_), Some(_)) => {
                    return Err(SqlError::not_supported(format!(
                        "statements naming more than {MAX_NAMES_PER_STATEMENT} tables and views"
                    )))
                }
                (r, _) => return r,
            }
        }
    }

    /// What `db.name` is: a table, a view, or nothing.
    pub async fn lookup_name(&self, db: &str, name: &str) -> SqlResult<Entry> {
        if db.eq_ignore_ascii_case(crate::infoschema::INFORMATION_SCHEMA) {
            return Ok(match self.information_schema(name).await? {
                Some(v) => Entry::Virtual(Arc::new(v)),
                None => Entry::Missing,
            });
        }
        match self.resolve(&[db.to_string(), name.to_string()]).await {
            Ok(t) => Ok(Entry::Table(t)),
            Err(e) if e.code == code::NO_SUCH_TABLE => match self.find_view(db, name).await? {
                Some(v) => Ok(Entry::View(v)),
                None => Ok(Entry::Missing),
            },
            Err(e) => Err(e),
        }
    }

    /// Reads the tables of the subqueries in these expressions (UPDATE and DELETE).
    pub async fn read_subquery_tables(&self, exprs: &[&Expr]) -> SqlResult<()> {
        let mut scans = vec![];
        for e in exprs {
            e.walk(&mut |x| {
                if let Expr::Subquery(s) = x {
                    s.plan.plan.scans(&mut scans);
                }
            });
        }
        self.read_scans(scans, None).await
    }

    /// Reads every table the plan needs that is not streamed (`skip`), each through the access
    /// path its pushed-down conditions allow.
    pub async fn read_tables(&self, plan: &QueryPlan, skip: Option<&crate::sql::query::Scan>) -> SqlResult<()> {
        let mut scans = vec![];
        plan.scans(&mut scans);
        self.read_scans(scans, skip).await
    }

    /// Reads these tables, several at a time (each scan visits the partitions one after
    /// another), at most `MAX_BUFFERED_ROWS` rows in all.
    async fn read_scans(&self, mut scans: Vec<Arc<Scan>>, skip: Option<&Scan>) -> SqlResult<()> {
        scans.retain(|s| !skip.is_some_and(|k| std::ptr::eq(k, s.as_ref())) && s.rows.get().is_none());
        let mut seen = std::collections::HashSet::new();
        scans.retain(|s| seen.insert(Arc::as_ptr(s) as usize));
        drop(seen);
        let held = AtomicUsize::new(0);
        // Boxed into a list first: a lazily mapped stream of borrowing futures trips the
        // compiler's `Send` inference for the connection task.
        type Read<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = SqlResult<()>> + Send + 'a>>;
        let reads: Vec<Read<'_>> = scans.iter().map(|scan| Box::pin(self.read_scan(scan, &held)) as Read<'_>).collect();
        let reads = futures::StreamExt::buffer_unordered(futures::stream::iter(reads), MAX_PARALLEL_TABLE_READS);
        futures::TryStreamExt::try_collect::<Vec<()>>(reads).await?;
        Ok(())
    }

    async fn read_scan(&self, scan: &Scan, held: &AtomicUsize) -> SqlResult<()> {
        let t = &scan.table;
        let access = plan::choose(t, scan.pushed.as_ref());
        let width = t.visible();
        let mut rows = vec![];
        let mut over = false;
        self.for_each_val(t, access, &[], |mut row| {
            if held.fetch_add(1, Ordering::Relaxed) >= MAX_BUFFERED_ROWS {
                over = true;
                return Ok(false);
            }
            row.truncate(width);
            rows.push(row);
            Ok(true)
        })
        .await?;
        if over {
            return Err(too_many("rows", MAX_BUFFERED_ROWS));
        }
        let _ = scan.rows.set(rows);
        Ok(())
    }

    /// Reads what a plan needs and runs it.
    pub async fn run_plan(&self, plan: &QueryPlan) -> SqlResult<Vec<Vec<Val>>> {
        // A SELECT over one base table streams it through its access path.
        if let Body::Select(sp) = &plan.body {
            if let From::Scan(scan) = &sp.from {
                self.read_tables(plan, Some(scan)).await?;
                let mut access = plan::choose(&scan.table, sp.filter.as_ref());
                let mut run = SelectRun::new(sp, None);
                // A transaction's own writes come after the scan's rows (`scan_rows`):
                // then the run sorts them itself.
                let own_writes =
                    matches!(access, Access::Range(..)) && self.txn_wrote(&scan.table.table.spec.name).await;
                if let Some(ordered) = index_order(sp, &scan.table, &access).filter(|_| !own_writes) {
                    access = ordered;
                    run.presorted();
                } else if plan::filter_implied(&scan.table, sp.filter.as_ref(), &access) {
                    run.filtered();
                    if let Some((lo, count, aggs)) = agg_pushdown::pushed(sp, &scan.table, &access, true) {
                        let name = &scan.table.table.spec.name;
                        if let Some(partials) = self.kv_key_run_aggregates(name, lo, count, &aggs).await {
                            run.take_group(agg_pushdown::accumulators(sp, &scan.table, &partials));
                            return run.finish();
                        }
                    }
                }
                let columns = crate::sql::select::needed_columns(sp, &scan.table);
                self.for_each_val(&scan.table, access, &columns, |row| run.feed(row)).await?;
                return run.finish();
            }
        }
        self.read_tables(plan, None).await?;
        crate::sql::select::run(plan, None)
    }

    pub async fn select(&mut self, q: &ast::Query, sql: &str) -> SqlResult<Outcome> {
        let names = crate::sql::parse::select_item_texts(sql);
        let plan = self.plan_query(q, |p| p.query(q, sql, &[], names.as_deref())).await?;
        // FOR UPDATE / FOR SHARE lock what the query reads (inside a transaction).
        let lock = q.locks.iter().fold(shoal_client::LockMode::None, |m, l| match l.lock_type {
            ast::LockType::Update => shoal_client::LockMode::Exclusive,
            ast::LockType::Share if m == shoal_client::LockMode::None => shoal_client::LockMode::Shared,
            _ => m,
        });
        self.set_read_lock(lock);
        let rows = self.run_plan(&plan).await;
        self.set_read_lock(shoal_client::LockMode::None);
        let rows = rows?;
        self.found_rows = rows.len() as u64;
        Ok(Outcome::Rows(ResultSet { columns: plan.columns.into(), rows }))
    }

    // ----- INSERT / REPLACE -----

    pub async fn insert(&mut self, ins: &ast::Insert, sql: &str) -> SqlResult<Outcome> {
        let ast::TableObject::TableName(name) = &ins.table else {
            return Err(SqlError::not_supported("INSERT into a table function"));
        };
        let on_duplicate = match &ins.on {
            None => None,
            Some(ast::OnInsert::DuplicateKeyUpdate(a)) => Some(a),
            Some(_) => return Err(SqlError::not_supported("INSERT ... ON CONFLICT")),
        };
        if on_duplicate.is_some() && (ins.replace_into || ins.ignore) {
            return Err(SqlError::not_supported("ON DUPLICATE KEY UPDATE with REPLACE or IGNORE"));
        }
        if ins.returning.is_some() || ins.partitioned.is_some() {
            return Err(SqlError::not_supported("INSERT with RETURNING / PARTITION"));
        }
        let t = self.resolve(&object_parts(name)).await?;
        let env = self.env();
        // Target columns.
        let mut targets: Vec<usize> = vec![];
        let names: Vec<String> = if !ins.assignments.is_empty() {
            ins.assignments
                .iter()
                .map(|a| match &a.target {
                    ast::AssignmentTarget::ColumnName(n) => Ok(object_parts(n).pop().unwrap_or_default()),
                    _ => Err(SqlError::not_supported("tuple assignment")),
                })
                .collect::<SqlResult<_>>()?
        } else {
            ins.columns.iter().map(|c| object_parts(c).pop().unwrap_or_default()).collect()
        };
        for n in &names {
            let i = t.column(n).ok_or_else(|| SqlError::bad_field(n, "field list"))?;
            if targets.contains(&i) {
                return Err(SqlError::new(code::FIELD_SPECIFIED_TWICE, format!("Column '{n}' specified twice")));
            }
            targets.push(i);
        }
        if names.is_empty() {
            targets = (0..t.visible()).collect();
        }
        // Value rows (None = DEFAULT).
        let value_rows: Vec<Vec<Option<Val>>> = if !ins.assignments.is_empty() {
            vec![ins.assignments.iter().map(|a| value_or_default(&env, &a.value)).collect::<SqlResult<_>>()?]
        } else {
            let src = ins.source.as_ref().ok_or_else(|| SqlError::parse("INSERT without VALUES"))?;
            match src.body.as_ref() {
                ast::SetExpr::Values(v) => {
                    let mut rows = vec![];
                    for (n, r) in v.rows.iter().enumerate() {
                        let exprs = &r.content;
                        if exprs.len() != targets.len() && !(exprs.is_empty() && names.is_empty()) {
                            return Err(SqlError::new(
                                code::WRONG_VALUE_COUNT_ON_ROW,
                                format!("Column count doesn't match value count at row {}", n + 1),
                            ));
                        }
                        if exprs.is_empty() {
                            rows.push(vec![None; targets.len()]);
                        } else {
                            rows.push(exprs.iter().map(|e| value_or_default(&env, e)).collect::<SqlResult<_>>()?);
                        }
                    }
                    rows
                }
                _ => {
                    // INSERT ... SELECT: the query runs first, to completion (bounded like any
                    // result), then its rows are inserted as a VALUES list would be.
                    let Outcome::Rows(rs) = Box::pin(self.select(src, sql)).await? else {
                        return Err(SqlError::internal("INSERT ... SELECT: the query gave no rows"));
                    };
                    if rs.columns.len() != targets.len() {
                        return Err(SqlError::new(
                            code::WRONG_VALUE_COUNT_ON_ROW,
                            "Column count doesn't match value count at row 1",
                        ));
                    }
                    rs.rows.into_iter().map(|r| r.into_iter().map(Some).collect()).collect()
                }
            }
        };
        if value_rows.len() > MAX_BUFFERED_ROWS {
            return Err(too_many("rows", MAX_BUFFERED_ROWS));
        }
        let replace = ins.replace_into;
        let auto_col = t.table.columns().iter().position(|c| c.auto_increment);
        let triggered = has_triggers(&t, TriggerEvent::Insert);
        if on_duplicate.is_some() && (triggered || has_triggers(&t, TriggerEvent::Update)) {
            return Err(SqlError::not_supported("INSERT … ON DUPLICATE KEY UPDATE into a table with triggers"));
        }
        if replace && has_triggers(&t, TriggerEvent::Delete) {
            return Err(SqlError::not_supported("REPLACE into a table with DELETE triggers"));
        }
        if triggered {
            let implicit = self.begin_implicit().await;
            let out = self.insert_fired(&t, &targets, &value_rows, auto_col, replace, ins.ignore).await;
            return self.end_implicit(implicit, out).await;
        }
        if let Some(assignments) = on_duplicate {
            return self
                .insert_or_update(&t, &targets, &value_rows, auto_col, assignments, ins.insert_alias.as_ref())
                .await;
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (rows, first_generated) = self.build_rows(&t, &targets, &value_rows, auto_col).await?;
            match self.write_rows(&t, rows, replace, ins.ignore).await {
                Ok(n) => {
                    if let Some(id) = first_generated {
                        self.last_insert_id = id;
                    }
                    return Ok(Outcome::Done {
                        affected: n,
                        last_insert_id: first_generated.unwrap_or(0),
                        info: String::new(),
                    });
                }
                Err((e, generated_dup)) => {
                    if generated_dup && attempt < AUTOINC_ATTEMPTS {
                        // Another SQL node took these values: learn the new maximum and retry.
                        self.shared.autoinc.lock().remove(&t.table.id);
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// INSERT into a table with INSERT triggers: row by row, as MySQL runs it — the BEFORE
    /// triggers (which may change the row), the write, then the AFTER triggers (not for a row
    /// INSERT IGNORE skipped). The caller runs it inside one transaction.
    async fn insert_fired(
        &mut self,
        t: &TableRef,
        targets: &[usize],
        value_rows: &[Vec<Option<Val>>],
        auto_col: Option<usize>,
        replace: bool,
        ignore: bool,
    ) -> SqlResult<Outcome> {
        let (rows, first_generated) = self.build_rows(t, targets, value_rows, auto_col).await?;
        let mut affected = 0u64;
        for (n, (mut row, generated)) in rows.into_iter().enumerate() {
            let mut new = loaded(t, &row);
            self.fire(t, true, TriggerEvent::Insert, RowPair { new: Some(&mut new), old: None }).await?;
            stored_back(t, &new, &mut row, n + 1)?;
            let written = self.write_rows(t, vec![(row, generated)], replace, ignore).await.map_err(|(e, _)| e)?;
            if written == 0 {
                continue;
            }
            affected += written;
            self.fire(t, false, TriggerEvent::Insert, RowPair { new: Some(&mut new), old: None }).await?;
        }
        if let Some(id) = first_generated {
            self.last_insert_id = id;
        }
        Ok(Outcome::Done { affected, last_insert_id: first_generated.unwrap_or(0), info: String::new() })
    }

    /// `INSERT … ON DUPLICATE KEY UPDATE`: each row is inserted, or, when its primary key is
    /// taken, the row holding it is updated by the assignments (which read that row's columns,
    /// and the proposed row through `VALUES(col)` or the row alias). Row by row, in statement
    /// order, so a later row sees an earlier one. Affected rows count 1 per insert and 2 per
    /// changed row, as MySQL does. Like UPDATE, the read and the write of a conflicting row are
    /// two operations until transactions land; a row deleted in between is inserted instead.
    async fn insert_or_update(
        &mut self,
        t: &TableRef,
        targets: &[usize],
        value_rows: &[Vec<Option<Val>>],
        auto_col: Option<usize>,
        assignments: &[ast::Assignment],
        alias: Option<&ast::InsertAliases>,
    ) -> SqlResult<Outcome> {
        let width = t.visible();
        // Scope: the table's row, then the proposed row (qualified by the row alias only).
        let mut scope = Scope::of_table(t);
        let new_name = alias.map(|a| object_parts(&a.row_alias).pop().unwrap_or_default());
        let mut new_cols = scope.rels[0].cols.to_vec();
        if let Some(names) = alias.and_then(|a| a.col_aliases.as_ref()).filter(|n| !n.is_empty()) {
            if names.len() != width {
                return Err(SqlError::new(code::WRONG_VALUE_COUNT_ON_ROW, "Column count doesn't match value count"));
            }
            for (c, n) in new_cols.iter_mut().zip(names) {
                c.name = n.value.clone();
            }
        }
        let q = new_name.clone().unwrap_or_else(|| "\0values".into());
        scope.push(&q, None, &q, new_cols);
        // Unqualified names mean the table's columns; the proposed row's are named through the
        // row alias or VALUES().
        scope.merged.extend(width..2 * width);
        let env = self.env();
        let mut sets: Vec<(usize, Expr)> = vec![];
        {
            let mut b = Binder::scoped(&env, &scope, &[], None, "field list");
            b.values_offset = Some(width);
            for a in assignments {
                let ast::AssignmentTarget::ColumnName(n) = &a.target else {
                    return Err(SqlError::not_supported("tuple assignment"));
                };
                let cname = object_parts(n).pop().unwrap_or_default();
                let i = t.column(&cname).ok_or_else(|| SqlError::bad_field(&cname, "field list"))?;
                if t.table.spec.primary_key.contains(&(i as u32)) {
                    return Err(SqlError::not_supported("updating primary key columns in ON DUPLICATE KEY UPDATE"));
                }
                sets.push((i, b.bind(&a.value)?));
            }
        }
        let (rows, first_generated) = self.build_rows(t, targets, value_rows, auto_col).await?;
        let name = &t.table.spec.name;
        let mut affected = 0u64;
        for (n, (row, _)) in rows.into_iter().enumerate() {
            let mut attempts = 0;
            loop {
                attempts += 1;
                if attempts > UPSERT_ATTEMPTS {
                    return Err(SqlError::new(
                        code::LOCK_WAIT_TIMEOUT,
                        "ON DUPLICATE KEY UPDATE: the conflicting row kept changing; try again",
                    ));
                }
                let op = KeyOp::Insert { table: name.clone(), row: row.clone() };
                match self.kv_batch(vec![op]).await.pop() {
                    Some(Ok(_)) => {
                        affected += 1;
                        break;
                    }
                    Some(Err(e)) if e.code == ErrorCode::DuplicateKey => {}
                    Some(Err(e)) => return Err(cluster_err(&e, t)),
                    None => return Err(SqlError::internal("INSERT: no answer from the cluster")),
                }
                // The row holding the primary key, else (MySQL's order) one holding a unique value.
                let mut key = if t.table.hidden_pk { None } else { Some(t.table.key_of(&row)) };
                let mut old = None;
                if let Some(k) = &key {
                    old = self.kv_get(name, k.clone()).await.map_err(|e| cluster_err(&e, t))?;
                }
                if old.is_none() && crate::unique::has_unique(&t.table) {
                    key = self.unique_holder(&t.table, &row).await.map_err(|e| cluster_err(&e, t))?;
                    if let Some(k) = &key {
                        old = self.kv_get(name, k.clone()).await.map_err(|e| cluster_err(&e, t))?;
                    }
                }
                let (Some(key), Some(old)) = (key, old) else {
                    continue; // deleted meanwhile: insert again
                };
                let mut vals: Vec<Val> = old.iter().take(width).zip(t.types.iter()).map(|(v, ty)| ty.load(v)).collect();
                vals.extend(row.iter().take(width).zip(t.types.iter()).map(|(v, ty)| ty.load(v)));
                let (mut cols, mut values): (Vec<u32>, Vec<Value>) = (vec![], vec![]);
                for (i, e) in &sets {
                    let v = e.eval(&vals, &[])?;
                    let c = &t.table.columns()[*i];
                    if v.is_null() && !c.nullable {
                        return Err(SqlError::new(code::BAD_NULL, format!("Column '{}' cannot be null", c.name)));
                    }
                    let sv = t.types[*i].store(&c.name, &v, n + 1)?;
                    // Later assignments see earlier ones.
                    vals[*i] = t.types[*i].load(&sv);
                    match cols.iter().position(|&x| x == *i as u32) {
                        Some(p) => values[p] = sv,
                        None => {
                            cols.push(*i as u32);
                            values.push(sv);
                        }
                    }
                }
                let changed = cols.iter().zip(&values).any(|(&c, v)| old.get(c as usize) != Some(v));
                if !changed {
                    break;
                }
                let op = KeyOp::Update { table: name.clone(), key, columns: cols, values, deltas: vec![] };
                match self.kv_batch(vec![op]).await.pop() {
                    Some(Ok(_)) => {
                        affected += 2;
                        break;
                    }
                    Some(Err(e)) if e.code == ErrorCode::KeyNotFound => continue,
                    Some(Err(e)) => return Err(cluster_err(&e, t)),
                    None => return Err(SqlError::internal("UPDATE: no answer from the cluster")),
                }
            }
        }
        if let Some(id) = first_generated {
            self.last_insert_id = id;
        }
        Ok(Outcome::Done { affected, last_insert_id: first_generated.unwrap_or(0), info: String::new() })
    }

    /// Full storage rows for an INSERT; the first AUTO_INCREMENT value generated, if any.
    async fn build_rows(
        &self,
        t: &TableRef,
        targets: &[usize],
        value_rows: &[Vec<Option<Val>>],
        auto_col: Option<usize>,
    ) -> SqlResult<(Vec<(Vec<Value>, bool)>, Option<u64>)> {
        let width = t.visible();
        let cols = t.table.columns();
        let mut out = Vec::with_capacity(value_rows.len());
        let mut need_auto = 0u64;
        for (n, vals) in value_rows.iter().enumerate() {
            let rownum = n + 1;
            let mut row: Vec<Option<Value>> = vec![None; width];
            for (&i, v) in targets.iter().zip(vals) {
                let c = &cols[i];
                let Some(v) = v else { continue };
                if Some(i) == auto_col && (v.is_null() || v.to_i64() == Some(0)) {
                    continue;
                }
                if v.is_null() && !c.nullable {
                    return Err(SqlError::new(code::BAD_NULL, format!("Column '{}' cannot be null", c.name)));
                }
                row[i] = Some(t.types[i].store(&c.name, v, rownum)?);
            }
            let mut generated = false;
            for i in 0..width {
                if row[i].is_some() {
                    continue;
                }
                let c = &cols[i];
                if Some(i) == auto_col {
                    generated = true;
                    need_auto += 1;
                    continue;
                }
                row[i] = Some(match &c.default {
                    Some(d) => d.clone(),
                    None if c.nullable => Value::Null,
                    None => {
                        return Err(SqlError::new(
                            code::NO_DEFAULT_FOR_FIELD,
                            format!("Field '{}' doesn't have a default value", c.name),
                        ))
                    }
                });
            }
            out.push((row, generated));
        }
        let mut first = None;
        if let Some(a) = auto_col {
            let explicit_max = out
                .iter()
                .filter_map(|(r, _)| match &r[a] {
                    Some(Value::Int(i)) => u64::try_from(*i).ok(),
                    Some(Value::Uint(u)) => Some(*u),
                    _ => None,
                })
                .max();
            let mut next = self.autoinc_reserve(t, a, need_auto, explicit_max).await?;
            let (lo, hi) = match t.types[a] {
                SqlType::Int { kind, unsigned, .. } => kind.range(unsigned),
                _ => (0, i128::from(i64::MAX)),
            };
            for (row, generated) in &mut out {
                if *generated {
                    if i128::from(next) > hi || i128::from(next) < lo {
                        return Err(SqlError::new(
                            code::WARN_DATA_OUT_OF_RANGE,
                            format!("Out of range value for column '{}' (AUTO_INCREMENT exhausted)", cols[a].name),
                        ));
                    }
                    first.get_or_insert(next);
                    row[a] = Some(if cols[a].ty == shoal_proto::ColumnType::Uint {
                        Value::Uint(next)
                    } else {
                        Value::Int(next as i64)
                    });
                    next += 1;
                }
            }
        }
        Ok((
            out.into_iter().map(|(r, g)| (r.into_iter().map(|v| v.unwrap_or(Value::Null)).collect(), g)).collect(),
            first,
        ))
    }

    /// Reserves `n` AUTO_INCREMENT values; returns the first. `explicit_max` is the largest value
    /// the statement gives explicitly (later values go above it).
    async fn autoinc_reserve(&self, t: &TableRef, col: usize, n: u64, explicit_max: Option<u64>) -> SqlResult<u64> {
        let id = t.table.id;
        let known = self.shared.autoinc.lock().get(&id).copied();
        if known.is_none() {
            let mut max = 0u64;
            let mut stream = self.client().scan(&t.table.spec.name, vec![], vec![col as u32]);
            while let Some(row) = stream.next().await {
                let row = row.map_err(|e| cluster_err(&e, t))?;
                let v = match row.first() {
                    Some(Value::Int(i)) => u64::try_from(*i).unwrap_or(0),
                    Some(Value::Uint(u)) => *u,
                    _ => 0,
                };
                max = max.max(v);
            }
            let mut m = self.shared.autoinc.lock();
            let e = m.entry(id).or_insert(max + 1);
            *e = (*e).max(max + 1);
        }
        let mut m = self.shared.autoinc.lock();
        let next = m.entry(id).or_insert(1);
        if let Some(x) = explicit_max {
            *next = (*next).max(x.saturating_add(1));
        }
        let first = *next;
        *next = next.saturating_add(n);
        Ok(first)
    }

    /// Inserts (or upserts) rows in batches. On failure, removes what this statement inserted
    /// and returns the error, and whether it was a duplicate of a generated AUTO_INCREMENT value.
    async fn write_rows(
        &self,
        t: &TableRef,
        rows: Vec<(Vec<Value>, bool)>,
        replace: bool,
        ignore: bool,
    ) -> Result<u64, (SqlError, bool)> {
        let name = &t.table.spec.name;
        let mut done: Vec<Vec<Value>> = vec![];
        let mut affected = 0u64;
        let mut failure: Option<(SqlError, bool)> = None;
        for chunk in rows.chunks(WRITE_BATCH) {
            let ops = chunk
                .iter()
                .map(|(r, _)| {
                    if replace {
                        KeyOp::Upsert { table: name.clone(), row: r.clone() }
                    } else {
                        KeyOp::Insert { table: name.clone(), row: r.clone() }
                    }
                })
                .collect();
            let results = self.kv_batch(ops).await;
            for ((row, generated), r) in chunk.iter().zip(results) {
                match r {
                    Ok(_) => {
                        affected += 1;
                        // Rows of tables with a hidden key cannot be named again (the client
                        // chose their key), so they are not undone.
                        if !replace && !t.table.hidden_pk {
                            done.push(t.table.key_of(row));
                        }
                    }
                    Err(e) if e.code == ErrorCode::DuplicateKey && ignore => {}
                    // A unique index's value: not a clash of generated keys.
                    Err(e) if crate::unique::is_worded(&e) => {
                        failure.get_or_insert((SqlError::from_cluster(&e), false));
                    }
                    Err(e) if e.code == ErrorCode::DuplicateKey => {
                        failure.get_or_insert((dup_entry(t, row), *generated));
                    }
                    Err(e) => {
                        failure.get_or_insert((cluster_err(&e, t), false));
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some(f) = failure {
            if !done.is_empty() {
                let undo = done.into_iter().map(|key| KeyOp::Delete { table: name.clone(), key }).collect();
                for r in self.kv_batch(undo).await {
                    if let Err(e) = r {
                        tracing::warn!("undo of a failed INSERT into {name}: {e}");
                    }
                }
            }
            return Err(f);
        }
        Ok(affected)
    }

    // ----- UPDATE -----

    /// Binds an UPDATE against its table (the assignments, WHERE, ORDER BY and LIMIT).
    pub async fn bind_update(&self, u: &ast::Update) -> SqlResult<BoundUpdate> {
        if !u.table.joins.is_empty() || u.from.is_some() {
            return Err(SqlError::not_supported("multi-table UPDATE"));
        }
        if u.returning.is_some() || u.or.is_some() {
            return Err(SqlError::not_supported("UPDATE with RETURNING / OR"));
        }
        let (parts, alias) = self.table_of(&u.table.relation)?;
        let mut t = self.resolve(&parts).await?;
        t.alias = alias;
        let env = self.env();
        let scope = Scope::of_table(&t);
        // Bound with the planner, so values and the WHERE clause may hold subqueries.
        let (sets, filter, order) = self
            .plan(|p| {
                let mut sets: Vec<(usize, Expr)> = vec![];
                let mut b = Binder::scoped(p.env, &scope, &[], Some(p), "field list");
                for a in &u.assignments {
                    let ast::AssignmentTarget::ColumnName(n) = &a.target else {
                        return Err(SqlError::not_supported("tuple assignment"));
                    };
                    let cname = object_parts(n).pop().unwrap_or_default();
                    let i = t.column(&cname).ok_or_else(|| SqlError::bad_field(&cname, "field list"))?;
                    if t.table.spec.primary_key.contains(&(i as u32)) {
                        return Err(SqlError::not_supported("updating primary key columns"));
                    }
                    sets.push((i, b.bind(&a.value)?));
                }
                let filter = match &u.selection {
                    Some(e) => Some(Binder::scoped(p.env, &scope, &[], Some(p), "where clause").bind(e)?),
                    None => None,
                };
                let order = bind_order(p, &scope, &u.order_by)?;
                Ok((sets, filter, order))
            })
            .await?;
        let limit = match &u.limit {
            Some(e) => Some(const_count(&env, e)?),
            None => None,
        };
        Ok(BoundUpdate { t, sets, filter, order, limit })
    }

    /// An UPDATE of the one row its WHERE clause names by primary key, to literal values or
    /// `col = col ± integer` on a signed integer column: sent as one key write (the data node
    /// adds the increments, and says whether the row was there and whether it changed)
    /// without reading the row first — inside the session's transaction if one is open, else
    /// on its own. None when the statement is not of that shape, or when a value does not fit
    /// its column (the general path then reports that only if the row exists, with MySQL's
    /// error).
    pub async fn update_by_key(&self, b: &BoundUpdate) -> Option<SqlResult<Outcome>> {
        let t = &b.t;
        if b.limit == Some(0) || t.table.indexes.iter().any(|i| i.unique) || has_triggers(t, TriggerEvent::Update) {
            return None;
        }
        let key = plan::key_only(t, b.filter.as_ref())?;
        let mut columns: Vec<u32> = vec![];
        let mut values: Vec<Value> = vec![];
        let mut deltas: Vec<shoal_client::Delta> = vec![];
        for (i, e) in &b.sets {
            // Assignments are applied in order: an increment after a set (or a set of a column
            // already incremented) is not one row-local step any more.
            if deltas.iter().any(|d| d.column == *i as u32) {
                return None;
            }
            let v = match e {
                Expr::Lit(v) => v.clone(),
                e => {
                    if columns.contains(&(*i as u32)) {
                        return None;
                    }
                    deltas.push(increment(t, *i, e)?);
                    continue;
                }
            };
            let c = &t.table.columns()[*i];
            if v.is_null() && !c.nullable {
                return None;
            }
            let sv = t.types[*i].store(&c.name, &v, 1).ok()?;
            // A later assignment of the same column wins (MySQL's left-to-right rule).
            match columns.iter().position(|&x| x == *i as u32) {
                Some(p) => values[p] = sv,
                None => {
                    columns.push(*i as u32);
                    values.push(sv);
                }
            }
        }
        let op = KeyOp::Update { table: t.table.spec.name.clone(), key, columns, values, deltas };
        let (matched, changed) = match self.kv_batch(vec![op]).await.pop() {
            Some(Ok(Some(_))) => (1, 0),
            Some(Ok(None)) => (1, 1),
            Some(Err(e)) if e.code == ErrorCode::KeyNotFound => (0, 0),
            // An increment out of the column's range: the general path gives MySQL's error.
            Some(Err(e)) if e.code == ErrorCode::TypeMismatch => return None,
            Some(Err(e)) => return Some(Err(cluster_err(&e, t))),
            None => return Some(Err(SqlError::internal("no outcome for the update"))),
        };
        Some(Ok(self.updated(matched, changed)))
    }

    /// An UPDATE's answer: affected rows are the changed ones, or the matched ones when the
    /// client asked for found rows (CLIENT_FOUND_ROWS).
    fn updated(&self, matched: u64, changed: u64) -> Outcome {
        let affected = if self.client_found_rows { matched } else { changed };
        Outcome::Done {
            affected,
            last_insert_id: 0,
            info: format!("Rows matched: {matched}  Changed: {changed}  Warnings: 0"),
        }
    }

    /// Runs a bound UPDATE: reads the matching rows (locking them, inside the statement's
    /// transaction), computes their new values and writes the rows that change.
    pub async fn run_update(&mut self, b: BoundUpdate) -> SqlResult<Outcome> {
        let BoundUpdate { t, sets, filter, order, limit } = b;
        let mut subqueries = filter.iter().collect::<Vec<_>>();
        subqueries.extend(sets.iter().map(|(_, e)| e));
        subqueries.extend(order.iter().map(|(e, _)| e));
        self.read_subquery_tables(&subqueries).await?;
        let mut writes: Vec<(Vec<Value>, Vec<u32>, Vec<Value>)> = vec![];
        // With UPDATE triggers: each matching row as stored, before and after the assignments.
        let triggered = has_triggers(&t, TriggerEvent::Update);
        let mut fired: Vec<(Vec<Value>, Vec<Val>, Vec<Val>)> = vec![];
        let mut matched = 0u64;
        let mut err = None;
        // The new values of one matching row; false = stop.
        let mut apply = |stored: &[Value], mut row: Vec<Val>| -> SqlResult<bool> {
            matched += 1;
            let old = if triggered { row.clone() } else { vec![] };
            let mut cols = vec![];
            let mut vals = vec![];
            for (i, e) in &sets {
                let v = e.eval(&row, &[])?;
                let c = &t.table.columns()[*i];
                if v.is_null() && !c.nullable {
                    err = Some(SqlError::new(code::BAD_NULL, format!("Column '{}' cannot be null", c.name)));
                    return Ok(false);
                }
                let sv = t.types[*i].store(&c.name, &v, matched as usize)?;
                // Later assignments see earlier ones (MySQL's left-to-right rule).
                row[*i] = t.types[*i].load(&sv);
                if let Some(p) = cols.iter().position(|&x| x == *i as u32) {
                    vals[p] = sv;
                } else {
                    cols.push(*i as u32);
                    vals.push(sv);
                }
            }
            if triggered {
                if fired.len() >= MAX_BUFFERED_ROWS {
                    err = Some(too_many("rows", MAX_BUFFERED_ROWS));
                    return Ok(false);
                }
                fired.push((stored.to_vec(), old, row));
                return Ok(true);
            }
            let changed = cols.iter().zip(&vals).any(|(&c, v)| stored[c as usize] != *v);
            if changed {
                if writes.len() >= MAX_BUFFERED_ROWS {
                    err = Some(too_many("rows", MAX_BUFFERED_ROWS));
                    return Ok(false);
                }
                writes.push((t.table.key_of(stored), cols, vals));
            }
            Ok(true)
        };
        match limit {
            Some(l) if !order.is_empty() => {
                for (stored, row) in self.ordered_matches(&t, filter.as_ref(), &order, l).await? {
                    if !apply(&stored, row)? {
                        break;
                    }
                }
            }
            _ => {
                let access = plan::choose(&t, filter.as_ref());
                let mut seen = 0u64;
                self.for_each_row(&t, access, |stored, row| {
                    if limit.is_some_and(|l| seen >= l) {
                        return Ok(false);
                    }
                    if let Some(f) = &filter {
                        if f.eval(&row, &[])?.truth() != Some(true) {
                            return Ok(true);
                        }
                    }
                    seen += 1;
                    apply(stored, row)
                })
                .await?;
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        if triggered {
            return self.update_fired(&t, fired, matched).await;
        }
        let name = &t.table.spec.name;
        let mut changed = 0u64;
        for chunk in writes.chunks(WRITE_BATCH) {
            let ops = chunk
                .iter()
                .map(|(key, columns, values)| KeyOp::Update {
                    table: name.clone(),
                    key: key.clone(),
                    columns: columns.clone(),
                    values: values.clone(),
                    deltas: vec![],
                })
                .collect();
            for r in self.kv_batch(ops).await {
                match r {
                    Ok(_) => changed += 1,
                    Err(e) if e.code == ErrorCode::KeyNotFound => {}
                    Err(e) => return Err(cluster_err(&e, &t)),
                }
            }
        }
        Ok(self.updated(matched, changed))
    }

    /// The writes of an UPDATE of a table with UPDATE triggers, row by row: the BEFORE
    /// triggers (which may change NEW), the row's write if it changed, the AFTER triggers
    /// (for every matched row, changed or not, as in MySQL).
    async fn update_fired(
        &mut self,
        t: &TableRef,
        rows: Vec<(Vec<Value>, Vec<Val>, Vec<Val>)>,
        matched: u64,
    ) -> SqlResult<Outcome> {
        let name = &t.table.spec.name;
        let mut changed = 0u64;
        for (n, (stored, old, mut new)) in rows.into_iter().enumerate() {
            self.fire(t, true, TriggerEvent::Update, RowPair { new: Some(&mut new), old: Some(&old) }).await?;
            let mut row = stored.clone();
            stored_back(t, &new, &mut row, n + 1)?;
            let columns: Vec<u32> = (0..t.visible()).filter(|&i| row[i] != stored[i]).map(|i| i as u32).collect();
            if columns.iter().any(|c| t.table.spec.primary_key.contains(c)) && !t.table.hidden_pk {
                return Err(SqlError::not_supported("updating primary key columns"));
            }
            if !columns.is_empty() {
                let values = columns.iter().map(|&c| row[c as usize].clone()).collect();
                let key = t.table.key_of(&stored);
                let op = KeyOp::Update { table: name.clone(), key, columns, values, deltas: vec![] };
                match self.kv_batch(vec![op]).await.pop() {
                    Some(Ok(_)) => changed += 1,
                    Some(Err(e)) if e.code == ErrorCode::KeyNotFound => {}
                    Some(Err(e)) => return Err(cluster_err(&e, t)),
                    None => return Err(SqlError::internal("UPDATE: no answer from the cluster")),
                }
            }
            self.fire(t, false, TriggerEvent::Update, RowPair { new: Some(&mut new), old: Some(&old) }).await?;
        }
        Ok(self.updated(matched, changed))
    }

    // ----- DELETE -----

    /// Binds a DELETE against its table.
    pub async fn bind_delete(&self, d: &ast::Delete) -> SqlResult<BoundDelete> {
        if !d.tables.is_empty() || d.using.is_some() {
            return Err(SqlError::not_supported("multi-table DELETE"));
        }
        let from = match &d.from {
            ast::FromTable::WithFromKeyword(f) | ast::FromTable::WithoutKeyword(f) => f,
        };
        let [twj] = from.as_slice() else { return Err(SqlError::not_supported("multi-table DELETE")) };
        if !twj.joins.is_empty() {
            return Err(SqlError::not_supported("multi-table DELETE"));
        }
        let (parts, alias) = self.table_of(&twj.relation)?;
        let mut t = self.resolve(&parts).await?;
        t.alias = alias;
        let env = self.env();
        let scope = Scope::of_table(&t);
        let (filter, order) = self
            .plan(|p| {
                let filter = match &d.selection {
                    Some(e) => Some(Binder::scoped(p.env, &scope, &[], Some(p), "where clause").bind(e)?),
                    None => None,
                };
                Ok((filter, bind_order(p, &scope, &d.order_by)?))
            })
            .await?;
        let limit = match &d.limit {
            Some(e) => Some(const_count(&env, e)?),
            None => None,
        };
        Ok(BoundDelete { t, filter, order, limit })
    }

    /// A DELETE of the one row its WHERE clause names by primary key: one key delete, without
    /// reading the row first (as [`Session::update_by_key`]). None when not of that shape.
    pub async fn delete_by_key(&self, b: &BoundDelete) -> Option<SqlResult<Outcome>> {
        let t = &b.t;
        if b.limit == Some(0) || t.table.indexes.iter().any(|i| i.unique) || has_triggers(t, TriggerEvent::Delete) {
            return None;
        }
        let key = plan::key_only(t, b.filter.as_ref())?;
        Some(self.delete_keys(t, vec![key]).await)
    }

    /// Runs a bound DELETE: finds the matching rows (locking them, inside the statement's
    /// transaction) and deletes them by key.
    pub async fn run_delete(&mut self, b: BoundDelete) -> SqlResult<Outcome> {
        let BoundDelete { t, filter, order, limit } = b;
        let mut subqueries = filter.iter().collect::<Vec<_>>();
        subqueries.extend(order.iter().map(|(e, _)| e));
        self.read_subquery_tables(&subqueries).await?;
        if has_triggers(&t, TriggerEvent::Delete) {
            let rows = match limit {
                Some(l) if !order.is_empty() => self.ordered_matches(&t, filter.as_ref(), &order, l).await?,
                _ => self.matching(&t, filter.as_ref(), limit, |stored, row| (stored.to_vec(), row)).await?,
            };
            return self.delete_fired(&t, rows).await;
        }
        match limit {
            Some(l) if !order.is_empty() => {
                let rows = self.ordered_matches(&t, filter.as_ref(), &order, l).await?;
                let keys = rows.iter().map(|(stored, _)| t.table.key_of(stored)).collect();
                self.delete_keys(&t, keys).await
            }
            _ => self.delete_matching(&t, filter.as_ref(), limit).await,
        }
    }

    /// The rows of `t` that pass `filter`, sorted by `order` (ties in scan order), at most
    /// `limit` of them: for UPDATE / DELETE … ORDER BY … LIMIT. Every matching row is held
    /// while sorting (bounded by `MAX_BUFFERED_ROWS`).
    async fn ordered_matches(
        &self,
        t: &TableRef,
        filter: Option<&Expr>,
        order: &[(Expr, bool)],
        limit: u64,
    ) -> SqlResult<Vec<(Vec<Value>, Vec<Val>)>> {
        let access = plan::choose(t, filter);
        let mut found: Vec<(Vec<Val>, Vec<Value>, Vec<Val>)> = vec![];
        let mut overflow = false;
        self.for_each_row(t, access, |stored, row| {
            if let Some(f) = filter {
                if f.eval(&row, &[])?.truth() != Some(true) {
                    return Ok(true);
                }
            }
            if found.len() >= MAX_BUFFERED_ROWS {
                overflow = true;
                return Ok(false);
            }
            let keys = order.iter().map(|(e, _)| e.eval(&row, &[])).collect::<SqlResult<Vec<_>>>()?;
            found.push((keys, stored.to_vec(), row));
            Ok(true)
        })
        .await?;
        if overflow {
            return Err(too_many("rows", MAX_BUFFERED_ROWS));
        }
        found.sort_by(|(a, ..), (b, ..)| {
            for ((x, y), (_, asc)) in a.iter().zip(b).zip(order) {
                let o = crate::val::sort_cmp(x, y);
                let o = if *asc { o } else { o.reverse() };
                if o != std::cmp::Ordering::Equal {
                    return o;
                }
            }
            std::cmp::Ordering::Equal
        });
        found.truncate(limit.min(usize::MAX as u64) as usize);
        Ok(found.into_iter().map(|(_, stored, row)| (stored, row)).collect())
    }

    /// The rows of `t` that pass `filter` (at most `limit`, and at most `MAX_BUFFERED_ROWS`),
    /// each as `keep` makes it from the stored row and its SQL values.
    async fn matching<T>(
        &self,
        t: &TableRef,
        filter: Option<&Expr>,
        limit: Option<u64>,
        mut keep: impl FnMut(&[Value], Vec<Val>) -> T,
    ) -> SqlResult<Vec<T>> {
        let access = plan::choose(t, filter);
        let mut out = vec![];
        let mut overflow = false;
        self.for_each_row(t, access, |stored, row| {
            if limit.is_some_and(|l| out.len() as u64 >= l) {
                return Ok(false);
            }
            if let Some(f) = filter {
                if f.eval(&row, &[])?.truth() != Some(true) {
                    return Ok(true);
                }
            }
            if out.len() >= MAX_BUFFERED_ROWS {
                overflow = true;
                return Ok(false);
            }
            out.push(keep(stored, row));
            Ok(true)
        })
        .await?;
        if overflow {
            return Err(too_many("rows", MAX_BUFFERED_ROWS));
        }
        Ok(out)
    }

    /// A DELETE from a table with DELETE triggers, row by row: the BEFORE triggers, the
    /// delete, the AFTER triggers (not for a row someone deleted meanwhile).
    async fn delete_fired(&mut self, t: &TableRef, rows: Vec<(Vec<Value>, Vec<Val>)>) -> SqlResult<Outcome> {
        let mut deleted = 0u64;
        for (stored, old) in rows {
            self.fire(t, true, TriggerEvent::Delete, RowPair { new: None, old: Some(&old) }).await?;
            let op = KeyOp::Delete { table: t.table.spec.name.clone(), key: t.table.key_of(&stored) };
            match self.kv_batch(vec![op]).await.pop() {
                Some(Ok(_)) => deleted += 1,
                Some(Err(e)) if e.code == ErrorCode::KeyNotFound => continue,
                Some(Err(e)) => return Err(cluster_err(&e, t)),
                None => return Err(SqlError::internal("DELETE: no answer from the cluster")),
            }
            self.fire(t, false, TriggerEvent::Delete, RowPair { new: None, old: Some(&old) }).await?;
        }
        Ok(Outcome::affected(deleted))
    }

    /// Deletes the rows of `t` that pass `filter` (at most `limit`); returns how many.
    pub async fn delete_matching(&self, t: &TableRef, filter: Option<&Expr>, limit: Option<u64>) -> SqlResult<Outcome> {
        let keys = self.matching(t, filter, limit, |stored, _| t.table.key_of(stored)).await?;
        self.delete_keys(t, keys).await
    }

    /// Deletes rows by primary key, in batches; returns how many were there.
    async fn delete_keys(&self, t: &TableRef, keys: Vec<Vec<Value>>) -> SqlResult<Outcome> {
        let name = &t.table.spec.name;
        let mut deleted = 0u64;
        for chunk in keys.chunks(WRITE_BATCH) {
            let ops = chunk.iter().map(|key| KeyOp::Delete { table: name.clone(), key: key.clone() }).collect();
            for r in self.kv_batch(ops).await {
                match r {
                    Ok(_) => deleted += 1,
                    Err(e) if e.code == ErrorCode::KeyNotFound => {}
                    Err(e) => return Err(cluster_err(&e, t)),
                }
            }
        }
        Ok(Outcome::affected(deleted))
    }
}

/// `col = col + n`, `col = n + col` or `col = col - n` for column `i` of `t`, a signed integer
/// column, and an integer literal `n`: the increment the data node can apply by itself,
/// bounded by the column's SQL range.
fn increment(t: &TableRef, i: usize, e: &Expr) -> Option<shoal_client::Delta> {
    use crate::val::ArithOp;
    let SqlType::Int { kind, unsigned: false, .. } = t.types[i] else { return None };
    let col = |x: &Expr| matches!(x, Expr::Col(c) if *c == i);
    let by = match e {
        Expr::Arith(ArithOp::Add, a, b) if col(a) => b,
        Expr::Arith(ArithOp::Add, a, b) if col(b) => a,
        Expr::Arith(ArithOp::Sub, a, b) if col(a) => b,
        _ => return None,
    };
    let Expr::Lit(Val::Int(n)) = by.as_ref() else { return None };
    let by = if matches!(e, Expr::Arith(ArithOp::Sub, ..)) { n.checked_neg()? } else { *n };
    let (min, max) = kind.range(false);
    Some(shoal_client::Delta { column: i as u32, by, min: min as i64, max: max as i64 })
}

/// A stored row's visible columns as SQL values (a trigger's NEW or OLD).
fn loaded(t: &TableRef, row: &[Value]) -> Vec<Val> {
    row.iter().take(t.visible()).zip(t.types.iter()).map(|(v, ty)| ty.load(v)).collect()
}

/// Puts a trigger's NEW row back into the stored row, through each column's conversion.
fn stored_back(t: &TableRef, new: &[Val], row: &mut [Value], rownum: usize) -> SqlResult<()> {
    for (i, v) in new.iter().enumerate() {
        let c = &t.table.columns()[i];
        row[i] = if v.is_null() {
            if !c.nullable {
                return Err(SqlError::new(code::BAD_NULL, format!("Column '{}' cannot be null", c.name)));
            }
            Value::Null
        } else {
            t.types[i].store(&c.name, v, rownum)?
        };
    }
    Ok(())
}

/// ORDER BY of an UPDATE or DELETE: expressions over the target table.
fn bind_order(p: &Planner<'_>, scope: &Scope, items: &[ast::OrderByExpr]) -> SqlResult<Vec<(Expr, bool)>> {
    items
        .iter()
        .map(|it| {
            let e = Binder::scoped(p.env, scope, &[], Some(p), "order clause").bind(&it.expr)?;
            Ok((e, !matches!(it.options.sort, Some(ast::OrderBySort::Desc))))
        })
        .collect()
}

/// Names of the tables in the FROM clauses of a query's outermost SELECTs.
fn top_level_tables(body: &ast::SetExpr, out: &mut Vec<Vec<String>>) {
    match body {
        ast::SetExpr::Select(s) => {
            for twj in &s.from {
                let factors = std::iter::once(&twj.relation).chain(twj.joins.iter().map(|j| &j.relation));
                for f in factors {
                    if let ast::TableFactor::Table { name, .. } = f {
                        out.push(object_parts(name));
                    }
                }
            }
        }
        ast::SetExpr::SetOperation { left, right, .. } => {
            top_level_tables(left, out);
            top_level_tables(right, out);
        }
        ast::SetExpr::Query(q) => top_level_tables(&q.body, out),
        _ => {}
    }
}

fn value_or_default(env: &crate::sql::bind::Env, e: &ast::Expr) -> SqlResult<Option<Val>> {
    if let ast::Expr::Identifier(id) = e {
        if id.quote_style.is_none() && id.value.eq_ignore_ascii_case("default") {
            return Ok(None);
        }
    }
    Ok(Some(Binder::new(env, None, "field list").bind(e)?.eval(&[], &[])?))
}

/// An index walk that yields a single-table SELECT's rows in its ORDER BY order, when the
/// query has a LIMIT and nothing between the scan and the sort reorders or merges rows
/// (grouping, DISTINCT, window functions), and every sort key is a plain column.
pub(crate) fn index_order(sp: &crate::sql::query::SelectPlan, t: &TableRef, access: &Access) -> Option<Access> {
    use crate::sql::expr::Expr;
    use crate::sql::query::SortKey;
    let limit = sp.limit?;
    if sp.order.is_empty() || sp.grouped || sp.distinct || !sp.windows.is_empty() {
        return None;
    }
    let mut order = vec![];
    for (key, asc) in &sp.order {
        let e = match key {
            SortKey::Out(i) => sp.outputs.get(*i)?,
            SortKey::Expr(e) => e,
        };
        let Expr::Col(c) = e else { return None };
        order.push((*c, *asc));
    }
    plan::order_by_index(t, access, &order, limit.saturating_add(sp.offset))
}

/// Whether a row read by key lies within a scan access path: it passes the path's filters
/// and is in its partition and index range (see `Session::scan_rows`).
fn within(table: &shoal_proto::Table, access: &Access, row: &[Value]) -> bool {
    let in_partition = |p: u32| shoal_proto::codec::partition_of_key(table, &table.key_of(row)) == p;
    let passes = |filters: &[shoal_proto::filter::Filter]| filters.iter().all(|f| f.matches(row));
    match access {
        Access::Scan(filters) => passes(filters),
        Access::Partition(p, filters) => in_partition(*p) && passes(filters),
        Access::Range(range, only, filters, _) => {
            only.is_none_or(in_partition) && range.admits(table, row) && passes(filters)
        }
        _ => true,
    }
}

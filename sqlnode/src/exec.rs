//! Queries and DML over the cluster: SELECT (projection, WHERE, GROUP BY with aggregates,
//! HAVING, DISTINCT, ORDER BY, LIMIT), INSERT/REPLACE, UPDATE and DELETE.
//!
//! Rows come from the access path [`crate::sql::plan`] picks; the whole WHERE clause is then
//! evaluated here on every row. Sorting, grouping and DISTINCT run in the SQL node within
//! named bounds (`MAX_BUFFERED_ROWS`, `MAX_GROUPS`); passing one is a clear error, not an
//! unbounded allocation.
//!
//! Writes are per-row atomic in the cluster. Until cluster transactions land, a multi-row
//! INSERT that fails part-way deletes the rows it had inserted before reporting the error
//! (statement atomicity against everything but concurrent writers and crashes); UPDATE and
//! DELETE may be partially applied when they fail.
//!
//! **AUTO_INCREMENT** (allowed only as the whole primary key): each SQL node keeps the next
//! value per table, starting from one scan for the column's maximum. Values are claimed by the
//! insert itself — the primary key makes a value taken by another SQL node fail with a duplicate
//! key — and on such a collision the node rescans and retries the statement (bounded), so values
//! are unique cluster-wide, increasing per SQL node, and not gap-free.

use std::cmp::Ordering;
use std::collections::HashMap;

use shoal_client::KeyOp;
use shoal_proto::{ErrorCode, ShoalError, Value};
use sqlparser::ast::{self, SelectItem, Spanned};
use tokio_stream::StreamExt;

use crate::error::{code, SqlError, SqlResult};
use crate::session::{object_parts, ColumnMeta, Outcome, ResultSet, Session};
use crate::sql::bind::{Binder, TableRef};
use crate::sql::expr::{Acc, AggSpec, Expr};
use crate::sql::plan::{self, Access};
use crate::types::{SqlType, WireType};
use crate::val::{sort_cmp, Val};

/// Most rows a statement holds in the SQL node at once (results, sort buffers, keys to write).
pub const MAX_BUFFERED_ROWS: usize = 1_000_000;
/// Most groups of one GROUP BY.
pub const MAX_GROUPS: usize = 100_000;
/// Key operations sent to the cluster per batch.
pub const WRITE_BATCH: usize = 1000;
/// Attempts of an INSERT whose AUTO_INCREMENT values collided with another SQL node's.
const AUTOINC_ATTEMPTS: usize = 5;

fn too_many(what: &str, n: usize) -> SqlError {
    SqlError::new(
        code::OUT_OF_SORTMEMORY,
        format!("Out of sort memory: the statement needs more than {n} {what} in the SQL node; add a WHERE or LIMIT"),
    )
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

/// The text of an expression as the query wrote it (MySQL's column name for it).
pub fn source_text(sql: &str, e: &ast::Expr) -> String {
    if let ast::Expr::Value(v) = e {
        if let ast::Value::SingleQuotedString(s) | ast::Value::DoubleQuotedString(s) = &v.value {
            return s.clone();
        }
    }
    let span = e.span();
    let (s, en) = (span.start, span.end);
    if s.line == 0 || en.line == 0 {
        return e.to_string();
    }
    let offset = |line: u64, col: u64| -> Option<usize> {
        let mut off = 0usize;
        for (i, l) in sql.split_inclusive('\n').enumerate() {
            if i as u64 + 1 == line {
                let chars: usize = l.chars().take(col.saturating_sub(1) as usize).map(char::len_utf8).sum();
                return Some(off + chars);
            }
            off += l.len();
        }
        None
    };
    match (offset(s.line, s.column), offset(en.line, en.column)) {
        (Some(a), Some(b)) if a < b && b <= sql.len() => {
            let text = sql[a..b].trim();
            // Spans of calls end before their closing parenthesis: fall back to the
            // normalized text when the slice is not a whole expression.
            let balanced = text.matches('(').count() == text.matches(')').count();
            if balanced && !matches!(e, ast::Expr::Function(_)) {
                text.to_string()
            } else {
                e.to_string()
            }
        }
        _ => e.to_string(),
    }
}

enum SortKey {
    Out(usize),
    Expr(Expr),
}

/// Evaluates a LIMIT/OFFSET expression.
fn const_count(env: &crate::sql::bind::Env, e: &ast::Expr) -> SqlResult<u64> {
    let v = Binder::new(env, None, "limit clause").bind(e)?.eval(&[], &[])?;
    match v {
        Val::Int(i) if i >= 0 => Ok(i as u64),
        Val::UInt(u) => Ok(u),
        _ => Err(SqlError::parse("LIMIT and OFFSET take non-negative integers")),
    }
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
        access: &Access,
        mut f: impl FnMut(&[Value], Vec<Val>) -> SqlResult<bool>,
    ) -> SqlResult<()> {
        let name = &t.table.spec.name;
        let convert = |row: &[Value]| -> Vec<Val> { row.iter().zip(&t.types).map(|(v, ty)| ty.load(v)).collect() };
        match access {
            Access::Nothing => {}
            Access::Key(k) => {
                if let Some(row) = self.client().get(name, k.clone()).await.map_err(|e| cluster_err(&e, t))? {
                    f(&row, convert(&row))?;
                }
            }
            Access::Keys(keys) => {
                let rows = self.client().batch_get(name, keys.clone()).await.map_err(|e| cluster_err(&e, t))?;
                for row in rows.into_iter().flatten() {
                    if !f(&row, convert(&row))? {
                        break;
                    }
                }
            }
            Access::Scan(filters) => {
                let mut stream = self.client().scan(name, filters.clone(), vec![]);
                while let Some(row) = stream.next().await {
                    let row = row.map_err(|e| cluster_err(&e, t))?;
                    if !f(&row, convert(&row))? {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    // ----- SELECT -----

    pub async fn select(&mut self, q: &ast::Query, sql: &str) -> SqlResult<Outcome> {
        if q.with.is_some() {
            return Err(SqlError::not_supported("WITH"));
        }
        if !q.locks.is_empty() {
            return Err(SqlError::not_supported("SELECT ... FOR UPDATE / FOR SHARE (no transactions yet)"));
        }
        if q.fetch.is_some() || q.for_clause.is_some() {
            return Err(SqlError::not_supported("FETCH / FOR clauses"));
        }
        let s = match q.body.as_ref() {
            ast::SetExpr::Select(s) => s,
            ast::SetExpr::SetOperation { .. } => return Err(SqlError::not_supported("UNION / INTERSECT / EXCEPT")),
            ast::SetExpr::Query(_) => return Err(SqlError::not_supported("nested query expressions")),
            _ => return Err(SqlError::not_supported("this query form")),
        };
        if s.into.is_some() {
            return Err(SqlError::not_supported("SELECT ... INTO"));
        }
        let table = match s.from.as_slice() {
            [] => None,
            [twj] => {
                if !twj.joins.is_empty() {
                    return Err(SqlError::not_supported("joins"));
                }
                let (parts, alias) = self.table_of(&twj.relation)?;
                let mut t = self.resolve(&parts).await?;
                t.alias = alias;
                Some(t)
            }
            _ => return Err(SqlError::not_supported("joins")),
        };
        let env = self.env();
        let t = table.as_ref();
        let col_wire: Vec<WireType> = t.map(|t| t.types.iter().map(|ty| ty.wire()).collect()).unwrap_or_default();

        // Projection.
        let mut b = Binder::new(&env, t, "field list");
        b.allow_aggs = true;
        let mut outputs: Vec<Expr> = vec![];
        let mut metas: Vec<ColumnMeta> = vec![];
        let mut aliases: Vec<(String, Expr)> = vec![];
        let col_meta = |t: &TableRef, i: usize, name: &str| {
            let c = &t.table.columns()[i];
            ColumnMeta {
                name: name.to_string(),
                org_name: c.name.clone(),
                table: t.alias.clone().unwrap_or_else(|| t.name.clone()),
                org_table: t.name.clone(),
                db: t.db.clone(),
                ty: Some(t.types[i].wire()),
                not_null: !c.nullable,
                primary_key: !t.table.hidden_pk && t.table.spec.primary_key.contains(&(i as u32)),
                auto_increment: c.auto_increment,
            }
        };
        let item_texts = crate::sql::parse::select_item_texts(sql).filter(|t| t.len() == s.projection.len());
        for (n, item) in s.projection.iter().enumerate() {
            match item {
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) => {
                    let Some(t) = t else { return Err(SqlError::new(code::NO_DB, "No tables used")) };
                    for i in 0..t.visible() {
                        outputs.push(Expr::Col(i));
                        metas.push(col_meta(t, i, t.col_name(i)));
                    }
                }
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    let bound = b.bind(e)?;
                    let name = match item {
                        SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                        _ => match e {
                            ast::Expr::Identifier(i) if !i.value.starts_with("@@") => i.value.clone(),
                            ast::Expr::CompoundIdentifier(p) if !p[0].value.starts_with("@@") => {
                                p.last().map(|i| i.value.clone()).unwrap_or_default()
                            }
                            ast::Expr::Value(_) => source_text(sql, e),
                            _ => match &item_texts {
                                Some(t) => t[n].clone(),
                                None => source_text(sql, e),
                            },
                        },
                    };
                    let meta = match (&bound, t) {
                        (Expr::Col(i), Some(t)) => col_meta(t, *i, &name),
                        _ => ColumnMeta::named(&name, None),
                    };
                    if let SelectItem::ExprWithAlias { alias, .. } = item {
                        aliases.push((alias.value.clone(), bound.clone()));
                    }
                    metas.push(meta);
                    outputs.push(bound);
                }
                other => return Err(SqlError::not_supported(format!("select item {other}"))),
            }
        }
        let mut aggs = std::mem::take(&mut b.aggs);

        // WHERE (no aggregates).
        let filter = match &s.selection {
            Some(e) => Some(Binder::new(&env, t, "where clause").bind(e)?),
            None => None,
        };

        // GROUP BY: expressions, output ordinals or aliases.
        let mut group_exprs = vec![];
        match &s.group_by {
            ast::GroupByExpr::Expressions(exprs, mods) if mods.is_empty() => {
                for e in exprs {
                    group_exprs.push(self.order_or_group_expr(
                        e,
                        &env,
                        t,
                        &outputs,
                        &aliases,
                        "group statement",
                        &mut aggs,
                        false,
                    )?);
                }
            }
            _ => return Err(SqlError::not_supported("GROUP BY ALL / WITH ROLLUP")),
        }
        let group_exprs: Vec<Expr> = group_exprs
            .into_iter()
            .map(|k| match k {
                SortKey::Out(i) => outputs[i].clone(),
                SortKey::Expr(e) => e,
            })
            .collect();

        // HAVING and ORDER BY may use aggregates and aliases.
        let having = match &s.having {
            Some(e) => {
                let mut hb = Binder::new(&env, t, "having clause");
                hb.allow_aggs = true;
                hb.aggs = std::mem::take(&mut aggs);
                let r = bind_with_aliases(&mut hb, e, &aliases);
                aggs = std::mem::take(&mut hb.aggs);
                Some(r?)
            }
            None => None,
        };
        let mut order: Vec<(SortKey, bool)> = vec![];
        if let Some(ob) = &q.order_by {
            match &ob.kind {
                ast::OrderByKind::Expressions(items) => {
                    for it in items {
                        let key = self.order_or_group_expr(
                            &it.expr,
                            &env,
                            t,
                            &outputs,
                            &aliases,
                            "order clause",
                            &mut aggs,
                            true,
                        )?;
                        order.push((key, !matches!(it.options.sort, Some(ast::OrderBySort::Desc))));
                    }
                }
                ast::OrderByKind::All(_) => return Err(SqlError::not_supported("ORDER BY ALL")),
            }
        }
        let (limit, offset) = match &q.limit_clause {
            None => (None, 0),
            Some(ast::LimitClause::LimitOffset { limit, offset, limit_by }) => {
                if !limit_by.is_empty() {
                    return Err(SqlError::not_supported("LIMIT BY"));
                }
                let l = match limit {
                    Some(e) => Some(const_count(&env, e)?),
                    None => None,
                };
                let o = match offset {
                    Some(o) => const_count(&env, &o.value)?,
                    None => 0,
                };
                (l, o)
            }
            Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) => {
                (Some(const_count(&env, limit)?), const_count(&env, offset)?)
            }
        };
        let distinct = match &s.distinct {
            None | Some(ast::Distinct::All) => false,
            Some(ast::Distinct::Distinct) => true,
            Some(ast::Distinct::On(_)) => return Err(SqlError::not_supported("DISTINCT ON")),
        };
        let grouped = !group_exprs.is_empty() || !aggs.is_empty();
        if !grouped && having.is_some() {
            // MySQL allows HAVING without GROUP BY as a late WHERE; so do we.
        }

        // Run.
        let mut run = SelectRun {
            filter,
            outputs,
            order,
            grouped,
            group_exprs,
            aggs,
            having,
            distinct,
            limit,
            offset,
            buffer: vec![],
            groups: HashMap::new(),
            group_rows: vec![],
            width: t.map_or(0, |t| t.table.columns().len()),
        };
        match t {
            None => {
                run.feed(vec![])?;
            }
            Some(t) => {
                let access = plan::choose(t, run.filter.as_ref());
                self.for_each_row(t, &access, |_, row| run.feed(row)).await?;
            }
        }
        let rows = run.finish()?;
        self.found_rows = rows.len() as u64;
        // Column types the binder could infer.
        for (m, e) in metas.iter_mut().zip(&run.outputs) {
            if m.ty.is_none() {
                m.ty = e.wire_type(&col_wire, &run.aggs);
            }
        }
        Ok(Outcome::Rows(ResultSet { columns: metas, rows }))
    }

    #[allow(clippy::too_many_arguments)]
    fn order_or_group_expr(
        &self,
        e: &ast::Expr,
        env: &crate::sql::bind::Env,
        t: Option<&TableRef>,
        outputs: &[Expr],
        aliases: &[(String, Expr)],
        place: &'static str,
        aggs: &mut Vec<AggSpec>,
        allow_aggs: bool,
    ) -> SqlResult<SortKey> {
        if let ast::Expr::Value(v) = e {
            if let ast::Value::Number(n, _) = &v.value {
                let i: usize = n.to_string().parse().unwrap_or(0);
                if i == 0 || i > outputs.len() {
                    return Err(SqlError::bad_field(&n.to_string(), place));
                }
                return Ok(SortKey::Out(i - 1));
            }
        }
        if let ast::Expr::Identifier(id) = e {
            if let Some(pos) = aliases.iter().position(|(a, _)| a.eq_ignore_ascii_case(&id.value)) {
                // An alias names the output expression (MySQL prefers it over a column).
                let bound = &aliases[pos].1;
                if let Some(i) = outputs.iter().position(|o| o == bound) {
                    return Ok(SortKey::Out(i));
                }
            }
        }
        let mut b = Binder::new(env, t, place);
        b.allow_aggs = allow_aggs;
        b.aggs = std::mem::take(aggs);
        let r = bind_with_aliases(&mut b, e, aliases);
        *aggs = std::mem::take(&mut b.aggs);
        Ok(SortKey::Expr(r?))
    }

    // ----- INSERT / REPLACE -----

    pub async fn insert(&mut self, ins: &ast::Insert, sql: &str) -> SqlResult<Outcome> {
        let ast::TableObject::TableName(name) = &ins.table else {
            return Err(SqlError::not_supported("INSERT into a table function"));
        };
        if ins.on.is_some() {
            return Err(SqlError::not_supported("INSERT ... ON DUPLICATE KEY UPDATE"));
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
            let results = self.client().batch(ops).await;
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
                for r in self.client().batch(undo).await {
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

    pub async fn update(&mut self, u: &ast::Update) -> SqlResult<Outcome> {
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
        let mut sets: Vec<(usize, Expr)> = vec![];
        {
            let mut b = Binder::new(&env, Some(&t), "field list");
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
        }
        let filter = match &u.selection {
            Some(e) => Some(Binder::new(&env, Some(&t), "where clause").bind(e)?),
            None => None,
        };
        if !u.order_by.is_empty() && u.limit.is_some() {
            return Err(SqlError::not_supported("UPDATE ... ORDER BY ... LIMIT"));
        }
        let limit = match &u.limit {
            Some(e) => Some(const_count(&env, e)?),
            None => None,
        };
        let access = plan::choose(&t, filter.as_ref());
        let mut writes: Vec<(Vec<Value>, Vec<u32>, Vec<Value>)> = vec![];
        let mut matched = 0u64;
        let mut err = None;
        self.for_each_row(&t, &access, |stored, mut row| {
            if limit.is_some_and(|l| matched >= l) {
                return Ok(false);
            }
            if let Some(f) = &filter {
                if f.eval(&row, &[])?.truth() != Some(true) {
                    return Ok(true);
                }
            }
            matched += 1;
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
            let changed = cols.iter().zip(&vals).any(|(&c, v)| stored[c as usize] != *v);
            if changed {
                if writes.len() >= MAX_BUFFERED_ROWS {
                    err = Some(too_many("rows", MAX_BUFFERED_ROWS));
                    return Ok(false);
                }
                writes.push((t.table.key_of(stored), cols, vals));
            }
            Ok(true)
        })
        .await?;
        if let Some(e) = err {
            return Err(e);
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
                })
                .collect();
            for r in self.client().batch(ops).await {
                match r {
                    Ok(_) => changed += 1,
                    Err(e) if e.code == ErrorCode::KeyNotFound => {}
                    Err(e) => return Err(cluster_err(&e, &t)),
                }
            }
        }
        let affected = if self.client_found_rows { matched } else { changed };
        Ok(Outcome::Done {
            affected,
            last_insert_id: 0,
            info: format!("Rows matched: {matched}  Changed: {changed}  Warnings: 0"),
        })
    }

    // ----- DELETE -----

    pub async fn delete(&mut self, d: &ast::Delete) -> SqlResult<Outcome> {
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
        let filter = match &d.selection {
            Some(e) => Some(Binder::new(&env, Some(&t), "where clause").bind(e)?),
            None => None,
        };
        if !d.order_by.is_empty() && d.limit.is_some() {
            return Err(SqlError::not_supported("DELETE ... ORDER BY ... LIMIT"));
        }
        let limit = match &d.limit {
            Some(e) => Some(const_count(&env, e)?),
            None => None,
        };
        self.delete_matching(&t, filter.as_ref(), limit).await
    }

    /// Deletes the rows of `t` that pass `filter` (at most `limit`); returns how many.
    pub async fn delete_matching(&self, t: &TableRef, filter: Option<&Expr>, limit: Option<u64>) -> SqlResult<Outcome> {
        let access = plan::choose(t, filter);
        let mut keys: Vec<Vec<Value>> = vec![];
        let mut overflow = false;
        self.for_each_row(t, &access, |stored, row| {
            if limit.is_some_and(|l| keys.len() as u64 >= l) {
                return Ok(false);
            }
            if let Some(f) = filter {
                if f.eval(&row, &[])?.truth() != Some(true) {
                    return Ok(true);
                }
            }
            if keys.len() >= MAX_BUFFERED_ROWS {
                overflow = true;
                return Ok(false);
            }
            keys.push(t.table.key_of(stored));
            Ok(true)
        })
        .await?;
        if overflow {
            return Err(too_many("rows", MAX_BUFFERED_ROWS));
        }
        let name = &t.table.spec.name;
        let mut deleted = 0u64;
        for chunk in keys.chunks(WRITE_BATCH) {
            let ops = chunk.iter().map(|key| KeyOp::Delete { table: name.clone(), key: key.clone() }).collect();
            for r in self.client().batch(ops).await {
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

fn bind_with_aliases(b: &mut Binder<'_>, e: &ast::Expr, aliases: &[(String, Expr)]) -> SqlResult<Expr> {
    b.aliases = aliases.to_vec();
    b.bind(e)
}

fn value_or_default(env: &crate::sql::bind::Env, e: &ast::Expr) -> SqlResult<Option<Val>> {
    if let ast::Expr::Identifier(id) = e {
        if id.quote_style.is_none() && id.value.eq_ignore_ascii_case("default") {
            return Ok(None);
        }
    }
    Ok(Some(Binder::new(env, None, "field list").bind(e)?.eval(&[], &[])?))
}

/// The SELECT pipeline's state: filtering, grouping, buffering for ORDER BY/DISTINCT, LIMIT.
struct SelectRun {
    filter: Option<Expr>,
    outputs: Vec<Expr>,
    order: Vec<(SortKey, bool)>,
    grouped: bool,
    group_exprs: Vec<Expr>,
    aggs: Vec<AggSpec>,
    having: Option<Expr>,
    distinct: bool,
    limit: Option<u64>,
    offset: u64,
    /// (sort keys, output row)
    buffer: Vec<(Vec<Val>, Vec<Val>)>,
    groups: HashMap<Vec<u8>, usize>,
    /// (representative input row, accumulators)
    group_rows: Vec<(Vec<Val>, Vec<Acc>)>,
    width: usize,
}

impl SelectRun {
    /// Takes one input row; false = enough rows, stop reading.
    fn feed(&mut self, row: Vec<Val>) -> SqlResult<bool> {
        if let Some(f) = &self.filter {
            if f.eval(&row, &[])?.truth() != Some(true) {
                return Ok(true);
            }
        }
        if self.grouped {
            let mut key = vec![];
            for g in &self.group_exprs {
                g.eval(&row, &[])?.group_key(&mut key);
            }
            let idx = match self.groups.get(&key) {
                Some(&i) => i,
                None => {
                    if self.group_rows.len() >= MAX_GROUPS {
                        return Err(too_many("groups", MAX_GROUPS));
                    }
                    let accs = self.aggs.iter().map(|a| Acc::new(a.kind)).collect();
                    self.group_rows.push((row.clone(), accs));
                    self.groups.insert(key, self.group_rows.len() - 1);
                    self.group_rows.len() - 1
                }
            };
            let (_, accs) = &mut self.group_rows[idx];
            for (spec, acc) in self.aggs.iter().zip(accs.iter_mut()) {
                let v = match &spec.arg {
                    Some(e) => Some(e.eval(&row, &[])?),
                    None => None,
                };
                acc.add(spec.kind, v)?;
            }
            return Ok(true);
        }
        self.emit(&row, &[])
    }

    /// Computes one output row from an input row (or group) and buffers it.
    fn emit(&mut self, row: &[Val], aggs: &[Val]) -> SqlResult<bool> {
        if let Some(h) = &self.having {
            if h.eval(row, aggs)?.truth() != Some(true) {
                return Ok(true);
            }
        }
        let out = self.outputs.iter().map(|e| e.eval(row, aggs)).collect::<SqlResult<Vec<_>>>()?;
        let keys = self
            .order
            .iter()
            .map(|(k, _)| match k {
                SortKey::Out(i) => Ok(out.get(*i).cloned().unwrap_or(Val::Null)),
                SortKey::Expr(e) => e.eval(row, aggs),
            })
            .collect::<SqlResult<Vec<_>>>()?;
        self.buffer.push((keys, out));
        let wanted = self.limit.map(|l| l.saturating_add(self.offset) as usize);
        if self.order.is_empty() && !self.distinct && !self.grouped {
            if let Some(w) = wanted {
                return Ok(self.buffer.len() < w);
            }
        }
        if let (false, Some(w)) = (self.order.is_empty(), wanted) {
            // Top-k: keep the buffer near the rows that can still be in the result.
            if !self.distinct && self.buffer.len() > w.saturating_mul(2).max(1024) {
                self.sort();
                self.buffer.truncate(w);
            }
        }
        if self.buffer.len() > MAX_BUFFERED_ROWS {
            return Err(too_many("rows", MAX_BUFFERED_ROWS));
        }
        Ok(true)
    }

    fn sort(&mut self) {
        let dirs: Vec<bool> = self.order.iter().map(|(_, asc)| *asc).collect();
        self.buffer.sort_by(|(a, _), (b, _)| {
            for ((x, y), asc) in a.iter().zip(b).zip(&dirs) {
                let o = sort_cmp(x, y);
                let o = if *asc { o } else { o.reverse() };
                if o != Ordering::Equal {
                    return o;
                }
            }
            Ordering::Equal
        });
    }

    fn finish(&mut self) -> SqlResult<Vec<Vec<Val>>> {
        if self.grouped {
            if self.group_rows.is_empty() && self.group_exprs.is_empty() {
                // Aggregates over no rows still give one row (COUNT(*) = 0).
                let accs = self.aggs.iter().map(|a| Acc::new(a.kind)).collect();
                self.group_rows.push((vec![Val::Null; self.width], accs));
            }
            let groups = std::mem::take(&mut self.group_rows);
            for (rep, accs) in groups {
                let vals: Vec<Val> = self.aggs.iter().zip(&accs).map(|(s, a)| a.finish(s.kind)).collect();
                self.emit(&rep, &vals)?;
            }
        }
        if self.distinct {
            let mut seen = std::collections::HashSet::new();
            self.buffer.retain(|(_, out)| {
                let mut k = vec![];
                for v in out {
                    v.group_key(&mut k);
                }
                seen.insert(k)
            });
        }
        if !self.order.is_empty() {
            self.sort();
        }
        let rows = std::mem::take(&mut self.buffer);
        let skip = self.offset.min(rows.len() as u64) as usize;
        let take = self.limit.map_or(usize::MAX, |l| l.min(usize::MAX as u64) as usize);
        Ok(rows.into_iter().skip(skip).take(take).map(|(_, out)| out).collect())
    }
}

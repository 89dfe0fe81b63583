//! Query plans: a SELECT (or a UNION/INTERSECT/EXCEPT of them) bound against a snapshot of the
//! catalog. Pure: the planner takes the AST and the [`Catalog`] and returns a [`QueryPlan`];
//! the executor reads the tables it names ([`QueryPlan::scans`]) and runs it
//! ([`crate::sql::select`]).
//!
//! - **FROM** is a tree of base-table scans, derived tables (subqueries in FROM, views) and
//!   joins (inner, left, right; comma is an inner join without condition). Every relation's
//!   columns follow the previous ones' in the combined row the expressions are bound against.
//! - **Filter pushdown**: a WHERE (or inner-join ON) conjunct that reads one base table only,
//!   and that table is not on the NULL-filled side of an outer join, goes to that table's scan,
//!   where the access path turns what it can into key reads or data-node filters. Every
//!   condition is still evaluated on the joined rows, so pushing down never changes a result.
//! - **Names**: the catalog is a snapshot the caller fills in. When the planner meets a name it
//!   does not have, it records it in [`Planner::wanted`] and fails; the caller looks the name up
//!   (a table, a view, or nothing) and plans again. So planning stays synchronous and pure, and a
//!   statement costs one catalog lookup per distinct name.
//! - **Views** are stored queries (see `crate::view`): a view in FROM is planned as a derived
//!   table from its definition, whose unqualified names mean tables of the view's database.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, OnceLock};

use sqlparser::ast::{self, SelectItem, Spanned};

use crate::error::{code, SqlError, SqlResult};
use crate::session::{object_parts, ColumnMeta};
use crate::sql::bind::{Binder, Env, Scope, TableRef};
use crate::sql::expr::{AggSpec, Cmp, Expr};
use crate::sql::subquery::SubPlan;
use crate::types::WireType;
use crate::val::Val;

/// Deepest nesting of subqueries, derived tables and views in one statement.
pub const MAX_QUERY_DEPTH: usize = 32;

/// What a name in FROM means.
#[derive(Clone, Debug)]
pub enum Entry {
    Table(TableRef),
    View(ViewDef),
    /// A table the SQL node computes (`information_schema`), rows included.
    Virtual(Arc<VirtualTable>),
    /// Looked up: neither a table nor a view.
    Missing,
}

/// Rows the SQL node made up for a statement (`information_schema` tables).
#[derive(Clone, Debug)]
pub struct VirtualTable {
    pub name: String,
    pub columns: Vec<ColumnMeta>,
    pub rows: Arc<Vec<Vec<Val>>>,
}

/// A stored view: its `CREATE VIEW` text, parsed when used.
#[derive(Clone, Debug)]
pub struct ViewDef {
    pub db: String,
    pub name: String,
    pub sql: String,
}

/// The names a statement uses, as looked up for it.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub db: Option<String>,
    entries: HashMap<String, Entry>,
}

fn key(db: &str, name: &str) -> String {
    format!("{}.{}", db.to_lowercase(), name.to_lowercase())
}

impl Catalog {
    pub fn new(db: Option<String>) -> Catalog {
        Catalog { db, entries: HashMap::new() }
    }

    pub fn insert(&mut self, db: &str, name: &str, e: Entry) {
        self.entries.insert(key(db, name), e);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[derive(Debug)]
pub struct QueryPlan {
    pub columns: Vec<ColumnMeta>,
    pub body: Body,
}

#[derive(Debug)]
pub enum Body {
    Select(Box<SelectPlan>),
    /// `text_cols`: columns one side gives as numbers and the other as text; MySQL's result
    /// column is then text, so numbers are compared and sorted as their text.
    Set {
        op: SetOp,
        all: bool,
        left: Box<QueryPlan>,
        right: Box<QueryPlan>,
        text_cols: Vec<usize>,
    },
    /// ORDER BY / LIMIT over the output columns of a set operation or parenthesized query.
    Sorted {
        input: Box<QueryPlan>,
        order: Vec<(usize, bool)>,
        limit: Option<u64>,
        offset: u64,
    },
    /// A recursive common table expression (`WITH RECURSIVE`).
    Recursive(Box<RecursivePlan>),
}

/// `WITH RECURSIVE name AS (seed UNION [ALL] step)`: the seeds run once; each step then runs
/// over the rows the previous round added ([`WorkTable`]) until a round adds none.
#[derive(Debug)]
pub struct RecursivePlan {
    pub name: String,
    /// The query blocks that do not name the CTE, in order.
    pub seeds: Vec<QueryPlan>,
    /// The query blocks that name it once, in their FROM.
    pub steps: Vec<QueryPlan>,
    /// UNION (not UNION ALL) somewhere in the chain: a row already produced is not added again,
    /// which is also what ends a recursion over a cycle.
    pub distinct: bool,
    pub work: Arc<WorkTable>,
    /// The session's `cte_max_recursion_depth` when the statement was planned.
    pub max_depth: u64,
}

/// The rows the previous round of a recursive CTE added: what its name means inside a step.
#[derive(Debug, Default)]
pub struct WorkTable {
    pub rows: Mutex<Arc<Vec<Vec<Val>>>>,
}

impl WorkTable {
    pub fn rows(&self) -> Arc<Vec<Vec<Val>>> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, rows: Vec<Vec<Val>>) {
        *self.rows.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(rows);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetOp {
    Union,
    Intersect,
    Except,
}

#[derive(Debug)]
pub enum SortKey {
    /// An output column.
    Out(usize),
    Expr(Expr),
}

/// One SELECT: FROM, WHERE, grouping, HAVING, projection, DISTINCT, ORDER BY, LIMIT.
#[derive(Debug)]
pub struct SelectPlan {
    pub from: From,
    /// Width of the combined FROM row.
    pub width: usize,
    pub filter: Option<Expr>,
    pub outputs: Vec<Expr>,
    /// (key, ascending)
    pub order: Vec<(SortKey, bool)>,
    pub grouped: bool,
    pub group_exprs: Vec<Expr>,
    pub aggs: Vec<AggSpec>,
    pub having: Option<Expr>,
    pub distinct: bool,
    pub limit: Option<u64>,
    pub offset: u64,
    /// Window functions of the select list, computed over the rows after HAVING.
    pub windows: Vec<crate::sql::window::WinSpec>,
}

#[derive(Debug)]
pub enum From {
    /// No FROM clause: one empty row.
    Dual,
    Scan(Arc<Scan>),
    Derived(Arc<Derived>),
    /// Rows made in the SQL node (`information_schema`).
    Values(Arc<VirtualTable>),
    Join(Box<Join>),
    /// A recursive CTE's name inside its own step: the previous round's rows.
    Work {
        name: String,
        width: usize,
        table: Arc<WorkTable>,
    },
}

/// A base table as a query reads it: the rows its pushed-down conjuncts select, fetched before
/// the plan runs (visible columns only).
#[derive(Debug)]
pub struct Scan {
    pub table: TableRef,
    /// Conjuncts over this table's own columns (positions of the table, not of the join).
    pub pushed: Option<Expr>,
    pub rows: OnceLock<Vec<Vec<Val>>>,
}

/// A subquery in FROM or a view: run once per statement, its rows kept for the statement.
#[derive(Debug)]
pub struct Derived {
    /// The alias (or the view's name) that qualifies its columns.
    pub name: String,
    pub plan: QueryPlan,
    pub rows: OnceLock<Vec<Vec<Val>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinKind {
    Inner,
    Left,
    Right,
}

#[derive(Debug)]
pub struct Join {
    pub left: From,
    pub right: From,
    pub kind: JoinKind,
    /// Over this join's row (left columns, then right columns).
    pub on: Option<Expr>,
    pub left_width: usize,
    pub right_width: usize,
    /// Equalities the join matches by hashing: (left column, right column), each a position in
    /// its side's row. Empty: nested loops.
    pub hash: Vec<(usize, usize)>,
}

impl From {
    pub fn width(&self) -> usize {
        match self {
            From::Dual => 0,
            From::Scan(s) => s.table.visible(),
            From::Derived(d) => d.plan.columns.len(),
            From::Values(v) => v.columns.len(),
            From::Join(j) => j.left_width + j.right_width,
            From::Work { width, .. } => *width,
        }
    }
}

impl QueryPlan {
    /// Visits every expression of this query level (not those of its subqueries or derived
    /// tables, which have scopes of their own).
    pub fn each_expr(&self, f: &mut dyn FnMut(&Expr)) {
        match &self.body {
            Body::Select(s) => {
                fn from_exprs(fr: &From, f: &mut dyn FnMut(&Expr)) {
                    if let From::Join(j) = fr {
                        from_exprs(&j.left, f);
                        from_exprs(&j.right, f);
                        if let Some(on) = &j.on {
                            f(on);
                        }
                    }
                }
                from_exprs(&s.from, f);
                s.filter.iter().chain(&s.outputs).chain(&s.group_exprs).chain(&s.having).for_each(&mut *f);
                s.aggs.iter().filter_map(|a| a.arg.as_ref()).for_each(&mut *f);
                for (k, _) in &s.order {
                    if let SortKey::Expr(e) = k {
                        f(e);
                    }
                }
            }
            Body::Set { left, right, .. } => {
                left.each_expr(f);
                right.each_expr(f);
            }
            Body::Sorted { input, .. } => input.each_expr(f),
            Body::Recursive(r) => r.seeds.iter().chain(&r.steps).for_each(|p| p.each_expr(f)),
        }
    }

    /// Every base-table scan the plan reads, subqueries and derived tables included.
    pub fn scans(&self, out: &mut Vec<Arc<Scan>>) {
        match &self.body {
            Body::Select(s) => {
                from_scans(&s.from, out);
                self.each_expr(&mut |e| {
                    e.walk(&mut |x| {
                        if let Expr::Subquery(s) = x {
                            s.plan.plan.scans(out);
                        }
                    })
                });
            }
            Body::Set { left, right, .. } => {
                left.scans(out);
                right.scans(out);
            }
            Body::Sorted { input, .. } => input.scans(out),
            Body::Recursive(r) => r.seeds.iter().chain(&r.steps).for_each(|p| p.scans(out)),
        }
    }
}

fn from_scans(fr: &From, out: &mut Vec<Arc<Scan>>) {
    match fr {
        From::Dual | From::Values(_) | From::Work { .. } => {}
        From::Scan(s) => out.push(s.clone()),
        From::Derived(d) => d.plan.scans(out),
        From::Join(j) => {
            from_scans(&j.left, out);
            from_scans(&j.right, out);
        }
    }
}

/// Plans queries against a catalog snapshot; see the module docs for how missing names are
/// reported.
pub struct Planner<'a> {
    pub env: &'a Env,
    catalog: &'a Catalog,
    /// The first name the catalog did not have: (database, name).
    pub wanted: RefCell<Option<(String, String)>>,
    /// The database unqualified names mean (the session's, or a view's while planning it).
    db: RefCell<Option<String>>,
    depth: Cell<usize>,
    /// Common table expressions in scope, innermost last.
    ctes: RefCell<Vec<Cte>>,
}

/// A `WITH` query: planned as a derived table wherever it is named.
#[derive(Clone)]
struct Cte {
    name: String,
    query: ast::Query,
    columns: Vec<String>,
    /// The statement text its spans refer to.
    text: String,
    /// Defined under `WITH RECURSIVE`: it may name itself.
    recursive: bool,
    /// Set on the entry that stands for a recursive CTE while its own query is planned.
    work: Option<Arc<WorkMarker>>,
}

/// What a recursive CTE's name means while its own query blocks are planned. (Shared through
/// an `Arc`, as a planner lives across a statement's awaits.)
struct WorkMarker {
    table: Arc<WorkTable>,
    /// Its columns (named as the CTE names them), known once the first seed is planned.
    columns: Mutex<Option<Vec<ColumnMeta>>>,
    /// How often the block being planned named it.
    uses: AtomicUsize,
    /// The planner's depth in a block's own FROM: a use any deeper is inside a subquery or a
    /// derived table, which would see only the first round's rows.
    depth: usize,
}

/// What a CTE's name in FROM stands for.
enum CteUse {
    /// Its query, planned, with the CTE's column names (empty: the query's own).
    Plan(QueryPlan, Vec<String>),
    /// A recursive CTE inside its own step: the previous round's rows, with these columns.
    Work(Arc<WorkTable>, Vec<ColumnMeta>),
}

fn nonrecursive_first(name: &str) -> SqlError {
    SqlError::new(
        code::CTE_RECURSIVE_REQUIRES_NONRECURSIVE_FIRST,
        format!("Recursive Common Table Expression '{name}' should have one or more non-recursive query blocks followed by one or more recursive ones"),
    )
}

fn different_columns() -> SqlError {
    SqlError::new(
        code::WRONG_NUMBER_OF_COLUMNS_IN_SELECT,
        "The used SELECT statements have a different number of columns",
    )
}

fn seeds_width(seeds: &[QueryPlan]) -> usize {
    seeds.first().map_or(0, |s| s.columns.len())
}

/// A recursive block adds rows one at a time from the previous round's: what needs all of a
/// round at once (aggregates, windows, DISTINCT, ORDER BY, LIMIT) is refused, as MySQL does.
fn check_step(name: &str, plan: &QueryPlan) -> SqlResult<()> {
    let Body::Select(s) = &plan.body else {
        return Err(SqlError::not_supported("a set operation or parenthesized query as a recursive query block"));
    };
    if s.grouped || !s.aggs.is_empty() || !s.windows.is_empty() {
        return Err(SqlError::new(
            code::CTE_RECURSIVE_FORBIDS_AGGREGATION,
            format!("Recursive Common Table Expression '{name}' can contain neither aggregation nor window functions in recursive query block"),
        ));
    }
    if s.distinct || !s.order.is_empty() || s.limit.is_some() || s.offset > 0 {
        return Err(SqlError::not_supported("DISTINCT, ORDER BY or LIMIT in a recursive query block"));
    }
    Ok(())
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

/// Evaluates a LIMIT/OFFSET expression.
pub fn const_count(env: &Env, e: &ast::Expr) -> SqlResult<u64> {
    let v = Binder::new(env, None, "limit clause").bind(e)?.eval(&[], &[])?;
    match v {
        Val::Int(i) if i >= 0 => Ok(i as u64),
        Val::UInt(u) => Ok(u),
        _ => Err(SqlError::parse("LIMIT and OFFSET take non-negative integers")),
    }
}

fn limit_offset(env: &Env, l: &Option<ast::LimitClause>) -> SqlResult<(Option<u64>, u64)> {
    Ok(match l {
        None => (None, 0),
        Some(ast::LimitClause::LimitOffset { limit, offset, limit_by }) => {
            if !limit_by.is_empty() {
                return Err(SqlError::not_supported("LIMIT BY"));
            }
            let l = match limit {
                Some(e) => Some(const_count(env, e)?),
                None => None,
            };
            let o = match offset {
                Some(o) => const_count(env, &o.value)?,
                None => 0,
            };
            (l, o)
        }
        Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) => {
            (Some(const_count(env, limit)?), const_count(env, offset)?)
        }
    })
}

fn order_items(o: &Option<ast::OrderBy>) -> SqlResult<Vec<&ast::OrderByExpr>> {
    match o {
        None => Ok(vec![]),
        Some(ob) => match &ob.kind {
            ast::OrderByKind::Expressions(items) => Ok(items.iter().collect()),
            ast::OrderByKind::All(_) => Err(SqlError::not_supported("ORDER BY ALL")),
        },
    }
}

fn ascending(it: &ast::OrderByExpr) -> bool {
    !matches!(it.options.sort, Some(ast::OrderBySort::Desc))
}

/// An ORDER BY item over output columns: a position or an output name.
fn output_position(e: &ast::Expr, columns: &[ColumnMeta]) -> SqlResult<usize> {
    match e {
        ast::Expr::Value(v) => {
            if let ast::Value::Number(n, _) = &v.value {
                let i: usize = n.to_string().parse().unwrap_or(0);
                if i >= 1 && i <= columns.len() {
                    return Ok(i - 1);
                }
                return Err(SqlError::bad_field(&n.to_string(), "order clause"));
            }
        }
        ast::Expr::Identifier(id) => {
            if let Some(i) = columns.iter().position(|c| c.name.eq_ignore_ascii_case(&id.value)) {
                return Ok(i);
            }
            return Err(SqlError::bad_field(&id.value, "order clause"));
        }
        ast::Expr::CompoundIdentifier(p) => {
            let last = p.last().map(|i| i.value.clone()).unwrap_or_default();
            if let Some(i) = columns.iter().position(|c| c.name.eq_ignore_ascii_case(&last)) {
                return Ok(i);
            }
            return Err(SqlError::bad_field(&last, "order clause"));
        }
        _ => {}
    }
    Err(SqlError::not_supported("ORDER BY expressions over a UNION (order by output columns)"))
}

/// Columns of the conjunct, or None when it reads anything but this query's columns and
/// constants (enclosing rows, subqueries, aggregates).
fn local_columns(e: &Expr) -> Option<Vec<usize>> {
    let mut cols = vec![];
    let mut ok = true;
    e.walk(&mut |x| match x {
        Expr::Col(i) => cols.push(*i),
        Expr::Outer(..) | Expr::Subquery(_) | Expr::Agg(_) => ok = false,
        _ => {}
    });
    ok.then_some(cols)
}

/// Scans that may take pushed-down conjuncts: (first column in the combined row, width, scan).
fn pushable_leaves<'a>(
    fr: &'a mut From,
    start: usize,
    nullable: bool,
    out: &mut Vec<(usize, usize, &'a mut Scan)>,
) -> usize {
    match fr {
        From::Dual => 0,
        From::Scan(s) => {
            let w = s.table.visible();
            if !nullable {
                if let Some(m) = Arc::get_mut(s) {
                    out.push((start, w, m));
                }
            }
            w
        }
        From::Derived(d) => d.plan.columns.len(),
        From::Values(v) => v.columns.len(),
        From::Work { width, .. } => *width,
        From::Join(j) => {
            let Join { left, right, kind, .. } = &mut **j;
            let lw = pushable_leaves(left, start, nullable || *kind == JoinKind::Right, out);
            let rw = pushable_leaves(right, start + lw, nullable || *kind == JoinKind::Left, out);
            lw + rw
        }
    }
}

/// Pushes conjuncts that read one pushable scan into it.
fn push_down(fr: &mut From, conjuncts: &[&Expr]) {
    let mut leaves = vec![];
    pushable_leaves(fr, 0, false, &mut leaves);
    for c in conjuncts {
        let Some(cols) = local_columns(c) else { continue };
        for (start, width, scan) in leaves.iter_mut() {
            if cols.iter().all(|&i| i >= *start && i < *start + *width) {
                let mut local = (*c).clone();
                let off = *start;
                local.walk_mut(&mut |x| {
                    if let Expr::Col(i) = x {
                        *i -= off;
                    }
                });
                scan.pushed = Some(match scan.pushed.take() {
                    Some(p) => Expr::and(p, local),
                    None => local,
                });
                break;
            }
        }
    }
}

/// Inner-join ON conjuncts of joins not under the NULL-filled side of an outer join (they hold
/// for every result row, like WHERE's), with positions of the combined row.
fn inner_on_conditions(fr: &From, start: usize, nullable: bool, out: &mut Vec<Expr>) {
    if let From::Join(j) = fr {
        if j.kind == JoinKind::Inner && !nullable {
            if let Some(on) = &j.on {
                for c in on.conjuncts() {
                    let mut g = c.clone();
                    g.walk_mut(&mut |x| {
                        if let Expr::Col(i) = x {
                            *i += start;
                        }
                    });
                    out.push(g);
                }
            }
        }
        inner_on_conditions(&j.left, start, nullable || j.kind == JoinKind::Right, out);
        inner_on_conditions(&j.right, start + j.left_width, nullable || j.kind == JoinKind::Left, out);
    }
}

/// Chooses the equalities each join matches by hashing: its own ON equalities, and for inner
/// joins not under a NULL-filled side the WHERE / ON equalities (`conj`, combined-row positions)
/// between its two sides. Only column pairs of comparable kinds (both numeric or both text)
/// hash; the full conditions are evaluated on every candidate row anyway.
fn choose_hash_keys(fr: &mut From, start: usize, nullable: bool, conj: &[Expr], types: &[Option<WireType>]) {
    let From::Join(j) = fr else { return };
    let (lw, rw) = (j.left_width, j.right_width);
    choose_hash_keys(&mut j.left, start, nullable || j.kind == JoinKind::Right, conj, types);
    choose_hash_keys(&mut j.right, start + lw, nullable || j.kind == JoinKind::Left, conj, types);
    let ty = |local: usize| types.get(start + local).copied().flatten();
    let mut keys = vec![];
    if let Some(on) = &j.on {
        keys.extend(equi_pairs(on, lw));
    }
    if j.kind == JoinKind::Inner && !nullable {
        for c in conj {
            let Some(cols) = local_columns(c) else { continue };
            if cols.iter().any(|&i| i < start || i >= start + lw + rw) {
                continue;
            }
            let mut local = c.clone();
            local.walk_mut(&mut |x| {
                if let Expr::Col(i) = x {
                    *i -= start;
                }
            });
            keys.extend(equi_pairs(&local, lw));
        }
    }
    keys.retain(|&(l, r)| hashable_pair(ty(l), ty(r)));
    keys.dedup();
    j.hash = keys.into_iter().map(|(l, r)| (l, r - lw)).collect();
}

impl<'a> Planner<'a> {
    pub fn new(env: &'a Env, catalog: &'a Catalog) -> Planner<'a> {
        Planner {
            env,
            catalog,
            wanted: RefCell::new(None),
            db: RefCell::new(catalog.db.clone()),
            depth: Cell::new(0),
            ctes: RefCell::new(vec![]),
        }
    }

    fn lookup(&self, parts: &[String]) -> SqlResult<Entry> {
        let (db, name) = match parts {
            [t] => {
                let db = self.db.borrow().clone().ok_or_else(|| SqlError::new(code::NO_DB, "No database selected"))?;
                (db, t.clone())
            }
            [d, t] => (d.clone(), t.clone()),
            _ => return Err(SqlError::parse(format!("bad table name {}", parts.join(".")))),
        };
        match self.catalog.entries.get(&key(&db, &name)) {
            Some(Entry::Missing) => Err(SqlError::no_such_table(&db, &name)),
            Some(e) => Ok(e.clone()),
            None => {
                self.wanted.borrow_mut().get_or_insert((db.clone(), name.clone()));
                Err(SqlError::no_such_table(&db, &name))
            }
        }
    }

    fn nested<T>(&self, f: impl FnOnce() -> SqlResult<T>) -> SqlResult<T> {
        if self.depth.get() >= MAX_QUERY_DEPTH {
            return Err(SqlError::not_supported(format!(
                "more than {MAX_QUERY_DEPTH} levels of nested subqueries, derived tables and views"
            )));
        }
        self.depth.set(self.depth.get() + 1);
        let r = f();
        self.depth.set(self.depth.get() - 1);
        r
    }

    /// Plans a query. `outer` are the scopes of enclosing queries (outermost first); `names` the
    /// select-list items as written, when the caller has them (the statement's first SELECT).
    pub fn query(
        &self,
        q: &ast::Query,
        text: &str,
        outer: &[&Scope],
        names: Option<&[String]>,
    ) -> SqlResult<QueryPlan> {
        self.nested(|| self.query_inner(q, text, outer, names))
    }

    /// Plans a subquery of an expression.
    pub fn subquery(&self, q: &ast::Query, outer: &[&Scope]) -> SqlResult<Arc<SubPlan>> {
        let text = q.to_string();
        // Names of a subquery's columns do not matter; its text is only for them.
        let plan = self.query(q, &text, outer, None)?;
        Ok(Arc::new(SubPlan::new(plan)))
    }

    fn query_inner(
        &self,
        q: &ast::Query,
        text: &str,
        outer: &[&Scope],
        names: Option<&[String]>,
    ) -> SqlResult<QueryPlan> {
        let Some(with) = &q.with else { return self.query_body(q, text, outer, names) };
        // The CTEs are visible to the rest of this query (and, in order, to each other).
        let base = self.ctes.borrow().len();
        for c in &with.cte_tables {
            let name = c.alias.name.value.clone();
            if self.ctes.borrow()[base..].iter().any(|o| o.name.eq_ignore_ascii_case(&name)) {
                self.ctes.borrow_mut().truncate(base);
                return Err(SqlError::new(code::NONUNIQ_TABLE, format!("Not unique table/alias: '{name}'")));
            }
            let columns = c.alias.columns.iter().map(|col| col.name.value.clone()).collect();
            self.ctes.borrow_mut().push(Cte {
                name,
                query: (*c.query).clone(),
                columns,
                text: text.to_string(),
                recursive: with.recursive,
                work: None,
            });
        }
        let r = self.query_body(q, text, outer, names);
        self.ctes.borrow_mut().truncate(base);
        r
    }

    /// Plans the CTE named `name` (the innermost one of that name) as a derived table, seeing
    /// only the CTEs defined before it (and, under `WITH RECURSIVE`, itself). None when no CTE
    /// has that name.
    fn cte(&self, name: &str) -> Option<SqlResult<CteUse>> {
        let pos = self.ctes.borrow().iter().rposition(|c| c.name.eq_ignore_ascii_case(name))?;
        let cte = self.ctes.borrow()[pos].clone();
        if let Some(marker) = &cte.work {
            return Some(self.work_use(&cte.name, marker));
        }
        let later = self.ctes.borrow_mut().split_off(pos);
        let plan = if cte.recursive { self.recursive_cte(&cte) } else { self.query(&cte.query, &cte.text, &[], None) };
        self.ctes.borrow_mut().extend(later);
        Some(plan.map(|p| CteUse::Plan(p, cte.columns)))
    }

    /// A recursive CTE's name inside one of its own query blocks.
    fn work_use(&self, name: &str, marker: &WorkMarker) -> SqlResult<CteUse> {
        marker.uses.fetch_add(1, AtomicOrdering::Relaxed);
        if self.depth.get() != marker.depth {
            return Err(SqlError::new(
                code::CTE_RECURSIVE_REQUIRES_SINGLE_REFERENCE,
                format!("In recursive query block of Recursive Common Table Expression '{name}', the recursive table must be referenced only once, and not in any subquery"),
            ));
        }
        match marker.columns.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(cols) => Ok(CteUse::Work(marker.table.clone(), cols.clone())),
            None => Err(nonrecursive_first(name)),
        }
    }

    /// A CTE defined under `WITH RECURSIVE`. Planned once with its own name standing for the
    /// previous round's rows: if no block names it, that plan is the CTE's. Otherwise its query
    /// is a chain of UNION [ALL] whose blocks are planned one by one: seeds (not naming it)
    /// first, then steps (naming it once, in their own FROM).
    fn recursive_cte(&self, cte: &Cte) -> SqlResult<QueryPlan> {
        let marker = Arc::new(WorkMarker {
            table: Arc::new(WorkTable::default()),
            columns: Mutex::new(None),
            uses: AtomicUsize::new(0),
            depth: self.depth.get() + 1,
        });
        self.ctes.borrow_mut().push(Cte { work: Some(marker.clone()), ..cte.clone() });
        let r = self.recursive_blocks(cte, &marker);
        self.ctes.borrow_mut().pop();
        r
    }

    fn recursive_blocks(&self, cte: &Cte, marker: &WorkMarker) -> SqlResult<QueryPlan> {
        let whole = self.query(&cte.query, &cte.text, &[], None);
        if marker.uses.load(AtomicOrdering::Relaxed) == 0 {
            return whole;
        }
        let name = &cte.name;
        let q = &cte.query;
        if !order_items(&q.order_by)?.is_empty() || q.limit_clause.is_some() {
            return Err(SqlError::not_supported("ORDER BY or LIMIT over a recursive common table expression"));
        }
        // The chain of UNIONs, left to right.
        let mut blocks = vec![];
        let mut distinct = false;
        let mut at = q.body.as_ref();
        while let ast::SetExpr::SetOperation { left, op: ast::SetOperator::Union, set_quantifier, right } = at {
            distinct |= !matches!(set_quantifier, ast::SetQuantifier::All);
            blocks.push(right.as_ref());
            at = left;
        }
        blocks.push(at);
        blocks.reverse();
        if blocks.len() < 2 {
            return Err(SqlError::new(
                code::CTE_RECURSIVE_REQUIRES_UNION,
                format!("Recursive Common Table Expression '{name}' should contain a UNION"),
            ));
        }
        let (mut seeds, mut steps) = (vec![], vec![]);
        for block in blocks {
            marker.uses.store(0, AtomicOrdering::Relaxed);
            let plan = self.nested(|| self.set_expr(block, &cte.text, &[], None))?;
            match marker.uses.load(AtomicOrdering::Relaxed) {
                0 if steps.is_empty() => {
                    if seeds.is_empty() {
                        let cols = derived_columns(&plan.columns, name, "", name, &cte.columns)?;
                        *marker.columns.lock().unwrap_or_else(|e| e.into_inner()) = Some(cols);
                    } else if plan.columns.len() != seeds_width(&seeds) {
                        return Err(different_columns());
                    }
                    seeds.push(plan);
                }
                0 => return Err(nonrecursive_first(name)),
                1 => {
                    if plan.columns.len() != seeds_width(&seeds) {
                        return Err(different_columns());
                    }
                    check_step(name, &plan)?;
                    steps.push(plan);
                }
                _ => {
                    return Err(SqlError::new(
                        code::CTE_RECURSIVE_REQUIRES_SINGLE_REFERENCE,
                        format!("In recursive query block of Recursive Common Table Expression '{name}', the recursive table must be referenced only once, and not in any subquery"),
                    ))
                }
            }
        }
        // The first seed names the columns; a column's type holds where every block agrees on
        // it (as for UNION), else the values decide.
        let columns = seeds[0]
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let agree = seeds.iter().chain(&steps).all(|p| p.columns[i].ty == c.ty);
                if agree {
                    c.clone()
                } else {
                    ColumnMeta::named(&c.name, None)
                }
            })
            .collect();
        let plan = RecursivePlan {
            name: name.clone(),
            seeds,
            steps,
            distinct,
            work: marker.table.clone(),
            max_depth: self.env.cte_max_recursion_depth(),
        };
        Ok(QueryPlan { columns, body: Body::Recursive(Box::new(plan)) })
    }

    fn query_body(
        &self,
        q: &ast::Query,
        text: &str,
        outer: &[&Scope],
        names: Option<&[String]>,
    ) -> SqlResult<QueryPlan> {
        // FOR UPDATE / FOR SHARE are carried out when the plan runs (exec.rs, txn.rs).
        if q.fetch.is_some() || q.for_clause.is_some() {
            return Err(SqlError::not_supported("FETCH / FOR clauses"));
        }
        let (limit, offset) = limit_offset(self.env, &q.limit_clause)?;
        let order = order_items(&q.order_by)?;
        match q.body.as_ref() {
            ast::SetExpr::Select(s) => self.select(s, &order, limit, offset, text, outer, names),
            body => {
                let input = self.set_expr(body, text, outer, names)?;
                if order.is_empty() && limit.is_none() && offset == 0 {
                    return Ok(input);
                }
                let order = order
                    .iter()
                    .map(|it| Ok((output_position(&it.expr, &input.columns)?, ascending(it))))
                    .collect::<SqlResult<Vec<_>>>()?;
                Ok(QueryPlan {
                    columns: input.columns.clone(),
                    body: Body::Sorted { input: Box::new(input), order, limit, offset },
                })
            }
        }
    }

    fn set_expr(
        &self,
        e: &ast::SetExpr,
        text: &str,
        outer: &[&Scope],
        names: Option<&[String]>,
    ) -> SqlResult<QueryPlan> {
        match e {
            ast::SetExpr::Select(s) => self.select(s, &[], None, 0, text, outer, names),
            ast::SetExpr::Query(q) => self.query(q, text, outer, names),
            ast::SetExpr::SetOperation { left, op, set_quantifier, right } => {
                let l = self.set_expr(left, text, outer, names)?;
                let r = self.set_expr(right, text, outer, None)?;
                if l.columns.len() != r.columns.len() {
                    return Err(SqlError::new(
                        code::WRONG_NUMBER_OF_COLUMNS_IN_SELECT,
                        "The used SELECT statements have a different number of columns",
                    ));
                }
                let all = match set_quantifier {
                    ast::SetQuantifier::All => true,
                    ast::SetQuantifier::Distinct | ast::SetQuantifier::None => false,
                    other => return Err(SqlError::not_supported(format!("{op} {other}"))),
                };
                let op = match op {
                    ast::SetOperator::Union => SetOp::Union,
                    ast::SetOperator::Intersect => SetOp::Intersect,
                    ast::SetOperator::Except | ast::SetOperator::Minus => SetOp::Except,
                };
                // The first query names the columns; a type holds where both sides agree.
                let kind = |t: Option<WireType>| match t {
                    Some(WireType::Int { .. } | WireType::Decimal { .. } | WireType::Float | WireType::Double) => {
                        Some(0)
                    }
                    Some(WireType::Str { .. } | WireType::Blob { .. } | WireType::Date | WireType::Datetime { .. }) => {
                        Some(1)
                    }
                    _ => None,
                };
                let mut text_cols = vec![];
                let columns = l
                    .columns
                    .iter()
                    .zip(&r.columns)
                    .enumerate()
                    .map(|(i, (a, b))| {
                        let mixed = matches!((kind(a.ty), kind(b.ty)), (Some(x), Some(y)) if x != y);
                        if mixed {
                            text_cols.push(i);
                        }
                        let ty = match (a.ty == b.ty, mixed) {
                            (true, _) => a.ty,
                            (false, true) => Some(WireType::Str { len: 255 }),
                            (false, false) => None,
                        };
                        ColumnMeta::named(&a.name, ty)
                    })
                    .collect();
                Ok(QueryPlan { columns, body: Body::Set { op, all, left: Box::new(l), right: Box::new(r), text_cols } })
            }
            ast::SetExpr::Values(_) => Err(SqlError::not_supported("VALUES as a query")),
            _ => Err(SqlError::not_supported("this query form")),
        }
    }

    // ----- FROM -----

    fn plan_from(&self, from: &[ast::TableWithJoins], outer: &[&Scope], scope: &mut Scope) -> SqlResult<From> {
        let mut acc: Option<From> = None;
        for twj in from {
            let item = self.table_with_joins(twj, outer, scope)?;
            acc = Some(match acc {
                None => item,
                Some(prev) => {
                    let (lw, rw) = (prev.width(), item.width());
                    From::Join(Box::new(Join {
                        left: prev,
                        right: item,
                        kind: JoinKind::Inner,
                        on: None,
                        left_width: lw,
                        right_width: rw,
                        hash: vec![],
                    }))
                }
            });
        }
        Ok(acc.unwrap_or(From::Dual))
    }

    fn table_with_joins(&self, twj: &ast::TableWithJoins, outer: &[&Scope], scope: &mut Scope) -> SqlResult<From> {
        let start = scope.width();
        let first_rel = scope.rels.len();
        let mut item = self.factor(&twj.relation, outer, scope)?;
        for j in &twj.joins {
            use ast::JoinOperator as J;
            let (kind, constraint) = match &j.join_operator {
                J::Join(c) | J::Inner(c) | J::StraightJoin(c) | J::CrossJoin(c) => (JoinKind::Inner, c),
                J::Left(c) | J::LeftOuter(c) => (JoinKind::Left, c),
                J::Right(c) | J::RightOuter(c) => (JoinKind::Right, c),
                other => return Err(SqlError::not_supported(format!("join {other:?}"))),
            };
            let left_rels = first_rel..scope.rels.len();
            let right_rel = scope.rels.len();
            let right = self.factor(&j.relation, outer, scope)?;
            let on = match constraint {
                ast::JoinConstraint::On(e) => {
                    let mut b = Binder::scoped(self.env, scope, outer, Some(self), "on clause");
                    let mut on = b.bind(e)?;
                    // ON sees the tables of its join only; its positions become the join's own.
                    let mut outside = None;
                    on.walk_mut(&mut |x| {
                        if let Expr::Col(i) = x {
                            if *i < start {
                                outside = Some(*i);
                            }
                            *i = i.saturating_sub(start);
                        }
                    });
                    if let Some(i) = outside {
                        let name = scope.meta(i).map_or_else(|| i.to_string(), |m| format!("{}.{}", m.table, m.name));
                        return Err(SqlError::bad_field(&name, "on clause"));
                    }
                    Some(on)
                }
                ast::JoinConstraint::None => None,
                ast::JoinConstraint::Using(names) => {
                    let names: Vec<String> = names.iter().map(|n| object_parts(n).pop().unwrap_or_default()).collect();
                    Self::using(scope, start, right_rel, &names, kind, false)?
                }
                ast::JoinConstraint::UsingAlias(..) => {
                    return Err(SqlError::not_supported("JOIN ... USING (...) AS alias"));
                }
                ast::JoinConstraint::Natural => {
                    // The columns both sides have, in the right side's order.
                    let mut names: Vec<String> = vec![];
                    for r in &scope.rels[right_rel..] {
                        for c in r.cols.iter() {
                            if !scope.positions_named(left_rels.clone(), &c.name).is_empty()
                                && !names.iter().any(|n| n.eq_ignore_ascii_case(&c.name))
                            {
                                names.push(c.name.clone());
                            }
                        }
                    }
                    Self::using(scope, start, right_rel, &names, kind, true)?
                }
            };
            let (lw, rw) = (item.width(), right.width());
            item = From::Join(Box::new(Join {
                left: item,
                right,
                kind,
                on,
                left_width: lw,
                right_width: rw,
                hash: vec![],
            }));
        }
        Ok(item)
    }

    /// `JOIN … USING (names)` (or NATURAL JOIN's common names): the equalities of the ON
    /// condition, in the join's own positions (it starts at `start`; its right side is
    /// relation `right_rel` on). Each name then means one column: the left one, or for RIGHT
    /// JOIN the right one (the side whose value is never NULL-filled).
    fn using(
        scope: &mut Scope,
        start: usize,
        right_rel: usize,
        names: &[String],
        kind: JoinKind,
        natural: bool,
    ) -> SqlResult<Option<Expr>> {
        let mut on: Option<Expr> = None;
        let mut pairs = vec![];
        for n in names {
            let l = scope.positions_named(0..right_rel, n);
            let l = l.into_iter().filter(|&i| i >= start).collect::<Vec<_>>();
            let r = scope.positions_named(right_rel..scope.rels.len(), n);
            let (l, r) = match (l.as_slice(), r.as_slice()) {
                ([l], [r]) => (*l, *r),
                ([], _) | (_, []) => {
                    return Err(SqlError::bad_field(n, "from clause"));
                }
                _ => {
                    return Err(SqlError::new(
                        code::NON_UNIQ_ERROR,
                        format!("Column '{n}' in from clause is ambiguous"),
                    ))
                }
            };
            pairs.push((l, r));
            let eq = Expr::Cmp(Cmp::Eq, Box::new(Expr::Col(l - start)), Box::new(Expr::Col(r - start)));
            on = Some(match on {
                Some(p) => Expr::and(p, eq),
                None => eq,
            });
        }
        let mut first = vec![];
        for (l, r) in pairs {
            let (keep, merge) = if kind == JoinKind::Right { (r, l) } else { (l, r) };
            scope.merged.push(merge);
            scope.coalesced.retain(|&c| c != merge);
            first.push(keep);
        }
        first.retain(|c| !scope.coalesced.contains(c));
        first.extend(scope.coalesced.iter().copied());
        scope.coalesced = first;
        if natural && on.is_none() {
            return Ok(None);
        }
        Ok(on)
    }

    fn check_alias(scope: &Scope, q: &str) -> SqlResult<()> {
        if scope.rels.iter().any(|r| r.qualifier.eq_ignore_ascii_case(q)) {
            return Err(SqlError::new(code::NONUNIQ_TABLE, format!("Not unique table/alias: '{q}'")));
        }
        Ok(())
    }

    fn factor(&self, f: &ast::TableFactor, outer: &[&Scope], scope: &mut Scope) -> SqlResult<From> {
        match f {
            ast::TableFactor::Table { name, alias, args: None, .. } => {
                let parts = object_parts(name);
                let alias_name = alias.as_ref().map(|a| a.name.value.clone());
                if let [one] = parts.as_slice() {
                    if let Some(r) = self.cte(one) {
                        let alias_cols: Vec<String> =
                            alias.iter().flat_map(|a| &a.columns).map(|c| c.name.value.clone()).collect();
                        let q = alias_name.unwrap_or_else(|| one.clone());
                        Self::check_alias(scope, &q)?;
                        return match r? {
                            CteUse::Plan(plan, mut renames) => {
                                if !alias_cols.is_empty() {
                                    renames = alias_cols;
                                }
                                let cols = derived_columns(&plan.columns, &q, "", &q, &renames)?;
                                scope.push(&q, None, &q, cols);
                                Ok(From::Derived(Arc::new(Derived { name: q, plan, rows: OnceLock::new() })))
                            }
                            CteUse::Work(table, cols) => {
                                let cols = derived_columns(&cols, &q, "", &q, &alias_cols)?;
                                let width = cols.len();
                                scope.push(&q, None, &q, cols);
                                Ok(From::Work { name: q, width, table })
                            }
                        };
                    }
                    if one.eq_ignore_ascii_case("dual") && alias.is_none() {
                        // MySQL's dummy table: one row, no columns.
                        return Ok(From::Dual);
                    }
                }
                if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
                    return Err(SqlError::not_supported("column aliases on a table"));
                }
                match self.lookup(&parts)? {
                    Entry::Table(mut t) => {
                        t.alias = alias_name;
                        Self::check_alias(scope, t.alias.as_deref().unwrap_or(&t.name))?;
                        scope.push_table(&t);
                        Ok(From::Scan(Arc::new(Scan { table: t, pushed: None, rows: OnceLock::new() })))
                    }
                    Entry::View(v) => {
                        let q = alias_name.unwrap_or_else(|| v.name.clone());
                        Self::check_alias(scope, &q)?;
                        let plan = self.view_plan(&v)?;
                        let cols = derived_columns(&plan.columns, &q, &v.db, &v.name, &[])?;
                        scope.push(&q, Some(v.db.clone()), &v.name, cols);
                        Ok(From::Derived(Arc::new(Derived { name: q, plan, rows: OnceLock::new() })))
                    }
                    Entry::Virtual(v) => {
                        let q = alias_name.unwrap_or_else(|| v.name.clone());
                        Self::check_alias(scope, &q)?;
                        let cols = v.columns.iter().map(|c| ColumnMeta { table: q.clone(), ..c.clone() }).collect();
                        let db = v.columns.first().map_or(String::new(), |c| c.db.clone());
                        scope.push(&q, Some(db), &v.name, cols);
                        Ok(From::Values(v))
                    }
                    Entry::Missing => {
                        Err(SqlError::no_such_table(parts.first().map_or("", |s| s), parts.last().map_or("", |s| s)))
                    }
                }
            }
            ast::TableFactor::Derived { lateral, subquery, alias, .. } => {
                if *lateral {
                    return Err(SqlError::not_supported("LATERAL derived tables"));
                }
                let Some(alias) = alias else {
                    return Err(SqlError::new(
                        code::DERIVED_MUST_HAVE_ALIAS,
                        "Every derived table must have its own alias",
                    ));
                };
                let q = alias.name.value.clone();
                Self::check_alias(scope, &q)?;
                // A derived table does not see the query around it (MySQL: only LATERAL does).
                let text = subquery.to_string();
                let plan = self.query(subquery, &text, &[], None)?;
                let renames: Vec<String> = alias.columns.iter().map(|c| c.name.value.clone()).collect();
                let cols = derived_columns(&plan.columns, &q, "", &q, &renames)?;
                scope.push(&q, None, &q, cols);
                Ok(From::Derived(Arc::new(Derived { name: q, plan, rows: OnceLock::new() })))
            }
            ast::TableFactor::NestedJoin { table_with_joins, alias: None } => {
                self.table_with_joins(table_with_joins, outer, scope)
            }
            other => Err(SqlError::not_supported(format!("FROM item {other}"))),
        }
    }

    /// Plans a view's stored query, in the view's database.
    pub fn view_plan(&self, v: &ViewDef) -> SqlResult<QueryPlan> {
        self.nested(|| self.view(v))
    }

    fn view(&self, v: &ViewDef) -> SqlResult<QueryPlan> {
        let stmt = crate::sql::parse::parse_one(&v.sql)?;
        let ast::Statement::CreateView(cv) = stmt else {
            return Err(SqlError::internal(format!("view {}.{} has a bad definition", v.db, v.name)));
        };
        // A view sees its own database and none of the statement's CTEs.
        let saved = self.db.replace(Some(v.db.clone()));
        let saved_ctes = self.ctes.replace(vec![]);
        let plan = self.query(&cv.query, &v.sql, &[], None);
        *self.db.borrow_mut() = saved;
        *self.ctes.borrow_mut() = saved_ctes;
        let mut plan = plan?;
        if !cv.columns.is_empty() {
            if cv.columns.len() != plan.columns.len() {
                return Err(SqlError::new(
                    code::VIEW_WRONG_LIST,
                    "In definition of view, derived table or common table expression, SELECT list and column names list have different column counts",
                ));
            }
            for (m, c) in plan.columns.iter_mut().zip(&cv.columns) {
                m.name = c.name.value.clone();
            }
        }
        Ok(plan)
    }

    // ----- SELECT -----

    #[allow(clippy::too_many_arguments)]
    fn select(
        &self,
        s: &ast::Select,
        order_items: &[&ast::OrderByExpr],
        limit: Option<u64>,
        offset: u64,
        text: &str,
        outer: &[&Scope],
        names: Option<&[String]>,
    ) -> SqlResult<QueryPlan> {
        if s.into.is_some() {
            return Err(SqlError::not_supported("SELECT ... INTO"));
        }
        if s.qualify.is_some() {
            return Err(SqlError::not_supported("QUALIFY"));
        }
        let named_windows = crate::sql::window::named_windows(&s.named_window)?;
        if s.top.is_some() || !s.lateral_views.is_empty() || s.prewhere.is_some() || !s.connect_by.is_empty() {
            return Err(SqlError::not_supported("this SELECT form"));
        }
        let env = self.env;
        let mut scope = Scope::default();
        let mut from = self.plan_from(&s.from, outer, &mut scope)?;
        let col_wire = scope.wire_types();

        // Projection.
        let mut b = Binder::scoped(env, &scope, outer, Some(self), "field list");
        b.allow_aggs = true;
        b.allow_windows = true;
        b.named_windows = named_windows;
        let mut outputs: Vec<Expr> = vec![];
        let mut metas: Vec<ColumnMeta> = vec![];
        let mut aliases: Vec<(String, Expr)> = vec![];
        let names = names.filter(|t| t.len() == s.projection.len());
        for (n, item) in s.projection.iter().enumerate() {
            match item {
                SelectItem::Wildcard(_) => {
                    if scope.rels.is_empty() {
                        return Err(SqlError::new(code::NO_DB, "No tables used"));
                    }
                    for i in scope.star() {
                        outputs.push(Expr::Col(i));
                        metas.push(scope.meta(i).cloned().unwrap_or_default());
                    }
                }
                SelectItem::QualifiedWildcard(kind, _) => {
                    let ast::SelectItemQualifiedWildcardKind::ObjectName(name) = kind else {
                        return Err(SqlError::not_supported(format!("select item {item}")));
                    };
                    let parts = object_parts(name);
                    let rel = scope
                        .rels
                        .iter()
                        .find(|r| match parts.as_slice() {
                            [t] => r.qualifier.eq_ignore_ascii_case(t),
                            [d, t] => {
                                r.db.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(d))
                                    && r.table.eq_ignore_ascii_case(t)
                            }
                            _ => false,
                        })
                        .ok_or_else(|| {
                            SqlError::new(code::BAD_TABLE, format!("Unknown table '{}'", parts.join(".")))
                        })?;
                    for (i, c) in rel.cols.iter().enumerate() {
                        outputs.push(Expr::Col(rel.start + i));
                        metas.push(c.clone());
                    }
                }
                SelectItem::ExprWithAliases { .. } => {
                    return Err(SqlError::not_supported(format!("select item {item}")));
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
                            ast::Expr::Value(_) => source_text(text, e),
                            _ => match names {
                                Some(t) => t[n].clone(),
                                None => source_text(text, e),
                            },
                        },
                    };
                    let meta = match &bound {
                        Expr::Col(i) => match scope.meta(*i) {
                            Some(m) => ColumnMeta { name: name.clone(), ..m.clone() },
                            None => ColumnMeta::named(&name, None),
                        },
                        _ => ColumnMeta::named(&name, None),
                    };
                    if let SelectItem::ExprWithAlias { alias, .. } = item {
                        aliases.push((alias.value.clone(), bound.clone()));
                    }
                    metas.push(meta);
                    outputs.push(bound);
                }
            }
        }
        let mut aggs = std::mem::take(&mut b.aggs);
        let windows = std::mem::take(&mut b.windows);

        // WHERE (no aggregates).
        let filter = match &s.selection {
            Some(e) => Some(Binder::scoped(env, &scope, outer, Some(self), "where clause").bind(e)?),
            None => None,
        };

        // GROUP BY: expressions, output ordinals or aliases.
        let mut group_exprs = vec![];
        match &s.group_by {
            ast::GroupByExpr::Expressions(exprs, mods) if mods.is_empty() => {
                for e in exprs {
                    let k = self.order_or_group_expr(
                        e,
                        &scope,
                        outer,
                        &outputs,
                        &aliases,
                        "group statement",
                        &mut aggs,
                        false,
                    )?;
                    group_exprs.push(match k {
                        SortKey::Out(i) => outputs[i].clone(),
                        SortKey::Expr(e) => e,
                    });
                }
            }
            _ => return Err(SqlError::not_supported("GROUP BY ALL / WITH ROLLUP")),
        }

        // HAVING and ORDER BY may use aggregates and aliases.
        let having = match &s.having {
            Some(e) => {
                let mut hb = Binder::scoped(env, &scope, outer, Some(self), "having clause");
                hb.allow_aggs = true;
                hb.aggs = std::mem::take(&mut aggs);
                hb.aliases = aliases.clone();
                let r = hb.bind(e);
                aggs = std::mem::take(&mut hb.aggs);
                Some(r?)
            }
            None => None,
        };
        let mut order = vec![];
        for it in order_items {
            let key =
                self.order_or_group_expr(&it.expr, &scope, outer, &outputs, &aliases, "order clause", &mut aggs, true)?;
            order.push((key, ascending(it)));
        }
        let distinct = match &s.distinct {
            None | Some(ast::Distinct::All) => false,
            Some(ast::Distinct::Distinct) => true,
            Some(ast::Distinct::On(_)) => return Err(SqlError::not_supported("DISTINCT ON")),
        };
        let grouped = !group_exprs.is_empty() || !aggs.is_empty();

        // Push the conditions every result row meets down to the scans.
        let mut on_conj = vec![];
        inner_on_conditions(&from, 0, false, &mut on_conj);
        let mut conj: Vec<&Expr> = filter.as_ref().map(|f| f.conjuncts()).unwrap_or_default();
        conj.extend(on_conj.iter());
        push_down(&mut from, &conj);
        push_left_join_conditions(&mut from);
        let where_conj: Vec<Expr> =
            filter.as_ref().map(|f| f.conjuncts().into_iter().cloned().collect()).unwrap_or_default();
        choose_hash_keys(&mut from, 0, false, &where_conj, &col_wire);

        for (m, e) in metas.iter_mut().zip(&outputs) {
            if m.ty.is_none() {
                m.ty = match e {
                    Expr::Window(j) => crate::sql::window::result_type(&windows[*j], &col_wire, &aggs),
                    _ => e.wire_type(&col_wire, &aggs),
                };
            }
        }
        // Window values are read like aggregates, placed after the aggregates.
        let mut windows_elsewhere = false;
        for e in group_exprs.iter().chain(&having).chain(order.iter().filter_map(|(k, _)| match k {
            SortKey::Expr(e) => Some(e),
            SortKey::Out(_) => None,
        })) {
            e.walk(&mut |x| windows_elsewhere |= matches!(x, Expr::Window(_)));
        }
        if windows_elsewhere {
            return Err(SqlError::new(
                code::WINDOW_INVALID_USE,
                "You cannot use a window function in GROUP BY, HAVING or ORDER BY expressions (name it in the select list)",
            ));
        }
        let n_aggs = aggs.len();
        for e in &mut outputs {
            e.walk_mut(&mut |x| {
                if let Expr::Window(j) = x {
                    *x = Expr::Agg(n_aggs + *j);
                }
            });
        }
        let plan = SelectPlan {
            windows,
            width: scope.width(),
            from,
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
        };
        Ok(QueryPlan { columns: metas, body: Body::Select(Box::new(plan)) })
    }

    #[allow(clippy::too_many_arguments)]
    fn order_or_group_expr(
        &self,
        e: &ast::Expr,
        scope: &Scope,
        outer: &[&Scope],
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
        let mut b = Binder::scoped(self.env, scope, outer, Some(self), place);
        b.allow_aggs = allow_aggs;
        b.aggs = std::mem::take(aggs);
        b.aliases = aliases.to_vec();
        let r = b.bind(e);
        *aggs = std::mem::take(&mut b.aggs);
        let r = r?;
        // A column that an output is (`ORDER BY c` of `SELECT c`) is that output: a sort then
        // reads the output row instead of taking the column's value again for every row.
        match outputs.iter().position(|o| matches!(o, Expr::Col(_)) && *o == r) {
            Some(i) => Ok(SortKey::Out(i)),
            None => Ok(SortKey::Expr(r)),
        }
    }
}

/// A LEFT JOIN's ON conjuncts that read only its right side, when that side is one scan, are
/// pushed into that scan: right rows failing them can never match.
fn push_left_join_conditions(fr: &mut From) {
    let From::Join(j) = fr else { return };
    push_left_join_conditions(&mut j.left);
    push_left_join_conditions(&mut j.right);
    if j.kind != JoinKind::Left {
        return;
    }
    let Some(on) = j.on.clone() else { return };
    let (lw, rw) = (j.left_width, j.right_width);
    if let From::Scan(s) = &mut j.right {
        let Some(scan) = Arc::get_mut(s) else { return };
        for c in on.conjuncts() {
            let Some(cols) = local_columns(c) else { continue };
            if cols.iter().all(|&i| i >= lw && i < lw + rw) {
                let mut local = c.clone();
                local.walk_mut(&mut |x| {
                    if let Expr::Col(i) = x {
                        *i -= lw;
                    }
                });
                scan.pushed = Some(match scan.pushed.take() {
                    Some(p) => Expr::and(p, local),
                    None => local,
                });
            }
        }
    }
}

/// Columns a derived table or view shows: its query's output names (renamed by a column list),
/// qualified by its alias. Names must be unique.
fn derived_columns(
    columns: &[ColumnMeta],
    qualifier: &str,
    db: &str,
    table: &str,
    renames: &[String],
) -> SqlResult<Vec<ColumnMeta>> {
    if !renames.is_empty() && renames.len() != columns.len() {
        return Err(SqlError::new(
            code::VIEW_WRONG_LIST,
            "In definition of view, derived table or common table expression, SELECT list and column names list have different column counts",
        ));
    }
    let mut cols: Vec<ColumnMeta> = vec![];
    for (i, c) in columns.iter().enumerate() {
        let name = renames.get(i).cloned().unwrap_or_else(|| c.name.clone());
        if cols.iter().any(|o| o.name.eq_ignore_ascii_case(&name)) {
            return Err(SqlError::new(code::DUP_FIELDNAME, format!("Duplicate column name '{name}'")));
        }
        cols.push(ColumnMeta {
            name: name.clone(),
            org_name: name,
            table: qualifier.to_string(),
            org_table: table.to_string(),
            db: db.to_string(),
            ty: c.ty,
            not_null: false,
            primary_key: false,
            auto_increment: false,
        });
    }
    Ok(cols)
}

/// Whether two bound equality operands can be matched by hashing (both numeric or both text).
pub fn hashable_pair(a: Option<WireType>, b: Option<WireType>) -> bool {
    use WireType as W;
    let class = |t: Option<W>| match t {
        Some(W::Int { .. } | W::Float | W::Double | W::Decimal { .. }) => Some(0),
        Some(W::Str { .. } | W::Blob { binary: false, .. }) => Some(1),
        _ => None,
    };
    matches!((class(a), class(b)), (Some(x), Some(y)) if x == y)
}

/// `Col(l) = Col(r)` conjuncts of an ON condition with `l` on the left side and `r` on the right
/// (positions in the combined row).
pub fn equi_pairs(on: &Expr, left_width: usize) -> Vec<(usize, usize)> {
    let mut out = vec![];
    for c in on.conjuncts() {
        if let Expr::Cmp(Cmp::Eq, a, b) = c {
            if let (Expr::Col(x), Expr::Col(y)) = (a.as_ref(), b.as_ref()) {
                match (*x < left_width, *y < left_width) {
                    (true, false) => out.push((*x, *y)),
                    (false, true) => out.push((*y, *x)),
                    _ => {}
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parse::parse_one;
    use shoal_proto::{Column, ColumnType, Table, TableSpec};

    fn catalog() -> Catalog {
        let table = |id, name: &str, cols: &[(&str, ColumnType, &str)]| {
            let columns = cols
                .iter()
                .map(|(n, ty, sql)| {
                    let mut c = Column::new(n, *ty).nullable();
                    c.sql_type = sql.to_string();
                    c
                })
                .collect();
            let (spec, hidden_pk) =
                TableSpec { name: format!("d.{name}"), columns, primary_key: vec![0], partition_key: vec![] }
                    .normalize()
                    .unwrap();
            TableRef::new(
                "d",
                name,
                Table { id, spec, partition_count: 4, schema_version: 1, hidden_pk, ..Default::default() },
            )
        };
        let mut c = Catalog::new(Some("d".into()));
        let t1 = table(1, "t1", &[("a", ColumnType::Int, "int"), ("b", ColumnType::Text, "varchar(5)")]);
        let t2 = table(2, "t2", &[("x", ColumnType::Int, "int"), ("y", ColumnType::Int, "int")]);
        c.insert("d", "t1", Entry::Table(t1));
        c.insert("d", "t2", Entry::Table(t2));
        c
    }

    fn plan(sql: &str) -> SqlResult<QueryPlan> {
        let catalog = catalog();
        let env = Env::default();
        let ast::Statement::Query(q) = parse_one(sql)? else { panic!("not a query") };
        let p = Planner::new(&env, &catalog);
        p.query(&q, sql, &[], None)
    }

    fn select(p: &QueryPlan) -> &SelectPlan {
        match &p.body {
            Body::Select(s) => s,
            other => panic!("not a select: {other:?}"),
        }
    }

    #[test]
    fn key_reads_fetch_the_columns_the_plan_looks_at() {
        let needed = |sql: &str| {
            let p = plan(sql).unwrap();
            let sp = select(&p);
            let From::Scan(scan) = &sp.from else { panic!("not a scan: {sql}") };
            crate::sql::select::needed_columns(sp, &scan.table)
        };
        assert_eq!(needed("SELECT SUM(y) FROM t2 WHERE y > 0"), vec![1]);
        assert_eq!(needed("SELECT x FROM t2 WHERE x IN (1, 2)"), vec![0]);
        assert_eq!(needed("SELECT x FROM t2 WHERE x BETWEEN 1 AND 5 ORDER BY y"), vec![0, 1]);
        assert_eq!(needed("SELECT y, COUNT(*) FROM t2 GROUP BY y HAVING COUNT(*) > 1"), vec![1]);
        assert_eq!(needed("SELECT * FROM t2"), vec![0, 1]);
        // Nothing looked at: the primary key still finds the rows.
        assert_eq!(needed("SELECT COUNT(*) FROM t2"), vec![0]);
        // A correlated subquery sees the whole row.
        assert_eq!(needed("SELECT x FROM t2 WHERE EXISTS (SELECT 1 FROM t1 WHERE t1.a = t2.y)"), Vec::<u32>::new());
    }

    fn join(f: &From) -> &Join {
        match f {
            From::Join(j) => j,
            other => panic!("not a join: {other:?}"),
        }
    }

    fn pushed(f: &From) -> Option<&Expr> {
        match f {
            From::Scan(s) => s.pushed.as_ref(),
            other => panic!("not a scan: {other:?}"),
        }
    }

    #[test]
    fn conditions_go_to_their_tables_and_equalities_hash() {
        let p =
            plan("SELECT * FROM t1 JOIN t2 ON t1.a = t2.x WHERE t1.b = 'q' AND t2.y > 1 AND t1.a + t2.y > 0").unwrap();
        let j = join(&select(&p).from);
        // Positions are each table's own.
        assert_eq!(
            pushed(&j.left),
            Some(&Expr::Cmp(Cmp::Eq, Box::new(Expr::Col(1)), Box::new(Expr::Lit(Val::Str("q".into())))))
        );
        assert_eq!(
            pushed(&j.right),
            Some(&Expr::Cmp(Cmp::Gt, Box::new(Expr::Col(1)), Box::new(Expr::Lit(Val::Int(1)))))
        );
        assert_eq!(j.hash, vec![(0, 0)]);
        // Comma joins hash on WHERE equalities too.
        let p = plan("SELECT * FROM t1, t2 WHERE a = x").unwrap();
        assert_eq!(join(&select(&p).from).hash, vec![(0, 0)]);
        // A text column never hashes against a number (MySQL compares them as numbers).
        let p = plan("SELECT * FROM t1 JOIN t2 ON t1.b = t2.x").unwrap();
        assert!(join(&select(&p).from).hash.is_empty());
    }

    #[test]
    fn outer_joins_keep_the_null_filled_side_whole() {
        // WHERE on the right side of a LEFT JOIN must see its NULL-filled rows: not pushed.
        let p = plan("SELECT * FROM t1 LEFT JOIN t2 ON a = x AND y = 2 WHERE y IS NULL").unwrap();
        let j = join(&select(&p).from);
        assert_eq!(j.kind, JoinKind::Left);
        // The ON conjunct on the right side alone does go to its scan.
        assert_eq!(
            pushed(&j.right),
            Some(&Expr::Cmp(Cmp::Eq, Box::new(Expr::Col(1)), Box::new(Expr::Lit(Val::Int(2)))))
        );
        assert_eq!(pushed(&j.left), None);
        let p = plan("SELECT * FROM t1 RIGHT JOIN t2 ON a = x WHERE b = 'q'").unwrap();
        assert_eq!(pushed(&join(&select(&p).from).left), None);
    }

    #[test]
    fn names_resolve_or_fail_like_mysql() {
        assert_eq!(plan("SELECT a FROM t1, t1").unwrap_err().code, code::NONUNIQ_TABLE);
        assert_eq!(plan("SELECT x FROM t2 p, t2 q").unwrap_err().code, code::NON_UNIQ_ERROR);
        assert_eq!(plan("SELECT t1.a FROM t1 AS z").unwrap_err().code, code::BAD_FIELD);
        assert_eq!(plan("SELECT * FROM (SELECT 1)").unwrap_err().code, code::DERIVED_MUST_HAVE_ALIAS);
        assert_eq!(plan("SELECT * FROM (SELECT a, a FROM t1) AS d").unwrap_err().code, code::DUP_FIELDNAME);
        assert_eq!(
            plan("SELECT a FROM t1 UNION SELECT x, y FROM t2").unwrap_err().code,
            code::WRONG_NUMBER_OF_COLUMNS_IN_SELECT
        );
        // An unknown table is reported back for the caller to look up.
        let catalog = catalog();
        let env = Env::default();
        let ast::Statement::Query(q) = parse_one("SELECT * FROM t1 WHERE a IN (SELECT k FROM other)").unwrap() else {
            panic!()
        };
        let p = Planner::new(&env, &catalog);
        assert_eq!(p.query(&q, "", &[], None).unwrap_err().code, code::NO_SUCH_TABLE);
        assert_eq!(p.wanted.borrow().clone(), Some(("d".to_string(), "other".to_string())));
        // Correlation is detected through nesting.
        let p =
            plan("SELECT (SELECT COUNT(*) FROM t2 WHERE x IN (SELECT a FROM t1 z WHERE z.a = t1.a)) FROM t1").unwrap();
        let Expr::Subquery(s) = &select(&p).outputs[0] else { panic!("not a subquery") };
        assert!(s.plan.correlated);
        let p = plan("SELECT (SELECT COUNT(*) FROM t2) FROM t1").unwrap();
        let Expr::Subquery(s) = &select(&p).outputs[0] else { panic!("not a subquery") };
        assert!(!s.plan.correlated);
    }
}

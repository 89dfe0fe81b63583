//! Binding: sqlparser expressions → [`Expr`] against the relations of a FROM clause (a
//! [`Scope`]; none for statements without tables). Resolves column names to positions in the
//! combined row — or, in subqueries, to the rows of enclosing queries — session functions and
//! `@@variables` to constants, and collects aggregates. Subqueries are planned through the
//! [`Planner`], which knows the catalog.

use std::borrow::Cow;
use std::sync::Arc;

use shoal_proto::Table;
use sqlparser::ast::{
    self, BinaryOperator, DataType, DuplicateTreatment, FunctionArg, FunctionArgExpr, FunctionArguments, UnaryOperator,
    Value as AstValue,
};
use sqlparser::tokenizer::Location;

use crate::error::{code, SqlError, SqlResult};
use crate::session::ColumnMeta;
use crate::sql::expr::{AggKind, AggSpec, CastTo, Cmp, Expr, Func, Sub, SubKind};
use crate::sql::func::{IntervalUnit, LibFn};
use crate::sql::query::Planner;
use crate::sql::window::{Bound, Frame, WinFunc, WinSpec};
use crate::types::{SqlType, WireType};
use crate::val::{ArithOp, Dec, Val};

/// A table of the catalog as SQL sees it.
#[derive(Clone, Debug)]
pub struct TableRef {
    pub db: String,
    pub name: String,
    pub alias: Option<String>,
    /// Shared with the SQL node's table cache (see `session::TableCache`): cloning a
    /// TableRef copies no catalog entry and parses no column type.
    pub table: Arc<Table>,
    pub types: Arc<[SqlType]>,
    /// The visible columns' result metadata under the table's own name, as a scope without an
    /// alias holds them: made with the reference and shared by every statement that uses the
    /// table (building them, five strings a column, took a fifth of a SQL node's allocations
    /// under sysbench `oltp_read_write`).
    pub metas: Arc<[ColumnMeta]>,
}

impl TableRef {
    pub fn new(db: &str, name: &str, table: Table) -> TableRef {
        let types = table.columns().iter().map(SqlType::of_column).collect();
        let mut t = TableRef {
            db: db.to_string(),
            name: name.to_string(),
            alias: None,
            table: Arc::new(table),
            types,
            metas: Arc::new([]),
        };
        t.metas = (0..t.visible()).map(|i| t.column_meta(i, t.col_name(i))).collect();
        t
    }

    /// Columns a user sees (the hidden key excluded).
    pub fn visible(&self) -> usize {
        self.table.visible_columns()
    }

    pub fn column(&self, name: &str) -> Option<usize> {
        self.table.column_index(name).filter(|&i| i < self.visible())
    }

    pub fn col_name(&self, i: usize) -> &str {
        &self.table.columns()[i].name
    }

    /// Result metadata of column `i` under the name `name`.
    pub fn column_meta(&self, i: usize, name: &str) -> ColumnMeta {
        let c = &self.table.columns()[i];
        ColumnMeta {
            name: name.to_string(),
            org_name: c.name.clone(),
            table: self.alias.clone().unwrap_or_else(|| self.name.clone()),
            org_table: self.name.clone(),
            db: self.db.clone(),
            ty: Some(self.types[i].wire()),
            not_null: !c.nullable,
            primary_key: !self.table.hidden_pk && self.table.spec.primary_key.contains(&(i as u32)),
            auto_increment: c.auto_increment,
        }
    }
}

/// One relation of a FROM clause as names see it.
#[derive(Clone, Debug)]
pub struct ScopeRel {
    /// What qualifies its columns: the alias, else the table name.
    pub qualifier: String,
    /// `db.table.column` names base tables and views by database and name (not by alias).
    pub db: Option<String>,
    pub table: String,
    /// Position of its first column in the combined row.
    pub start: usize,
    pub cols: Arc<[ColumnMeta]>,
}

/// The relations of one query's FROM clause, in row order.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub rels: Vec<ScopeRel>,
    /// Columns merged into another by `JOIN … USING` / `NATURAL JOIN`: unqualified names and
    /// `*` do not see them (qualified names do).
    pub merged: Vec<usize>,
    /// The merged-into columns, which `*` lists first (MySQL's order for USING / NATURAL).
    pub coalesced: Vec<usize>,
}

impl Scope {
    pub fn of_table(t: &TableRef) -> Scope {
        let mut s = Scope::default();
        s.push_table(t);
        s
    }

    /// Width of the combined row.
    pub fn width(&self) -> usize {
        self.rels.last().map_or(0, |r| r.start + r.cols.len())
    }

    pub fn push_table(&mut self, t: &TableRef) {
        let cols = match t.alias {
            None => t.metas.clone(),
            Some(_) => (0..t.visible()).map(|i| t.column_meta(i, t.col_name(i))).collect(),
        };
        self.rels.push(ScopeRel {
            qualifier: t.alias.clone().unwrap_or_else(|| t.name.clone()),
            db: Some(t.db.clone()),
            table: t.name.clone(),
            start: self.width(),
            cols,
        });
    }

    pub fn push(&mut self, qualifier: &str, db: Option<String>, table: &str, cols: Vec<ColumnMeta>) {
        self.rels.push(ScopeRel {
            qualifier: qualifier.to_string(),
            db,
            table: table.to_string(),
            start: self.width(),
            cols: cols.into(),
        });
    }

    /// What `SELECT *` lists: the columns joins coalesced, then every other visible column.
    pub fn star(&self) -> Vec<usize> {
        let mut out = self.coalesced.clone();
        for i in 0..self.width() {
            if !self.merged.contains(&i) && !self.coalesced.contains(&i) {
                out.push(i);
            }
        }
        out
    }

    /// Positions of the columns named `name` in relations `rels` (unqualified lookup).
    pub fn positions_named(&self, rels: std::ops::Range<usize>, name: &str) -> Vec<usize> {
        let mut out = vec![];
        for rel in &self.rels[rels] {
            for (j, c) in rel.cols.iter().enumerate() {
                if c.name.eq_ignore_ascii_case(name) && !self.merged.contains(&(rel.start + j)) {
                    out.push(rel.start + j);
                }
            }
        }
        out
    }

    pub fn meta(&self, i: usize) -> Option<&ColumnMeta> {
        self.rels.iter().find(|r| i >= r.start && i < r.start + r.cols.len()).map(|r| &r.cols[i - r.start])
    }

    pub fn wire_types(&self) -> Vec<Option<WireType>> {
        self.rels.iter().flat_map(|r| r.cols.iter().map(|c| c.ty)).collect()
    }

    /// The position of a column, None when no relation has it; an error when two do.
    fn find(&self, qualifier: Option<&[ast::Ident]>, name: &str, full: &str, place: &str) -> SqlResult<Option<usize>> {
        let mut hit = None;
        for rel in &self.rels {
            let named = match qualifier {
                None => true,
                Some([t]) => rel.qualifier.eq_ignore_ascii_case(&t.value),
                Some([db, t]) => {
                    rel.db.as_deref().is_some_and(|d| d.eq_ignore_ascii_case(&db.value))
                        && rel.table.eq_ignore_ascii_case(&t.value)
                        && rel.qualifier.eq_ignore_ascii_case(&rel.table)
                }
                Some(_) => false,
            };
            if !named {
                continue;
            }
            if let Some(j) = rel.cols.iter().position(|c| c.name.eq_ignore_ascii_case(name)) {
                if qualifier.is_none() && self.merged.contains(&(rel.start + j)) {
                    continue;
                }
                if hit.is_some() {
                    return Err(SqlError::new(
                        code::NON_UNIQ_ERROR,
                        format!("Column '{full}' in {place} is ambiguous"),
                    ));
                }
                hit = Some(rel.start + j);
            }
        }
        Ok(hit)
    }
}

/// What session functions and system variables read.
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub db: Option<String>,
    /// The user name the client logged in with and its address: USER().
    pub user: String,
    pub host: String,
    /// The account the login matched, `name@host pattern`: CURRENT_USER().
    pub current_user: String,
    pub connection_id: u32,
    pub last_insert_id: u64,
    pub row_count: i64,
    pub found_rows: u64,
    pub autocommit: bool,
    /// Most rounds a recursive CTE may run; None: MySQL's default.
    pub cte_max_recursion_depth: Option<u64>,
    pub version: String,
    /// Seconds since the Unix epoch, fixed for one statement (NOW()).
    pub now_secs: u64,
    /// The values of a prepared statement's placeholders.
    pub params: Params,
}

/// The values of a prepared statement's placeholders for one execution, each with where its
/// `?` stands in the statement's text (the placeholder's span start): binding a placeholder
/// takes the value at its place.
pub type Params = std::sync::Arc<Vec<(Location, Val)>>;

impl Env {
    pub fn cte_max_recursion_depth(&self) -> u64 {
        self.cte_max_recursion_depth.unwrap_or(crate::sql::select::CTE_MAX_RECURSION_DEPTH)
    }

    fn param(&self, at: Location) -> SqlResult<Val> {
        self.params
            .iter()
            .find(|(l, _)| *l == at)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| SqlError::parse("placeholder '?' outside a prepared statement"))
    }
}

pub struct Binder<'a> {
    pub env: &'a Env,
    scope: Cow<'a, Scope>,
    /// Scopes of the enclosing queries, outermost first.
    outer: &'a [&'a Scope],
    /// Plans subqueries; None where they cannot appear (DEFAULT values, LIMIT).
    planner: Option<&'a Planner<'a>>,
    pub aggs: Vec<AggSpec>,
    pub allow_aggs: bool,
    /// For error messages: 'field list', 'where clause', 'order clause', ...
    pub place: &'static str,
    /// Select-list aliases that HAVING and ORDER BY may use where no column has the name.
    pub aliases: Vec<(String, Expr)>,
    /// `INSERT … ON DUPLICATE KEY UPDATE`: `VALUES(col)` means column `col` of the row the
    /// INSERT proposed, found this far after the table's own columns.
    pub values_offset: Option<usize>,
    /// Window functions are allowed here (the SELECT list), and those bound so far.
    pub allow_windows: bool,
    pub windows: Vec<WinSpec>,
    /// The SELECT's `WINDOW` clause, resolved ([`crate::sql::window::named_windows`]).
    pub named_windows: Vec<(String, ast::WindowSpec)>,
}

fn ident_name(parts: &[ast::Ident]) -> String {
    parts.iter().map(|i| i.value.as_str()).collect::<Vec<_>>().join(".")
}

/// Parses a numeric literal as MySQL types it: integer, exact decimal, or double.
pub fn number_literal(text: &str) -> SqlResult<Val> {
    if text.contains(['e', 'E']) {
        return text.parse::<f64>().map(Val::Float).map_err(|_| SqlError::parse(format!("bad number {text}")));
    }
    if !text.contains('.') {
        if let Ok(i) = text.parse::<i64>() {
            return Ok(Val::Int(i));
        }
        if let Ok(u) = text.parse::<u64>() {
            return Ok(Val::UInt(u));
        }
    }
    Dec::parse(text).map(Val::Dec).ok_or_else(|| SqlError::parse(format!("bad number {text}")))
}

/// Converts an AST literal.
pub fn literal(v: &AstValue) -> SqlResult<Val> {
    Ok(match v {
        AstValue::Number(n, _) => number_literal(&n.to_string())?,
        AstValue::SingleQuotedString(s)
        | AstValue::DoubleQuotedString(s)
        | AstValue::EscapedStringLiteral(s)
        | AstValue::NationalStringLiteral(s)
        | AstValue::TripleSingleQuotedString(s)
        | AstValue::TripleDoubleQuotedString(s) => Val::Str(s.clone()),
        AstValue::HexStringLiteral(h) => {
            let h = if h.len() % 2 == 1 { format!("0{h}") } else { h.clone() };
            let bytes: Option<Vec<u8>> =
                (0..h.len()).step_by(2).map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok()).collect();
            Val::Bytes(bytes.ok_or_else(|| SqlError::parse(format!("bad hex literal X'{h}'")))?)
        }
        AstValue::SingleQuotedByteStringLiteral(s) | AstValue::DoubleQuotedByteStringLiteral(s) => {
            Val::Bytes(s.clone().into_bytes())
        }
        AstValue::Boolean(b) => Val::bool(*b),
        AstValue::Null => Val::Null,
        AstValue::Placeholder(p) => {
            return Err(SqlError::parse(format!("placeholder {p} outside a prepared statement")));
        }
        other => return Err(SqlError::not_supported(format!("literal {other}"))),
    })
}

fn func_arity(name: &str, n: usize, ok: bool) -> SqlResult<()> {
    if ok {
        Ok(())
    } else {
        Err(SqlError::new(
            code::WRONG_PARAMCOUNT_TO_NATIVE_FCT,
            format!("Incorrect parameter count in the call to native function '{name}' ({n} given)"),
        ))
    }
}

impl<'a> Binder<'a> {
    /// A binder over one table (or none), without subqueries.
    pub fn new(env: &'a Env, table: Option<&TableRef>, place: &'static str) -> Binder<'a> {
        let scope = table.map(Scope::of_table).unwrap_or_default();
        Binder {
            env,
            scope: Cow::Owned(scope),
            outer: &[],
            planner: None,
            aggs: vec![],
            allow_aggs: false,
            place,
            aliases: vec![],
            values_offset: None,
            allow_windows: false,
            windows: vec![],
            named_windows: vec![],
        }
    }

    /// A binder over a FROM clause's scope inside the given enclosing scopes.
    pub fn scoped(
        env: &'a Env,
        scope: &'a Scope,
        outer: &'a [&'a Scope],
        planner: Option<&'a Planner<'a>>,
        place: &'static str,
    ) -> Binder<'a> {
        Binder {
            env,
            scope: Cow::Borrowed(scope),
            outer,
            planner,
            aggs: vec![],
            allow_aggs: false,
            place,
            aliases: vec![],
            values_offset: None,
            allow_windows: false,
            windows: vec![],
            named_windows: vec![],
        }
    }

    /// Resolves a column name: this query's FROM clause first, then select-list aliases (HAVING,
    /// ORDER BY), then the enclosing queries from the innermost out.
    fn column(&self, qualifier: Option<&[ast::Ident]>, name: &ast::Ident) -> SqlResult<Expr> {
        let full = match qualifier {
            Some(q) => format!("{}.{}", ident_name(q), name.value),
            None => name.value.clone(),
        };
        if let Some(i) = self.scope.find(qualifier, &name.value, &full, self.place)? {
            return Ok(Expr::Col(i));
        }
        if qualifier.is_none() {
            if let Some((_, e)) = self.aliases.iter().find(|(a, _)| a.eq_ignore_ascii_case(&name.value)) {
                return Ok(e.clone());
            }
        }
        for (n, s) in self.outer.iter().rev().enumerate() {
            if let Some(i) = s.find(qualifier, &name.value, &full, self.place)? {
                return Ok(Expr::Outer(n + 1, i));
            }
        }
        Err(SqlError::bad_field(&full, self.place))
    }

    /// Plans a subquery in the scope of this query.
    fn subquery(&mut self, q: &ast::Query, kind: SubKind) -> SqlResult<Expr> {
        let Some(planner) = self.planner else { return Err(SqlError::not_supported("subqueries here")) };
        let mut stack: Vec<&Scope> = self.outer.to_vec();
        stack.push(&self.scope);
        let plan = planner.subquery(q, &stack)?;
        if !matches!(kind, SubKind::Exists) && plan.plan.columns.len() != 1 {
            return Err(SqlError::new(code::OPERAND_COLUMNS, "Operand should contain 1 column(s)"));
        }
        Ok(Expr::Subquery(Sub { plan, kind }))
    }

    pub fn bind(&mut self, e: &ast::Expr) -> SqlResult<Expr> {
        use ast::Expr as A;
        let bx = |e: Expr| Box::new(e);
        Ok(match e {
            A::Identifier(id) => {
                if let Some(var) = id.value.strip_prefix("@@") {
                    return Ok(Expr::Lit(self.sysvar(var)?));
                }
                if id.quote_style.is_none() {
                    match id.value.to_ascii_lowercase().as_str() {
                        "current_timestamp" | "localtimestamp" | "localtime" => {
                            return Ok(Expr::Lit(Val::Str(now_string(self.env.now_secs, true))))
                        }
                        "current_date" => return Ok(Expr::Lit(Val::Str(now_string(self.env.now_secs, false)))),
                        "current_user" => return Ok(Expr::Lit(Val::Str(self.env.current_user.clone()))),
                        _ => {}
                    }
                }
                self.column(None, id)?
            }
            A::CompoundIdentifier(parts) => {
                if let Some(first) = parts.first() {
                    if first.value.starts_with("@@") {
                        let name = parts.last().map(|p| p.value.clone()).unwrap_or_default();
                        let name = name.strip_prefix("@@").unwrap_or(&name).to_string();
                        return Ok(Expr::Lit(self.sysvar(&name)?));
                    }
                }
                let (last, quals) = parts.split_last().ok_or_else(|| SqlError::parse("empty identifier"))?;
                self.column(Some(quals), last)?
            }
            A::Value(v) if matches!(v.value, AstValue::Placeholder(_)) => Expr::Lit(self.env.param(v.span.start)?),
            A::Value(v) => Expr::Lit(literal(&v.value)?),
            A::TypedString(ts) => {
                let text = match &ts.value.value {
                    AstValue::SingleQuotedString(s) | AstValue::DoubleQuotedString(s) => s.clone(),
                    other => other.to_string(),
                };
                match ts.data_type {
                    DataType::Date => crate::sql::expr::cast(Val::Str(text), CastTo::Date).map(Expr::Lit)?,
                    DataType::Datetime(_) | DataType::Timestamp(..) => {
                        crate::sql::expr::cast(Val::Str(text), CastTo::Datetime).map(Expr::Lit)?
                    }
                    _ => Expr::Lit(Val::Str(text)),
                }
            }
            A::Nested(inner) => self.bind(inner)?,
            A::UnaryOp { op, expr } => {
                let inner = self.bind(expr)?;
                match op {
                    UnaryOperator::Minus => match inner {
                        Expr::Lit(Val::UInt(u)) if u == 1u64 << 63 => Expr::Lit(Val::Int(i64::MIN)),
                        // A negative constant stays a constant, so plans can use it (`k < -5`
                        // as an index bound or pushed filter); errors are left to run time.
                        lit @ Expr::Lit(_) => {
                            let neg = Expr::Neg(bx(lit));
                            match neg.eval(&[], &[]) {
                                Ok(v) => Expr::Lit(v),
                                Err(_) => neg,
                            }
                        }
                        other => Expr::Neg(bx(other)),
                    },
                    UnaryOperator::Plus => inner,
                    UnaryOperator::Not | UnaryOperator::BangNot => Expr::Not(bx(inner)),
                    other => return Err(SqlError::not_supported(format!("operator {other}"))),
                }
            }
            A::BinaryOp { left, op: op @ (BinaryOperator::Plus | BinaryOperator::Minus), right }
                if matches!(right.as_ref(), A::Interval(_)) || matches!(left.as_ref(), A::Interval(_)) =>
            {
                // `date ± INTERVAL n unit` (and `INTERVAL n unit + date`).
                let (date, iv) = match (left.as_ref(), right.as_ref()) {
                    (d, A::Interval(iv)) => (d, iv),
                    (A::Interval(iv), d) if *op == BinaryOperator::Plus => (d, iv),
                    _ => return Err(SqlError::parse("INTERVAL can only be added to a date")),
                };
                let (unit, amount) = self.interval(iv)?;
                let amount = if *op == BinaryOperator::Minus { Expr::Neg(bx(amount)) } else { amount };
                Expr::Func(Func::Lib(LibFn::DateAdd(unit)), vec![self.bind(date)?, amount])
            }
            A::BinaryOp { left, op, right } => {
                let (l, r) = (self.bind(left)?, self.bind(right)?);
                let arith = |o| Expr::Arith(o, bx(l.clone()), bx(r.clone()));
                let cmp = |o| Expr::Cmp(o, bx(l.clone()), bx(r.clone()));
                match op {
                    BinaryOperator::Plus => arith(ArithOp::Add),
                    BinaryOperator::Minus => arith(ArithOp::Sub),
                    BinaryOperator::Multiply => arith(ArithOp::Mul),
                    BinaryOperator::Divide => arith(ArithOp::Div),
                    BinaryOperator::Modulo => arith(ArithOp::Mod),
                    BinaryOperator::MyIntegerDivide => arith(ArithOp::IntDiv),
                    BinaryOperator::Eq => cmp(Cmp::Eq),
                    BinaryOperator::NotEq => cmp(Cmp::Ne),
                    BinaryOperator::Lt => cmp(Cmp::Lt),
                    BinaryOperator::LtEq => cmp(Cmp::Le),
                    BinaryOperator::Gt => cmp(Cmp::Gt),
                    BinaryOperator::GtEq => cmp(Cmp::Ge),
                    BinaryOperator::Spaceship => cmp(Cmp::NullSafeEq),
                    BinaryOperator::And => Expr::And(bx(l), bx(r)),
                    BinaryOperator::Or | BinaryOperator::StringConcat => Expr::Or(bx(l), bx(r)),
                    BinaryOperator::Xor => Expr::Xor(bx(l), bx(r)),
                    other => return Err(SqlError::not_supported(format!("operator {other}"))),
                }
            }
            A::IsNull(x) => Expr::IsNull(bx(self.bind(x)?), false),
            A::IsNotNull(x) => Expr::IsNull(bx(self.bind(x)?), true),
            A::IsTrue(x) => Expr::IsBool(bx(self.bind(x)?), true, false),
            A::IsNotTrue(x) => Expr::IsBool(bx(self.bind(x)?), true, true),
            A::IsFalse(x) => Expr::IsBool(bx(self.bind(x)?), false, false),
            A::IsNotFalse(x) => Expr::IsBool(bx(self.bind(x)?), false, true),
            A::IsUnknown(x) => Expr::IsNull(bx(self.bind(x)?), false),
            A::IsNotUnknown(x) => Expr::IsNull(bx(self.bind(x)?), true),
            A::IsDistinctFrom(a, c) => Expr::Not(bx(Expr::Cmp(Cmp::NullSafeEq, bx(self.bind(a)?), bx(self.bind(c)?)))),
            A::IsNotDistinctFrom(a, c) => Expr::Cmp(Cmp::NullSafeEq, bx(self.bind(a)?), bx(self.bind(c)?)),
            A::In { expr, target, negated, .. } => match target {
                ast::InTarget::List(list) => {
                    let x = self.bind(expr)?;
                    let l = list.iter().map(|e| self.bind(e)).collect::<SqlResult<Vec<_>>>()?;
                    Expr::InList(bx(x), l, *negated)
                }
                ast::InTarget::Subquery(q) => {
                    let x = self.bind(expr)?;
                    let e = self.subquery(q, SubKind::In(bx(x)))?;
                    if *negated {
                        Expr::Not(bx(e))
                    } else {
                        e
                    }
                }
                _ => return Err(SqlError::not_supported("this IN form")),
            },
            A::Between { expr, negated, low, high } => {
                Expr::Between(bx(self.bind(expr)?), bx(self.bind(low)?), bx(self.bind(high)?), *negated)
            }
            A::Like { negated, expr, pattern, escape_char, any: false } => {
                let esc = self.escape(escape_char.as_deref())?;
                Expr::Like(bx(self.bind(expr)?), bx(self.bind(pattern)?), esc, *negated, false)
            }
            A::ILike { negated, expr, pattern, escape_char, any: false } => {
                let esc = self.escape(escape_char.as_deref())?;
                Expr::Like(bx(self.bind(expr)?), bx(self.bind(pattern)?), esc, *negated, true)
            }
            A::Case { operand, conditions, else_result, .. } => {
                let operand = match operand {
                    Some(o) => Some(bx(self.bind(o)?)),
                    None => None,
                };
                let whens = conditions
                    .iter()
                    .map(|w| Ok((self.bind(&w.condition)?, self.bind(&w.result)?)))
                    .collect::<SqlResult<Vec<_>>>()?;
                let otherwise = match else_result {
                    Some(e) => Some(bx(self.bind(e)?)),
                    None => None,
                };
                Expr::Case { operand, whens, otherwise }
            }
            A::Cast { expr, data_type, .. } | A::Convert { expr, data_type: Some(data_type), .. } => {
                let to = cast_target(data_type)?;
                Expr::Cast(bx(self.bind(expr)?), to)
            }
            A::Substring { expr, substring_from, substring_for, .. } => {
                let mut args = vec![self.bind(expr)?];
                args.push(match substring_from {
                    Some(f) => self.bind(f)?,
                    None => Expr::Lit(Val::Int(1)),
                });
                if let Some(f) = substring_for {
                    args.push(self.bind(f)?);
                }
                Expr::Func(Func::Substring, args)
            }
            A::Trim { expr, trim_where: None, trim_what: None, .. } => Expr::Func(Func::Trim, vec![self.bind(expr)?]),
            A::Ceil { expr, field: ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime) } => {
                Expr::Func(Func::Ceil, vec![self.bind(expr)?])
            }
            A::Floor { expr, field: ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime) } => {
                Expr::Func(Func::Floor, vec![self.bind(expr)?])
            }
            A::Function(f) => self.function(f)?,
            A::Subquery(q) => self.subquery(q, SubKind::Scalar)?,
            A::Exists { subquery, negated } => {
                let e = self.subquery(subquery, SubKind::Exists)?;
                if *negated {
                    Expr::Not(bx(e))
                } else {
                    e
                }
            }
            A::AnyOp { left, compare_op, right, .. } | A::AllOp { left, compare_op, right } => {
                let all = matches!(e, A::AllOp { .. });
                let op = match compare_op {
                    BinaryOperator::Eq => Cmp::Eq,
                    BinaryOperator::NotEq => Cmp::Ne,
                    BinaryOperator::Lt => Cmp::Lt,
                    BinaryOperator::LtEq => Cmp::Le,
                    BinaryOperator::Gt => Cmp::Gt,
                    BinaryOperator::GtEq => Cmp::Ge,
                    other => return Err(SqlError::not_supported(format!("{other} ANY/ALL"))),
                };
                let mut q = right.as_ref();
                while let A::Nested(inner) = q {
                    q = inner;
                }
                let A::Subquery(q) = q else {
                    return Err(SqlError::parse("ANY and ALL take a subquery"));
                };
                let x = self.bind(left)?;
                self.subquery(q, SubKind::Quantified(bx(x), op, all))?
            }
            A::Tuple(_) => {
                return Err(SqlError::new(code::OPERAND_COLUMNS, "Operand should contain 1 column(s)"));
            }
            other => return Err(SqlError::not_supported(format!("expression {other}"))),
        })
    }

    fn escape(&mut self, e: Option<&ast::Expr>) -> SqlResult<char> {
        let Some(e) = e else { return Ok('\\') };
        match self.bind(e)? {
            Expr::Lit(v) => {
                let s = v.to_string_lossy().unwrap_or_default();
                let mut chars = s.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) => Ok(c),
                    (None, _) => Ok('\\'),
                    _ => Err(SqlError::new(code::WRONG_ARGUMENTS, "Incorrect arguments to ESCAPE")),
                }
            }
            _ => Err(SqlError::new(code::WRONG_ARGUMENTS, "Incorrect arguments to ESCAPE")),
        }
    }

    fn function(&mut self, f: &ast::Function) -> SqlResult<Expr> {
        let name = f.name.0.last().map(|p| p.to_string()).unwrap_or_default().to_ascii_lowercase();
        let name = name.trim_matches('`').to_string();
        if let Some(over) = &f.over {
            return self.window(&name, f, over);
        }
        let (arg_list, distinct, clauses) = match &f.args {
            FunctionArguments::None => (vec![], false, &[][..]),
            FunctionArguments::Subquery(_) => return Err(SqlError::not_supported("subqueries as function arguments")),
            FunctionArguments::List(l) => (
                l.args.iter().collect::<Vec<_>>(),
                matches!(l.duplicate_treatment, Some(DuplicateTreatment::Distinct)),
                l.clauses.as_slice(),
            ),
        };
        if name != "group_concat" && !clauses.is_empty() {
            return Err(SqlError::not_supported(format!("{name}(... {})", clauses[0])));
        }
        let n = arg_list.len();
        let agg = match name.as_str() {
            "count" => Some(AggKind::Count),
            "sum" => Some(AggKind::Sum),
            "min" => Some(AggKind::Min),
            "max" => Some(AggKind::Max),
            "avg" => Some(AggKind::Avg),
            "group_concat" => Some(AggKind::GroupConcat),
            _ => None,
        };
        if let Some(mut kind) = agg {
            if !self.allow_aggs {
                return Err(SqlError::new(code::INVALID_GROUP_FUNC_USE, "Invalid use of group function"));
            }
            func_arity(&name, n, n == 1 || (kind == AggKind::GroupConcat && n >= 1))?;
            // Aggregates do not nest.
            self.allow_aggs = false;
            let r = self.agg_args(&name, kind, &arg_list, distinct, clauses);
            self.allow_aggs = true;
            let (arg, order, separator) = r?;
            if arg.is_none() {
                kind = AggKind::CountStar;
            }
            let spec = AggSpec { kind, arg, distinct, order, separator };
            let i = match self.aggs.iter().position(|a| *a == spec) {
                Some(i) => i,
                None => {
                    self.aggs.push(spec);
                    self.aggs.len() - 1
                }
            };
            return Ok(Expr::Agg(i));
        }
        let takes_interval = matches!(name.as_str(), "date_add" | "adddate" | "date_sub" | "subdate");
        let mut args = vec![];
        for a in &arg_list {
            match a {
                // Bound with its unit by the DATE_ADD arm below.
                FunctionArg::Unnamed(FunctionArgExpr::Expr(ast::Expr::Interval(_))) if takes_interval => {
                    args.push(Expr::Lit(Val::Null))
                }
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => args.push(self.bind(e)?),
                _ => return Err(SqlError::parse(format!("bad argument to {name}"))),
            }
        }
        let env = self.env;
        let lit = |v: Val| Ok(Expr::Lit(v));
        let fixed = |func: Func, ok: bool, args: Vec<Expr>| -> SqlResult<Expr> {
            func_arity(&name, n, ok)?;
            Ok(Expr::Func(func, args))
        };
        match name.as_str() {
            "values" if self.values_offset.is_some() => {
                func_arity(&name, n, n == 1)?;
                match args.first() {
                    Some(Expr::Col(i)) => Ok(Expr::Col(i + self.values_offset.unwrap_or(0))),
                    _ => Err(SqlError::parse("VALUES() takes a column name")),
                }
            }
            "database" | "schema" => {
                func_arity(&name, n, n == 0)?;
                lit(env.db.clone().map_or(Val::Null, Val::Str))
            }
            "version" => lit(Val::Str(env.version.clone())),
            "current_user" => lit(Val::Str(env.current_user.clone())),
            "user" | "session_user" | "system_user" => lit(Val::Str(format!("{}@{}", env.user, env.host))),
            "connection_id" => lit(Val::UInt(u64::from(env.connection_id))),
            "last_insert_id" if n == 0 => lit(Val::UInt(env.last_insert_id)),
            "row_count" => lit(Val::Int(env.row_count)),
            "found_rows" => lit(Val::UInt(env.found_rows)),
            "now" | "current_timestamp" | "sysdate" | "localtime" | "localtimestamp" | "utc_timestamp" => {
                lit(Val::Str(now_string(env.now_secs, true)))
            }
            "curdate" | "current_date" | "utc_date" => lit(Val::Str(now_string(env.now_secs, false))),
            "unix_timestamp" if n == 0 => lit(Val::UInt(env.now_secs)),
            "coalesce" => fixed(Func::Coalesce, n >= 1, args),
            "ifnull" => fixed(Func::IfNull, n == 2, args),
            "nullif" => fixed(Func::NullIf, n == 2, args),
            "if" => fixed(Func::If, n == 3, args),
            "concat" => fixed(Func::Concat, n >= 1, args),
            "concat_ws" => fixed(Func::ConcatWs, n >= 2, args),
            "length" | "octet_length" => fixed(Func::Length, n == 1, args),
            "char_length" | "character_length" => fixed(Func::CharLength, n == 1, args),
            "upper" | "ucase" => fixed(Func::Upper, n == 1, args),
            "lower" | "lcase" => fixed(Func::Lower, n == 1, args),
            "abs" => fixed(Func::Abs, n == 1, args),
            "sign" => fixed(Func::Sign, n == 1, args),
            "round" => fixed(Func::Round, n == 1 || n == 2, args),
            "floor" => fixed(Func::Floor, n == 1, args),
            "ceil" | "ceiling" => fixed(Func::Ceil, n == 1, args),
            "mod" => fixed(Func::Mod, n == 2, args),
            "substring" | "substr" | "mid" => fixed(Func::Substring, n == 2 || n == 3, args),
            "trim" => fixed(Func::Trim, n == 1, args),
            "ltrim" => fixed(Func::LTrim, n == 1, args),
            "rtrim" => fixed(Func::RTrim, n == 1, args),
            "left" => fixed(Func::Left, n == 2, args),
            "right" => fixed(Func::Right, n == 2, args),
            "replace" => fixed(Func::Replace, n == 3, args),
            "greatest" => fixed(Func::Greatest, n >= 2, args),
            "least" => fixed(Func::Least, n >= 2, args),
            "hex" => fixed(Func::Hex, n == 1, args),
            "date_add" | "adddate" | "date_sub" | "subdate" => {
                func_arity(&name, n, n == 2)?;
                let negate = name == "date_sub" || name == "subdate";
                let (unit, amount) = match arg_list[1] {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(ast::Expr::Interval(iv))) => self.interval(iv)?,
                    // ADDDATE(d, n) / SUBDATE(d, n): days.
                    _ => (IntervalUnit::Day, args[1].clone()),
                };
                let amount = if negate { Expr::Neg(Box::new(amount)) } else { amount };
                Ok(Expr::Func(Func::Lib(LibFn::DateAdd(unit)), vec![args[0].clone(), amount]))
            }
            _ => match crate::sql::func::lookup(&name, n) {
                Some((lf, ok)) => fixed(Func::Lib(lf), ok, args),
                None => Err(SqlError::new(code::SP_DOES_NOT_EXIST, format!("FUNCTION {name} does not exist"))),
            },
        }
    }

    /// An aggregate's argument (None for COUNT(*)), and GROUP_CONCAT's ORDER BY and SEPARATOR.
    #[allow(clippy::type_complexity)]
    fn agg_args(
        &mut self,
        name: &str,
        kind: AggKind,
        args: &[&FunctionArg],
        distinct: bool,
        clauses: &[ast::FunctionArgumentClause],
    ) -> SqlResult<(Option<Expr>, Vec<(Expr, bool)>, String)> {
        let mut exprs = vec![];
        for a in args {
            match a {
                FunctionArg::Unnamed(FunctionArgExpr::Wildcard) if kind == AggKind::Count && !distinct => {
                    return Ok((None, vec![], String::new()));
                }
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => exprs.push(self.bind(e)?),
                _ => return Err(SqlError::parse(format!("bad argument to {name}"))),
            }
        }
        // GROUP_CONCAT(a, b) concatenates its arguments per row.
        let arg = if exprs.len() == 1 { exprs.remove(0) } else { Expr::Func(Func::Concat, exprs) };
        let mut order = vec![];
        let mut separator = ",".to_string();
        for c in clauses {
            match c {
                ast::FunctionArgumentClause::OrderBy(items) => {
                    for it in items {
                        let asc = !matches!(it.options.sort, Some(ast::OrderBySort::Desc));
                        order.push((self.bind(&it.expr)?, asc));
                    }
                }
                ast::FunctionArgumentClause::Separator(v) => {
                    separator = literal(&v.value)?.to_string_lossy().unwrap_or_default();
                }
                other => return Err(SqlError::not_supported(format!("{name}(... {other})"))),
            }
        }
        Ok((Some(arg), order, separator))
    }

    /// A window function call `name(...) OVER (...)`.
    fn window(&mut self, name: &str, f: &ast::Function, over: &ast::WindowType) -> SqlResult<Expr> {
        if !self.allow_windows {
            return Err(SqlError::new(
                code::WINDOW_INVALID_USE,
                format!("You cannot use the window function '{name}' in this context"),
            ));
        }
        let spec = &crate::sql::window::resolve(over, &self.named_windows)?;
        let args: Vec<&FunctionArg> = match &f.args {
            FunctionArguments::None => vec![],
            FunctionArguments::List(l) => {
                if l.duplicate_treatment.is_some() || !l.clauses.is_empty() {
                    return Err(SqlError::not_supported(format!("{name}(DISTINCT / clauses ...) OVER")));
                }
                l.args.iter().collect()
            }
            FunctionArguments::Subquery(_) => return Err(SqlError::parse(format!("bad argument to {name}"))),
        };
        let n = args.len();
        let func = match name {
            "row_number" => (WinFunc::RowNumber, n == 0),
            "rank" => (WinFunc::Rank, n == 0),
            "dense_rank" => (WinFunc::DenseRank, n == 0),
            "percent_rank" => (WinFunc::PercentRank, n == 0),
            "cume_dist" => (WinFunc::CumeDist, n == 0),
            "ntile" => (WinFunc::Ntile, n == 1),
            "lag" => (WinFunc::Lag, (1..=3).contains(&n)),
            "lead" => (WinFunc::Lead, (1..=3).contains(&n)),
            "first_value" => (WinFunc::FirstValue, n == 1),
            "last_value" => (WinFunc::LastValue, n == 1),
            "count" if matches!(args.first(), Some(FunctionArg::Unnamed(FunctionArgExpr::Wildcard))) => {
                (WinFunc::Agg(AggKind::CountStar), n == 1)
            }
            "count" => (WinFunc::Agg(AggKind::Count), n == 1),
            "sum" => (WinFunc::Agg(AggKind::Sum), n == 1),
            "avg" => (WinFunc::Agg(AggKind::Avg), n == 1),
            "min" => (WinFunc::Agg(AggKind::Min), n == 1),
            "max" => (WinFunc::Agg(AggKind::Max), n == 1),
            _ => return Err(SqlError::not_supported(format!("window function {name}"))),
        };
        func_arity(name, n, func.1)?;
        let func = func.0;
        // Window functions do not nest; their arguments may use the query's aggregates.
        self.allow_windows = false;
        let r = self.window_parts(func, &args, spec);
        self.allow_windows = true;
        let (args, partition, order, frame) = r?;
        self.windows.push(WinSpec { func, args, partition, order, frame });
        Ok(Expr::Window(self.windows.len() - 1))
    }

    #[allow(clippy::type_complexity)]
    fn window_parts(
        &mut self,
        func: WinFunc,
        args: &[&FunctionArg],
        spec: &ast::WindowSpec,
    ) -> SqlResult<(Vec<Expr>, Vec<Expr>, Vec<(Expr, bool)>, Frame)> {
        let mut bound = vec![];
        for a in args {
            match a {
                FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => {}
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => bound.push(self.bind(e)?),
                _ => return Err(SqlError::parse("bad window function argument")),
            }
        }
        let partition = spec.partition_by.iter().map(|e| self.bind(e)).collect::<SqlResult<Vec<_>>>()?;
        let mut order = vec![];
        for it in &spec.order_by {
            order.push((self.bind(&it.expr)?, !matches!(it.options.sort, Some(ast::OrderBySort::Desc))));
        }
        let ranking = !matches!(func, WinFunc::FirstValue | WinFunc::LastValue | WinFunc::Agg(_));
        let frame = match &spec.window_frame {
            None => WinSpec::default_frame(!order.is_empty()),
            // Ranking and offset functions ignore frames, as in MySQL.
            Some(_) if ranking => WinSpec::default_frame(!order.is_empty()),
            Some(fr) => {
                let end = fr.end_bound.clone().unwrap_or(ast::WindowFrameBound::CurrentRow);
                let (s, e) = (self.frame_bound(&fr.start_bound)?, self.frame_bound(&end)?);
                match fr.units {
                    ast::WindowFrameUnits::Rows => Frame::Rows(s, e),
                    ast::WindowFrameUnits::Range
                        if matches!(s, Bound::UnboundedPreceding | Bound::CurrentRow)
                            && matches!(e, Bound::CurrentRow | Bound::UnboundedFollowing) =>
                    {
                        Frame::Range(s, e)
                    }
                    _ => {
                        return Err(SqlError::not_supported(format!(
                            "window frame {} {} AND {}",
                            fr.units, fr.start_bound, end
                        )))
                    }
                }
            }
        };
        Ok((bound, partition, order, frame))
    }

    fn frame_bound(&mut self, b: &ast::WindowFrameBound) -> SqlResult<Bound> {
        let count = |binder: &mut Self, e: &ast::Expr| -> SqlResult<u64> {
            match binder.bind(e)?.eval(&[], &[])? {
                Val::Int(i) if i >= 0 => Ok(i as u64),
                Val::UInt(u) => Ok(u),
                _ => Err(SqlError::parse("window frame bounds are non-negative integers")),
            }
        };
        Ok(match b {
            ast::WindowFrameBound::CurrentRow => Bound::CurrentRow,
            ast::WindowFrameBound::Preceding(None) => Bound::UnboundedPreceding,
            ast::WindowFrameBound::Following(None) => Bound::UnboundedFollowing,
            ast::WindowFrameBound::Preceding(Some(e)) => Bound::Preceding(count(self, e)?),
            ast::WindowFrameBound::Following(Some(e)) => Bound::Following(count(self, e)?),
        })
    }

    /// `INTERVAL <expr> <unit>`: the unit and the bound amount.
    fn interval(&mut self, iv: &ast::Interval) -> SqlResult<(IntervalUnit, Expr)> {
        let unit = iv
            .leading_field
            .as_ref()
            .and_then(|f| IntervalUnit::parse(&f.to_string()))
            .filter(|_| iv.last_field.is_none())
            .ok_or_else(|| SqlError::not_supported(format!("INTERVAL {}", iv)))?;
        Ok((unit, self.bind(&iv.value)?))
    }

    fn sysvar(&self, name: &str) -> SqlResult<Val> {
        let lower = name.to_ascii_lowercase();
        let lower = lower.strip_prefix("session.").or_else(|| lower.strip_prefix("global.")).unwrap_or(&lower);
        let lower = lower.strip_prefix("local.").unwrap_or(lower);
        system_variable(self.env, lower)
            .ok_or_else(|| SqlError::new(code::UNKNOWN_SYSTEM_VARIABLE, format!("Unknown system variable '{name}'")))
    }
}

/// Values of the system variables drivers and tools read. Everything is read-only.
pub fn system_variable(env: &Env, name: &str) -> Option<Val> {
    let s = |x: &str| Some(Val::Str(x.to_string()));
    let i = |x: i64| Some(Val::Int(x));
    match name {
        "version" => s(&env.version),
        "version_comment" => s("Shoal"),
        "version_compile_os" => s("Linux"),
        "version_compile_machine" => s(std::env::consts::ARCH),
        "max_allowed_packet" => i(crate::server::MAX_PACKET_BYTES as i64),
        "net_buffer_length" => i(16384),
        "wait_timeout" | "interactive_timeout" => i(28800),
        "net_read_timeout" => i(30),
        "net_write_timeout" => i(60),
        "autocommit" => i(i64::from(env.autocommit)),
        "transaction_isolation" | "tx_isolation" => s("READ-COMMITTED"),
        "transaction_read_only" | "tx_read_only" | "read_only" | "super_read_only" => i(0),
        "sql_mode" => s("STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION"),
        "character_set_client"
        | "character_set_connection"
        | "character_set_results"
        | "character_set_server"
        | "character_set_database"
        | "character_set_system" => s("utf8mb4"),
        "collation_connection" | "collation_server" | "collation_database" => s("utf8mb4_bin"),
        "lower_case_table_names" => i(1),
        "time_zone" => s("SYSTEM"),
        "system_time_zone" => s("UTC"),
        "socket" => Some(Val::Null),
        "port" => i(3306),
        "hostname" => s("localhost"),
        "server_id" => i(i64::from(env.connection_id >> 24)),
        "license" => s("Apache-2.0"),
        "sql_select_limit" => Some(Val::UInt(u64::MAX)),
        "auto_increment_increment" | "auto_increment_offset" => i(1),
        "performance_schema" | "have_query_cache" | "query_cache_size" | "query_cache_type" => i(0),
        "default_storage_engine" | "storage_engine" | "default_tmp_storage_engine" => s("ndbcluster"),
        "init_connect" => s(""),
        "warning_count" | "error_count" => i(0),
        "identity" | "last_insert_id" => Some(Val::UInt(env.last_insert_id)),
        "sql_auto_is_null" | "sql_safe_updates" | "unique_checks" | "foreign_key_checks" => i(0),
        "lock_wait_timeout" | "innodb_lock_wait_timeout" => i(2),
        "default_authentication_plugin" => s("mysql_native_password"),
        "div_precision_increment" => i(i64::from(crate::val::DIV_PRECISION_INCREMENT)),
        "max_connections" => i(i64::from(crate::server::MAX_CONNECTIONS)),
        "cte_max_recursion_depth" => Some(Val::UInt(env.cte_max_recursion_depth())),
        _ => None,
    }
}

/// Every variable `SHOW VARIABLES` lists.
pub const SHOWN_VARIABLES: &[&str] = &[
    "auto_increment_increment",
    "auto_increment_offset",
    "autocommit",
    "character_set_client",
    "character_set_connection",
    "character_set_database",
    "character_set_results",
    "character_set_server",
    "character_set_system",
    "collation_connection",
    "collation_database",
    "collation_server",
    "cte_max_recursion_depth",
    "default_storage_engine",
    "div_precision_increment",
    "hostname",
    "interactive_timeout",
    "license",
    "lock_wait_timeout",
    "lower_case_table_names",
    "max_allowed_packet",
    "max_connections",
    "net_buffer_length",
    "net_read_timeout",
    "net_write_timeout",
    "read_only",
    "sql_mode",
    "system_time_zone",
    "time_zone",
    "transaction_isolation",
    "transaction_read_only",
    "tx_isolation",
    "version",
    "version_comment",
    "version_compile_machine",
    "version_compile_os",
    "wait_timeout",
];

fn cast_target(dt: &DataType) -> SqlResult<CastTo> {
    use DataType as D;
    Ok(match dt {
        D::Signed | D::SignedInteger | D::Int(_) | D::Integer(_) | D::BigInt(_) => CastTo::Signed,
        D::Unsigned | D::UnsignedInteger | D::IntUnsigned(_) | D::BigIntUnsigned(_) => CastTo::Unsigned,
        D::Char(_) | D::Varchar(_) | D::Text | D::Nvarchar(_) | D::Character(_) => CastTo::Char,
        D::Binary(_) | D::Varbinary(_) | D::Blob(_) => CastTo::Binary,
        D::Double(_) | D::DoublePrecision | D::Float(_) | D::Real => CastTo::Double,
        D::Decimal(i) | D::Numeric(i) | D::Dec(i) => {
            let s = match i {
                ast::ExactNumberInfo::PrecisionAndScale(_, s) => (*s).clamp(0, 30) as u8,
                _ => 0,
            };
            CastTo::Decimal { s }
        }
        D::Date => CastTo::Date,
        D::Datetime(_) | D::Timestamp(..) => CastTo::Datetime,
        other => return Err(SqlError::not_supported(format!("CAST to {other}"))),
    })
}

/// `YYYY-MM-DD hh:mm:ss` (or the date only) in UTC for a Unix time.
pub fn now_string(secs: u64, with_time: bool) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let date = format!("{y:04}-{m:02}-{d:02}");
    if with_time {
        format!("{date} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
    } else {
        date
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parse::parse_one;

    fn env() -> Env {
        Env {
            db: Some("d".into()),
            user: "root".into(),
            version: "8.0.36-shoal".into(),
            autocommit: true,
            ..Env::default()
        }
    }

    fn eval(sql: &str) -> SqlResult<Val> {
        let stmt = parse_one(&format!("SELECT {sql}"))?;
        let sqlparser::ast::Statement::Query(q) = stmt else { panic!("not a query") };
        let sqlparser::ast::SetExpr::Select(s) = *q.body else { panic!("not a select") };
        let sqlparser::ast::SelectItem::UnnamedExpr(e) = &s.projection[0] else { panic!("no expr") };
        let env = env();
        let mut b = Binder::new(&env, None, "field list");
        b.bind(e)?.eval(&[], &[])
    }

    fn text(sql: &str) -> String {
        eval(sql).unwrap().to_string_lossy().unwrap_or_else(|| "NULL".into())
    }

    #[test]
    fn constant_expressions() {
        assert_eq!(text("DATE_ADD('2024-01-31', INTERVAL 1 MONTH)"), "2024-02-29");
        assert_eq!(text("'2024-01-01' - INTERVAL 1 DAY"), "2023-12-31");
        assert_eq!(text("DATE_SUB('2024-01-01 00:00:00', INTERVAL 90 MINUTE)"), "2023-12-31 22:30:00");
        assert_eq!(text("YEAR('2024-05-06') + MONTH('2024-05-06')"), "2029");
        assert_eq!(text("LPAD(REVERSE('ab'), 4, '*')"), "**ba");
        assert_eq!(text("ROUND(POW(2, 0.5), 3)"), "1.414");
        assert_eq!(text("1+1"), "2");
        assert_eq!(text("7/2"), "3.5000");
        assert_eq!(text("1.5*2"), "3.0");
        assert_eq!(text("2 > 1 AND NOT 0"), "1");
        assert_eq!(text("NULL IS NULL"), "1");
        assert_eq!(text("3 IN (1,2,3)"), "1");
        assert_eq!(text("5 BETWEEN 1 AND 4"), "0");
        assert_eq!(text("'abc' LIKE 'a%'"), "1");
        assert_eq!(text("COALESCE(NULL, 'x')"), "x");
        assert_eq!(text("IFNULL(NULL, 2)"), "2");
        assert_eq!(text("CONCAT('a', 'b', 1)"), "ab1");
        assert_eq!(text("UPPER('abc')"), "ABC");
        assert_eq!(text("LENGTH('abc')"), "3");
        assert_eq!(text("CAST('42' AS SIGNED)"), "42");
        assert_eq!(text("CAST(1.5 AS CHAR)"), "1.5");
        assert_eq!(text("CASE WHEN 1 > 2 THEN 'a' ELSE 'b' END"), "b");
        assert_eq!(text("-9223372036854775808"), "-9223372036854775808");
        assert_eq!(text("1e3"), "1000");
        assert_eq!(text("@@version"), "8.0.36-shoal");
        assert_eq!(text("@@session.transaction_isolation"), "READ-COMMITTED");
        assert_eq!(text("@@socket"), "NULL");
        assert_eq!(text("DATABASE()"), "d");
        assert_eq!(text("X'4142'"), "AB");
    }

    #[test]
    fn bind_errors_have_mysql_codes() {
        assert_eq!(eval("nosuch").unwrap_err().code, 1054);
        assert_eq!(eval("COUNT(*)").unwrap_err().code, 1111);
        assert_eq!(eval("nosuchfn(1)").unwrap_err().code, 1305);
        assert_eq!(eval("@@nosuchvar").unwrap_err().code, 1193);
        assert_eq!(eval("IFNULL(1)").unwrap_err().code, 1582);
        assert_eq!(eval("9223372036854775807 + 1").unwrap_err().code, 1690);
    }

    #[test]
    fn now_formats_civil_time() {
        assert_eq!(now_string(0, true), "1970-01-01 00:00:00");
        assert_eq!(now_string(951_782_400, false), "2000-02-29");
        assert_eq!(now_string(1_700_000_000, true), "2023-11-14 22:13:20");
    }
}

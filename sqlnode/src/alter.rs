//! ALTER TABLE that changes columns (ADD/DROP/MODIFY/CHANGE/RENAME COLUMN, ALTER COLUMN … SET
//! or DROP DEFAULT) or adds a unique index, by copy, as MySQL's ALGORITHM=COPY: rows are
//! encoded by position, so a new layout means new rows; a new unique index must see every
//! existing row checked and entered while no write slips past it, and the copy's new table id
//! fences off SQL nodes that do not know the index yet. Also RENAME TABLE (and ALTER TABLE …
//! RENAME TO), which is one catalog change and copies nothing.
//!
//! 1. The new layout is worked out from the old table and the operations ([`new_layout`],
//!    pure: indexes and keys follow their columns by name, through renames; an index left
//!    without columns goes), with where each new column's values come from.
//! 2. A copy table `db.#alter-name` is created in that layout, with the indexes.
//! 3. The table is made read-only: data nodes refuse its writes with a retriable error, which
//!    the cluster client retries within its deadline (writers wait, or fail when the copy
//!    outlasts it). Reads go on. The copy renews the mark every 2 s; mgmd lifts a mark not
//!    renewed for 10 s (its SQL node died), and then refuses the swap.
//! 4. Every row is copied, each value converted to its new column's type by the conversion
//!    INSERT uses (`SqlType::store`, strict mode: a value that does not fit fails the ALTER with
//!    MySQL's error, a NULL for a NOT NULL column with 1138), with its unique index entries (a
//!    value taken twice fails the ALTER with 1062). 5. One catalog change drops the table and
//!    gives its name to the copy. A failure before that drops the copy and lets writes in
//!    again: the table is left as it was.
//!
//! When the operations change only column names and defaults (RENAME COLUMN, CHANGE to the same
//! definition, SET/DROP DEFAULT), no row changes: one catalog change (`SetColumns`) renames
//! them in place, as MySQL changes only metadata ([`in_place`]).

use std::collections::HashSet;

use shoal_proto::{Column, ColumnType, ErrorCode, IndexSpec, TableSpec, Value, MAX_RENAMES};
use sqlparser::ast::{self, AlterColumnOperation, AlterTableOperation, TableConstraint};
use tokio_stream::StreamExt;

use crate::error::{code, SqlError, SqlResult};
use crate::session::{
    check_ident, column_from_def, default_index_name, default_value, index_of_constraint, index_parts,
    is_internal_table, InlineKey, Session,
};
use crate::sql::bind::{Env, TableRef};
use crate::types::SqlType;

/// Names of the copies ALTER TABLE makes start with this (hidden from SHOW TABLES).
pub const COPY_PREFIX: &str = "#alter-";

/// How often the copy renews the table's read-only mark (mgmd's lease is 10 s).
const RENEW_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Rows per insert batch while copying.
const COPY_BATCH: usize = 500;

/// Where a column of the new layout gets its values, while the operations are applied.
#[derive(Clone, Debug, PartialEq)]
enum Source {
    Old(usize),
    Fill(Value),
}

struct NewColumn {
    col: Column,
    source: Source,
}

/// An index by column names while the layout changes.
struct NamedIndex {
    name: String,
    /// Each column with its prefix length (0: the whole value).
    columns: Vec<(String, u32)>,
    unique: bool,
}

/// How the copy makes one column of a new row from an old row (decided once per ALTER, not
/// per row).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Make {
    /// The old row's value at this position, as it is.
    Keep(usize),
    /// The old row's value at `from`, converted from type `old` to the new column's type `new`
    /// (and refused when NULL and the new column is NOT NULL).
    Convert { from: usize, old: SqlType, new: SqlType },
    /// The same value in every row (a column added).
    Fill(Value),
}

/// The table an ALTER TABLE makes: its columns and how each is made from an old row, its keys
/// and indexes by position (index ids are mgmd's to give).
#[derive(Debug)]
pub(crate) struct Layout {
    pub columns: Vec<Column>,
    pub make: Vec<Make>,
    pub primary_key: Vec<u32>,
    pub partition_key: Vec<u32>,
    pub indexes: Vec<IndexSpec>,
}

/// The table's columns after `layout`, when the ALTER changes only column names and defaults:
/// every column stays where it is with its values as they are, and the keys and indexes stay
/// the same. Then one catalog change does it and no row is copied (MySQL changes only metadata
/// for RENAME COLUMN and SET/DROP DEFAULT too). None otherwise.
pub(crate) fn in_place(t: &TableRef, layout: &Layout) -> Option<Vec<Column>> {
    let table = &t.table;
    if layout.make.iter().enumerate().any(|(i, m)| *m != Make::Keep(i)) {
        return None;
    }
    let spec = TableSpec {
        name: table.spec.name.clone(),
        columns: layout.columns.clone(),
        primary_key: layout.primary_key.clone(),
        partition_key: layout.partition_key.clone(),
    };
    let (spec, hidden_pk) = spec.normalize().ok()?;
    let keys_kept = hidden_pk == table.hidden_pk
        && spec.primary_key == table.spec.primary_key
        && spec.partition_key == table.spec.partition_key;
    // Index ids are mgmd's: the same indexes, in the same order, but for their ids.
    let indexes_kept = layout.indexes.len() == table.indexes.len()
        && layout.indexes.iter().zip(&table.indexes).all(|(a, b)| IndexSpec { id: b.id, ..a.clone() } == *b);
    if !keys_kept || !indexes_kept {
        return None;
    }
    table.with_columns_renamed(spec.columns.clone()).ok()?;
    Some(spec.columns)
}

/// Whether an ALTER TABLE operation needs the copy (changes columns or adds a unique index).
pub fn needs_copy(op: &AlterTableOperation) -> bool {
    matches!(
        op,
        AlterTableOperation::AddColumn { .. }
            | AlterTableOperation::DropColumn { .. }
            | AlterTableOperation::ModifyColumn { .. }
            | AlterTableOperation::ChangeColumn { .. }
            | AlterTableOperation::RenameColumn { .. }
            | AlterTableOperation::AlterColumn { .. }
            | AlterTableOperation::AddConstraint {
                constraint: TableConstraint::Unique(_) | TableConstraint::PrimaryKey(_),
                ..
            }
            | AlterTableOperation::DropPrimaryKey { .. }
    )
}

/// `CREATE UNIQUE INDEX name ON t (columns)` as the ALTER TABLE operation it is.
pub fn add_unique(name: Option<String>, columns: Vec<ast::IndexColumn>) -> AlterTableOperation {
    let constraint = TableConstraint::Unique(ast::UniqueConstraint {
        name: None,
        index_name: name.map(ast::Ident::new),
        index_type_display: ast::KeyOrIndexDisplay::None,
        index_type: None,
        columns,
        include: vec![],
        index_options: vec![],
        characteristics: None,
        nulls_distinct: ast::NullsDistinctOption::None,
    });
    AlterTableOperation::AddConstraint { constraint, not_valid: false }
}

/// The value a new NOT NULL column without DEFAULT gets in existing rows (MySQL's implicit
/// default); None where MySQL's would be a zero date we do not store.
fn implicit_default(col: &Column) -> Option<Value> {
    let t = col.sql_type.to_ascii_lowercase();
    if t.starts_with("date") || t.starts_with("timestamp") || t.starts_with("time") || t.starts_with("year") {
        return None;
    }
    Some(match col.ty {
        ColumnType::Int => Value::Int(0),
        ColumnType::Uint => Value::Uint(0),
        ColumnType::Float => Value::Float(0.0),
        ColumnType::Bool => Value::Bool(false),
        ColumnType::Text => Value::Text(String::new()),
        ColumnType::Bytes => Value::Bytes(vec![]),
    })
}

fn find(cols: &[NewColumn], name: &str) -> Option<usize> {
    cols.iter().position(|c| c.col.name.eq_ignore_ascii_case(name))
}

/// A stored value of type `old` as a value of column `col` of type `new`: INSERT's conversion
/// in strict mode (`SqlType::store`), with the errors MySQL's ALTER TABLE gives (1265 where
/// INSERT says 1406 for a string too long; 1138 for a NULL in a NOT NULL column). `row` is the
/// 1-based row number for messages.
pub(crate) fn convert(v: Value, old: SqlType, new: SqlType, col: &Column, row: usize) -> SqlResult<Value> {
    if v == Value::Null {
        if col.nullable {
            return Ok(v);
        }
        return Err(SqlError::new(code::INVALID_USE_OF_NULL, "Invalid use of NULL value"));
    }
    if old == new {
        return Ok(v);
    }
    new.store(&col.name, &old.load_owned(v), row).map_err(|e| match e.code {
        code::DATA_TOO_LONG => {
            SqlError::new(code::WARN_DATA_TRUNCATED, format!("Data truncated for column '{}' at row {row}", col.name))
        }
        _ => e,
    })
}

/// The column definition MODIFY and CHANGE carry in parts.
fn column_def(name: &ast::Ident, data_type: &ast::DataType, options: &[ast::ColumnOption]) -> ast::ColumnDef {
    ast::ColumnDef {
        name: name.clone(),
        data_type: data_type.clone(),
        options: options.iter().map(|o| ast::ColumnOptionDef { name: None, option: o.clone() }).collect(),
    }
}

/// Renames column `old` to `new` wherever keys and indexes name it.
fn rename_refs(pk: &mut [String], partition_key: &mut [String], indexes: &mut [NamedIndex], old: &str, new: &str) {
    let names = pk.iter_mut().chain(partition_key.iter_mut());
    let names = names.chain(indexes.iter_mut().flat_map(|ix| ix.columns.iter_mut().map(|(n, _)| n)));
    for n in names.filter(|n| n.eq_ignore_ascii_case(old)) {
        *n = new.to_string();
    }
}

/// Where `position` puts a column among `cols` (`None`: at `keep`).
fn place(
    cols: &[NewColumn],
    position: &Option<ast::MySQLColumnPosition>,
    keep: usize,
    table: &str,
) -> SqlResult<usize> {
    match position {
        None => Ok(keep),
        Some(ast::MySQLColumnPosition::First) => Ok(0),
        Some(ast::MySQLColumnPosition::After(after)) => {
            Ok(find(cols, &after.value).ok_or_else(|| SqlError::bad_field(&after.value, table))? + 1)
        }
    }
}

fn dup_column(name: &str) -> SqlError {
    SqlError::new(code::DUP_FIELDNAME, format!("Duplicate column name '{name}'"))
}

/// The layout table `t` takes after `ops` (pure; RENAME TO is the caller's and skipped here).
pub(crate) fn new_layout(env: &Env, t: &TableRef, ops: &[AlterTableOperation]) -> SqlResult<Layout> {
    let table = &t.table;
    let visible = t.visible();
    let mut cols: Vec<NewColumn> = table.columns()[..visible]
        .iter()
        .enumerate()
        .map(|(i, c)| NewColumn { col: c.clone(), source: Source::Old(i) })
        .collect();
    let names = |idx: &[u32]| idx.iter().map(|&c| table.columns()[c as usize].name.clone()).collect::<Vec<_>>();
    let mut pk = if table.hidden_pk { vec![] } else { names(&table.spec.primary_key) };
    let mut partition_key =
        if table.spec.partition_key == table.spec.primary_key { vec![] } else { names(&table.spec.partition_key) };
    let mut indexes: Vec<NamedIndex> = table
        .indexes
        .iter()
        .filter(|i| i.name != IndexSpec::PRIMARY)
        .map(|i| {
            let prefix = |k: usize| i.prefix_lens.get(k).copied().unwrap_or(0);
            let columns = names(&i.columns).into_iter().enumerate().map(|(k, n)| (n, prefix(k))).collect();
            NamedIndex { name: i.name.clone(), columns, unique: i.unique }
        })
        .collect();
    let in_pk = |pk: &[String], n: &str| pk.iter().any(|p| p.eq_ignore_ascii_case(n));
    for op in ops {
        match op {
            AlterTableOperation::AddColumn { if_not_exists, column_def, column_position, .. } => {
                let (col, inline_key) = column_from_def(env, column_def)?;
                if find(&cols, &col.name).is_some() {
                    if *if_not_exists {
                        continue;
                    }
                    return Err(dup_column(&col.name));
                }
                if inline_key == InlineKey::Primary {
                    return Err(SqlError::not_supported("adding a PRIMARY KEY column"));
                }
                if inline_key == InlineKey::Unique {
                    let name =
                        default_index_name(std::slice::from_ref(&col), 0, indexes.iter().map(|i| i.name.as_str()));
                    indexes.push(NamedIndex { name, columns: vec![(col.name.clone(), 0)], unique: true });
                }
                if col.auto_increment {
                    return Err(SqlError::not_supported("adding an AUTO_INCREMENT column"));
                }
                let fill = match (&col.default, col.nullable) {
                    (Some(d), _) => d.clone(),
                    (None, true) => Value::Null,
                    (None, false) => implicit_default(&col)
                        .ok_or_else(|| SqlError::not_supported("adding a NOT NULL date/time column without DEFAULT"))?,
                };
                let at = place(&cols, column_position, cols.len(), &t.name)?;
                cols.insert(at, NewColumn { col, source: Source::Fill(fill) });
            }
            AlterTableOperation::DropColumn { column_names, if_exists, .. } => {
                for n in column_names {
                    let Some(i) = find(&cols, &n.value) else {
                        if *if_exists {
                            continue;
                        }
                        return Err(SqlError::new(
                            code::CANT_DROP_FIELD_OR_KEY,
                            format!("Can't DROP '{}'; check that column/key exists", n.value),
                        ));
                    };
                    if in_pk(&pk, &n.value) {
                        return Err(SqlError::not_supported("dropping a primary key column"));
                    }
                    if cols.len() == 1 {
                        return Err(SqlError::new(
                            code::CANT_REMOVE_ALL_FIELDS,
                            "You can't delete all columns with ALTER TABLE; use DROP TABLE instead",
                        ));
                    }
                    cols.remove(i);
                    // MySQL drops the column from its indexes, and an index left empty.
                    for ix in &mut indexes {
                        ix.columns.retain(|(c, _)| !c.eq_ignore_ascii_case(&n.value));
                    }
                    indexes.retain(|ix| !ix.columns.is_empty());
                }
            }
            // MODIFY is CHANGE to the same name.
            AlterTableOperation::ModifyColumn { col_name: old_name, data_type, options, column_position }
            | AlterTableOperation::ChangeColumn { old_name, data_type, options, column_position, .. } => {
                let new_name = match op {
                    AlterTableOperation::ChangeColumn { new_name, .. } => new_name,
                    _ => old_name,
                };
                check_ident("column", &new_name.value)?;
                let (col, key) = column_from_def(env, &column_def(new_name, data_type, options))?;
                let i = find(&cols, &old_name.value).ok_or_else(|| SqlError::bad_field(&old_name.value, &t.name))?;
                if !old_name.value.eq_ignore_ascii_case(&new_name.value) && find(&cols, &new_name.value).is_some() {
                    return Err(dup_column(&new_name.value));
                }
                let was = cols.remove(i);
                let col = changed_column(&was.col, col, key, &pk, &mut indexes)?;
                rename_refs(&mut pk, &mut partition_key, &mut indexes, &was.col.name, &col.name);
                let source = match was.source {
                    // Added by this statement: its one value is converted now.
                    Source::Fill(v) => {
                        let (old, new) = (SqlType::of_column(&was.col), SqlType::of_column(&col));
                        Source::Fill(convert(v, old, new, &col, 1)?)
                    }
                    old => old,
                };
                let at = place(&cols, column_position, i, &t.name)?;
                cols.insert(at, NewColumn { col, source });
            }
            AlterTableOperation::RenameColumn { old_column_name: old, new_column_name: new } => {
                check_ident("column", &new.value)?;
                let i = find(&cols, &old.value).ok_or_else(|| SqlError::bad_field(&old.value, &t.name))?;
                if !old.value.eq_ignore_ascii_case(&new.value) && find(&cols, &new.value).is_some() {
                    return Err(dup_column(&new.value));
                }
                let was = std::mem::replace(&mut cols[i].col.name, new.value.clone());
                rename_refs(&mut pk, &mut partition_key, &mut indexes, &was, &new.value);
            }
            AlterTableOperation::AlterColumn { column_name, op } => {
                let i =
                    find(&cols, &column_name.value).ok_or_else(|| SqlError::bad_field(&column_name.value, &t.name))?;
                let col = &cols[i].col;
                let default = match op {
                    AlterColumnOperation::SetDefault { value } => {
                        default_value(env, col, SqlType::of_column(col), value)?
                    }
                    AlterColumnOperation::DropDefault => None,
                    other => return Err(SqlError::not_supported(format!("ALTER COLUMN … {other}"))),
                };
                cols[i].col.default = default;
            }
            AlterTableOperation::AddConstraint {
                constraint: c @ (TableConstraint::Index(_) | TableConstraint::Unique(_)),
                ..
            } => {
                let Some((name, parts, unique)) = index_of_constraint(c) else { continue };
                let columns: Vec<Column> = cols.iter().map(|c| c.col.clone()).collect();
                let (positions, prefixes) = index_parts(&columns, parts)?;
                let name = name.unwrap_or_else(|| {
                    default_index_name(&columns, positions[0], indexes.iter().map(|i| i.name.as_str()))
                });
                if indexes.iter().any(|i| i.name.eq_ignore_ascii_case(&name))
                    || name.eq_ignore_ascii_case(IndexSpec::PRIMARY)
                {
                    return Err(SqlError::new(code::DUP_KEYNAME, format!("Duplicate key name '{name}'")));
                }
                let prefix = |k: usize| prefixes.get(k).copied().unwrap_or(0);
                let columns =
                    positions.iter().enumerate().map(|(k, &p)| (columns[p as usize].name.clone(), prefix(k))).collect();
                indexes.push(NamedIndex { name, columns, unique });
            }
            // The new key orders the copy: rows that repeat its values fail the copy with
            // 1062, NULLs in its columns with MySQL's error for a NOT NULL column.
            AlterTableOperation::AddConstraint { constraint: TableConstraint::PrimaryKey(p), .. } => {
                if !pk.is_empty() {
                    return Err(SqlError::new(code::MULTIPLE_PRI_KEY, "Multiple primary key defined"));
                }
                let columns: Vec<Column> = cols.iter().map(|c| c.col.clone()).collect();
                let positions = crate::session::index_columns(&columns, &p.columns)?;
                pk = positions.iter().map(|&i| columns[i as usize].name.clone()).collect();
            }
            // The table gets a hidden key, as a table created without one; its partition key
            // was part of the old key and goes with it.
            AlterTableOperation::DropPrimaryKey { .. } => {
                if pk.is_empty() {
                    return Err(SqlError::new(
                        code::CANT_DROP_FIELD_OR_KEY,
                        "Can't DROP 'PRIMARY'; check that column/key exists",
                    ));
                }
                pk.clear();
                partition_key.clear();
            }
            AlterTableOperation::DropIndex { name } => {
                let before = indexes.len();
                indexes.retain(|i| !i.name.eq_ignore_ascii_case(&name.value));
                if indexes.len() == before {
                    return Err(SqlError::new(
                        code::CANT_DROP_FIELD_OR_KEY,
                        format!("Can't DROP '{}'; check that column/key exists", name.value),
                    ));
                }
            }
            // Done by the caller once the copy is in (MySQL renames last too).
            AlterTableOperation::RenameTable { .. } => {}
            other => {
                let text = other.to_string();
                let head: String = text.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
                return Err(SqlError::not_supported(format!("ALTER TABLE … {head}")));
            }
        }
    }
    let positions = |cols: &[NewColumn], names: &[String]| -> Vec<u32> {
        names.iter().filter_map(|n| find(cols, n)).map(|i| i as u32).collect()
    };
    let primary_key = positions(&cols, &pk);
    let partition_key = positions(&cols, &partition_key);
    crate::session::check_auto_key(cols.iter().map(|c| c.col.auto_increment), &primary_key)?;
    for &k in &primary_key {
        let c = &mut cols[k as usize].col;
        // Primary key columns are NOT NULL (as in CREATE TABLE).
        c.nullable = false;
        if c.ty == ColumnType::Float {
            return Err(SqlError::not_supported("FLOAT/DOUBLE primary key columns"));
        }
    }
    let mut specs = vec![];
    if !primary_key.is_empty() {
        specs.push(IndexSpec::primary(primary_key.clone()));
    }
    for ix in &indexes {
        let names: Vec<String> = ix.columns.iter().map(|(n, _)| n.clone()).collect();
        let columns = positions(&cols, &names);
        // A prefix longer than its (changed) column, or of a column no longer a string, is
        // the whole column, as MySQL makes it.
        let mut prefix_lens: Vec<u32> = ix
            .columns
            .iter()
            .zip(&columns)
            .map(|(&(_, p), &c)| {
                let col = &cols[c as usize].col;
                if p > 0 && col.ty.is_var() && p <= col.max_len.max(1) {
                    p
                } else {
                    0
                }
            })
            .collect();
        if prefix_lens.iter().all(|&p| p == 0) {
            prefix_lens.clear();
        }
        specs.push(IndexSpec { id: 0, name: ix.name.clone(), columns, unique: ix.unique, prefix_lens });
    }
    let make = cols
        .iter()
        .map(|c| match &c.source {
            Source::Fill(v) => Make::Fill(v.clone()),
            Source::Old(from) => {
                let (old, new) = (t.types[*from], SqlType::of_column(&c.col));
                let tightened = !c.col.nullable && table.columns()[*from].nullable;
                if old == new && !tightened {
                    Make::Keep(*from)
                } else {
                    Make::Convert { from: *from, old, new }
                }
            }
        })
        .collect();
    Ok(Layout { columns: cols.into_iter().map(|c| c.col).collect(), make, primary_key, partition_key, indexes: specs })
}

/// Column `was` as MODIFY / CHANGE redefines it (`new`, with the key its definition declares):
/// a primary key column stays NOT NULL; AUTO_INCREMENT may stay, not be added; an inline
/// UNIQUE adds a unique index.
fn changed_column(
    was: &Column,
    mut new: Column,
    key: InlineKey,
    pk: &[String],
    indexes: &mut Vec<NamedIndex>,
) -> SqlResult<Column> {
    match key {
        InlineKey::Primary if pk.is_empty() => return Err(SqlError::not_supported("adding a PRIMARY KEY")),
        InlineKey::Primary => return Err(SqlError::new(code::MULTIPLE_PRI_KEY, "Multiple primary key defined")),
        InlineKey::Unique => {
            let name = default_index_name(std::slice::from_ref(&new), 0, indexes.iter().map(|i| i.name.as_str()));
            indexes.push(NamedIndex { name, columns: vec![(new.name.clone(), 0)], unique: true });
        }
        InlineKey::None => {}
    }
    if new.auto_increment && !was.auto_increment {
        return Err(SqlError::not_supported("adding AUTO_INCREMENT to an existing column"));
    }
    if pk.iter().any(|p| p.eq_ignore_ascii_case(&was.name)) {
        new.nullable = false;
    }
    Ok(new)
}

/// What stops a RENAME TABLE, found by playing its renames in order over the catalog's names:
/// the position of the pair whose source is missing or whose target is taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RenameError {
    Missing(usize),
    Taken(usize),
}

/// Checks renames `(from, to)` of full names (`db.t`) against the tables there are, in order
/// (a later pair may take a name an earlier one freed; a name may change only its case).
pub(crate) fn check_renames<'a>(
    tables: impl IntoIterator<Item = &'a str>,
    pairs: &[(String, String)],
) -> Result<(), RenameError> {
    let mut names: HashSet<String> = tables.into_iter().map(|n| n.to_ascii_lowercase()).collect();
    for (k, (from, to)) in pairs.iter().enumerate() {
        let (from, to) = (from.to_ascii_lowercase(), to.to_ascii_lowercase());
        if !names.remove(&from) {
            return Err(RenameError::Missing(k));
        }
        if !names.insert(to) {
            return Err(RenameError::Taken(k));
        }
    }
    Ok(())
}

impl Session {
    /// ALTER TABLE with column changes (and index changes alongside), by copy.
    /// ALTER TABLE … RENAME INDEX: one catalog change; the index keeps its id and entries.
    pub(crate) async fn rename_index(&self, t: &TableRef, from: &str, to: &str) -> SqlResult<()> {
        check_ident("index", to)?;
        for n in [from, to] {
            if n.eq_ignore_ascii_case(IndexSpec::PRIMARY) {
                return Err(SqlError::new(code::WRONG_NAME_FOR_INDEX, format!("Incorrect index name '{n}'")));
            }
        }
        let named = |n: &str| t.table.indexes.iter().any(|i| i.name.eq_ignore_ascii_case(n));
        if !named(from) {
            return Err(SqlError::new(
                code::KEY_DOES_NOT_EXIST,
                format!("Key '{from}' doesn't exist in table '{}'", t.name),
            ));
        }
        if !from.eq_ignore_ascii_case(to) && named(to) {
            return Err(SqlError::new(code::DUP_KEYNAME, format!("Duplicate key name '{to}'")));
        }
        let client = self.client();
        client.rename_index(&t.table.spec.name, from, to).await.map(drop).map_err(|e| SqlError::from_cluster(&e))
    }

    /// ALTER TABLE operations that change columns: in place when only names and defaults
    /// change ([`in_place`]), else by copy.
    pub(crate) async fn alter_columns(&mut self, t: &TableRef, ops: &[AlterTableOperation]) -> SqlResult<()> {
        if let Some(columns) = in_place(t, &new_layout(&self.env(), t, ops)?) {
            let client = self.client();
            return client
                .set_columns(&t.table.spec.name, &columns)
                .await
                .map(drop)
                .map_err(|e| SqlError::from_cluster(&e));
        }
        self.alter_by_copy(t, ops).await
    }

    pub(crate) async fn alter_by_copy(&mut self, t: &TableRef, ops: &[AlterTableOperation]) -> SqlResult<()> {
        let layout = new_layout(&self.env(), t, ops)?;
        let table = &t.table;
        let (db, name) = table.spec.name.split_once('.').unwrap_or(("", table.spec.name.as_str()));
        let copy_name = format!("{db}.{COPY_PREFIX}{name}");
        let spec = TableSpec {
            name: copy_name.clone(),
            columns: layout.columns,
            primary_key: layout.primary_key,
            partition_key: layout.partition_key,
        };
        let make = layout.make;
        let client = self.client().clone();
        let cluster = |e: shoal_proto::ShoalError| SqlError::from_cluster(&e);
        // A copy left behind by an ALTER that died half-way is stale.
        client.drop_table(&copy_name, true).await.map_err(cluster)?;
        let copy = client.create_table_with_indexes(spec, layout.indexes, false).await.map_err(cluster)?;
        let copied = async {
            client.set_read_only(&table.spec.name, true).await.map_err(cluster)?;
            let mut renewed = std::time::Instant::now();
            let mut rows = client.scan(&table.spec.name, vec![], vec![]);
            let mut batch = Vec::with_capacity(COPY_BATCH);
            let mut entries: Vec<(usize, Vec<Value>)> = vec![];
            let mut row_number = 0;
            loop {
                // mgmd lets writes in again when the mark is not renewed (a dead SQL node).
                if renewed.elapsed() >= RENEW_EVERY {
                    client.set_read_only(&table.spec.name, true).await.map_err(cluster)?;
                    renewed = std::time::Instant::now();
                }
                let next = rows.next().await.transpose().map_err(cluster)?;
                let done = next.is_none();
                if let Some(mut old) = next {
                    row_number += 1;
                    let mut row = Vec::with_capacity(make.len() + 1);
                    for (m, col) in make.iter().zip(copy.columns()) {
                        row.push(match m {
                            Make::Keep(i) => std::mem::replace(&mut old[*i], Value::Null),
                            Make::Convert { from, old: was, new } => {
                                let v = std::mem::replace(&mut old[*from], Value::Null);
                                convert(v, *was, *new, col, row_number)?
                            }
                            Make::Fill(v) => v.clone(),
                        });
                    }
                    // Nobody else writes the copy: its unique entries need no transaction.
                    let row = client.with_hidden_key(&copy, row);
                    for e in crate::unique::entries(&copy, &row) {
                        entries.push((e.index, e.row));
                    }
                    batch.push(shoal_client::KeyOp::Insert { table: copy_name.clone(), row });
                }
                if batch.len() >= COPY_BATCH || (done && !batch.is_empty()) {
                    let taken = std::mem::take(&mut entries);
                    let inserts = taken.iter().map(|(ix, row)| shoal_client::KeyOp::Insert {
                        table: copy.unique_table_name(&copy.indexes[*ix]),
                        row: row.clone(),
                    });
                    for (r, (ix, row)) in client.batch(inserts.collect()).await.into_iter().zip(&taken) {
                        match r {
                            Err(e) if e.code == ErrorCode::DuplicateKey => {
                                let ix = &copy.indexes[*ix];
                                let e = crate::unique::duplicate(&t.name, &copy, ix, &row[..ix.columns.len()]);
                                return Err(cluster(e));
                            }
                            r => {
                                r.map_err(cluster)?;
                            }
                        }
                    }
                    for r in client.batch(std::mem::take(&mut batch)).await {
                        r.map_err(cluster)?;
                    }
                }
                if done {
                    break;
                }
            }
            client.replace_table(&table.spec.name, &copy_name).await.map_err(cluster)
        }
        .await;
        if let Err(e) = copied {
            let _ = client.drop_table(&copy_name, true).await;
            let _ = client.set_read_only(&table.spec.name, false).await;
            return Err(e);
        }
        Ok(())
    }

    /// RENAME TABLE `from TO to, …` (each name as its parts, `[db, ]table`), and ALTER TABLE …
    /// RENAME TO: MySQL's checks (1146 for a missing source, 1050 for a taken target, both in
    /// statement order), then one catalog change that moves only names.
    pub(crate) async fn rename_tables(&self, pairs: &[(Vec<String>, Vec<String>)]) -> SqlResult<()> {
        let renames = self.plan_renames(pairs).await?;
        self.client().rename_tables(&renames).await.map(drop).map_err(|e| SqlError::from_cluster(&e))
    }

    /// The checks of [`Session::rename_tables`]; the renames as catalog names (`db.t`).
    pub(crate) async fn plan_renames(&self, pairs: &[(Vec<String>, Vec<String>)]) -> SqlResult<Vec<(String, String)>> {
        if pairs.len() > MAX_RENAMES {
            return Err(SqlError::not_supported(format!("RENAME TABLE of more than {MAX_RENAMES} tables")));
        }
        let mut names = Vec::with_capacity(pairs.len());
        for (from, to) in pairs {
            let from = self.table_name(from)?;
            let to = self.table_name(to)?;
            check_ident("table", &to.1)?;
            if is_internal_table(&to.1) {
                return Err(SqlError::new(code::WRONG_TABLE_NAME, format!("Incorrect table name '{}'", to.1)));
            }
            names.push((from, to));
        }
        let full = |(db, t): &(String, String)| format!("{db}.{t}");
        // Tables the SQL node keeps for itself (ALTER copies, unique index tables, `$` databases)
        // are nobody's to rename.
        let hidden = |db: &str, t: &str| db.is_empty() || db.starts_with('$') || is_internal_table(t);
        let map = self.client().map();
        if names.iter().any(|(from, _)| map.table(&full(from)).is_none()) {
            let _ = self.client().refresh().await;
        }
        let map = self.client().map();
        let tables = map.tables.iter().map(|t| t.spec.name.as_str()).filter(|n| {
            let (db, t) = n.split_once('.').unwrap_or(("", *n));
            !hidden(db, t)
        });
        // Sources by their catalog spelling.
        let renames: Vec<(String, String)> = names
            .iter()
            .map(|(from, to)| {
                let catalog = map.table(&full(from)).filter(|_| !hidden(&from.0, &from.1)).map(|t| t.spec.name.clone());
                (catalog.unwrap_or_else(|| full(from)), full(to))
            })
            .collect();
        match check_renames(tables, &renames) {
            Ok(()) => {}
            Err(RenameError::Missing(k)) => {
                let (db, t) = &names[k].0;
                if self.find_view(db, t).await?.is_some() {
                    return Err(SqlError::not_supported("RENAME TABLE of a view"));
                }
                return Err(SqlError::no_such_table(db, t));
            }
            Err(RenameError::Taken(k)) => {
                return Err(SqlError::new(code::TABLE_EXISTS, format!("Table '{}' already exists", names[k].1 .1)))
            }
        }
        for ((from, to), (catalog, _)) in names.iter().zip(&renames) {
            if !self.db_exists(&to.0) {
                return Err(SqlError::bad_db(&to.0));
            }
            // Trigger names are unique per database: a table with triggers stays in its own.
            let triggers = map.table(catalog).is_some_and(|t| !t.triggers.is_empty());
            if triggers && !from.0.eq_ignore_ascii_case(&to.0) {
                return Err(SqlError::new(code::TRG_IN_WRONG_SCHEMA, "Trigger in wrong schema"));
            }
            if self.find_view(&to.0, &to.1).await?.is_some() {
                return Err(SqlError::new(code::TABLE_EXISTS, format!("Table '{}' already exists", to.1)));
            }
        }
        Ok(renames)
    }

    /// `[db, ]table` as (database, table), after the privilege check.
    fn table_name(&self, parts: &[String]) -> SqlResult<(String, String)> {
        let (db, t) = match parts {
            [t] => (self.db_for(None)?, t.clone()),
            [d, t] => (d.clone(), t.clone()),
            _ => return Err(SqlError::parse(format!("bad table name {}", parts.join(".")))),
        };
        self.check_table(&db, &t)?;
        Ok((db, t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parse::parse_one;
    use crate::types::IntKind;
    use shoal_proto::Table;
    use sqlparser::ast::Statement;

    /// `CREATE TABLE d.t (id INT PRIMARY KEY, v INT, s VARCHAR(10) NOT NULL, KEY v_idx (v),
    /// UNIQUE KEY s_u (s))` as the catalog holds it.
    fn table() -> TableRef {
        let Statement::CreateTable(ct) =
            parse_one("CREATE TABLE t (id INT, v INT DEFAULT 3, s VARCHAR(10) NOT NULL)").unwrap()
        else {
            panic!("not a CREATE TABLE")
        };
        let env = Env::default();
        let columns = ct.columns.iter().map(|c| column_from_def(&env, c).unwrap().0).collect();
        let spec = TableSpec { name: "d.t".into(), columns, primary_key: vec![0], partition_key: vec![] };
        let (spec, hidden_pk) = spec.normalize().unwrap();
        let index = |id, name: &str, columns: Vec<u32>, unique| IndexSpec {
            id,
            name: name.into(),
            columns,
            unique,
            prefix_lens: vec![],
        };
        let indexes = vec![
            index(1, "PRIMARY", vec![0], false),
            index(2, "v_idx", vec![1], false),
            index(3, "s_u", vec![2], true),
        ];
        let t = Table { id: 7, spec, partition_count: 4, schema_version: 1, hidden_pk, indexes, ..Default::default() };
        TableRef::new("d", "t", t)
    }

    fn layout(ops: &str) -> SqlResult<Layout> {
        let Statement::AlterTable(at) = parse_one(&format!("ALTER TABLE t {ops}")).unwrap() else {
            panic!("not an ALTER TABLE")
        };
        new_layout(&Env::default(), &table(), &at.operations)
    }

    fn names(l: &Layout) -> Vec<&str> {
        l.columns.iter().map(|c| c.name.as_str()).collect()
    }

    /// Each index as `name(columns)`, the columns by name.
    fn indexes(l: &Layout) -> Vec<String> {
        let col = |c: &u32| l.columns[*c as usize].name.clone();
        l.indexes
            .iter()
            .map(|i| format!("{}({})", i.name, i.columns.iter().map(col).collect::<Vec<_>>().join(",")))
            .collect()
    }

    fn code_of(r: SqlResult<Layout>) -> u16 {
        r.expect_err("the ALTER should fail").code
    }

    const INT: SqlType = SqlType::Int { kind: IntKind::Int, unsigned: false, width: None };
    const BIGINT: SqlType = SqlType::Int { kind: IntKind::Big, unsigned: false, width: None };

    #[test]
    fn modify_converts_only_what_changes() {
        let l = layout("MODIFY v BIGINT").unwrap();
        assert_eq!(names(&l), ["id", "v", "s"]);
        assert_eq!(l.make, [Make::Keep(0), Make::Convert { from: 1, old: INT, new: BIGINT }, Make::Keep(2)]);
        assert_eq!(l.columns[1].default, None, "MODIFY replaces the whole definition");
        assert_eq!(indexes(&l), ["PRIMARY(id)", "v_idx(v)", "s_u(s)"]);
        assert!(l.indexes[2].unique);
        // Same type, NOT NULL added: each value is still checked for NULL.
        let l = layout("MODIFY COLUMN v INT NOT NULL").unwrap();
        assert_eq!(l.make[1], Make::Convert { from: 1, old: INT, new: INT });
        // Placed first: keys and indexes follow by name.
        let l = layout("MODIFY s VARCHAR(20) FIRST").unwrap();
        assert_eq!(names(&l), ["s", "id", "v"]);
        assert_eq!(
            (l.primary_key.clone(), indexes(&l)),
            (vec![1], vec!["PRIMARY(id)".into(), "v_idx(v)".into(), "s_u(s)".into()])
        );
        assert_eq!(
            l.make,
            [
                Make::Convert { from: 2, old: SqlType::Varchar(10), new: SqlType::Varchar(20) },
                Make::Keep(0),
                Make::Keep(1)
            ]
        );
        let l = layout("MODIFY id INT AFTER v").unwrap();
        assert_eq!((names(&l), l.primary_key.clone()), (vec!["v", "id", "s"], vec![1]));
        assert!(!l.columns[1].nullable, "a primary key column stays NOT NULL");
    }

    #[test]
    fn change_and_rename_column_carry_keys_and_indexes() {
        let l = layout("CHANGE v w INT DEFAULT 3").unwrap();
        assert_eq!(names(&l), ["id", "w", "s"]);
        assert_eq!(l.make, [Make::Keep(0), Make::Keep(1), Make::Keep(2)], "same type: no conversion");
        assert_eq!(indexes(&l), ["PRIMARY(id)", "v_idx(w)", "s_u(s)"]);
        let l = layout("CHANGE COLUMN id ident BIGINT").unwrap();
        assert_eq!((names(&l), l.primary_key.clone()), (vec!["ident", "v", "s"], vec![0]));
        assert!(!l.columns[0].nullable);
        assert_eq!(l.make[0], Make::Convert { from: 0, old: INT, new: BIGINT });
        let l = layout("RENAME COLUMN s TO s2").unwrap();
        assert_eq!(names(&l), ["id", "v", "s2"]);
        assert_eq!(l.columns[2].sql_type, "varchar(10)");
        assert!(!l.columns[2].nullable);
        assert_eq!(indexes(&l), ["PRIMARY(id)", "v_idx(v)", "s_u(s2)"]);
        assert_eq!(l.make, [Make::Keep(0), Make::Keep(1), Make::Keep(2)]);
        // A name may change case only; renames chain within one statement.
        let l = layout("RENAME COLUMN v TO V, CHANGE V x INT, RENAME COLUMN x TO y").unwrap();
        assert_eq!(indexes(&l), ["PRIMARY(id)", "v_idx(y)", "s_u(s)"]);
    }

    #[test]
    fn defaults_change_alone() {
        let l = layout("ALTER COLUMN v SET DEFAULT 42").unwrap();
        assert_eq!(l.columns[1].default, Some(Value::Int(42)));
        assert_eq!(l.make, [Make::Keep(0), Make::Keep(1), Make::Keep(2)]);
        let l = layout("ALTER v DROP DEFAULT").unwrap();
        assert_eq!(l.columns[1].default, None);
        let l = layout("ALTER COLUMN s SET DEFAULT 'abc'").unwrap();
        assert_eq!(l.columns[2].default, Some(Value::Text("abc".into())));
        assert_eq!(code_of(layout("ALTER COLUMN v SET DEFAULT 'abc'")), code::INVALID_DEFAULT);
        assert_eq!(code_of(layout("ALTER COLUMN s SET DEFAULT NULL")), code::INVALID_DEFAULT);
        assert_eq!(code_of(layout("ALTER COLUMN s SET DEFAULT 'abcdefghijk'")), code::INVALID_DEFAULT);
        assert_eq!(code_of(layout("ALTER COLUMN nope SET DEFAULT 1")), code::BAD_FIELD);
    }

    #[test]
    fn names_and_defaults_change_in_place_the_rest_by_copy() {
        let t = table();
        for ops in [
            "RENAME COLUMN s TO s2",
            "CHANGE v w INT DEFAULT 3",
            "ALTER COLUMN v SET DEFAULT 42",
            "ALTER v DROP DEFAULT, RENAME COLUMN id TO ident",
        ] {
            assert!(in_place(&t, &layout(ops).unwrap()).is_some(), "{ops}");
        }
        let cols = in_place(&t, &layout("RENAME COLUMN s TO s2, ALTER COLUMN v SET DEFAULT 42").unwrap()).unwrap();
        assert_eq!((cols[2].name.as_str(), &cols[1].default), ("s2", &Some(Value::Int(42))));
        assert_eq!((cols[0].name.as_str(), cols.len()), ("id", 3));
        for ops in [
            "MODIFY v BIGINT",
            "MODIFY v INT NOT NULL",
            "ADD COLUMN z INT",
            "DROP COLUMN v",
            "MODIFY s VARCHAR(10) NOT NULL FIRST",
            "ADD UNIQUE (v)",
            "RENAME COLUMN v TO w, DROP INDEX v_idx",
        ] {
            assert!(in_place(&t, &layout(ops).unwrap()).is_none(), "{ops}");
        }
    }

    #[test]
    fn several_operations_apply_in_order() {
        let l = layout("MODIFY v BIGINT, ADD COLUMN z INT, DROP INDEX v_idx").unwrap();
        assert_eq!(names(&l), ["id", "v", "s", "z"]);
        assert_eq!(indexes(&l), ["PRIMARY(id)", "s_u(s)"]);
        assert_eq!(l.make[3], Make::Fill(Value::Null));
        // A column added and modified in one statement: its fill value is converted.
        let l = layout("ADD COLUMN z INT NOT NULL DEFAULT 7, MODIFY z VARCHAR(5) NOT NULL").unwrap();
        assert_eq!(l.make[3], Make::Fill(Value::Text("7".into())));
        let l = layout("ADD COLUMN z INT NOT NULL DEFAULT 700, MODIFY z VARCHAR(5), RENAME TO t2").unwrap();
        assert_eq!(l.columns.len(), 4, "RENAME TO is left to the caller");
        assert_eq!(code_of(layout("ADD COLUMN z VARCHAR(9) DEFAULT 'long text', MODIFY z VARCHAR(3)")), 1265);
    }

    #[test]
    fn mysql_errors() {
        assert_eq!(code_of(layout("MODIFY nope INT")), code::BAD_FIELD);
        assert_eq!(code_of(layout("CHANGE nope x INT")), code::BAD_FIELD);
        assert_eq!(code_of(layout("CHANGE v s INT")), code::DUP_FIELDNAME);
        assert_eq!(code_of(layout("RENAME COLUMN v TO id")), code::DUP_FIELDNAME);
        assert_eq!(code_of(layout("RENAME COLUMN nope TO x")), code::BAD_FIELD);
        assert_eq!(code_of(layout("MODIFY v INT AFTER v")), code::BAD_FIELD, "AFTER itself");
        assert_eq!(code_of(layout("MODIFY v INT AFTER nope")), code::BAD_FIELD);
        assert_eq!(code_of(layout("MODIFY v INT PRIMARY KEY")), code::MULTIPLE_PRI_KEY);
        assert_eq!(code_of(layout("MODIFY id DOUBLE")), code::NOT_SUPPORTED_YET);
        assert_eq!(code_of(layout("MODIFY v INT AUTO_INCREMENT")), code::NOT_SUPPORTED_YET);
        assert_eq!(code_of(layout("ADD PRIMARY KEY (v)")), code::MULTIPLE_PRI_KEY);
        assert_eq!(code_of(layout("DROP PRIMARY KEY, DROP PRIMARY KEY")), code::CANT_DROP_FIELD_OR_KEY);
        assert_eq!(code_of(layout("DROP PRIMARY KEY, ADD PRIMARY KEY (nope)")), code::KEY_COLUMN_DOES_NOT_EXIST);
    }

    /// ADD / DROP PRIMARY KEY: a new key (its columns NOT NULL), or a hidden one.
    #[test]
    fn primary_keys_are_dropped_and_added() {
        let l = layout("DROP PRIMARY KEY, MODIFY v BIGINT").unwrap();
        assert!(l.primary_key.is_empty() && l.partition_key.is_empty());
        assert_eq!(indexes(&l), ["v_idx(v)", "s_u(s)"]);
        let l = layout("DROP PRIMARY KEY, ADD PRIMARY KEY (s, v)").unwrap();
        assert_eq!(l.primary_key, vec![2, 1]);
        assert!(!l.columns[1].nullable, "a primary key column is NOT NULL");
        assert_eq!(indexes(&l), ["PRIMARY(s,v)", "v_idx(v)", "s_u(s)"]);
        assert!(in_place(&table(), &l).is_none(), "a new key copies the rows");
    }

    #[test]
    fn other_forms_are_refused_clearly() {
        for ops in [
            "ALTER COLUMN v SET NOT NULL",
            "MODIFY v INT, DROP FOREIGN KEY f",
            "RENAME INDEX v_idx TO v2",
            "ADD COLUMN z INT, RENAME KEY v_idx TO v2",
        ] {
            let sql = format!("ALTER TABLE t {ops}");
            let code = match parse_one(&sql) {
                Ok(Statement::AlterTable(at)) => code_of(new_layout(&Env::default(), &table(), &at.operations)),
                Ok(other) => panic!("{ops}: parsed as {other}"),
                Err(e) => crate::sql::parse::unparsed_form(&sql).unwrap_or(e).code,
            };
            assert_eq!(code, code::NOT_SUPPORTED_YET, "{ops}");
        }
    }

    #[test]
    fn convert_is_inserts_conversion_with_alters_errors() {
        let col = |sql_type: SqlType, nullable| {
            let (ty, max_len) = sql_type.storage().unwrap();
            Column { nullable, max_len, sql_type: sql_type.to_string(), ..Column::new("c", ty) }
        };
        let big = col(BIGINT, true);
        assert_eq!(convert(Value::Int(5), INT, BIGINT, &big, 1), Ok(Value::Int(5)));
        assert_eq!(convert(Value::Null, INT, BIGINT, &big, 1), Ok(Value::Null));
        let not_null = col(BIGINT, false);
        assert_eq!(convert(Value::Null, INT, BIGINT, &not_null, 1).unwrap_err().code, code::INVALID_USE_OF_NULL);
        let text = SqlType::Varchar(10);
        assert_eq!(convert(Value::Text(" 42".into()), text, BIGINT, &big, 1), Ok(Value::Int(42)));
        let e = convert(Value::Text("abc".into()), text, BIGINT, &big, 3).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (1366, "Incorrect integer value: 'abc' for column 'c' at row 3"));
        let short = col(SqlType::Varchar(3), true);
        let e = convert(Value::Text("abcd".into()), text, SqlType::Varchar(3), &short, 2).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (1265, "Data truncated for column 'c' at row 2"));
        assert_eq!(convert(Value::Int(12), INT, SqlType::Varchar(3), &short, 1), Ok(Value::Text("12".into())));
        let tiny = SqlType::Int { kind: IntKind::Tiny, unsigned: false, width: None };
        let e = convert(Value::Int(1000), INT, tiny, &col(tiny, true), 1).unwrap_err();
        assert_eq!(e.code, code::WARN_DATA_OUT_OF_RANGE);
        let dec = SqlType::Decimal { p: 5, s: 2 };
        assert_eq!(convert(Value::Int(7), INT, dec, &col(dec, true), 1), Ok(Value::Int(700)));
        let date = SqlType::Datetime(0);
        let got = convert(Value::Text("2024-02-03".into()), SqlType::Date, date, &col(date, true), 1);
        assert_eq!(got, Ok(Value::Text("2024-02-03 00:00:00".into())));
    }

    #[test]
    fn renames_play_in_order() {
        let tables = ["d.a", "d.b", "e.c"];
        let pairs = |p: &[(&str, &str)]| p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        assert_eq!(check_renames(tables, &pairs(&[("d.a", "d.x")])), Ok(()));
        assert_eq!(check_renames(tables, &pairs(&[("d.a", "d.tmp"), ("d.b", "d.a"), ("d.tmp", "d.b")])), Ok(()));
        assert_eq!(check_renames(tables, &pairs(&[("D.A", "e.a")])), Ok(()), "across databases, any case");
        assert_eq!(check_renames(tables, &pairs(&[("d.a", "d.A")])), Ok(()), "a change of case");
        assert_eq!(check_renames(tables, &pairs(&[("d.a", "d.x"), ("d.a", "d.y")])), Err(RenameError::Missing(1)));
        assert_eq!(check_renames(tables, &pairs(&[("d.nope", "d.x")])), Err(RenameError::Missing(0)));
        assert_eq!(check_renames(tables, &pairs(&[("d.a", "d.x"), ("d.b", "E.C")])), Err(RenameError::Taken(1)));
        assert_eq!(check_renames(tables, &pairs(&[("d.a", "d.x"), ("d.b", "d.x")])), Err(RenameError::Taken(1)));
    }
}

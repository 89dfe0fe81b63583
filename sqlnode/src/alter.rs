//! ALTER TABLE that changes columns (ADD/DROP COLUMN) or adds a unique index, by copy, as
//! MySQL's ALGORITHM=COPY: rows are encoded by position, so a new layout means new rows; a new
//! unique index must see every existing row checked and entered while no write slips past it,
//! and the copy's new table id fences off SQL nodes that do not know the index yet.
//!
//! 1. The new layout is worked out from the old table and the operations (indexes follow their
//!    columns; an index left without columns goes).
//! 2. A copy table `db.#alter-name` is created in that layout, with the indexes.
//! 3. The table is made read-only: data nodes refuse its writes with a retriable error, which
//!    the cluster client retries within its deadline (writers wait, or fail when the copy
//!    outlasts it). Reads go on. The copy renews the mark every 2 s; mgmd lifts a mark not
//!    renewed for 10 s (its SQL node died), and then refuses the swap.
//! 4. Every row is copied, converted, with its unique index entries (a value taken twice fails
//!    the ALTER with 1062). 5. One catalog change drops the table and gives its name to the
//!    copy. A failure before that drops the copy and lets writes in again.

use shoal_proto::{Column, ColumnType, IndexSpec, TableSpec, Value};
use sqlparser::ast::{self, AlterTableOperation, TableConstraint};
use tokio_stream::StreamExt;

use crate::error::{code, SqlError, SqlResult};
use crate::session::{column_from_def, default_index_name, index_of_constraint, index_parts, InlineKey, Session};
use crate::sql::bind::TableRef;

/// Names of the copies ALTER TABLE makes start with this (hidden from SHOW TABLES).
pub const COPY_PREFIX: &str = "#alter-";

/// How often the copy renews the table's read-only mark (mgmd's lease is 10 s).
const RENEW_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Rows per insert batch while copying.
const COPY_BATCH: usize = 500;

/// Where a column of the new layout gets its values.
#[derive(Clone, Debug)]
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

/// Whether an ALTER TABLE operation needs the copy (changes columns or adds a unique index).
pub fn needs_copy(op: &AlterTableOperation) -> bool {
    matches!(
        op,
        AlterTableOperation::AddColumn { .. }
            | AlterTableOperation::DropColumn { .. }
            | AlterTableOperation::AddConstraint { constraint: TableConstraint::Unique(_), .. }
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

impl Session {
    /// ALTER TABLE with column changes (and index changes alongside), by copy.
    pub(crate) async fn alter_by_copy(&mut self, t: &TableRef, ops: &[AlterTableOperation]) -> SqlResult<()> {
        let table = &t.table;
        let visible = t.visible();
        let mut cols: Vec<NewColumn> = table.columns()[..visible]
            .iter()
            .enumerate()
            .map(|(i, c)| NewColumn { col: c.clone(), source: Source::Old(i) })
            .collect();
        let names = |idx: &[u32]| idx.iter().map(|&c| table.columns()[c as usize].name.clone()).collect::<Vec<_>>();
        let pk = if table.hidden_pk { vec![] } else { names(&table.spec.primary_key) };
        let partition_key =
            if table.spec.partition_key == table.spec.primary_key { vec![] } else { names(&table.spec.partition_key) };
        let mut indexes: Vec<NamedIndex> = table
            .indexes
            .iter()
            .filter(|i| i.name != "PRIMARY")
            .map(|i| {
                let prefix = |k: usize| i.prefix_lens.get(k).copied().unwrap_or(0);
                let columns = names(&i.columns).into_iter().enumerate().map(|(k, n)| (n, prefix(k))).collect();
                NamedIndex { name: i.name.clone(), columns, unique: i.unique }
            })
            .collect();
        let env = self.env();
        for op in ops {
            match op {
                AlterTableOperation::AddColumn { if_not_exists, column_def, column_position, .. } => {
                    let (col, inline_key) = column_from_def(&env, column_def)?;
                    if find(&cols, &col.name).is_some() {
                        if *if_not_exists {
                            continue;
                        }
                        return Err(SqlError::new(
                            code::DUP_FIELDNAME,
                            format!("Duplicate column name '{}'", col.name),
                        ));
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
                        (None, false) => implicit_default(&col).ok_or_else(|| {
                            SqlError::not_supported("adding a NOT NULL date/time column without DEFAULT")
                        })?,
                    };
                    let at = match column_position {
                        None => cols.len(),
                        Some(ast::MySQLColumnPosition::First) => 0,
                        Some(ast::MySQLColumnPosition::After(after)) => {
                            find(&cols, &after.value)
                                .ok_or_else(|| SqlError::bad_field(&after.value, t.name.as_str()))?
                                + 1
                        }
                    };
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
                        if pk.iter().any(|p| p.eq_ignore_ascii_case(&n.value)) {
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
                        || name.eq_ignore_ascii_case("PRIMARY")
                    {
                        return Err(SqlError::new(code::DUP_KEYNAME, format!("Duplicate key name '{name}'")));
                    }
                    let prefix = |k: usize| prefixes.get(k).copied().unwrap_or(0);
                    let columns = positions
                        .iter()
                        .enumerate()
                        .map(|(k, &p)| (columns[p as usize].name.clone(), prefix(k)))
                        .collect();
                    indexes.push(NamedIndex { name, columns, unique });
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
                other => {
                    let text = other.to_string();
                    let head: String = text.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
                    return Err(SqlError::not_supported(format!("ALTER TABLE … {head}")));
                }
            }
        }
        let position = |n: &String| find(&cols, n).map(|i| i as u32);
        let pk: Vec<u32> = pk.iter().filter_map(position).collect();
        let partition_key: Vec<u32> = partition_key.iter().filter_map(position).collect();
        let mut specs = vec![];
        if !pk.is_empty() {
            specs.push(IndexSpec {
                id: 0,
                name: "PRIMARY".into(),
                columns: pk.clone(),
                unique: false,
                prefix_lens: vec![],
            });
        }
        for ix in &indexes {
            let columns = ix.columns.iter().filter_map(|(n, _)| position(n)).collect();
            let mut prefix_lens: Vec<u32> = ix.columns.iter().map(|&(_, p)| p).collect();
            if prefix_lens.iter().all(|&p| p == 0) {
                prefix_lens.clear();
            }
            specs.push(IndexSpec { id: 0, name: ix.name.clone(), columns, unique: ix.unique, prefix_lens });
        }
        let (db, name) = table.spec.name.split_once('.').unwrap_or(("", table.spec.name.as_str()));
        let copy_name = format!("{db}.{COPY_PREFIX}{name}");
        let spec = TableSpec {
            name: copy_name.clone(),
            columns: cols.iter().map(|c| c.col.clone()).collect(),
            primary_key: pk,
            partition_key,
        };
        let sources: Vec<Source> = cols.iter().map(|c| c.source.clone()).collect();
        let client = self.client().clone();
        // A copy left behind by an ALTER that died half-way is stale.
        client.drop_table(&copy_name, true).await.map_err(|e| SqlError::from_cluster(&e))?;
        let copy =
            client.create_table_with_indexes(spec, specs, false).await.map_err(|e| SqlError::from_cluster(&e))?;
        let copied = async {
            client.set_read_only(&table.spec.name, true).await?;
            let mut renewed = std::time::Instant::now();
            let mut rows = client.scan(&table.spec.name, vec![], vec![]);
            let mut batch = Vec::with_capacity(COPY_BATCH);
            let mut entries: Vec<(usize, Vec<Value>)> = vec![];
            loop {
                // mgmd lets writes in again when the mark is not renewed (a dead SQL node).
                if renewed.elapsed() >= RENEW_EVERY {
                    client.set_read_only(&table.spec.name, true).await?;
                    renewed = std::time::Instant::now();
                }
                let next = rows.next().await.transpose()?;
                if let Some(old) = &next {
                    let row: Vec<Value> = sources
                        .iter()
                        .map(|s| match s {
                            Source::Old(i) => old[*i].clone(),
                            Source::Fill(v) => v.clone(),
                        })
                        .collect();
                    // Nobody else writes the copy: its unique entries need no transaction.
                    let row = client.with_hidden_key(&copy, row);
                    for e in crate::unique::entries(&copy, &row) {
                        entries.push((e.index, e.row));
                    }
                    batch.push(shoal_client::KeyOp::Insert { table: copy_name.clone(), row });
                }
                if batch.len() >= COPY_BATCH || (next.is_none() && !batch.is_empty()) {
                    let taken = std::mem::take(&mut entries);
                    let inserts = taken.iter().map(|(ix, row)| shoal_client::KeyOp::Insert {
                        table: copy.unique_table_name(&copy.indexes[*ix]),
                        row: row.clone(),
                    });
                    for (r, (ix, row)) in client.batch(inserts.collect()).await.into_iter().zip(&taken) {
                        match r {
                            Err(e) if e.code == shoal_proto::ErrorCode::DuplicateKey => {
                                let ix = &copy.indexes[*ix];
                                return Err(crate::unique::duplicate(&t.name, &copy, ix, &row[..ix.columns.len()]));
                            }
                            r => {
                                r?;
                            }
                        }
                    }
                    for r in client.batch(std::mem::take(&mut batch)).await {
                        r?;
                    }
                }
                if next.is_none() {
                    break;
                }
            }
            client.replace_table(&table.spec.name, &copy_name).await
        }
        .await;
        if let Err(e) = copied {
            let _ = client.drop_table(&copy_name, true).await;
            let _ = client.set_read_only(&table.spec.name, false).await;
            return Err(SqlError::from_cluster(&e));
        }
        Ok(())
    }
}

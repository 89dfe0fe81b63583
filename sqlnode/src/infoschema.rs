//! `information_schema`: SCHEMATA, TABLES, COLUMNS, VIEWS and TRIGGERS, built from the catalog (and the
//! views table) when a statement names them, then queried like any derived table (joins,
//! WHERE, ORDER BY all work). Read-only and computed per statement; the columns are the ones
//! tools read most, named as MySQL 8 names them.

use std::sync::Arc;

use crate::error::SqlResult;
use crate::session::{ColumnMeta, Session};
use crate::sql::bind::TableRef;
use crate::sql::query::VirtualTable;
use crate::types::{IntKind, SqlType, WireType};
use crate::val::Val;

/// The database name of the virtual tables.
pub const INFORMATION_SCHEMA: &str = "information_schema";

fn text_col(name: &str) -> (String, WireType) {
    (name.to_string(), WireType::Str { len: 256 })
}

fn int_col(name: &str) -> (String, WireType) {
    (name.to_string(), WireType::Int { kind: IntKind::Big, unsigned: true, width: None })
}

fn s(x: &str) -> Val {
    Val::Str(x.to_string())
}

/// (DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, NUMERIC_PRECISION, NUMERIC_SCALE) of a column type.
fn type_parts(t: SqlType) -> (String, Val, Val, Val) {
    let full = t.to_string();
    let data_type = full.split(['(', ' ']).next().unwrap_or("").to_string();
    let n = |x: u64| Val::UInt(x);
    match t {
        SqlType::Int { kind, unsigned, .. } => {
            let p = match kind {
                IntKind::Tiny => 3,
                IntKind::Small => 5,
                IntKind::Medium => 7,
                IntKind::Int => 10,
                IntKind::Big if unsigned => 20,
                IntKind::Big => 19,
            };
            (data_type, Val::Null, n(p), n(0))
        }
        SqlType::Decimal { p, s } => (data_type, Val::Null, n(u64::from(p)), n(u64::from(s))),
        SqlType::Float => (data_type, Val::Null, n(12), Val::Null),
        SqlType::Double => (data_type, Val::Null, n(22), Val::Null),
        SqlType::Char(len) | SqlType::Varchar(len) | SqlType::Binary(len) | SqlType::Varbinary(len) => {
            (data_type, n(u64::from(len)), Val::Null, Val::Null)
        }
        _ => (data_type, Val::Null, Val::Null, Val::Null),
    }
}

impl Session {
    /// The virtual table `information_schema.<name>`, if there is one.
    pub async fn information_schema(&self, name: &str) -> SqlResult<Option<VirtualTable>> {
        let (cols, rows): (Vec<(String, WireType)>, Vec<Vec<Val>>) = match name.to_ascii_lowercase().as_str() {
            "schemata" => {
                let mut rows =
                    vec![vec![s("def"), s(INFORMATION_SCHEMA), s("utf8mb3"), s("utf8mb3_general_ci"), Val::Null]];
                for db in self.visible_databases() {
                    rows.push(vec![s("def"), Val::Str(db), s("utf8mb4"), s("utf8mb4_bin"), Val::Null]);
                }
                let cols =
                    ["CATALOG_NAME", "SCHEMA_NAME", "DEFAULT_CHARACTER_SET_NAME", "DEFAULT_COLLATION_NAME", "SQL_PATH"];
                (cols.iter().map(|c| text_col(c)).collect(), rows)
            }
            "tables" => {
                let mut rows = vec![];
                for db in self.visible_databases() {
                    for (t, _) in self.user_tables_in(&db) {
                        rows.push(vec![
                            s("def"),
                            s(&db),
                            Val::Str(t),
                            s("BASE TABLE"),
                            s("ndbcluster"),
                            Val::UInt(10),
                            s("Dynamic"),
                            Val::Null,
                            Val::Null,
                            Val::Null,
                            s("utf8mb4_bin"),
                            s(""),
                        ]);
                    }
                    for v in self.views_in(&db).await? {
                        rows.push(vec![
                            s("def"),
                            s(&db),
                            Val::Str(v.name),
                            s("VIEW"),
                            Val::Null,
                            Val::Null,
                            Val::Null,
                            Val::Null,
                            Val::Null,
                            Val::Null,
                            Val::Null,
                            s("VIEW"),
                        ]);
                    }
                }
                let mut cols: Vec<(String, WireType)> =
                    ["TABLE_CATALOG", "TABLE_SCHEMA", "TABLE_NAME", "TABLE_TYPE", "ENGINE"]
                        .iter()
                        .map(|c| text_col(c))
                        .collect();
                cols.push(int_col("VERSION"));
                cols.push(text_col("ROW_FORMAT"));
                cols.push(int_col("TABLE_ROWS"));
                cols.push(int_col("AUTO_INCREMENT"));
                cols.push((String::from("CREATE_TIME"), WireType::Datetime { fsp: 0, timestamp: false }));
                cols.push(text_col("TABLE_COLLATION"));
                cols.push(text_col("TABLE_COMMENT"));
                (cols, rows)
            }
            "columns" => {
                let mut rows = vec![];
                for db in self.visible_databases() {
                    for (name, table) in self.user_tables_in(&db) {
                        let t = TableRef::new(&db, &name, table);
                        for i in 0..t.visible() {
                            let c = &t.table.columns()[i];
                            let ty = t.types[i];
                            let (data_type, max_len, precision, scale) = type_parts(ty);
                            let key = !t.table.hidden_pk && t.table.spec.primary_key.contains(&(i as u32));
                            let default = c
                                .default
                                .as_ref()
                                .and_then(|v| ty.load(v).to_string_lossy())
                                .map_or(Val::Null, Val::Str);
                            rows.push(vec![
                                s("def"),
                                s(&db),
                                s(&name),
                                s(&c.name),
                                Val::UInt(i as u64 + 1),
                                default,
                                s(if c.nullable { "YES" } else { "NO" }),
                                Val::Str(data_type),
                                max_len,
                                precision,
                                scale,
                                Val::Str(ty.to_string()),
                                s(if key { "PRI" } else { "" }),
                                s(if c.auto_increment { "auto_increment" } else { "" }),
                                s(""),
                            ]);
                        }
                    }
                }
                let mut cols: Vec<(String, WireType)> = ["TABLE_CATALOG", "TABLE_SCHEMA", "TABLE_NAME", "COLUMN_NAME"]
                    .iter()
                    .map(|c| text_col(c))
                    .collect();
                cols.push(int_col("ORDINAL_POSITION"));
                cols.extend(["COLUMN_DEFAULT", "IS_NULLABLE", "DATA_TYPE"].iter().map(|c| text_col(c)));
                cols.extend(
                    ["CHARACTER_MAXIMUM_LENGTH", "NUMERIC_PRECISION", "NUMERIC_SCALE"].iter().map(|c| int_col(c)),
                );
                cols.extend(["COLUMN_TYPE", "COLUMN_KEY", "EXTRA", "COLUMN_COMMENT"].iter().map(|c| text_col(c)));
                (cols, rows)
            }
            "views" => {
                let mut rows = vec![];
                for db in self.visible_databases() {
                    for v in self.views_in(&db).await? {
                        rows.push(vec![s("def"), s(&db), Val::Str(v.name), Val::Str(v.sql), s("NONE"), s("NO")]);
                    }
                }
                let cols =
                    ["TABLE_CATALOG", "TABLE_SCHEMA", "TABLE_NAME", "VIEW_DEFINITION", "CHECK_OPTION", "IS_UPDATABLE"];
                (cols.iter().map(|c| text_col(c)).collect(), rows)
            }
            "triggers" => {
                let mut rows = vec![];
                for db in self.visible_databases() {
                    for (name, table) in self.user_tables_in(&db) {
                        for (i, tr) in table.triggers.iter().enumerate() {
                            // 1-based among the table's triggers of the same timing and event.
                            let order = table.triggers[..i]
                                .iter()
                                .filter(|o| o.before == tr.before && o.event == tr.event)
                                .count() as u64
                                + 1;
                            rows.push(vec![
                                s("def"),
                                s(&db),
                                s(&tr.name),
                                s(tr.event.as_sql()),
                                s("def"),
                                s(&db),
                                s(&name),
                                Val::UInt(order),
                                Val::Null,
                                s(&tr.body),
                                s("ROW"),
                                s(if tr.before { "BEFORE" } else { "AFTER" }),
                                Val::Null,
                                Val::Null,
                                s("OLD"),
                                s("NEW"),
                                Val::Str(crate::trigger::run::created_text(tr.created_ms)),
                                s(crate::trigger::run::SQL_MODE),
                                Val::Str(tr.definer.replace('\'', "")),
                                s("utf8mb4"),
                                s("utf8mb4_bin"),
                                s("utf8mb4_bin"),
                            ]);
                        }
                    }
                }
                let mut cols: Vec<(String, WireType)> = [
                    "TRIGGER_CATALOG",
                    "TRIGGER_SCHEMA",
                    "TRIGGER_NAME",
                    "EVENT_MANIPULATION",
                    "EVENT_OBJECT_CATALOG",
                    "EVENT_OBJECT_SCHEMA",
                    "EVENT_OBJECT_TABLE",
                ]
                .iter()
                .map(|c| text_col(c))
                .collect();
                cols.push(int_col("ACTION_ORDER"));
                cols.extend(
                    [
                        "ACTION_CONDITION",
                        "ACTION_STATEMENT",
                        "ACTION_ORIENTATION",
                        "ACTION_TIMING",
                        "ACTION_REFERENCE_OLD_TABLE",
                        "ACTION_REFERENCE_NEW_TABLE",
                        "ACTION_REFERENCE_OLD_ROW",
                        "ACTION_REFERENCE_NEW_ROW",
                        "CREATED",
                        "SQL_MODE",
                        "DEFINER",
                        "CHARACTER_SET_CLIENT",
                        "COLLATION_CONNECTION",
                        "DATABASE_COLLATION",
                    ]
                    .iter()
                    .map(|c| text_col(c)),
                );
                (cols, rows)
            }
            _ => return Ok(None),
        };
        let table = name.to_ascii_uppercase();
        let columns = cols
            .into_iter()
            .map(|(n, ty)| ColumnMeta {
                name: n.clone(),
                org_name: n,
                table: table.clone(),
                org_table: table.clone(),
                db: INFORMATION_SCHEMA.into(),
                ty: Some(ty),
                ..ColumnMeta::default()
            })
            .collect();
        Ok(Some(VirtualTable { name: table, columns, rows: Arc::new(rows) }))
    }
}

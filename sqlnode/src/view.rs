//! Views: stored queries, kept as rows of the hidden cluster table `$sys.views` (one row per
//! view: its `CREATE VIEW` text and database), so that they need nothing from mgmd but an
//! ordinary table, and every SQL node sees a view as soon as its row is written.
//!
//! A view is planned from its text every time a statement names it, as a derived table whose
//! unqualified names mean tables of the view's database (`crate::sql::query`). CREATE VIEW
//! plans the query once to check it (tables and columns exist, column names are unique).
//! Tables and views share one namespace per database: each refuses a name the other has
//! (checked, not enforced atomically across SQL nodes). Views are read-only.

use shoal_client::KeyOp;
use shoal_proto::{Column, ColumnType, ErrorCode, TableSpec, Value};
use sqlparser::ast;
use tokio_stream::StreamExt;

use crate::error::{code, SqlError, SqlResult};
use crate::session::{object_parts, Outcome, Session};
use crate::sql::query::ViewDef;

/// The catalog table holding every view (a `$` name, which SQL cannot create or name).
pub const VIEWS_TABLE: &str = "$sys.views";
/// Longest `CREATE VIEW` text stored.
pub const MAX_VIEW_SQL_BYTES: u32 = 16 * 1024;

/// The primary key of a view's row: `db.name`, lower case (names compare case-insensitively).
fn view_key(db: &str, name: &str) -> Vec<Value> {
    vec![Value::Text(format!("{}.{}", db.to_lowercase(), name.to_lowercase()))]
}

fn views_spec() -> TableSpec {
    let text = |n: &str, len: u32| {
        let mut c = Column::new(n, ColumnType::Text);
        c.max_len = len;
        c
    };
    TableSpec {
        name: VIEWS_TABLE.into(),
        columns: vec![text("key", 260), text("db", 256), text("name", 256), text("definition", MAX_VIEW_SQL_BYTES)],
        primary_key: vec![0],
        partition_key: vec![],
    }
}

fn row_to_view(row: &[Value]) -> Option<ViewDef> {
    match row {
        [_, Value::Text(db), Value::Text(name), Value::Text(sql), ..] => {
            Some(ViewDef { db: db.clone(), name: name.clone(), sql: sql.clone() })
        }
        _ => None,
    }
}

impl Session {
    fn views_table_exists(&self) -> bool {
        self.client().map().table(VIEWS_TABLE).is_some()
    }

    /// The view `db.name`, if there is one.
    pub async fn find_view(&self, db: &str, name: &str) -> SqlResult<Option<ViewDef>> {
        if !self.views_table_exists() {
            return Ok(None);
        }
        match self.client().get(VIEWS_TABLE, view_key(db, name)).await {
            Ok(row) => Ok(row.as_deref().and_then(row_to_view)),
            Err(e) if e.code == ErrorCode::NoSuchTable => Ok(None),
            Err(e) => Err(SqlError::from_cluster(&e)),
        }
    }

    /// Every view of one database.
    pub async fn views_in(&self, db: &str) -> SqlResult<Vec<ViewDef>> {
        if !self.views_table_exists() {
            return Ok(vec![]);
        }
        let mut out = vec![];
        let mut stream = self.client().scan(VIEWS_TABLE, vec![], vec![]);
        while let Some(row) = stream.next().await {
            match row {
                Ok(row) => {
                    if let Some(v) = row_to_view(&row).filter(|v| v.db.eq_ignore_ascii_case(db)) {
                        out.push(v);
                    }
                }
                Err(e) if e.code == ErrorCode::NoSuchTable => return Ok(vec![]),
                Err(e) => return Err(SqlError::from_cluster(&e)),
            }
        }
        out.sort_by_key(|v| v.name.to_lowercase());
        Ok(out)
    }

    pub async fn create_view(&mut self, cv: &ast::CreateView, sql: &str) -> SqlResult<Outcome> {
        if cv.materialized || cv.temporary || cv.to.is_some() {
            return Err(SqlError::not_supported("MATERIALIZED / TEMPORARY views"));
        }
        let parts = object_parts(&cv.name);
        let (db, name) = match parts.as_slice() {
            [v] => (self.db_for(None)?, v.clone()),
            [d, v] => (d.clone(), v.clone()),
            _ => return Err(SqlError::parse("bad view name")),
        };
        self.check_table(&db, &name)?;
        if !self.db_exists(&db) {
            return Err(SqlError::bad_db(&db));
        }
        if sql.len() > MAX_VIEW_SQL_BYTES as usize {
            return Err(SqlError::not_supported(format!("view definitions longer than {MAX_VIEW_SQL_BYTES} bytes")));
        }
        if self.resolve(&[db.clone(), name.clone()]).await.is_ok() {
            return Err(SqlError::new(code::TABLE_EXISTS, format!("Table '{name}' already exists")));
        }
        // Check the query now (tables, columns, unique column names), in the view's database.
        let def = ViewDef { db: db.clone(), name: name.clone(), sql: sql.to_string() };
        let plan = self.plan(|p| p.view_plan(&def)).await?;
        let mut seen: Vec<&str> = vec![];
        for c in &plan.columns {
            if seen.iter().any(|s| s.eq_ignore_ascii_case(&c.name)) {
                return Err(SqlError::new(code::DUP_FIELDNAME, format!("Duplicate column name '{}'", c.name)));
            }
            seen.push(&c.name);
        }
        if !self.views_table_exists() {
            match self.client().create_table(views_spec(), true).await {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::TableExists => {}
                Err(e) => return Err(SqlError::from_cluster(&e)),
            }
        }
        let mut row = view_key(&db, &name);
        row.extend([Value::Text(db.clone()), Value::Text(name.clone()), Value::Text(sql.to_string())]);
        let op = if cv.or_replace || cv.or_alter {
            KeyOp::Upsert { table: VIEWS_TABLE.into(), row }
        } else {
            KeyOp::Insert { table: VIEWS_TABLE.into(), row }
        };
        match self.client().batch(vec![op]).await.pop() {
            Some(Ok(_)) => Ok(Outcome::ok()),
            Some(Err(e)) if e.code == ErrorCode::DuplicateKey => {
                if cv.if_not_exists {
                    return Ok(Outcome::ok());
                }
                Err(SqlError::new(code::TABLE_EXISTS, format!("Table '{name}' already exists")))
            }
            Some(Err(e)) => Err(SqlError::from_cluster(&e)),
            None => Err(SqlError::internal("CREATE VIEW: no answer from the cluster")),
        }
    }

    pub async fn drop_views(&mut self, names: &[ast::ObjectName], if_exists: bool) -> SqlResult<Outcome> {
        let mut missing = vec![];
        for n in names {
            let parts = object_parts(n);
            let (db, name) = match parts.as_slice() {
                [v] => (self.db_for(None)?, v.clone()),
                [d, v] => (d.clone(), v.clone()),
                _ => return Err(SqlError::parse("bad view name")),
            };
            self.check_table(&db, &name)?;
            if self.find_view(&db, &name).await?.is_none() {
                if !if_exists && self.resolve(&[db.clone(), name.clone()]).await.is_ok() {
                    return Err(SqlError::new(code::WRONG_OBJECT, format!("'{db}.{name}' is not VIEW")));
                }
                missing.push(format!("{db}.{name}"));
                continue;
            }
            let op = KeyOp::Delete { table: VIEWS_TABLE.into(), key: view_key(&db, &name) };
            match self.client().batch(vec![op]).await.pop() {
                Some(Ok(_)) => {}
                Some(Err(e)) if e.code == ErrorCode::KeyNotFound => missing.push(format!("{db}.{name}")),
                Some(Err(e)) => return Err(SqlError::from_cluster(&e)),
                None => return Err(SqlError::internal("DROP VIEW: no answer from the cluster")),
            }
        }
        if !missing.is_empty() && !if_exists {
            return Err(SqlError::new(code::BAD_TABLE, format!("Unknown table '{}'", missing.join(","))));
        }
        Ok(Outcome::ok())
    }

    /// Drops every view of a database (DROP DATABASE).
    pub async fn drop_views_in(&self, db: &str) -> SqlResult<()> {
        let ops: Vec<KeyOp> = self
            .views_in(db)
            .await?
            .iter()
            .map(|v| KeyOp::Delete { table: VIEWS_TABLE.into(), key: view_key(&v.db, &v.name) })
            .collect();
        for r in self.client().batch(ops).await {
            match r {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::KeyNotFound => {}
                Err(e) => return Err(SqlError::from_cluster(&e)),
            }
        }
        Ok(())
    }
}

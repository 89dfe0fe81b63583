//! Prepared point selects: `SELECT a, b FROM t WHERE pk = ?` (sysbench's `oltp_point_select`,
//! feature lookups) skip parsing, binding and planning on every execution. PREPARE recognizes
//! the shape — plain columns of one table, equality of its single-column primary key with the
//! one placeholder, nothing else — and keeps what the plan would be; EXECUTE converts the
//! parameter, reads the key and projects the row, exactly as the general path does (the
//! columns announced at PREPARE are the ones the general path gave). Anything else about the
//! session or the table that could change the answer sends the execution the general way: a
//! different current database, a table whose id or schema version changed (ALTER, DROP and
//! CREATE), a parameter that does not convert exactly to the key's type.

use shoal_proto::Value;
use sqlparser::ast;

use crate::error::SqlResult;
use crate::session::{object_parts, ColumnMeta, Outcome, ResultSet, Session};
use crate::sql::bind::TableRef;
use crate::val::Val;

#[derive(Debug)]
pub struct PointSelect {
    /// The current database at PREPARE (unqualified names resolve in it).
    db: Option<String>,
    table: TableRef,
    key: usize,
    project: Vec<usize>,
    /// The columns to fetch: those projected, ascending.
    fetch: Vec<u32>,
    columns: std::sync::Arc<[ColumnMeta]>,
}

/// The parts of `SELECT cols FROM name WHERE key = NULL` (the statement prepared with NULL in
/// its placeholder), if that is all the statement is.
fn shape(stmt: &ast::Statement) -> Option<(Vec<String>, Vec<String>, String)> {
    let ast::Statement::Query(q) = stmt else { return None };
    let ast::SetExpr::Select(s) = q.body.as_ref() else { return None };
    let [from] = s.from.as_slice() else { return None };
    let ast::TableFactor::Table { name, .. } = &from.relation else { return None };
    let cols = s
        .projection
        .iter()
        .map(|item| match item {
            ast::SelectItem::UnnamedExpr(ast::Expr::Identifier(i)) => Some(i.value.clone()),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    let Some(ast::Expr::BinaryOp { left, op: ast::BinaryOperator::Eq, .. }) = &s.selection else { return None };
    let ast::Expr::Identifier(key) = left.as_ref() else { return None };
    // Whatever else the statement says shows up in its text: the shape must be all of it.
    let plain = format!(
        "SELECT {} FROM {name} WHERE {key} = NULL",
        s.projection.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
    );
    (stmt.to_string() == plain).then(|| (cols, object_parts(name), key.value.clone()))
}

impl Session {
    /// The point select a prepared statement is, if it is one (`probe`: its text with NULL in
    /// the placeholder; `columns`: what PREPARE announced).
    pub(crate) async fn point_select(&self, probe: &str, columns: &[ColumnMeta]) -> Option<PointSelect> {
        let stmt = crate::sql::parse::parse_one(probe).ok()?;
        let (cols, name, key) = shape(&stmt)?;
        let table = self.resolve(&name).await.ok()?;
        let key = table.column(&key)?;
        if table.table.hidden_pk || table.table.spec.primary_key != [key as u32] {
            return None;
        }
        let project = cols.iter().map(|c| table.column(c)).collect::<Option<Vec<_>>>()?;
        if project.len() != columns.len() {
            return None;
        }
        let mut fetch: Vec<u32> = project.iter().map(|&c| c as u32).collect();
        fetch.sort_unstable();
        fetch.dedup();
        Some(PointSelect { db: self.db.clone(), table, key, project, fetch, columns: columns.into() })
    }

    /// Runs a point select with its parameter; None when it must go the general way.
    pub(crate) async fn run_point_select(&mut self, p: &PointSelect, param: &Val) -> Option<SqlResult<Outcome>> {
        let t = &p.table;
        if self.db != p.db {
            return None;
        }
        let now = self.client().map().table(&t.table.spec.name).map(|x| (x.id, x.schema_version));
        if now != Some((t.table.id, t.table.schema_version)) {
            return None;
        }
        if let Err(e) = self.shared.users().await {
            return Some(Err(crate::error::SqlError::from_cluster(&e)));
        }
        if let Err(e) = self.check_table(&t.db, &t.name) {
            return Some(Err(e));
        }
        let key: Option<Value> = match t.types[p.key].exact_storage(param) {
            Some(v) => Some(v),
            // `pk = NULL`, `pk = 1.5` on an integer key: no row (as the planner decides).
            None if param.is_null() || param.is_numeric() => None,
            None => return None,
        };
        let row = match key {
            Some(k) => match self.kv_batch_get(&t.table.spec.name, vec![vec![k]], &p.fetch).await {
                Ok(mut rows) => rows.pop().flatten(),
                Err(e) => return Some(Err(crate::error::SqlError::from_cluster(&e))),
            },
            None => None,
        };
        let rows: Vec<Vec<Val>> =
            row.into_iter().map(|r| p.project.iter().map(|&c| t.types[c].load(&r[c])).collect()).collect();
        self.found_rows = rows.len() as u64;
        self.row_count = -1;
        Some(Ok(Outcome::Rows(ResultSet { columns: p.columns.clone(), rows })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape_of(sql: &str) -> Option<(Vec<String>, Vec<String>, String)> {
        shape(&crate::sql::parse::parse_one(sql).unwrap())
    }

    #[test]
    fn only_the_plain_shape_is_a_point_select() {
        let (cols, name, key) = shape_of("SELECT c FROM sbtest1 WHERE id=NULL").unwrap();
        assert_eq!((cols, name, key), (vec!["c".to_string()], vec!["sbtest1".to_string()], "id".to_string()));
        assert!(shape_of("select a, b from d.t where k = NULL").is_some());
        for other in [
            "SELECT c FROM t WHERE id = NULL AND k = 1",
            "SELECT c FROM t WHERE id = NULL ORDER BY c",
            "SELECT c FROM t WHERE id = NULL LIMIT 1",
            "SELECT c FROM t WHERE id = NULL FOR UPDATE",
            "SELECT DISTINCT c FROM t WHERE id = NULL",
            "SELECT c AS x FROM t WHERE id = NULL",
            "SELECT c + 1 FROM t WHERE id = NULL",
            "SELECT * FROM t WHERE id = NULL",
            "SELECT c FROM t AS u WHERE id = NULL",
            "SELECT c FROM t, u WHERE id = NULL",
            "SELECT c FROM t WHERE id > NULL",
            "SELECT c FROM t WHERE id = NULL GROUP BY c",
        ] {
            assert!(shape_of(other).is_none(), "{other}");
        }
    }
}

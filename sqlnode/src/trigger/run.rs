//! Triggers in a session: CREATE / DROP TRIGGER, SHOW TRIGGERS, SHOW CREATE TRIGGER, and
//! firing a table's triggers for one row (`exec.rs` calls [`Session::fire`] around each row
//! INSERT, UPDATE and DELETE write when the table has triggers for the event).
//!
//! A trigger's statements run in the session that runs the statement, inside that statement's
//! transaction (the statement opens one of its own under autocommit), so a failing trigger
//! takes the statement and everything its triggers did back with it. Every trigger runs with
//! the caller's privileges (MySQL runs it as its DEFINER; Shoal records the definer only).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};

use shoal_proto::{Trigger, TriggerEvent};
use sqlparser::ast::{self, Statement};

use super::parse::{self, CreateTrigger, Step};
use crate::error::{code, SqlError, SqlResult};
use crate::session::{object_parts, Outcome, Session};
use crate::sql::bind::TableRef;
use crate::sql::parse::{parse_one, sql_literal};
use crate::val::Val;

/// Deepest chain of triggers firing triggers (a trigger's statement writes a table with
/// triggers of its own).
const MAX_TRIGGER_DEPTH: usize = 16;

/// Whether `t` has triggers for `event`.
pub fn has_triggers(t: &TableRef, event: TriggerEvent) -> bool {
    t.table.triggers.iter().any(|tr| tr.event == event)
}

/// The row a trigger fires for: NEW (INSERT, UPDATE; a BEFORE trigger may change it) and OLD
/// (UPDATE, DELETE), as SQL values of the table's visible columns.
pub struct RowPair<'a> {
    pub new: Option<&'a mut Vec<Val>>,
    pub old: Option<&'a [Val]>,
}

type StepFuture<'a> = Pin<Box<dyn Future<Output = SqlResult<()>> + Send + 'a>>;

impl Session {
    /// CREATE TRIGGER: checked here (table, names, what the body may do), then one catalog
    /// change.
    pub(crate) async fn create_trigger(&mut self, sql: &str) -> SqlResult<Outcome> {
        let ct = parse::parse_create(sql)?;
        let db = self.db_for(ct.table_db.as_deref())?;
        if ct.db.as_deref().is_some_and(|d| !d.eq_ignore_ascii_case(&db)) {
            return Err(SqlError::new(code::TRG_IN_WRONG_SCHEMA, "Trigger in wrong schema"));
        }
        crate::session::check_ident("trigger", &ct.name)?;
        self.check_table(&db, &ct.table)?;
        if self.find_view(&db, &ct.table).await?.is_some() {
            return Err(SqlError::new(
                code::TRG_ON_VIEW_OR_TEMP_TABLE,
                format!("Trigger's '{}' is view or temporary table", ct.table),
            ));
        }
        let t = self.resolve(&[db.clone(), ct.table.clone()]).await?;
        check_body(&ct, &t)?;
        let trigger = Trigger {
            name: ct.name.clone(),
            before: ct.before,
            event: ct.event,
            body: ct.body.clone(),
            definer: format!("'{}'@'{}'", self.account.name, self.account.host),
            created_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        self.client()
            .create_trigger(&t.table.spec.name, &trigger, ct.if_not_exists)
            .await
            .map_err(|e| SqlError::from_cluster(&e))?;
        Ok(Outcome::ok())
    }

    /// DROP TRIGGER [IF EXISTS] [db.]name.
    pub(crate) async fn drop_trigger(
        &mut self,
        db: Option<String>,
        name: String,
        if_exists: bool,
    ) -> SqlResult<Outcome> {
        let db = self.db_for(db.as_deref())?;
        self.check_db(&db)?;
        if !self.db_exists(&db) {
            // MySQL names the missing trigger, not the database.
            if if_exists {
                return Ok(Outcome::ok());
            }
            return Err(SqlError::new(code::TRG_DOES_NOT_EXIST, "Trigger does not exist"));
        }
        // mgmd compares database names ignoring case, as the catalog's table names.
        self.client().drop_trigger(&db, &name, if_exists).await.map_err(|e| SqlError::from_cluster(&e))?;
        Ok(Outcome::ok())
    }

    /// The triggers of `db` (the current database if None): (table name, trigger), in
    /// table order, then creation order.
    fn triggers_in(&self, db: Option<&str>) -> SqlResult<(String, Vec<(String, Trigger)>)> {
        let db = self.db_for(db)?;
        self.check_db(&db)?;
        if !self.db_exists(&db) {
            return Err(SqlError::bad_db(&db));
        }
        let mut out = vec![];
        for (name, t) in self.user_tables_in(&db) {
            out.extend(t.triggers.iter().map(|tr| (name.clone(), tr.clone())));
        }
        Ok((db, out))
    }

    /// SHOW TRIGGERS [FROM db] [LIKE 'table pattern'].
    pub(crate) fn show_triggers(&self, db: Option<String>, like: Option<String>) -> SqlResult<Outcome> {
        let (_, triggers) = self.triggers_in(db.as_deref())?;
        let rows = triggers
            .into_iter()
            .filter(|(table, _)| crate::session::like_filter(&like, table))
            .map(|(table, tr)| {
                vec![
                    tr.name,
                    tr.event.as_sql().into(),
                    table,
                    tr.body,
                    if tr.before { "BEFORE" } else { "AFTER" }.into(),
                    created_text(tr.created_ms),
                    SQL_MODE.into(),
                    tr.definer.replace('\'', ""),
                    "utf8mb4".into(),
                    "utf8mb4_bin".into(),
                    "utf8mb4_bin".into(),
                ]
            })
            .collect();
        Ok(crate::session::text_rows(
            &[
                "Trigger",
                "Event",
                "Table",
                "Statement",
                "Timing",
                "Created",
                "sql_mode",
                "Definer",
                "character_set_client",
                "collation_connection",
                "Database Collation",
            ],
            rows,
        ))
    }

    /// SHOW CREATE TRIGGER [db.]name.
    pub(crate) fn show_create_trigger(&self, db: Option<String>, name: String) -> SqlResult<Outcome> {
        let (_, triggers) = self.triggers_in(db.as_deref())?;
        let (table, tr) = triggers
            .into_iter()
            .find(|(_, tr)| tr.name.eq_ignore_ascii_case(&name))
            .ok_or_else(|| SqlError::new(code::TRG_DOES_NOT_EXIST, "Trigger does not exist"))?;
        let definer = tr.definer.replace('\'', "`");
        let text = format!(
            "CREATE DEFINER={definer} TRIGGER `{}` {} {} ON `{table}` FOR EACH ROW {}",
            tr.name,
            if tr.before { "BEFORE" } else { "AFTER" },
            tr.event.as_sql(),
            tr.body
        );
        let row = vec![
            tr.name,
            SQL_MODE.into(),
            text,
            "utf8mb4".into(),
            "utf8mb4_bin".into(),
            "utf8mb4_bin".into(),
            created_text(tr.created_ms),
        ];
        Ok(crate::session::text_rows(
            &[
                "Trigger",
                "sql_mode",
                "SQL Original Statement",
                "character_set_client",
                "collation_connection",
                "Database Collation",
                "Created",
            ],
            vec![row],
        ))
    }

    /// Fires `t`'s triggers of one timing and event for one row, in creation order.
    pub(crate) async fn fire(
        &mut self,
        t: &TableRef,
        before: bool,
        event: TriggerEvent,
        mut row: RowPair<'_>,
    ) -> SqlResult<()> {
        // Borrowed from `t`, not copied: this runs for every row of a statement.
        let triggers: Vec<&Trigger> =
            t.table.triggers.iter().filter(|tr| tr.before == before && tr.event == event).collect();
        if triggers.is_empty() {
            return Ok(());
        }
        if self.trigger_tables.len() >= MAX_TRIGGER_DEPTH {
            return Err(SqlError::new(
                code::CANT_UPDATE_USED_TABLE_IN_SF_OR_TRG,
                format!("Triggers nest deeper than {MAX_TRIGGER_DEPTH} levels"),
            ));
        }
        // A trigger's statements do not change what the statement that fired it reads with,
        // nor its LAST_INSERT_ID().
        let (lock, last_id) = (self.read_lock(), self.last_insert_id);
        self.set_read_lock(shoal_client::LockMode::None);
        self.trigger_tables.push(t.table.id);
        let mut out = Ok(());
        for tr in triggers {
            out = match parse::program(&tr.body) {
                Ok(steps) => self.run_steps(&steps, t, &mut row).await,
                Err(e) => Err(e),
            };
            if out.is_err() {
                break;
            }
        }
        self.trigger_tables.pop();
        self.set_read_lock(lock);
        self.last_insert_id = last_id;
        out
    }

    fn run_steps<'a, 'r: 'a>(
        &'a mut self,
        steps: &'a [Step],
        t: &'a TableRef,
        row: &'a mut RowPair<'r>,
    ) -> StepFuture<'a> {
        Box::pin(async move {
            for step in steps {
                match step {
                    Step::Block(inner) => self.run_steps(inner, t, row).await?,
                    Step::If { arms, otherwise } => {
                        let mut taken = None;
                        for (cond, inner) in arms {
                            if self.row_value(cond, t, row).await?.truth() == Some(true) {
                                taken = Some(inner);
                                break;
                            }
                        }
                        self.run_steps(taken.unwrap_or(otherwise), t, row).await?;
                    }
                    Step::SetNew(sets) => {
                        for (col, expr) in sets {
                            let v = self.row_value(expr, t, row).await?;
                            let i = t.column(col).ok_or_else(|| SqlError::bad_field(col, "NEW"))?;
                            let c = &t.table.columns()[i];
                            // The column's own conversion, as an INSERT of the value would do.
                            let v = if v.is_null() {
                                Val::Null
                            } else {
                                t.types[i].load(&t.types[i].store(&c.name, &v, 1)?)
                            };
                            let new = row.new.as_deref_mut().ok_or_else(|| no_row(true, TriggerEvent::Delete))?;
                            new[i] = v;
                        }
                    }
                    Step::Signal { state, message, errno } => {
                        if state.starts_with("01") {
                            continue; // a warning: the statement goes on
                        }
                        let default =
                            if state.starts_with("02") { code::SIGNAL_NOT_FOUND } else { code::SIGNAL_EXCEPTION };
                        let message =
                            message.clone().unwrap_or_else(|| "Unhandled user-defined exception condition".into());
                        return Err(SqlError { code: errno.unwrap_or(default), state: static_state(state), message });
                    }
                    Step::Sql(text) => {
                        let sql = self.with_row_values(text, t, row)?;
                        let stmt = parse_one(&sql)?;
                        let target =
                            dml_target(&stmt).ok_or_else(|| SqlError::not_supported("this statement in a trigger"))?;
                        let target = self.resolve(&target).await?;
                        if self.trigger_tables.contains(&target.table.id) {
                            return Err(SqlError::new(
                                code::CANT_UPDATE_USED_TABLE_IN_SF_OR_TRG,
                                format!(
                                    "Can't update table '{}' in stored function/trigger because it is already used by \
                                     statement which invoked this stored function/trigger.",
                                    target.name
                                ),
                            ));
                        }
                        self.write_once(&stmt, &sql).await?;
                    }
                }
            }
            Ok(())
        })
    }

    /// `text` with the row's `NEW.col` / `OLD.col` as literals.
    fn with_row_values(&self, text: &str, t: &TableRef, row: &RowPair<'_>) -> SqlResult<String> {
        let refs = parse::row_refs(text)?;
        parse::replace_refs(text, &refs, |r| {
            let i =
                t.column(&r.column).ok_or_else(|| SqlError::bad_field(&r.column, if r.new { "NEW" } else { "OLD" }))?;
            let vals: &[Val] = if r.new { row.new.as_deref().map(Vec::as_slice) } else { row.old }
                .ok_or_else(|| SqlError::internal("a trigger's row reference has no row"))?;
            Ok(sql_literal(&vals[i]))
        })
    }

    /// The value of expression `text` for the row (a subquery in it reads the tables).
    async fn row_value(&mut self, text: &str, t: &TableRef, row: &RowPair<'_>) -> SqlResult<Val> {
        let sql = format!("SELECT {}", self.with_row_values(text, t, row)?);
        let Statement::Query(q) = parse_one(&sql)? else {
            return Err(SqlError::parse(format!("not an expression: {text}")));
        };
        match Box::pin(self.select(&q, &sql)).await? {
            Outcome::Rows(rs) => Ok(rs.rows.into_iter().next().and_then(|r| r.into_iter().next()).unwrap_or(Val::Null)),
            Outcome::Done { .. } => Err(SqlError::internal("an expression gave no value")),
        }
    }
}

/// What MySQL checks when it creates a trigger: which rows the body may name and change, that
/// the columns exist, and that its statements write (no result sets, no DDL).
fn check_body(ct: &CreateTrigger, t: &TableRef) -> SqlResult<()> {
    let steps = parse::program(&ct.body)?;
    check_steps(&steps, ct, t)
}

fn check_steps(steps: &[Step], ct: &CreateTrigger, t: &TableRef) -> SqlResult<()> {
    for step in steps {
        match step {
            Step::Block(inner) => check_steps(inner, ct, t)?,
            Step::If { arms, otherwise } => {
                for (cond, inner) in arms {
                    check_refs(cond, ct, t)?;
                    check_steps(inner, ct, t)?;
                }
                check_steps(otherwise, ct, t)?;
            }
            Step::SetNew(sets) => {
                if ct.event == TriggerEvent::Delete {
                    return Err(no_row(true, ct.event));
                }
                if !ct.before {
                    return Err(SqlError::new(
                        code::TRG_CANT_CHANGE_ROW,
                        "Updating of NEW row is not allowed in after trigger",
                    ));
                }
                for (col, expr) in sets {
                    t.column(col).ok_or_else(|| SqlError::bad_field(col, "NEW"))?;
                    check_refs(expr, ct, t)?;
                }
            }
            Step::Signal { .. } => {}
            Step::Sql(text) => {
                check_refs(text, ct, t)?;
                let refs = parse::row_refs(text)?;
                let stmt = parse_one(&parse::replace_refs(text, &refs, |_| Ok("NULL".into()))?)?;
                match stmt {
                    Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => {}
                    Statement::Query(_) => {
                        return Err(SqlError::new(
                            code::SP_NO_RETSET,
                            "Not allowed to return a result set from a trigger",
                        ))
                    }
                    Statement::CreateTable(_)
                    | Statement::AlterTable(_)
                    | Statement::Drop { .. }
                    | Statement::CreateIndex(_)
                    | Statement::CreateView(_)
                    | Statement::Truncate(_)
                    | Statement::RenameTable(_)
                    | Statement::StartTransaction { .. }
                    | Statement::Commit { .. }
                    | Statement::Rollback { .. } => {
                        return Err(SqlError::new(
                            code::COMMIT_NOT_ALLOWED_IN_SF_OR_TRG,
                            "Explicit or implicit commit is not allowed in stored function or trigger.",
                        ))
                    }
                    other => {
                        let head: String = other.to_string().split_whitespace().take(2).collect::<Vec<_>>().join(" ");
                        return Err(SqlError::not_supported(format!("{head} in a trigger")));
                    }
                }
            }
        }
    }
    Ok(())
}

/// NEW in a DELETE trigger, OLD in an INSERT trigger, unknown columns: refused at CREATE.
fn check_refs(text: &str, ct: &CreateTrigger, t: &TableRef) -> SqlResult<()> {
    for r in parse::row_refs(text)? {
        if (r.new && ct.event == TriggerEvent::Delete) || (!r.new && ct.event == TriggerEvent::Insert) {
            return Err(no_row(r.new, ct.event));
        }
        t.column(&r.column).ok_or_else(|| SqlError::bad_field(&r.column, if r.new { "NEW" } else { "OLD" }))?;
    }
    Ok(())
}

fn no_row(new: bool, event: TriggerEvent) -> SqlError {
    let which = if new { "NEW" } else { "OLD" };
    SqlError::new(code::TRG_NO_SUCH_ROW_IN_TRG, format!("There is no {which} row in on {} trigger", event.as_sql()))
}

/// The table an INSERT, UPDATE or DELETE writes.
fn dml_target(stmt: &Statement) -> Option<Vec<String>> {
    match stmt {
        Statement::Insert(ins) => match &ins.table {
            ast::TableObject::TableName(n) => Some(object_parts(n)),
            _ => None,
        },
        Statement::Update(u) => match &u.table.relation {
            ast::TableFactor::Table { name, .. } => Some(object_parts(name)),
            _ => None,
        },
        Statement::Delete(d) => {
            let from = match &d.from {
                ast::FromTable::WithFromKeyword(f) | ast::FromTable::WithoutKeyword(f) => f,
            };
            match from.first().map(|f| &f.relation) {
                Some(ast::TableFactor::Table { name, .. }) => Some(object_parts(name)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `sql_mode` as SHOW TRIGGERS reports it (Shoal runs strict, as MySQL 8's default).
pub(crate) const SQL_MODE: &str = "STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION";

/// `YYYY-MM-DD hh:mm:ss.cc` (UTC) of wall-clock milliseconds.
pub(crate) fn created_text(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (y, m, d) = crate::sql::func::civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:02}", s / 3600, s / 60 % 60, s % 60, ms % 1000 / 10)
}

/// Most distinct SQLSTATEs SIGNAL keeps (an error's state is a `&'static str`); past that a
/// new one is reported as HY000.
const MAX_SIGNAL_STATES: usize = 256;

/// A SIGNAL's SQLSTATE as a `&'static str`: each distinct value is kept once, at most
/// `MAX_SIGNAL_STATES` of them.
fn static_state(state: &str) -> &'static str {
    if state == "45000" {
        return "45000";
    }
    static STATES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut known = STATES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = known.get(state) {
        return s;
    }
    if known.len() >= MAX_SIGNAL_STATES {
        return "HY000";
    }
    let s: &'static str = Box::leak(state.to_string().into_boxed_str());
    known.insert(s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_is_a_utc_datetime_with_hundredths() {
        assert_eq!(created_text(0), "1970-01-01 00:00:00.00");
        assert_eq!(created_text(1_700_000_000_123), "2023-11-14 22:13:20.12");
    }

    #[test]
    fn signal_states_are_kept_once() {
        assert_eq!(static_state("45000"), "45000");
        let a = static_state("HY123");
        assert!(std::ptr::eq(a, static_state("HY123")));
    }
}

//! One client connection's state and statement dispatch: session statements, databases, SHOW,
//! DDL here; queries and DML in [`crate::exec`].
//!
//! **Databases** are catalog entries: database `d` is a marker table named `$db.d` (a name SQL
//! cannot produce: database names starting with `$` are refused), and table `t` of `d` is the
//! catalog table `d.t`. The catalog is replicated by mgmd's Raft log, so databases survive
//! restarts like tables do. Names compare case-insensitively (the catalog does).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use shoal_client::Client;
use shoal_proto::hash::IdMap;
use shoal_proto::{
    AccountName, Column, ColumnType, ErrorCode, IndexSpec, Table, TableId, TableSpec, Value, MAX_NAME_BYTES,
};
use sqlparser::ast::{self, ColumnOption, Statement, TableConstraint};
use sqlparser::tokenizer::Location;

use crate::error::{code, SqlError, SqlResult};
use crate::sql::bind::{system_variable, Binder, Env, Params, TableRef, SHOWN_VARIABLES};
use crate::sql::parse::{self, Admin, TxnControl};
use crate::types::{SqlType, WireType};
use crate::val::{like, Val};

/// The server version string clients see.
pub const VERSION: &str = "8.0.36-shoal";
/// Prefix of the catalog marker tables that record databases.
pub const DB_MARKER_PREFIX: &str = "$db.";
/// How often a write outside a transaction that failed whole (see `implicit_retry`) is run again.
const IMPLICIT_RETRIES: u32 = 20;

/// State shared by every session of one SQL node.
pub struct Shared {
    pub client: Client,
    /// AUTO_INCREMENT: the next value this SQL node hands out, per table.
    pub autoinc: Mutex<IdMap<TableId, u64>>,
    next_connection: AtomicU32,
    /// The catalog's user table as last loaded (None before the first load), see `users.rs`.
    pub(crate) users: parking_lot::RwLock<Option<Arc<shoal_client::users::Users>>>,
    /// Held while the user table is reloaded, so concurrent logins wait for one load; holds
    /// when the last reload failed.
    pub(crate) users_refresh: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Tables as SQL sees them (`Session::table_ref`): at most one entry per table of the map.
    tables: parking_lot::Mutex<PerMap<String, TableRef>>,
    /// Prepared statements every connection of this SQL node shares (`Session::prepare`).
    prepared: parking_lot::Mutex<PerMap<PreparedKey, SharedPrepared>>,
}

/// Entries made from one cluster map: any new map empties it, so an entry never outlives the
/// catalog it was made from (DDL, failover, whatever mgmd pushes).
struct PerMap<K, V> {
    map: Option<Arc<shoal_proto::ClusterState>>,
    entries: HashMap<K, V>,
}

impl<K, V> Default for PerMap<K, V> {
    fn default() -> Self {
        PerMap { map: None, entries: HashMap::new() }
    }
}

impl<K, V> PerMap<K, V> {
    /// The entries made from `map`, emptied first if they were made from another.
    fn of(&mut self, map: &Arc<shoal_proto::ClusterState>) -> &mut HashMap<K, V> {
        if !self.map.as_ref().is_some_and(|m| Arc::ptr_eq(m, map)) {
            self.entries.clear();
            self.map = Some(map.clone());
        }
        &mut self.entries
    }

    /// The entries, if they were made from `map` (else nothing: `map` is out of date).
    fn of_current(&mut self, map: &Arc<shoal_proto::ClusterState>) -> Option<&mut HashMap<K, V>> {
        self.map.as_ref().is_some_and(|m| Arc::ptr_eq(m, map)).then_some(&mut self.entries)
    }
}

/// What PREPARE made of a statement text in a current database (`PreparedKey`), for one
/// cluster map ([`PerMap`]), shared by every connection of the SQL node: the statement and the
/// result columns PREPARE announced. A thousand sysbench connections prepare the same
/// statements: PREPARE of a SELECT runs it once to learn its columns, a data-node round trip
/// that a shared statement skips (1024 sysbench threads connected, prepared
/// `oltp_read_write`'s statements and ran one second in 4.32–4.43 s instead of 5.90–6.11), and
/// every execution reads its prepared statement, one copy in the CPU's caches where there were
/// a thousand (0.3–0.6 µs less user CPU per point select; benchmarks.md, "Thirty-fifth
/// session"). At most [`PREPARED_CACHE_ENTRIES`] entries, of texts up to
/// [`PREPARED_CACHE_TEXT_BYTES`] (what a connection left behind is bounded); when full, it
/// starts over.
type SharedPrepared = (Arc<Prepared>, Arc<[ColumnMeta]>);

/// The current database and the statement's text.
type PreparedKey = (Option<String>, String);

const PREPARED_CACHE_ENTRIES: usize = 1024;
const PREPARED_CACHE_TEXT_BYTES: usize = 4096;

impl Shared {
    pub fn new(client: Client, node_id: u32) -> Shared {
        Shared {
            client,
            autoinc: Mutex::new(IdMap::default()),
            next_connection: AtomicU32::new((node_id & 0xff) << 24 | 1),
            users: parking_lot::RwLock::new(None),
            users_refresh: tokio::sync::Mutex::new(None),
            tables: parking_lot::Mutex::new(PerMap::default()),
            prepared: parking_lot::Mutex::new(PerMap::default()),
        }
    }

    pub fn next_connection_id(&self) -> u32 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }
}

/// Metadata of one result column.
#[derive(Clone, Debug, Default)]
pub struct ColumnMeta {
    pub name: String,
    pub org_name: String,
    pub table: String,
    pub org_table: String,
    pub db: String,
    /// None: decided from the values.
    pub ty: Option<WireType>,
    pub not_null: bool,
    pub primary_key: bool,
    pub auto_increment: bool,
}

impl ColumnMeta {
    pub fn named(name: &str, ty: Option<WireType>) -> ColumnMeta {
        ColumnMeta { name: name.to_string(), org_name: name.to_string(), ty, ..ColumnMeta::default() }
    }
}

#[derive(Clone, Debug, Default)]
pub struct ResultSet {
    /// Shared: a prepared point select hands out the columns it announced at PREPARE on every
    /// execution (cloned, they were five strings per column each time).
    pub columns: Arc<[ColumnMeta]>,
    pub rows: Vec<Vec<Val>>,
}

#[derive(Clone, Debug)]
pub enum Outcome {
    Rows(ResultSet),
    Done { affected: u64, last_insert_id: u64, info: String },
}

impl Outcome {
    pub fn ok() -> Outcome {
        Outcome::Done { affected: 0, last_insert_id: 0, info: String::new() }
    }
    pub fn affected(n: u64) -> Outcome {
        Outcome::Done { affected: n, last_insert_id: 0, info: String::new() }
    }
}

/// A prepared statement: its text and where its `?` are.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub sql: String,
    pub placeholders: Vec<usize>,
    /// Set when the statement is a point select (`point.rs`): executions skip the planner.
    pub point: Option<Arc<crate::point::PointSelect>>,
    /// A query or DML statement parsed once at PREPARE, its `?` left in place: executions bind
    /// each to its value (`Env::params`) instead of writing the values into the text and
    /// parsing it again (parsing was 6% of a SQL node's CPU on sysbench `oltp_read_write`).
    pub parsed: Option<Box<Statement>>,
    /// Where each `?` stands in `sql`, as the parsed statement's spans say it.
    pub param_at: Vec<Location>,
}

pub struct Session {
    pub shared: Arc<Shared>,
    /// The open cluster transaction (BEGIN, or autocommit off), see `txn.rs`.
    pub txn: tokio::sync::Mutex<Option<shoal_client::Transaction>>,
    /// The lock the running statement's reads take inside a transaction (`txn::lock_code`).
    pub read_lock: std::sync::atomic::AtomicU8,
    /// The cluster connection at this session's durability (`SET shoal_durability`).
    client: Client,
    pub db: Option<String>,
    /// The user name the client logged in with.
    pub user: String,
    /// The account that login matched (`'user'@'host pattern'`): what privileges belong to.
    pub account: AccountName,
    /// The client's address, as USER() and access-denied messages show it.
    pub host: String,
    /// The running statement's command, for 1142 messages ("SELECT command denied ...").
    pub command: &'static str,
    pub connection_id: u32,
    pub last_insert_id: u64,
    pub row_count: i64,
    pub found_rows: u64,
    pub autocommit: bool,
    /// `SET cte_max_recursion_depth`; None: MySQL's default.
    pub cte_max_recursion_depth: Option<u64>,
    pub in_transaction: bool,
    /// A write happened since BEGIN (it is committed already: see `TxnControl::Rollback`).
    pub wrote_in_transaction: bool,
    /// SQL SAVEPOINTs: name, the transaction's id, its savepoint number there (see
    /// `crate::txn`), in the order set.
    pub savepoints: Vec<(String, u64, u64)>,
    /// The client asked for "found rows" instead of "changed rows" in UPDATE counts.
    pub client_found_rows: bool,
    pub prepared: IdMap<u32, Arc<Prepared>>,
    next_statement: u32,
    /// The running prepared statement's placeholder values (see `Prepared::parsed`).
    params: Params,
    /// Tables whose triggers are running, outermost first: a trigger's statement may not
    /// write them (1442), and their count bounds triggers firing triggers.
    pub trigger_tables: Vec<u32>,
}

/// Most prepared statements one connection may hold.
pub const MAX_PREPARED_PER_CONNECTION: usize = 16_384;

pub fn object_parts(name: &ast::ObjectName) -> Vec<String> {
    name.0
        .iter()
        .map(|p| match p {
            ast::ObjectNamePart::Identifier(i) => i.value.clone(),
            other => other.to_string(),
        })
        .collect()
}

pub(crate) fn check_ident(kind: &str, name: &str) -> SqlResult<()> {
    if name.len() > MAX_NAME_BYTES {
        return Err(SqlError::new(code::TOO_LONG_IDENT, format!("Identifier name '{name}' is too long")));
    }
    if name.is_empty() || name.ends_with(' ') || name.chars().any(|c| c.is_control()) {
        return Err(SqlError::new(code::PARSE, format!("Incorrect {kind} name '{name}'")));
    }
    Ok(())
}

pub(crate) fn like_filter(like_pat: &Option<String>, s: &str) -> bool {
    like_pat.as_ref().is_none_or(|p| crate::val::like(&s.to_lowercase(), &p.to_lowercase(), '\\'))
}

pub(crate) fn text_rows(names: &[&str], rows: Vec<Vec<String>>) -> Outcome {
    Outcome::Rows(ResultSet {
        columns: names.iter().map(|n| ColumnMeta::named(n, Some(WireType::Str { len: 256 }))).collect(),
        rows: rows.into_iter().map(|r| r.into_iter().map(Val::Str).collect()).collect(),
    })
}

fn opt_text(v: Option<String>) -> Val {
    v.map_or(Val::Null, Val::Str)
}

impl Session {
    /// A session of `user` whose calls go through `client` (its worker's links, see `workers`).
    pub fn new(shared: Arc<Shared>, client: Client, user: String, client_found_rows: bool) -> Session {
        let connection_id = shared.next_connection_id();
        Session {
            txn: tokio::sync::Mutex::new(None),
            read_lock: std::sync::atomic::AtomicU8::new(0),
            client,
            shared,
            db: None,
            account: AccountName::new(&user, "%"),
            trigger_tables: vec![],
            user,
            host: "localhost".to_string(),
            command: "SELECT",
            connection_id,
            last_insert_id: 0,
            row_count: -1,
            found_rows: 0,
            autocommit: true,
            cte_max_recursion_depth: None,
            in_transaction: false,
            wrote_in_transaction: false,
            savepoints: vec![],
            client_found_rows,
            prepared: IdMap::default(),
            next_statement: 1,
            params: Params::default(),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn env(&self) -> Env {
        Env {
            db: self.db.clone(),
            user: self.user.clone(),
            host: self.host.clone(),
            current_user: format!("{}@{}", self.account.name, self.account.host),
            connection_id: self.connection_id,
            last_insert_id: self.last_insert_id,
            row_count: self.row_count,
            found_rows: self.found_rows,
            autocommit: self.autocommit,
            cte_max_recursion_depth: self.cte_max_recursion_depth,
            version: VERSION.to_string(),
            now_secs: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            params: self.params.clone(),
        }
    }

    // ----- catalog -----

    pub fn databases(&self) -> Vec<String> {
        let map = self.client().map();
        let mut dbs: Vec<String> =
            map.tables.iter().filter_map(|t| t.spec.name.strip_prefix(DB_MARKER_PREFIX).map(str::to_string)).collect();
        dbs.sort_by_key(|d| d.to_lowercase());
        dbs
    }

    pub fn db_exists(&self, db: &str) -> bool {
        self.client().map().table(&format!("{DB_MARKER_PREFIX}{db}")).is_some()
    }

    /// The database a statement means: the one it names, else the current one.
    pub fn db_for(&self, explicit: Option<&str>) -> SqlResult<String> {
        match explicit {
            Some(d) => Ok(d.to_string()),
            None => self.db.clone().ok_or_else(|| SqlError::new(code::NO_DB, "No database selected")),
        }
    }

    /// Tables of one database: (name, catalog table).
    /// The tables of `db` a user sees: without the copies an ALTER TABLE is making and the
    /// hidden tables of unique indexes.
    pub fn user_tables_in(&self, db: &str) -> Vec<(String, Table)> {
        let mut out = self.tables_in(db);
        out.retain(|(name, _)| !is_internal_table(name));
        out
    }

    /// Every table of `db`, ALTER TABLE copies included (DROP DATABASE drops them too).
    pub fn tables_in(&self, db: &str) -> Vec<(String, Table)> {
        let map = self.client().map();
        let prefix = format!("{}.", db.to_lowercase());
        let mut out: Vec<(String, Table)> = map
            .tables
            .iter()
            .filter(|t| !t.spec.name.starts_with(DB_MARKER_PREFIX) && t.spec.name.to_lowercase().starts_with(&prefix))
            .map(|t| (t.spec.name[prefix.len()..].to_string(), t.clone()))
            .collect();
        out.sort_by_key(|(n, _)| n.to_lowercase());
        out
    }

    /// Finds a table by its SQL name (`t` or `db.t`).
    pub async fn resolve(&self, parts: &[String]) -> SqlResult<TableRef> {
        let (db, name) = match parts {
            [t] => (self.db_for(None)?, t.clone()),
            [d, t] => (d.clone(), t.clone()),
            _ => return Err(SqlError::parse(format!("bad table name {}", parts.join(".")))),
        };
        // Privileges first: whether a table exists is no business of who may not use it.
        self.check_table(&db, &name)?;
        if is_internal_table(&name) {
            return Err(SqlError::no_such_table(&db, &name));
        }
        if let Some(t) = self.table_ref(&db, &name) {
            return Ok(t);
        }
        // Another SQL node may have just created it.
        let _ = self.client().refresh().await;
        self.table_ref(&db, &name).ok_or_else(|| SqlError::no_such_table(&db, &name))
    }

    /// The table `db.name` of the current cluster map as SQL sees it, under its catalog
    /// spelling (which may differ in case from the query's). Made once per table and map: a
    /// statement clones it (reference counts) instead of copying the catalog entry and parsing
    /// every column's type again.
    pub fn table_ref(&self, db: &str, name: &str) -> Option<TableRef> {
        let map = self.client().map();
        let mut full = format!("{db}.{name}");
        full.make_ascii_lowercase();
        let mut cache = self.shared.tables.lock();
        let cache = cache.of(&map);
        if let Some(t) = cache.get(&full) {
            return Some(t.clone());
        }
        let table = map.table(&full)?;
        let (real_db, real) = table.spec.name.split_once('.').unwrap_or((db, name));
        let t = TableRef::new(real_db, real, table.clone());
        cache.insert(full, t.clone());
        Some(t)
    }

    // ----- dispatch -----

    /// Runs one statement of COM_QUERY.
    pub async fn query(&mut self, sql: &str) -> SqlResult<Outcome> {
        self.begin_statement(sql, Params::default()).await?;
        // Queries and DML (nearly every statement) go straight to sqlparser: the admin
        // statements and CREATE TABLE … PARTITION BY that `classify` and
        // `split_partition_by` look for (each tokenizing the text once more) start otherwise.
        let out = if parse::is_query_or_dml(sql) {
            let stmt = Box::new(parse::parse_one(sql)?);
            self.statement(&stmt, sql).await
        } else if let Some(a) = parse::bare_transaction_control(sql) {
            // Boxed on its own: `other`'s future holds every admin arm (16 KB), and boxing it
            // copied those bytes twice per sysbench transaction (BEGIN, COMMIT), 1.2% of the
            // SQL node's instructions.
            Box::pin(self.transaction_control(a)).await
        } else {
            // Boxed, like the rare statements in `statement` (see there).
            Box::pin(self.other(sql)).await
        };
        self.end_statement(out)
    }

    /// What every statement does first: privilege checks use the user cache, brought up to the
    /// map's version once here; `params` are the values of its placeholders (none outside
    /// prepared statements: a `?` in a plain query is an error, not an earlier value).
    async fn begin_statement(&mut self, sql: &str, params: Params) -> SqlResult<()> {
        self.params = params;
        if let Err(e) = self.shared.users().await {
            return Err(SqlError::from_cluster(&e));
        }
        self.command = command_of(sql);
        Ok(())
    }

    /// ROW_COUNT() after a statement.
    fn end_statement(&mut self, out: SqlResult<Outcome>) -> SqlResult<Outcome> {
        if let Ok(Outcome::Done { affected, .. }) = &out {
            self.row_count = *affected as i64;
        } else if out.is_ok() {
            self.row_count = -1;
        }
        out
    }

    /// A statement that is not a query or DML: admin statements, DDL, EXPLAIN, ...
    async fn other(&mut self, sql: &str) -> SqlResult<Outcome> {
        match parse::classify(sql)? {
            Some(admin) => self.admin(admin).await,
            None => match parse::split_partition_by(sql)? {
                // CREATE TABLE … PARTITION BY KEY (cols): sqlparser takes the rest.
                Some((rest, cols)) => match parse::parse_one(&rest)? {
                    Statement::CreateTable(ct) => self.create_table(&ct, &cols).await,
                    _ => Err(SqlError::parse("PARTITION BY belongs to CREATE TABLE")),
                },
                None => {
                    let stmt = parse::parse_one(sql).map_err(|e| parse::unparsed_form(sql).unwrap_or(e))?;
                    self.statement(&Box::new(stmt), sql).await
                }
            },
        }
    }

    /// Runs a parsed statement. Callers keep it boxed (a `Statement` is 3.4 KB) and the rare
    /// kinds run in a boxed future of their own: every statement's future is moved by value a
    /// few times on its way to the connection task, and an async fn's future holds its largest
    /// arm and whatever it keeps across awaits. Inline, the statement and the DDL, EXPLAIN and
    /// transaction-control arms made every SELECT's future 43 KB, and copying it took 2-3% of a
    /// SQL node's CPU.
    async fn statement(&mut self, stmt: &Statement, sql: &str) -> SqlResult<Outcome> {
        match stmt {
            Statement::Query(q) => self.select(q, sql).await,
            // A write that failed whole outside a transaction — it raced with an ALTER TABLE
            // (1412), or the cluster rolled its own transaction back (1213: a partition moved
            // under it, a deadlock) — is planned and run again.
            Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => {
                // Inside a transaction a statement that fails takes back what it wrote, and
                // only that (outside, its own transaction is rolled back whole).
                let savepoint = self.statement_savepoint().await;
                let mut attempt = 0;
                let out = loop {
                    let out = self.write_once(stmt, sql).await;
                    if !self.implicit_retry(&mut attempt, &out).await {
                        self.note_write();
                        break out;
                    }
                };
                match (out, savepoint) {
                    (Err(e), Some(sp)) => Err(self.undo_statement(sp, e).await),
                    (out, _) => out,
                }
            }
            _ => Box::pin(self.rare_statement(Box::new(stmt.clone()), sql)).await,
        }
    }

    /// The statements other than queries and DML (see `statement`).
    async fn rare_statement(&mut self, stmt: Box<Statement>, sql: &str) -> SqlResult<Outcome> {
        match *stmt {
            Statement::CreateTable(ct) => self.create_table(&ct, &[]).await,
            Statement::Drop { object_type: ast::ObjectType::Table, if_exists, names, temporary: false, .. } => {
                self.drop_tables(&names, if_exists).await
            }
            Statement::CreateView(cv) => self.create_view(&cv, sql).await,
            Statement::Drop { object_type: ast::ObjectType::View, if_exists, names, .. } => {
                self.drop_views(&names, if_exists).await
            }
            Statement::Drop {
                object_type: ast::ObjectType::Schema | ast::ObjectType::Database,
                if_exists,
                names,
                ..
            } if names.len() == 1 => {
                let name = object_parts(&names[0]).join(".");
                self.admin(Admin::DropDatabase { name, if_exists }).await
            }
            Statement::Explain { statement, .. } => self.explain(*statement).await,
            Statement::Truncate(tr) => {
                // Deletes every row (no atomic swap to an empty table yet).
                for target in &tr.table_names {
                    let t = self.resolve(&object_parts(&target.name)).await?;
                    self.delete_matching(&t, None, None).await?;
                }
                self.note_write();
                Ok(Outcome::ok())
            }
            Statement::CreateIndex(ci) => {
                let t = self.resolve(&object_parts(&ci.table_name)).await?;
                let name = ci.name.as_ref().map(|n| object_parts(n).join("."));
                if ci.unique {
                    // Existing rows are checked and entered by a copy of the table.
                    let taken =
                        name.as_ref().is_some_and(|n| t.table.indexes.iter().any(|i| i.name.eq_ignore_ascii_case(n)));
                    if taken && ci.if_not_exists {
                        return Ok(Outcome::ok());
                    }
                    let op = crate::alter::add_unique(name, ci.columns.clone());
                    self.alter_by_copy(&t, &[op]).await?;
                } else {
                    self.add_index(&t, name, &ci.columns, ci.if_not_exists).await?;
                }
                Ok(Outcome::ok())
            }
            Statement::Drop { object_type: ast::ObjectType::Index, if_exists, names, table: Some(table), .. }
                if names.len() == 1 =>
            {
                let t = self.resolve(&object_parts(&table)).await?;
                self.remove_index(&t, &object_parts(&names[0]).join("."), if_exists).await?;
                Ok(Outcome::ok())
            }
            Statement::AlterTable(at) => self.alter_table(&at).await,
            Statement::RenameTable(pairs) => {
                let pairs: Vec<_> =
                    pairs.iter().map(|r| (object_parts(&r.old_name), object_parts(&r.new_name))).collect();
                self.rename_tables(&pairs).await?;
                Ok(Outcome::ok())
            }
            Statement::StartTransaction { .. } => self.transaction_control(TxnControl::Begin).await,
            Statement::Commit { .. } => self.transaction_control(TxnControl::Commit).await,
            Statement::Rollback { savepoint: None, .. } => self.transaction_control(TxnControl::Rollback).await,
            other => {
                let text = other.to_string();
                let head: String = text.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
                Err(SqlError::not_supported(head))
            }
        }
    }

    /// One attempt at INSERT / UPDATE / DELETE.
    pub(crate) async fn write_once(&mut self, stmt: &Statement, sql: &str) -> SqlResult<Outcome> {
        match stmt {
            // UPDATE, DELETE and INSERT … ON DUPLICATE KEY UPDATE read rows and write what they
            // computed from them: they lock the rows they read, inside the session's transaction
            // or (autocommit) one of their own, so no concurrent writer can slip in between
            // (`k = k + 1` from two sessions never loses one) and the statement is atomic.
            Statement::Insert(ins) if ins.on.is_some() => {
                let implicit = self.begin_implicit().await;
                self.set_read_lock(shoal_client::LockMode::Exclusive);
                let out = self.insert(ins, sql).await;
                self.set_read_lock(shoal_client::LockMode::None);
                self.end_implicit(implicit, out).await
            }
            Statement::Insert(ins) => self.insert(ins, sql).await,
            // One row named by its whole primary key, literal values: a single key write,
            // atomic by itself, needs neither the read nor a transaction of its own.
            Statement::Update(u) => {
                let b = self.bind_update(u).await?;
                if let Some(out) = self.update_by_key(&b).await {
                    return out;
                }
                let implicit = self.begin_implicit().await;
                self.set_read_lock(shoal_client::LockMode::Exclusive);
                let out = self.run_update(b).await;
                self.set_read_lock(shoal_client::LockMode::None);
                self.end_implicit(implicit, out).await
            }
            Statement::Delete(d) => {
                let b = self.bind_delete(d).await?;
                if let Some(out) = self.delete_by_key(&b).await {
                    return out;
                }
                let implicit = self.begin_implicit().await;
                self.set_read_lock(shoal_client::LockMode::Exclusive);
                let out = self.run_delete(b).await;
                self.set_read_lock(shoal_client::LockMode::None);
                self.end_implicit(implicit, out).await
            }
            _ => Err(SqlError::internal("not a write statement")),
        }
    }

    /// Whether to run a write again: it failed whole, with 1412 (it raced with an ALTER TABLE)
    /// or 1213 (the cluster rolled back the statement's own transaction, so nothing of it took
    /// effect); it ran outside any transaction of the user's (one would have lost its work);
    /// and it has not tried too often.
    async fn implicit_retry(&self, attempt: &mut u32, out: &SqlResult<Outcome>) -> bool {
        let again = |e: &SqlError| e.code == code::TABLE_DEF_CHANGED || e.code == code::LOCK_DEADLOCK;
        if *attempt >= IMPLICIT_RETRIES || !matches!(out, Err(e) if again(e)) {
            return false;
        }
        if self.in_transaction || !self.autocommit || self.txn.lock().await.is_some() {
            return false;
        }
        *attempt += 1;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let _ = self.client().refresh().await;
        true
    }

    fn note_write(&mut self) {
        if self.in_transaction {
            self.wrote_in_transaction = true;
        }
    }

    async fn transaction_control(&mut self, c: TxnControl) -> SqlResult<Outcome> {
        self.savepoints.clear();
        let r = match c {
            TxnControl::Begin => {
                self.txn_begin().await?;
                self.in_transaction = true;
                self.wrote_in_transaction = false;
                return Ok(Outcome::ok());
            }
            TxnControl::Commit => self.txn_commit().await,
            TxnControl::Rollback => self.txn_rollback().await,
        };
        self.in_transaction = !self.autocommit;
        self.wrote_in_transaction = false;
        r.map(|()| Outcome::ok())
    }

    async fn admin(&mut self, a: Admin) -> SqlResult<Outcome> {
        match a {
            Admin::Empty => Err(SqlError::new(code::PARSE, "Query was empty")),
            Admin::Account(stmt) => self.account_statement(stmt).await,
            Admin::CreateTrigger(sql) => Box::pin(self.create_trigger(&sql)).await,
            Admin::DropTrigger { db, name, if_exists } => self.drop_trigger(db, name, if_exists).await,
            Admin::ShowTriggers { db, like } => self.show_triggers(db, like),
            Admin::ShowCreateTrigger { db, name } => self.show_create_trigger(db, name),
            Admin::RenameIndex { db, table, from, to } => {
                let t = self.resolve(&table_parts(db, table)).await?;
                self.rename_index(&t, &from, &to).await?;
                Ok(Outcome::ok())
            }
            Admin::Set(vars) => {
                for (name, value) in vars {
                    if name == "shoal_durability" {
                        // When writes are acknowledged: in memory on every replica (default), or
                        // on disk everywhere, once their global checkpoint completes ('sync').
                        let v = value.trim_matches(|c| c == '\'' || c == '"').to_ascii_lowercase();
                        let d = match v.as_str() {
                            "sync" => shoal_client::Durability::Sync,
                            "memory" | "default" => shoal_client::Durability::Memory,
                            _ => {
                                return Err(SqlError::new(
                                    code::WRONG_VALUE_FOR_VAR,
                                    format!("Variable 'shoal_durability' can't be set to the value of '{v}'"),
                                ))
                            }
                        };
                        self.client = self.client.with_durability(d);
                    }
                    if name == "cte_max_recursion_depth" {
                        let v = value.trim_matches(|c| c == '\'' || c == '"');
                        self.cte_max_recursion_depth = if v.eq_ignore_ascii_case("default") {
                            None
                        } else {
                            // MySQL's range for it; a value past it is refused, not clipped.
                            Some(u64::from(v.parse::<u32>().map_err(|_| {
                                SqlError::new(
                                    code::WRONG_VALUE_FOR_VAR,
                                    format!("Variable 'cte_max_recursion_depth' can't be set to the value of '{v}'"),
                                )
                            })?))
                        };
                    }
                    if name == "autocommit" {
                        let v = value.trim_matches('\'').to_ascii_lowercase();
                        self.autocommit = !matches!(v.as_str(), "0" | "off" | "false");
                        if !self.autocommit {
                            self.in_transaction = true;
                        } else {
                            // Turning autocommit on commits the open transaction (MySQL).
                            self.txn_commit().await?;
                            self.in_transaction = false;
                        }
                    }
                }
                Ok(Outcome::ok())
            }
            Admin::Use(db) => {
                self.use_db(&db).await?;
                Ok(Outcome::ok())
            }
            Admin::Txn(c) => self.transaction_control(c).await,
            Admin::Savepoint(op) => self.savepoint_statement(op).await,
            Admin::CreateDatabase { name, if_not_exists } => {
                check_ident("database", &name)?;
                self.check_db(&name)?;
                if name.starts_with('$') {
                    return Err(SqlError::new(code::PARSE, format!("Incorrect database name '{name}'")));
                }
                if self.db_exists(&name) {
                    if if_not_exists {
                        return Ok(Outcome::ok());
                    }
                    return Err(SqlError::new(
                        code::DB_CREATE_EXISTS,
                        format!("Can't create database '{name}'; database exists"),
                    ));
                }
                let spec = TableSpec {
                    name: format!("{DB_MARKER_PREFIX}{name}"),
                    columns: vec![Column::new("created", ColumnType::Bool).nullable()],
                    primary_key: vec![],
                    partition_key: vec![],
                };
                match self.client().create_table(spec, if_not_exists).await {
                    Ok(_) => Ok(Outcome::affected(1)),
                    Err(e) if e.code == ErrorCode::TableExists => Err(SqlError::new(
                        code::DB_CREATE_EXISTS,
                        format!("Can't create database '{name}'; database exists"),
                    )),
                    Err(e) => Err(SqlError::from_cluster(&e)),
                }
            }
            Admin::DropDatabase { name, if_exists } => {
                self.check_db(&name)?;
                if !self.db_exists(&name) {
                    if if_exists {
                        return Ok(Outcome::ok());
                    }
                    return Err(SqlError::new(
                        code::DB_DROP_EXISTS,
                        format!("Can't drop database '{name}'; database doesn't exist"),
                    ));
                }
                self.drop_views_in(&name).await?;
                let tables = self.tables_in(&name);
                for (_, t) in &tables {
                    self.client().drop_table(&t.spec.name, true).await.map_err(|e| SqlError::from_cluster(&e))?;
                }
                self.client()
                    .drop_table(&format!("{DB_MARKER_PREFIX}{name}"), true)
                    .await
                    .map_err(|e| SqlError::from_cluster(&e))?;
                if self.db.as_deref().is_some_and(|d| d.eq_ignore_ascii_case(&name)) {
                    self.db = None;
                }
                Ok(Outcome::affected(tables.len() as u64))
            }
            Admin::ShowDatabases { like: pat } => {
                let rows =
                    self.visible_databases().into_iter().filter(|d| like_filter(&pat, d)).map(|d| vec![d]).collect();
                Ok(text_rows(&["Database"], rows))
            }
            Admin::ShowTables { db, full, like: pat } => {
                let db = self.db_for(db.as_deref())?;
                self.check_db(&db)?;
                if !self.db_exists(&db) {
                    return Err(SqlError::bad_db(&db));
                }
                let title = format!("Tables_in_{db}");
                let mut named: Vec<(String, &str)> =
                    self.user_tables_in(&db).into_iter().map(|(n, _)| (n, "BASE TABLE")).collect();
                named.extend(self.views_in(&db).await?.into_iter().map(|v| (v.name, "VIEW")));
                named.sort_by_key(|(n, _)| n.to_lowercase());
                let rows: Vec<Vec<String>> = named
                    .into_iter()
                    .filter(|(n, _)| like_filter(&pat, n))
                    .map(|(n, kind)| if full { vec![n, kind.into()] } else { vec![n] })
                    .collect();
                if full {
                    Ok(text_rows(&[&title, "Table_type"], rows))
                } else {
                    Ok(text_rows(&[&title], rows))
                }
            }
            Admin::ShowColumns { db, table, full } => {
                let t = self.resolve(&table_parts(db, table)).await?;
                Ok(describe(&t, full))
            }
            Admin::ShowCreateTable { db, table } => {
                let t = self.resolve(&table_parts(db, table)).await?;
                Ok(text_rows(&["Table", "Create Table"], vec![vec![t.name.clone(), show_create(&t)]]))
            }
            Admin::ShowCreateDatabase(db) => {
                self.check_db(&db)?;
                if !self.db_exists(&db) {
                    return Err(SqlError::bad_db(&db));
                }
                let text =
                    format!("CREATE DATABASE `{db}` /*!40100 DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin */");
                Ok(text_rows(&["Database", "Create Database"], vec![vec![db, text]]))
            }
            Admin::ShowIndex { db, table } => {
                let t = self.resolve(&table_parts(db, table)).await?;
                let mut rows = vec![];
                if !t.table.hidden_pk {
                    for (seq, &k) in t.table.spec.primary_key.iter().enumerate() {
                        rows.push(vec![
                            t.name.clone(),
                            "0".into(),
                            "PRIMARY".into(),
                            (seq + 1).to_string(),
                            t.col_name(k as usize).to_string(),
                            "HASH".into(),
                        ]);
                    }
                }
                // Ordered indexes (the ordered copy of PRIMARY is part of PRIMARY above).
                for ix in t.table.indexes.iter().filter(|i| i.name != IndexSpec::PRIMARY) {
                    for (seq, &c) in ix.columns.iter().enumerate() {
                        rows.push(vec![
                            t.name.clone(),
                            if ix.unique { "0" } else { "1" }.into(),
                            ix.name.clone(),
                            (seq + 1).to_string(),
                            t.col_name(c as usize).to_string(),
                            "BTREE".into(),
                        ]);
                    }
                }
                Ok(text_rows(&["Table", "Non_unique", "Key_name", "Seq_in_index", "Column_name", "Index_type"], rows))
            }
            Admin::ShowWarnings => Ok(text_rows(&["Level", "Code", "Message"], vec![])),
            Admin::ShowVariables { like: pat } => {
                let env = self.env();
                let rows = SHOWN_VARIABLES
                    .iter()
                    .filter(|n| like_filter(&pat, n))
                    .map(|n| {
                        let v = system_variable(&env, n).and_then(|v| v.to_string_lossy()).unwrap_or_default();
                        vec![n.to_string(), v]
                    })
                    .collect();
                Ok(text_rows(&["Variable_name", "Value"], rows))
            }
            Admin::ShowStatus => Ok(text_rows(&["Variable_name", "Value"], vec![])),
            Admin::ShowEngines => Ok(text_rows(
                &["Engine", "Support", "Comment", "Transactions", "XA", "Savepoints"],
                vec![vec![
                    "ndbcluster".into(),
                    "DEFAULT".into(),
                    "Shoal: distributed, in-memory, replicated".into(),
                    "YES".into(),
                    "NO".into(),
                    "YES".into(),
                ]],
            )),
            Admin::ShowCollation => Ok(text_rows(
                &["Collation", "Charset", "Id", "Default", "Compiled", "Sortlen"],
                vec![vec!["utf8mb4_bin".into(), "utf8mb4".into(), "46".into(), "Yes".into(), "Yes".into(), "1".into()]],
            )),
            Admin::ShowCharset => Ok(text_rows(
                &["Charset", "Description", "Default collation", "Maxlen"],
                vec![vec!["utf8mb4".into(), "UTF-8 Unicode".into(), "utf8mb4_bin".into(), "4".into()]],
            )),
            Admin::ShowProcesslist => Ok(Outcome::Rows(ResultSet {
                columns: ["Id", "User", "Host", "db", "Command", "Time", "State", "Info"]
                    .iter()
                    .map(|n| ColumnMeta::named(n, Some(WireType::Str { len: 64 })))
                    .collect(),
                rows: vec![vec![
                    Val::UInt(u64::from(self.connection_id)),
                    Val::Str(self.user.clone()),
                    Val::Str(self.host.clone()),
                    opt_text(self.db.clone()),
                    Val::Str("Query".into()),
                    Val::Int(0),
                    Val::Str("executing".into()),
                    Val::Str("SHOW PROCESSLIST".into()),
                ]],
            })),
        }
    }

    /// USE / COM_INIT_DB / the database of the handshake.
    pub async fn use_db(&mut self, db: &str) -> SqlResult<()> {
        self.check_db(db)?;
        if !self.db_exists(db) {
            let _ = self.client().refresh().await;
            if !self.db_exists(db) {
                return Err(SqlError::bad_db(db));
            }
        }
        let real = self.databases().into_iter().find(|d| d.eq_ignore_ascii_case(db)).unwrap_or_else(|| db.to_string());
        self.db = Some(real);
        Ok(())
    }

    // ----- prepared statements -----

    /// Prepares `sql`: its id, its number of placeholders, and for a SELECT its result columns.
    pub async fn prepare(&mut self, sql: &str) -> SqlResult<(u32, usize, Vec<ColumnMeta>)> {
        if self.prepared.len() >= MAX_PREPARED_PER_CONNECTION {
            return Err(SqlError::new(
                code::UNKNOWN,
                format!("Can't create more than {MAX_PREPARED_PER_CONNECTION} prepared statements"),
            ));
        }
        let map = self.client().map();
        // Longer texts are neither looked up nor shared (nor copied for a key).
        let key = (sql.len() <= PREPARED_CACHE_TEXT_BYTES).then(|| (self.db.clone(), sql.to_string()));
        let shared = key.as_ref().and_then(|k| self.shared.prepared.lock().of(&map).get(k).cloned());
        if let Some((p, columns)) = shared {
            let n = p.placeholders.len();
            return Ok((self.add_prepared(p), n, columns.to_vec()));
        }
        // Check the syntax now, as MySQL does, with NULL in every placeholder.
        let placeholders = parse::placeholders(sql);
        let probe = parse::substitute(sql, &placeholders, &vec![Val::Null; placeholders.len()]);
        if parse::classify(&probe)?.is_none() {
            parse::parse_one(&probe)?;
        }
        // Clients bind result buffers at prepare time (libmysqlclient, so sysbench, refuses a
        // result set that PREPARE did not announce): learn a SELECT's columns by running it
        // once with NULL in every placeholder, which matches no row in a key lookup.
        let is_select = probe.trim_start().get(..6).is_some_and(|h| h.eq_ignore_ascii_case("select"));
        let columns = match is_select {
            true => match self.query(&probe).await {
                Ok(Outcome::Rows(rs)) => rs.columns.to_vec(),
                _ => vec![],
            },
            false => vec![],
        };
        let point = match is_select && placeholders.len() == 1 {
            true => self.point_select(&probe, &columns).await.map(Arc::new),
            false => None,
        };
        let parsed = parse::parse_with_placeholders(sql, &placeholders);
        let param_at = match parsed {
            Some(_) => parse::locations(sql, &placeholders),
            None => vec![],
        };
        let n = placeholders.len();
        let p = Arc::new(Prepared { sql: sql.to_string(), placeholders, point, parsed, param_at });
        // Only what depends on nothing but the text, the database and the map is shared: a
        // SELECT whose columns PREPARE could not learn (the probe failed, say for want of a
        // privilege) may learn them for another user. And only under the map it began with:
        // one that came meanwhile may have changed what the statement means.
        if let Some(key) = key.filter(|_| !is_select || !columns.is_empty()) {
            if let Some(cache) = self.shared.prepared.lock().of_current(&map) {
                if cache.len() >= PREPARED_CACHE_ENTRIES {
                    cache.clear();
                }
                cache.insert(key, (p.clone(), columns.as_slice().into()));
            }
        }
        Ok((self.add_prepared(p), n, columns))
    }

    fn add_prepared(&mut self, p: Arc<Prepared>) -> u32 {
        let id = self.next_statement;
        self.next_statement = self.next_statement.wrapping_add(1).max(1);
        self.prepared.insert(id, p);
        id
    }

    pub async fn execute(&mut self, id: u32, params: &[Val]) -> SqlResult<Outcome> {
        let p = self.prepared.get(&id).cloned().ok_or_else(|| {
            SqlError::new(
                code::UNKNOWN_STMT_HANDLER,
                format!("Unknown prepared statement handler ({id}) given to mysqld_stmt_execute"),
            )
        })?;
        if params.len() != p.placeholders.len() {
            return Err(SqlError::new(code::WRONG_ARGUMENTS, "Incorrect arguments to mysqld_stmt_execute"));
        }
        if let (Some(point), [param]) = (&p.point, params) {
            self.command = command_of(&p.sql);
            if let Some(out) = self.run_point_select(point, param).await {
                return out;
            }
        }
        if let Some(stmt) = &p.parsed {
            let values = p.param_at.iter().copied().zip(params.iter().map(parse::param_value)).collect();
            self.begin_statement(&p.sql, Arc::new(values)).await?;
            let out = self.statement(stmt, &p.sql).await;
            return self.end_statement(out);
        }
        let sql = parse::substitute(&p.sql, &p.placeholders, params);
        self.query(&sql).await
    }

    // ----- DDL -----

    /// CREATE TABLE; `partition_by` names the partition-key columns (PARTITION BY KEY), else the
    /// primary key partitions the table.
    async fn create_table(&mut self, ct: &ast::CreateTable, partition_by: &[String]) -> SqlResult<Outcome> {
        if ct.query.is_some() || ct.like.is_some() || ct.clone.is_some() {
            return Err(SqlError::not_supported("CREATE TABLE ... AS SELECT / LIKE"));
        }
        if ct.temporary {
            return Err(SqlError::not_supported("CREATE TEMPORARY TABLE"));
        }
        let parts = object_parts(&ct.name);
        let (db, name) = match parts.as_slice() {
            [t] => (self.db_for(None)?, t.clone()),
            [d, t] => (d.clone(), t.clone()),
            _ => return Err(SqlError::parse("bad table name")),
        };
        check_ident("table", &name)?;
        self.check_table(&db, &name)?;
        if !self.db_exists(&db) {
            return Err(SqlError::bad_db(&db));
        }
        if self.find_view(&db, &name).await?.is_some() {
            return Err(SqlError::new(code::TABLE_EXISTS, format!("Table '{name}' already exists")));
        }
        let env = self.env();
        let mut columns: Vec<Column> = vec![];
        let mut pk: Vec<u32> = vec![];
        let mut pk_defs = 0;
        let mut secondary: Vec<IndexSpec> = vec![];
        for cd in &ct.columns {
            let cname = cd.name.value.clone();
            check_ident("column", &cname)?;
            if columns.iter().any(|c| c.name.eq_ignore_ascii_case(&cname)) {
                return Err(SqlError::new(code::DUP_FIELDNAME, format!("Duplicate column name '{cname}'")));
            }
            let (col, inline_key) = column_from_def(&env, cd)?;
            match inline_key {
                InlineKey::Primary => {
                    pk_defs += 1;
                    pk = vec![columns.len() as u32];
                }
                // MySQL names a column's own unique key after the column.
                InlineKey::Unique => {
                    let taken = secondary.iter().map(|s| s.name.as_str());
                    let name = default_index_name(std::slice::from_ref(&col), 0, taken);
                    secondary.push(IndexSpec {
                        id: 0,
                        name,
                        columns: vec![columns.len() as u32],
                        unique: true,
                        prefix_lens: vec![],
                    });
                }
                InlineKey::None => {}
            }
            columns.push(col);
        }
        for c in &ct.constraints {
            match c {
                TableConstraint::PrimaryKey(p) => {
                    pk_defs += 1;
                    pk = index_columns(&columns, &p.columns)?;
                    for &i in &pk {
                        columns[i as usize].nullable = false;
                    }
                }
                // Ordered secondary indexes, kept by the data nodes; unique ones also have a
                // hidden table each (`unique.rs`).
                TableConstraint::Index(_) | TableConstraint::Unique(_) => {
                    let Some((name, parts, unique)) = index_of_constraint(c) else { continue };
                    let (cols, prefix_lens) = index_parts(&columns, parts)?;
                    let name = name.unwrap_or_else(|| {
                        default_index_name(&columns, cols[0], secondary.iter().map(|s| s.name.as_str()))
                    });
                    if secondary.iter().any(|s: &IndexSpec| s.name.eq_ignore_ascii_case(&name)) {
                        return Err(SqlError::new(code::DUP_KEYNAME, format!("Duplicate key name '{name}'")));
                    }
                    secondary.push(IndexSpec { id: 0, name, columns: cols, unique, prefix_lens });
                }
                TableConstraint::ForeignKey(_) => return Err(SqlError::not_supported("FOREIGN KEY constraints")),
                other => return Err(SqlError::not_supported(format!("table constraint {other}"))),
            }
        }
        if pk_defs > 1 {
            return Err(SqlError::new(code::MULTIPLE_PRI_KEY, "Multiple primary key defined"));
        }
        check_auto_key(columns.iter().map(|c| c.auto_increment), &pk)?;
        for &k in &pk {
            if columns[k as usize].ty == ColumnType::Float {
                return Err(SqlError::not_supported("FLOAT/DOUBLE primary key columns"));
            }
        }
        let mut partition_key = vec![];
        for n in partition_by {
            let i = columns.iter().position(|c| c.name.eq_ignore_ascii_case(n)).ok_or_else(|| {
                SqlError::new(code::BAD_FIELD, "Field in list of fields for partition function not found in table")
            })?;
            if !pk.contains(&(i as u32)) {
                return Err(SqlError::new(
                    code::UNIQUE_KEY_NEED_ALL_FIELDS_IN_PF,
                    "A PRIMARY KEY must include all columns in the table's partitioning function",
                ));
            }
            if !partition_key.contains(&(i as u32)) {
                partition_key.push(i as u32);
            }
        }
        // The primary key is an ordered index too (as in NDB): range scans and ORDER BY on it.
        let mut indexes = vec![];
        if !pk.is_empty() {
            indexes.push(IndexSpec::primary(pk.clone()));
        }
        indexes.extend(secondary);
        let spec = TableSpec { name: format!("{db}.{name}"), columns, primary_key: pk, partition_key };
        match self.client().create_table_with_indexes(spec, indexes, ct.if_not_exists).await {
            Ok(_) => Ok(Outcome::ok()),
            Err(e) if e.code == ErrorCode::TableExists => {
                Err(SqlError::new(code::TABLE_EXISTS, format!("Table '{name}' already exists")))
            }
            Err(e) if e.code == ErrorCode::InvalidArgument => Err(SqlError::new(code::TOO_BIG_ROWSIZE, e.message)),
            Err(e) => Err(SqlError::from_cluster(&e)),
        }
    }

    /// CREATE INDEX / ALTER TABLE … ADD INDEX: the data nodes build it from the rows.
    async fn add_index(
        &self,
        t: &TableRef,
        name: Option<String>,
        columns: &[ast::IndexColumn],
        if_not_exists: bool,
    ) -> SqlResult<()> {
        let (cols, prefix_lens) = index_parts(&t.table.spec.columns, columns)?;
        let taken = t.table.indexes.iter().map(|i| i.name.as_str());
        let name = name.unwrap_or_else(|| default_index_name(&t.table.spec.columns, cols[0], taken));
        if name.eq_ignore_ascii_case("PRIMARY") {
            return Err(SqlError::new(code::WRONG_NAME_FOR_INDEX, "Incorrect index name 'PRIMARY'"));
        }
        let index = IndexSpec { id: 0, name: name.clone(), columns: cols, unique: false, prefix_lens };
        match self.client().create_index(&t.table.spec.name, index, if_not_exists).await {
            Ok(_) => Ok(()),
            Err(e) if e.code == ErrorCode::TableExists => {
                Err(SqlError::new(code::DUP_KEYNAME, format!("Duplicate key name '{name}'")))
            }
            Err(e) if e.code == ErrorCode::TooLarge => Err(SqlError::new(code::TOO_MANY_KEYS, e.message)),
            Err(e) => Err(SqlError::from_cluster(&e)),
        }
    }

    /// DROP INDEX / ALTER TABLE … DROP INDEX.
    async fn remove_index(&self, t: &TableRef, name: &str, if_exists: bool) -> SqlResult<()> {
        if name.eq_ignore_ascii_case("PRIMARY") {
            return Err(SqlError::not_supported("dropping the primary key"));
        }
        match self.client().drop_index(&t.table.spec.name, name, if_exists).await {
            Ok(()) => Ok(()),
            Err(e) if e.code == ErrorCode::InvalidArgument => Err(SqlError::new(
                code::CANT_DROP_FIELD_OR_KEY,
                format!("Can't DROP '{name}'; check that column/key exists"),
            )),
            Err(e) => Err(SqlError::from_cluster(&e)),
        }
    }

    /// ALTER TABLE: adding and dropping indexes (one catalog change each); column changes by
    /// copy (`alter.rs`); RENAME TO last, once the rest is in (one catalog change).
    async fn alter_table(&mut self, at: &ast::AlterTable) -> SqlResult<Outcome> {
        let t = self.resolve(&object_parts(&at.name)).await?;
        let rename = at.operations.iter().rev().find_map(|op| match op {
            ast::AlterTableOperation::RenameTable {
                table_name: ast::RenameTableNameKind::To(n) | ast::RenameTableNameKind::As(n),
            } => Some(object_parts(n)),
            _ => None,
        });
        let ops: Vec<&ast::AlterTableOperation> =
            at.operations.iter().filter(|op| !matches!(op, ast::AlterTableOperation::RenameTable { .. })).collect();
        let rename = rename.map(|to| (vec![t.db.clone(), t.name.clone()], to));
        if let Some(pair) = &rename {
            // The target is checked before anything changes (the copy takes a while).
            self.plan_renames(std::slice::from_ref(pair)).await?;
        }
        if ops.iter().any(|op| crate::alter::needs_copy(op)) {
            let ops: Vec<ast::AlterTableOperation> = ops.into_iter().cloned().collect();
            self.alter_columns(&t, &ops).await?;
        } else {
            for op in ops {
                match op {
                    ast::AlterTableOperation::AddConstraint { constraint: TableConstraint::Index(ix), .. } => {
                        let name = ix.name.as_ref().map(|n| n.value.clone());
                        self.add_index(&t, name, &ix.columns, false).await?;
                    }
                    ast::AlterTableOperation::DropIndex { name } => self.remove_index(&t, &name.value, false).await?,
                    other => {
                        let text = other.to_string();
                        let head: String = text.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
                        return Err(SqlError::not_supported(format!("ALTER TABLE … {head}")));
                    }
                }
            }
        }
        if let Some(pair) = rename {
            self.rename_tables(&[pair]).await?;
        }
        Ok(Outcome::ok())
    }

    async fn drop_tables(&mut self, names: &[ast::ObjectName], if_exists: bool) -> SqlResult<Outcome> {
        let mut missing = vec![];
        for n in names {
            let parts = object_parts(n);
            let (db, t) = match parts.as_slice() {
                [t] => (self.db_for(None)?, t.clone()),
                [d, t] => (d.clone(), t.clone()),
                _ => return Err(SqlError::parse("bad table name")),
            };
            self.check_table(&db, &t)?;
            let full = format!("{db}.{t}");
            if is_internal_table(&t) {
                missing.push(full);
                continue;
            }
            if self.client().map().table(&full).is_none() {
                let _ = self.client().refresh().await;
            }
            if self.client().map().table(&full).is_none() {
                missing.push(full);
                continue;
            }
            match self.client().drop_table(&full, if_exists).await {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::NoSuchTable => missing.push(full),
                Err(e) => return Err(SqlError::from_cluster(&e)),
            }
        }
        if !missing.is_empty() && !if_exists {
            return Err(SqlError::new(code::BAD_TABLE, format!("Unknown table '{}'", missing.join(","))));
        }
        Ok(Outcome::ok())
    }

    async fn explain(&mut self, stmt: Statement) -> SqlResult<Outcome> {
        use crate::sql::explain;
        let (table, selection) = match &stmt {
            Statement::Query(q) => {
                let text = q.to_string();
                let plan = self.plan_query(q, |p| p.query(q, &text, &[], None)).await?;
                return Ok(text_rows(explain::COLUMNS, explain::explain(&plan)));
            }
            Statement::Update(u) => (u.table.relation.clone(), u.selection.clone()),
            Statement::Delete(d) => match &d.from {
                ast::FromTable::WithFromKeyword(f) | ast::FromTable::WithoutKeyword(f) if f.len() == 1 => {
                    (f[0].relation.clone(), d.selection.clone())
                }
                _ => return Err(SqlError::not_supported("EXPLAIN of this statement")),
            },
            _ => return Err(SqlError::not_supported("EXPLAIN of this statement")),
        };
        let ast::TableFactor::Table { name, .. } = table else {
            return Err(SqlError::not_supported("EXPLAIN of this statement"));
        };
        let t = self.resolve(&object_parts(&name)).await?;
        let env = self.env();
        let filter = match &selection {
            Some(e) => Some(Binder::new(&env, Some(&t), "where clause").bind(e)?),
            None => None,
        };
        let a = crate::sql::plan::choose(&t, filter.as_ref());
        let row = vec![t.name.clone(), a.describe(), explain::pushed_text(&t, &a), String::new()];
        Ok(text_rows(explain::COLUMNS, vec![row]))
    }
}

/// The command a statement is, as 1142 messages name it.
fn command_of(sql: &str) -> &'static str {
    let first = sql.split_whitespace().next().unwrap_or("");
    let is = |w: &str| first.eq_ignore_ascii_case(w);
    if is("INSERT") || is("REPLACE") {
        "INSERT"
    } else if is("UPDATE") {
        "UPDATE"
    } else if is("DELETE") {
        "DELETE"
    } else if is("CREATE") {
        "CREATE"
    } else if is("DROP") || is("TRUNCATE") {
        "DROP"
    } else if is("ALTER") || is("RENAME") {
        "ALTER"
    } else {
        "SELECT"
    }
}

fn table_parts(db: Option<String>, table: String) -> Vec<String> {
    match db {
        Some(d) => vec![d, table],
        None => vec![table],
    }
}

fn default_text(t: &TableRef, i: usize) -> Option<String> {
    let c = &t.table.columns()[i];
    c.default.as_ref().and_then(|v| t.types[i].load(v).to_string_lossy())
}

/// DESCRIBE / SHOW COLUMNS.
fn describe(t: &TableRef, full: bool) -> Outcome {
    let mut names = vec!["Field", "Type"];
    if full {
        names.push("Collation");
    }
    names.extend(["Null", "Key", "Default", "Extra"]);
    let mut rows = vec![];
    for i in 0..t.visible() {
        let c = &t.table.columns()[i];
        let key = if !t.table.hidden_pk && t.table.spec.primary_key.contains(&(i as u32)) { "PRI" } else { "" };
        let mut row = vec![Val::Str(c.name.clone()), Val::Str(t.types[i].to_string())];
        if full {
            row.push(if t.types[i].is_text() { Val::Str("utf8mb4_bin".into()) } else { Val::Null });
        }
        row.push(Val::Str(if c.nullable { "YES" } else { "NO" }.into()));
        row.push(Val::Str(key.into()));
        row.push(opt_text(default_text(t, i)));
        row.push(Val::Str(if c.auto_increment { "auto_increment" } else { "" }.into()));
        rows.push(row);
    }
    Outcome::Rows(ResultSet {
        columns: names.iter().map(|n| ColumnMeta::named(n, Some(WireType::Str { len: 256 }))).collect(),
        rows,
    })
}

/// SHOW CREATE TABLE text.
pub fn show_create(t: &TableRef) -> String {
    let mut lines = vec![];
    for i in 0..t.visible() {
        let c = &t.table.columns()[i];
        let mut l = format!("  `{}` {}", c.name, t.types[i]);
        if !c.nullable {
            l.push_str(" NOT NULL");
        }
        if c.auto_increment {
            l.push_str(" AUTO_INCREMENT");
        } else if let Some(d) = default_text(t, i) {
            let quoted = match c.default {
                Some(Value::Int(_) | Value::Uint(_) | Value::Float(_))
                    if !matches!(t.types[i], SqlType::Decimal { .. }) =>
                {
                    d
                }
                _ => format!("'{}'", d.replace('\'', "''")),
            };
            l.push_str(&format!(" DEFAULT {quoted}"));
        } else if c.nullable {
            l.push_str(" DEFAULT NULL");
        }
        lines.push(l);
    }
    if !t.table.hidden_pk {
        let cols: Vec<String> =
            t.table.spec.primary_key.iter().map(|&k| format!("`{}`", t.col_name(k as usize))).collect();
        lines.push(format!("  PRIMARY KEY ({})", cols.join(",")));
    }
    for ix in t.table.indexes.iter().filter(|i| i.name != IndexSpec::PRIMARY) {
        let cols: Vec<String> = ix
            .columns
            .iter()
            .enumerate()
            .map(|(i, &c)| match ix.prefix_lens.get(i).copied().unwrap_or(0) {
                0 => format!("`{}`", t.col_name(c as usize)),
                n => format!("`{}`({n})", t.col_name(c as usize)),
            })
            .collect();
        let kind = if ix.unique { "UNIQUE KEY" } else { "KEY" };
        lines.push(format!("  {kind} `{}` ({})", ix.name, cols.join(",")));
    }
    let spec = &t.table.spec;
    let partitioning = if !t.table.hidden_pk && spec.partition_key != spec.primary_key {
        let cols: Vec<String> = spec.partition_key.iter().map(|&k| format!("`{}`", t.col_name(k as usize))).collect();
        format!("\n/*!50100 PARTITION BY KEY ({}) */", cols.join(","))
    } else {
        String::new()
    };
    format!(
        "CREATE TABLE `{}` (\n{}\n) ENGINE=ndbcluster DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin{partitioning}",
        t.name,
        lines.join(",\n")
    )
}

/// True when `s` matches a SHOW ... LIKE pattern (case-insensitive, as MySQL).
pub fn show_like(pattern: &str, s: &str) -> bool {
    like(&s.to_lowercase(), &pattern.to_lowercase(), '\\')
}

/// The column positions of an index's key parts.
/// An index a table constraint declares: its name if given, its columns, whether unique.
pub(crate) fn index_of_constraint(c: &TableConstraint) -> Option<(Option<String>, &[ast::IndexColumn], bool)> {
    match c {
        TableConstraint::Index(ix) => Some((ix.name.as_ref().map(|n| n.value.clone()), &ix.columns, false)),
        TableConstraint::Unique(u) => {
            let name = u.index_name.as_ref().or(u.name.as_ref()).map(|n| n.value.clone());
            Some((name, &u.columns, true))
        }
        _ => None,
    }
}

/// At most one AUTO_INCREMENT column (`auto`: per column, whether it is one), and it is the
/// whole primary key `pk` (MySQL's 1075).
pub(crate) fn check_auto_key(auto: impl Iterator<Item = bool>, pk: &[u32]) -> SqlResult<()> {
    let autos: Vec<u32> = auto.zip(0..).filter_map(|(a, i)| a.then_some(i)).collect();
    if autos.len() > 1 || (autos.len() == 1 && pk != autos.as_slice()) {
        return Err(SqlError::new(
            code::WRONG_AUTO_KEY,
            "Incorrect table definition; there can be only one auto column and it must be the whole primary key",
        ));
    }
    Ok(())
}

/// The columns of a primary key (no prefixes).
pub(crate) fn index_columns(columns: &[Column], parts: &[ast::IndexColumn]) -> SqlResult<Vec<u32>> {
    let (cols, prefixes) = index_parts(columns, parts)?;
    if !prefixes.is_empty() {
        return Err(SqlError::not_supported("a prefix of a primary key column"));
    }
    Ok(cols)
}

/// The columns of an index and their prefix lengths (`title(32)`; 0 = whole value; empty when
/// no column has one).
pub(crate) fn index_parts(columns: &[Column], parts: &[ast::IndexColumn]) -> SqlResult<(Vec<u32>, Vec<u32>)> {
    let mut out = vec![];
    let mut prefixes = vec![];
    for ic in parts {
        let (n, prefix) = match &ic.column.expr {
            ast::Expr::Identifier(i) => (i.value.clone(), 0),
            e => match key_prefix(e) {
                Some(np) => np,
                None => return Err(SqlError::not_supported(format!("index key part {e}"))),
            },
        };
        let i = columns.iter().position(|c| c.name.eq_ignore_ascii_case(&n)).ok_or_else(|| {
            SqlError::new(code::KEY_COLUMN_DOES_NOT_EXIST, format!("Key column '{n}' doesn't exist in table"))
        })?;
        if out.contains(&(i as u32)) {
            return Err(SqlError::new(code::DUP_FIELDNAME, format!("Duplicate column name '{n}'")));
        }
        let col = &columns[i];
        if prefix > 0 && (!col.ty.is_var() || prefix > col.max_len) {
            return Err(SqlError::new(
                code::WRONG_SUB_KEY,
                "Incorrect prefix key; the used key part isn't a string, the used length is longer than the key part, or the storage engine doesn't support unique prefix keys",
            ));
        }
        out.push(i as u32);
        prefixes.push(prefix);
    }
    if out.is_empty() {
        return Err(SqlError::parse("an index needs at least one column"));
    }
    if prefixes.iter().all(|&p| p == 0) {
        prefixes.clear();
    }
    Ok((out, prefixes))
}

/// `name(length)` in an index column list: a prefix of the column.
fn key_prefix(e: &ast::Expr) -> Option<(String, u32)> {
    let ast::Expr::Function(f) = e else { return None };
    let [name] = f.name.0.as_slice() else { return None };
    let ast::FunctionArguments::List(list) = &f.args else { return None };
    let [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(ast::Expr::Value(v)))] = list.args.as_slice() else {
        return None;
    };
    let ast::Value::Number(n, _) = &v.value else { return None };
    let len = n.parse::<u32>().ok().filter(|&l| l > 0)?;
    Some((name.as_ident()?.value.clone(), len))
}

/// MySQL's name for an unnamed index: its first column's, with `_2`, `_3`… when taken.
pub(crate) fn default_index_name<'a>(
    columns: &[Column],
    first: u32,
    taken: impl Iterator<Item = &'a str> + Clone,
) -> String {
    let base = columns[first as usize].name.clone();
    let free = |n: &str| !taken.clone().any(|t| t.eq_ignore_ascii_case(n));
    if free(&base) {
        return base;
    }
    (2..).map(|k| format!("{base}_{k}")).find(|n| free(n)).expect("some suffix is free")
}

/// One column of CREATE TABLE / ALTER TABLE ADD COLUMN: the catalog column, and the key it
/// declares itself.
/// Tables the SQL node keeps for itself (ALTER TABLE copies, unique index tables): not
/// listed, not readable or writable by name.
pub(crate) fn is_internal_table(name: &str) -> bool {
    name.starts_with(crate::alter::COPY_PREFIX) || name.starts_with(shoal_proto::UNIQUE_TABLE_MARK)
}

/// A key declared on the column itself (`PRIMARY KEY`, `UNIQUE [KEY]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InlineKey {
    None,
    Primary,
    Unique,
}

pub(crate) fn column_from_def(env: &Env, cd: &ast::ColumnDef) -> SqlResult<(Column, InlineKey)> {
    let cname = cd.name.value.clone();
    let mut inline_key = InlineKey::None;
    let ty = SqlType::from_ast(&cd.data_type)?;
    let (storage, max_len) = ty.storage()?;
    let mut col = Column::new(&cname, storage);
    col.max_len = max_len;
    col.sql_type = ty.to_string();
    col.nullable = true;
    let mut default_expr = None;
    for opt in &cd.options {
        match &opt.option {
            ColumnOption::Null => col.nullable = true,
            ColumnOption::NotNull => col.nullable = false,
            ColumnOption::Default(e) => default_expr = Some(e.clone()),
            ColumnOption::PrimaryKey(_) => {
                inline_key = InlineKey::Primary;
                col.nullable = false;
            }
            ColumnOption::Unique(_) => {
                if inline_key == InlineKey::None {
                    inline_key = InlineKey::Unique;
                }
            }
            ColumnOption::DialectSpecific(tokens)
                if tokens.iter().any(|t| t.to_string().eq_ignore_ascii_case("AUTO_INCREMENT")) =>
            {
                if !matches!(ty, SqlType::Int { .. }) {
                    return Err(SqlError::new(
                        code::WRONG_AUTO_KEY,
                        format!("Incorrect column specifier for column '{cname}'"),
                    ));
                }
                col.auto_increment = true;
                col.nullable = false;
            }
            ColumnOption::Comment(_) | ColumnOption::CharacterSet(_) | ColumnOption::Collation(_) => {}
            other => return Err(SqlError::not_supported(format!("column option {other}"))),
        }
    }
    if let Some(e) = default_expr {
        col.default = default_value(env, &col, ty, &e)?;
    }
    Ok((col, inline_key))
}

/// The stored value of `DEFAULT e` for column `col` of type `ty` (None: NULL), as CREATE TABLE
/// and ALTER TABLE … SET DEFAULT keep it; 1067 when it does not fit the column.
pub(crate) fn default_value(env: &Env, col: &Column, ty: SqlType, e: &ast::Expr) -> SqlResult<Option<Value>> {
    let bad = || SqlError::new(code::INVALID_DEFAULT, format!("Invalid default value for '{}'", col.name));
    if col.auto_increment {
        return Err(bad());
    }
    let mut b = Binder::new(env, None, "field list");
    let v = match e {
        ast::Expr::Identifier(i) if i.quote_style.is_none() && i.value.eq_ignore_ascii_case("current_timestamp") => {
            return Err(SqlError::not_supported("DEFAULT CURRENT_TIMESTAMP"));
        }
        ast::Expr::Function(_) => return Err(SqlError::not_supported("non-constant DEFAULT")),
        _ => b.bind(e).map_err(|_| bad())?.eval(&[], &[]).map_err(|_| bad())?,
    };
    if v.is_null() {
        return if col.nullable { Ok(None) } else { Err(bad()) };
    }
    ty.store(&col.name, &v, 1).map(Some).map_err(|_| bad())
}

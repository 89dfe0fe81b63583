//! Domain types shared by every Shoal process. They are validated: a value of these types that
//! came off the wire went through [`crate::convert`] and obeys the limits below.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, ShoalError};

pub type NodeId = u32;
pub type Epoch = u64;
pub type TableId = u32;
pub type PartitionId = u32;

/// Longest table or column name.
pub const MAX_NAME_BYTES: usize = 64;
/// Longest table name: SQL nodes store `database.table` (64 + 1 + 64 bytes).
pub const MAX_TABLE_NAME_BYTES: usize = 129;
/// Most columns in one table (hidden key included).
pub const MAX_COLUMNS: usize = 256;
/// Longest encoded primary key.
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest encoded row (NDB's limit for in-row data is 30,000 bytes; ours is a little larger).
pub const MAX_ROW_BYTES: usize = 64 * 1024;
/// TEXT/BYTES columns declared without a length get this one.
pub const DEFAULT_MAX_LEN: u32 = 4096;
/// Name of the hidden primary key column added to tables declared without one.
pub const HIDDEN_PK_COLUMN: &str = "$pk";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ColumnType {
    Int,
    Uint,
    Float,
    Text,
    Bytes,
    Bool,
}

impl ColumnType {
    pub fn name(self) -> &'static str {
        match self {
            ColumnType::Int => "INT",
            ColumnType::Uint => "UINT",
            ColumnType::Float => "FLOAT",
            ColumnType::Text => "TEXT",
            ColumnType::Bytes => "BYTES",
            ColumnType::Bool => "BOOL",
        }
    }

    pub fn is_var(self) -> bool {
        matches!(self, ColumnType::Text | ColumnType::Bytes)
    }
}

/// An update's `column = column + by` on an integer column, applied where the row is (one
/// round trip instead of a locked read and a write): NULL stays NULL; a result outside
/// `[min, max]` — the column's SQL range — is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delta {
    pub column: u32,
    pub by: i64,
    pub min: i64,
    pub max: i64,
}

impl Delta {
    /// Adds the increment to its column of `row`.
    pub fn apply_to(&self, row: &mut [Value]) -> Result<(), ShoalError> {
        let slot = row
            .get_mut(self.column as usize)
            .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, format!("no column {}", self.column)))?;
        *slot = match &*slot {
            Value::Null => Value::Null,
            Value::Int(v) => match v.checked_add(self.by) {
                Some(n) if (self.min..=self.max).contains(&n) => Value::Int(n),
                _ => {
                    return Err(ShoalError::new(
                        ErrorCode::TypeMismatch,
                        format!("column {} out of range", self.column),
                    ))
                }
            },
            other => {
                return Err(ShoalError::new(
                    ErrorCode::TypeMismatch,
                    format!("column {} holds {}, not a signed integer", self.column, other.type_name()),
                ))
            }
        };
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Column {
    pub name: String,
    pub ty: ColumnType,
    pub nullable: bool,
    /// TEXT/BYTES: longest value in bytes.
    pub max_len: u32,
    /// The type as SQL declared it ("varchar(20)", "date"); data nodes ignore it.
    pub sql_type: String,
    pub auto_increment: bool,
    /// Default value for inserts that omit the column (applied by the SQL node).
    pub default: Option<Value>,
}

impl Column {
    pub fn new(name: &str, ty: ColumnType) -> Column {
        Column {
            name: name.to_string(),
            ty,
            nullable: false,
            max_len: if ty.is_var() { DEFAULT_MAX_LEN } else { 0 },
            sql_type: String::new(),
            auto_increment: false,
            default: None,
        }
    }

    pub fn nullable(mut self) -> Column {
        self.nullable = true;
        self
    }
}

/// What a user asks for in CREATE TABLE.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    pub name: String,
    pub columns: Vec<Column>,
    /// Column positions; empty means "no primary key": a hidden one is added.
    pub primary_key: Vec<u32>,
    /// Subset of the primary key; empty means the whole primary key.
    pub partition_key: Vec<u32>,
}

/// A table as the catalog holds it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub id: TableId,
    pub spec: TableSpec,
    pub partition_count: u32,
    pub schema_version: u64,
    /// The last column is the hidden key `$pk`, assigned by the data node on insert.
    pub hidden_pk: bool,
    /// Ordered indexes the data nodes keep for this table.
    #[serde(default)]
    pub indexes: Vec<IndexSpec>,
    /// Writes are refused while an ALTER TABLE copies the rows (see `Command::ReplaceTable`).
    #[serde(default)]
    pub read_only: bool,
    /// Row triggers, in the order they fire (per timing and event); the SQL nodes run them.
    #[serde(default)]
    pub triggers: Vec<Trigger>,
}

/// A row trigger (CREATE TRIGGER): a statement the SQL node runs for each row a statement
/// inserts, updates or deletes, before or after the row's write. Names are unique per database.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trigger {
    pub name: String,
    /// BEFORE (may change the row through `SET NEW.col`), else AFTER.
    pub before: bool,
    pub event: TriggerEvent,
    /// The statement after FOR EACH ROW, as written.
    pub body: String,
    /// `'user'@'host'` of the account that created it.
    pub definer: String,
    /// When it was created, wall-clock milliseconds since the Unix epoch.
    pub created_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TriggerEvent {
    Insert,
    Update,
    Delete,
}

impl TriggerEvent {
    pub fn as_sql(self) -> &'static str {
        match self {
            TriggerEvent::Insert => "INSERT",
            TriggerEvent::Update => "UPDATE",
            TriggerEvent::Delete => "DELETE",
        }
    }
}

/// Most indexes per table.
pub const MAX_INDEXES: usize = 64;
/// Most triggers per table.
pub const MAX_TRIGGERS: usize = 64;
/// Longest trigger body stored, in bytes.
pub const MAX_TRIGGER_BODY_BYTES: usize = 16 * 1024;
/// Most renames in one RENAME TABLE (one catalog change).
pub const MAX_RENAMES: usize = 64;
/// Most columns per index.
pub const MAX_INDEX_COLUMNS: usize = 16;

/// An ordered index over columns of a table (DDL: CREATE INDEX, KEY in CREATE TABLE). Data
/// nodes keep one per partition replica; entries sort by the index columns (NULL first), then
/// by primary key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexSpec {
    /// Unique within the table, assigned by mgmd.
    pub id: u32,
    pub name: String,
    pub columns: Vec<u32>,
    /// No two rows share non-NULL values of the columns, cluster-wide. The SQL node keeps the
    /// index's hidden table (`Table::unique_table_spec`) in each writing transaction.
    pub unique: bool,
    /// Per column: the length in characters (TEXT) or bytes (BYTES) of the prefix indexed, 0
    /// for the whole value; empty for whole values everywhere. Only a unique index's check
    /// (and its hidden table's key) uses prefixes; ordered indexes hold whole values, which
    /// order their prefixes too.
    #[serde(default)]
    pub prefix_lens: Vec<u32>,
}

impl IndexSpec {
    /// The name the primary key's index goes by (MySQL's).
    pub const PRIMARY: &'static str = "PRIMARY";

    /// The primary key as an ordered index (as in NDB: range scans and ORDER BY on it); mgmd
    /// gives it its id.
    pub fn primary(columns: Vec<u32>) -> IndexSpec {
        IndexSpec { id: 0, name: IndexSpec::PRIMARY.into(), columns, unique: false, prefix_lens: vec![] }
    }

    /// `v`, a value of the index's `i`-th column, cut to that column's prefix length.
    pub fn cut(&self, i: usize, v: Value) -> Value {
        match (v, self.prefix_lens.get(i).copied().unwrap_or(0) as usize) {
            (Value::Text(s), n) if n > 0 && s.chars().nth(n).is_some() => Value::Text(s.chars().take(n).collect()),
            (Value::Bytes(mut b), n) if n > 0 => {
                b.truncate(n);
                Value::Bytes(b)
            }
            (v, _) => v,
        }
    }

    /// Checks the index against its table (columns exist, no repeats).
    pub fn check(&self, table: &TableSpec) -> Result<(), ShoalError> {
        check_name("index", &self.name)?;
        if self.columns.is_empty() || self.columns.len() > MAX_INDEX_COLUMNS {
            return Err(invalid(format!("an index has 1..={MAX_INDEX_COLUMNS} columns")));
        }
        for (i, c) in self.columns.iter().enumerate() {
            if *c as usize >= table.columns.len() {
                return Err(invalid(format!("index {}: column {c} does not exist", self.name)));
            }
            if self.columns[..i].contains(c) {
                return Err(invalid(format!("index {} names a column twice", self.name)));
            }
        }
        if !self.prefix_lens.is_empty() {
            if self.prefix_lens.len() != self.columns.len() {
                return Err(invalid(format!("index {}: one prefix length per column", self.name)));
            }
            for (&c, &len) in self.columns.iter().zip(&self.prefix_lens) {
                let col = &table.columns[c as usize];
                if len > 0 && (!col.ty.is_var() || len > col.max_len.max(1)) {
                    return Err(invalid(format!(
                        "index {}: bad prefix length {len} of column {}",
                        self.name, col.name
                    )));
                }
            }
        }
        Ok(())
    }
}

fn invalid(msg: impl Into<String>) -> ShoalError {
    ShoalError::new(ErrorCode::InvalidArgument, msg)
}

fn check_name(what: &str, name: &str) -> Result<(), ShoalError> {
    let max = if what == "table" { MAX_TABLE_NAME_BYTES } else { MAX_NAME_BYTES };
    if name.is_empty() || name.len() > max {
        return Err(invalid(format!("{what} name must be 1..={max} bytes")));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err(invalid(format!("{what} name {name:?} has control characters")));
    }
    Ok(())
}

impl TableSpec {
    /// Checks the spec and completes it: a hidden primary key when none is given, the partition
    /// key defaulting to the primary key, default lengths. Returns the spec and whether the key
    /// is hidden.
    pub fn normalize(mut self) -> Result<(TableSpec, bool), ShoalError> {
        check_name("table", &self.name)?;
        if self.columns.is_empty() {
            return Err(invalid("a table needs at least one column"));
        }
        if self.columns.len() >= MAX_COLUMNS {
            return Err(invalid(format!("a table has at most {} columns", MAX_COLUMNS - 1)));
        }
        for i in 0..self.columns.len() {
            if self.columns[..i].iter().any(|o| o.name.eq_ignore_ascii_case(&self.columns[i].name)) {
                return Err(invalid(format!("duplicate column {}", self.columns[i].name)));
            }
            let c = &mut self.columns[i];
            check_name("column", &c.name)?;
            if c.name == HIDDEN_PK_COLUMN {
                return Err(invalid(format!("column name {HIDDEN_PK_COLUMN} is reserved")));
            }
            if c.ty.is_var() {
                if c.max_len == 0 {
                    c.max_len = DEFAULT_MAX_LEN;
                }
                if c.max_len as usize > MAX_ROW_BYTES {
                    return Err(invalid(format!(
                        "column {} is longer than the row limit of {MAX_ROW_BYTES} bytes",
                        c.name
                    )));
                }
            } else {
                c.max_len = 0;
            }
        }
        let mut hidden = false;
        if self.primary_key.is_empty() {
            if !self.partition_key.is_empty() {
                return Err(invalid("a partition key needs a primary key"));
            }
            hidden = true;
            self.columns.push(Column::new(HIDDEN_PK_COLUMN, ColumnType::Uint));
            self.primary_key = vec![self.columns.len() as u32 - 1];
        }
        let mut seen = Vec::new();
        for &k in &self.primary_key {
            let col = self
                .columns
                .get_mut(k as usize)
                .ok_or_else(|| invalid(format!("primary key column {k} does not exist")))?;
            if seen.contains(&k) {
                return Err(invalid(format!("column {} is twice in the primary key", col.name)));
            }
            seen.push(k);
            if col.ty == ColumnType::Float && !self.name.contains(UNIQUE_TABLE_MARK) {
                // Float equality is a poor key (SQL nodes refuse it too); a unique index on a
                // FLOAT column needs one in its hidden table, where -0 and +0 encode alike.
                return Err(invalid(format!("column {}: FLOAT cannot be part of a primary key", col.name)));
            }
            // Primary key columns are NOT NULL, as in MySQL.
            col.nullable = false;
        }
        if self.partition_key.is_empty() {
            self.partition_key = self.primary_key.clone();
        }
        for (i, k) in self.partition_key.iter().enumerate() {
            if !self.primary_key.contains(k) {
                return Err(invalid("the partition key must be a subset of the primary key"));
            }
            if self.partition_key[..i].contains(k) {
                return Err(invalid("the partition key names a column twice"));
            }
        }
        Ok((self, hidden))
    }
}

impl Table {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn columns(&self) -> &[Column] {
        &self.spec.columns
    }

    /// Columns a user writes: all but the hidden key.
    pub fn visible_columns(&self) -> usize {
        self.spec.columns.len() - usize::from(self.hidden_pk)
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.spec.columns.iter().position(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// Picks the primary key values out of a full row.
    pub fn key_of(&self, row: &[Value]) -> Vec<Value> {
        self.spec.primary_key.iter().map(|&i| row[i as usize].clone()).collect()
    }

    /// The values `index` holds for a row: each column's value, cut to its prefix length.
    pub fn index_key(&self, index: &IndexSpec, row: &[Value]) -> Vec<Value> {
        let value = |c: u32| row.get(c as usize).cloned().unwrap_or(Value::Null);
        index.columns.iter().enumerate().map(|(i, &c)| index.cut(i, value(c))).collect()
    }

    pub fn unique_indexes(&self) -> impl Iterator<Item = &IndexSpec> {
        self.indexes.iter().filter(|i| i.unique)
    }

    /// The hidden table that holds a unique index (NDB's unique index tables): one row per
    /// indexed row whose index columns are all non-NULL, keyed (and partitioned) by those
    /// values, holding the row's primary key. Inserting there is the cluster-wide uniqueness
    /// check. Named `db.#unique-<table id>-<index id>` (ids survive renames; an ALTER TABLE
    /// copy has its own id, so a copy's hidden tables are its own).
    pub fn unique_table_name(&self, index: &IndexSpec) -> String {
        match self.spec.name.split_once('.') {
            Some((db, _)) => format!("{db}.{UNIQUE_TABLE_MARK}{}-{}", self.id, index.id),
            None => format!("{UNIQUE_TABLE_MARK}{}-{}", self.id, index.id),
        }
    }

    /// Columns `k0…`: the index columns; `p0…`: the primary key of the row.
    /// This table with `columns` in place of its own, when only their names and defaults
    /// differ (RENAME COLUMN, CHANGE to the same definition, SET/DROP DEFAULT): rows, keys and
    /// indexes are by position, so nothing else changes. The schema version moves on.
    pub fn with_columns_renamed(&self, columns: Vec<Column>) -> Result<Table, ShoalError> {
        let bare = |c: &Column| Column { name: String::new(), default: None, ..c.clone() };
        let same = columns.len() == self.spec.columns.len()
            && columns.iter().zip(&self.spec.columns).all(|(a, b)| bare(a) == bare(b));
        if !same {
            return Err(invalid("only the names and defaults of columns change in place"));
        }
        for (i, c) in columns.iter().enumerate() {
            check_name("column", &c.name)?;
            let hidden = self.hidden_pk && i + 1 == columns.len();
            if hidden != (c.name == HIDDEN_PK_COLUMN) {
                return Err(invalid(format!("column name {HIDDEN_PK_COLUMN} is reserved")));
            }
            if columns[..i].iter().any(|o| o.name.eq_ignore_ascii_case(&c.name)) {
                return Err(invalid(format!("duplicate column {}", c.name)));
            }
        }
        let mut t = self.clone();
        t.spec.columns = columns;
        t.schema_version += 1;
        Ok(t)
    }

    pub fn unique_table_spec(&self, index: &IndexSpec) -> TableSpec {
        let hidden_col = |name: String, c: &Column| Column {
            name,
            nullable: false,
            auto_increment: false,
            default: None,
            ..c.clone()
        };
        let mut columns: Vec<Column> = index
            .columns
            .iter()
            .enumerate()
            .map(|(i, &c)| hidden_col(format!("k{i}"), &self.columns()[c as usize]))
            .collect();
        let keys = columns.len() as u32;
        columns.extend(
            self.spec
                .primary_key
                .iter()
                .enumerate()
                .map(|(i, &c)| hidden_col(format!("p{i}"), &self.columns()[c as usize])),
        );
        TableSpec {
            name: self.unique_table_name(index),
            columns,
            primary_key: (0..keys).collect(),
            partition_key: vec![],
        }
    }
}

/// Names of unique indexes' hidden tables contain this (after the database's dot).
pub const UNIQUE_TABLE_MARK: &str = "#unique-";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Value {
    Null,
    Int(i64),
    Uint(u64),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    Bool(bool),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Int(_) => "INT",
            Value::Uint(_) => "UINT",
            Value::Float(_) => "FLOAT",
            Value::Text(_) => "TEXT",
            Value::Bytes(_) => "BYTES",
            Value::Bool(_) => "BOOL",
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Int(v) => Some(v),
            Value::Uint(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeKind {
    Mgmd,
    DataNode,
    SqlNode,
}

impl NodeKind {
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Mgmd => "mgmd",
            NodeKind::DataNode => "datanode",
            NodeKind::SqlNode => "sqlnode",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeState {
    Down,
    /// Registered and copying data; receives writes, serves nothing.
    Starting,
    Up,
}

impl NodeState {
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Down => "down",
            NodeState::Starting => "starting",
            NodeState::Up => "up",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub id: NodeId,
    pub kind: NodeKind,
    pub addr: String,
    pub state: NodeState,
    pub node_group: u32,
    pub pid: u32,
    /// Changes every time the process starts; tells a restart from a slow heartbeat.
    pub incarnation: u64,
    /// Starting data nodes: the epoch in which their current copy began (0 otherwise). A node
    /// that sees a new value must drop what it holds and copy again.
    pub sync_epoch: Epoch,
    /// Data nodes: the newest global checkpoint their own files can restore (recorded by mgmd
    /// when the node reports its files complete at a checkpoint). A system restart starts a
    /// node group only from a node holding its group's newest one.
    #[serde(default)]
    pub restorable_gci: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub node_id: NodeId,
    /// 0: a complete replica. Otherwise the replica is being filled by a copy from the
    /// primary that started in this epoch: it receives every write but serves nothing.
    pub sync_epoch: Epoch,
}

impl Replica {
    pub fn complete(node_id: NodeId) -> Replica {
        Replica { node_id, sync_epoch: 0 }
    }

    pub fn syncing(&self) -> bool {
        self.sync_epoch != 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionAssignment {
    pub partition: PartitionId,
    pub node_group: u32,
    /// None: no live replica; the partition answers PartitionUnavailable.
    pub primary: Option<NodeId>,
    /// The epoch in which `primary` took over. Backups refuse replication from older terms.
    pub primary_term: Epoch,
    /// Every live replica, the primary included.
    pub replicas: Vec<Replica>,
}

impl PartitionAssignment {
    pub fn replica(&self, node: NodeId) -> Option<&Replica> {
        self.replicas.iter().find(|r| r.node_id == node)
    }

    /// Replicas other than the primary that must hold a write before it is acknowledged.
    pub fn backups(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().filter(move |r| Some(r.node_id) != self.primary)
    }
}

/// The cluster map every node and client caches. Every change raises `epoch`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    pub epoch: Epoch,
    pub nodes: Vec<Node>,
    pub tables: Vec<Table>,
    /// Indexed by partition id. Every table has `partitions.len()` partitions and partition p
    /// of every table lives in the same place, so tables with the same partition key co-locate.
    pub partitions: Vec<PartitionAssignment>,
    pub leader_id: NodeId,
    /// The newest complete global checkpoint (DESIGN §2). Advances without changing `epoch`.
    #[serde(default)]
    pub gci_complete: u64,
    /// GCI ranges that system restarts of node groups rolled back, newest last (bounded): a
    /// GCI below `gci_complete` is durable for a group only if it is in none of its ranges.
    #[serde(default)]
    pub rolled_back: Vec<RolledBack>,
    /// Raised by every change of the SQL users (mgmd's user table, read with `ListUsers`).
    /// Advances without changing `epoch`: users are no part of the data path.
    #[serde(default)]
    pub users_version: u64,
    /// Where each table is in `tables`, built on the first lookup (see [`TableIndex`]).
    #[serde(skip)]
    pub table_index: TableIndex,
}

/// Positions of a map's tables by name and by id, so that finding a table (every key read of
/// every client does) does not scan the catalog: a feature store has hundreds of tables.
/// Built from `tables` on the first lookup. A copy starts empty (it may be changed, as mgmd
/// changes its own), and a lookup checks the table at the position it finds and scans when
/// that is not the one asked for or the name is not indexed: a stale index costs a scan,
/// never a wrong table.
#[derive(Default)]
pub struct TableIndex(std::sync::OnceLock<TablePositions>);

struct TablePositions {
    /// By a case-insensitive hash of the name (names compare case-insensitively); of two names
    /// with one hash the first is kept, the other found by scanning.
    by_name: crate::hash::IdMap<u64, usize>,
    by_id: crate::hash::IdMap<TableId, usize>,
}

impl TableIndex {
    fn positions(&self, tables: &[Table]) -> &TablePositions {
        self.0.get_or_init(|| {
            let mut by_name = crate::hash::IdMap::with_capacity_and_hasher(tables.len(), Default::default());
            let mut by_id = crate::hash::IdMap::with_capacity_and_hasher(tables.len(), Default::default());
            for (i, t) in tables.iter().enumerate() {
                by_name.entry(crate::hash::caseless_hash(&t.spec.name)).or_insert(i);
                by_id.entry(t.id).or_insert(i);
            }
            TablePositions { by_name, by_id }
        })
    }
}

impl Clone for TableIndex {
    fn clone(&self) -> TableIndex {
        TableIndex::default()
    }
}

/// Derived data: two maps with the same tables are equal whatever their indexes hold.
impl PartialEq for TableIndex {
    fn eq(&self, _: &TableIndex) -> bool {
        true
    }
}

impl std::fmt::Debug for TableIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TableIndex")
    }
}

/// Commits of `node_group` stamped with a GCI in (after, through] were rolled back by a
/// system restart of the group: they never became part of a complete global checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolledBack {
    pub node_group: u32,
    pub after: u64,
    pub through: u64,
}

impl ClusterState {
    /// Whether commits of `node_group` stamped `gci` are on disk for good: the checkpoint
    /// completed and no system restart of the group rolled it back.
    pub fn gci_durable(&self, gci: u64, node_group: u32) -> bool {
        gci <= self.gci_complete
            && !self.rolled_back.iter().any(|r| r.node_group == node_group && gci > r.after && gci <= r.through)
    }

    /// The lowest GCI the nodes of `node_group` may stamp: above every rolled-back range.
    pub fn gci_floor(&self, node_group: u32) -> u64 {
        self.rolled_back.iter().filter(|r| r.node_group == node_group).map(|r| r.through + 1).max().unwrap_or(0)
    }

    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    pub fn table(&self, name: &str) -> Option<&Table> {
        let at = self.table_index.positions(&self.tables).by_name.get(&crate::hash::caseless_hash(name)).copied();
        // The exact name first: callers mostly pass the catalog's own spelling, and comparing
        // ignoring case goes a byte at a time. With the word-wise name hash, a lookup of
        // `sbtest.sbtest1` went from about 460 instructions to 100.
        self.table_where(at, |t| t.spec.name == name || t.spec.name.eq_ignore_ascii_case(name))
    }

    pub fn table_by_id(&self, id: TableId) -> Option<&Table> {
        let at = self.table_index.positions(&self.tables).by_id.get(&id).copied();
        self.table_where(at, |t| t.id == id)
    }

    /// The table at the indexed position `at` if it is the one wanted, else the first wanted
    /// one (a stale index costs a scan, never a wrong table).
    fn table_where(&self, at: Option<usize>, wanted: impl Fn(&Table) -> bool) -> Option<&Table> {
        match at.and_then(|i| self.tables.get(i)) {
            Some(t) if wanted(t) => Some(t),
            _ => self.tables.iter().find(|t| wanted(t)),
        }
    }

    pub fn partition(&self, p: PartitionId) -> Option<&PartitionAssignment> {
        self.partitions.get(p as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_adds_within_the_column_range_and_keeps_null() {
        let apply = |d: &Delta, v: Value| {
            let mut row = vec![Value::Int(0), v];
            d.apply_to(&mut row).map(|()| row.pop().unwrap())
        };
        let d = Delta { column: 1, by: 1, min: -128, max: 127 };
        assert_eq!(apply(&d, Value::Int(5)).unwrap(), Value::Int(6));
        assert_eq!(apply(&d, Value::Null).unwrap(), Value::Null);
        assert_eq!(apply(&d, Value::Int(127)).unwrap_err().code, ErrorCode::TypeMismatch);
        let wide = Delta { column: 1, by: i64::MAX, min: i64::MIN, max: i64::MAX };
        assert_eq!(apply(&wide, Value::Int(1)).unwrap_err().code, ErrorCode::TypeMismatch);
        assert_eq!(apply(&d, Value::Text("x".into())).unwrap_err().code, ErrorCode::TypeMismatch);
        let far = Delta { column: 5, ..d };
        assert_eq!(apply(&far, Value::Int(5)).unwrap_err().code, ErrorCode::InvalidArgument);
    }

    #[test]
    fn tables_are_found_by_name_and_id_also_after_the_list_changed_under_the_index() {
        let table = |id: TableId, name: &str| {
            let spec = TableSpec {
                name: name.into(),
                columns: vec![Column::new("id", ColumnType::Int)],
                primary_key: vec![0],
                partition_key: vec![],
            };
            Table {
                id,
                spec,
                partition_count: 2,
                schema_version: 1,
                hidden_pk: false,
                indexes: vec![],
                read_only: false,
                triggers: vec![],
            }
        };
        let mut map =
            ClusterState { tables: (1..=50).map(|i| table(i, &format!("db.T{i}"))).collect(), ..Default::default() };
        assert_eq!(map.table("DB.t7").map(|t| t.id), Some(7));
        assert_eq!(map.table_by_id(42).map(|t| t.spec.name.as_str()), Some("db.T42"));
        assert!(map.table("db.t51").is_none() && map.table_by_id(51).is_none());
        // Changed in place after the index was built (as mgmd changes its own map): removed,
        // added and moved tables are still found right, missing ones still missing.
        map.tables.remove(0);
        map.tables.push(table(51, "db.t51"));
        assert_eq!(map.table("db.t7").map(|t| t.id), Some(7));
        assert_eq!(map.table_by_id(42).map(|t| t.id), Some(42));
        assert_eq!(map.table("db.T51").map(|t| t.id), Some(51));
        assert!(map.table("db.t1").is_none() && map.table_by_id(1).is_none());
        // A copy indexes afresh and compares equal.
        let copy = map.clone();
        assert_eq!(copy, map);
        assert_eq!(copy.table("db.t2").map(|t| t.id), Some(2));
    }
}

//! Unique indexes, enforced cluster-wide as NDB does: each unique index has a hidden table
//! (`Table::unique_table_spec`, made and dropped by mgmd with the index) keyed by the index
//! columns and holding the row's primary key. Every write to a table with unique indexes runs
//! in a cluster transaction that also keeps those tables: inserting an entry is the check (two
//! writers of one value meet on the entry's row lock; the second gets a duplicate key), and an
//! entry lives and dies with its row in the same commit. Rows with a NULL in the index columns
//! have no entry (NULLs never collide, as in MySQL).
//!
//! A batch of writes goes in phases, each one round trip: read the old rows (locked), delete
//! the entries that go, insert the entries that come, write the rows, and undo the entries of
//! the writes that failed. Uniqueness is therefore checked after the whole batch's old entries
//! are gone: `UPDATE t SET u = u + 1` succeeds where MySQL, checking row by row, may not.
//!
//! Writers are fenced by table id: a unique index on existing rows is built by copying the
//! table (`alter.rs`), so a SQL node that has not seen the index writes to the old table id and
//! gets SCHEMA_CHANGED. Only SQL nodes keep the entries; native-client writes to such tables
//! bypass them (the client API documents this).

use shoal_client::{Client, KeyOp, LockMode, OpOutcome, Transaction};
use shoal_proto::{ErrorCode, IndexSpec, ShoalError, Table, Value};

use crate::session::Session;
use crate::types::SqlType;

/// One row of a unique index's hidden table.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    /// Position of the index in `Table::indexes`.
    pub index: usize,
    pub table: String,
    /// The index columns' values, then the row's primary key.
    pub row: Vec<Value>,
    keys: usize,
}

impl Entry {
    pub fn key(&self) -> Vec<Value> {
        self.row[..self.keys].to_vec()
    }
}

pub(crate) fn has_unique(table: &Table) -> bool {
    table.unique_indexes().next().is_some()
}

/// The entries a full stored row puts into `table`'s unique indexes.
pub(crate) fn entries(table: &Table, row: &[Value]) -> Vec<Entry> {
    let mut out = vec![];
    for (index, ix) in table.indexes.iter().enumerate().filter(|(_, i)| i.unique) {
        let key = table.index_key(ix, row);
        if key.iter().any(|v| matches!(v, Value::Null)) {
            continue;
        }
        let keys = key.len();
        let mut entry = key;
        // A row whose hidden key is not chosen yet (looking for a holder) has no key part.
        entry.extend(table.spec.primary_key.iter().filter_map(|&c| row.get(c as usize).cloned()));
        out.push(Entry { index, table: table.unique_table_name(ix), row: entry, keys });
    }
    out
}

/// MySQL's 1062 text for a value taken in a unique index; `name` is the table as users call it.
pub(crate) fn duplicate(name: &str, table: &Table, ix: &IndexSpec, key: &[Value]) -> ShoalError {
    let shown: Vec<String> = ix
        .columns
        .iter()
        .zip(key)
        .map(|(&c, v)| {
            let v = SqlType::of_column(&table.columns()[c as usize]).load(v);
            v.to_string_lossy().unwrap_or_else(|| "NULL".into())
        })
        .collect();
    ShoalError::new(
        ErrorCode::DuplicateKey,
        format!("Duplicate entry '{}' for key '{name}.{}'", shown.join("-"), ix.name),
    )
}

/// Whether a duplicate-key error already says which key, in MySQL's words.
pub(crate) fn is_worded(e: &ShoalError) -> bool {
    e.code == ErrorCode::DuplicateKey && e.message.starts_with("Duplicate entry '")
}

fn short_name(table: &Table) -> &str {
    table.spec.name.split_once('.').map_or(table.spec.name.as_str(), |(_, n)| n)
}

/// What one write does to the unique indexes.
#[derive(Default)]
struct Plan {
    removes: Vec<Entry>,
    adds: Vec<Entry>,
    /// How many of `adds` went in (they are undone if the write fails).
    added: Vec<bool>,
    removed: Vec<bool>,
    failed: Option<ShoalError>,
}

impl Session {
    /// Whether key operations write to a table with unique indexes (they then go through
    /// `write_unique`).
    pub(crate) fn writes_unique(&self, ops: &[KeyOp]) -> bool {
        let map = self.client().map();
        ops.iter().any(|op| !matches!(op, KeyOp::Read { .. }) && map.table(op.table()).is_some_and(has_unique))
    }

    /// Runs writes that keep unique indexes: inside the open transaction, or in one of their
    /// own committed at the end (each write on its own succeeds or fails, as in a batch).
    pub(crate) async fn write_unique(&self, ops: Vec<KeyOp>) -> Vec<OpOutcome> {
        let own = !self.in_cluster_txn().await;
        let mut guard = self.txn.lock().await;
        if own {
            *guard = Some(self.client().begin());
        }
        let Some(tx) = guard.as_mut() else {
            return ops.iter().map(|_| Err(ShoalError::internal("no transaction"))).collect();
        };
        let lock = self.read_lock();
        let mut out = run(self.client(), tx, ops, lock).await;
        let aborted = out.iter().any(|o| matches!(o, Err(e) if e.code == ErrorCode::TxnAborted));
        if own || aborted {
            let Some(tx) = guard.take() else { return out };
            if aborted {
                let _ = tx.rollback().await;
            } else if let Err(e) = tx.commit().await {
                for o in out.iter_mut().filter(|o| o.is_ok()) {
                    *o = Err(e.clone());
                }
            }
        }
        out
    }

    /// The primary key of the row that holds one of `row`'s unique values (the row an
    /// `INSERT … ON DUPLICATE KEY UPDATE` updates), read under an exclusive lock.
    pub(crate) async fn unique_holder(&self, table: &Table, row: &[Value]) -> Result<Option<Vec<Value>>, ShoalError> {
        let reads: Vec<KeyOp> =
            entries(table, row).iter().map(|e| KeyOp::Read { table: e.table.clone(), key: e.key() }).collect();
        let keys = table.spec.primary_key.len();
        for found in self.kv_batch(reads).await {
            if let Some(entry) = found? {
                return Ok(Some(entry[entry.len() - keys..].to_vec()));
            }
        }
        Ok(None)
    }
}

/// The writes of one batch with their unique index entries, in the transaction.
async fn run(client: &Client, tx: &mut Transaction, mut ops: Vec<KeyOp>, read_lock: LockMode) -> Vec<OpOutcome> {
    let map = client.map();
    let tables: Vec<Option<&Table>> = ops
        .iter()
        .map(|op| map.table(op.table()).filter(|t| has_unique(t) && !matches!(op, KeyOp::Read { .. })))
        .collect();
    // Inserted rows need their hidden key now: entries hold it.
    for (op, t) in ops.iter_mut().zip(&tables) {
        if let (KeyOp::Insert { row, .. } | KeyOp::Upsert { row, .. }, Some(t)) = (op, t) {
            *row = client.with_hidden_key(t, std::mem::take(row));
        }
    }
    // 1. The rows as they are, locked.
    let mut reads = vec![];
    let mut read_of = vec![None; ops.len()];
    for (i, (op, t)) in ops.iter().zip(&tables).enumerate() {
        let Some(t) = t else { continue };
        let key = match op {
            KeyOp::Update { key, .. } | KeyOp::Delete { key, .. } => key.clone(),
            KeyOp::Upsert { row, .. } => t.key_of(row),
            _ => continue,
        };
        read_of[i] = Some(reads.len());
        reads.push((KeyOp::Read { table: op.table().to_string(), key }, LockMode::Exclusive));
    }
    let mut olds = vec![];
    for r in tx.execute(reads).await {
        match r {
            Ok(row) => olds.push(row),
            Err(e) => return ops.iter().map(|_| Err(e.clone())).collect(),
        }
    }
    // 2. What each write changes in the indexes.
    let mut plans: Vec<Plan> = Vec::with_capacity(ops.len());
    for (i, (op, t)) in ops.iter().zip(&tables).enumerate() {
        let Some(t) = t else {
            plans.push(Plan::default());
            continue;
        };
        let old = read_of[i].and_then(|r| olds[r].clone());
        let new = match op {
            KeyOp::Insert { row, .. } | KeyOp::Upsert { row, .. } => Some(row.clone()),
            KeyOp::Update { columns, values, deltas, .. } => {
                match old.clone().map(|r| updated(r, columns, values, deltas)).transpose() {
                    Ok(new) => new,
                    Err(e) => return ops.iter().map(|_| Err(e.clone())).collect(),
                }
            }
            _ => None,
        };
        let before = old.as_deref().map(|r| entries(t, r)).unwrap_or_default();
        let after = new.as_deref().map(|r| entries(t, r)).unwrap_or_default();
        let removes: Vec<Entry> = before.iter().filter(|e| !after.contains(e)).cloned().collect();
        let adds: Vec<Entry> = after.iter().filter(|e| !before.contains(e)).cloned().collect();
        plans.push(Plan {
            added: vec![false; adds.len()],
            removed: vec![false; removes.len()],
            removes,
            adds,
            failed: None,
        });
    }
    // REPLACE: rows holding one of the new row's unique values go first, as in MySQL.
    if let Err(e) = replace_holders(tx, &ops, &tables, &mut plans).await {
        return ops.iter().map(|_| Err(e.clone())).collect();
    }
    // 3. Entries that go.
    let mut dels = vec![];
    for (i, p) in plans.iter().enumerate() {
        for (j, e) in p.removes.iter().enumerate() {
            dels.push(((i, j), (KeyOp::Delete { table: e.table.clone(), key: e.key() }, LockMode::None)));
        }
    }
    let (at, batch): (Vec<_>, Vec<_>) = dels.into_iter().unzip();
    for ((i, j), r) in at.into_iter().zip(tx.execute(batch).await) {
        match r {
            Ok(_) => plans[i].removed[j] = true,
            Err(e) if e.code == ErrorCode::KeyNotFound => {}
            Err(e) => {
                plans[i].failed.get_or_insert(e);
            }
        }
    }
    // 4. Entries that come: the uniqueness check.
    let mut ins = vec![];
    for (i, p) in plans.iter().enumerate().filter(|(_, p)| p.failed.is_none()) {
        for (j, e) in p.adds.iter().enumerate() {
            ins.push(((i, j), (KeyOp::Insert { table: e.table.clone(), row: e.row.clone() }, LockMode::None)));
        }
    }
    let (at, batch): (Vec<_>, Vec<_>) = ins.into_iter().unzip();
    for ((i, j), r) in at.into_iter().zip(tx.execute(batch).await) {
        match r {
            Ok(_) => plans[i].added[j] = true,
            Err(e) => {
                let e = match (e.code, tables[i]) {
                    (ErrorCode::DuplicateKey, Some(t)) => {
                        let entry = &plans[i].adds[j];
                        duplicate(short_name(t), t, &t.indexes[entry.index], &entry.key())
                    }
                    _ => e,
                };
                plans[i].failed.get_or_insert(e);
            }
        }
    }
    // 5. The writes themselves.
    let mut out: Vec<Option<OpOutcome>> = plans.iter().map(|p| p.failed.clone().map(Err)).collect();
    let go: Vec<usize> = (0..ops.len()).filter(|&i| out[i].is_none()).collect();
    let batch = go
        .iter()
        .map(|&i| {
            let lock = if matches!(ops[i], KeyOp::Read { .. }) { read_lock } else { LockMode::None };
            (ops[i].clone(), lock)
        })
        .collect();
    for (i, r) in go.into_iter().zip(tx.execute(batch).await) {
        out[i] = Some(r);
    }
    // 6. Failed writes take their entry changes back.
    let mut undo = vec![];
    // (Writes to tables without unique indexes have empty plans: nothing to undo.)
    for (p, _) in plans.iter().zip(&out).filter(|(_, o)| matches!(o, Some(Err(_)))) {
        for (e, _) in p.adds.iter().zip(&p.added).filter(|(_, &a)| a) {
            undo.push((KeyOp::Delete { table: e.table.clone(), key: e.key() }, LockMode::None));
        }
        for (e, _) in p.removes.iter().zip(&p.removed).filter(|(_, &r)| r) {
            undo.push((KeyOp::Insert { table: e.table.clone(), row: e.row.clone() }, LockMode::None));
        }
    }
    if !undo.is_empty() {
        // An entry this batch's other writes took over cannot go back: the batch's effects are
        // tangled, and only rolling the whole transaction back is right.
        if let Some(e) = tx.execute(undo).await.into_iter().find_map(|r| r.err()) {
            let e = ShoalError::new(
                ErrorCode::TxnAborted,
                format!("undoing a failed write's unique index entries failed ({e}); the transaction is rolled back"),
            );
            return ops.iter().map(|_| Err(e.clone())).collect();
        }
    }
    out.into_iter().map(|o| o.unwrap_or_else(|| Err(ShoalError::internal("write without outcome")))).collect()
}

/// For each REPLACE: deletes the other rows that hold one of its new unique values (their
/// entries go too), so its entries can go in.
async fn replace_holders(
    tx: &mut Transaction,
    ops: &[KeyOp],
    tables: &[Option<&Table>],
    plans: &mut [Plan],
) -> Result<(), ShoalError> {
    for (i, op) in ops.iter().enumerate() {
        let (KeyOp::Upsert { table: name, row }, Some(t)) = (op, tables[i]) else { continue };
        let own_key = t.key_of(row);
        let reads =
            plans[i].adds.iter().map(|e| (KeyOp::Read { table: e.table.clone(), key: e.key() }, LockMode::Exclusive));
        let mut holders: Vec<Vec<Value>> = vec![];
        let width = own_key.len();
        for r in tx.execute(reads.collect()).await {
            if let Some(entry) = r? {
                let key = entry[entry.len() - width..].to_vec();
                if key != own_key && !holders.contains(&key) {
                    holders.push(key);
                }
            }
        }
        for key in holders {
            let got =
                tx.execute(vec![(KeyOp::Read { table: name.clone(), key: key.clone() }, LockMode::Exclusive)]).await;
            let Some(Ok(Some(other))) = got.into_iter().next() else { continue };
            let mut batch: Vec<(KeyOp, LockMode)> = entries(t, &other)
                .iter()
                .map(|e| (KeyOp::Delete { table: e.table.clone(), key: e.key() }, LockMode::None))
                .collect();
            batch.push((KeyOp::Delete { table: name.clone(), key }, LockMode::None));
            for r in tx.execute(batch).await {
                match r {
                    Ok(_) => {}
                    Err(e) if e.code == ErrorCode::KeyNotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

/// A row after an update's assignments and increments.
fn updated(
    mut r: Vec<Value>,
    columns: &[u32],
    values: &[Value],
    deltas: &[shoal_client::Delta],
) -> Result<Vec<Value>, ShoalError> {
    for (&c, v) in columns.iter().zip(values) {
        if let Some(slot) = r.get_mut(c as usize) {
            *slot = v.clone();
        }
    }
    for d in deltas {
        d.apply_to(&mut r)?;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::{Column, ColumnType, TableSpec};

    fn table() -> Table {
        Table {
            id: 7,
            spec: TableSpec {
                name: "db.t".into(),
                columns: vec![
                    Column::new("k", ColumnType::Int),
                    Column::new("a", ColumnType::Int).nullable(),
                    Column::new("b", ColumnType::Text).nullable(),
                ],
                primary_key: vec![0],
                partition_key: vec![0],
            },
            partition_count: 4,
            schema_version: 1,
            hidden_pk: false,
            indexes: vec![
                IndexSpec { id: 1, name: "PRIMARY".into(), columns: vec![0], unique: false, prefix_lens: vec![] },
                IndexSpec { id: 2, name: "ua".into(), columns: vec![1], unique: true, prefix_lens: vec![] },
                IndexSpec { id: 3, name: "uab".into(), columns: vec![1, 2], unique: true, prefix_lens: vec![] },
            ],
            read_only: false,
            triggers: vec![],
        }
    }

    #[test]
    fn entries_skip_nulls_and_carry_the_primary_key() {
        let t = table();
        let row = vec![Value::Int(1), Value::Int(5), Value::Null];
        let e = entries(&t, &row);
        assert_eq!(e.len(), 1, "a NULL in (a, b) leaves uab without an entry");
        assert_eq!((e[0].index, e[0].table.as_str()), (1, "db.#unique-7-2"));
        assert_eq!(e[0].row, vec![Value::Int(5), Value::Int(1)]);
        assert_eq!(e[0].key(), vec![Value::Int(5)]);
        let full = entries(&t, &[Value::Int(2), Value::Int(5), Value::Text("x".into())]);
        assert_eq!(full[1].row, vec![Value::Int(5), Value::Text("x".into()), Value::Int(2)]);
        assert!(full[0].key() == e[0].key() && full[0] != e[0], "same value, other row");
    }

    #[test]
    fn prefix_indexes_hold_prefixes() {
        let mut t = table();
        t.indexes[2].prefix_lens = vec![0, 2];
        let e = entries(&t, &[Value::Int(2), Value::Int(5), Value::Text("héllo".into())]);
        assert_eq!(e[1].key(), vec![Value::Int(5), Value::Text("hé".into())], "characters, not bytes");
        let short = entries(&t, &[Value::Int(2), Value::Int(5), Value::Text("h".into())]);
        assert_eq!(short[1].key(), vec![Value::Int(5), Value::Text("h".into())]);
    }

    #[test]
    fn duplicates_are_worded_as_mysql_words_them() {
        let t = table();
        let e = duplicate("t", &t, &t.indexes[2], &[Value::Int(5), Value::Text("x".into())]);
        assert_eq!(e.message, "Duplicate entry '5-x' for key 't.uab'");
        assert!(is_worded(&e));
        assert!(!is_worded(&ShoalError::new(ErrorCode::DuplicateKey, "key exists")));
    }
}

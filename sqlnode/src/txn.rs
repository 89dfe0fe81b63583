//! SQL transactions on cluster transactions: BEGIN / START TRANSACTION, COMMIT, ROLLBACK,
//! `autocommit = 0`, `SELECT … FOR UPDATE` / `FOR SHARE` (`LOCK IN SHARE MODE`).
//!
//! While a transaction is open every key read and write of the session goes through it: writes
//! lock their rows and stay invisible to others until COMMIT; key reads see the transaction's
//! own writes; reads under FOR UPDATE / FOR SHARE (and the reads UPDATE and DELETE make to find
//! their rows) lock what they return. A scan reads committed rows at the data nodes; inside a
//! transaction that wrote the table, the rows at the keys it wrote come through the
//! transaction instead (`Session::scan_rows`), so every read sees its own writes, as in
//! MySQL. When the cluster rolls the transaction back
//! (error 1213) the session's transaction is gone, as in MySQL; a lock wait timeout (1205)
//! fails the statement and leaves the transaction open. Outside a transaction each statement
//! commits on its own, as before.

use std::sync::atomic::Ordering;

use shoal_client::{KeyOp, LockMode, OpOutcome, RowDecoder};
use shoal_proto::aggregate::{Aggregate, Partial};
use shoal_proto::{ErrorCode, ShoalError, Value};

use crate::error::{code, SqlError, SqlResult};
use crate::session::Outcome;
use crate::session::Session;
use crate::sql::parse::SavepointOp;

pub(crate) fn lock_code(l: LockMode) -> u8 {
    match l {
        LockMode::None => 0,
        LockMode::Shared => 1,
        LockMode::Exclusive => 2,
    }
}

fn lock_of(c: u8) -> LockMode {
    match c {
        1 => LockMode::Shared,
        2 => LockMode::Exclusive,
        _ => LockMode::None,
    }
}

impl Session {
    /// The lock reads of the running statement take inside a transaction.
    pub(crate) fn read_lock(&self) -> LockMode {
        lock_of(self.read_lock.load(Ordering::Relaxed))
    }

    pub(crate) fn set_read_lock(&self, l: LockMode) {
        self.read_lock.store(lock_code(l), Ordering::Relaxed);
    }

    /// Whether statements run inside a cluster transaction now (opening one when autocommit
    /// is off).
    pub(crate) async fn in_cluster_txn(&self) -> bool {
        let mut t = self.txn.lock().await;
        if t.is_none() && !self.autocommit {
            *t = Some(self.client().begin());
        }
        t.is_some()
    }

    /// Forgets a transaction the cluster rolled back.
    async fn drop_if_aborted<'e>(&self, errors: impl IntoIterator<Item = &'e ShoalError>) {
        if errors.into_iter().any(|e| e.code == ErrorCode::TxnAborted) {
            if let Some(t) = self.txn.lock().await.take() {
                let _ = t.rollback().await;
            }
        }
    }

    /// The primary keys of `table` the session's open transaction wrote (empty outside one):
    /// a scan lays the transaction's rows at those keys over its own (`Session::scan_rows`).
    pub(crate) async fn txn_written(&self, table: &str) -> Vec<Vec<Value>> {
        self.txn.lock().await.as_ref().map(|t| t.written_keys(table)).unwrap_or_default()
    }

    /// Whether the session's open transaction wrote `table`.
    pub(crate) async fn txn_wrote(&self, table: &str) -> bool {
        self.txn.lock().await.as_ref().is_some_and(|t| t.has_written(table))
    }

    /// Key operations: through the open transaction (reads with the statement's lock), or each
    /// committed on its own.
    pub(crate) async fn kv_batch(&self, ops: Vec<KeyOp>) -> Vec<OpOutcome> {
        if self.writes_unique(&ops) {
            return self.write_unique(ops).await;
        }
        if !self.in_cluster_txn().await {
            return self.client().batch(ops).await;
        }
        let lock = self.read_lock();
        let out = {
            let mut t = self.txn.lock().await;
            match t.as_mut() {
                Some(tx) => tx.execute(ops.into_iter().map(|o| (o, lock)).collect()).await,
                None => return self.client().batch(ops).await,
            }
        };
        self.drop_if_aborted(out.iter().filter_map(|o| o.as_ref().err())).await;
        out
    }

    pub(crate) async fn kv_get(&self, table: &str, key: Vec<Value>) -> Result<Option<Vec<Value>>, ShoalError> {
        let op = KeyOp::Read { table: table.into(), key };
        self.kv_batch(vec![op]).await.pop().unwrap_or_else(|| Err(ShoalError::internal("no outcome")))
    }

    /// Reads rows by key; `columns`: the only columns the caller needs (empty = all). Lock-free
    /// reads ask the data nodes for just those, so the other columns may come back NULL.
    pub(crate) async fn kv_batch_get(
        &self,
        table: &str,
        keys: Vec<Vec<Value>>,
        columns: &[u32],
    ) -> Result<Vec<Option<Vec<Value>>>, ShoalError> {
        if !self.in_cluster_txn().await {
            return self.client().batch_get_columns(table, keys, columns).await;
        }
        if self.read_lock() == LockMode::None {
            let out = {
                let mut t = self.txn.lock().await;
                match t.as_mut() {
                    Some(tx) => tx.get_many_columns(table, keys, columns).await,
                    None => return self.client().batch_get_columns(table, keys, columns).await,
                }
            };
            self.drop_if_aborted(out.iter().filter_map(|o| o.as_ref().err())).await;
            return out.into_iter().collect();
        }
        let ops = keys.into_iter().map(|key| KeyOp::Read { table: table.into(), key }).collect();
        self.kv_batch(ops).await.into_iter().collect()
    }

    /// The rows of a run of `count` integer primary keys from `lo` ([`Access::KeyRun`]), in
    /// key order, read as [`Session::kv_batch_get`] reads keys: lock-free reads as range reads
    /// where they can be (`Client::read_key_range`), locking ones key by key.
    ///
    /// [`Access::KeyRun`]: crate::sql::plan::Access::KeyRun
    pub(crate) async fn kv_key_run<D: RowDecoder>(
        &self,
        table: &str,
        lo: i128,
        count: u32,
        columns: &[u32],
        rows: &D,
    ) -> Result<Vec<D::Row>, ShoalError> {
        if !self.in_cluster_txn().await {
            return self.client().read_key_range_as(table, lo, count, columns, rows).await;
        }
        if self.read_lock() == LockMode::None {
            let out = {
                let mut t = self.txn.lock().await;
                match t.as_mut() {
                    Some(tx) => tx.read_key_range_as(table, lo, count, columns, rows).await,
                    None => return self.client().read_key_range_as(table, lo, count, columns, rows).await,
                }
            };
            self.drop_if_aborted(out.as_ref().err()).await;
            return out;
        }
        let keys = self.client().run_keys(table, lo, count);
        Ok(self.kv_batch_get(table, keys, columns).await?.into_iter().flatten().map(|row| rows.convert(row)).collect())
    }

    /// The aggregates `aggs` of the rows of a run of keys, folded in the data nodes
    /// ([`Client::aggregate_key_range`]), where [`Session::kv_key_run`] would read the rows as
    /// range reads: lock-free, and in a transaction only while it has written nothing. None:
    /// read the rows.
    ///
    /// [`Client::aggregate_key_range`]: shoal_client::Client::aggregate_key_range
    pub(crate) async fn kv_key_run_aggregates(
        &self,
        table: &str,
        lo: i128,
        count: u32,
        aggs: &[Aggregate],
    ) -> Option<Vec<Partial>> {
        if !self.in_cluster_txn().await {
            return self.client().aggregate_key_range(table, lo, count, aggs).await;
        }
        if self.read_lock() != LockMode::None {
            return None;
        }
        let t = self.txn.lock().await;
        match t.as_ref() {
            Some(tx) => tx.aggregate_key_range(table, lo, count, aggs).await,
            None => self.client().aggregate_key_range(table, lo, count, aggs).await,
        }
    }

    /// Opens a transaction for one statement when autocommit is on and none is open; returns
    /// whether it did (then `end_implicit` must close it).
    pub(crate) async fn begin_implicit(&self) -> bool {
        let mut t = self.txn.lock().await;
        if t.is_some() || !self.autocommit {
            return false;
        }
        *t = Some(self.client().begin());
        true
    }

    /// Commits the statement's own transaction if it succeeded, rolls it back otherwise.
    pub(crate) async fn end_implicit<T>(&self, implicit: bool, out: SqlResult<T>) -> SqlResult<T> {
        if !implicit {
            return out;
        }
        // None when the cluster already rolled it back (the statement then failed).
        let Some(t) = self.txn.lock().await.take() else { return out };
        match out {
            Ok(v) => t.commit().await.map(|_| v).map_err(|e| crate::error::SqlError::from_cluster(&e)),
            Err(e) => {
                let _ = t.rollback().await;
                Err(e)
            }
        }
    }

    /// The savepoint a write statement runs under inside a transaction (None outside one,
    /// where the statement's own transaction is all or nothing). Savepoints below the
    /// session's oldest SQL SAVEPOINT (or below this one) are let go at the data nodes.
    pub(crate) async fn statement_savepoint(&self) -> Option<u64> {
        if !self.in_transaction && self.autocommit {
            return None;
        }
        let mut t = self.txn.lock().await;
        if t.is_none() && !self.autocommit {
            *t = Some(self.client().begin());
        }
        let tx = t.as_mut()?;
        let sp = tx.savepoint();
        let oldest = self.savepoints.iter().filter(|s| s.1 == tx.id()).map(|s| s.2).min();
        tx.keep_savepoints_from(oldest.unwrap_or(sp));
        Some(sp)
    }

    /// Takes back what a failed statement wrote under savepoint `sp`; returns the error to
    /// report: the statement's own, or 1213 when the undo failed and the cluster rolled the
    /// whole transaction back (which the session then forgets).
    pub(crate) async fn undo_statement(&self, sp: u64, e: SqlError) -> SqlError {
        let mut t = self.txn.lock().await;
        let Some(tx) = t.as_mut() else { return e };
        match tx.rollback_to(sp).await {
            Ok(()) => e,
            Err(undo) => {
                t.take();
                SqlError::from_cluster(&undo)
            }
        }
    }

    /// SAVEPOINT, ROLLBACK TO SAVEPOINT, RELEASE SAVEPOINT (names compare ignoring case). Outside
    /// a transaction SAVEPOINT is accepted and keeps nothing (each statement commits on its
    /// own), as in MySQL; ROLLBACK TO and RELEASE then find no savepoint (1305).
    pub(crate) async fn savepoint_statement(&mut self, op: SavepointOp) -> SqlResult<Outcome> {
        let mut t = self.txn.lock().await;
        if t.is_none() && !self.autocommit {
            *t = Some(self.client().begin());
        }
        let id = t.as_ref().map(|tx| tx.id());
        // Savepoints of an earlier transaction are gone with it.
        self.savepoints.retain(|s| Some(s.1) == id);
        let at = |name: &str| self.savepoints.iter().position(|s| s.0.eq_ignore_ascii_case(name));
        let missing = |name: &str| SqlError::new(code::SP_DOES_NOT_EXIST, format!("SAVEPOINT {name} does not exist"));
        match op {
            SavepointOp::Set(name) => {
                let Some(tx) = t.as_mut().filter(|_| self.in_transaction || !self.autocommit) else {
                    return Ok(Outcome::ok());
                };
                if let Some(i) = at(&name) {
                    self.savepoints.remove(i);
                }
                let sp = tx.savepoint();
                self.savepoints.push((name, tx.id(), sp));
            }
            SavepointOp::RollbackTo(name) => {
                let (Some(i), Some(tx)) = (at(&name), t.as_mut()) else { return Err(missing(&name)) };
                let sp = self.savepoints[i].2;
                if let Err(e) = tx.rollback_to(sp).await {
                    t.take();
                    self.savepoints.clear();
                    return Err(SqlError::from_cluster(&e));
                }
                // The later savepoints go; this one stays, to be rolled back to again.
                self.savepoints.truncate(i + 1);
            }
            SavepointOp::Release(name) => {
                let Some(i) = at(&name) else { return Err(missing(&name)) };
                self.savepoints.truncate(i);
            }
        }
        Ok(Outcome::ok())
    }

    /// BEGIN: commits an open transaction first, as MySQL does.
    pub(crate) async fn txn_begin(&self) -> SqlResult<()> {
        self.txn_commit().await?;
        *self.txn.lock().await = Some(self.client().begin());
        Ok(())
    }

    pub(crate) async fn txn_commit(&self) -> SqlResult<()> {
        let Some(t) = self.txn.lock().await.take() else { return Ok(()) };
        t.commit().await.map(|_| ()).map_err(|e| crate::error::SqlError::from_cluster(&e))
    }

    pub(crate) async fn txn_rollback(&self) -> SqlResult<()> {
        let Some(t) = self.txn.lock().await.take() else { return Ok(()) };
        t.rollback().await.map_err(|e| crate::error::SqlError::from_cluster(&e))
    }
}

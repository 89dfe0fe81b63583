//! SQL transactions on cluster transactions: BEGIN / START TRANSACTION, COMMIT, ROLLBACK,
//! `autocommit = 0`, `SELECT … FOR UPDATE` / `FOR SHARE` (`LOCK IN SHARE MODE`).
//!
//! While a transaction is open every key read and write of the session goes through it: writes
//! lock their rows and stay invisible to others until COMMIT; key reads see the transaction's
//! own writes; reads under FOR UPDATE / FOR SHARE (and the reads UPDATE and DELETE make to find
//! their rows) lock what they return. A scan without a lock reads committed rows only (it does
//! not see the transaction's own pending writes). When the cluster rolls the transaction back
//! (error 1213) the session's transaction is gone, as in MySQL; a lock wait timeout (1205)
//! fails the statement and leaves the transaction open. Outside a transaction each statement
//! commits on its own, as before.

use std::sync::atomic::Ordering;

use shoal_client::{KeyOp, LockMode, OpOutcome, RowDecoder};
use shoal_proto::aggregate::{Aggregate, Partial};
use shoal_proto::{ErrorCode, ShoalError, Value};

use crate::error::SqlResult;
use crate::session::Session;

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

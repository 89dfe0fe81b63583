//! Client side of transactions (see `datanode/src/txn.rs` for the protocol).
//!
//! `Client::begin` opens a transaction; its operations go straight to the primary of each
//! one's partition (batched per data node) and take row locks there; `commit` asks the
//! coordinator — the primary of the first partition the transaction touched — to commit
//! everything, atomically across partitions and node groups. A dropped transaction that was
//! not committed is rolled back in the background.
//!
//! Errors a caller should answer by running the whole transaction again: TXN_ABORTED (a
//! failure or timeout rolled it back) and LOCK_WAIT_TIMEOUT (a lock was not granted in time,
//! also how deadlocks are broken; the transaction is still open and may be rolled back).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use shoal_proto::convert::check;
use shoal_proto::pb;
use shoal_proto::{ErrorCode, NodeId, PartitionId, ShoalError, TableId};

use crate::{Client, Durability, KeyOp, OpOutcome, Result, Row, RowDecoder, Values};

/// The lock a read takes in a transaction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LockMode {
    /// READ COMMITTED, no lock (writes always lock exclusively).
    #[default]
    None,
    /// `LOCK IN SHARE MODE`.
    Shared,
    /// `FOR UPDATE`.
    Exclusive,
}

pub struct Transaction {
    client: Client,
    id: u64,
    /// The coordinator, chosen at the first operation.
    tc: Option<NodeId>,
    /// Partitions where the transaction holds work or locks, and the node holding them: if the
    /// partition's primary changes, that work is gone and the transaction must abort (running
    /// on at the new primary would act on reads whose locks were lost).
    parts: BTreeMap<(TableId, PartitionId), (NodeId, u64)>,
    /// The primary key of every row the transaction wrote, or tried to, per table: a scan
    /// reads committed rows only, so a caller that scans inside the transaction reads these
    /// keys through it and lays them over the scan ([`Transaction::written_keys`]).
    written: BTreeMap<TableId, Written>,
    /// The savepoint the operations run under now, the last one started (0: none; see
    /// [`Transaction::savepoint`]), and the lowest one that may still be rolled back to.
    savepoint: u64,
    keep_from: u64,
    /// The savepoint of the last write sent: a rollback to a later one has nothing to undo.
    wrote_under: u64,
    finished: bool,
}

/// The keys written in one table, each once (by its encoding).
#[derive(Default)]
struct Written {
    seen: std::collections::HashSet<Vec<u8>>,
    keys: Vec<Row>,
}

/// An operation on its way to a primary: its index in the call, the op, its lock mode, and
/// its partition.
type Routed = (usize, pb::Op, i32, (TableId, PartitionId));
/// A routed operation as sent: with the node it went to and the term the transaction held
/// its partition under there before (0: none).
type Sent = (usize, pb::Op, i32, (TableId, PartitionId), NodeId, u64);

fn aborted(why: impl Into<String>) -> ShoalError {
    ShoalError::new(ErrorCode::TxnAborted, why.into())
}

impl Client {
    /// Opens a transaction.
    pub fn begin(&self) -> Transaction {
        let n = self.inner.hidden_next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Ids count up from a random 31-bit prefix; single writes' lock owners count down from
        // u64::MAX, so the two never meet. Data nodes rely on this layout: a transaction waits
        // only briefly for an older one of the same prefix (datanode/src/partition.rs).
        // Top bit clear, prefix above bit 32, counter below.
        let id = (self.inner.hidden_prefix >> 1) | (n & 0xffff_ffff);
        Transaction {
            client: self.clone(),
            id,
            tc: None,
            parts: BTreeMap::new(),
            written: BTreeMap::new(),
            savepoint: 0,
            keep_from: 0,
            wrote_under: 0,
            finished: false,
        }
    }
}

impl Transaction {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Reads a row, taking `lock` on it.
    pub async fn get(&mut self, table: &str, key: Row, lock: LockMode) -> Result<Option<Row>> {
        self.one(KeyOp::Read { table: table.into(), key }, lock).await
    }

    pub async fn insert(&mut self, table: &str, row: Row) -> Result<()> {
        self.one(KeyOp::Insert { table: table.into(), row }, LockMode::None).await.map(|_| ())
    }

    pub async fn upsert(&mut self, table: &str, row: Row) -> Result<()> {
        self.one(KeyOp::Upsert { table: table.into(), row }, LockMode::None).await.map(|_| ())
    }

    /// Sets `columns` (by position) to `values` in the row with primary key `key`.
    pub async fn update(&mut self, table: &str, key: Row, columns: Vec<u32>, values: Row) -> Result<()> {
        self.one(KeyOp::Update { table: table.into(), key, columns, values, deltas: vec![] }, LockMode::None)
            .await
            .map(|_| ())
    }

    pub async fn delete(&mut self, table: &str, key: Row) -> Result<()> {
        self.one(KeyOp::Delete { table: table.into(), key }, LockMode::None).await.map(|_| ())
    }

    /// Scans `table` for rows matching every filter and locks each one it returns with `lock`
    /// (`SELECT … FOR UPDATE` / `LOCK IN SHARE MODE` over a scan). The scan finds candidates
    /// without locks; each is then read again under its lock and kept only if it still
    /// matches, so every row returned is locked and current. Rows inserted by others after the
    /// scan passed are not seen (no gap locks). At most `max_rows` rows.
    pub async fn scan_locked(
        &mut self,
        table: &str,
        filters: Vec<shoal_proto::filter::Filter>,
        lock: LockMode,
        max_rows: usize,
    ) -> Result<Vec<Row>> {
        use tokio_stream::StreamExt;
        let t = self.client.table(table)?;
        let key_cols: Vec<usize> = t.spec.primary_key.iter().map(|&c| c as usize).collect();
        let mut keys = vec![];
        let mut stream = self.client.scan(table, filters.clone(), vec![]);
        while let Some(row) = stream.next().await {
            let row = row?;
            keys.push(key_cols.iter().map(|&c| row[c].clone()).collect::<Row>());
            if keys.len() > max_rows {
                return Err(ShoalError::new(
                    ErrorCode::TooManyLocks,
                    format!("a locking scan returns at most {max_rows} rows"),
                ));
            }
        }
        let mut out = vec![];
        for chunk in keys.chunks(500) {
            let ops = chunk.iter().map(|k| (KeyOp::Read { table: table.into(), key: k.clone() }, lock)).collect();
            for r in self.execute(ops).await {
                if let Some(row) = r? {
                    if filters.iter().all(|f| f.matches(&row)) {
                        out.push(row);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether the transaction is open with no work of its own anywhere yet (its reads before
    /// its writes): its lock-free reads then see what autocommit reads see, and go their way.
    fn untouched(&self) -> bool {
        !self.finished && self.parts.is_empty()
    }

    /// Whether every operation is a read without a lock on a partition where the transaction
    /// holds no work (so it cannot see a pending write of its own there).
    fn plain_reads_only(&self, ops: &[(KeyOp, LockMode)]) -> bool {
        let plain = |(op, lock): &(KeyOp, LockMode)| *lock == LockMode::None && matches!(op, KeyOp::Read { .. });
        if !ops.iter().all(plain) {
            return false;
        }
        // A transaction with no work anywhere yet (its reads before its writes) needs no
        // routing: only otherwise is each key's partition worked out (once more in `batch`).
        if self.parts.is_empty() {
            return true;
        }
        let map = self.client.map();
        ops.iter().all(|(op, _)| {
            self.client.prepare(&map, op).is_ok_and(|p| !self.parts.contains_key(&(p.op.table_id, p.partition)))
        })
    }

    async fn one(&mut self, op: KeyOp, lock: LockMode) -> Result<Option<Row>> {
        self.execute(vec![(op, lock)]).await.pop().unwrap_or_else(|| Err(ShoalError::internal("no outcome")))
    }

    /// Lock-free reads of many keys of one table, asking only for `columns` (empty = all; the
    /// rest come back NULL) when the transaction has no work of its own where they land (the
    /// reads then go the batched autocommit way, as in `execute`); whole rows otherwise.
    pub async fn get_many_columns(&mut self, table: &str, keys: Vec<Row>, columns: &[u32]) -> Vec<OpOutcome> {
        if self.untouched() {
            // No work of its own anywhere yet (its reads before its writes): see `plain_reads_only`.
            // At the primary even for a client that reads as the primary from any replica:
            // with its key reads apart from the primary reads of its other statements (range
            // reads, reads after its writes), each kind batched on its own, sysbench
            // `oltp_read_write` at 16 threads lost 5% (benchmarks.md, "Twenty-fifth session").
            return self.client.read_many_as(table, keys, columns, false).await;
        }
        let ops = keys.into_iter().map(|key| (KeyOp::Read { table: table.into(), key }, LockMode::None)).collect();
        self.execute_fetching(ops, columns).await
    }

    /// The rows of a run of `count` integer keys from `lo`, read without locks, in key order
    /// ([`Client::read_key_range`]): as range reads while the transaction has no work of its
    /// own anywhere (its reads before its writes), key by key through the transaction
    /// otherwise, so it sees its own pending writes.
    pub async fn read_key_range(&mut self, table: &str, lo: i128, count: u32, columns: &[u32]) -> Result<Vec<Row>> {
        self.read_key_range_as(table, lo, count, columns, &Values).await
    }

    /// [`Transaction::read_key_range`], the rows decoded by `rows`.
    pub async fn read_key_range_as<D: RowDecoder>(
        &mut self,
        table: &str,
        lo: i128,
        count: u32,
        columns: &[u32],
        rows: &D,
    ) -> Result<Vec<D::Row>> {
        if self.untouched() {
            return self.client.read_key_range_as(table, lo, count, columns, rows).await;
        }
        let keys = self.client.run_keys(table, lo, count);
        let found = self.get_many_columns(table, keys, columns).await.into_iter().filter_map(Result::transpose);
        found.map(|row| row.map(|row| rows.convert(row))).collect()
    }

    /// [`Client::aggregate_key_range`], while this transaction has written nothing (its reads
    /// then see what autocommit reads see); None otherwise, and the caller reads the rows.
    pub async fn aggregate_key_range(
        &self,
        table: &str,
        lo: i128,
        count: u32,
        aggs: &[shoal_proto::aggregate::Aggregate],
    ) -> Option<Vec<shoal_proto::aggregate::Partial>> {
        if !self.untouched() {
            return None;
        }
        self.client.aggregate_key_range(table, lo, count, aggs).await
    }

    /// Runs operations in the transaction, batched per data node.
    pub async fn execute(&mut self, ops: Vec<(KeyOp, LockMode)>) -> Vec<OpOutcome> {
        self.execute_fetching(ops, &[]).await
    }

    /// [`Transaction::execute`]; lock-free reads that go the autocommit way fetch only
    /// `columns` (empty = all).
    async fn execute_fetching(&mut self, ops: Vec<(KeyOp, LockMode)>, columns: &[u32]) -> Vec<OpOutcome> {
        if self.finished {
            return ops.iter().map(|_| Err(aborted("the transaction is finished"))).collect();
        }
        if self.plain_reads_only(&ops) {
            // Lock-free reads of rows this transaction has not touched read the committed
            // image, as autocommit reads do: they go the batched autocommit way, and their
            // partitions do not become participants of the commit.
            let ops = ops.into_iter().map(|(op, _)| op).collect();
            let read_backup = self.client.inner.opts.read_backup;
            return self.client.run_batch(ops, read_backup, None, columns).await.0;
        }
        let deadline = Instant::now() + self.client.inner.opts.deadline;
        let mut out: Vec<Option<OpOutcome>> = vec![None; ops.len()];
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        let mut backoff = Duration::from_millis(5);
        // As in `Client::batch`: a retry must not land in a table swapped in under the name.
        let mut pinned: Vec<Option<u32>> = vec![None; ops.len()];
        while !pending.is_empty() {
            let map = self.client.map();
            let mut retry = vec![];
            let by_node = self.route(&map, &ops, &pending, &mut pinned, &mut out, &mut retry);
            for (_, op, _, _) in by_node.values().flatten() {
                self.note_written(&map, op);
            }
            if self.tc.is_none() {
                self.tc = by_node.keys().next().copied();
            }
            let tc = self.tc.unwrap_or(0);
            let sends = by_node.into_iter().map(|(node, items)| {
                let (items, req) = self.request(map.epoch, tc, node, items);
                let client = self.client.clone();
                async move {
                    let resp = match client.txn_links(node) {
                        Ok(links) => links.execute.call(req).await,
                        Err(e) => Err(e),
                    };
                    (items, resp)
                }
            });
            for (items, resp) in futures::future::join_all(sends).await {
                let resp = resp.and_then(|r| check(r.error.clone()).map(|()| r));
                match resp {
                    Ok(r) => {
                        for (k, ((i, _, _, slot, node, _), mut res)) in items.into_iter().zip(r.results).enumerate() {
                            if r.holds.get(k).copied().unwrap_or(false) {
                                self.parts.insert(slot, (node, r.terms.get(k).copied().unwrap_or(0)));
                            }
                            match check(res.error.take()) {
                                Ok(()) => out[i] = Some(crate::row_of(&map, &mut Default::default(), pinned[i], &res)),
                                Err(e) if e.is_retriable() && !self.parts.contains_key(&slot) => retry.push(i),
                                Err(e) if e.is_retriable() => {
                                    out[i] = Some(Err(aborted(format!("the transaction's partition moved: {e}"))))
                                }
                                Err(e) => out[i] = Some(Err(e)),
                            }
                        }
                    }
                    Err(e) => {
                        for (i, _, _, slot, _, _) in items {
                            if e.is_retriable() && !self.parts.contains_key(&slot) {
                                retry.push(i);
                            } else {
                                out[i] = Some(Err(if e.is_retriable() { aborted(e.to_string()) } else { e.clone() }));
                            }
                        }
                    }
                }
            }
            if retry.is_empty() || Instant::now() + backoff >= deadline {
                for i in retry {
                    out[i] = Some(Err(ShoalError::new(ErrorCode::Timeout, "no primary answered in time")));
                }
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(200));
            let _ = self.client.refresh().await;
            pending = retry;
        }
        out.into_iter().map(|o| o.unwrap_or_else(|| Err(ShoalError::internal("operation without outcome")))).collect()
    }

    /// Records the key a routed write names (before it is sent: a write whose outcome is
    /// unknown may have taken effect, and reading a key the transaction did not change
    /// through it costs only the read).
    fn note_written(&mut self, map: &shoal_proto::ClusterState, op: &pb::Op) {
        if op.kind == pb::OpKind::Read as i32 {
            return;
        }
        self.wrote_under = self.savepoint;
        let Some(table) = map.table_by_id(op.table_id) else { return };
        let key = match pb::OpKind::try_from(op.kind) {
            Ok(pb::OpKind::Insert | pb::OpKind::Upsert) => {
                table.key_of(&shoal_proto::convert::values_from_pb(op.row.clone()))
            }
            _ => shoal_proto::convert::values_from_pb(op.key.clone()),
        };
        let Ok(encoded) = shoal_proto::codec::encode_key_ref(table, &key) else { return };
        let w = self.written.entry(op.table_id).or_default();
        if w.seen.insert(encoded) {
            w.keys.push(key);
        }
    }

    /// The primary keys of the rows of `table` this transaction wrote, or tried to (each
    /// once, in the order first written). Empty when it wrote none, or when another table
    /// now has the name.
    pub fn written_keys(&self, table: &str) -> Vec<Row> {
        let map = self.client.map();
        let Some(t) = map.table(table) else { return vec![] };
        self.written.get(&t.id).map(|w| w.keys.clone()).unwrap_or_default()
    }

    /// Whether this transaction wrote, or tried to write, a row of `table`.
    pub fn has_written(&self, table: &str) -> bool {
        self.client.map().table(table).is_some_and(|t| self.written.contains_key(&t.id))
    }

    /// Routes `ops[i]`, for each i in `pending`, to its partition's primary: per node, each
    /// op's index, its encoding, lock mode and partition. An op that cannot go anywhere gets
    /// its error in `out`; one whose partition has no primary right now goes to `retry`.
    fn route(
        &self,
        map: &shoal_proto::ClusterState,
        ops: &[(KeyOp, LockMode)],
        pending: &[usize],
        pinned: &mut [Option<u32>],
        out: &mut [Option<OpOutcome>],
        retry: &mut Vec<usize>,
    ) -> BTreeMap<NodeId, Vec<Routed>> {
        let mut by_node: BTreeMap<NodeId, Vec<Routed>> = BTreeMap::new();
        for &i in pending {
            if pinned[i].is_some_and(|t| map.table(ops[i].0.table()).map(|x| x.id) != Some(t)) {
                out[i] = Some(Err(crate::schema_changed()));
                continue;
            }
            let prepared = match self.client.prepare(map, &ops[i].0) {
                Ok(p) => {
                    pinned[i] = Some(p.op.table_id);
                    p
                }
                Err(e) => {
                    out[i] = Some(Err(e));
                    continue;
                }
            };
            let slot = (prepared.op.table_id, prepared.partition);
            let primary = map.partitions.get(prepared.partition as usize).and_then(|p| p.primary);
            if let Some(&(held_at, _)) = self.parts.get(&slot) {
                if primary != Some(held_at) {
                    out[i] = Some(Err(aborted(format!(
                        "partition {} moved from node {held_at} during the transaction",
                        slot.1
                    ))));
                    continue;
                }
            }
            match primary {
                Some(n) => {
                    let lock = match ops[i].1 {
                        LockMode::None => pb::LockMode::None,
                        LockMode::Shared => pb::LockMode::Shared,
                        LockMode::Exclusive => pb::LockMode::Exclusive,
                    } as i32;
                    by_node.entry(n).or_default().push((i, prepared.op, lock, slot));
                }
                None => retry.push(i),
            }
        }
        by_node
    }

    /// The request carrying one node's routed ops, and the ops with their node and the term
    /// the transaction already holds their partition under (0: none yet).
    fn request(&self, epoch: u64, tc: NodeId, node: NodeId, items: Vec<Routed>) -> (Vec<Sent>, pb::TxnExecuteRequest) {
        let items: Vec<Sent> = items
            .into_iter()
            .map(|(i, op, l, slot)| {
                let held_term = self.parts.get(&slot).map_or(0, |&(_, t)| t);
                (i, op, l, slot, node, held_term)
            })
            .collect();
        let req = pb::TxnExecuteRequest {
            epoch,
            txn_id: self.id,
            tc,
            ops: items.iter().map(|(_, op, _, _, _, _)| op.clone()).collect(),
            locks: items.iter().map(|(_, _, l, _, _, _)| *l).collect(),
            held_terms: items.iter().map(|(_, _, _, _, _, t)| *t).collect(),
            savepoint: self.savepoint,
            keep_from: self.keep_from,
            rollback_to: 0,
        };
        (items, req)
    }

    /// Starts a savepoint: the operations from now on run under it, and
    /// [`Transaction::rollback_to`] with the number returned undoes their writes and those of
    /// every later savepoint. Each data node keeps, per key and savepoint, the image the key
    /// had before (counted against `max_txn_operations`) until the transaction ends or
    /// [`Transaction::keep_savepoints_from`] lets it go. Numbers grow from 1.
    pub fn savepoint(&mut self) -> u64 {
        self.savepoint += 1;
        self.savepoint
    }

    /// Savepoints below `from` will not be rolled back to: the data nodes drop what would undo
    /// them with the transaction's next operations there.
    pub fn keep_savepoints_from(&mut self, from: u64) {
        self.keep_from = from;
    }

    /// Undoes every write the transaction made under savepoint `to` or a later one (its
    /// locks stay, as InnoDB's do); the operations from then on run under a new savepoint.
    /// If a data node holding its work cannot be told, the whole transaction is rolled back
    /// and TXN_ABORTED returned: committing it could have kept what was to be undone.
    pub async fn rollback_to(&mut self, to: u64) -> Result<()> {
        if self.finished {
            return Err(aborted("the transaction is finished"));
        }
        let (Some(tc), false, true) = (self.tc, self.parts.is_empty(), self.wrote_under >= to) else {
            // Nothing was written since: nothing to undo anywhere.
            self.savepoint();
            return Ok(());
        };
        let map = self.client.map();
        let nodes: BTreeSet<NodeId> = self.parts.values().map(|&(node, _)| node).collect();
        let sends = nodes.into_iter().map(|node| {
            let req = pb::TxnExecuteRequest {
                epoch: map.epoch,
                txn_id: self.id,
                tc,
                rollback_to: to,
                keep_from: self.keep_from,
                ..Default::default()
            };
            let client = self.client.clone();
            async move {
                let links = client.txn_links(node)?;
                check(links.execute.call(req).await?.error)
            }
        });
        let failed = futures::future::join_all(sends).await.into_iter().find_map(Result::err);
        if let Some(e) = failed {
            self.finished = true;
            let _ = self.finish(true, vec![]).await;
            return Err(aborted(format!("rolling back to a savepoint failed, the transaction is rolled back: {e}")));
        }
        self.savepoint();
        Ok(())
    }

    /// Commits; returns the global checkpoint the transaction was committed in (0 when it wrote
    /// nothing). With `Durability::Sync` it returns once that checkpoint is complete.
    pub async fn commit(self) -> Result<u64> {
        self.commit_with(vec![]).await
    }

    /// Runs `writes` and commits, one round trip shorter than `execute` and then `commit`: the
    /// writes ride on the commit to the coordinator, which hands each participant its share
    /// with the PREPARE (or the one-phase COMMIT), and the participant runs them first. All or
    /// nothing: if one fails, the transaction is rolled back and that write's error returned
    /// (a duplicate key as such; anything retriable as `TXN_ABORTED`). Writes only: there is
    /// nowhere to return a read's row.
    pub async fn commit_with(mut self, writes: Vec<KeyOp>) -> Result<u64> {
        if writes.iter().any(|w| matches!(w, KeyOp::Read { .. })) {
            return Err(ShoalError::new(ErrorCode::InvalidArgument, "only writes ride on a commit"));
        }
        // On an error below, dropping `self` rolls the transaction back.
        let ops: Vec<(KeyOp, LockMode)> = writes.into_iter().map(|w| (w, LockMode::None)).collect();
        let map = self.client.map();
        let mut out: Vec<Option<OpOutcome>> = vec![None; ops.len()];
        let mut retry = vec![];
        let pending: Vec<usize> = (0..ops.len()).collect();
        let by_node = self.route(&map, &ops, &pending, &mut vec![None; ops.len()], &mut out, &mut retry);
        if let Some(e) = out.into_iter().flatten().find_map(Result::err) {
            return Err(e);
        }
        if !retry.is_empty() {
            return Err(aborted("a written partition has no primary right now"));
        }
        if self.tc.is_none() {
            self.tc = by_node.keys().next().copied();
        }
        let tc = self.tc.unwrap_or(0);
        let mut execute = vec![];
        for (node, items) in by_node {
            let (items, req) = self.request(map.epoch, tc, node, items);
            for (_, _, _, slot, node, held_term) in items {
                self.parts.entry(slot).or_insert((node, held_term));
            }
            execute.push(pb::TxnWrites { node, req: Some(req) });
        }
        self.finished = true;
        let gci = self.finish(false, execute).await?;
        if self.client.durability() == Durability::Sync && gci > 0 {
            let map = self.client.map();
            let groups: BTreeSet<u32> = self
                .parts
                .keys()
                .filter_map(|&(_, p)| map.partitions.get(p as usize).map(|pa| pa.node_group))
                .collect();
            let until = Instant::now() + crate::MIN_DURABLE_WAIT.max(self.client.inner.opts.deadline);
            for g in groups {
                self.client.wait_durable(gci, g, until).await?;
            }
        }
        Ok(gci)
    }

    /// Rolls back: every lock is freed and nothing the transaction wrote becomes visible.
    pub async fn rollback(mut self) -> Result<()> {
        self.finished = true;
        self.finish(true, vec![]).await.map(|_| ())
    }

    /// Asks the coordinator to commit (with `execute`, the writes riding on the commit) or to
    /// roll back.
    async fn finish(&mut self, rollback: bool, execute: Vec<pb::TxnWrites>) -> Result<u64> {
        let Some(tc) = self.tc else { return Ok(0) };
        if self.parts.is_empty() {
            return Ok(0);
        }
        let req = pb::TxnCommitRequest {
            txn_id: self.id,
            parts: self.parts.keys().map(|&(t, p)| pb::TxnPart { table_id: t, partition: p }).collect(),
            rollback,
            execute,
        };
        // The coordinator must be the node that ran the first operations (it is their
        // participant too); if it is gone, the transaction is gone with it.
        let links = self.client.txn_links(tc)?;
        let timeout = self.client.inner.opts.deadline;
        let resp = match tokio::time::timeout(timeout, links.commit.call(req)).await {
            Err(_) => {
                return Err(ShoalError::new(ErrorCode::Timeout, "no answer from the coordinator: outcome unknown"))
            }
            // The request may have reached the coordinator before the stream broke.
            Ok(Err(e)) if !rollback => {
                return Err(ShoalError::new(ErrorCode::Timeout, format!("{}; outcome unknown", e.message)))
            }
            Ok(Err(e)) => return Err(e),
            Ok(Ok(r)) => r,
        };
        check(resp.error)?;
        Ok(resp.gci)
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        if self.finished || self.parts.is_empty() {
            return;
        }
        // Not committed: roll back now rather than holding locks until the inactivity timeout.
        let mut rest = Transaction {
            client: self.client.clone(),
            id: self.id,
            tc: self.tc,
            parts: std::mem::take(&mut self.parts),
            written: BTreeMap::new(),
            savepoint: 0,
            keep_from: 0,
            wrote_under: 0,
            finished: true,
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = rest.finish(true, vec![]).await;
            });
        }
    }
}

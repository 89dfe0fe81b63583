//! Range reads: the rows of a run of consecutive integer primary keys (a SQL node's `id
//! BETWEEN 5 AND 104`), in key order. The keys of such a run are numbers whose 8-byte encoding
//! counts up (`codec::int_key_run`), so instead of encoding, routing and sending a hundred keys
//! the client sends each data node serving the table one operation naming the run's start, its
//! length and the partitions that node answers for; the node counts through the run, keeps
//! the keys that hash to those partitions and sends back a row per key of the run (empty
//! where it has none: `shoal_proto::packed_rows`). Encoding and sending the keys of
//! sysbench's 100-key ranges was a tenth of a SQL node's instructions per `oltp_read_write`
//! transaction.
//!
//! A range read asks every node that serves a partition of the table, whether or not a key of
//! the run lands there, so short runs go key by key (`Client::read_many`), as does any run
//! whose range reads fail for any reason: that path has the retries and map refreshes.

use shoal_proto::aggregate::{Aggregate, Partial};
use shoal_proto::packed_rows::PackedRows;
use shoal_proto::{codec, pb, ClusterState, ColumnType, NodeId, PartitionId, ShoalError, Table, Value};

use crate::{route, Client, Row, RowDecoder, Values};

/// Fewest keys per partition of the table a run needs to go as range reads.
const MIN_KEYS_PER_PARTITION: u32 = 2;

/// The keys of a run, as values of the key column's type (`Int` when the table is unknown: the
/// key-by-key read then reports that); keys the type cannot hold have no row and are left out.
fn run_keys(map: &ClusterState, table: &str, lo: i128, count: u32) -> Vec<Row> {
    let unsigned = map.table(table).and_then(codec::int_key_type) == Some(ColumnType::Uint);
    (lo..lo.saturating_add(i128::from(count)))
        .filter_map(|k| match unsigned {
            true => u64::try_from(k).ok().map(Value::Uint),
            false => i64::try_from(k).ok().map(Value::Int),
        })
        .map(|v| vec![v])
        .collect()
}

/// Where a run of `count` keys from `lo` of `t` starts in the key encoding, when it goes as
/// range reads: keys the key type holds, and enough of them per partition.
fn range_start(t: &Table, lo: i128, count: u32) -> Option<u64> {
    codec::int_key_run(t, lo, count).filter(|_| count >= t.partition_count.saturating_mul(MIN_KEYS_PER_PARTITION))
}

/// A range read of the run of `count` keys of `t` from `start`, its partitions not yet named.
fn range_op(t: &Table, start: u64, count: u32) -> pb::Op {
    pb::Op {
        kind: pb::OpKind::Read as i32,
        table_id: t.id,
        range_start: start,
        range_count: count,
        ..Default::default()
    }
}

/// Each node's share of a range read of `table`: the partitions it serves (in order), by the
/// route every read takes. None when a partition has no node to ask.
fn shares(
    map: &ClusterState,
    table: &Table,
    read_backup: bool,
    spread: usize,
) -> Option<Vec<(NodeId, Vec<PartitionId>)>> {
    let mut out: Vec<(NodeId, Vec<PartitionId>)> = vec![];
    for p in 0..table.partition_count {
        let node = route(map, p, true, read_backup, None, spread)?;
        match out.iter_mut().find(|(n, _)| *n == node) {
            Some((_, parts)) => parts.push(p),
            None => out.push((node, vec![p])),
        }
    }
    Some(out)
}

/// The rows of a run of `count` keys from the answers of every share's range read, in key
/// order, decoded by `rows`; None when an answer is anything but a clean one (an error, not
/// one row per key of the run, a key answered by two nodes, or the older form without packed
/// rows that a data node predating packing sends): the run then goes key by key.
fn merge<D: RowDecoder>(
    table: &Table,
    count: u32,
    answers: Vec<Result<Vec<pb::OpResult>, ShoalError>>,
    rows: &D,
) -> Option<Result<Vec<D::Row>, ShoalError>> {
    let mut shares = Vec::with_capacity(answers.len());
    for answer in answers {
        let [mut r] = <[pb::OpResult; 1]>::try_from(answer.ok()?).ok()?;
        if r.error.is_some() || !r.row_offsets.is_empty() {
            return None;
        }
        let packed = PackedRows::from_pb(&mut r).ok()?;
        if packed.len() != count as usize {
            return None;
        }
        shares.push(packed);
    }
    // One pass: the decoded rows go straight into the answer (collecting per-row results and
    // then the rows out of them was a second pass and a second vector). After a damaged row
    // the rest is only checked for keys answered twice, which still send the run key by key.
    let mut out = Vec::with_capacity(count as usize);
    let mut damaged = None;
    for at in 0..count as usize {
        let mut row: &[u8] = &[];
        for share in &shares {
            let r = share.get(at);
            if !r.is_empty() {
                if !row.is_empty() {
                    return None;
                }
                row = r;
            }
        }
        if row.is_empty() || damaged.is_some() {
            continue;
        }
        match rows.decode(table, row) {
            Ok(r) => out.push(r),
            Err(e) => damaged = Some(e),
        }
    }
    Some(match damaged {
        Some(e) => Err(e),
        None => Ok(out),
    })
}

impl Client {
    /// The keys of the run of `count` integers from `lo`, as `table`'s key values: for reading
    /// them key by key (a locking read).
    pub fn run_keys(&self, table: &str, lo: i128, count: u32) -> Vec<Row> {
        run_keys(&self.map(), table, lo, count)
    }

    /// The rows of `table` whose primary key is one of the `count` integers from `lo` up, in
    /// key order (keys without a row are left out), read without locks and asking for
    /// `columns` (empty = all; the rest come back NULL).
    pub async fn read_key_range(
        &self,
        table: &str,
        lo: i128,
        count: u32,
        columns: &[u32],
    ) -> Result<Vec<Row>, ShoalError> {
        self.read_key_range_as(table, lo, count, columns, &Values).await
    }

    /// [`Client::read_key_range`], the rows decoded by `rows`.
    pub async fn read_key_range_as<D: RowDecoder>(
        &self,
        table: &str,
        lo: i128,
        count: u32,
        columns: &[u32],
        rows: &D,
    ) -> Result<Vec<D::Row>, ShoalError> {
        let map = self.map();
        if let Some(t) = map.table(table) {
            if let Some(start) = range_start(t, lo, count) {
                if let Some(found) = self.range_read(&map, t, start, count, columns, rows).await {
                    return found;
                }
                // A node that failed, a map that changed, or a data node too old to know range
                // reads (it answers an error: the read names no key).
                tracing::debug!(table, lo, count, "range read failed; reading the run key by key");
            }
        }
        let keys = run_keys(&map, table, lo, count);
        let found = self.read_many(table, keys, columns).await.into_iter().filter_map(Result::transpose);
        found.map(|row| row.map(|row| rows.convert(row))).collect()
    }

    /// One range read per node serving `t`; None when anything failed.
    async fn range_read<D: RowDecoder>(
        &self,
        map: &ClusterState,
        t: &Table,
        start: u64,
        count: u32,
        columns: &[u32],
        rows: &D,
    ) -> Option<Result<Vec<D::Row>, ShoalError>> {
        let op = pb::Op { columns: columns.to_vec(), packed_rows: true, ..range_op(t, start, count) };
        merge(t, count, self.send_shares(map, t, op).await?, rows)
    }

    /// `op` (a range read of `t`) sent to every node serving `t`, each with the partitions it
    /// answers for; their answers, or None when a partition has no node to ask.
    async fn send_shares(
        &self,
        map: &ClusterState,
        t: &Table,
        op: pb::Op,
    ) -> Option<Vec<Result<Vec<pb::OpResult>, ShoalError>>> {
        let read_backup = self.inner.opts.read_backup;
        let spread = self.inner.spread.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sends = shares(map, t, read_backup, spread)?.into_iter().map(|(node, key_partitions)| {
            let op = pb::Op { key_partitions, ..op.clone() };
            self.send(node, pb::BatchRequest { epoch: map.epoch, read_backup, ops: vec![op], ..Default::default() })
        });
        Some(futures::future::join_all(sends).await)
    }

    /// The aggregates `aggs` of the rows of a run of `count` keys from `lo` (as
    /// [`Client::read_key_range`] reads them, without locks), folded where the rows are
    /// (`shoal_proto::aggregate`): one partial per aggregate, every node's share merged. None
    /// when the run does not go as range reads or anything failed: the caller then reads the
    /// rows, the way with the retries.
    pub async fn aggregate_key_range(
        &self,
        table: &str,
        lo: i128,
        count: u32,
        aggs: &[Aggregate],
    ) -> Option<Vec<Partial>> {
        let map = self.map();
        let t = map.table(table)?;
        let start = range_start(t, lo, count)?;
        let op = pb::Op { aggregates: aggs.iter().map(|a| a.to_pb()).collect(), ..range_op(t, start, count) };
        let mut out = vec![Partial::default(); aggs.len()];
        for answer in self.send_shares(&map, t, op).await? {
            let [r] = <[pb::OpResult; 1]>::try_from(answer.ok()?).ok()?;
            if r.error.is_some() || r.aggregates.len() != aggs.len() {
                return None;
            }
            for ((sum, share), a) in out.iter_mut().zip(&r.aggregates).zip(aggs) {
                sum.merge(a.kind, Partial::from_pb(share).ok()?).ok()?;
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_many::tests::{packed_rows, table};
    use shoal_proto::bytes::Bytes;

    fn row(t: &Table, k: i64) -> Bytes {
        Bytes::from(codec::encode_row(t, &[Value::Int(k), Value::Text(format!("r{k}"))]).unwrap())
    }

    /// A node's share as it answers: one row per key of the run (empty where it has none).
    fn answer(rows: &[Bytes]) -> Result<Vec<pb::OpResult>, ShoalError> {
        let mut r = pb::OpResult::default();
        packed_rows(rows).into_pb(&mut r);
        Ok(vec![r])
    }

    #[test]
    fn the_shares_rows_come_back_in_key_order_and_anything_odd_goes_key_by_key() {
        let t = table();
        let none = Bytes::new;
        // Two nodes' shares of a run of 5 from 10: rows at places 0, 1 and 3 (node A), 2 (node
        // B); key 14 has no row.
        let a = answer(&[row(&t, 10), row(&t, 11), none(), row(&t, 13), none()]);
        let b = answer(&[none(), none(), row(&t, 12), none(), none()]);
        let rows = merge(&t, 5, vec![a.clone(), b], &Values).unwrap().unwrap();
        let keys: Vec<_> = rows.iter().map(|r| r[0].clone()).collect();
        assert_eq!(keys, [10, 11, 12, 13].map(Value::Int));
        assert_eq!(rows[2][1], Value::Text("r12".into()));
        // An error, an answer not one row per key, a key answered twice, the older form.
        let err = Ok(vec![pb::OpResult { error: Some(ShoalError::internal("x").into()), ..Default::default() }]);
        assert!(merge(&t, 5, vec![err], &Values).is_none());
        assert!(merge(&t, 5, vec![Err(ShoalError::internal("down"))], &Values).is_none());
        assert!(merge(&t, 5, vec![answer(&[row(&t, 10)])], &Values).is_none());
        assert!(merge(&t, 5, vec![a.clone(), a], &Values).is_none());
        assert!(merge(&t, 5, vec![Ok(vec![])], &Values).is_none());
        let older = pb::OpResult { rows: vec![row(&t, 10)], row_offsets: vec![0], ..Default::default() };
        assert!(merge(&t, 1, vec![Ok(vec![older])], &Values).is_none());
        // A damaged row is an error, not a missing row.
        assert!(merge(&t, 1, vec![answer(&[row(&t, 10).slice(..2)])], &Values).unwrap().is_err());
    }

    #[test]
    fn key_by_key_the_run_takes_the_key_columns_type() {
        let mut map = ClusterState::default();
        let mut t = table();
        map.tables.push(t.clone());
        assert_eq!(run_keys(&map, "d.t", -1, 2), vec![vec![Value::Int(-1)], vec![Value::Int(0)]]);
        t.spec.columns[0].ty = ColumnType::Uint;
        map.tables = vec![t];
        assert_eq!(run_keys(&map, "d.t", 3, 1), vec![vec![Value::Uint(3)]]);
        assert_eq!(run_keys(&map, "d.x", 3, 1), vec![vec![Value::Int(3)]]);
        assert_eq!(run_keys(&map, "d.t", -2, 3), vec![vec![Value::Uint(0)]]);
    }
}

//! Lock-free reads of many keys of one table (`batch_get`, a SQL node's IN lists, short key
//! ranges and point selects) in one pass over the keys: each key is encoded and routed once,
//! the keys of a data node go as one many-key read (see `many_key.rs`), and the rows are
//! decoded straight from the answer. The general path (`Client::run_batch`) builds an
//! operation, a routing entry and a result per key, which cost a SQL node more than the data
//! node's lookups did. Whatever this pass cannot finish — an error of any kind, a partition
//! with no replica to ask, a table the map does not know — goes the general way, with its
//! retries and map refreshes.

use shoal_proto::bytes::Bytes;
use shoal_proto::packed_rows::PackedRows;
use shoal_proto::{codec, pb, ClusterState, NodeId, PartitionId, ShoalError, Table};

use crate::{route, schema_changed, Client, KeyOp, OpOutcome, Row, MAX_OPS_PER_REQUEST};

/// The keys one request carries to one data node.
#[derive(Debug, PartialEq)]
struct Request {
    node: NodeId,
    /// Where each key is in the caller's list.
    at: Vec<usize>,
    keys: Vec<Bytes>,
    partitions: Vec<PartitionId>,
}

/// Groups routed keys `(position, encoded key, partition, node)` by node, in their order, at
/// most `MAX_OPS_PER_REQUEST` keys per request (a data node's batch limit counts keys).
fn group(routed: Vec<(usize, Bytes, PartitionId, NodeId)>) -> Vec<Request> {
    let mut out: Vec<Request> = vec![];
    // Index in `out` of each node's request being filled: a cluster has a handful of nodes.
    let mut open: Vec<(NodeId, usize)> = vec![];
    // Sized for every key up front (short-lived; each node gets a share): growing three
    // vectors from empty cost 1% of a SQL node's instructions on sysbench's 100-key ranges.
    let room = routed.len().min(MAX_OPS_PER_REQUEST);
    for (at, key, partition, node) in routed {
        let slot = match open.iter().find(|(n, _)| *n == node) {
            Some(&(_, i)) if out[i].keys.len() < MAX_OPS_PER_REQUEST => i,
            _ => {
                let (at, keys, partitions) =
                    (Vec::with_capacity(room), Vec::with_capacity(room), Vec::with_capacity(room));
                out.push(Request { node, at, keys, partitions });
                open.retain(|(n, _)| *n != node);
                open.push((node, out.len() - 1));
                out.len() - 1
            }
        };
        let r = &mut out[slot];
        r.at.push(at);
        r.keys.push(key);
        r.partitions.push(partition);
    }
    out
}

/// The read to send for a request: a lone key goes as a plain read.
fn read_op(table: &Table, r: Request, columns: &[u32]) -> (Vec<usize>, pb::Op) {
    if let ([key], [partition]) = (r.keys.as_slice(), r.partitions.as_slice()) {
        return (r.at, key_read(table, columns, key.clone(), *partition));
    }
    let op = pb::Op {
        kind: pb::OpKind::Read as i32,
        table_id: table.id,
        columns: columns.to_vec(),
        keys: r.keys,
        key_partitions: r.partitions,
        packed_rows: true,
        ..Default::default()
    };
    (r.at, op)
}

/// A plain read of one encoded key.
fn key_read(table: &Table, columns: &[u32], key: Bytes, partition: PartitionId) -> pb::Op {
    pb::Op {
        kind: pb::OpKind::Read as i32,
        table_id: table.id,
        columns: columns.to_vec(),
        key_data: key,
        partition,
        ..Default::default()
    }
}

/// Where `key` of `table` goes: its encoding, partition and the node to ask (None when the
/// partition has no replica to ask, which the general way waits for); an error for a key that
/// does not fit the table. `spread` picks among the replicas of a read that may go to any
/// (see `route`).
fn place(
    map: &ClusterState,
    table: &Table,
    key: &Row,
    read_backup: bool,
    spread: usize,
) -> Result<Option<(Bytes, PartitionId, NodeId)>, ShoalError> {
    let (encoded, partition) = locate(table, key)?;
    let node = route(map, partition, true, read_backup, None, spread);
    Ok(node.map(|node| (Bytes::from(encoded), partition, node)))
}

/// `key` of `table` encoded, and its partition.
fn locate(table: &Table, key: &Row) -> Result<(Vec<u8>, PartitionId), ShoalError> {
    let encoded = codec::encode_key_ref(table, key)?;
    let partition = codec::partition_of_encoded_key(table, &encoded)?;
    Ok((encoded, partition))
}

/// The rows of an answer to [`read_op`] for `n` keys, each decoded with `table`'s layout (the
/// table id the read named); None when the answer is anything else (an error, a short answer),
/// which sends its keys the general way.
fn rows_of(table: &Table, n: usize, answer: Result<Vec<pb::OpResult>, ShoalError>) -> Option<Vec<OpOutcome>> {
    if n == 1 {
        return row_of(table, answer).map(|row| vec![row]);
    }
    let [mut r] = <[pb::OpResult; 1]>::try_from(answer.ok()?).ok()?;
    if r.error.is_some() {
        return None;
    }
    let rows = PackedRows::from_pb(&mut r).ok()?;
    let decode = |row: &[u8]| match row.is_empty() {
        true => Ok(None),
        false => codec::decode_row(table, row).map(Some),
    };
    (rows.len() == n).then(|| rows.iter().map(decode).collect())
}

/// The row of an answer to a plain read of one key, as [`rows_of`] gives it.
fn row_of(table: &Table, answer: Result<Vec<pb::OpResult>, ShoalError>) -> Option<OpOutcome> {
    let [r] = <[pb::OpResult; 1]>::try_from(answer.ok()?).ok()?;
    if r.error.is_some() {
        return None;
    }
    Some(match r.found {
        true => codec::decode_row(table, &r.row_data).map(Some),
        false => Ok(None),
    })
}

impl Client {
    /// Reads `keys` of `table` without locks, asking for `columns` (empty = all; the rest come
    /// back NULL): one outcome per key, in order, as [`Client::batch`] gives them.
    pub async fn read_many(&self, table: &str, keys: Vec<Row>, columns: &[u32]) -> Vec<OpOutcome> {
        self.read_many_as(table, keys, columns, true).await
    }

    /// [`Client::read_many`]; without `anywhere` at the primary (or, for a read-backup client,
    /// any replica) even for a client that reads as the primary from any replica.
    pub(crate) async fn read_many_as(
        &self,
        table: &str,
        keys: Vec<Row>,
        columns: &[u32],
        anywhere: bool,
    ) -> Vec<OpOutcome> {
        let (read_backup, as_primary) = self.key_reads(anywhere);
        let map: std::sync::Arc<ClusterState> = self.map();
        let Some(t) = map.table(table) else {
            // Unknown here: the general way looks at the newest map once.
            let ops = keys.into_iter().map(|key| KeyOp::Read { table: table.into(), key }).collect();
            return self.run_batch(ops, self.inner.opts.read_backup, None, columns).await.0;
        };
        // Reads that may go to any replica take turns between them or keep to this client's home
        // replica, whichever the client measured to read more (`replica_turns`); a client with a
        // home replica for lone reads (the SQL node) takes turns with its many-key reads.
        let probed = read_backup && !self.inner.opts.home_replica;
        let spread = if probed && self.inner.turns.home_for(keys.len()) {
            self.inner.home
        } else {
            self.inner.spread.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        };
        if let [key] = keys.as_slice() {
            if let Some(row) = self.read_one(&map, t, key, columns, spread, (read_backup, as_primary)).await {
                return vec![row];
            }
            return self.read_again(table, t, &keys, &[0], columns).await;
        }
        let mut out: Vec<Option<OpOutcome>> = vec![None; keys.len()];
        let mut slow: Vec<usize> = vec![];
        let mut routed = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            match place(&map, t, key, read_backup, spread) {
                Ok(Some((k, p, node))) => routed.push((i, k, p, node)),
                Ok(None) => slow.push(i),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let sends = group(routed).into_iter().map(|r| {
            let node = r.node;
            let (at, op) = read_op(t, r, columns);
            let req =
                pb::BatchRequest { epoch: map.epoch, read_backup, ops: vec![op], as_primary, ..Default::default() };
            async move { (at.len(), at, self.send(node, req).await) }
        });
        for (n, at, answer) in futures::future::join_all(sends).await {
            match rows_of(t, n, answer) {
                Some(rows) => at.into_iter().zip(rows).for_each(|(i, row)| out[i] = Some(row)),
                None => slow.extend(at),
            }
        }
        if !slow.is_empty() {
            slow.sort_unstable();
            let results = self.read_again(table, t, &keys, &slow, columns).await;
            for (i, r) in slow.into_iter().zip(results) {
                out[i] = Some(r);
            }
        }
        out.into_iter().map(|o| o.unwrap_or_else(|| Err(ShoalError::internal("read without outcome")))).collect()
    }

    /// A lone key, read as [`Client::read_many`] reads each key without grouping them by node,
    /// which cost a point select a dozen allocations (the grouping's vectors, a copy of the
    /// key, the futures joined); None when it must go the general way.
    async fn read_one(
        &self,
        map: &ClusterState,
        t: &Table,
        key: &Row,
        columns: &[u32],
        spread: usize,
        (read_backup, as_primary): (bool, bool),
    ) -> Option<OpOutcome> {
        let (encoded, partition) = match locate(t, key) {
            Ok(located) => located,
            Err(e) => return Some(Err(e)),
        };
        // Read as the primary by a client with a home replica: there (`Client::home_route`),
        // through the batcher that routing looked at; otherwise taking turns with the other
        // replicas.
        let read = (read_backup, as_primary);
        let home =
            if as_primary && self.inner.opts.home_replica { self.home_route(map, partition, read) } else { None };
        let (node, batcher) = match home {
            Some(routed) => routed,
            None => {
                let node = route(map, partition, true, read_backup, None, spread)?;
                (node, self.batcher(node, read, false).ok()?)
            }
        };
        let ops = vec![key_read(t, columns, Bytes::from(encoded), partition)];
        let req = pb::BatchRequest { epoch: map.epoch, read_backup, ops, as_primary, ..Default::default() };
        row_of(t, crate::send_through(node, &batcher, req).await)
    }

    /// How key reads go first: `(read_backup, as_primary)` of their requests. Reads as the
    /// primary that a backup refused (or that failed otherwise) go again the general way
    /// ([`Client::read_again`]), at the primary.
    fn key_reads(&self, anywhere: bool) -> (bool, bool) {
        let o = &self.inner.opts;
        let any = o.read_any_replica && anywhere;
        (o.read_backup || any, any && !o.read_backup)
    }

    /// The keys at `at` of `keys` read the general way, with its retries and map refreshes —
    /// unless another table was put under the name meanwhile (ALTER TABLE): the caller decodes
    /// with the layout of `t`, which it planned with.
    async fn read_again(&self, table: &str, t: &Table, keys: &[Row], at: &[usize], columns: &[u32]) -> Vec<OpOutcome> {
        if self.map().table(table).map(|x| x.id) != Some(t.id) {
            return vec![Err(schema_changed()); at.len()];
        }
        let ops = at.iter().map(|&i| KeyOp::Read { table: table.into(), key: keys[i].clone() }).collect();
        self.run_batch(ops, self.inner.opts.read_backup, None, columns).await.0
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use shoal_proto::{Column, ColumnType, TableSpec, Value};

    /// Table `d.t`: an integer key `id` and a nullable text `v`, in 4 partitions.
    pub(crate) fn table() -> Table {
        let spec = TableSpec {
            name: "d.t".into(),
            columns: vec![Column::new("id", ColumnType::Int), Column::new("v", ColumnType::Text).nullable()],
            primary_key: vec![0],
            partition_key: vec![],
        };
        let (spec, hidden_pk) = spec.normalize().unwrap();
        Table { id: 7, spec, partition_count: 4, schema_version: 1, hidden_pk, ..Default::default() }
    }

    /// `rows` as a data node packs them.
    pub(crate) fn packed_rows(rows: &[Bytes]) -> PackedRows {
        let mut w = shoal_proto::packed_rows::RowsWriter::default();
        for row in rows {
            w.buf().extend_from_slice(row);
            w.end_row();
        }
        w.finish()
    }

    fn key(i: u8) -> Bytes {
        Bytes::from(vec![i])
    }

    #[test]
    fn keys_go_per_node_in_order_and_requests_stay_under_the_batch_limit() {
        let routed = vec![(0, key(0), 1, 10), (1, key(1), 2, 20), (2, key(2), 3, 10), (3, key(3), 1, 10)];
        let reqs = group(routed);
        assert_eq!(
            reqs,
            [
                Request { node: 10, at: vec![0, 2, 3], keys: vec![key(0), key(2), key(3)], partitions: vec![1, 3, 1] },
                Request { node: 20, at: vec![1], keys: vec![key(1)], partitions: vec![2] },
            ]
        );
        let many: Vec<_> = (0..MAX_OPS_PER_REQUEST * 2 + 1).map(|i| (i, key(1), 0, 10)).collect();
        let reqs = group(many);
        assert_eq!(
            reqs.iter().map(|r| r.keys.len()).collect::<Vec<_>>(),
            [MAX_OPS_PER_REQUEST, MAX_OPS_PER_REQUEST, 1]
        );
        assert_eq!(reqs[2].at, [MAX_OPS_PER_REQUEST * 2]);
    }

    #[test]
    fn a_lone_key_is_a_plain_read_and_more_are_one_many_key_read() {
        let t = table();
        let (at, op) = read_op(&t, Request { node: 1, at: vec![4], keys: vec![key(9)], partitions: vec![2] }, &[1]);
        assert_eq!((at, op.key_data, op.partition, op.keys.len(), op.columns), (vec![4], key(9), 2, 0, vec![1]));
        let r = Request { node: 1, at: vec![0, 1], keys: vec![key(1), key(2)], partitions: vec![3, 0] };
        let (_, op) = read_op(&t, r, &[]);
        assert_eq!((op.keys, op.key_partitions, op.key_data.is_empty()), (vec![key(1), key(2)], vec![3, 0], true));
    }

    #[test]
    fn answers_decode_per_key_and_anything_odd_goes_the_general_way() {
        let t = table();
        let row = Bytes::from(codec::encode_row(&t, &[Value::Int(5), Value::Text("x".into())]).unwrap());
        // Packed, as asked (`into_pb`), or one by one, as a data node that predates packing
        // answers (`into_each`): the same outcome.
        let packed = |rows: Vec<Bytes>| {
            let mut r = pb::OpResult::default();
            packed_rows(&rows).into_pb(&mut r);
            Ok(vec![r])
        };
        let each = |rows: Vec<Bytes>| Ok(vec![pb::OpResult { rows, ..Default::default() }]);
        let got = rows_of(&t, 2, each(vec![row.clone(), Bytes::new()])).unwrap();
        assert_eq!(got[1].as_ref().unwrap(), &None);
        let many = packed;
        let got = rows_of(&t, 2, many(vec![row.clone(), Bytes::new()])).unwrap();
        assert_eq!(got[0].as_ref().unwrap(), &Some(vec![Value::Int(5), Value::Text("x".into())]));
        assert_eq!(got[1].as_ref().unwrap(), &None);
        let lone = pb::OpResult { found: true, row_data: row.clone(), ..Default::default() };
        assert!(rows_of(&t, 1, Ok(vec![lone])).unwrap()[0].as_ref().unwrap().is_some());
        assert!(rows_of(&t, 1, Ok(vec![pb::OpResult::default()])).unwrap()[0].as_ref().unwrap().is_none());
        // A cut row fails its key only.
        let got = rows_of(&t, 2, many(vec![row.slice(..2), row.clone()])).unwrap();
        assert!(got[0].is_err() && got[1].is_ok());
        // Errors, short or extra answers: the general way.
        let err = pb::OpResult { error: Some(ShoalError::internal("x").into()), ..Default::default() };
        assert!(rows_of(&t, 2, Ok(vec![err])).is_none());
        assert!(rows_of(&t, 2, many(vec![row.clone()])).is_none());
        assert!(rows_of(&t, 2, Ok(vec![])).is_none());
        assert!(rows_of(&t, 1, Err(ShoalError::internal("down"))).is_none());
    }
}

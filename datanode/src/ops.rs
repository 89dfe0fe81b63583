//! Key operations: reads at the primary (or any complete replica on request) and writes at the
//! primary, replicated synchronously to every live replica before they are acknowledged.
//!
//! Write protocol at the primary (DESIGN §4): lock the row; compute the new image from the
//! committed one; send it to every other replica of the partition (syncing ones included); once
//! all have applied it, apply it here, unlock and answer. The primary applies last, so a reader
//! at the primary never sees a write that a failure could still take back.

use std::sync::Arc;

use shoal_proto::aggregate::{Aggregate, Folder, Partial};
use shoal_proto::bytes::Bytes;
use shoal_proto::codec::{self, check_row, coerce, decode_row, encode_key, encode_row, Projection};
use shoal_proto::packed_rows::{PackedRows, RowsWriter};
use shoal_proto::{
    ClusterState, Delta, ErrorCode, PartitionAssignment, PartitionId, ShoalError, Table, TableId, Value,
};

use crate::node::Node;
use crate::partition::Partition;
use crate::replication;
use crate::storage::{Image, PartitionStore, RowAt, RowSlot};

/// Most operations in one request.
pub const MAX_BATCH_OPS: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Insert,
    Update,
    Upsert,
    Delete,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub kind: OpKind,
    pub table: TableId,
    pub partition: PartitionId,
    /// Primary key values (read, update, delete).
    pub key: Vec<Value>,
    /// Or the primary key already encoded (`key` is then empty).
    pub key_data: Option<Bytes>,
    /// Or, for a many-key read, encoded keys with their partitions (`partition` unused).
    pub keys: Vec<(Bytes, PartitionId)>,
    /// Or, for a range read, the consecutive integer keys to read (`partition` unused).
    pub range: Option<KeyRange>,
    /// Every column (insert, upsert) or the columns named in `columns` (update).
    pub row: Vec<Value>,
    pub columns: Vec<u32>,
    /// Update: increments of integer columns, applied after `columns`.
    pub deltas: Vec<Delta>,
    /// A many-key or range read's caller wants the rows packed (`Op.packed_rows`).
    pub packed_rows: bool,
    /// A range read's caller wants these aggregates of its rows instead of the rows.
    pub aggregates: Vec<Aggregate>,
}

/// A range read's keys: `count` keys whose 8-byte encoding counts up from `start`
/// (`codec::int_key_at`), of which this node reads those in `partitions`.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyRange {
    pub start: u64,
    pub count: u32,
    pub partitions: Vec<PartitionId>,
}

pub fn table_of(map: &ClusterState, id: TableId) -> Result<&Table, ShoalError> {
    map.table_by_id(id).ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, format!("table id {id} does not exist")))
}

pub fn check_routing(table: &Table, key: &[Value], partition: PartitionId) -> Result<(), ShoalError> {
    let owner = codec::partition_of_key(table, key);
    if owner != partition {
        return Err(ShoalError::new(
            ErrorCode::InvalidArgument,
            format!("key belongs to partition {owner}, not {partition}"),
        ));
    }
    Ok(())
}

/// [`check_routing`] for an encoded key.
fn check_encoded_routing(table: &Table, key: &[u8], partition: PartitionId) -> Result<(), ShoalError> {
    let owner = codec::partition_of_encoded_key(table, key)?;
    if owner != partition {
        return Err(ShoalError::new(
            ErrorCode::InvalidArgument,
            format!("key belongs to partition {owner}, not {partition}"),
        ));
    }
    Ok(())
}

/// What an operation gives its caller.
#[derive(Debug)]
pub enum Answer {
    /// A read's row in the table's row encoding (None: no row with that key); None for writes.
    Row(Option<Vec<u8>>),
    /// An update that found the row already holding its values: nothing was written.
    Unchanged,
    /// A many-key read's rows, one per key, or a range read's (`range`), one per key of the
    /// run; empty where the key has no row here. `packed`: the caller wants them so.
    Rows { rows: PackedRows, range: bool, packed: bool },
    /// A range read's aggregates (`Op.aggregates`) over the rows this node has, in order.
    Aggregates(Vec<Partial>),
}

/// Which replica may answer a read, and what it shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadAt {
    /// The partition's primary only.
    Primary,
    /// Any complete replica, showing what it holds: a backup may show a write its primary has
    /// not applied yet (NDB's READ_BACKUP).
    AnyReplica,
    /// Any complete replica, answering as the primary would: a backup refuses keys with
    /// writes the primary has not confirmed (`unconfirmed.rs`).
    AsPrimary,
}

impl ReadAt {
    /// From a request's `read_backup` and `as_primary`.
    pub fn of(read_backup: bool, as_primary: bool) -> ReadAt {
        match (read_backup, as_primary) {
            (false, _) => ReadAt::Primary,
            (true, false) => ReadAt::AnyReplica,
            (true, true) => ReadAt::AsPrimary,
        }
    }
}

/// Reads one row by primary key, in the table's row encoding (the caller decodes it), or each
/// row of a many-key read: see [`Answer`].
pub fn read(node: &Node, op: Op, at: ReadAt) -> Result<Answer, ShoalError> {
    read_many(node, vec![Ok(op)], at).pop().unwrap_or_else(|| Err(ShoalError::internal("read without answer")))
}

/// The reads of one batch, as [`read`] each, with a (table, partition)'s checks made once for
/// the batch (one map, one look at the lease) instead of once per key.
pub fn read_many(node: &Node, ops: Vec<Result<Op, ShoalError>>, at: ReadAt) -> Vec<Result<Answer, ShoalError>> {
    let map = node.map();
    let mut targets = Targets { node, map: &map, at, checked: vec![] };
    ops.into_iter()
        .map(|op| {
            let op = op?;
            if let Some(range) = op.range.as_ref().filter(|_| !op.aggregates.is_empty()) {
                return aggregate_range(&mut targets, op.table, range, &op.aggregates).map(Answer::Aggregates);
            }
            if let Some(range) = &op.range {
                let rows = read_range(&mut targets, op.table, range, &op.columns)?;
                return Ok(Answer::Rows { rows, range: true, packed: op.packed_rows });
            }
            if op.keys.is_empty() {
                let (table, part, refuse) = targets.get(op.table, op.partition)?;
                return read_from(table, &part, op, refuse).map(Answer::Row);
            }
            let table = table_of(&map, op.table)?;
            let keep = wanted(table, &op.columns)?;
            let mut parts = Vec::with_capacity(op.keys.len());
            let mut refusing = vec![];
            for (key, partition) in &op.keys {
                let (table, part, refuse) = targets.get(op.table, *partition)?;
                check_encoded_routing(table, key, *partition)?;
                if refuse {
                    refusing.push(part.clone());
                }
                parts.push(part);
            }
            let reads: Vec<_> = op.keys.iter().zip(&parts).map(|((key, _), part)| (key, Some(part.as_ref()))).collect();
            let rows = lookup_rows(&reads, keep.as_ref(), &refusing)?;
            Ok(Answer::Rows { rows, range: false, packed: op.packed_rows })
        })
        .collect()
}

/// A range read ([`KeyRange`]): every key of the range is hashed to its partition here, and
/// looked up when that partition is one the caller sent here. The caller sent each other
/// partition's share of the range to that partition's node. One row per key of the run, empty
/// where this node has none.
fn read_range(
    targets: &mut Targets,
    table: TableId,
    range: &KeyRange,
    columns: &[u32],
) -> Result<PackedRows, ShoalError> {
    let t = range_table(targets.map, table)?;
    let keep = wanted(t, columns)?;
    with_range_reads(targets, t, range, |reads, refusing| lookup_rows(reads, keep.as_ref(), refusing))
}

/// A range read's aggregates ([`Op::aggregates`]): the rows of the range that this node has,
/// folded into one partial per aggregate. The keys are located and refused as a range read's.
fn aggregate_range(
    targets: &mut Targets,
    table: TableId,
    range: &KeyRange,
    aggs: &[Aggregate],
) -> Result<Vec<Partial>, ShoalError> {
    let t = range_table(targets.map, table)?;
    let mut folder = Folder::new(t, aggs)?;
    with_range_reads(targets, t, range, |reads, refusing| {
        for (key, part) in reads {
            let Some(part) = part else { continue };
            let store = part.store.lock();
            let refuse = refusing.iter().any(|r| std::ptr::eq(r.as_ref(), *part));
            refuse_unconfirmed(&store, key, refuse)?;
            if let Some(slot) = store.get(key) {
                folder.add_row(slot.data())?;
            }
        }
        Ok(())
    })?;
    Ok(folder.partials)
}

/// The table a range read names, which must have a single integer primary key.
fn range_table(map: &ClusterState, table: TableId) -> Result<&Table, ShoalError> {
    let t = table_of(map, table)?;
    if codec::int_key_type(t).is_none() {
        return Err(ShoalError::new(
            ErrorCode::InvalidArgument,
            format!("table {} has no single integer primary key to read a range of", t.name()),
        ));
    }
    Ok(t)
}

/// Runs `read` over the keys of `range` (each with its partition's replica here, None for a
/// partition the caller sent elsewhere) and the partitions whose reads must refuse
/// unconfirmed keys ([`refuse_unconfirmed`]).
fn with_range_reads<T>(
    targets: &mut Targets,
    t: &Table,
    range: &KeyRange,
    read: impl FnOnce(&[([u8; 8], Option<&Partition>)], &[Arc<Partition>]) -> Result<T, ShoalError>,
) -> Result<T, ShoalError> {
    let table = t.id;
    // Checked once each, before any key: a partition this node may not serve fails the read.
    let mut parts = Vec::with_capacity(range.partitions.len());
    let mut refusing = vec![];
    for &p in &range.partitions {
        let (_, part, refuse) = targets.get(table, p)?;
        if refuse {
            refusing.push(part.clone());
        }
        parts.push((p, part));
    }
    let mut reads = Vec::with_capacity(range.count as usize);
    for i in 0..range.count {
        let key = codec::int_key_at(range.start, i)
            .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, "the range runs past the last key"))?;
        let p = shoal_proto::hash::partition_of(&key, t.partition_count);
        let part = parts.iter().find(|(q, _)| *q == p).map(|(_, part)| part.as_ref());
        reads.push((key, part));
    }
    read(&reads, &refusing)
}

/// Most bytes a many-row answer's buffer is sized for up front (it grows past that as needed).
const MAX_PRESIZED_ANSWER: usize = 1 << 20;

/// [`lookup_many`], refusing keys of the `refusing` partitions (reads as the primary, at a
/// backup) that have writes their primary has not confirmed; every other read goes without
/// the checks.
fn lookup_rows<K: AsRef<[u8]>>(
    reads: &[(K, Option<&Partition>)],
    keep: Option<&Projection>,
    refusing: &[Arc<Partition>],
) -> Result<PackedRows, ShoalError> {
    match refusing {
        [] => lookup_many::<K, false>(reads, keep, refusing),
        _ => lookup_many::<K, true>(reads, keep, refusing),
    }
}

/// The rows of `reads`' keys (a key with no partition is not read here: its row is empty), one
/// per key, in two passes: first where each key's row is, then the rows. A lookup is a chain
/// of dependent memory reads (hash table, slot, row) that mostly miss the cache; with the
/// lookups back to back the CPU overlaps the misses of several keys, where a row copied and
/// projected between one lookup and the next kept about one in flight. All the rows go into
/// one buffer: an allocation and a copy per row were a tenth of a data node's CPU on
/// sysbench's 100-key ranges.
///
/// With `CHECK`, a key of a `refusing` partition fails the whole read if it has a write the
/// primary has not confirmed ([`refuse_unconfirmed`]), checked under the lock of the pass that
/// reads it: the first for keys without a row, the second for the rest. Without, the loops
/// are the ones they were before the check existed: a check per key in every read cost the
/// data node 4% more instructions per sysbench `oltp_read_write` transaction.
fn lookup_many<K: AsRef<[u8]>, const CHECK: bool>(
    reads: &[(K, Option<&Partition>)],
    keep: Option<&Projection>,
    refusing: &[Arc<Partition>],
) -> Result<PackedRows, ShoalError> {
    let refuses = |p: &Partition| CHECK && refusing.iter().any(|r| std::ptr::eq(r.as_ref(), p));
    let mut refused = false;
    let places: Vec<Option<RowAt>> = reads
        .iter()
        .map(|(key, part)| {
            part.as_ref().and_then(|p| {
                let store = p.store.lock();
                // A flag, not `?` inside the loop: the first pass keeps its plain `collect`.
                refused |= refuse_unconfirmed(&store, key.as_ref(), refuses(p)).is_err();
                store.locate(key.as_ref())
            })
        })
        .collect();
    if refused {
        return Err(unconfirmed_error());
    }
    let found = places.iter().filter(|at| at.is_some()).count();
    let mut rows = RowsWriter::with_capacity(reads.len(), found * 64);
    // Sized again from the first row: most rows of a table are about as long, and growing the
    // buffer by doubling copied it twice or three times for sysbench's 140-byte rows. Not past
    // `MAX_PRESIZED_ANSWER`, so one long first row cannot reserve a thousand times its size.
    let mut sized = false;
    for ((key, part), at) in reads.iter().zip(places) {
        if let (Some(part), Some(at)) = (part, at) {
            let store = part.store.lock();
            refuse_unconfirmed(&store, key.as_ref(), refuses(part))?;
            if let Some(slot) = store.row_at(at, key.as_ref()) {
                let before = rows.buf().len();
                copy_row(slot.data(), keep, rows.buf())?;
                if !sized {
                    sized = true;
                    let row = rows.buf().len() - before;
                    rows.buf().reserve((row * found.saturating_sub(1)).min(MAX_PRESIZED_ANSWER));
                }
            }
        }
        rows.end_row();
    }
    Ok(rows.finish())
}

/// Fails a read as the primary, at a backup (`refuse`), of a key with a write its primary has
/// not confirmed: the primary may not show it yet. The client reads such keys at the primary.
fn refuse_unconfirmed(store: &PartitionStore, key: &[u8], refuse: bool) -> Result<(), ShoalError> {
    if refuse && store.unconfirmed.holds(key) {
        return Err(unconfirmed_error());
    }
    Ok(())
}

#[cold]
fn unconfirmed_error() -> ShoalError {
    ShoalError::not_primary(None, "a write to the key is not yet confirmed by its primary")
}

/// A partition a read may use: its table, its replica here, and whether reads must refuse
/// unconfirmed keys ([`refuse_unconfirmed`]).
type Target<'m> = Result<(&'m Table, Arc<Partition>, bool), ShoalError>;

/// The [`read_target`] checks of the partitions one batch reads, each made once.
struct Targets<'m> {
    node: &'m Node,
    map: &'m ClusterState,
    at: ReadAt,
    /// A batch touches a handful of partitions: a list beats a map here.
    checked: Vec<((TableId, PartitionId), Target<'m>)>,
}

impl<'m> Targets<'m> {
    fn get(&mut self, table: TableId, partition: PartitionId) -> Target<'m> {
        let slot = (table, partition);
        if let Some((_, t)) = self.checked.iter().find(|(s, _)| *s == slot) {
            return t.clone();
        }
        let t = read_target(self.node, self.map, table, partition, self.at);
        self.checked.push((slot, t.clone()));
        t
    }
}

/// The checks a read makes before it looks at its key: the table exists, this node may serve
/// the partition (as primary, or as any complete replica for `read_backup`), and its replica is
/// installed (and active, as primary).
fn read_target<'m>(
    node: &Node,
    map: &'m ClusterState,
    table: TableId,
    partition: PartitionId,
    at: ReadAt,
) -> Target<'m> {
    let t = table_of(map, table)?;
    let pa = map
        .partition(partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, format!("no partition {partition}")))?;
    if at == ReadAt::Primary {
        node.check_primary(map, pa)?;
    } else {
        node.check_readable(map, pa)?;
    }
    let part = node
        .partition(table, partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::NodeNotReady, "partition replica not installed"))?;
    if at == ReadAt::Primary {
        node.check_active(&part, pa)?;
    }
    // Only an active primary shows exactly what it holds to a read as the primary.
    let refuse = at == ReadAt::AsPrimary && !(pa.primary == Some(node.id) && node.check_active(&part, pa).is_ok());
    Ok((t, part, refuse))
}

/// Looks a read's key up in a replica [`read_target`] allowed.
fn read_from(table: &Table, part: &Partition, op: Op, refuse: bool) -> Result<Option<Vec<u8>>, ShoalError> {
    let key: std::borrow::Cow<[u8]> = match &op.key_data {
        Some(key) => {
            check_encoded_routing(table, key, op.partition)?;
            key.as_ref().into()
        }
        None => {
            let (key, values) = encode_key(table, op.key)?;
            check_routing(table, &values, op.partition)?;
            key.into()
        }
    };
    lookup(part, &key, wanted(table, &op.columns)?.as_ref(), refuse)
}

/// Which columns a read wants, from its `columns` (the rest come back NULL); None: all.
fn wanted(table: &Table, columns: &[u32]) -> Result<Option<Projection>, ShoalError> {
    if columns.is_empty() {
        return Ok(None);
    }
    Projection::new(table, columns).map(Some)
}

/// The row under an encoded key, with only the `keep` columns (None: all).
fn lookup(
    part: &Partition,
    key: &[u8],
    keep: Option<&Projection>,
    refuse: bool,
) -> Result<Option<Vec<u8>>, ShoalError> {
    let store = part.store.lock();
    refuse_unconfirmed(&store, key, refuse)?;
    let Some(slot) = store.get(key) else { return Ok(None) };
    let mut row = vec![];
    copy_row(slot.data(), keep, &mut row)?;
    Ok(Some(row))
}

/// Appends a stored row to `out`, with only the `keep` columns (None: all).
fn copy_row(data: &[u8], keep: Option<&Projection>, out: &mut Vec<u8>) -> Result<(), ShoalError> {
    match keep {
        None => out.extend_from_slice(data),
        Some(keep) => keep.append(data, out)?,
    }
    Ok(())
}

/// Checks a write's row (insert, upsert: replaced by the checked, coerced row) and returns
/// the encoded primary key it addresses, with the key's values.
pub fn check_write(table: &Table, op: &mut Op) -> Result<(Vec<u8>, Vec<Value>), ShoalError> {
    if table.read_only && op.kind != OpKind::Read {
        // ALTER TABLE is copying the rows: a write now would miss the copy. Retriable: the
        // copy takes over the name when it is done.
        return Err(ShoalError::new(
            ErrorCode::NodeNotReady,
            format!("table {} is being altered; writes wait until it is done", table.name()),
        ));
    }
    let key_values = match op.kind {
        OpKind::Insert | OpKind::Upsert => {
            op.row = check_row(table, std::mem::take(&mut op.row))?;
            table.key_of(&op.row)
        }
        OpKind::Update | OpKind::Delete | OpKind::Read => match &op.key_data {
            Some(data) => codec::decode_key(table, data)?,
            None => op.key.clone(),
        },
    };
    encode_key(table, key_values)
}

/// The row image a write leaves, from the row's current committed (or, in a transaction,
/// pending) image: None = deleted. `op` went through [`check_write`].
pub fn new_image(table: &Table, op: Op, current: Option<&[u8]>) -> Result<Option<Vec<u8>>, ShoalError> {
    match op.kind {
        OpKind::Insert => {
            if current.is_some() {
                return Err(ShoalError::new(
                    ErrorCode::DuplicateKey,
                    format!("duplicate key in table {}", table.name()),
                ));
            }
            Ok(Some(encode_row(table, &op.row)?))
        }
        OpKind::Upsert => Ok(Some(encode_row(table, &op.row)?)),
        OpKind::Update => {
            let cur = current.ok_or_else(|| ShoalError::new(ErrorCode::KeyNotFound, "no row with that key"))?;
            let mut values = decode_row(table, cur)?;
            if op.columns.len() != op.row.len() {
                return Err(ShoalError::new(
                    ErrorCode::InvalidArgument,
                    "update names a different number of columns and values",
                ));
            }
            for (&c, v) in op.columns.iter().zip(op.row) {
                let col = table
                    .columns()
                    .get(c as usize)
                    .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, format!("no column {c}")))?;
                if table.spec.primary_key.contains(&c) {
                    return Err(ShoalError::new(
                        ErrorCode::InvalidArgument,
                        format!("column {} is part of the primary key and cannot be updated", col.name),
                    ));
                }
                values[c as usize] = coerce(col, v)?;
            }
            for d in &op.deltas {
                if table.spec.primary_key.contains(&d.column) {
                    return Err(ShoalError::new(ErrorCode::InvalidArgument, "a primary key column cannot be updated"));
                }
                d.apply_to(&mut values)?;
            }
            Ok(Some(encode_row(table, &values)?))
        }
        OpKind::Delete => {
            if current.is_none() {
                return Err(ShoalError::new(ErrorCode::KeyNotFound, "no row with that key"));
            }
            Ok(None)
        }
        OpKind::Read => Err(ShoalError::internal("read sent down the write path")),
    }
}

/// The partition's assignment and this node's replica of it, if this node may serve it as
/// primary now (the checks every write and transaction operation makes first).
pub fn active_primary<'m>(
    node: &Node,
    map: &'m ClusterState,
    table: TableId,
    partition: PartitionId,
) -> Result<(&'m PartitionAssignment, Arc<Partition>), ShoalError> {
    let pa = map
        .partition(partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, format!("no partition {partition}")))?;
    node.check_primary(map, pa)?;
    let part = node
        .partition(table, partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::NodeNotReady, "partition replica not installed"))?;
    node.check_active(&part, pa)?;
    Ok((pa, part))
}

/// Executes one write as primary and returns the GCI it was committed in, or None for an
/// update that would leave the row as it is (nothing is written or replicated then). Must run
/// to completion once replication started (the caller spawns it), so a vanished client cannot
/// leave replicas disagreeing.
pub async fn write(node: Arc<Node>, mut op: Op) -> Result<Option<u64>, ShoalError> {
    let map = node.map();
    let table = table_of(&map, op.table)?;
    let (pa, part) = active_primary(&node, &map, op.table, op.partition)?;

    let (key, key_values) = check_write(table, &mut op)?;
    check_routing(table, &key_values, op.partition)?;
    let (table_id, partition) = (op.table, op.partition);

    let _row_lock = part.lock_row(&key, node.timing.lock_wait).await?;
    let current = part.store.lock().get(&key).map(|s| s.data().to_vec());
    let old_charge = current.as_ref().map_or(0, |d| RowSlot::charge(key.len(), d.len()));
    let is_update = op.kind == OpKind::Update;
    let data = new_image(table, op, current.as_deref())?;
    if is_update && data == current {
        return Ok(None);
    }

    // Only growth needs room: a full node still takes updates that do not grow rows, and deletes.
    let new_charge = data.as_ref().map_or(0, |d| RowSlot::charge(key.len(), d.len()));
    let reserved = new_charge.saturating_sub(old_charge);
    if reserved > 0 && !node.budget.try_reserve(reserved) {
        return Err(ShoalError::new(
            ErrorCode::TableFull,
            format!("table {} is full: node {} reached its data memory limit", table.name(), node.id),
        ));
    }
    // The commit point: from here the write belongs to global checkpoint `stamp.gci`, and that
    // checkpoint cannot complete before the write is applied and logged on every replica.
    let stamp = match node.durability.begin_commit(partition).await {
        Ok(s) => s,
        Err(e) => {
            node.budget.release(reserved);
            return Err(e);
        }
    };
    let gci = stamp.gci;
    let image = Image { key, data, seq: part.next_seq() };
    let inflight = part.enter_write(map.epoch);
    if let Err(e) = replication::replicate(&node, &map, table_id, pa, gci, vec![image.clone()]).await {
        node.budget.release(reserved);
        return Err(e);
    }
    {
        let mut store = part.store.lock();
        node.durability.log(gci, table_id, partition, &image);
        match image.data {
            Some(d) => store.put_reserved(&image.key, d, image.seq, reserved),
            None => {
                store.delete(&image.key);
            }
        }
    }
    part.applied_as_primary(image.seq);
    drop(inflight);
    drop(stamp);
    Ok(Some(gci))
}

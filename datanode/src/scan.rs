//! Full scans of one partition replica with filters and projection evaluated here, in the data
//! node, so only matching rows cross the network.
//!
//! The scan walks the partition's slab a chunk at a time, holding the partition lock only while
//! it reads one chunk, so writes proceed between chunks. Rows are read committed.
//!
//! An index scan walks a range of one ordered index instead (`index.rs`), in index order,
//! resuming after the last entry it visited; rows changed between chunks are seen as they are
//! when their entry is reached.

use std::sync::Arc;

use shoal_proto::codec::decode_row;
use shoal_proto::filter::Filter;
use shoal_proto::{Epoch, ErrorCode, PartitionId, ShoalError, Table, TableId, Value};
use tokio::sync::mpsc;

use crate::index::KeyRange;
use crate::node::Node;
use crate::partition::Partition;

/// Rows per batch when the caller does not say.
pub const DEFAULT_BATCH_ROWS: u32 = 1000;
/// Most rows per batch.
pub const MAX_BATCH_ROWS: u32 = 10_000;
/// Slots looked at per lock hold.
const SLOTS_PER_CHUNK: u32 = 2048;
/// Longest a scan waits for writes accepted under an older map to finish.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Batches buffered ahead of a slow reader.
pub const SCAN_QUEUE_BATCHES: usize = 4;

pub struct ScanSpec {
    pub epoch: Epoch,
    pub table: TableId,
    pub partition: PartitionId,
    pub filters: Vec<Filter>,
    pub projection: Vec<u32>,
    pub batch_rows: u32,
    pub read_backup: bool,
    pub index: Option<IndexScan>,
}

/// A range of an ordered index to walk (bounds are value prefixes of its columns).
pub struct IndexScan {
    pub id: u32,
    pub lower: Vec<Value>,
    pub lower_inclusive: bool,
    pub upper: Vec<Value>,
    pub upper_inclusive: bool,
    pub descending: bool,
}

/// Keeps freed slots from being reused while a cursor walks the slab.
pub struct CursorGuard(pub Arc<Partition>);

impl CursorGuard {
    pub fn open(part: Arc<Partition>) -> CursorGuard {
        part.store.lock().open_cursor();
        CursorGuard(part)
    }
}

impl Drop for CursorGuard {
    fn drop(&mut self) {
        self.0.store.lock().close_cursor();
    }
}

pub type Batch = Result<(Vec<Vec<Value>>, bool), ShoalError>;

/// Runs the scan, sending batches of rows (and whether it is the last) until done, an error, or
/// the receiver goes away.
pub async fn run(node: Arc<Node>, spec: ScanSpec, tx: mpsc::Sender<Batch>) {
    if let Err(e) = scan(&node, spec, &tx).await {
        let _ = tx.send(Err(e)).await;
    }
}

async fn scan(node: &Node, spec: ScanSpec, tx: &mpsc::Sender<Batch>) -> Result<(), ShoalError> {
    node.ensure_epoch(spec.epoch).await?;
    let map = node.map();
    let table = map
        .table_by_id(spec.table)
        .cloned()
        .ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, format!("table id {} does not exist", spec.table)))?;
    let pa = map
        .partition(spec.partition)
        .filter(|_| spec.partition < table.partition_count)
        .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, format!("no partition {}", spec.partition)))?;
    if spec.read_backup {
        node.check_readable(&map, pa)?;
    } else {
        node.check_primary(&map, pa)?;
    }
    if let Some(&bad) = spec.projection.iter().find(|&&c| c as usize >= table.columns().len()) {
        return Err(ShoalError::new(ErrorCode::InvalidArgument, format!("no column {bad} to project")));
    }
    let part = node
        .partition(spec.table, spec.partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::NodeNotReady, "partition replica not installed"))?;
    if !spec.read_backup {
        node.check_active(&part, pa)?;
        // Writes this primary accepted under an older map finish first, committed or not, so
        // a scan sees everything its map's predecessors allowed: after ALTER TABLE made a table
        // read-only, its copy misses no write that slipped in before.
        let waited = std::time::Instant::now();
        while !part.settled_before(map.epoch) {
            if waited.elapsed() > SETTLE_WAIT {
                return Err(ShoalError::new(ErrorCode::Timeout, "writes under an older map did not finish in time"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }
    let batch_rows = match spec.batch_rows {
        0 => DEFAULT_BATCH_ROWS,
        n => n.min(MAX_BATCH_ROWS),
    } as usize;
    if let Some(ix) = &spec.index {
        return index_scan(&table, &part, ix, &spec, batch_rows, tx).await;
    }
    let cursor = CursorGuard::open(part);
    let mut at = Some(0u32);
    let mut batch = Vec::with_capacity(batch_rows);
    while let Some(start) = at {
        let mut failure = None;
        {
            let store = cursor.0.store.lock();
            at = store.walk(start, SLOTS_PER_CHUNK, |slot| {
                let row = match decode_row(&table, slot.data()) {
                    Ok(r) => r,
                    Err(e) => {
                        failure = Some(e);
                        return false;
                    }
                };
                if spec.filters.iter().all(|f| f.matches(&row)) {
                    let row = if spec.projection.is_empty() {
                        row
                    } else {
                        spec.projection.iter().map(|&c| row[c as usize].clone()).collect()
                    };
                    batch.push(row);
                }
                batch.len() < batch_rows
            });
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if batch.len() >= batch_rows || at.is_none() {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(batch_rows));
            if tx.send(Ok((full, at.is_none()))).await.is_err() {
                return Ok(()); // the reader went away
            }
        }
    }
    Ok(())
}

/// Emits the rows of `part` whose entries lie in the index range, in index order.
async fn index_scan(
    table: &Table,
    part: &Arc<Partition>,
    ix: &IndexScan,
    spec: &ScanSpec,
    batch_rows: usize,
    tx: &mpsc::Sender<Batch>,
) -> Result<(), ShoalError> {
    let index = table.indexes.iter().find(|i| i.id == ix.id).ok_or_else(|| {
        ShoalError::new(ErrorCode::InvalidArgument, format!("table {} has no index {}", table.name(), ix.id))
    })?;
    let range =
        KeyRange::encode(table, index, &ix.lower, ix.lower_inclusive, &ix.upper, ix.upper_inclusive, ix.descending)?;
    let mut after: Option<Box<[u8]>> = None;
    let mut batch = Vec::with_capacity(batch_rows);
    loop {
        let mut failure = None;
        let resume = {
            let store = part.store.lock();
            let Some(tree) = store.index(ix.id) else {
                // The replica has not installed the map that created the index yet.
                return Err(ShoalError::new(
                    ErrorCode::NodeNotReady,
                    format!("index {} is not built here yet", index.name),
                ));
            };
            tree.walk(&range, after.as_deref(), SLOTS_PER_CHUNK as usize, |pk| {
                let Some(slot) = store.get(pk) else { return true };
                let row = match decode_row(table, slot.data()) {
                    Ok(r) => r,
                    Err(e) => {
                        failure = Some(e);
                        return false;
                    }
                };
                if spec.filters.iter().all(|f| f.matches(&row)) {
                    batch.push(if spec.projection.is_empty() {
                        row
                    } else {
                        spec.projection.iter().map(|&c| row[c as usize].clone()).collect()
                    });
                }
                batch.len() < batch_rows
            })
        };
        if let Some(e) = failure {
            return Err(e);
        }
        let done = resume.is_none();
        if batch.len() >= batch_rows || done {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(batch_rows));
            if tx.send(Ok((full, done))).await.is_err() {
                return Ok(()); // the reader went away
            }
        }
        if done {
            return Ok(());
        }
        after = resume;
    }
}

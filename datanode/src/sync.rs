//! Node restart for in-memory replicas: a starting node copies every partition of its node
//! group from the partition's primary while live writes already flow to it.
//!
//! Order of events, which makes the copy exact (DESIGN §4 "Restarts", invariant 5):
//! 1. mgmd adds the node to each partition as a *syncing* replica in epoch S. The node installs
//!    that map before it accepts any write from epoch S, emptying its replicas and recording
//!    deletes from then on.
//! 2. From epoch S on, primaries replicate every write to it as well.
//! 3. The node asks each primary for a copy at epoch S. The primary first learns S and waits for
//!    its writes that chose replicas from an older map (and so skip the new node) to finish,
//!    then streams its committed rows chunk by chunk.
//! 4. Copied and live images meet in the replica; the newer sequence number wins, and a
//!    recorded delete beats an older copied row.
//! 5. When every partition is copied the node reports Synced(S); mgmd marks it up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_proto::{Epoch, ErrorCode, ShoalError};
use tokio::sync::mpsc;

use crate::node::Node;
use crate::scan::CursorGuard;
use crate::storage::Image;
use crate::transport::CopyRequest;

/// Rows per copy chunk.
pub const COPY_CHUNK_ROWS: usize = 1000;
/// How long a copy source waits for older in-flight writes to drain.
const DRAIN_WAIT: Duration = Duration::from_secs(15);

/// Primary side: streams the committed rows of one partition to a starting node.
pub async fn copy_out(node: Arc<Node>, req: CopyRequest, tx: mpsc::Sender<Result<Vec<Image>, ShoalError>>) {
    if let Err(e) = copy_rows(&node, req, &tx).await {
        let _ = tx.send(Err(e)).await;
    }
}

async fn copy_rows(
    node: &Arc<Node>,
    req: CopyRequest,
    tx: &mpsc::Sender<Result<Vec<Image>, ShoalError>>,
) -> Result<(), ShoalError> {
    node.ensure_epoch(req.epoch).await?;
    let map = node.map();
    let pa = map
        .partition(req.partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, format!("no partition {}", req.partition)))?;
    node.check_primary(&map, pa)?;
    if pa.replica(req.to).is_none() {
        return Err(ShoalError::new(
            ErrorCode::StaleEpoch,
            format!("node {} is not a replica of partition {}", req.to, req.partition),
        ));
    }
    let part = node
        .partition(req.table, req.partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, format!("table id {} is not here", req.table)))?;
    node.check_active(&part, pa)?;
    let start = Instant::now();
    while !part.writes_before_drained(req.epoch) {
        if start.elapsed() > DRAIN_WAIT {
            return Err(ShoalError::new(ErrorCode::Timeout, "older writes did not drain"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Transactions prepared before the new replica joined: it must hold their images too.
    crate::txn::push_prepared(node, req.table, req.partition, req.to).await?;
    let cursor = CursorGuard::open(part);
    let mut at = Some(0u32);
    while let Some(begin) = at {
        let mut chunk = Vec::with_capacity(COPY_CHUNK_ROWS);
        at = cursor.0.store.lock().walk(begin, COPY_CHUNK_ROWS as u32, |slot| {
            chunk.push(Image { key: slot.key().to_vec(), data: Some(slot.data().to_vec()), seq: slot.seq });
            true
        });
        if tx.send(Ok(chunk)).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Receiving side: copies every partition this node fills in `sync_epoch` (all of them after
/// a restart, one partition's worth after a failover with three or more replicas) and ends the
/// fill. Returns the rows copied, or None when a newer map replaced this copy.
pub async fn run(node: &Node, sync_epoch: Epoch) -> Option<u64> {
    let map = node.map();
    let mut work = vec![];
    for t in &map.tables {
        for pa in map.partitions.iter().take(t.partition_count as usize) {
            if pa.replica(node.id).is_some_and(|r| r.sync_epoch == sync_epoch) {
                work.push((t.id, pa.partition));
            }
        }
    }
    tracing::info!(sync_epoch, partitions = work.len(), "node restart: copying partitions from their primaries");
    let mut rows = 0u64;
    for (done, (table, partition)) in work.iter().copied().enumerate() {
        loop {
            if !node.is_filling(sync_epoch) {
                tracing::info!(sync_epoch, "sync superseded");
                return None;
            }
            match copy_in(node, table, partition, sync_epoch).await {
                Ok(n) => {
                    rows += n;
                    break;
                }
                Err(e) if e.code == ErrorCode::NoSuchTable => break, // dropped meanwhile
                Err(e) => {
                    tracing::warn!(table, partition, "copy failed, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        let what = format!(
            "copy: {}/{} partitions from their primaries ({rows} rows, {}%)",
            done + 1,
            work.len(),
            (done + 1) * 100 / work.len().max(1)
        );
        tracing::info!("node restart: {what}");
        *node.durability.progress.lock() = what;
    }
    node.durability.progress.lock().clear();
    node.end_fill(sync_epoch);
    Some(rows)
}

async fn copy_in(node: &Node, table: u32, partition: u32, sync_epoch: Epoch) -> Result<u64, ShoalError> {
    let map = node.map();
    let pa = map.partition(partition).ok_or_else(|| ShoalError::internal("partition vanished"))?;
    let primary =
        pa.primary.ok_or_else(|| ShoalError::new(ErrorCode::PartitionUnavailable, "partition has no primary"))?;
    let part = node
        .partition(table, partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, "replica not installed"))?;
    let req = CopyRequest { to: node.id, table, partition, epoch: sync_epoch };
    let mut chunks = node.transport.copy(primary, req).await?;
    let mut rows = 0;
    while let Some(chunk) = chunks.recv().await {
        let chunk = chunk?;
        let mut store = part.store.lock();
        for img in chunk {
            part.saw_seq(img.seq);
            store.apply(img);
            rows += 1;
        }
    }
    Ok(rows)
}

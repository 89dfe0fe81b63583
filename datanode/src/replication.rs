//! Synchronous replication inside a node group: the primary's sending side and the replicas'
//! applying side.
//!
//! A replica accepts images only from the primary of the partition's current term. Terms come
//! from mgmd (the epoch in which a primary took over) and only grow; a message from an older
//! term is refused with STALE_EPOCH, which tells a deposed primary to stop. A replica that has
//! not yet learned the sender's epoch catches up first, so it never applies a write from a map
//! it has not installed (that map may ask it to start over empty).

use std::time::{Duration, Instant};

use shoal_proto::pb;
use shoal_proto::{ClusterState, ErrorCode, NodeId, PartitionAssignment, ShoalError, TableId};

use crate::node::Node;
use crate::storage::Image;

/// One attempt to reach a replica.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// After this long without an answer from a replica, ask mgmd to declare it failed.
const REPORT_AFTER: Duration = Duration::from_millis(300);
/// Give up on a write after this long (the client sees TIMEOUT; the outcome is unknown).
const GIVE_UP_AFTER: Duration = Duration::from_secs(10);

pub fn image_to_pb(img: &Image) -> pb::RowImage {
    pb::RowImage {
        key: img.key.clone(),
        row: img.data.clone().unwrap_or_default(),
        deleted: img.data.is_none(),
        seq: img.seq,
    }
}

pub fn image_from_pb(img: pb::RowImage) -> Image {
    Image { key: img.key, data: (!img.deleted).then_some(img.row), seq: img.seq }
}

/// Sends `image` to every replica of `pa` but this node and waits until each has applied it or
/// has left the partition's replica set.
pub async fn replicate(
    node: &Node,
    map: &ClusterState,
    table: TableId,
    pa: &PartitionAssignment,
    image: &Image,
) -> Result<(), ShoalError> {
    let req = pb::ReplicateRequest {
        from: node.id,
        table_id: table,
        partition: pa.partition,
        primary_term: pa.primary_term,
        rows: vec![image_to_pb(image)],
        epoch: map.epoch,
    };
    replicate_request(node, pa, req).await
}

pub async fn replicate_request(
    node: &Node,
    pa: &PartitionAssignment,
    req: pb::ReplicateRequest,
) -> Result<(), ShoalError> {
    let targets: Vec<NodeId> = pa.replicas.iter().map(|r| r.node_id).filter(|&n| n != node.id).collect();
    let sends = targets.into_iter().map(|to| send_to(node, to, pa, req.clone()));
    for r in futures::future::join_all(sends).await {
        r?;
    }
    Ok(())
}

async fn send_to(
    node: &Node,
    to: NodeId,
    pa: &PartitionAssignment,
    req: pb::ReplicateRequest,
) -> Result<(), ShoalError> {
    let start = Instant::now();
    let mut reported = false;
    loop {
        let failure = match node.peer(to) {
            None => format!("no address for node {to}"),
            Some(mut client) => match tokio::time::timeout(ATTEMPT_TIMEOUT, client.replicate(req.clone())).await {
                Ok(Ok(resp)) => match shoal_proto::convert::check(resp.into_inner().error) {
                    Ok(()) => return Ok(()),
                    Err(e) if matches!(e.code, ErrorCode::StaleEpoch) => {
                        return Err(ShoalError::not_primary(None, format!("replica {to} knows a newer primary: {e}")));
                    }
                    Err(e) => e.to_string(),
                },
                Ok(Err(status)) => format!("rpc failed: {}", status.message()),
                Err(_) => "timed out".to_string(),
            },
        };
        // Decide against the newest map: the replica may have been removed, or this node
        // deposed, while we were trying.
        let map = node.map();
        let Some(now) = map.partition(pa.partition) else {
            return Err(ShoalError::internal("partition vanished from the map"));
        };
        if now.replica(to).is_none() {
            return Ok(());
        }
        if now.primary != Some(node.id) || now.primary_term != pa.primary_term {
            return Err(ShoalError::not_primary(now.primary, "primary changed during replication"));
        }
        if !reported && start.elapsed() >= REPORT_AFTER {
            reported = true;
            tracing::warn!(replica = to, partition = pa.partition, "cannot replicate: {failure}; reporting it failed");
            let _ = node.failure_reports.try_send((to, failure));
        }
        if start.elapsed() >= GIVE_UP_AFTER {
            return Err(ShoalError::new(ErrorCode::Timeout, format!("replica {to} did not acknowledge in time")));
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// Replica side: applies images sent by a primary.
pub async fn apply(node: &Node, req: pb::ReplicateRequest) -> Result<(), ShoalError> {
    node.ensure_epoch(req.epoch).await?;
    let map = node.map();
    let table = map
        .table_by_id(req.table_id)
        .ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, format!("table id {} does not exist", req.table_id)))?;
    let pa = map
        .partition(req.partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, format!("no partition {}", req.partition)))?;
    if pa.replica(node.id).is_none() {
        return Err(ShoalError::new(
            ErrorCode::NodeNotReady,
            format!("node {} is not a replica of partition {}", node.id, req.partition),
        ));
    }
    let part = node
        .partition(table.id, req.partition)
        .ok_or_else(|| ShoalError::new(ErrorCode::NodeNotReady, "partition replica not installed"))?;
    let newest = part.raise_term(pa.primary_term);
    if req.primary_term < newest || pa.primary != Some(req.from) {
        return Err(ShoalError::stale_epoch(map.epoch, req.epoch));
    }
    let mut store = part.store.lock();
    for img in req.rows {
        part.saw_seq(img.seq);
        store.apply(image_from_pb(img));
    }
    Ok(())
}

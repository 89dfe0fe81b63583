//! Synchronous replication inside a node group: the primary's sending side and the replicas'
//! applying side.
//!
//! A replica accepts images only from the primary of the partition's current term. Terms come
//! from mgmd (the epoch in which a primary took over) and only grow; a message from an older
//! term is refused with STALE_EPOCH, which tells a deposed primary to stop. A replica that has
//! not yet learned the sender's epoch catches up first, so it never applies a write from a map
//! it has not installed (that map may ask it to start over empty).

use std::time::{Duration, Instant};

use shoal_proto::{ClusterState, ErrorCode, NodeId, PartitionAssignment, ShoalError, TableId};

use crate::node::Node;
use crate::storage::Image;
use crate::transport::{Replicate, TxnStep, TxnTag};

/// Table id of an activation barrier: a message with no rows that a new primary sends to every
/// other replica (see `node::apply_map`). Real tables start at 1.
pub const BARRIER_TABLE: TableId = 0;

/// Pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// After this long without an answer from a replica, ask mgmd to declare it failed.
const REPORT_AFTER: Duration = Duration::from_millis(300);
/// Give up on a write after this long (the client sees TIMEOUT; the outcome is unknown).
const GIVE_UP_AFTER: Duration = Duration::from_secs(10);

/// Sends `images` of one partition to every replica of `pa` but this node and waits until each
/// has applied them or has left the partition's replica set.
pub async fn replicate(
    node: &Node,
    map: &ClusterState,
    table: TableId,
    pa: &PartitionAssignment,
    gci: u64,
    images: Vec<Image>,
) -> Result<(), ShoalError> {
    replicate_txn(node, map, table, pa, gci, images, None).await
}

/// Like [`replicate`], for a transaction's images (see [`TxnTag`]).
pub async fn replicate_txn(
    node: &Node,
    map: &ClusterState,
    table: TableId,
    pa: &PartitionAssignment,
    gci: u64,
    images: Vec<Image>,
    txn: Option<TxnTag>,
) -> Result<(), ShoalError> {
    // The writes applied since the last message ride along (not on barriers: a new primary
    // confirms nothing of the old one's).
    let confirmed = match table {
        BARRIER_TABLE => vec![],
        _ => node.partition(table, pa.partition).map(|p| p.take_confirms()).unwrap_or_default(),
    };
    let msg = Replicate {
        from: node.id,
        table,
        partition: pa.partition,
        primary_term: pa.primary_term,
        epoch: map.epoch,
        gci,
        images,
        txn,
        confirmed,
    };
    let targets = pa.replicas.iter().map(|r| r.node_id).filter(|&n| n != node.id);
    let sends = targets.map(|to| send_to(node, to, pa, msg.clone()));
    for r in futures::future::join_all(sends).await {
        r?;
    }
    Ok(())
}

async fn send_to(node: &Node, to: NodeId, pa: &PartitionAssignment, msg: Replicate) -> Result<(), ShoalError> {
    let start = Instant::now();
    let mut reported = false;
    loop {
        let failure = match node.transport.replicate(to, msg.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) if e.code == ErrorCode::StaleEpoch => {
                return Err(ShoalError::not_primary(None, format!("replica {to} knows a newer primary: {e}")));
            }
            // A commit decision refused (`TxnStep::Record`): asking again changes nothing.
            Err(e) if e.code == ErrorCode::TxnAborted => return Err(e),
            Err(e) => e,
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
            let _ = node.failure_reports.try_send((to, failure.to_string()));
        }
        if start.elapsed() >= GIVE_UP_AFTER {
            return Err(ShoalError::new(ErrorCode::Timeout, format!("replica {to} did not acknowledge in time")));
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// Replica side: applies images sent by a primary.
pub async fn apply(node: &Node, req: Replicate) -> Result<(), ShoalError> {
    node.ensure_epoch(req.epoch).await?;
    let map = node.map();
    if req.table == BARRIER_TABLE {
        let pa = map
            .partition(req.partition)
            .ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, format!("no partition {}", req.partition)))?;
        if req.primary_term < pa.primary_term || pa.primary != Some(req.from) {
            return Err(ShoalError::stale_epoch(map.epoch, req.epoch));
        }
        return Ok(());
    }
    let table = map
        .table_by_id(req.table)
        .ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, format!("table id {} does not exist", req.table)))?;
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
    if !req.confirmed.is_empty() {
        let mut store = part.store.lock();
        for &seq in &req.confirmed {
            store.unconfirmed.confirm(req.primary_term, seq);
        }
    }
    if let Some(t) = req.txn {
        tracing::debug!(txn = format!("{:x}", t.id), partition = req.partition, step = ?t.step, from = req.from, images = req.images.len(), "txn replicate");
    }
    match req.txn.map(|t| (t, t.step)) {
        Some((t, TxnStep::Prepare)) => {
            node.txns.keep_prepared(t.id, t.tc, req.table, req.partition, req.images);
            return Ok(());
        }
        Some((t, TxnStep::Abort)) => {
            node.txns.drop_prepared(t.id, req.table, req.partition);
            return Ok(());
        }
        Some((t, TxnStep::Commit)) => node.txns.drop_prepared(t.id, req.table, req.partition),
        Some((t, TxnStep::Record)) => {
            crate::txn::take_record(node, t.id, req.gci)?;
            node.txns.drop_prepared(t.id, req.table, req.partition);
        }
        None => {}
    }
    let mut store = part.store.lock();
    for img in req.images {
        part.saw_seq(img.seq);
        // Logged where it is applied (under the store lock), and only if it changes anything.
        if store.is_newer(&img) {
            node.durability.log(req.gci, req.table, req.partition, &img);
            // Applied here before the primary applies it: hidden from reads made as the
            // primary until it confirms (`unconfirmed.rs`).
            store.unconfirmed.add(&img.key, req.primary_term, img.seq);
            store.apply(img);
        }
    }
    Ok(())
}

/// How long a primary's confirmations of applied writes wait for a write to take them to the
/// backups before they go on their own (`unconfirmed.rs`): one to two of these. Until they
/// arrive, reads made as the primary of those keys go to the primary; under load the next
/// write of the partition takes them along. Longer means fewer messages of their own (each
/// wakes the backup) on partitions written now and then.
pub const CONFIRM_DELAY: Duration = Duration::from_millis(50);

/// Sends each partition's confirmations that waited a whole `CONFIRM_DELAY` to its backups, in
/// a message without images, while this node is still the partition's primary. A lost one
/// only leaves reads of those keys going to the primary.
pub async fn confirm_loop(node: std::sync::Arc<Node>) {
    let mut tick = tokio::time::interval(CONFIRM_DELAY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let map = node.map();
        for part in node.partitions() {
            let confirmed = part.confirm_tick();
            if confirmed.is_empty() {
                continue;
            }
            let Some(pa) = map.partition(part.id).filter(|pa| pa.primary == Some(node.id)) else { continue };
            let msg = Replicate {
                from: node.id,
                table: part.table,
                partition: part.id,
                primary_term: pa.primary_term,
                epoch: map.epoch,
                gci: 0,
                images: vec![],
                txn: None,
                confirmed,
            };
            for r in pa.replicas.iter().filter(|r| r.node_id != node.id) {
                let (node, msg, to) = (node.clone(), msg.clone(), r.node_id);
                tokio::spawn(async move {
                    let _ = node.transport.replicate(to, msg).await;
                });
            }
        }
    }
}

//! The data node's shared state: its view of the cluster map, its partition replicas, its
//! lease, and its transport to its peers.
//!
//! The data path reads the map and the partition table through `ArcSwap`
//! snapshots: no lock is shared between requests. Only installing a new map (control path)
//! serializes on `install_lock`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use shoal_proto::{
    ClusterState, Epoch, ErrorCode, NodeId, NodeState, PartitionAssignment, PartitionId, ShoalError, TableId,
};
use tokio::sync::{mpsc, watch, Notify};

use crate::partition::Partition;
use crate::storage::MemoryBudget;
use crate::transport::Transport;

/// How long a request from a newer epoch waits for this node to learn that epoch.
pub const EPOCH_CATCH_UP_MS: u64 = 2000;

#[derive(Clone, Debug)]
pub struct Timing {
    pub heartbeat_interval: Duration,
    pub lease: Duration,
    pub failure_timeout: Duration,
    pub lock_wait: Duration,
}

type PartitionTable = HashMap<(TableId, PartitionId), Arc<Partition>>;

pub struct Node {
    pub id: NodeId,
    pub incarnation: u64,
    pub addr: String,
    pub timing: Timing,
    pub budget: Arc<MemoryBudget>,
    map: ArcSwap<ClusterState>,
    parts: ArcSwap<PartitionTable>,
    pub transport: Arc<dyn Transport>,
    epoch_tx: watch::Sender<Epoch>,
    install_lock: Mutex<()>,
    /// The sync (copy from the primaries) this node runs or ran last; 0 = none.
    sync_epoch: AtomicU64,
    start: Instant,
    /// Lease end in nanoseconds since `start`; 0 = no lease.
    lease_until_ns: AtomicU64,
    /// Wakes the mgmd link to fetch the map now.
    pub refresh: Notify,
    /// Peers this node could not replicate to, for the mgmd link to report (bounded; a full
    /// queue drops reports, which are repeated while the peer stays unreachable).
    pub failure_reports: mpsc::Sender<(NodeId, String)>,
}

impl Node {
    pub fn new(
        id: NodeId,
        incarnation: u64,
        addr: String,
        timing: Timing,
        budget: Arc<MemoryBudget>,
        failure_reports: mpsc::Sender<(NodeId, String)>,
        transport: Arc<dyn Transport>,
    ) -> Arc<Node> {
        let (epoch_tx, _) = watch::channel(0);
        Arc::new(Node {
            failure_reports,
            id,
            incarnation,
            addr,
            timing,
            budget,
            map: ArcSwap::from_pointee(ClusterState::default()),
            parts: ArcSwap::from_pointee(HashMap::new()),
            transport,
            epoch_tx,
            install_lock: Mutex::new(()),
            sync_epoch: AtomicU64::new(0),
            start: Instant::now(),
            lease_until_ns: AtomicU64::new(0),
            refresh: Notify::new(),
        })
    }

    pub fn map(&self) -> Arc<ClusterState> {
        self.map.load_full()
    }

    pub fn epoch(&self) -> Epoch {
        self.map.load().epoch
    }

    pub fn partition(&self, table: TableId, p: PartitionId) -> Option<Arc<Partition>> {
        self.parts.load().get(&(table, p)).cloned()
    }

    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.parts.load().values().cloned().collect()
    }

    pub fn sync_epoch(&self) -> Epoch {
        self.sync_epoch.load(Ordering::Acquire)
    }

    // ----- lease -----

    /// A heartbeat sent at `sent` was answered with a lease: it runs from the send time, so
    /// the node's lease always ends before mgmd's failure timeout for it.
    pub fn renew_lease(&self, sent: Instant, lease: Duration) {
        let until = (sent.saturating_duration_since(self.start) + lease).as_nanos() as u64;
        self.lease_until_ns.fetch_max(until, Ordering::AcqRel);
    }

    pub fn drop_lease(&self) {
        self.lease_until_ns.store(0, Ordering::Release);
    }

    pub fn lease_valid(&self) -> bool {
        let now = self.start.elapsed().as_nanos() as u64;
        now < self.lease_until_ns.load(Ordering::Acquire)
    }

    // ----- roles -----

    fn my_state(&self, map: &ClusterState) -> Option<NodeState> {
        map.node(self.id).filter(|n| n.incarnation == self.incarnation).map(|n| n.state)
    }

    /// May this node act as primary of `pa` now?
    pub fn check_primary(&self, map: &ClusterState, pa: &PartitionAssignment) -> Result<(), ShoalError> {
        if pa.primary != Some(self.id) {
            return Err(match pa.primary {
                Some(p) => {
                    ShoalError::not_primary(Some(p), format!("node {} is primary of partition {}", p, pa.partition))
                }
                None => ShoalError::new(
                    ErrorCode::PartitionUnavailable,
                    format!("partition {} has no live replica", pa.partition),
                ),
            });
        }
        if self.my_state(map) != Some(NodeState::Up) {
            return Err(ShoalError::new(ErrorCode::NodeNotReady, format!("node {} is not up", self.id)));
        }
        if !self.lease_valid() {
            return Err(ShoalError::new(ErrorCode::NodeNotReady, format!("node {} holds no lease", self.id)));
        }
        Ok(())
    }

    /// May this node serve committed reads of `pa` as a replica (read-backup)?
    pub fn check_readable(&self, map: &ClusterState, pa: &PartitionAssignment) -> Result<(), ShoalError> {
        match pa.replica(self.id) {
            Some(r) if !r.syncing => {}
            _ => {
                return Err(ShoalError::not_primary(pa.primary, format!("node {} holds no complete replica", self.id)))
            }
        }
        if self.my_state(map) != Some(NodeState::Up) || !self.lease_valid() {
            return Err(ShoalError::new(ErrorCode::NodeNotReady, format!("node {} is not serving", self.id)));
        }
        Ok(())
    }

    /// Waits until this node knows `epoch`, asking mgmd for the map if needed.
    pub async fn ensure_epoch(&self, epoch: Epoch) -> Result<(), ShoalError> {
        if self.epoch() >= epoch {
            return Ok(());
        }
        self.refresh.notify_one();
        let mut rx = self.epoch_tx.subscribe();
        let caught_up = tokio::time::timeout(Duration::from_millis(EPOCH_CATCH_UP_MS), async {
            rx.wait_for(|&e| e >= epoch).await.is_ok()
        })
        .await;
        match caught_up {
            Ok(true) => Ok(()),
            _ => Err(ShoalError::new(
                ErrorCode::NodeNotReady,
                format!("node {} has not learned epoch {epoch} yet", self.id),
            )),
        }
    }

    /// Installs a newer cluster map. Returns the epoch of a sync this node must now run.
    pub fn install_map(&self, new: ClusterState) -> Option<Epoch> {
        let _g = self.install_lock.lock();
        if new.epoch <= self.epoch() {
            return None;
        }
        let old_parts = self.parts.load_full();
        let me = new.node(self.id).filter(|n| n.incarnation == self.incarnation).cloned();
        let mut parts: PartitionTable = HashMap::new();
        if me.is_some() {
            for t in &new.tables {
                for pa in new.partitions.iter().take(t.partition_count as usize) {
                    if pa.replica(self.id).is_none() {
                        continue;
                    }
                    let part = old_parts
                        .get(&(t.id, pa.partition))
                        .cloned()
                        .unwrap_or_else(|| Arc::new(Partition::new(t.id, pa.partition, self.budget.clone())));
                    part.raise_term(pa.primary_term);
                    parts.insert((t.id, pa.partition), part);
                }
            }
        }
        let mut start_sync = None;
        if let Some(me) = &me {
            if me.state == NodeState::Starting && me.sync_epoch != 0 && me.sync_epoch != self.sync_epoch() {
                // A new copy: whatever this node held may be stale. Start every replica empty
                // and remember deletes until the copy is done.
                for part in parts.values() {
                    part.store.lock().begin_fill();
                }
                self.sync_epoch.store(me.sync_epoch, Ordering::Release);
                start_sync = Some(me.sync_epoch);
            }
        }
        if me.as_ref().is_none_or(|m| m.state == NodeState::Down) {
            self.drop_lease();
        }
        self.transport.update_peers(&new);
        // Partitions first: a request that sees the new map must find its replicas.
        self.parts.store(Arc::new(parts));
        let epoch = new.epoch;
        self.map.store(Arc::new(new));
        self.epoch_tx.send_replace(epoch);
        start_sync
    }
}

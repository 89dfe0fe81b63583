//! The data node's shared state: its view of the cluster map, its partition replicas, its
//! lease, and its transport to its peers.
//!
//! The data path reads the map and the partition table through `ArcSwap`
//! snapshots: no lock is shared between requests. Only installing a new map (control path)
//! serializes on `install_lock`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use shoal_proto::hash::IdMap;
use shoal_proto::{
    ClusterState, Epoch, ErrorCode, NodeId, NodeState, PartitionAssignment, PartitionId, ShoalError, TableId,
};
use tokio::sync::{mpsc, watch, Notify};

use crate::durability::Durability;
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
    /// An unprepared transaction idle this long is rolled back.
    pub txn_inactive: Duration,
}

type PartitionTable = IdMap<(TableId, PartitionId), Arc<Partition>>;

/// What a node is started with.
pub struct NodeSetup {
    pub id: NodeId,
    /// Changes with every start of the process.
    pub incarnation: u64,
    pub addr: String,
    pub timing: Timing,
    pub budget: Arc<MemoryBudget>,
    pub durability: Durability,
    pub txn_limits: crate::txn::TxnLimits,
}

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
    /// Primary terms this node passed the activation barrier for, per partition id (control
    /// path only; the data path reads each replica's copy).
    activated: Mutex<IdMap<PartitionId, Epoch>>,
    /// Activations running now.
    activating: Mutex<HashSet<(PartitionId, Epoch)>>,
    /// Partitions being filled by a copy from their primary → the copy's sync epoch (control
    /// path only).
    filling: Mutex<IdMap<PartitionId, Epoch>>,
    start: Instant,
    /// Lease end in nanoseconds since `start`; 0 = no lease.
    lease_until_ns: AtomicU64,
    /// Wakes the mgmd link to fetch the map now.
    pub refresh: Notify,
    /// Peers this node could not replicate to, for the mgmd link to report (bounded; a full
    /// queue drops reports, which are repeated while the peer stays unreachable).
    pub failure_reports: mpsc::Sender<(NodeId, String)>,
    /// Redo log, GCI clock, checkpoints.
    pub durability: Durability,
    /// Transactions this node takes part in or coordinates.
    pub txns: crate::txn::Txns,
}

impl Node {
    pub fn new(
        setup: NodeSetup,
        failure_reports: mpsc::Sender<(NodeId, String)>,
        transport: Arc<dyn Transport>,
    ) -> Arc<Node> {
        let NodeSetup { id, incarnation, addr, timing, budget, durability, txn_limits } = setup;
        let (epoch_tx, _) = watch::channel(0);
        Arc::new(Node {
            failure_reports,
            id,
            incarnation,
            addr,
            timing,
            budget,
            map: ArcSwap::from_pointee(ClusterState::default()),
            parts: ArcSwap::from_pointee(IdMap::default()),
            transport,
            epoch_tx,
            install_lock: Mutex::new(()),
            activated: Mutex::new(IdMap::default()),
            activating: Mutex::new(HashSet::new()),
            filling: Mutex::new(IdMap::default()),
            start: Instant::now(),
            lease_until_ns: AtomicU64::new(0),
            refresh: Notify::new(),
            durability,
            txns: crate::txn::Txns::new(txn_limits),
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

    /// Whether a copy of `sync_epoch` still has partitions to fill (a newer map may have
    /// replaced it).
    pub fn is_filling(&self, sync_epoch: Epoch) -> bool {
        self.filling.lock().values().any(|&e| e == sync_epoch)
    }

    /// Whether any replica of this node is being filled by a copy now.
    pub fn any_filling(&self) -> bool {
        !self.filling.lock().is_empty()
    }

    /// Ends the fill of every partition this node filled in `sync_epoch`.
    pub fn end_fill(&self, sync_epoch: Epoch) {
        let mut filling = self.filling.lock();
        let done: Vec<PartitionId> = filling.iter().filter(|(_, &e)| e == sync_epoch).map(|(&p, _)| p).collect();
        for p in &done {
            filling.remove(p);
        }
        for part in self.parts.load().values().filter(|part| done.contains(&part.id)) {
            part.store.lock().end_fill();
        }
        if !done.is_empty() {
            self.durability.fill_changed(true);
        }
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

    /// As primary, may this replica serve now? Not before this node passed the activation
    /// barrier for the partition's current term, and not once a newer primary was seen.
    pub fn check_active(&self, part: &Partition, pa: &PartitionAssignment) -> Result<(), ShoalError> {
        if part.term() > pa.primary_term {
            return Err(ShoalError::not_primary(None, "a newer primary took over"));
        }
        if part.active_term() < pa.primary_term {
            return Err(ShoalError::new(
                ErrorCode::NodeNotReady,
                format!("node {} is still taking over partition {}", self.id, pa.partition),
            ));
        }
        Ok(())
    }

    /// May this node serve committed reads of `pa` as a replica (read-backup)?
    pub fn check_readable(&self, map: &ClusterState, pa: &PartitionAssignment) -> Result<(), ShoalError> {
        match pa.replica(self.id) {
            Some(r) if !r.syncing() => {}
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

    /// Installs a newer cluster map and says what the node must start because of it.
    pub fn install_map(&self, new: ClusterState) -> MapChange {
        let _g = self.install_lock.lock();
        let mut change = MapChange::default();
        if new.epoch <= self.epoch() {
            // Same map, newer checkpoint bookkeeping (GCIs advance without a new epoch).
            let cur = self.map.load();
            if new.epoch == cur.epoch && new.gci_complete > cur.gci_complete {
                self.map.store(Arc::new(new));
            }
            return change;
        }
        let activated = self.activated.lock().clone();
        let mut filling = self.filling.lock();
        // Replicas that must be filled by a new copy: whatever they hold may be stale. They
        // start empty and remember deletes until the copy is done (see sync.rs).
        let mut new_fills: IdMap<PartitionId, Epoch> = IdMap::default();
        if new.node(self.id).is_some_and(|n| n.incarnation == self.incarnation) {
            for pa in &new.partitions {
                match pa.replica(self.id) {
                    Some(r) if r.syncing() && filling.get(&pa.partition) != Some(&r.sync_epoch) => {
                        new_fills.insert(pa.partition, r.sync_epoch);
                    }
                    Some(r) if !r.syncing() => {
                        filling.remove(&pa.partition);
                    }
                    None => {
                        filling.remove(&pa.partition);
                    }
                    _ => {}
                }
            }
        }
        filling.extend(new_fills.iter());
        let old_parts = self.parts.load_full();
        let me = new.node(self.id).filter(|n| n.incarnation == self.incarnation).cloned();
        let mut parts = PartitionTable::default();
        if me.is_some() {
            for t in &new.tables {
                for pa in new.partitions.iter().take(t.partition_count as usize) {
                    if pa.replica(self.id).is_none() {
                        continue;
                    }
                    let old = old_parts.get(&(t.id, pa.partition)).cloned();
                    let fresh = old.is_none();
                    let part = old.unwrap_or_else(|| {
                        // Rows this node restored from its own files, if any.
                        let part = self
                            .durability
                            .take_restored(t.id, pa.partition)
                            .unwrap_or_else(|| Arc::new(Partition::new(t.id, pa.partition, self.budget.clone())));
                        part.activate(activated.get(&pa.partition).copied().unwrap_or(0));
                        part
                    });
                    if new_fills.contains_key(&pa.partition) || (fresh && filling.contains_key(&pa.partition)) {
                        part.store.lock().begin_fill();
                        self.durability.fill_changed(false);
                    }
                    part.raise_term(pa.primary_term);
                    part.store.lock().set_indexes(t);
                    parts.insert((t.id, pa.partition), part);
                }
            }
        }
        if me.is_some() {
            let mut activating = self.activating.lock();
            for pa in &new.partitions {
                let done = activated.get(&pa.partition).copied().unwrap_or(0);
                if pa.primary == Some(self.id)
                    && done < pa.primary_term
                    && activating.insert((pa.partition, pa.primary_term))
                {
                    change.activate.push((pa.partition, pa.primary_term));
                }
            }
        }
        let mut epochs: Vec<Epoch> = new_fills.values().copied().collect();
        epochs.sort_unstable();
        epochs.dedup();
        change.sync = epochs;
        drop(filling);
        if me.as_ref().is_none_or(|m| m.state == NodeState::Down) {
            self.drop_lease();
        }
        if let Some(m) = &me {
            self.durability.clock.raise_floor(new.gci_floor(m.node_group));
        }
        if me.as_ref().is_some_and(|m| m.state == NodeState::Up) {
            // Restored replicas of tables dropped meanwhile will never be claimed.
            self.durability.forget_restored();
        }
        self.transport.update_peers(&new);
        // Partitions first: a request that sees the new map must find its replicas.
        self.parts.store(Arc::new(parts));
        let epoch = new.epoch;
        self.map.store(Arc::new(new));
        self.epoch_tx.send_replace(epoch);
        change
    }

    /// Records that this node passed the activation barrier of `term` for `partition`.
    pub fn mark_active(&self, partition: PartitionId, term: Epoch) {
        {
            let mut activated = self.activated.lock();
            let e = activated.entry(partition).or_default();
            *e = (*e).max(term);
        }
        for part in self.parts.load().values().filter(|p| p.id == partition) {
            part.activate(term);
        }
    }

    fn activation_over(&self, partition: PartitionId, term: Epoch) {
        self.activating.lock().remove(&(partition, term));
    }
}

/// What installing a map asks of the node.
#[derive(Debug, Default)]
pub struct MapChange {
    /// Copies to run, by sync epoch: partitions of this node to fill from their primaries.
    pub sync: Vec<Epoch>,
    /// Partitions this node became primary of: (partition, term) to activate.
    pub activate: Vec<(PartitionId, Epoch)>,
}

/// Installs `map` and starts what it asks for: the activation barrier of every partition this
/// node now leads. Returns the sync epochs of copies the caller must run.
pub fn apply_map(node: &Arc<Node>, map: ClusterState) -> Vec<Epoch> {
    let change = node.install_map(map);
    for (partition, term) in change.activate {
        tokio::spawn(activate(node.clone(), partition, term));
    }
    change.sync
}

/// The activation barrier: a new primary serves a partition only after every other replica
/// has installed the map that made it primary. From then on no replica accepts writes from an
/// older primary, and an old primary that is still alive knows it is not primary any more, so
/// two nodes never serve one partition at once, also when mgmd moves a primary on purpose.
async fn activate(node: Arc<Node>, partition: PartitionId, term: Epoch) {
    for attempt in 0u32.. {
        let map = node.map();
        let Some(pa) = map.partition(partition) else { break };
        if pa.primary != Some(node.id) || pa.primary_term != term {
            break;
        }
        match crate::replication::replicate(&node, &map, crate::replication::BARRIER_TABLE, pa, 0, vec![]).await {
            Ok(()) => {
                // Prepared transactions kept as a backup are this primary's to finish.
                crate::txn::adopt_prepared(&node, partition, term).await;
                node.mark_active(partition, term);
                tracing::debug!(partition, term, "primary activated");
                break;
            }
            Err(e) if e.code == ErrorCode::NotPrimary => break,
            Err(e) => {
                if attempt.is_multiple_of(20) {
                    tracing::warn!(partition, term, "activation barrier failed, retrying: {e}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    node.activation_over(partition, term);
}

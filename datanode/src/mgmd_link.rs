//! The data node's link to mgmd: heartbeats (which carry its lease), the cluster map watch,
//! failure reports about peers, and sync reports.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_client::MgmdPool;
use shoal_proto::pb::{self, mgmd_client::MgmdClient};
use shoal_proto::{ClusterState, Epoch, ErrorCode, NodeId, ShoalError};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::node::Node;

pub struct MgmdLink {
    pool: MgmdPool,
}

impl MgmdLink {
    pub fn new(addrs: &[String], call_timeout: Duration) -> Result<MgmdLink, ShoalError> {
        Ok(MgmdLink { pool: MgmdPool::new(addrs, call_timeout)? })
    }

    async fn on_leader<T, F, Fut>(&self, f: F) -> Result<T, ShoalError>
    where
        F: Fn(MgmdClient<Channel>) -> Fut,
        Fut: Future<Output = Result<(T, Option<pb::Error>), tonic::Status>>,
    {
        self.pool.on_leader(f).await
    }

    pub async fn heartbeat(&self, req: pb::HeartbeatRequest) -> Result<pb::HeartbeatResponse, ShoalError> {
        self.on_leader(|mut c| {
            let req = req.clone();
            async move {
                let r = c.heartbeat(req).await?.into_inner();
                let err = r.error.clone();
                Ok((r, err))
            }
        })
        .await
    }

    pub async fn hurry_checkpoint(&self, gci: u64) -> Result<(), ShoalError> {
        self.pool.hurry_checkpoint(gci).await
    }

    pub async fn synced(&self, node_id: NodeId, incarnation: u64, sync_epoch: Epoch) -> Result<(), ShoalError> {
        let req = pb::NodeSyncedRequest { node_id, incarnation, sync_epoch };
        self.on_leader(|mut c| async move { Ok(((), c.node_synced(req).await?.into_inner().error)) }).await
    }

    pub async fn report_failure(&self, reporter: NodeId, node_id: NodeId, reason: String) -> Result<(), ShoalError> {
        let req = pb::ReportFailureRequest { reporter, node_id, reason };
        self.on_leader(|mut c| {
            let req = req.clone();
            async move { Ok(((), c.report_failure(req).await?.into_inner().error)) }
        })
        .await
    }

    /// The newest map any reachable mgmd has.
    pub async fn fetch_newest(&self) -> Option<ClusterState> {
        self.pool.fetch_newest().await.ok()
    }
}

/// The cluster map, waiting for an mgmd to answer (a data node can do nothing without one).
pub async fn fetch_map_at_start(link: &MgmdLink) -> ClusterState {
    for attempt in 0u64.. {
        if let Some(m) = link.fetch_newest().await {
            return m;
        }
        if attempt.is_multiple_of(20) {
            tracing::warn!("waiting for an mgmd to answer");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    unreachable!("the loop above only ends by returning")
}

/// While the node loads its files: heartbeats that only carry progress (mgmd neither grants a
/// lease nor starts a join for them).
pub async fn report_restore(
    link: Arc<MgmdLink>,
    (node_id, incarnation, addr, pid): (NodeId, u64, String, u32),
    progress: Arc<parking_lot::Mutex<String>>,
) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let req = pb::HeartbeatRequest {
            node_id,
            incarnation,
            addr: addr.clone(),
            pid,
            epoch: 0,
            loaded: false,
            loaded_gci: 0,
            restoring: true,
            progress: progress.lock().clone(),
        };
        let _ = link.heartbeat(req).await;
    }
}

/// Heartbeats the mgmd leader; each answered heartbeat renews the lease from its send time.
/// `loaded` is the GCI the node restored from its own files (None: it could not).
pub async fn heartbeat_loop(node: Arc<Node>, link: Arc<MgmdLink>, pid: u32, loaded: Option<u64>) {
    let mut tick = tokio::time::interval(node.timing.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = 0u64;
    loop {
        tick.tick().await;
        let sent = Instant::now();
        let req = pb::HeartbeatRequest {
            node_id: node.id,
            incarnation: node.incarnation,
            addr: node.addr.clone(),
            pid,
            epoch: node.epoch(),
            loaded: loaded.is_some(),
            loaded_gci: loaded.unwrap_or(0),
            restoring: false,
            progress: node.durability.progress.lock().clone(),
        };
        match link.heartbeat(req).await {
            Ok(resp) => {
                failures = 0;
                if resp.restart_from_files {
                    forget_unused_life(&node);
                    restart_from_files();
                }
                let down = resp.state == pb::NodeState::Down as i32;
                if down {
                    node.drop_lease();
                } else if resp.lease_ms > 0 {
                    node.renew_lease(sent, Duration::from_millis(resp.lease_ms));
                }
                if resp.epoch > node.epoch() {
                    node.refresh.notify_one();
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(50) {
                    tracing::warn!("heartbeat failed ({failures} in a row): {e}");
                }
            }
        }
    }
}

/// Before a restart mgmd asked for: a start that never took part in the cluster must not stay
/// recorded as a life, or the next restore would drop the writes of checkpoints above its
/// restore point (see `redo::Redo::forget_unused_life`).
fn forget_unused_life(node: &Node) {
    let Some(redo) = &node.durability.redo else { return };
    match redo.forget_unused_life() {
        Ok(true) => tracing::info!("this start wrote nothing: forgetting it in the redo log's lives"),
        Ok(false) => {}
        Err(e) => tracing::warn!("cannot update the redo log's lives before restarting: {e}"),
    }
}

/// Replaces this process with a fresh start of the same program and arguments (same pid, new
/// incarnation), which restores from the node's own files like a restart after a crash: what
/// mgmd asks of a node declared down while alive when its node group can start again only from
/// files (NDB's angel process restarts a node excluded from the cluster the same way).
fn restart_from_files() -> ! {
    use std::os::unix::process::CommandExt;
    tracing::warn!("declared down while alive and asked to restart: restarting from this node's own files");
    let err = match std::env::current_exe() {
        Ok(exe) => std::process::Command::new(exe).args(std::env::args_os().skip(1)).exec(),
        Err(e) => e,
    };
    tracing::error!("cannot restart this process: {err}");
    std::process::exit(1)
}

/// Follows the cluster map: a watch stream from one mgmd, plus on-demand fetches of the newest
/// map when a request or heartbeat shows this node is behind.
pub async fn watch_loop(node: Arc<Node>, link: Arc<MgmdLink>) {
    let mut i = 0usize;
    loop {
        let mut client = link.pool.client(i);
        let req = pb::WatchRequest { known_epoch: node.epoch() };
        if let Ok(Ok(resp)) = tokio::time::timeout(link.pool.call_timeout(), client.watch_cluster_state(req)).await {
            let mut stream = resp.into_inner();
            loop {
                tokio::select! {
                    msg = stream.next() => match msg {
                        Some(Ok(state)) => match ClusterState::try_from(state) {
                            Ok(s) => install(&node, &link, s),
                            Err(e) => tracing::warn!("ignoring a bad cluster map: {e}"),
                        },
                        _ => break,
                    },
                    _ = node.refresh.notified() => {
                        if let Some(s) = link.fetch_newest().await {
                            install(&node, &link, s);
                        }
                    }
                }
            }
        } else if let Some(s) = link.fetch_newest().await {
            install(&node, &link, s);
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn install(node: &Arc<Node>, link: &Arc<MgmdLink>, state: ClusterState) {
    let epoch = state.epoch;
    for sync_epoch in crate::node::apply_map(node, state) {
        tokio::spawn(sync_and_report(node.clone(), sync_epoch, link.clone()));
    }
    tracing::debug!(epoch, "installed cluster map");
}

/// Forwards failure reports from the replication path to mgmd.
pub async fn report_loop(node: Arc<Node>, link: Arc<MgmdLink>, mut rx: mpsc::Receiver<(NodeId, String)>) {
    while let Some((peer, reason)) = rx.recv().await {
        if let Err(e) = link.report_failure(node.id, peer, reason).await {
            tracing::warn!(peer, "could not report failure to mgmd: {e}");
        }
    }
}

/// Runs a node-restart copy and tells mgmd when it is done, so mgmd marks the node up.
async fn sync_and_report(node: Arc<Node>, sync_epoch: Epoch, link: Arc<MgmdLink>) {
    let begun = Instant::now();
    let Some(rows) = crate::sync::run(&node, sync_epoch).await else { return };
    for attempt in 0u32..600 {
        if !node.is_filling(sync_epoch) && attempt > 0 && mgmd_knows_synced(&node, sync_epoch) {
            return;
        }
        match link.synced(node.id, node.incarnation, sync_epoch).await {
            Ok(()) => {
                tracing::info!(sync_epoch, rows, ms = begun.elapsed().as_millis() as u64, "node restart: caught up");
                return;
            }
            Err(e) if e.code == ErrorCode::StaleEpoch => {
                tracing::info!("sync report refused: {e}");
                return;
            }
            Err(e) => {
                if attempt.is_multiple_of(10) {
                    tracing::warn!("cannot report sync to mgmd: {e}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Whether the newest map shows the copy of `sync_epoch` done (or replaced).
fn mgmd_knows_synced(node: &Node, sync_epoch: Epoch) -> bool {
    let map = node.map();
    !map.partitions.iter().any(|p| p.replica(node.id).is_some_and(|r| r.sync_epoch == sync_epoch))
}

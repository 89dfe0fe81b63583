//! The data node's link to mgmd: heartbeats (which carry its lease), the cluster map watch,
//! failure reports about peers, and sync reports.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_proto::convert::check;
use shoal_proto::pb::{self, mgmd_client::MgmdClient};
use shoal_proto::{ClusterState, Epoch, ErrorCode, NodeId, ShoalError};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

use crate::node::Node;

pub struct MgmdLink {
    clients: Vec<(String, MgmdClient<Channel>)>,
    /// Index of the mgmd that last answered as leader.
    leader: AtomicUsize,
    call_timeout: Duration,
}

impl MgmdLink {
    pub fn new(addrs: &[String], call_timeout: Duration) -> Result<MgmdLink, ShoalError> {
        let mut clients = vec![];
        for a in addrs {
            let ep = Endpoint::from_shared(format!("http://{a}"))
                .map_err(|e| ShoalError::new(ErrorCode::InvalidArgument, format!("mgmd address {a}: {e}")))?
                .connect_timeout(Duration::from_millis(300))
                .tcp_nodelay(true);
            clients.push((a.clone(), MgmdClient::new(ep.connect_lazy())));
        }
        if clients.is_empty() {
            return Err(ShoalError::new(ErrorCode::InvalidArgument, "no mgmd address"));
        }
        Ok(MgmdLink { clients, leader: AtomicUsize::new(0), call_timeout })
    }

    /// Calls the mgmd leader, following NOT_LEADER hints and skipping unreachable mgmds.
    async fn on_leader<T, F, Fut>(&self, f: F) -> Result<T, ShoalError>
    where
        F: Fn(MgmdClient<Channel>) -> Fut,
        Fut: Future<Output = Result<(T, Option<pb::Error>), tonic::Status>>,
    {
        let n = self.clients.len();
        let mut i = self.leader.load(Ordering::Relaxed) % n;
        let mut last = ShoalError::new(ErrorCode::NotLeader, "no mgmd leader reachable");
        for _ in 0..2 * n + 1 {
            match tokio::time::timeout(self.call_timeout, f(self.clients[i].1.clone())).await {
                Ok(Ok((t, err))) => match check(err) {
                    Ok(()) => {
                        self.leader.store(i, Ordering::Relaxed);
                        return Ok(t);
                    }
                    Err(e) if e.code == ErrorCode::NotLeader => {
                        let hinted = self.clients.iter().position(|(a, _)| !e.hint_addr.is_empty() && *a == e.hint_addr);
                        i = hinted.unwrap_or((i + 1) % n);
                        last = e;
                    }
                    Err(e) => return Err(e),
                },
                Ok(Err(status)) => {
                    last = ShoalError::new(ErrorCode::NotLeader, format!("mgmd {}: {}", self.clients[i].0, status.message()));
                    i = (i + 1) % n;
                }
                Err(_) => {
                    last = ShoalError::new(ErrorCode::Timeout, format!("mgmd {} did not answer", self.clients[i].0));
                    i = (i + 1) % n;
                }
            }
        }
        Err(last)
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

    pub async fn synced(&self, node_id: NodeId, incarnation: u64, sync_epoch: Epoch) -> Result<(), ShoalError> {
        let req = pb::NodeSyncedRequest { node_id, incarnation, sync_epoch };
        self.on_leader(|mut c| {
            let req = req.clone();
            async move { Ok(((), c.node_synced(req).await?.into_inner().error)) }
        })
        .await
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
        let calls = self.clients.iter().map(|(_, c)| {
            let mut c = c.clone();
            async move { tokio::time::timeout(self.call_timeout, c.get_cluster_state(pb::Empty {})).await }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .filter_map(|r| r.ok()?.ok())
            .filter_map(|r| ClusterState::try_from(r.into_inner()).ok())
            .max_by_key(|s| s.epoch)
    }
}

/// Heartbeats the mgmd leader; each answered heartbeat renews the lease from its send time.
pub async fn heartbeat_loop(node: Arc<Node>, link: Arc<MgmdLink>, pid: u32) {
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
        };
        match link.heartbeat(req).await {
            Ok(resp) => {
                failures = 0;
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
                if failures == 1 || failures % 50 == 0 {
                    tracing::warn!("heartbeat failed ({failures} in a row): {e}");
                }
            }
        }
    }
}

/// Follows the cluster map: a watch stream from one mgmd, plus on-demand fetches of the newest
/// map when a request or heartbeat shows this node is behind.
pub async fn watch_loop(node: Arc<Node>, link: Arc<MgmdLink>) {
    let mut i = 0usize;
    loop {
        let mut client = link.clients[i % link.clients.len()].1.clone();
        let req = pb::WatchRequest { known_epoch: node.epoch() };
        if let Ok(Ok(resp)) = tokio::time::timeout(link.call_timeout, client.watch_cluster_state(req)).await {
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
    if let Some(sync_epoch) = node.install_map(state) {
        tokio::spawn(crate::sync::run(node.clone(), sync_epoch, link.clone()));
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

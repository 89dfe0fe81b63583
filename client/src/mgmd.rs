//! Talking to the mgmd nodes: find the Raft leader for changes, read the newest cluster map.
//! Used by the client library, the data nodes and the CLI.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use shoal_proto::convert::check;
use shoal_proto::pb::{self, mgmd_client::MgmdClient};
use shoal_proto::{ClusterState, ErrorCode, ShoalError};
use tonic::transport::Channel;

pub struct MgmdPool {
    clients: Vec<(String, MgmdClient<Channel>)>,
    /// Index of the mgmd that last answered as leader.
    leader: AtomicUsize,
    call_timeout: Duration,
}

impl MgmdPool {
    pub fn new(addrs: &[String], call_timeout: Duration) -> Result<MgmdPool, ShoalError> {
        let mut clients = vec![];
        for a in addrs {
            let ch = shoal_proto::grpc::channel(a, Duration::from_millis(300))?;
            clients.push((a.clone(), MgmdClient::new(ch)));
        }
        if clients.is_empty() {
            return Err(ShoalError::new(ErrorCode::InvalidArgument, "no mgmd address given"));
        }
        Ok(MgmdPool { clients, leader: AtomicUsize::new(0), call_timeout })
    }

    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    pub fn client(&self, i: usize) -> MgmdClient<Channel> {
        self.clients[i % self.clients.len()].1.clone()
    }

    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// Calls the mgmd leader, following NOT_LEADER hints and skipping unreachable mgmds.
    /// `f` returns the answer and the error field of the response.
    pub async fn on_leader<T, F, Fut>(&self, f: F) -> Result<T, ShoalError>
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
                        let hinted =
                            self.clients.iter().position(|(a, _)| !e.hint_addr.is_empty() && *a == e.hint_addr);
                        i = hinted.unwrap_or((i + 1) % n);
                        last = e;
                    }
                    Err(e) => return Err(e),
                },
                Ok(Err(status)) => {
                    last = ShoalError::new(
                        ErrorCode::NotLeader,
                        format!("mgmd {}: {}", self.clients[i].0, status.message()),
                    );
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

    /// The newest map any reachable mgmd has applied.
    pub async fn fetch_newest(&self) -> Result<ClusterState, ShoalError> {
        let calls = self.clients.iter().map(|(_, c)| {
            let mut c = c.clone();
            async move { tokio::time::timeout(self.call_timeout, c.get_cluster_state(pb::Empty {})).await }
        });
        futures::future::join_all(calls)
            .await
            .into_iter()
            .filter_map(|r| r.ok()?.ok())
            .filter_map(|r| ClusterState::try_from(r.into_inner()).ok())
            .max_by_key(|s| (s.epoch, s.gci_complete, s.users_version))
            .ok_or_else(|| ShoalError::new(ErrorCode::NodeNotReady, "no mgmd answered"))
    }

    /// Status from the leader if one answers, else from any mgmd.
    /// Asks the mgmd leader to run global checkpoints now until `gci` is complete.
    pub async fn hurry_checkpoint(&self, gci: u64) -> Result<(), ShoalError> {
        self.on_leader(|mut c| async move {
            Ok(((), c.hurry_checkpoint(pb::HurryRequest { gci }).await?.into_inner().error))
        })
        .await
    }

    pub async fn status(&self) -> Result<pb::StatusResponse, ShoalError> {
        let mut best: Option<pb::StatusResponse> = None;
        for (_, c) in &self.clients {
            let mut c = c.clone();
            if let Ok(Ok(r)) = tokio::time::timeout(self.call_timeout, c.status(pb::Empty {})).await {
                let r = r.into_inner();
                let is_leader =
                    r.mgmds.iter().any(|m| m.leader && r.state.as_ref().is_some_and(|s| s.leader_id == m.id));
                let newer = best
                    .as_ref()
                    .is_none_or(|b| r.state.as_ref().map_or(0, |s| s.epoch) > b.state.as_ref().map_or(0, |s| s.epoch));
                if is_leader || newer {
                    best = Some(r);
                }
            }
        }
        best.ok_or_else(|| ShoalError::new(ErrorCode::NodeNotReady, "no mgmd answered"))
    }
}

//! The global checkpoint driver (DESIGN §2, §4 "Durability"), run by the acting leader.
//!
//! Every `gcp_interval_ms` it takes the live data nodes (up or starting) through
//! PREPARE(g+1) → COMMIT(g+1) → FLUSH(g) (see `datanode/src/gcp.rs` for what each step does
//! there), then records GCI g complete through Raft, together with the nodes whose own files
//! can restore it. A round that any live node fails is abandoned (held commits are released)
//! and the next round uses a higher GCI; nodes never move their GCI backwards.
//!
//! A new leader does not know what its predecessor was in the middle of: data nodes may
//! already stamp up to two GCIs past the last complete one, so it starts three past it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use shoal_proto::pb::{self, data_node_client::DataNodeClient};
use shoal_proto::{NodeId, NodeKind, NodeState, ShoalError};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use crate::leader::Leader;
use crate::state::Command;

/// Data nodes never stamp a GCI more than this past the last complete one: a leader records
/// g complete only after switching them to g+1, and a new leader starts three past it.
pub const MAX_STAMPED_PAST_COMPLETE: u64 = 3;

/// Timeout of PREPARE, COMMIT and ABORT calls.
const STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// Timeout of FLUSH (it waits for an fsync).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Participant {
    id: NodeId,
    incarnation: u64,
    client: DataNodeClient<Channel>,
}

pub async fn gcp_loop(leader: Arc<Leader>, mut shutdown: watch::Receiver<bool>) {
    let mut channels: HashMap<(NodeId, String), DataNodeClient<Channel>> = HashMap::new();
    let mut next = 0u64;
    let mut failures = 0u64;
    loop {
        let interval = Duration::from_millis(leader.cluster_config().cluster.gcp_interval_ms);
        // Sync writers waiting on a GCI not complete yet: the next round starts at once.
        let wanted = leader.hurry_to.load(std::sync::atomic::Ordering::Acquire);
        if wanted <= leader.consensus().published.current().gci_complete {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = leader.hurry.notified() => {}
                _ = shutdown.wait_for(|&s| s) => return,
            }
        }
        if !leader.is_acting() {
            next = 0;
            continue;
        }
        let cluster = leader.consensus().published.current();
        if cluster.nodes.is_empty() {
            continue; // not bootstrapped
        }
        // Above any range a system restart rolled back: nodes of that group stamp nothing below.
        let floor = cluster.rolled_back.iter().map(|r| r.through + 1).max().unwrap_or(0);
        next = next.max(cluster.gci_complete + MAX_STAMPED_PAST_COMPLETE).max(floor);
        let mut parts = vec![];
        for n in cluster
            .nodes
            .iter()
            .filter(|n| n.kind == NodeKind::DataNode && matches!(n.state, NodeState::Up | NodeState::Starting))
        {
            let client = channels.entry((n.id, n.addr.clone())).or_insert_with(|| connect(&n.addr)).clone();
            parts.push(Participant { id: n.id, incarnation: n.incarnation, client });
        }
        channels.retain(|(id, addr), _| cluster.node(*id).is_some_and(|n| &n.addr == addr));
        if parts.is_empty() {
            continue;
        }
        let begun = Instant::now();
        let gci = next - 1;
        next += 1;
        match round(&parts, gci + 1, cluster.gci_complete).await {
            Ok(restorable) => {
                if restorable.len() < parts.len() {
                    let not: Vec<NodeId> = parts.iter().map(|p| p.id).filter(|id| !restorable.contains(id)).collect();
                    tracing::info!(
                        gci,
                        "global checkpoint {gci} is complete, but nodes {not:?} cannot restore it from their files yet"
                    );
                }
                let res = leader.consensus().propose(Command::GciComplete { gci, restorable }).await;
                match res {
                    Ok(_) => {
                        failures = 0;
                        tracing::debug!(gci, ms = begun.elapsed().as_millis() as u64, "global checkpoint complete");
                    }
                    Err(e) => tracing::warn!(gci, "global checkpoint {gci} not recorded: {e}"),
                }
            }
            Err(e) => {
                if failures.is_multiple_of(20) {
                    tracing::warn!(gci, "global checkpoint {gci} abandoned ({} in a row): {e}", failures + 1);
                }
                failures += 1;
                // Hurried rounds run back to back; a failing one must not spin.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

fn connect(addr: &str) -> DataNodeClient<Channel> {
    let ch = shoal_proto::grpc::channel(addr, Duration::from_millis(500))
        .unwrap_or_else(|_| Endpoint::from_static("http://invalid.invalid:1").connect_lazy());
    DataNodeClient::new(ch)
}

/// One checkpoint round; returns the nodes whose files can restore `next - 1`.
async fn round(parts: &[Participant], next: u64, gci_complete: u64) -> Result<Vec<NodeId>, String> {
    let prepared = join_all(parts.iter().map(|p| call(p, pb::GcpPhase::Prepare, next, gci_complete))).await;
    if let Some(e) = first_error(parts, &prepared) {
        join_all(parts.iter().map(|p| call(p, pb::GcpPhase::Abort, next, gci_complete))).await;
        return Err(format!("prepare: {e}"));
    }
    let committed = join_all(parts.iter().map(|p| call(p, pb::GcpPhase::Commit, next, gci_complete))).await;
    if let Some(e) = first_error(parts, &committed) {
        // Nodes that switched stay switched (GCIs only grow); the others release their hold
        // (by ABORT now, or by themselves after a while if unreachable).
        join_all(parts.iter().map(|p| call(p, pb::GcpPhase::Abort, next, gci_complete))).await;
        return Err(format!("commit: {e}"));
    }
    let flushed = join_all(parts.iter().map(|p| call(p, pb::GcpPhase::Flush, next - 1, gci_complete))).await;
    if let Some(e) = first_error(parts, &flushed) {
        return Err(format!("flush: {e}"));
    }
    Ok(parts.iter().zip(flushed).filter(|(_, r)| matches!(r, Ok(true))).map(|(p, _)| p.id).collect())
}

fn first_error(parts: &[Participant], results: &[Result<bool, ShoalError>]) -> Option<String> {
    parts.iter().zip(results).find_map(|(p, r)| r.as_ref().err().map(|e| format!("data node {}: {e}", p.id)))
}

async fn call(p: &Participant, phase: pb::GcpPhase, gci: u64, gci_complete: u64) -> Result<bool, ShoalError> {
    let timeout = if phase == pb::GcpPhase::Flush { FLUSH_TIMEOUT } else { STEP_TIMEOUT };
    let req = pb::GcpRequest { phase: phase as i32, gci, incarnation: p.incarnation, gci_complete };
    let mut client = p.client.clone();
    match tokio::time::timeout(timeout, client.gcp(req)).await {
        Err(_) => Err(ShoalError::new(shoal_proto::ErrorCode::Timeout, "no answer")),
        Ok(Err(status)) => Err(ShoalError::new(shoal_proto::ErrorCode::Internal, status.message().to_string())),
        Ok(Ok(resp)) => {
            let resp = resp.into_inner();
            match resp.error {
                Some(e) => Err(ShoalError::from(e)),
                None => Ok(resp.restorable),
            }
        }
    }
}

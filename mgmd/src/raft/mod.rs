//! Raft for the mgmd: openraft with our own storage ([`log_store`], [`state_machine`], both
//! on [`mod@file`]'s framing) and a gRPC transport ([`network`], [`server`]).
//!
//! [`Consensus`] is what the rest of the daemon holds: the Raft handle plus the few questions
//! everyone asks of it (who leads, propose a command).

pub mod log_store;
pub mod network;
pub mod server;
pub mod state_machine;
pub mod types;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, ServerState, SnapshotPolicy};
use shoal_proto::{ErrorCode, NodeId, ShoalError};

use crate::state::{Command, CommandResult};
pub use state_machine::Published;
pub use types::{node_id, raft_id, MgmdRaft};

/// Leader heartbeat to followers. Failover takes an election timeout, so these are tuned for
/// loopback and LAN: a leader loss is noticed within 300–600 ms.
pub const HEARTBEAT_INTERVAL_MS: u64 = 50;
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 300;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 600;
/// Take a snapshot every this many applied entries, then purge the log behind it.
pub const SNAPSHOT_EVERY_LOGS: u64 = 1000;
/// Entries kept behind a snapshot, so a briefly lagging follower catches up from the log
/// instead of needing the whole snapshot.
pub const LOGS_KEPT_AFTER_SNAPSHOT: u64 = 200;
/// Snapshot chunk size on the wire; as JSON a chunk grows up to ~4x, still far below
/// [`network::MAX_RAFT_MESSAGE_BYTES`].
pub const SNAPSHOT_CHUNK_BYTES: u64 = 256 * 1024;
/// Time to send and install a snapshot chunk.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 2000;
/// Longest a proposal waits to be committed and applied.
pub const PROPOSE_TIMEOUT_MS: u64 = 5000;

pub fn raft_config(cluster_name: &str, snapshot_every_logs: u64) -> anyhow::Result<Config> {
    Config {
        cluster_name: cluster_name.to_string(),
        heartbeat_interval: HEARTBEAT_INTERVAL_MS,
        election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_every_logs),
        max_in_snapshot_log_to_keep: LOGS_KEPT_AFTER_SNAPSHOT.min(snapshot_every_logs),
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        ..Default::default()
    }
    .validate()
    .context("validate raft config")
}

/// Opens the Raft storage in `dir` and starts the Raft node `id`.
pub async fn start(
    id: NodeId,
    cluster_name: &str,
    dir: &Path,
    snapshot_every_logs: u64,
    published: Arc<Published>,
) -> anyhow::Result<MgmdRaft> {
    let log = log_store::LogStore::open(dir).context("open raft log and vote")?;
    let sm = state_machine::StateMachine::open(dir, published).context("open raft snapshot")?;
    let config = Arc::new(raft_config(cluster_name, snapshot_every_logs)?);
    openraft::Raft::new(raft_id(id), config, network::Network::new(raft_id(id)), log, sm).await.context("start raft")
}

/// The local Raft node and what it knows.
#[derive(Clone)]
pub struct Consensus {
    pub raft: MgmdRaft,
    pub id: NodeId,
    /// Every configured mgmd: id → address, for leader hints.
    pub mgmds: Arc<BTreeMap<NodeId, String>>,
    pub published: Arc<Published>,
}

impl Consensus {
    /// The leader as this node currently sees it.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader.map(node_id)
    }

    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(raft_id(self.id))
    }

    /// NOT_LEADER, naming the leader if one is known.
    pub fn not_leader(&self, leader: Option<NodeId>) -> ShoalError {
        let leader = leader.filter(|&l| l != self.id);
        let mut e = ShoalError::new(
            ErrorCode::NotLeader,
            match leader {
                Some(l) => format!("mgmd {} is not the leader; mgmd {l} is", self.id),
                None => format!("mgmd {} is not the leader; no leader is known yet", self.id),
            },
        );
        if let Some(l) = leader {
            e.hint = l;
            e.hint_addr = self.mgmds.get(&l).cloned().unwrap_or_default();
        }
        e
    }

    /// Replicates `cmd` and returns what applying it gave. Only a leader accepts proposals;
    /// elsewhere this is NOT_LEADER with a hint, never a forward.
    pub async fn propose(&self, cmd: Command) -> CommandResult {
        let kind = cmd.kind();
        let res = tokio::time::timeout(Duration::from_millis(PROPOSE_TIMEOUT_MS), self.raft.client_write(cmd)).await;
        match res {
            Err(_) => Err(ShoalError::new(
                ErrorCode::Timeout,
                format!("{kind} was not committed within {PROPOSE_TIMEOUT_MS} ms"),
            )),
            Ok(Ok(resp)) => resp.data,
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                let mut e = self.not_leader(f.leader_id.map(node_id));
                if let Some(n) = f.leader_node {
                    e.hint_addr = n.addr;
                }
                Err(e)
            }
            Ok(Err(e)) => Err(ShoalError::internal(format!("propose {kind}: {e}"))),
        }
    }

    /// The configured mgmds as Raft members.
    pub fn members(&self) -> BTreeMap<u64, BasicNode> {
        self.mgmds.iter().map(|(&id, addr)| (raft_id(id), BasicNode::new(addr))).collect()
    }
}

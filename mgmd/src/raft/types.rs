//! The openraft type configuration of the mgmd: what a log entry carries and how nodes are
//! named. Raft node ids are `u64` (openraft's default); they are our `u32` mgmd ids widened.

use std::io::Cursor;

use openraft::BasicNode;
use shoal_proto::NodeId;

use crate::state::{Command, CommandResult};

openraft::declare_raft_types!(
    /// Type configuration of the mgmd Raft group.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

pub type RaftNodeId = u64;
pub type MgmdRaft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<RaftNodeId>;
pub type Vote = openraft::Vote<RaftNodeId>;
pub type StorageError = openraft::StorageError<RaftNodeId>;
pub type StoredMembership = openraft::StoredMembership<RaftNodeId, BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<RaftNodeId, BasicNode>;
pub type Snapshot = openraft::storage::Snapshot<TypeConfig>;

/// Our mgmd id as a Raft node id.
pub fn raft_id(id: NodeId) -> RaftNodeId {
    u64::from(id)
}

/// A Raft node id back as our mgmd id. Raft ids only ever come from [`raft_id`], so a value
/// that does not fit is a bug; 0 (our "unknown") keeps that bug from turning into a panic.
pub fn node_id(id: RaftNodeId) -> NodeId {
    debug_assert!(id <= u64::from(u32::MAX));
    NodeId::try_from(id).unwrap_or(0)
}

//! The Raft state machine: applies committed [`Command`](crate::state::Command)s to the pure [`Model`], publishes the
//! resulting [`ClusterState`], and keeps the snapshot file.
//!
//! The model itself is not written on every apply: it is rebuilt on restart from the last
//! snapshot plus the committed log entries after it (openraft replays those from the log up to
//! the saved committed id). `raft-snapshot` holds two frames: the JSON [`SnapshotMeta`] (last
//! applied log id and membership) and the snapshot data, the JSON of the [`Model`]. The data
//! bytes are exactly what a leader sends a lagging follower.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, StorageIOError};
use parking_lot::{Mutex, RwLock};
use shoal_proto::config::ClusterConfig;
use shoal_proto::{ClusterState, NodeId, UserAccount};
use tokio::sync::watch;

use super::types::{Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig};
use crate::state::{CommandResult, Model, Outcome};
use shoal_proto::file::{self, FileError};

pub const SNAPSHOT_FILE: &str = "raft-snapshot";

/// What the local mgmd knows of the replicated state, for everyone outside Raft: the applied
/// cluster map (with the leader as this node sees it) and the replicated configuration.
pub struct Published {
    tx: watch::Sender<Arc<ClusterState>>,
    leader: AtomicU32,
    config: RwLock<Option<Arc<ClusterConfig>>>,
    /// The user table and its version, kept out of the map (SQL nodes read it with ListUsers).
    users: RwLock<Arc<(u64, Vec<UserAccount>)>>,
}

impl Published {
    pub fn new() -> Arc<Published> {
        let (tx, _) = watch::channel(Arc::new(ClusterState::default()));
        Arc::new(Published {
            tx,
            leader: AtomicU32::new(0),
            config: RwLock::new(None),
            users: RwLock::new(Arc::new((0, vec![]))),
        })
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.tx.subscribe()
    }

    pub fn current(&self) -> Arc<ClusterState> {
        self.tx.borrow().clone()
    }

    /// The applied user table and its version.
    pub fn users(&self) -> Arc<(u64, Vec<UserAccount>)> {
        self.users.read().clone()
    }

    /// The configuration the cluster was bootstrapped with, once it is.
    pub fn config(&self) -> Option<Arc<ClusterConfig>> {
        self.config.read().clone()
    }

    /// Publishes the model's map if it is new (every change raises the epoch; a completed
    /// global checkpoint advances `gci_complete`), or always with `force` (a snapshot replaced
    /// the model wholesale).
    fn publish(&self, model: &Model, force: bool) {
        if model.config.is_some() != self.config.read().is_some() || force {
            *self.config.write() = model.config.clone().map(Arc::new);
        }
        if force || self.users.read().0 != model.cluster.users_version {
            // Before the map: whoever sees the new users_version finds these users.
            *self.users.write() = Arc::new((model.cluster.users_version, model.users.clone()));
        }
        self.tx.send_if_modified(|cur| {
            if !force
                && cur.epoch == model.cluster.epoch
                && cur.gci_complete == model.cluster.gci_complete
                && cur.users_version == model.cluster.users_version
            {
                return false;
            }
            let mut state = model.cluster.clone();
            state.leader_id = self.leader.load(Ordering::Relaxed);
            *cur = Arc::new(state);
            true
        });
    }

    /// Records the Raft leader as seen locally (0 = unknown) in the published map. Watchers
    /// wake but see the same epoch, so streams to clients stay quiet.
    pub fn set_leader(&self, id: NodeId) {
        self.leader.store(id, Ordering::Relaxed);
        self.tx.send_if_modified(|cur| {
            if cur.leader_id == id {
                return false;
            }
            Arc::make_mut(cur).leader_id = id;
            true
        });
    }
}

#[derive(Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// The current snapshot, shared by the state machine and its builders. The lock is held while
/// the file is written, so an older snapshot can never overwrite a newer one on disk.
type SnapshotSlot = Arc<Mutex<Option<StoredSnapshot>>>;

pub struct StateMachine {
    model: Model,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    snapshot: SnapshotSlot,
    path: PathBuf,
    published: Arc<Published>,
}

fn corrupt(path: &Path, reason: String) -> FileError {
    FileError::Corrupt { path: path.to_path_buf(), offset: 0, reason }
}

impl StateMachine {
    /// Loads the snapshot in `dir`, if any. A damaged snapshot is an error naming the file:
    /// the log behind it may already be purged, so starting without it would lose state.
    pub fn open(dir: &Path, published: Arc<Published>) -> Result<StateMachine, FileError> {
        let path = dir.join(SNAPSHOT_FILE);
        let mut sm = StateMachine {
            model: Model::default(),
            last_applied: None,
            membership: StoredMembership::default(),
            snapshot: Arc::new(Mutex::new(None)),
            path: path.clone(),
            published,
        };
        if let Some(frames) = file::read_whole(&path)? {
            let [meta, data] = frames.as_slice() else {
                return Err(corrupt(&path, format!("expected 2 records, found {}", frames.len())));
            };
            let meta: SnapshotMeta =
                serde_json::from_slice(meta).map_err(|e| corrupt(&path, format!("decode snapshot meta: {e}")))?;
            let model: Model =
                serde_json::from_slice(data).map_err(|e| corrupt(&path, format!("decode snapshot data: {e}")))?;
            tracing::info!(file = %path.display(), meta = %meta, epoch = model.cluster.epoch, "loaded snapshot");
            sm.model = model;
            sm.last_applied = meta.last_log_id;
            sm.membership = meta.last_membership.clone();
            *sm.snapshot.lock() = Some(StoredSnapshot { meta, data: data.clone() });
        }
        sm.published.publish(&sm.model, true);
        Ok(sm)
    }
}

/// Writes `snap` to `path` unless a newer snapshot is already current.
async fn save(slot: SnapshotSlot, path: PathBuf, snap: StoredSnapshot) -> Result<(), StorageError> {
    let sig = snap.meta.signature();
    let res = tokio::task::spawn_blocking(move || -> Result<(), FileError> {
        let mut cur = slot.lock();
        if cur.as_ref().is_some_and(|c| c.meta.last_log_id > snap.meta.last_log_id) {
            return Ok(());
        }
        let meta = serde_json::to_vec(&snap.meta).map_err(|e| corrupt(&path, format!("encode meta: {e}")))?;
        file::write_frames_atomic(&path, &[&meta, &snap.data])?;
        *cur = Some(snap);
        Ok(())
    })
    .await;
    match res {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(StorageIOError::write_snapshot(Some(sig), &e).into()),
        Err(e) => Err(StorageIOError::write_snapshot(Some(sig), &e).into()),
    }
}

pub struct SnapshotBuilder {
    model: Model,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    slot: SnapshotSlot,
    path: PathBuf,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let data = serde_json::to_vec(&self.model).map_err(|e| StorageIOError::write_state_machine(&e))?;
        let millis =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        let snapshot_id = match &self.last_applied {
            Some(l) => format!("{}-{}-{millis}", l.leader_id.term, l.index),
            None => format!("0-0-{millis}"),
        };
        let meta =
            SnapshotMeta { last_log_id: self.last_applied, last_membership: self.membership.clone(), snapshot_id };
        save(self.slot.clone(), self.path.clone(), StoredSnapshot { meta: meta.clone(), data: data.clone() }).await?;
        tracing::info!(meta = %meta, bytes = data.len(), "built snapshot");
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => out.push(Ok(Outcome::default())),
                EntryPayload::Normal(cmd) => {
                    let kind = cmd.kind();
                    let before = self.model.cluster.epoch;
                    let res = self.model.apply(cmd);
                    match &res {
                        Ok(o) if o.epoch != before => {
                            tracing::info!(index = entry.log_id.index, epoch = o.epoch, "applied {kind}")
                        }
                        Ok(_) => {
                            tracing::debug!(index = entry.log_id.index, "applied {kind}: no change")
                        }
                        Err(e) => tracing::info!(index = entry.log_id.index, "applied {kind}: refused: {e}"),
                    }
                    out.push(res);
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    out.push(Ok(Outcome::default()));
                }
            }
        }
        self.published.publish(&self.model, false);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            model: self.model.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            slot: self.snapshot.clone(),
            path: self.path.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let model: Model =
            serde_json::from_slice(&data).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        save(self.snapshot.clone(), self.path.clone(), StoredSnapshot { meta: meta.clone(), data }).await?;
        tracing::info!(meta = %meta, epoch = model.cluster.epoch, "installed snapshot from the leader");
        self.model = model;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.published.publish(&self.model, true);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        // The slot stays locked while a snapshot file is written and fsynced: wait for it in
        // the blocking pool, not on a runtime worker.
        let slot = self.snapshot.clone();
        tokio::task::spawn_blocking(move || {
            slot.lock()
                .as_ref()
                .map(|s| Snapshot { meta: s.meta.clone(), snapshot: Box::new(Cursor::new(s.data.clone())) })
        })
        .await
        .map_err(|e| StorageIOError::read_snapshot(None, &e).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use openraft::{CommittedLeaderId, Membership};
    use shoal_proto::config::{ClusterSection, DataNodeConfig, MgmdConfig};
    use shoal_proto::file::test_dir::TestDir;
    use std::collections::{BTreeMap, BTreeSet};

    fn config() -> ClusterConfig {
        ClusterConfig {
            cluster: ClusterSection { name: "t".into(), ..ClusterSection::new(1, 2) },
            mgmd: vec![MgmdConfig { id: 1, addr: "127.0.0.1:1".into(), data_dir: "m".into() }],
            datanode: vec![DataNodeConfig {
                id: 11,
                addr: "127.0.0.1:2".into(),
                node_group: 0,
                data_dir: "d".into(),
                data_memory_mb: 1,
                threads: 0,
                spin_us: 0,
                await_spin_us: 0,
                poll_idle_cpus: false,
            }],
            sqlnode: vec![],
        }
    }

    fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload }
    }

    #[tokio::test]
    async fn snapshot_survives_reopen_and_damage_is_refused() {
        let dir = TestDir::new("sm");
        let published = Published::new();
        let mut rx = published.subscribe();
        let mut sm = StateMachine::open(dir.path(), published.clone()).unwrap();
        let membership =
            Membership::new(vec![BTreeSet::from([1])], BTreeMap::from([(1, openraft::BasicNode::new("a"))]));
        let out = sm
            .apply([
                entry(1, EntryPayload::Membership(membership)),
                entry(2, EntryPayload::Normal(Command::Bootstrap { config: config() })),
            ])
            .await
            .unwrap();
        assert_eq!(out.len(), 2);
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().epoch, 1);
        assert!(published.config().is_some());
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(2));

        let published = Published::new();
        let mut sm2 = StateMachine::open(dir.path(), published.clone()).unwrap();
        let (applied, m) = sm2.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(2));
        assert_eq!(m.log_id().map(|l| l.index), Some(1));
        assert_eq!(published.current().epoch, 1);
        assert!(sm2.get_current_snapshot().await.unwrap().is_some());

        let path = dir.path().join(SNAPSHOT_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 2] ^= 0x20;
        std::fs::write(&path, &bytes).unwrap();
        let e = StateMachine::open(dir.path(), Published::new()).err().expect("must refuse").to_string();
        assert!(e.contains(SNAPSHOT_FILE) && e.contains("checksum"), "{e}");
    }
}

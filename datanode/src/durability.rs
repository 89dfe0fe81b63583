//! What makes a data node's rows survive a restart: its redo log, its GCI clock, its local
//! checkpoints, and recovery from them at start (DESIGN §4 "Durability" and "Restarts").
//!
//! A node's files can restore GCI g when a complete checkpoint with `end_gci ≤ g` and the redo
//! after it up to the marker of g are on disk, and no replica of the node was refilled by a
//! node-restart copy since that checkpoint began (a copy is not logged; the first checkpoint
//! after it makes the node restorable again). The node says so in its FLUSH answers; mgmd
//! records, per node, the newest GCI its files can restore, and a system restart starts each
//! node group from a node holding the newest one.
//!
//! Disk use stays bounded: a checkpoint runs once `lcp_redo_mb` of redo were written since the
//! last one (or after `lcp_interval_s`), and once a newer checkpoint can restore what mgmd
//! recorded for this node, older checkpoints and the redo before them are deleted. The two
//! newest usable checkpoints are kept, so a damaged one falls back to the one before.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_proto::{ClusterState, PartitionId, ShoalError, TableId};

use crate::checkpoint::{self, LcpMeta};
use crate::gcp::{GciClock, Stamp};
use crate::node::Node;
use crate::partition::Partition;
use crate::redo::{self, Lives, Redo};
use crate::storage::{Image, MemoryBudget};

/// A state on disk the node can restore: everything up to `end_gci` (plus redo), valid while
/// no copy refilled a replica since (`fill_gen` unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Base {
    end_gci: u64,
    fill_gen: u64,
}

pub struct Durability {
    dir: Option<PathBuf>,
    pub redo: Option<Arc<Redo>>,
    pub clock: GciClock,
    /// Raised whenever a replica starts or ends being filled by a copy.
    fill_gen: AtomicU64,
    bases: Mutex<Vec<Base>>,
    next_lcp: AtomicU64,
    lcp_running: AtomicBool,
    lcp_wanted: AtomicBool,
    /// Newest GCI mgmd reported complete (FLUSH messages carry it).
    gci_complete: AtomicU64,
    /// Restart progress for `shoal status` (sent with heartbeats); empty once serving.
    pub progress: Arc<Mutex<String>>,
    /// Replicas restored from disk, waiting for the map that assigns them to this node.
    restored: Mutex<HashMap<(TableId, PartitionId), Arc<Partition>>>,
    lcp_redo_bytes: u64,
    lcp_interval: Duration,
    /// The node is stopping: no new commits.
    closing: AtomicBool,
}

/// What recovery found at start.
pub struct Recovered {
    pub durability: Durability,
    /// The GCI the node's own files restored to, None when they could not (the node then
    /// needs a copy from a live peer).
    pub loaded_gci: Option<u64>,
}

impl Durability {
    /// No files: rows live only in memory (in-process tests). Commits are stamped GCI 1.
    pub fn memory_only() -> Durability {
        Durability::build(None, None, GciClock::new(1), vec![], 0, 64 << 20, Duration::from_secs(300))
    }

    fn build(
        dir: Option<PathBuf>,
        redo: Option<Arc<Redo>>,
        clock: GciClock,
        bases: Vec<Base>,
        next_lcp: u64,
        lcp_redo_bytes: u64,
        lcp_interval: Duration,
    ) -> Durability {
        Durability {
            dir,
            redo,
            clock,
            fill_gen: AtomicU64::new(0),
            bases: Mutex::new(bases),
            next_lcp: AtomicU64::new(next_lcp),
            lcp_running: AtomicBool::new(false),
            lcp_wanted: AtomicBool::new(false),
            gci_complete: AtomicU64::new(0),
            progress: Arc::default(),
            restored: Mutex::new(HashMap::new()),
            lcp_redo_bytes,
            lcp_interval,
            closing: AtomicBool::new(false),
        }
    }

    /// Refuses every later commit (the node is stopping).
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Restores the node's rows from `dir` up to `target` (the GCI mgmd recorded for this
    /// node) and opens a new life of the redo log.
    /// `progress` receives what the restore is doing, for the node's heartbeats.
    pub fn recover(
        dir: &Path,
        target: u64,
        map: &ClusterState,
        budget: &Arc<MemoryBudget>,
        lcp: (u64, Duration),
        progress: Arc<Mutex<String>>,
    ) -> anyhow::Result<Recovered> {
        let (lcp_redo_mb, lcp_interval) = lcp;
        std::fs::create_dir_all(dir)?;
        let begun = Instant::now();
        let (parts, loaded_gci, bases) = match restore(dir, target, map, budget, &progress) {
            Ok(parts) => {
                let rows: u64 = parts.values().map(|p| p.store.lock().rows()).sum();
                tracing::info!(
                    target,
                    rows,
                    partitions = parts.len(),
                    ms = begun.elapsed().as_millis() as u64,
                    "restored own files up to global checkpoint {target}"
                );
                (parts, Some(target), vec![Base { end_gci: target, fill_gen: 0 }])
            }
            Err(e) => {
                tracing::error!(
                    "cannot restore global checkpoint {target} from {}: {e}. This node will start only by copying from a live replica of its node group",
                    dir.display()
                );
                (HashMap::new(), None, vec![])
            }
        };
        let next_lcp = checkpoint::list(dir)?.last().map_or(1, |l| l.id + 1);
        let redo = Redo::open(&dir.join("redo"), redo::DEFAULT_PARTS, target)?;
        let d = Durability::build(
            Some(dir.to_path_buf()),
            Some(redo),
            GciClock::new(0),
            bases,
            next_lcp,
            lcp_redo_mb.max(1) << 20,
            lcp_interval,
        );
        *d.restored.lock() = parts;
        progress.lock().clear();
        Ok(Recovered { durability: Durability { progress, ..d }, loaded_gci })
    }

    /// Checks the redo log can take a commit, waits for room in its buffer, and stamps the
    /// commit with the current GCI. The commit is in flight until the stamp is dropped.
    pub async fn begin_commit(&self, partition: PartitionId) -> Result<Stamp<'_>, ShoalError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ShoalError::new(shoal_proto::ErrorCode::NodeNotReady, "the node is stopping"));
        }
        if let Some(r) = &self.redo {
            r.check_writable(partition)?;
            r.wait_for_room(partition).await;
        }
        self.clock.stamp().await
    }

    /// Logs a row change; call under the partition's store lock, right where it is applied.
    pub fn log(&self, gci: u64, table: TableId, partition: PartitionId, img: &Image) {
        if let Some(r) = &self.redo {
            r.append(gci, table, partition, img);
        }
    }

    /// FLUSH of global checkpoint `gci`: whether the node's files can now restore it.
    pub async fn flush(&self, gci: u64, gci_complete: u64, filling: bool) -> Result<bool, ShoalError> {
        self.gci_complete.fetch_max(gci_complete, Ordering::AcqRel);
        let Some(r) = &self.redo else { return Ok(false) };
        r.flush_checkpoint(gci).await?;
        let gen = self.fill_gen.load(Ordering::Acquire);
        Ok(!filling && self.bases.lock().iter().any(|b| b.fill_gen == gen && b.end_gci <= gci))
    }

    pub fn gci_complete(&self) -> u64 {
        self.gci_complete.load(Ordering::Acquire)
    }

    /// A replica started or finished being filled by a copy: the files no longer describe the
    /// node until the next checkpoint, which is wanted as soon as the copy ends.
    pub fn fill_changed(&self, ended: bool) {
        self.fill_gen.fetch_add(1, Ordering::AcqRel);
        if ended {
            self.lcp_wanted.store(true, Ordering::Release);
        }
    }

    /// A replica restored from disk for (table, partition), handed over once.
    pub fn take_restored(&self, table: TableId, partition: PartitionId) -> Option<Arc<Partition>> {
        self.restored.lock().remove(&(table, partition))
    }

    pub fn forget_restored(&self) {
        self.restored.lock().clear();
    }

    fn lcp_due(&self, last: Instant) -> bool {
        let Some(r) = &self.redo else { return false };
        let written = r.bytes_since_rotation();
        self.lcp_wanted.load(Ordering::Acquire)
            || written >= self.lcp_redo_bytes
            || (written > 0 && last.elapsed() >= self.lcp_interval)
    }
}

/// Runs local checkpoints when due and deletes what newer ones made unnecessary.
pub async fn lcp_loop(node: Arc<Node>) {
    let mut last = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !node.durability.lcp_due(last) {
            continue;
        }
        last = Instant::now();
        match run_lcp(&node).await {
            Ok(Some(meta)) => tracing::info!(
                id = meta.id,
                rows = meta.files.iter().map(|f| f.rows).sum::<u64>(),
                end_gci = meta.end_gci,
                complete = meta.complete,
                ms = last.elapsed().as_millis() as u64,
                "local checkpoint written"
            ),
            Ok(None) => {}
            Err(e) => tracing::error!("local checkpoint failed: {e}"),
        }
        if let Err(e) = cleanup(&node).await {
            tracing::warn!("checkpoint clean-up failed: {e}");
        }
    }
}

/// Writes a local checkpoint of every replica this node holds.
pub async fn run_lcp(node: &Arc<Node>) -> Result<Option<LcpMeta>, String> {
    let d = &node.durability;
    let (Some(dir), Some(redo)) = (d.dir.clone(), d.redo.clone()) else { return Ok(None) };
    if d.lcp_running.swap(true, Ordering::AcqRel) {
        return Ok(None);
    }
    d.lcp_wanted.store(false, Ordering::Release);
    let id = d.next_lcp.fetch_add(1, Ordering::AcqRel);
    let fill_gen = d.fill_gen.load(Ordering::Acquire);
    let complete_at_start = !node.any_filling();
    let n = node.clone();
    let res = tokio::task::spawn_blocking(move || -> Result<LcpMeta, String> {
        checkpoint::begin(&dir, id).map_err(|e| e.to_string())?;
        // Rotate first: every change applied before a partition is scanned is either in the
        // scan or in the redo from `start_seg` on.
        let start_seg = redo.rotate();
        let mut files = vec![];
        for part in n.partitions() {
            files.push(checkpoint::write_partition(&dir, id, &part).map_err(|e| e.to_string())?);
        }
        // A backup applies images its primary stamped, which may be one GCI ahead of ours.
        let end_gci = n.durability.clock.current() + 1;
        let complete =
            complete_at_start && !n.any_filling() && n.durability.fill_gen.load(Ordering::Acquire) == fill_gen;
        let meta = LcpMeta { id, start_seg, end_gci, complete, files };
        checkpoint::finish(&dir, &meta).map_err(|e| e.to_string())?;
        Ok(meta)
    })
    .await
    .map_err(|e| format!("checkpoint task failed: {e}"));
    d.lcp_running.store(false, Ordering::Release);
    let meta = res??;
    if meta.complete {
        let mut bases = d.bases.lock();
        bases.push(Base { end_gci: meta.end_gci, fill_gen });
        let excess = bases.len().saturating_sub(3);
        bases.drain(..excess);
    }
    Ok(Some(meta))
}

/// Deletes checkpoints and redo that the newest usable checkpoints make unnecessary. "Usable"
/// is judged against the GCI mgmd recorded for this node, the one a restart would restore.
pub async fn cleanup(node: &Arc<Node>) -> Result<(), String> {
    let d = &node.durability;
    let (Some(dir), Some(redo)) = (d.dir.clone(), d.redo.clone()) else { return Ok(()) };
    let map = node.map();
    let restorable = map.node(node.id).map_or(0, |n| n.restorable_gci).min(d.gci_complete());
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        let lcps = checkpoint::list(&dir).map_err(|e| e.to_string())?;
        let usable: Vec<&LcpMeta> = lcps
            .iter()
            .filter_map(|l| l.meta.as_ref()?.as_ref().ok())
            .filter(|m| m.complete && m.end_gci <= restorable)
            .collect();
        // The two newest usable ones stay: a damaged newest falls back to the one before.
        let Some(oldest_kept) = usable.get(usable.len().saturating_sub(2)).copied() else { return Ok(()) };
        for l in lcps.iter().filter(|l| l.id < oldest_kept.id) {
            checkpoint::remove(&dir, l.id).map_err(|e| e.to_string())?;
        }
        redo.delete_before(oldest_kept.start_seg).map_err(|e| e.to_string())?;
        Ok(())
    })
    .await
    .map_err(|e| format!("clean-up task failed: {e}"))?
}

/// Restores every replica from the newest usable checkpoint plus redo, falling back to an
/// older checkpoint when one is damaged. Tables no longer in the catalog are skipped.
fn restore(
    dir: &Path,
    target: u64,
    map: &ClusterState,
    budget: &Arc<MemoryBudget>,
    progress: &Mutex<String>,
) -> Result<HashMap<(TableId, PartitionId), Arc<Partition>>, String> {
    if target == 0 {
        return Ok(HashMap::new()); // no checkpoint of this node ever completed
    }
    let redo_dir = dir.join("redo");
    let lives = Lives::load(&redo_dir).map_err(|e| e.to_string())?;
    let lcps = checkpoint::list(dir).map_err(|e| e.to_string())?;
    let mut candidates: Vec<LcpMeta> = vec![];
    for l in lcps.iter().rev() {
        match &l.meta {
            Some(Ok(m)) if m.complete && m.end_gci <= target => candidates.push(m.clone()),
            Some(Err(e)) => tracing::error!("checkpoint {} is unusable: {e}", l.id),
            _ => {}
        }
    }
    let mut last_error = String::new();
    for meta in &candidates {
        match restore_from(dir, Some(meta), target, &lives, map, budget, progress) {
            Ok(parts) => return Ok(parts),
            Err(e) => {
                tracing::error!("cannot restore from checkpoint {}: {e}; trying an older one", meta.id);
                last_error = e;
            }
        }
    }
    // Without a usable checkpoint, the redo alone serves only if none of it was ever deleted.
    if redo::deleted_any(&redo_dir) {
        return Err(if candidates.is_empty() {
            format!("no usable local checkpoint for global checkpoint {target}")
        } else {
            last_error
        });
    }
    restore_from(dir, None, target, &lives, map, budget, progress)
}

fn restore_from(
    dir: &Path,
    meta: Option<&LcpMeta>,
    target: u64,
    lives: &Lives,
    map: &ClusterState,
    budget: &Arc<MemoryBudget>,
    progress: &Mutex<String>,
) -> Result<HashMap<(TableId, PartitionId), Arc<Partition>>, String> {
    let mut parts: HashMap<(TableId, PartitionId), Arc<Partition>> = HashMap::new();
    let valid =
        |table: TableId, partition: PartitionId| map.table_by_id(table).is_some_and(|t| partition < t.partition_count);
    let part_of = |parts: &mut HashMap<(TableId, PartitionId), Arc<Partition>>, t: TableId, p: PartitionId| {
        parts.entry((t, p)).or_insert_with(|| Arc::new(Partition::new(t, p, budget.clone()))).clone()
    };
    let report = |what: String| {
        tracing::info!("restore: {what}");
        *progress.lock() = format!("restore: {what}");
    };
    if let Some(meta) = meta {
        let total: u64 = meta.files.iter().map(|f| f.rows).sum();
        let mut loaded = 0u64;
        let mut bytes = 0u64;
        let mut last_report = Instant::now();
        for f in meta.files.iter().filter(|f| valid(f.table, f.partition)) {
            let rows = checkpoint::read_partition(dir, meta, f).map_err(|e| e.to_string())?;
            let part = part_of(&mut parts, f.table, f.partition);
            part.saw_seq(rows.seq);
            let mut store = part.store.lock();
            for img in rows.rows {
                store.apply(img);
            }
            drop(store);
            loaded += f.rows;
            bytes += f.bytes;
            if last_report.elapsed() >= Duration::from_secs(1) {
                last_report = Instant::now();
                report(format!(
                    "checkpoint {}: {loaded} of {total} rows ({} MB, {}%)",
                    meta.id,
                    bytes >> 20,
                    loaded * 100 / total.max(1)
                ));
            }
        }
        report(format!("checkpoint {}: {loaded} rows ({} MB) loaded", meta.id, bytes >> 20));
    }
    let from_seg = meta.map_or(0, |m| m.start_seg);
    let redo_dir = dir.join("redo");
    let parts_on_disk = (0..64).take_while(|p| redo_dir.join(format!("part{p}")).exists()).count();
    let mut applied = 0;
    for p in 0..parts_on_disk {
        let stats = redo::replay_part(&redo_dir, p, from_seg, target, lives, |table, partition, img| {
            if valid(table, partition) {
                let part = part_of(&mut parts, table, partition);
                part.saw_seq(img.seq);
                part.store.lock().apply(img);
            }
        })?;
        applied += stats.applied;
    }
    report(format!("redo: {applied} changes replayed up to global checkpoint {target}"));
    Ok(parts)
}

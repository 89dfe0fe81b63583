//! Transactions (DESIGN §3.2, §3.4, §4 "Transactions"): both roles a data node plays.
//!
//! **Participant** (the primary of a partition a transaction touches): `execute` runs the
//! transaction's operations under row locks owned by the transaction (shared for
//! `LOCK IN SHARE MODE` reads, exclusive for `FOR UPDATE` reads and every write). Writes are
//! kept as pending images, invisible to everyone else (READ COMMITTED: plain reads see the
//! committed image and take no lock); the transaction reads its own writes.
//!
//! **Coordinator** (TC, any data node; the client picks one per transaction): `commit_as_tc`
//! runs two-phase commit over the participants:
//! 1. PREPARE: each participant primary replicates the pending images of its partitions to
//!    their backups, which keep them aside (not visible). A participant whose primary changed
//!    since the operations ran has lost them: the transaction aborts.
//! 2. Decision: the TC stamps the commit with the current GCI (so the whole transaction lands
//!    in one global checkpoint: all or nothing after a system restart) and records the
//!    decision on the other live nodes of its own node group.
//! 3. COMMIT: each participant primary sends the images, now with sequence numbers and the
//!    GCI, to its backups (which apply and log them), applies and logs them itself, and frees
//!    the locks. The TC retries against the partition's current primary until it succeeds: a
//!    backup promoted after PREPARE holds the kept images and finishes from them.
//!
//! A transaction touching one partition skips PREPARE and the decision record: its single
//! participant commits exactly like an autocommit write (one round trip to the backups).
//!
//! **Failures.** A participant holding a prepared transaction whose TC died asks the TC's
//! node-group peers what was decided: the recorded decision is carried out; without a record
//! the peer notes the transaction aborted (so a late record from the dying TC is refused) and
//! it aborts. A transaction that is not prepared and idle longer than
//! `transaction_inactive_timeout_ms` (its client vanished) is aborted and its locks freed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_proto::pb;
use shoal_proto::{ErrorCode, NodeId, NodeState, PartitionId, ShoalError, TableId};

use crate::gcp::Stamp;
use crate::node::Node;
use crate::ops::{self, Answer, Op, OpKind};
use crate::partition::{LockMode, Partition};
use crate::replication;
use crate::storage::{Image, RowSlot};
use crate::transport::{TxnStep, TxnTag};

/// A prepared transaction waits this long for its TC before asking around.
const PREPARED_PATIENCE: Duration = Duration::from_secs(2);
/// Limits from the cluster config (`max_txn_operations`, `max_locks_per_node`).
#[derive(Clone, Copy, Debug)]
pub struct TxnLimits {
    /// Most pending writes of one transaction on one node.
    pub max_writes: usize,
    /// Most row locks transactions may hold on one node.
    pub max_locks: usize,
}

impl Default for TxnLimits {
    fn default() -> Self {
        TxnLimits { max_writes: 10_000, max_locks: 200_000 }
    }
}
/// How long the TC keeps trying to carry out a decision before giving up the call (the
/// participants still finish it: they ask the TC's peers).
const DECISION_RETRY_FOR: Duration = Duration::from_secs(10);
/// How long the TC goes on in the background after that before it gives up confirming.
const DECISION_KEEP_TRYING: Duration = Duration::from_secs(120);
/// Aborted-outcome notes kept this long (a dying TC's late record must be refused).
const ABORTED_NOTE_TTL: Duration = Duration::from_secs(120);

struct Pending {
    data: Option<Vec<u8>>,
    /// Memory reserved for the new image.
    reserved: u64,
    /// For an image taken over from a deposed primary: the sequence number the row had when
    /// the transaction prepared (0: absent). A row that moved on since then already carries
    /// this transaction's commit (the kept copy outlived it), so the image must not be applied
    /// again over newer data.
    base: Option<u64>,
    /// The savepoint it was written under (0: none).
    savepoint: u64,
}

/// What undoes a write made under a savepoint: the key's pending image before it (None: the
/// key had none, the committed row shows again).
struct Undo {
    savepoint: u64,
    key: Vec<u8>,
    before: Option<Pending>,
}

struct PartTxn {
    part: Arc<Partition>,
    /// The primary term the operations ran under: if it changed, they are gone.
    term: u64,
    locked: Vec<Box<[u8]>>,
    writes: BTreeMap<Vec<u8>, Pending>,
    /// The epoch of the PREPARE that holds this part's writes in the partition's count of
    /// prepared transactions (released when the transaction ends).
    held_at: Option<u64>,
    /// Taken over from a deposed primary's kept images (`adopt_prepared`): its fate is logged.
    taken_over: bool,
    /// One entry per key and savepoint, the first write of the key under that savepoint, in
    /// the order written (savepoints only grow): rolling back to savepoint S undoes the
    /// entries from S on, newest first.
    undo: Vec<Undo>,
}

struct TxnState {
    tc: NodeId,
    last_active: Instant,
    prepared: bool,
    parts: HashMap<(TableId, PartitionId), PartTxn>,
    /// Set, under the lock, by whoever ends the transaction here (commit, abort, an execute
    /// that left nothing), before it takes the state out of `active`. Anyone who locks the
    /// state afterwards must not add to it: work added to an ended state would be held by
    /// nobody (its locks never freed, its writes never committed, while a COMMIT finding no
    /// state answers "already done").
    ended: bool,
}

impl TxnState {
    fn new(tc: NodeId, prepared: bool) -> TxnState {
        TxnState { tc, last_active: Instant::now(), prepared, parts: HashMap::new(), ended: false }
    }
}

type SharedState = Arc<tokio::sync::Mutex<TxnState>>;
type LockedState = tokio::sync::OwnedMutexGuard<TxnState>;

/// What a TC (or its peer) recorded about a transaction.
#[derive(Clone, Debug)]
enum Decision {
    /// At the TC, while it records its commit decision at its group's peers: not told to
    /// anyone yet (an OUTCOME question gets "ask again"), so a peer's veto can still abort.
    Deciding,
    Commit {
        gci: u64,
    },
    Aborted {
        at: Instant,
    },
}

/// Images a backup keeps for a prepared transaction whose primary is another node.
struct Kept {
    tc: NodeId,
    images: Vec<Image>,
}

pub struct Txns {
    limits: TxnLimits,
    active: Mutex<HashMap<u64, SharedState>>,
    /// Transactions this node aborted on its own (idle too long): their later operations must
    /// fail rather than start afresh without the locks they held. Kept for `ABORTED_NOTE_TTL`.
    swept: Mutex<HashMap<u64, Instant>>,
    kept: Mutex<HashMap<(u64, TableId, PartitionId), Kept>>,
    decisions: Mutex<HashMap<u64, Decision>>,
    /// Commits this node coordinated that every participant confirmed: their records at the
    /// group peers can go (sent along with the next RECORD, or by `flush_forgets`).
    forgets: Mutex<Vec<u64>>,
    forget_flush_due: std::sync::atomic::AtomicBool,
    locks: AtomicUsize,
}

fn aborted(why: impl Into<String>) -> ShoalError {
    ShoalError::new(ErrorCode::TxnAborted, why.into())
}

impl Txns {
    pub fn new(limits: TxnLimits) -> Txns {
        Txns {
            limits,
            active: Default::default(),
            swept: Default::default(),
            kept: Default::default(),
            decisions: Default::default(),
            forgets: Default::default(),
            forget_flush_due: Default::default(),
            locks: Default::default(),
        }
    }

    pub fn keep_prepared(&self, txn: u64, tc: NodeId, table: TableId, partition: PartitionId, images: Vec<Image>) {
        self.kept.lock().insert((txn, table, partition), Kept { tc, images });
    }

    pub fn drop_prepared(&self, txn: u64, table: TableId, partition: PartitionId) {
        self.kept.lock().remove(&(txn, table, partition));
    }

    /// The open state of `txn`, locked; None when there is none (or it just ended).
    async fn locked(&self, txn: u64) -> Option<(SharedState, LockedState)> {
        let state = self.active.lock().get(&txn).cloned()?;
        let st = state.clone().lock_owned().await;
        (!st.ended).then_some((state, st))
    }

    /// The open state of `txn`, locked, made by `fresh` when there is none. A state found
    /// ended is being taken out by its ender: it is taken out here and a fresh one made.
    async fn open(&self, txn: u64, fresh: impl Fn() -> TxnState) -> (SharedState, LockedState) {
        loop {
            let state =
                self.active.lock().entry(txn).or_insert_with(|| Arc::new(tokio::sync::Mutex::new(fresh()))).clone();
            let st = state.clone().lock_owned().await;
            if !st.ended {
                return (state, st);
            }
            drop(st);
            // The next round finds no entry (or a fresh one): at most two rounds per race.
            self.forget(txn, &state);
        }
    }

    /// Takes `state` out of `active`, unless another state replaced it there.
    fn forget(&self, txn: u64, state: &SharedState) {
        let mut active = self.active.lock();
        if active.get(&txn).is_some_and(|s| Arc::ptr_eq(s, state)) {
            active.remove(&txn);
        }
    }
}

/// Ends the transaction here: nobody adds to this state any more, and it leaves `active`.
fn end(node: &Node, txn: u64, state: &SharedState, st: &mut TxnState) {
    st.ended = true;
    node.txns.forget(txn, state);
}

/// The savepoints of a request (see `TxnExecuteRequest` in the proto): its ops run under
/// `at` (0: none); nothing below `keep_from` will be rolled back to; `rollback_to` > 0 first
/// undoes the writes made here under savepoints from it on.
#[derive(Clone, Copy, Debug, Default)]
pub struct Savepoints {
    pub at: u64,
    pub keep_from: u64,
    pub rollback_to: u64,
}

/// One operation of a transaction, with the lock a read takes.
pub struct TxnOp {
    pub op: Op,
    pub lock: Option<LockMode>,
    /// The primary term under which the transaction already holds work in this partition
    /// (0: none yet).
    pub held_term: u64,
}

/// Runs operations of transaction `txn` here, as primary of their partitions.
/// Returns each op's result and, when the transaction holds anything in its partition here,
/// the primary term of that work.
pub async fn execute(
    node: &Arc<Node>,
    txn: u64,
    tc: NodeId,
    ops: Vec<TxnOp>,
    savepoints: Savepoints,
) -> Vec<(Result<Answer, ShoalError>, Option<u64>)> {
    if node.txns.swept.lock().contains_key(&txn) {
        let e = aborted(format!("transaction {txn:x} was idle too long and rolled back on node {}", node.id));
        return ops.iter().map(|_| (Err(e.clone()), None)).collect();
    }
    let (state, mut st) = node.txns.open(txn, || TxnState::new(tc, false)).await;
    if !st.prepared {
        if savepoints.rollback_to > 0 {
            rollback_to_savepoint(node, &mut st, savepoints.rollback_to);
        }
        forget_undo_below(node, &mut st, savepoints.keep_from);
    }
    let mut out = Vec::with_capacity(ops.len());
    // After a lock wait timeout the rest of the request is not tried: the caller must give up
    // or retry anyway, and a request that waited once per op could outlast the inactivity
    // timeout of the transaction's work on other nodes.
    let mut timed_out: Option<ShoalError> = None;
    for op in ops {
        let slot = (op.op.table, op.op.partition);
        let r = if st.prepared {
            Err(aborted("the transaction is already committing"))
        } else if let Some(e) = &timed_out {
            Err(e.clone())
        } else {
            execute_one(node, txn, &mut st, op, savepoints.at).await
        };
        if let Err(e) = &r {
            if e.code == ErrorCode::LockWaitTimeout {
                timed_out = Some(e.clone());
            }
        }
        out.push((r, st.parts.get(&slot).map(|p| p.term)));
    }
    st.last_active = Instant::now();
    // A transaction that touched nothing here leaves no state behind.
    if st.parts.is_empty() {
        end(node, txn, &state, &mut st);
    }
    out
}

async fn execute_one(
    node: &Arc<Node>,
    txn: u64,
    st: &mut TxnState,
    TxnOp { mut op, lock, held_term }: TxnOp,
    savepoint: u64,
) -> Result<Answer, ShoalError> {
    let map = node.map();
    let table = ops::table_of(&map, op.table)?;
    let (pa, part) = ops::active_primary(node, &map, op.table, op.partition)?;
    let (key, key_values) = ops::check_write(table, &mut op)?;
    ops::check_routing(table, &key_values, op.partition)?;
    let slot = (op.table, op.partition);
    if let Some(p) = st.parts.get(&slot) {
        if p.term != pa.primary_term {
            return Err(aborted("the partition's primary changed during the transaction"));
        }
    }
    // Work the client says it left here must still be here (a restart or a move loses it).
    if held_term != 0 && st.parts.get(&slot).map(|p| p.term) != Some(held_term) {
        return Err(aborted(format!(
            "node {} no longer holds the transaction's work on partition {} (restarted or moved)",
            node.id, op.partition
        )));
    }
    let mode = match op.kind {
        OpKind::Read => lock,
        _ => Some(LockMode::Exclusive),
    };
    let pt = st.parts.entry(slot).or_insert_with(|| PartTxn {
        part: part.clone(),
        term: pa.primary_term,
        locked: vec![],
        writes: BTreeMap::new(),
        held_at: None,
        taken_over: false,
        undo: vec![],
    });
    if let Some(mode) = mode {
        let max = node.txns.limits.max_locks;
        if node.txns.locks.load(Ordering::Relaxed) >= max {
            return Err(ShoalError::new(
                ErrorCode::TooManyLocks,
                format!("node {} holds {max} transaction locks, its limit (max_locks_per_node)", node.id),
            ));
        }
        if part.lock_for(&key, txn, mode, node.timing.lock_wait).await? {
            pt.locked.push(key.clone().into_boxed_slice());
            node.txns.locks.fetch_add(1, Ordering::Relaxed);
        }
    }
    let current = match pt.writes.get(&key) {
        Some(p) => p.data.clone(),
        None => part.store.lock().get(&key).map(|s| s.data().to_vec()),
    };
    if op.kind == OpKind::Read {
        return Ok(Answer::Row(current));
    }
    let max = node.txns.limits.max_writes;
    if (!pt.writes.contains_key(&key) && pt.writes.len() >= max) || pt.undo.len() >= max {
        return Err(ShoalError::new(
            ErrorCode::TooManyLocks,
            format!(
                "a transaction writes at most {max} rows per node, and keeps at most {max} \
                 earlier images for its savepoints (max_txn_operations)"
            ),
        ));
    }
    let is_update = op.kind == OpKind::Update;
    let data = ops::new_image(table, op, current.as_deref())?;
    if is_update && data == current {
        // The row keeps its exclusive lock to the end; there is nothing to write.
        return Ok(Answer::Unchanged);
    }
    let reserved = data.as_ref().map_or(0, |d| RowSlot::charge(key.len(), d.len()));
    if reserved > 0 && !node.budget.try_reserve(reserved) {
        return Err(ShoalError::new(
            ErrorCode::TableFull,
            format!("table {} is full: node {} reached its data memory limit", table.name(), node.id),
        ));
    }
    let pending = Pending { data, reserved, base: None, savepoint };
    if savepoint == 0 {
        if let Some(old) = pt.writes.insert(key, pending) {
            node.budget.release(old.reserved);
        }
        return Ok(Answer::Row(None));
    }
    // The first write of the key under this savepoint keeps what undoes it; a later one
    // under the same savepoint replaces an image that entry already covers.
    match pt.writes.insert(key.clone(), pending) {
        Some(old) if old.savepoint == savepoint => node.budget.release(old.reserved),
        before => pt.undo.push(Undo { savepoint, key, before }),
    }
    Ok(Answer::Row(None))
}

/// Undoes every write made here under a savepoint `to` or later, newest first: each key
/// gets back its pending image from before (none: the committed row shows again). The locks
/// stay, as InnoDB's do after a statement or savepoint rollback.
fn rollback_to_savepoint(node: &Node, st: &mut TxnState, to: u64) {
    for pt in st.parts.values_mut() {
        for u in take_undo(pt, |u| u.savepoint >= to).into_iter().rev() {
            let now = match u.before {
                Some(before) => pt.writes.insert(u.key, before),
                None => pt.writes.remove(&u.key),
            };
            if let Some(now) = now {
                node.budget.release(now.reserved);
            }
        }
    }
}

/// Takes the undo entries `which` picks out of `pt`, in their order; the rest stay.
fn take_undo(pt: &mut PartTxn, which: impl Fn(&Undo) -> bool) -> Vec<Undo> {
    let (taken, kept) = std::mem::take(&mut pt.undo).into_iter().partition(which);
    pt.undo = kept;
    taken
}

/// Drops what undoes writes under savepoints below `from`: nobody will roll back to them.
fn forget_undo_below(node: &Node, st: &mut TxnState, from: u64) {
    for pt in st.parts.values_mut() {
        if pt.undo.first().is_none_or(|u| u.savepoint >= from) {
            continue;
        }
        for before in take_undo(pt, |u| u.savepoint < from).into_iter().filter_map(|u| u.before) {
            node.budget.release(before.reserved);
        }
    }
}

/// Frees everything a transaction holds here: locks, reserved memory.
fn release(node: &Node, txn: u64, st: &mut TxnState) {
    for pt in st.parts.values_mut() {
        if let Some(epoch) = pt.held_at.take() {
            pt.part.release_prepared(epoch);
        }
        for key in pt.locked.drain(..) {
            pt.part.unlock_for(&key, txn);
            node.txns.locks.fetch_sub(1, Ordering::Relaxed);
        }
        for (_, p) in std::mem::take(&mut pt.writes) {
            node.budget.release(p.reserved);
        }
        for before in std::mem::take(&mut pt.undo).into_iter().filter_map(|u| u.before) {
            node.budget.release(before.reserved);
        }
    }
}

/// PREPARE at a participant: the backups of every written partition keep the images. With
/// `images_stay_here` (the TC's own part whose decision rides on its COMMIT images, see
/// `commit_as_tc`) they are not sent: only a backup holding the decision could finish this
/// part, and that one gets them with it.
pub async fn prepare(
    node: &Arc<Node>,
    txn: u64,
    parts: &[(TableId, PartitionId)],
    images_stay_here: bool,
) -> Result<(), ShoalError> {
    let (_, mut st) = node
        .txns
        .locked(txn)
        .await
        .ok_or_else(|| aborted(format!("transaction {txn:x} is not open on node {}", node.id)))?;
    for slot in parts {
        if !st.parts.contains_key(slot) {
            return Err(aborted(format!("node {} lost the transaction's work on partition {}", node.id, slot.1)));
        }
    }
    let map = node.map();
    let tc = st.tc;
    let parts: Vec<Arc<Partition>> = st.parts.values().map(|pt| pt.part.clone()).collect();
    // Counted as writes in flight: a copy to a joining replica waits for them, and then sees
    // the transaction prepared and sends it the images (`push_prepared`).
    let _inflight: Vec<_> = parts.iter().map(|p| p.enter_write(map.epoch)).collect();
    // Every part, read-only ones too, must still be held here under the term its operations
    // ran in: the locks of a deposed (or re-promoted) primary guard nothing any more, and a
    // locked read whose lock was lost before this point may be stale. Checked before any
    // image is replicated, so that all locks were held at one moment: the moment the
    // transaction's reads are valid for.
    for (&(table, partition), pt) in &st.parts {
        let pa = map.partition(partition).ok_or_else(|| ShoalError::internal("partition vanished"))?;
        if pa.primary != Some(node.id) || pa.primary_term != pt.term {
            return Err(aborted(format!(
                "the primary of partition {partition} changed during the transaction (its locks are gone)"
            )));
        }
        if !pt.writes.is_empty() && map.table_by_id(table).is_none_or(|t| t.read_only) {
            return Err(aborted("the table is being altered (or was dropped) since the transaction wrote to it"));
        }
    }
    // Every part's images at once: the sends to one backup leave in one message (its
    // batcher merges calls made in the same turn), one round trip however many parts.
    let mut sends = vec![];
    for (&(table, partition), pt) in &st.parts {
        if pt.writes.is_empty() || images_stay_here {
            continue;
        }
        let pa = map.partition(partition).ok_or_else(|| ShoalError::internal("partition vanished"))?;
        let tag = TxnTag { id: txn, tc, step: TxnStep::Prepare };
        sends.push(replication::replicate_txn(node, &map, table, pa, 0, prepared_images(pt), Some(tag)));
    }
    for sent in futures::future::join_all(sends).await {
        sent?;
    }
    // Until it commits or aborts, a scan under a newer map waits for it (an ALTER TABLE copy
    // must not miss its rows).
    for pt in st.parts.values_mut().filter(|pt| !pt.writes.is_empty()) {
        pt.part.hold_prepared(map.epoch);
        pt.held_at = Some(map.epoch);
    }
    st.prepared = true;
    st.last_active = Instant::now();
    tracing::debug!(txn = format!("{txn:x}"), parts = ?st.parts.keys().collect::<Vec<_>>(), "prepared");
    Ok(())
}

/// COMMIT at a participant: replicate and apply the images with `gci`, free the locks. A
/// transaction no longer open here was committed before (the TC retries) — unless
/// `one_phase`, where it means the work was lost.
pub async fn commit(
    node: &Arc<Node>,
    txn: u64,
    gci: u64,
    parts: &[(TableId, PartitionId)],
    one_phase: bool,
) -> Result<(), ShoalError> {
    commit_parts(node, txn, gci, parts, one_phase, false).await.map(|_| ())
}

/// COMMIT as [`commit`] does it; with `record` (the TC committing its own part) the commit
/// decision rides on the images sent to the backups (`TxnStep::Record`). Ok(true) when
/// images went out, so the backups hold the record; Ok(false) when this node wrote nothing.
async fn commit_parts(
    node: &Arc<Node>,
    txn: u64,
    gci: u64,
    parts: &[(TableId, PartitionId)],
    one_phase: bool,
    record: bool,
) -> Result<bool, ShoalError> {
    // Every named partition must be finished here: either by the work this node holds for it,
    // or because it already was (a retry). A promoted backup that has not taken the
    // transaction over yet, or a node that is not the partition's active primary, makes the
    // TC try again (elsewhere).
    let state = node.txns.locked(txn).await;
    if state.is_none() && one_phase {
        return Err(aborted(format!("transaction {txn:x} is not open on node {}", node.id)));
    }
    {
        let held: Vec<(TableId, PartitionId)> = match &state {
            Some((_, st)) => st.parts.keys().copied().collect(),
            None => vec![],
        };
        let map = node.map();
        for &(t, p) in parts.iter().filter(|slot| !held.contains(slot)) {
            if node.txns.kept.lock().contains_key(&(txn, t, p)) {
                return Err(ShoalError::new(ErrorCode::NodeNotReady, "taking over the transaction; retry"));
            }
            let pa = map.partition(p).ok_or_else(|| ShoalError::internal("partition vanished"))?;
            node.check_primary(&map, pa)?;
            if let Some(part) = node.partition(t, p) {
                node.check_active(&part, pa)?;
            }
        }
    }
    let Some((state, mut st)) = state else {
        tracing::debug!(txn = format!("{txn:x}"), ?parts, "commit: nothing held here (already done)");
        return Ok(false);
    };
    let map = node.map();
    let tc = st.tc;
    tracing::debug!(txn = format!("{txn:x}"), ?parts, held = ?st.parts.keys().collect::<Vec<_>>(), one_phase, "commit");
    let mut moved = vec![];
    // Counted as writes in flight until applied here (a copy to a joining replica waits).
    let writing: Vec<Arc<Partition>> =
        st.parts.values().filter(|pt| !pt.writes.is_empty()).map(|pt| pt.part.clone()).collect();
    let inflight: Vec<_> = writing.iter().map(|p| p.enter_write(map.epoch)).collect();
    // Each part's images, numbered, ready to go.
    let mut ready = vec![];
    for (&(table, partition), pt) in st.parts.iter_mut() {
        if pt.writes.is_empty() {
            continue;
        }
        let pa = map.partition(partition).ok_or_else(|| ShoalError::internal("partition vanished"))?;
        // Rare, and what a failure analysis needs: the fate of a taken-over transaction.
        if pt.taken_over {
            tracing::info!(txn = format!("{txn:x}"), partition, "committing a taken-over transaction");
        }
        if one_phase && map.table_by_id(table).is_none_or(|t| t.read_only) {
            return Err(aborted("the table is being altered (or was dropped) since the transaction wrote to it"));
        }
        if pa.primary != Some(node.id) || pa.primary_term != pt.term {
            if one_phase {
                return Err(aborted("the partition's primary changed during the transaction"));
            }
            // Deposed after PREPARE: the new primary finishes this part from the kept images.
            // Commit the parts still ours, let go of this one (its locks here guard nothing).
            tracing::info!(txn = format!("{txn:x}"), partition, primary = ?pa.primary, "commit: the part moved away; released");
            moved.push((table, partition, pa.primary));
            continue;
        }
        let part = pt.part.clone();
        let mut images: Vec<(Image, u64)> = Vec::with_capacity(pt.writes.len());
        let mut stale = vec![];
        for (k, p) in &pt.writes {
            let now = part.store.lock().get(k).map_or(0, |s| s.seq);
            if p.base.is_some_and(|b| b != now) {
                tracing::warn!(
                    txn = format!("{txn:x}"),
                    partition,
                    "a taken-over image is older than its row (the commit already happened): skipped"
                );
                stale.push(k.clone());
                continue;
            }
            images.push((Image { key: k.clone(), data: p.data.clone(), seq: part.next_seq() }, p.reserved));
        }
        for k in stale {
            if let Some(p) = pt.writes.remove(&k) {
                node.budget.release(p.reserved);
            }
        }
        ready.push((table, pa, part, images));
    }
    // Every part's images go to the backups at once: the sends to one backup leave in one
    // message (its batcher merges calls made in the same turn), one round trip however many
    // parts. Each part is applied here once its backups have it.
    let tag = TxnTag { id: txn, tc, step: if record { TxnStep::Record } else { TxnStep::Commit } };
    let sends = ready.iter().map(|(table, pa, _, images)| {
        let send: Vec<Image> = images.iter().map(|(i, _)| i.clone()).collect();
        replication::replicate_txn(node, &map, *table, pa, gci, send, Some(tag))
    });
    let results = futures::future::join_all(sends).await;
    let sent = results.iter().any(Result::is_ok);
    let mut failure = None;
    for ((table, pa, part, images), result) in ready.into_iter().zip(results) {
        if let Err(e) = result {
            failure.get_or_insert(e);
            continue;
        }
        let partition = pa.partition;
        let mut store = part.store.lock();
        for (img, reserved) in images {
            part.applied_as_primary(img.seq);
            node.durability.log(gci, table, partition, &img);
            match img.data {
                Some(d) => store.put_reserved(&img.key, d, img.seq, reserved),
                None => {
                    store.delete(&img.key);
                    node.budget.release(reserved);
                }
            }
        }
        drop(store);
        // Their reservations went to the rows; `release` must not give them back again.
        if let Some(pt) = st.parts.get_mut(&(table, partition)) {
            pt.writes.clear();
        }
    }
    drop(inflight);
    if let Some(e) = failure {
        // A refusal of the record says that no backup holds it only when no part got through.
        return Err(match e.code {
            ErrorCode::TxnAborted if sent => {
                ShoalError::new(ErrorCode::NodeNotReady, format!("a backup refused a commit record it held: {e}"))
            }
            _ => e,
        });
    }
    release(node, txn, &mut st);
    end(node, txn, &state, &mut st);
    drop(st);
    if let Some(&(_, partition, primary)) = moved.first() {
        return Err(ShoalError::not_primary(
            primary,
            format!("partition {partition} moved; commit it at its new primary"),
        ));
    }
    Ok(sent)
}

/// ABORT at a participant: drop the pending images (and the backups' kept ones), free locks.
pub async fn abort(node: &Arc<Node>, txn: u64) {
    let Some((state, mut st)) = node.txns.locked(txn).await else { return };
    for (&(_, partition), pt) in &st.parts {
        if pt.taken_over {
            tracing::info!(txn = format!("{txn:x}"), partition, "aborting a taken-over transaction");
        }
    }
    if st.prepared {
        let map = node.map();
        let tc = st.tc;
        for (&(table, partition), pt) in &st.parts {
            if pt.writes.is_empty() {
                continue;
            }
            if let Some(pa) = map.partition(partition) {
                let tag = TxnTag { id: txn, tc, step: TxnStep::Abort };
                let _ = replication::replicate_txn(node, &map, table, pa, 0, vec![], Some(tag)).await;
            }
        }
    }
    release(node, txn, &mut st);
    end(node, txn, &state, &mut st);
}

/// A backup promoted to primary of `partition` takes over the prepared transactions it kept
/// for it: they lock their rows again and wait for their TC's decision. Runs before the new
/// primary serves (inside its activation).
pub async fn adopt_prepared(node: &Arc<Node>, partition: PartitionId, term: u64) {
    let kept: Vec<((u64, TableId, PartitionId), Kept)> = {
        let mut kept = node.txns.kept.lock();
        let keys: Vec<_> = kept.keys().filter(|k| k.2 == partition).copied().collect();
        keys.into_iter().filter_map(|k| kept.remove(&k).map(|v| (k, v))).collect()
    };
    for ((txn, table, partition), k) in kept {
        let Some(part) = node.partition(table, partition) else { continue };
        let (_, mut st) = node.txns.open(txn, || TxnState::new(k.tc, true)).await;
        st.prepared = true;
        let pt = st.parts.entry((table, partition)).or_insert_with(|| PartTxn {
            part: part.clone(),
            term,
            locked: vec![],
            writes: BTreeMap::new(),
            held_at: None,
            taken_over: false,
            undo: vec![],
        });
        pt.term = term;
        pt.taken_over = true;
        for img in k.images {
            // Nobody else can hold these rows yet: the partition is not serving.
            if part.lock_for(&img.key, txn, LockMode::Exclusive, Duration::from_secs(1)).await.unwrap_or(false) {
                pt.locked.push(img.key.clone().into_boxed_slice());
                node.txns.locks.fetch_add(1, Ordering::Relaxed);
            }
            let reserved = img.data.as_ref().map_or(0, |d| RowSlot::charge(img.key.len(), d.len()));
            node.budget.force(reserved);
            pt.writes.insert(img.key, Pending { data: img.data, reserved, base: Some(img.seq), savepoint: 0 });
        }
        tracing::info!(txn = format!("{txn:x}"), partition, "took over a prepared transaction");
    }
}

/// The images a prepared part hands its backups: each with the row's current sequence number
/// (0: absent) as its base, which a backup that takes the transaction over checks at commit.
fn prepared_images(pt: &PartTxn) -> Vec<Image> {
    let store = pt.part.store.lock();
    pt.writes
        .iter()
        .map(|(k, p)| Image { key: k.clone(), data: p.data.clone(), seq: store.get(k).map_or(0, |s| s.seq) })
        .collect()
}

/// Sends the images of every transaction prepared here on (table, partition) to `to`, a
/// replica being filled by a copy: it joined after they were prepared, and must be able to
/// finish them if it becomes primary.
pub async fn push_prepared(node: &Node, table: TableId, partition: PartitionId, to: NodeId) -> Result<(), ShoalError> {
    let open: Vec<(u64, SharedState)> = node.txns.active.lock().iter().map(|(&k, v)| (k, v.clone())).collect();
    let map = node.map();
    let pa = map.partition(partition).ok_or_else(|| ShoalError::internal("partition vanished"))?;
    for (txn, state) in open {
        let st = state.lock().await;
        if !st.prepared || st.ended {
            continue;
        }
        let Some(pt) = st.parts.get(&(table, partition)).filter(|pt| !pt.writes.is_empty()) else { continue };
        let images = prepared_images(pt);
        let msg = crate::transport::Replicate {
            from: node.id,
            table,
            partition,
            primary_term: pa.primary_term,
            epoch: map.epoch,
            gci: 0,
            images,
            txn: Some(TxnTag { id: txn, tc: st.tc, step: TxnStep::Prepare }),
            confirmed: vec![],
        };
        tracing::info!(txn = format!("{txn:x}"), partition, to, "pushing a prepared transaction to a new replica");
        // Sent while holding the transaction: its COMMIT (or ABORT), which tells `to` to drop
        // these images, must not overtake them, or `to` would keep them after the
        // transaction ended and could later take over a transaction that already happened.
        node.transport.replicate(to, msg).await?;
        drop(st);
    }
    Ok(())
}

// ----- coordinator -----

/// Commits (or rolls back) transaction `txn` whose operations touched `parts`. Returns the GCI
/// of the commit (0 for a rollback or a transaction that wrote nothing).
/// `execute`: the transaction's last writes, one request per participant node, each run there
/// with its PREPARE (or its one-phase COMMIT).
pub async fn commit_as_tc(
    node: &Arc<Node>,
    txn: u64,
    parts: Vec<(TableId, PartitionId)>,
    rollback: bool,
    execute: Vec<pb::TxnWrites>,
) -> Result<u64, ShoalError> {
    let by_node = group_by_primary(node, &parts)?;
    if rollback {
        abort_everywhere(node, txn, &by_node).await;
        return Ok(0);
    }
    // The client routed the writes with its map; a node that is no participant under ours
    // means a primary moved in between, and the writes' partitions with it.
    let mut execute = match attach(&by_node, execute) {
        Ok(e) => e,
        Err(e) => {
            abort_everywhere(node, txn, &by_node).await;
            return Err(e);
        }
    };
    if parts.len() == 1 {
        let (&primary, _) = by_node.iter().next().expect("one part, one node");
        let stamp = stamp_or_abort(node, txn, parts[0].1, &by_node).await?;
        let gci = stamp.gci;
        let writes = execute.remove(&primary);
        let rode = writes.is_some();
        let r = control(node, primary, pb::TxnPhase::Commit, txn, gci, &parts, Run::one_phase(writes)).await;
        drop(stamp);
        if r.is_err() && rode {
            // A riding write failed before anything committed: free what the transaction
            // held there (its client is done with it).
            abort_everywhere(node, txn, &by_node).await;
        }
        return r.map(|_| gci);
    }
    // 1. PREPARE everywhere. When the decision will ride on the TC's own part's COMMIT (see
    // 2.) and that is one message (one partition), its PREPARE keeps the images here: the
    // peer gets them with the decision, or the transaction aborts.
    let images_only_here = own_part_carries_record(node, &by_node).is_some_and(|own| own.len() == 1);
    let prepared = futures::future::join_all(by_node.iter().map(|(&n, p)| {
        let mut run = Run::with(execute.remove(&n));
        run.images_stay_here = n == node.id && images_only_here;
        control(node, n, pb::TxnPhase::Prepare, txn, 0, p, run)
    }))
    .await;
    if let Some(e) = prepared.into_iter().find_map(Result::err) {
        abort_everywhere(node, txn, &by_node).await;
        // A write that failed for good (a duplicate key, a full table) says so; anything
        // retriable becomes the transaction's abort, which the client runs again.
        return Err(match e.code {
            ErrorCode::TxnAborted => e,
            _ if !e.is_retriable() => e,
            _ => aborted(format!("prepare failed: {e}")),
        });
    }
    // 2. Decide and record the decision where a TC take-over finds it.
    let stamp = stamp_or_abort(node, txn, parts[0].1, &by_node).await?;
    let gci = stamp.gci;
    let given_up = {
        let mut d = node.txns.decisions.lock();
        // A participant that waited too long asked, and was told "aborted".
        let given_up = matches!(d.get(&txn), Some(Decision::Aborted { .. }));
        if !given_up {
            d.insert(txn, Decision::Deciding);
        }
        given_up
    };
    if given_up {
        abort_everywhere(node, txn, &by_node).await;
        return Err(aborted("a participant gave up waiting for the commit decision"));
    }
    // The decision is commit once any peer holds the record: a participant that asks around
    // commits on that peer's word, so from then on aborting would split the transaction.
    // Only when no peer took it (each refused or could not be reached) may the TC still
    // abort: it told nobody (OUTCOME at the TC says "ask again" while deciding).
    //
    // With a single peer that is also the only backup of the TC's own part, the record rides
    // on that part's COMMIT to it (`TxnStep::Record`): one message instead of two, and the
    // own part is done before the others start theirs.
    let mut parts = parts;
    let rode = match own_part_carries_record(node, &by_node) {
        Some(own) => match commit_parts(node, txn, gci, &own, false, true).await {
            Ok(sent) => {
                parts.retain(|p| !own.contains(p));
                sent
            }
            // Maybe recorded, maybe not (a refusal too: a replica that joined meanwhile may
            // have refused while the peer took it). With the own images at the backups, the
            // RECORD messages below settle it (a peer that holds the record takes it again);
            // without, only a peer that holds the record (and so the images) allows a commit.
            // Either way the own part is then carried out with the rest.
            Err(e) => {
                tracing::debug!(txn = format!("{txn:x}"), "own part's commit with the record: {e}");
                images_only_here && recorded_at_a_peer(node, txn, &by_node).await?
            }
        },
        None if images_only_here => {
            // The group changed since PREPARE: the own images are nowhere else, so a record
            // alone could not be carried out by a take-over.
            node.txns.decisions.lock().insert(txn, Decision::Aborted { at: Instant::now() });
            abort_everywhere(node, txn, &by_node).await;
            return Err(aborted("the coordinator's node group changed during the commit"));
        }
        None => false,
    };
    let (recorded, failure) = if rode { (1, None) } else { record_at_peers(node, txn, gci, &parts).await };
    if let Some(e) = failure {
        if recorded == 0 {
            node.txns.decisions.lock().insert(txn, Decision::Aborted { at: Instant::now() });
            forget_at_peers(node, txn);
            abort_everywhere(node, txn, &by_node).await;
            return Err(aborted(format!("could not record the commit decision: {e}")));
        }
        tracing::warn!(
            txn = format!("{txn:x}"),
            recorded,
            "a group peer did not take the commit record ({e}); committing on the others' records"
        );
    }
    node.txns.decisions.lock().insert(txn, Decision::Commit { gci });
    // 3. COMMIT everywhere, following primaries that move.
    let (left, last_err) = carry_out(node, txn, gci, parts, DECISION_RETRY_FOR).await;
    drop(stamp);
    if !left.is_empty() {
        // Decided: keep carrying it out in the background (participants that wait too long
        // also finish it from the record), and forget the record only once it is done: a
        // record kept forever would outlive the transaction's ids in every other table.
        let node = node.clone();
        tokio::spawn(async move {
            let (left, _) = carry_out(&node, txn, gci, left, DECISION_KEEP_TRYING).await;
            if left.is_empty() {
                node.txns.decisions.lock().remove(&txn);
                forget_at_peers(&node, txn);
            } else {
                tracing::warn!(txn = format!("{txn:x}"), "gave up confirming a decided commit; its record stays");
            }
        });
        // The client cannot know when it is visible everywhere.
        return Err(ShoalError::new(
            ErrorCode::Timeout,
            format!(
                "transaction committed, but not every participant confirmed yet: {}",
                last_err.map_or_else(String::new, |e| e.to_string())
            ),
        ));
    }
    node.txns.decisions.lock().remove(&txn);
    forget_at_peers(node, txn);
    Ok(gci)
}

/// Sends COMMIT for `parts` to their current primaries until each confirmed or `patience`
/// ran out. Returns the parts still unconfirmed and the last error.
async fn carry_out(
    node: &Arc<Node>,
    txn: u64,
    gci: u64,
    parts: Vec<(TableId, PartitionId)>,
    patience: Duration,
) -> (Vec<(TableId, PartitionId)>, Option<ShoalError>) {
    let started = Instant::now();
    let mut left = parts;
    let mut last_err = None;
    while !left.is_empty() && started.elapsed() < patience {
        let groups = group_by_primary(node, &left).unwrap_or_default();
        if groups.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let results = futures::future::join_all(groups.iter().map(|(&n, p)| async move {
            (p.clone(), control(node, n, pb::TxnPhase::Commit, txn, gci, p, Run::default()).await)
        }))
        .await;
        left.clear();
        for (p, r) in results {
            if let Err(e) = r {
                last_err = Some(e);
                left.extend(p);
            }
        }
        if !left.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    (left, last_err)
}

fn group_by_primary(
    node: &Node,
    parts: &[(TableId, PartitionId)],
) -> Result<BTreeMap<NodeId, Vec<(TableId, PartitionId)>>, ShoalError> {
    let map = node.map();
    let mut out: BTreeMap<NodeId, Vec<(TableId, PartitionId)>> = BTreeMap::new();
    for &(t, p) in parts {
        let primary = map
            .partition(p)
            .and_then(|pa| pa.primary)
            .ok_or_else(|| aborted(format!("partition {p} has no live replica")))?;
        out.entry(primary).or_default().push((t, p));
    }
    Ok(out)
}

/// The commit's GCI stamp (`Durability::begin_commit`, on `partition`'s redo log). A
/// transaction that cannot be stamped (the node is stopping, or the redo log cannot take the
/// commit) is aborted everywhere.
async fn stamp_or_abort<'n>(
    node: &'n Arc<Node>,
    txn: u64,
    partition: PartitionId,
    by_node: &BTreeMap<NodeId, Vec<(TableId, PartitionId)>>,
) -> Result<Stamp<'n>, ShoalError> {
    match node.durability.begin_commit(partition).await {
        Ok(stamp) => Ok(stamp),
        Err(e) => {
            abort_everywhere(node, txn, by_node).await;
            Err(aborted(format!("cannot stamp the commit: {e}")))
        }
    }
}

async fn abort_everywhere(node: &Arc<Node>, txn: u64, by_node: &BTreeMap<NodeId, Vec<(TableId, PartitionId)>>) {
    // A part whose primary moved since the commit began (a failover, or a hand-over back to a
    // restarted node) was taken over prepared by its new primary (`adopt_prepared`), which
    // locked its rows again: it must hear the abort too. Told only the old primary, it held
    // those locks until its own question to the TC seconds later, and a statement meeting
    // them in between failed with a lock wait timeout (the docker test saw it once).
    let map = node.map();
    let mut to = by_node.clone();
    for &(t, p) in by_node.values().flatten() {
        if let Some(primary) = map.partition(p).and_then(|pa| pa.primary) {
            let parts = to.entry(primary).or_default();
            if !parts.contains(&(t, p)) {
                parts.push((t, p));
            }
        }
    }
    futures::future::join_all(
        to.iter().map(|(&n, p)| control(node, n, pb::TxnPhase::Abort, txn, 0, p, Run::default())),
    )
    .await;
}

/// The commit's riding writes keyed by the participant that runs them; an error when one is
/// addressed to a node that is not a participant.
fn attach(
    by_node: &BTreeMap<NodeId, Vec<(TableId, PartitionId)>>,
    execute: Vec<pb::TxnWrites>,
) -> Result<BTreeMap<NodeId, pb::TxnExecuteRequest>, ShoalError> {
    let mut out = BTreeMap::new();
    for w in execute {
        if !by_node.contains_key(&w.node) {
            return Err(aborted(format!("node {} is no longer the primary of the writes sent to it", w.node)));
        }
        let req = w.req.ok_or_else(|| ShoalError::new(ErrorCode::InvalidArgument, "writes without operations"))?;
        if out.insert(w.node, req).is_some() {
            return Err(ShoalError::new(ErrorCode::InvalidArgument, format!("two sets of writes for node {}", w.node)));
        }
    }
    Ok(out)
}

/// The TC's own parts when its decision can ride on their COMMIT: this node's group has one
/// live peer, and it is the only other replica of each of them.
fn own_part_carries_record(
    node: &Node,
    by_node: &BTreeMap<NodeId, Vec<(TableId, PartitionId)>>,
) -> Option<Vec<(TableId, PartitionId)>> {
    let own = by_node.get(&node.id)?;
    let &[peer] = group_peers(node).as_slice() else { return None };
    let map = node.map();
    let only_peer = |p: PartitionId| {
        map.partition(p).is_some_and(|pa| {
            let mut others = pa.replicas.iter().map(|r| r.node_id).filter(|&n| n != node.id);
            others.next() == Some(peer) && others.next().is_none()
        })
    };
    own.iter().all(|&(_, p)| only_peer(p)).then(|| own.clone())
}

/// After a failed COMMIT of the TC's own part that carried the decision while its images were
/// only here: Ok(true) when a group peer holds the record (and with it the images), so the
/// transaction commits; otherwise every peer now notes it aborted (and refuses the record if
/// it still arrives), and the transaction is aborted everywhere (the error).
async fn recorded_at_a_peer(
    node: &Arc<Node>,
    txn: u64,
    by_node: &BTreeMap<NodeId, Vec<(TableId, PartitionId)>>,
) -> Result<bool, ShoalError> {
    let started = Instant::now();
    for peer in group_peers(node) {
        loop {
            let req = control_request(node, pb::TxnPhase::Outcome, txn, 0, &[], false, vec![]);
            match node.transport.txn_control(peer, req).await {
                Ok(Some(_)) => return Ok(true),
                Ok(None) => break,
                // A peer that left the group (or stays unreachable) serves no take-over.
                Err(_) if !group_peers(node).contains(&peer) || started.elapsed() > Duration::from_secs(3) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
    node.txns.decisions.lock().insert(txn, Decision::Aborted { at: Instant::now() });
    abort_everywhere(node, txn, by_node).await;
    Err(aborted("the commit decision reached no peer of the coordinator's group"))
}

/// The other live members of this node's group: where a TC records its decisions.
fn group_peers(node: &Node) -> Vec<NodeId> {
    let map = node.map();
    let Some(me) = map.node(node.id) else { return vec![] };
    map.nodes
        .iter()
        .filter(|n| n.id != node.id && n.node_group == me.node_group && n.kind == shoal_proto::NodeKind::DataNode)
        .filter(|n| n.state != NodeState::Down)
        .map(|n| n.id)
        .collect()
}

/// Records the commit decision at every live peer of the TC's node group. Returns how many
/// took it, and the first failure (a peer that refused: it told a participant "no commit"
/// already; or one that stayed unreachable while still in the group).
async fn record_at_peers(
    node: &Arc<Node>,
    txn: u64,
    gci: u64,
    parts: &[(TableId, PartitionId)],
) -> (usize, Option<ShoalError>) {
    let started = Instant::now();
    let mut recorded = 0;
    let mut failure = None;
    // Confirmed commits' FORGETs ride along; if a peer does not take this RECORD they go
    // back in the queue (a second FORGET of a record is harmless).
    let forget = take_forgets(node);
    let mut missed = false;
    for peer in group_peers(node) {
        loop {
            let req = control_request(node, pb::TxnPhase::Record, txn, gci, parts, false, forget.clone());
            let sent = node.transport.txn_control(peer, req).await;
            missed |= sent.is_err();
            match sent {
                Ok(_) => {
                    recorded += 1;
                    break;
                }
                Err(e) if e.code == ErrorCode::TxnAborted => {
                    failure.get_or_insert(e);
                    break;
                }
                Err(e) => {
                    // A peer that left the group does not need the record.
                    if !group_peers(node).contains(&peer) {
                        break;
                    }
                    if started.elapsed() > Duration::from_secs(3) {
                        failure.get_or_insert(e);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
    if missed && !forget.is_empty() {
        queue_forgets(node, forget);
    }
    (recorded, failure)
}

/// How long confirmed commits' FORGETs wait for a RECORD to ride on before going on their own.
const FORGET_DELAY: Duration = Duration::from_millis(20);
/// At most this many FORGETs ride on one message.
const MAX_FORGETS: usize = 1024;

/// Lets the group peers drop `txn`'s commit record. Not urgent (nobody asks about a commit
/// every participant confirmed), so it waits for the next RECORD to the peers, which carries
/// it: under load a forget costs no message of its own.
fn forget_at_peers(node: &Arc<Node>, txn: u64) {
    queue_forgets(node, [txn]);
}

/// Queues FORGETs, and a flush of them after `FORGET_DELAY` unless one is due already.
fn queue_forgets(node: &Arc<Node>, txns: impl IntoIterator<Item = u64>) {
    node.txns.forgets.lock().extend(txns);
    if !node.txns.forget_flush_due.swap(true, Ordering::AcqRel) {
        let node = node.clone();
        tokio::spawn(async move {
            tokio::time::sleep(FORGET_DELAY).await;
            // Cleared first: a FORGET queued while this flush runs schedules another.
            node.txns.forget_flush_due.store(false, Ordering::Release);
            flush_forgets(&node).await;
        });
    }
}

/// Sends the FORGETs no RECORD took along.
async fn flush_forgets(node: &Arc<Node>) {
    loop {
        let batch = take_forgets(node);
        let Some((&first, rest)) = batch.split_first() else { return };
        for peer in group_peers(node) {
            let req = control_request(node, pb::TxnPhase::Forget, first, 0, &[], false, rest.to_vec());
            let _ = node.transport.txn_control(peer, req).await;
        }
    }
}

fn take_forgets(node: &Node) -> Vec<u64> {
    let mut f = node.txns.forgets.lock();
    let n = f.len().min(MAX_FORGETS);
    f.drain(..n).collect()
}

/// Drops the commit records of transactions a coordinator says are confirmed everywhere.
pub fn forget_records(node: &Node, txns: &[u64]) {
    if txns.is_empty() {
        return;
    }
    let mut d = node.txns.decisions.lock();
    for t in txns {
        d.remove(t);
    }
}

/// Sends one control step to `to` (locally when it is this node). Ok(Some(gci)) for a
/// committed OUTCOME, Ok(None) otherwise.
async fn control(
    node: &Arc<Node>,
    to: NodeId,
    phase: pb::TxnPhase,
    txn: u64,
    gci: u64,
    parts: &[(TableId, PartitionId)],
    run: Run,
) -> Result<Option<u64>, ShoalError> {
    if to == node.id {
        return handle_control(node, phase, txn, gci, parts, run).await;
    }
    let mut req = control_request(node, phase, txn, gci, parts, run.one_phase, vec![]);
    req.execute = run.execute;
    node.transport.txn_control(to, req).await
}

/// How a participant runs a PREPARE or a COMMIT: whether the COMMIT is one-phase (no PREPARE
/// came before), and writes of the transaction to run first (they rode on the commit).
#[derive(Default)]
pub struct Run {
    pub one_phase: bool,
    pub execute: Option<pb::TxnExecuteRequest>,
    /// PREPARE of the TC's own part without sending its images to the backups (`prepare`);
    /// never set from the wire.
    pub images_stay_here: bool,
}

impl Run {
    /// How a control request from the wire asks its step to run.
    pub fn from_request(req: &mut pb::TxnControlRequest) -> Run {
        Run { one_phase: req.one_phase, execute: req.execute.take(), images_stay_here: false }
    }

    fn with(execute: Option<pb::TxnExecuteRequest>) -> Run {
        Run { execute, ..Run::default() }
    }

    fn one_phase(execute: Option<pb::TxnExecuteRequest>) -> Run {
        Run { one_phase: true, execute, ..Run::default() }
    }
}

fn control_request(
    node: &Node,
    phase: pb::TxnPhase,
    txn: u64,
    gci: u64,
    parts: &[(TableId, PartitionId)],
    one_phase: bool,
    forget: Vec<u64>,
) -> pb::TxnControlRequest {
    pb::TxnControlRequest {
        phase: phase as i32,
        txn_id: txn,
        tc: node.id,
        gci,
        parts: parts.iter().map(|&(t, p)| pb::TxnPart { table_id: t, partition: p }).collect(),
        epoch: node.epoch(),
        one_phase,
        forget,
        execute: None,
    }
}

/// A group peer takes its TC's commit decision, unless it already told a participant that
/// the transaction aborted.
pub fn take_record(node: &Node, txn: u64, gci: u64) -> Result<(), ShoalError> {
    let mut d = node.txns.decisions.lock();
    if let Some(Decision::Aborted { .. }) = d.get(&txn) {
        return Err(aborted("the transaction was already resolved as aborted"));
    }
    d.insert(txn, Decision::Commit { gci });
    Ok(())
}

/// Handles a control step addressed to this node.
pub async fn handle_control(
    node: &Arc<Node>,
    phase: pb::TxnPhase,
    txn: u64,
    gci: u64,
    parts: &[(TableId, PartitionId)],
    run: Run,
) -> Result<Option<u64>, ShoalError> {
    let one_phase = run.one_phase;
    let images_stay_here = run.images_stay_here;
    // Writes riding on the commit run first; the first that fails fails the step (the TC
    // then aborts the transaction everywhere, this work included).
    if let Some(req) = run.execute {
        if !(phase == pb::TxnPhase::Prepare || phase == pb::TxnPhase::Commit && one_phase) {
            return Err(ShoalError::new(
                ErrorCode::InvalidArgument,
                "writes ride only on PREPARE or a one-phase COMMIT",
            ));
        }
        crate::service::run_attached(node, req).await?;
    }
    match phase {
        pb::TxnPhase::Prepare => prepare(node, txn, parts, images_stay_here).await.map(|()| None),
        pb::TxnPhase::Commit => commit(node, txn, gci, parts, one_phase).await.map(|()| None),
        pb::TxnPhase::Abort => {
            abort(node, txn).await;
            Ok(None)
        }
        pb::TxnPhase::Record => take_record(node, txn, gci).map(|()| None),
        pb::TxnPhase::Forget => {
            node.txns.decisions.lock().remove(&txn);
            Ok(None)
        }
        pb::TxnPhase::Outcome => {
            let mut d = node.txns.decisions.lock();
            match d.get(&txn) {
                Some(Decision::Commit { gci }) => Ok(Some(*gci)),
                // Recording at the peers: neither answer is true yet.
                Some(Decision::Deciding) => {
                    Err(ShoalError::new(ErrorCode::NodeNotReady, "the coordinator is still deciding; ask again"))
                }
                _ => {
                    d.insert(txn, Decision::Aborted { at: Instant::now() });
                    Ok(None)
                }
            }
        }
        pb::TxnPhase::Unspecified => Err(ShoalError::new(ErrorCode::InvalidArgument, "unknown transaction step")),
    }
}

/// Aborts transactions whose client vanished, resolves prepared ones whose TC died, and
/// forgets old abort notes. Runs for the life of the node.
pub async fn sweeper(node: Arc<Node>) {
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tick.tick().await;
        node.txns
            .decisions
            .lock()
            .retain(|_, d| !matches!(d, Decision::Aborted { at } if at.elapsed() > ABORTED_NOTE_TTL));
        node.txns.swept.lock().retain(|_, at| at.elapsed() <= ABORTED_NOTE_TTL);
        let open: Vec<(u64, SharedState)> = node.txns.active.lock().iter().map(|(&k, v)| (k, v.clone())).collect();
        for (txn, state) in open {
            let Ok(st) = state.try_lock() else { continue };
            if st.ended {
                continue;
            }
            let idle = st.last_active.elapsed();
            let (prepared, tc) = (st.prepared, st.tc);
            drop(st);
            if !prepared && idle > node.timing.txn_inactive {
                tracing::info!(txn = format!("{txn:x}"), "aborting a transaction idle for {idle:?}");
                node.txns.swept.lock().insert(txn, Instant::now());
                abort(&node, txn).await;
            } else if prepared && idle > PREPARED_PATIENCE {
                let node = node.clone();
                tokio::spawn(async move { resolve(&node, txn, tc).await });
            }
        }
    }
}

/// A prepared transaction heard nothing from its TC: ask the TC (if it is up) and every live
/// peer of its node group. A recorded commit anywhere means commit. Each one asked that knows
/// no commit notes the transaction aborted, which stops it from deciding or recording a
/// commit later; so only when all of them answer "none" is it aborted. (Asking the peers too
/// matters when the TC restarted: its new incarnation remembers nothing, its peers do.) A
/// node that does not answer leaves the transaction prepared until the next try.
async fn resolve(node: &Arc<Node>, txn: u64, tc: NodeId) {
    let map = node.map();
    let group = map.node(tc).map(|n| n.node_group);
    let ask: Vec<NodeId> = map
        .nodes
        .iter()
        .filter(|n| n.kind == shoal_proto::NodeKind::DataNode && Some(n.node_group) == group)
        .filter(|n| n.state != NodeState::Down)
        .map(|n| n.id)
        .collect();
    if ask.is_empty() {
        tracing::warn!(txn = format!("{txn:x}"), tc, "prepared transaction: its TC's node group is down; waiting");
        return;
    }
    let answers = futures::future::join_all(
        ask.iter().map(|&p| control(node, p, pb::TxnPhase::Outcome, txn, 0, &[], Run::default())),
    )
    .await;
    if let Some(decided) = answers.iter().find_map(|a| a.as_ref().ok().copied().flatten()) {
        tracing::info!(txn = format!("{txn:x}"), tc, decided, "finishing a transaction its TC decided to commit");
        // The TC no longer holds the decided GCI open, and its checkpoint may be complete
        // already: log the rest under a GCI that is still open, or the redo would hold records
        // behind the marker of their checkpoint. (A system restart cut between the two could
        // then keep one part of this transaction and not the other: a TC crash followed by a
        // whole-cluster crash within one checkpoint interval.)
        let stamp = match node.durability.begin_commit(0).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(txn = format!("{txn:x}"), "cannot finish the commit yet: {e}");
                return;
            }
        };
        if let Err(e) = commit(node, txn, stamp.gci, &[], false).await {
            tracing::warn!(txn = format!("{txn:x}"), "could not finish the commit yet: {e}");
        }
        return;
    }
    if answers.iter().all(|a| matches!(a, Ok(None))) {
        tracing::info!(txn = format!("{txn:x}"), tc, "aborting a prepared transaction its TC did not decide");
        abort(node, txn).await;
    }
}

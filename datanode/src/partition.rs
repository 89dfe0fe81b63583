//! A partition replica: its rows, its row locks, and the bookkeeping replication needs.
//!
//! Each replica has its own locks; nothing here is shared between partitions, so independent
//! partitions never contend (DESIGN §5).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use shoal_proto::{Epoch, ErrorCode, PartitionId, ShoalError, TableId};
use tokio::sync::Notify;

use crate::storage::{MemoryBudget, PartitionStore};

pub struct Partition {
    pub table: TableId,
    pub id: PartitionId,
    pub store: Mutex<PartitionStore>,
    /// Highest write sequence number issued or applied here. A primary issues the next one;
    /// a backup raises it as images arrive, so a promoted backup continues the sequence.
    seq: AtomicU64,
    /// Highest primary term seen for this partition (from the map or from a primary).
    term: AtomicU64,
    /// The primary term for which this node, as primary, has passed the activation barrier
    /// (every other replica installed the map that made it primary).
    active_term: AtomicU64,
    locks: RowLocks,
    /// Writes in flight at this primary, counted by the map epoch they chose replicas from.
    inflight: Mutex<BTreeMap<Epoch, u32>>,
    /// Transactions prepared here and not yet committed or aborted, by the epoch of their
    /// PREPARE: what a scan must wait for before it reads (see `scan.rs`).
    prepared: Mutex<BTreeMap<Epoch, u32>>,
    /// Writes this node applied as primary that its backups have not been told of yet
    /// (`unconfirmed.rs`), and whether the last `confirm_tick` already saw them waiting.
    confirms: Mutex<(Vec<u64>, bool)>,
}

impl Partition {
    pub fn new(table: TableId, id: PartitionId, budget: Arc<MemoryBudget>) -> Partition {
        Partition {
            table,
            id,
            store: Mutex::new(PartitionStore::new(budget)),
            seq: AtomicU64::new(0),
            term: AtomicU64::new(0),
            active_term: AtomicU64::new(0),
            locks: RowLocks::default(),
            inflight: Mutex::new(BTreeMap::new()),
            prepared: Mutex::new(BTreeMap::new()),
            confirms: Mutex::new((Vec::new(), false)),
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    pub fn saw_seq(&self, seq: u64) {
        self.seq.fetch_max(seq, Ordering::AcqRel);
    }

    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// Records a term; returns the highest seen.
    pub fn raise_term(&self, term: u64) -> u64 {
        self.term.fetch_max(term, Ordering::AcqRel).max(term)
    }

    pub fn active_term(&self) -> u64 {
        self.active_term.load(Ordering::Acquire)
    }

    pub fn activate(&self, term: u64) {
        self.active_term.fetch_max(term, Ordering::AcqRel);
        // What a primary holds is what it shows: nothing of it waits for a confirmation now.
        self.store.lock().unconfirmed.clear();
    }

    /// This node, as primary, applied its write `seq`: the backups may show it to reads made
    /// as the primary once they hear so (`unconfirmed.rs`).
    pub fn applied_as_primary(&self, seq: u64) {
        self.confirms.lock().0.push(seq);
    }

    /// The confirmations to send with this partition's next message to its backups.
    pub fn take_confirms(&self) -> Vec<u64> {
        let mut c = self.confirms.lock();
        c.1 = false;
        std::mem::take(&mut c.0)
    }

    /// Called every `CONFIRM_DELAY`: the confirmations that waited since the last call
    /// (no write took them along meanwhile), to be sent on their own.
    pub fn confirm_tick(&self) -> Vec<u64> {
        let mut c = self.confirms.lock();
        if c.0.is_empty() {
            return vec![];
        }
        if !c.1 {
            c.1 = true;
            return vec![];
        }
        c.1 = false;
        std::mem::take(&mut c.0)
    }

    pub fn enter_write(&self, epoch: Epoch) -> InflightGuard<'_> {
        *self.inflight.lock().entry(epoch).or_default() += 1;
        InflightGuard { part: self, epoch }
    }

    /// Whether every write still in flight chose its replicas from a map of at least `epoch`.
    pub fn writes_before_drained(&self, epoch: Epoch) -> bool {
        self.inflight.lock().keys().next().is_none_or(|&e| e >= epoch)
    }

    /// A transaction prepared its writes here under `epoch`; `release_prepared` when it ends.
    pub fn hold_prepared(&self, epoch: Epoch) {
        *self.prepared.lock().entry(epoch).or_default() += 1;
    }

    pub fn release_prepared(&self, epoch: Epoch) {
        let mut m = self.prepared.lock();
        if let Some(n) = m.get_mut(&epoch) {
            *n -= 1;
            if *n == 0 {
                m.remove(&epoch);
            }
        }
    }

    /// Whether every write accepted under a map older than `epoch` is finished: applied (or
    /// failed), and, for transactions, committed or aborted.
    pub fn settled_before(&self, epoch: Epoch) -> bool {
        self.writes_before_drained(epoch) && self.prepared.lock().keys().next().is_none_or(|&e| e >= epoch)
    }
}

pub struct InflightGuard<'a> {
    part: &'a Partition,
    epoch: Epoch,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        let mut m = self.part.inflight.lock();
        if let Some(n) = m.get_mut(&self.epoch) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.epoch);
            }
        }
    }
}

/// Who holds a row lock: a transaction (its id) or a single autocommit write (a fresh id
/// from the same space, see [`Partition::lock_row`]).
pub type LockOwner = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    Shared,
    Exclusive,
}

struct LockEntry {
    mode: LockMode,
    owners: Vec<LockOwner>,
    released: Arc<Notify>,
}

/// Row locks of one partition replica at its primary: shared or exclusive, held by an owner
/// until it releases them (a transaction: at commit or abort; an autocommit write: when every
/// replica has the new image, so two writes to one row are never in flight at once). A waiter
/// gives up after its wait time with LOCK_WAIT_TIMEOUT.
///
/// Deadlocks: a transaction waiting for a lock an *older* transaction of the same client holds
/// (a lower id with the same client prefix: a client's ids count up as it begins them) gives up
/// after [`YOUNGER_WAIT`] instead. Along a cycle of waits among one client's transactions the
/// ids cannot only fall, so such a deadlock — also one spanning data nodes — has a short wait
/// and breaks within it, not after the whole lock wait time that held every transaction of the
/// cycle and those queued behind them (sysbench's hot rows made one every few hundred
/// transactions). Ids of different clients (SQL nodes) say nothing about age: a wait on another
/// client's transaction keeps the whole wait (a cycle through it breaks then, as before), so a
/// writer never gives up early on a transaction it has no order with. Waits on younger holders,
/// shared-lock requests (a consistent read of many rows, `LOCK IN SHARE MODE`, would otherwise
/// give up at the first slow writer it meets: tests/txn.rs's audits under faults never got
/// through), and autocommit writes (they hold one row and wait for nothing else, so no cycle
/// runs through them) keep the whole wait; a cycle through one of those breaks there.
#[derive(Default)]
struct RowLocks {
    held: Mutex<HashMap<Box<[u8]>, LockEntry>>,
}

/// An autocommit write's exclusive lock, released on drop.
pub struct RowGuard<'a> {
    locks: &'a RowLocks,
    key: Box<[u8]>,
    owner: LockOwner,
}

/// Autocommit owners count down from the top of the id space; transaction ids count up.
static NEXT_AUTOCOMMIT_OWNER: AtomicU64 = AtomicU64::new(u64::MAX);

/// How long a transaction waits for a lock held by an older transaction (see [`RowLocks`]).
pub const YOUNGER_WAIT: Duration = Duration::from_millis(50);

/// Transaction ids have the top bit clear (`shoal_client::Client::begin`); autocommit owners
/// count down from the top.
fn is_transaction(owner: LockOwner) -> bool {
    owner < 1 << 63
}

/// Whether `holder` is a transaction the same client began before `waiter`: a client's
/// transaction ids are its random prefix above bit 32 and a counter below.
fn older_of_same_client(holder: LockOwner, waiter: LockOwner) -> bool {
    holder >> 32 == waiter >> 32 && holder < waiter
}

impl RowLocks {
    /// Takes (or upgrades to) `mode` on `key` for `owner`. Re-entrant. Returns whether the
    /// owner did not hold the row before (it must release it once).
    async fn lock(&self, key: &[u8], owner: LockOwner, mode: LockMode, wait: Duration) -> Result<bool, ShoalError> {
        let mut deadline = tokio::time::Instant::now() + wait;
        loop {
            let (released, behind_older) = {
                let mut held = self.held.lock();
                match held.get_mut(key) {
                    None => {
                        let entry = LockEntry { mode, owners: vec![owner], released: Arc::new(Notify::new()) };
                        held.insert(key.into(), entry);
                        return Ok(true);
                    }
                    Some(e) => {
                        let mine = e.owners.contains(&owner);
                        let alone = e.owners.len() == 1 && mine;
                        match (e.mode, mode) {
                            (LockMode::Shared, LockMode::Shared) => {
                                if !mine {
                                    e.owners.push(owner);
                                }
                                return Ok(!mine);
                            }
                            (LockMode::Exclusive, _) if mine => return Ok(false),
                            (LockMode::Shared, LockMode::Exclusive) if alone => {
                                e.mode = LockMode::Exclusive;
                                return Ok(false);
                            }
                            _ => {
                                let older = e.owners.iter().any(|&h| older_of_same_client(h, owner));
                                let short = older && is_transaction(owner) && mode == LockMode::Exclusive;
                                (e.released.clone(), short)
                            }
                        }
                    }
                }
            };
            // Register before re-checking, so a release between the check and the wait is seen.
            let notified = released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let changed = self.held.lock().get(key).is_none_or(|e| !Arc::ptr_eq(&e.released, &released));
            if changed {
                continue;
            }
            if behind_older {
                deadline = deadline.min(tokio::time::Instant::now() + YOUNGER_WAIT);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(ShoalError::new(
                    ErrorCode::LockWaitTimeout,
                    "lock wait timed out; run the transaction again",
                ));
            }
        }
    }

    fn unlock(&self, key: &[u8], owner: LockOwner) {
        let mut held = self.held.lock();
        let Some(e) = held.get_mut(key) else { return };
        e.owners.retain(|&o| o != owner);
        if e.owners.is_empty() {
            if let Some(e) = held.remove(key) {
                e.released.notify_waiters();
            }
        } else {
            // A waiting upgrade may now be alone.
            e.released.notify_waiters();
            e.released = Arc::new(Notify::new());
        }
    }

    fn count(&self) -> usize {
        self.held.lock().len()
    }
}

impl Partition {
    /// Locks `key` for an autocommit write (exclusive, released when the guard drops). A wait
    /// that runs out is a TIMEOUT, which the client retries within its deadline.
    pub async fn lock_row(&self, key: &[u8], wait: Duration) -> Result<RowGuard<'_>, ShoalError> {
        let owner = NEXT_AUTOCOMMIT_OWNER.fetch_sub(1, Ordering::Relaxed);
        match self.locks.lock(key, owner, LockMode::Exclusive, wait).await {
            Ok(_) => Ok(RowGuard { locks: &self.locks, key: key.into(), owner }),
            Err(e) if e.code == ErrorCode::LockWaitTimeout => {
                Err(ShoalError::new(ErrorCode::Timeout, "row lock wait timed out"))
            }
            Err(e) => Err(e),
        }
    }

    /// Locks `key` for a transaction; see [`RowLocks::lock`].
    pub async fn lock_for(
        &self,
        key: &[u8],
        owner: LockOwner,
        mode: LockMode,
        wait: Duration,
    ) -> Result<bool, ShoalError> {
        self.locks.lock(key, owner, mode, wait).await
    }

    pub fn unlock_for(&self, key: &[u8], owner: LockOwner) {
        self.locks.unlock(key, owner);
    }

    /// Rows locked now.
    pub fn locked_rows(&self) -> usize {
        self.locks.count()
    }
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        self.locks.unlock(&self.key, self.owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn row_lock_is_exclusive_and_times_out() {
        let p = Partition::new(1, 0, MemoryBudget::new(1 << 20));
        let g = p.lock_row(b"k", Duration::from_millis(10)).await.unwrap();
        let e = p.lock_row(b"k", Duration::from_millis(30)).await.err().unwrap();
        assert_eq!(e.code, ErrorCode::Timeout);
        // Another row is independent.
        let _other = p.lock_row(b"j", Duration::from_millis(10)).await.unwrap();
        drop(g);
        p.lock_row(b"k", Duration::from_millis(10)).await.unwrap();
    }

    #[tokio::test]
    async fn shared_locks_share_and_exclusive_waits_for_all() {
        let p = Arc::new(Partition::new(1, 0, MemoryBudget::new(1 << 20)));
        let ms = Duration::from_millis;
        assert!(p.lock_for(b"k", 1, LockMode::Shared, ms(10)).await.unwrap());
        assert!(p.lock_for(b"k", 2, LockMode::Shared, ms(10)).await.unwrap());
        // Re-entrant, and a shared holder cannot upgrade while another shares it.
        assert!(!p.lock_for(b"k", 1, LockMode::Shared, ms(10)).await.unwrap());
        let e = p.lock_for(b"k", 1, LockMode::Exclusive, ms(20)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::LockWaitTimeout);
        let e = p.lock_for(b"k", 3, LockMode::Exclusive, ms(20)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::LockWaitTimeout);
        // Once the other sharer leaves, the upgrade goes through.
        let p2 = p.clone();
        let upgrade = tokio::spawn(async move { p2.lock_for(b"k", 1, LockMode::Exclusive, ms(2000)).await });
        tokio::time::sleep(ms(20)).await;
        p.unlock_for(b"k", 2);
        assert!(!upgrade.await.unwrap().unwrap());
        // Exclusive blocks readers that lock, until released.
        let e = p.lock_for(b"k", 4, LockMode::Shared, ms(20)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::LockWaitTimeout);
        p.unlock_for(b"k", 1);
        assert!(p.lock_for(b"k", 4, LockMode::Shared, ms(10)).await.unwrap());
        assert_eq!(p.locked_rows(), 1);
    }

    #[tokio::test]
    async fn a_deadlock_breaks_at_the_wait_on_the_older_transaction() {
        let p = Arc::new(Partition::new(1, 0, MemoryBudget::new(1 << 20)));
        let s = Duration::from_secs;
        assert!(p.lock_for(b"a", 1, LockMode::Exclusive, s(1)).await.unwrap());
        assert!(p.lock_for(b"b", 2, LockMode::Exclusive, s(1)).await.unwrap());
        // 1 waits for 2 (younger): the whole wait.
        let p2 = p.clone();
        let older = tokio::spawn(async move { p2.lock_for(b"b", 1, LockMode::Exclusive, s(20)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // 2 waits for 1 (older): the cycle breaks here, after YOUNGER_WAIT, not 20 s.
        let t = std::time::Instant::now();
        let e = p.lock_for(b"a", 2, LockMode::Exclusive, s(20)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::LockWaitTimeout);
        assert!(t.elapsed() < s(5), "{:?}", t.elapsed());
        assert!(!older.is_finished());
        // The younger one rolls back; the older one gets its lock.
        p.unlock_for(b"b", 2);
        assert!(older.await.unwrap().unwrap());
        // Another client's transaction has no age order with these: it waits the whole time.
        let other_client = (7 << 32) | 1;
        let t = std::time::Instant::now();
        let e = p.lock_for(b"a", other_client, LockMode::Exclusive, Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::LockWaitTimeout);
        assert!(t.elapsed() >= Duration::from_millis(250), "{:?}", t.elapsed());
    }

    #[tokio::test]
    async fn waiter_gets_lock_on_release() {
        let p = Arc::new(Partition::new(1, 0, MemoryBudget::new(1 << 20)));
        let g = p.lock_row(b"k", Duration::from_millis(10)).await.unwrap();
        let p2 = p.clone();
        let waiter = tokio::spawn(async move { p2.lock_row(b"k", Duration::from_secs(5)).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(g);
        waiter.await.unwrap().unwrap();
    }

    #[test]
    fn inflight_tracks_epochs() {
        let p = Partition::new(1, 0, MemoryBudget::new(1 << 20));
        assert!(p.writes_before_drained(5));
        let g = p.enter_write(3);
        assert!(!p.writes_before_drained(5));
        assert!(p.writes_before_drained(3));
        drop(g);
        assert!(p.writes_before_drained(5));
    }
}

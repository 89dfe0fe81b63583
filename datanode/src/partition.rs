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
    }

    pub async fn lock_row(&self, key: &[u8], wait: Duration) -> Result<RowGuard<'_>, ShoalError> {
        self.locks.lock(key, wait).await
    }

    pub fn enter_write(&self, epoch: Epoch) -> InflightGuard<'_> {
        *self.inflight.lock().entry(epoch).or_default() += 1;
        InflightGuard { part: self, epoch }
    }

    /// Whether every write still in flight chose its replicas from a map of at least `epoch`.
    pub fn writes_before_drained(&self, epoch: Epoch) -> bool {
        self.inflight.lock().keys().next().is_none_or(|&e| e >= epoch)
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

/// Exclusive row locks held by a primary from the read of a row's current image until every
/// replica has the new one, so two writes to one row are never in flight at once.
#[derive(Default)]
struct RowLocks {
    held: Mutex<HashMap<Box<[u8]>, Arc<Notify>>>,
}

pub struct RowGuard<'a> {
    locks: &'a RowLocks,
    key: Box<[u8]>,
}

impl RowLocks {
    async fn lock(&self, key: &[u8], wait: Duration) -> Result<RowGuard<'_>, ShoalError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notify = {
                let mut held = self.held.lock();
                match held.get(key) {
                    None => {
                        held.insert(key.into(), Arc::new(Notify::new()));
                        return Ok(RowGuard { locks: self, key: key.into() });
                    }
                    Some(n) => n.clone(),
                }
            };
            // Register before re-checking, so a release between the check and the wait is seen.
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.held.lock().get(key).is_some_and(|n| Arc::ptr_eq(n, &notify)) {
                continue;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(ShoalError::new(ErrorCode::Timeout, "row lock wait timed out"));
            }
        }
    }
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.locks.held.lock().remove(&self.key) {
            n.notify_waiters();
        }
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

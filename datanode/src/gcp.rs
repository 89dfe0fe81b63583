//! The data node's side of global checkpoints (DESIGN §2, §4 "Durability"): the GCI clock that
//! stamps every commit, and the three steps the mgmd leader drives on every live node.
//!
//! 1. PREPARE(g+1): hold commits that have not been stamped yet.
//! 2. COMMIT(g+1): stamp new commits with g+1, release the held ones, and answer once every
//!    commit stamped ≤ g has finished (is applied and logged on every replica).
//! 3. FLUSH(g): append the marker of g to the redo log and fsync it.
//!
//! Then mgmd records g complete. Holding commits between PREPARE and COMMIT is what makes the
//! checkpoint a consistent cut: once any node stamps g+1, no node stamps g any more, so a
//! commit that could have seen another's effects never lands in an older checkpoint than it.
//! The hold lasts one round trip from mgmd; if mgmd vanishes in between, the node releases it
//! by itself after `MAX_HOLD`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_proto::{ErrorCode, ShoalError};
use tokio::sync::Notify;

/// Commits in flight are counted per GCI in this many slots (GCI mod SLOTS); only two or
/// three GCIs are ever in flight at once.
const SLOTS: usize = 8;
/// Longest a PREPARE holds commits without its COMMIT or ABORT.
pub const MAX_HOLD: Duration = Duration::from_secs(3);
/// Longest COMMIT waits for older commits to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a commit waits for the node's first usable GCI before it fails (retriably).
const NOT_JOINED_PATIENCE: Duration = Duration::from_secs(1);

pub struct GciClock {
    /// GCI stamped on new commits; 0 until the node learns one (it then refuses writes).
    current: AtomicU64,
    held: AtomicBool,
    held_since: Mutex<Option<Instant>>,
    released: Notify,
    in_flight: [AtomicU64; SLOTS],
    /// Lowest GCI this node may stamp: above what a system restart of its group rolled back.
    floor: AtomicU64,
}

/// A commit's GCI; the commit counts as in flight until this is dropped.
pub struct Stamp<'a> {
    clock: &'a GciClock,
    pub gci: u64,
}

impl Drop for Stamp<'_> {
    fn drop(&mut self) {
        self.clock.in_flight[self.gci as usize % SLOTS].fetch_sub(1, SeqCst);
    }
}

impl Default for GciClock {
    fn default() -> Self {
        GciClock::new(0)
    }
}

impl GciClock {
    pub fn new(start: u64) -> GciClock {
        GciClock {
            current: AtomicU64::new(start),
            held: AtomicBool::new(false),
            held_since: Mutex::new(None),
            released: Notify::new(),
            in_flight: Default::default(),
            floor: AtomicU64::new(0),
        }
    }

    pub fn current(&self) -> u64 {
        self.current.load(SeqCst)
    }

    /// Stamps a commit with the current GCI, waiting while a checkpoint switch holds commits.
    pub async fn stamp(&self) -> Result<Stamp<'_>, ShoalError> {
        // A node that just started (or restarted behind a rolled-back range) gets a usable GCI
        // within a checkpoint interval or two: wait that long rather than fail the commit.
        let patience = tokio::time::Instant::now() + NOT_JOINED_PATIENCE;
        loop {
            if self.held.load(SeqCst) {
                let notified = self.released.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.held.load(SeqCst) {
                    if tokio::time::timeout(Duration::from_millis(20), notified).await.is_err() {
                        self.release_if_stuck();
                    }
                    continue;
                }
            }
            let g = self.current.load(SeqCst);
            if (g == 0 || g < self.floor.load(SeqCst)) && tokio::time::Instant::now() < patience {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            if g == 0 {
                return Err(ShoalError::new(ErrorCode::NodeNotReady, "node has not joined a global checkpoint yet"));
            }
            if g < self.floor.load(SeqCst) {
                return Err(ShoalError::new(
                    ErrorCode::NodeNotReady,
                    "waiting for a global checkpoint above the ones a system restart rolled back",
                ));
            }
            // Count first, then check the GCI did not move: a COMMIT that switched in between
            // either sees this count while it drains, or this commit retries with the new GCI.
            self.in_flight[g as usize % SLOTS].fetch_add(1, SeqCst);
            if self.current.load(SeqCst) == g {
                return Ok(Stamp { clock: self, gci: g });
            }
            self.in_flight[g as usize % SLOTS].fetch_sub(1, SeqCst);
        }
    }

    fn release_if_stuck(&self) {
        let mut since = self.held_since.lock();
        if since.is_some_and(|t| t.elapsed() >= MAX_HOLD) {
            tracing::warn!("global checkpoint switch held commits for {MAX_HOLD:?} without a commit: releasing them");
            *since = None;
            self.held.store(false, SeqCst);
            self.released.notify_waiters();
        }
    }

    /// Raises the lowest GCI this node may stamp.
    pub fn raise_floor(&self, floor: u64) {
        self.floor.fetch_max(floor, SeqCst);
    }

    pub fn prepare(&self) {
        *self.held_since.lock() = Some(Instant::now());
        self.held.store(true, SeqCst);
    }

    pub fn abort(&self) {
        *self.held_since.lock() = None;
        self.held.store(false, SeqCst);
        self.released.notify_waiters();
    }

    /// Switches to `gci` (never backwards), releases held commits, and waits until every
    /// commit stamped with an older GCI has finished.
    pub async fn commit(&self, gci: u64) -> Result<(), ShoalError> {
        let now = self.current.fetch_max(gci, SeqCst).max(gci);
        self.abort();
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            let busy = (0..SLOTS).filter(|&s| s != now as usize % SLOTS).any(|s| self.in_flight[s].load(SeqCst) > 0);
            if !busy {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ShoalError::new(
                    ErrorCode::Timeout,
                    "commits of the previous global checkpoint did not finish",
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stamps_follow_the_switch_and_commit_waits_for_older_ones() {
        let c = std::sync::Arc::new(GciClock::new(0));
        assert_eq!(c.stamp().await.err().unwrap().code, ErrorCode::NodeNotReady);
        c.commit(5).await.unwrap();
        let old = c.stamp().await.unwrap();
        assert_eq!(old.gci, 5);
        c.prepare();
        // Held: a new commit waits for the switch.
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.stamp().await.map(|s| s.gci) });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished());
        // COMMIT releases it with the new GCI, and waits for the commit stamped 5.
        let c3 = c.clone();
        let switch = tokio::spawn(async move { c3.commit(6).await });
        assert_eq!(waiter.await.unwrap().unwrap(), 6);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!switch.is_finished(), "commit must wait for the older stamp");
        drop(old);
        switch.await.unwrap().unwrap();
        // Never backwards.
        c.commit(3).await.unwrap();
        assert_eq!(c.current(), 6);
    }
}

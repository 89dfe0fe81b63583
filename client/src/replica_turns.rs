//! Whether a client's reads that may go to any replica of a node group take turns between the
//! replicas or keep to the client's home replica — decided by measuring which reads more, the
//! way the data nodes decide whether to spin (`shoal_proto::spin`).
//!
//! Neither wins on every machine. A lone caller (one call at a time, `shoal bench kv` with one
//! client) read a third slower at one replica than taking turns on a host whose idle CPUs polled
//! (benchmarks.md, "Twenty-fifth session"): each data node then had a round trip's time to
//! finish its part while the other answered. On hosts whose idle CPUs halt, where waking one
//! goes through the hypervisor, it read 40% *faster* at one replica (benchmarks.md,
//! "Forty-seventh session"): the load generator and one data node keep to their CPUs, and no
//! call has to wake a data node that slept through the other's turn. A client with
//! `ClientOptions::home_replica` (the SQL node) keeps to its home replica always and does not
//! probe.
//!
//! Time is cut into slots of [`SLOT`]. Each cycle of [`CYCLE_SLOTS`] begins with a probe of
//! [`PROBE_SLOTS`] slots, turns and home in alternation, counting the keys the client read in
//! each; if home read [`DECISIVE`] more than turns, the rest of the cycle keeps home, otherwise
//! it takes turns. A client that idled through a whole slot starts a new cycle when it reads
//! again, so that an idle gap does not count as a slow slot.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// One slot of the probe, and the unit of the cycle.
const SLOT: Duration = Duration::from_millis(50);
/// Slots at the start of each cycle that probe: turns in the even ones, home in the odd ones.
const PROBE_SLOTS: u64 = 4;
/// Slots per cycle (2 s): the probe, then its verdict.
const CYCLE_SLOTS: u64 = 40;
/// How many more keys home must read than turns for the cycle to keep home. Where neither wins
/// by much, slots differ by several percent from the machine's noise alone; at 3% the probe
/// picked home now and then where taking turns read more (16 clients' 16-key reads: −5%).
const DECISIVE: f64 = 0.1;
/// Keys below which a probe's half says nothing (too few calls to compare): turns.
const PROBE_MIN_KEYS: u64 = 200;

/// The measuring state, shared by every caller of one client.
pub struct ReplicaTurns {
    /// Whether reads starting now keep to the home replica.
    home: AtomicBool,
    /// Keys read since the current slot began.
    keys: AtomicU64,
    /// When the current slot ends, in nanoseconds since `origin`: read by every call, the lock
    /// taken only by the one that finds it passed.
    slot_end: AtomicU64,
    origin: Instant,
    steer: Mutex<Steer>,
}

/// The cycle's progress.
#[derive(Debug, Default)]
struct Steer {
    /// Slots since the cycle began.
    slot: u64,
    /// Keys read in the probe's turns slots and home slots.
    turns: u64,
    home: u64,
}

impl Default for ReplicaTurns {
    fn default() -> Self {
        ReplicaTurns {
            home: AtomicBool::new(false),
            keys: AtomicU64::new(0),
            slot_end: AtomicU64::new(nanos(SLOT)),
            origin: Instant::now(),
            steer: Mutex::new(Steer::default()),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl ReplicaTurns {
    /// Whether a read of `keys` keys starting now keeps to the home replica; counts them in the
    /// slot it starts in (in a closed loop the calls a slot starts are those its answers let
    /// start, so starts measure the rate as well as completions and need no second call).
    pub fn home_for(&self, keys: usize) -> bool {
        self.keys.fetch_add(keys as u64, Ordering::Relaxed);
        let now = nanos(self.origin.elapsed());
        if now >= self.slot_end.load(Ordering::Relaxed) {
            if let Some(mut steer) = self.steer.try_lock() {
                self.next_slot(&mut steer, now);
            }
        }
        self.home.load(Ordering::Relaxed)
    }

    /// Ends the slot that ended by `now` (nanoseconds since `origin`), under the lock.
    fn next_slot(&self, steer: &mut Steer, now: u64) {
        let end = self.slot_end.load(Ordering::Relaxed);
        if now < end {
            return; // another caller moved on meanwhile
        }
        let keys = self.keys.swap(0, Ordering::Relaxed);
        let slot = nanos(SLOT);
        let home = if now - end >= slot {
            // Idle for a whole slot or more: what was counted says nothing about speed.
            *steer = Steer::default();
            false
        } else {
            // The slot ends when a call finds it over, a little after its end: per slot's length.
            let window = now - (end - slot);
            steer.step((u128::from(keys) * u128::from(slot) / u128::from(window.max(1))) as u64)
        };
        self.home.store(home, Ordering::Relaxed);
        self.slot_end.store(now + slot, Ordering::Relaxed);
    }
}

impl Steer {
    /// Counts `keys`, read in the slot that just ended, and says whether the next slot keeps
    /// to the home replica.
    fn step(&mut self, keys: u64) -> bool {
        if self.slot < PROBE_SLOTS {
            *(if self.slot.is_multiple_of(2) { &mut self.turns } else { &mut self.home }) += keys;
        }
        self.slot = (self.slot + 1) % CYCLE_SLOTS;
        if self.slot == 0 {
            (self.turns, self.home) = (0, 0);
        }
        if self.slot < PROBE_SLOTS {
            return !self.slot.is_multiple_of(2);
        }
        if self.slot == PROBE_SLOTS {
            tracing::debug!(turns = self.turns, home = self.home, "probe of reads at the home replica");
        }
        home_wins(self.turns, self.home)
    }
}

/// The probe's verdict from the keys read taking turns and at home.
fn home_wins(turns: u64, home: u64) -> bool {
    home.max(turns) >= PROBE_MIN_KEYS && home as f64 > turns as f64 * (1.0 + DECISIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `steer` through a whole cycle whose probe slots read `turns` and `home` keys each,
    /// returning the mode of every slot after the first.
    fn cycle(steer: &mut Steer, turns: u64, home: u64) -> Vec<bool> {
        (0..CYCLE_SLOTS)
            .map(|slot| {
                let probing = steer.slot < PROBE_SLOTS;
                let keys = if probing && slot % 2 == 1 { home } else { turns };
                steer.step(keys)
            })
            .collect()
    }

    #[test]
    fn keeps_home_only_where_it_read_decisively_more() {
        let mut steer = Steer::default();
        let modes = cycle(&mut steer, 1000, 1400);
        // Probe: turns, home, turns (the first slot, turns, is before the first step).
        assert_eq!(&modes[..3], &[true, false, true]);
        assert!(modes[3..CYCLE_SLOTS as usize - 1].iter().all(|&h| h), "home wins: {modes:?}");
        // The last step begins the next cycle, which probes again from turns.
        assert!(!modes[CYCLE_SLOTS as usize - 1]);

        let mut steer = Steer::default();
        let modes = cycle(&mut steer, 1000, 1080);
        assert!(modes[3..].iter().all(|&h| !h), "within the noise: turns");
        let mut steer = Steer::default();
        let modes = cycle(&mut steer, 1000, 600);
        assert!(modes[3..].iter().all(|&h| !h), "turns win");
    }

    #[test]
    fn too_few_reads_say_nothing() {
        assert!(!home_wins(10, 90));
        assert!(home_wins(1000, 1200));
        assert!(!home_wins(1000, 1050));
        assert!(!home_wins(0, 0));
    }

    #[test]
    fn an_idle_slot_restarts_the_cycle() {
        let t = ReplicaTurns::default();
        let slot = nanos(SLOT);
        // Probe slot 1 (home) begins after a busy first slot.
        t.keys.store(500, Ordering::Relaxed);
        t.next_slot(&mut t.steer.lock(), slot + 1);
        assert!(t.home.load(Ordering::Relaxed));
        assert_eq!(t.steer.lock().slot, 1);
        // Then nothing for three slots: back to the start, taking turns.
        t.next_slot(&mut t.steer.lock(), 5 * slot);
        assert!(!t.home.load(Ordering::Relaxed));
        assert_eq!(t.steer.lock().slot, 0);
    }
}

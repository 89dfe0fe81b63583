//! Idle CPUs that poll instead of halting while a node is busy (`poll_idle_cpus` of a
//! `[[datanode]]` or `[[sqlnode]]`).
//!
//! Every message between Shoal's processes wakes a thread that sleeps, and when that thread's
//! CPU has gone idle, the CPU has halted: the kernel must send it an interrupt, and on a
//! virtual machine the hypervisor must resume the virtual CPU, before the thread runs. On the
//! 2-vCPU hosts the benchmarks run on, sysbench point selects at 16 threads left each CPU idle
//! 13% of the time in about 3,000 halts a second of 41 µs each; MariaDB, with a thread per
//! connection, keeps both CPUs busy and halts almost never (benchmarks.md, "Forty-fifth
//! session"). The spinning in `crate::spin` covers the thread that spins, not the CPU a woken
//! thread lands on.
//!
//! So while the node is busy it asks Linux for a CPU latency of 0 µs (the PM QoS request of
//! `/dev/cpu_dma_latency`, as `tuned`'s latency-performance profile makes): the cpuidle
//! governor then keeps idle CPUs in the polling state, where a wake-up needs no interrupt. The
//! request holds while the file stays open, and the kernel takes the lowest of all open
//! requests, so several nodes on one machine may each hold one. It costs power: an idle CPU
//! spins instead of sleeping, so it is held only while the node gets work ([`BUSY_MESSAGES`]
//! per [`PERIOD`]) and let go after [`QUIET_PERIODS`] without. Opening the device needs write
//! access to it (root, by default); where it cannot be opened, as in most containers, the node
//! says so once and runs as before.

use std::fs::File;
use std::io::Write;
use std::time::Duration;

/// The kernel's CPU latency request device.
const DEVICE: &str = "/dev/cpu_dma_latency";
/// How often the node's work is looked at.
pub const PERIOD: Duration = Duration::from_millis(100);
/// Messages per period (client requests, peers' answers: `spin::note_work`) from which the
/// node counts as busy: 2,000 a second. A person at a `mysql` prompt stays under it; one
/// sysbench thread (about 20,000 a second) is far above.
pub const BUSY_MESSAGES: u64 = 200;
/// Quiet periods before the request is let go: a pause of a second between bursts keeps it.
pub const QUIET_PERIODS: u32 = 10;

/// Whether the request should be held, from the messages of each period: from a busy period
/// until [`QUIET_PERIODS`] quiet ones have followed it.
#[derive(Debug)]
pub struct Gate {
    /// Quiet periods since the last busy one.
    quiet: u32,
}

impl Default for Gate {
    /// Quiet from the start: nothing held until the first busy period.
    fn default() -> Gate {
        Gate { quiet: QUIET_PERIODS }
    }
}

impl Gate {
    pub fn wants_held(&mut self, messages: u64) -> bool {
        self.quiet = if messages >= BUSY_MESSAGES { 0 } else { self.quiet.saturating_add(1) };
        self.quiet < QUIET_PERIODS
    }
}

/// Holds the request while the process is busy, for as long as the runtime runs (each node
/// spawns it once). Returns when the device cannot be opened.
pub async fn while_busy() {
    let mut gate = Gate::default();
    let mut held: Option<File> = None;
    let mut seen = crate::spin::work_so_far();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = crate::spin::work_so_far();
        let want = gate.wants_held(now.wrapping_sub(seen));
        seen = now;
        match (want, held.is_some()) {
            (true, false) => match request_zero_latency() {
                Ok(f) => {
                    held = Some(f);
                    tracing::debug!("busy: idle CPUs poll instead of halting");
                }
                Err(e) => {
                    tracing::info!("idle CPUs keep halting while this node is busy: cannot write {DEVICE}: {e}");
                    return;
                }
            },
            (false, true) => {
                held = None;
                tracing::debug!("quiet: idle CPUs may halt again");
            }
            _ => {}
        }
    }
}

fn request_zero_latency() -> std::io::Result<File> {
    let mut f = File::options().write(true).open(DEVICE)?;
    // The device takes the latency in µs as a native-endian 32-bit integer.
    f.write_all(&0i32.to_ne_bytes())?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_from_the_first_busy_period_and_lets_go_after_the_quiet_ones() {
        let mut g = Gate::default();
        assert!(!g.wants_held(0));
        assert!(!g.wants_held(BUSY_MESSAGES - 1));
        assert!(g.wants_held(BUSY_MESSAGES));
        assert!(g.wants_held(5_000));
        // A pause shorter than the quiet periods keeps it, and starts the count again.
        for _ in 1..QUIET_PERIODS {
            assert!(g.wants_held(3));
        }
        assert!(g.wants_held(BUSY_MESSAGES));
        for _ in 1..QUIET_PERIODS {
            assert!(g.wants_held(0));
        }
        assert!(!g.wants_held(0), "let go after the quiet periods");
        assert!(!g.wants_held(0));
        assert!(g.wants_held(BUSY_MESSAGES), "held again");
    }
}

//! Spinning before a node's thread sleeps (`spin_us` of a `[[sqlnode]]` or `[[datanode]]`).
//!
//! A runtime thread that runs out of work sleeps in `epoll_wait`, and the next message must
//! wake it: the sender pays for the wake-up in the kernel, and on a virtual machine waking an
//! idle CPU goes through the hypervisor. With a window set, the thread keeps polling its
//! sockets for that long after it last had work (`yield_now` makes the scheduler poll the I/O
//! driver without blocking), so a message that arrives meanwhile is picked up where it lands —
//! the "spin before sleep" of NDB's and RonDB's data node threads. It burns the CPU it spins
//! on, at most the window after each burst of work.
//!
//! The SQL node spins by default: every statement crosses it twice (the client's request on
//! its way to the data nodes, their answer on its way back). On 2 cores, sysbench
//! `oltp_read_write` at 16 threads left 12% of the machine idle without it and 7% with it (2%
//! more transactions by the median of five alternated rounds, 0–11% per round), and one
//! thread ran 40–55% more point selects. Data nodes spin only when
//! configured: on 2 cores theirs took CPU from the SQL node, and point selects at 16 threads
//! lost more than a quarter, while key-value writes gained a third (benchmarks.md,
//! "Twenty-third session").

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Messages received in this process (see [`note_work`]).
static WORK: AtomicU64 = AtomicU64::new(0);

/// Notes that a message arrived (a client's request, a data node's answer): a spinning thread
/// restarts its window. Costs one atomic add where nothing spins.
#[inline]
pub fn note_work() {
    WORK.fetch_add(1, Ordering::Relaxed);
}

/// Builds a node's runtime (all drivers enabled) that spins `spin_us` microseconds before it
/// sleeps (0: never).
pub fn build(mut builder: tokio::runtime::Builder, spin_us: u32) -> std::io::Result<tokio::runtime::Runtime> {
    let spinner = (spin_us > 0).then(|| arm(&mut builder, Duration::from_micros(spin_us.into())));
    let rt = builder.enable_all().build()?;
    if let Some(s) = spinner {
        rt.spawn(s);
    }
    Ok(rt)
}

/// Arms `builder` to spin for `window` after each wake-up and after each message noted
/// meanwhile ([`note_work`]); returns the spinner, to be spawned on the built runtime.
fn arm(builder: &mut tokio::runtime::Builder, window: Duration) -> impl Future<Output = ()> + Send + 'static {
    let woken = Arc::new(Notify::new());
    let notify = woken.clone();
    // Called when the thread comes back from a real sleep, not after the spinner's own
    // non-blocking polls.
    builder.on_thread_unpark(move || notify.notify_one());
    spinner(woken, window)
}

async fn spinner(woken: Arc<Notify>, window: Duration) {
    loop {
        woken.notified().await;
        let mut until = Instant::now() + window;
        let mut seen = WORK.load(Ordering::Relaxed);
        loop {
            tokio::task::yield_now().await;
            let now = Instant::now();
            let work = WORK.load(Ordering::Relaxed);
            if work != seen {
                seen = work;
                until = now + window;
            } else if now >= until {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU time this thread has used.
    fn thread_cpu() -> Duration {
        // SAFETY: getrusage only writes the struct it is given.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) }, 0);
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        tv(r.ru_utime) + tv(r.ru_stime)
    }

    /// One test for both: messages count process-wide, so two tests at once would mix.
    #[test]
    fn spins_after_wake_ups_and_messages_then_sleeps() {
        let mut builder = tokio::runtime::Builder::new_current_thread();
        let spinner = arm(&mut builder, Duration::from_millis(20));
        let rt = builder.enable_all().build().unwrap();
        rt.spawn(spinner);

        // Ten wake-ups 40 ms apart: each is followed by 20 ms of spinning, then sleep.
        let before = thread_cpu();
        rt.block_on(async {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        });
        let used = thread_cpu() - before;
        // About 200 ms spinning of 400 ms; a spinner that never stopped would use all 400.
        assert!(used >= Duration::from_millis(50), "spun only {used:?}");
        assert!(used <= Duration::from_millis(330), "spun {used:?}: it did not stop");

        // A message noted every 10 ms from another thread keeps the window open.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let noter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    note_work();
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        let before = thread_cpu();
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(300)).await });
        let used = thread_cpu() - before;
        stop.store(true, Ordering::Relaxed);
        noter.join().unwrap();
        assert!(used >= Duration::from_millis(120), "spun only {used:?} of 300 ms with messages arriving");
    }
}

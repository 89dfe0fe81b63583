//! Spinning before a node's thread sleeps: after its work (`spin_us` of a `[[sqlnode]]` or
//! `[[datanode]]`), and while it awaits a peer (`await_spin_us` of a `[[datanode]]`).
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
//! thread ran 40–55% more point selects. Since the thirty-third session it spins only where
//! it pays, gated as the data nodes' spinning after work is (below; the work a probe compares
//! is the bytes of its clients' packets): with a thousand sysbench connections and the
//! machine saturated, spinning took CPU from the work: gated, point selects at 1024 threads
//! ran 7% and 35% more than always spinning (two alternated rounds), as many at 1 and 16
//! threads, and `oltp_read_write` at 16 threads as many (benchmarks.md, "Thirty-third
//! session"). One `steer` serves every runtime of a process.
//!
//! **Data nodes after their work.** Data nodes spin after their work too, but only where it
//! pays (`steer`): each cycle of `CYCLE_SLOTS` starts with a probe that turns spinning on
//! and off in turns and keeps it the way that brought the node more work; where the probe
//! cannot tell, they spin while Linux's CPU pressure (`/proc/pressure/cpu`, "some") stayed
//! under [`AFTER_WORK_SHARE`] over the last [`PRESSURE_PERIOD`]. They give the CPU away
//! (`sched_yield`) every few turns. Spinning always, on 2 cores, took CPU from the SQL node:
//! point selects at 16 threads lost more than a quarter (benchmarks.md, "Twenty-third
//! session"). Gated by the pressure, one client's key-value writes ran 2.4 times as fast (and
//! one sysbench thread's point selects 2.3 times) with point selects at 16 threads even
//! (benchmarks.md, "Twenty-ninth session"); with the probe, key-value writes at 16 clients
//! ran 12–28% faster again, sysbench even (benchmarks.md, "Thirtieth session").
//!
//! **Awaiting a peer.** A data node that sent a write to its backups (or a transaction step to
//! another node) knows an answer is coming within a round trip; sleeping meanwhile costs a
//! wake-up on each side, and a key-value write makes four such hops. So a data node spins while
//! it awaits a peer ([`awaiting`]), giving the CPU away (`sched_yield`) every few turns so the
//! peer it waits for runs first when the scheduler put both on one CPU. It does so up to a
//! higher pressure than after its work ([`CONTENDED_SHARE`]), since an answer is sure to come;
//! above it, spinning takes CPU from work that is there — sysbench
//! `oltp_read_write` at 16 threads lost 13–16% with data nodes spinning while they awaited
//! their backups, and its pressure is about 50%, against 23–26% for key-value writes at 16
//! clients, which gained 35–45% (benchmarks.md, "Twenty-eighth session").

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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

/// Messages received in this process so far ([`note_work`]).
pub fn work_so_far() -> u64 {
    WORK.load(Ordering::Relaxed)
}

/// Bytes of calls this process served (see [`note_load`]).
static LOAD: AtomicU64 = AtomicU64::new(0);

/// Notes that a call of `bytes` (encoded) arrived to be served: the probe of spinning after
/// work (`steer`) compares these, not the messages, because a node that answers sooner gets
/// the same work in more, smaller batches (its callers merge what queued meanwhile).
#[inline]
pub fn note_load(bytes: usize) {
    LOAD.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// How a node's runtime spins (see the module comment). Microseconds; 0 turns a kind off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spinning {
    /// Polling after each burst of work before the thread sleeps.
    pub after_work_us: u32,
    /// Spin after work only where it pays (`steer`), as the nodes do.
    pub after_work_gated: bool,
    /// Polling, without a message, while the process awaits a peer's answer (gated by
    /// [`CONTENDED_SHARE`]).
    pub await_us: u32,
}

/// Builds a node's runtime (all drivers enabled) that spins as `spin` says.
pub fn build(mut builder: tokio::runtime::Builder, spin: Spinning) -> std::io::Result<tokio::runtime::Runtime> {
    let spinner = arm(&mut builder, spin);
    let rt = builder.enable_all().build()?;
    if let Some(s) = spinner {
        rt.spawn(s);
    }
    let probe = spin.after_work_us > 0 && spin.after_work_gated;
    if spin.await_us > 0 || probe {
        rt.spawn(steer(probe));
    }
    Ok(rt)
}

/// Answers this process awaits from its peers (see [`awaiting`]).
static AWAITING: AtomicUsize = AtomicUsize::new(0);
/// Wakes the runtime's spinner when the first answer is awaited (see [`awaiting`]).
static AWAIT_WOKEN: Notify = Notify::const_new();
/// The machine's CPU pressure over the last [`PRESSURE_PERIOD`], in thousandths of the time
/// some task waited for a CPU (see the module comment). [`UNKNOWN`] until measured, and where
/// the kernel does not report pressure; only [`steer`], which runs beside the spinners that
/// read it, sets it.
static PRESSURE: AtomicU32 = AtomicU32::new(UNKNOWN);
const UNKNOWN: u32 = u32::MAX;

/// The share of time with some task waiting for a CPU above which awaiting does not spin.
pub const CONTENDED_SHARE: f64 = 0.4;
/// The share above which a data node does not spin after its work. Lower than for awaiting: a
/// thread that spins after its work does not know an answer is coming, and spinning raises
/// the pressure it reads. At 40%, sysbench point selects at 16 threads (about 35–39% without
/// it) lost 7%; at 30% they ran even (benchmarks.md, "Twenty-ninth session").
pub const AFTER_WORK_SHARE: f64 = 0.3;
/// How often the CPU pressure is read.
pub const PRESSURE_PERIOD: Duration = Duration::from_millis(100);

/// Whether the CPU pressure over the last period was under `share`.
fn room_under(share: f64) -> bool {
    let p = PRESSURE.load(Ordering::Relaxed);
    p != UNKNOWN && f64::from(p) < share * 1000.0
}

/// Held while this process awaits an answer from a peer: the spinner, if the runtime has an
/// await window, keeps the thread polling until every such answer is in, or its window passes
/// without a message.
#[must_use]
pub struct Awaiting(());

pub fn awaiting() -> Awaiting {
    if AWAITING.fetch_add(1, Ordering::Relaxed) == 0 && room_under(CONTENDED_SHARE) {
        AWAIT_WOKEN.notify_one();
    }
    Awaiting(())
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        AWAITING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether a gated spinner spins after its work in the current slot; set by [`steer`].
static AFTER_WORK_ON: AtomicBool = AtomicBool::new(false);
/// Whether a [`steer`] runs in this process.
static STEERING: AtomicBool = AtomicBool::new(false);

/// Held by the running [`steer`]; another may start once it ends (its runtime shut down).
struct Steering;

impl Drop for Steering {
    fn drop(&mut self) {
        STEERING.store(false, Ordering::Relaxed);
    }
}

/// Slots at the start of each cycle that probe whether spinning after work helps: it is on in
/// the even ones and off in the odd ones, whatever the pressure.
const PROBE_SLOTS: u64 = 4;
/// Slots per cycle: the probe, then its verdict for the rest of the cycle. A longer cycle
/// spends less time in the probe's losing half, and follows a change of load later.
const CYCLE_SLOTS: u64 = 40;
/// How much more (or less) work the probe's spinning half must see for a verdict.
const DECISIVE: f64 = 0.03;
/// Bytes of calls below which a probe half says nothing: too little work to tell.
const PROBE_MIN_LOAD: f64 = 16_384.0;

/// What a probe found spinning after work does to this process's rate of work (bytes of
/// calls served, [`note_load`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Helps,
    Hurts,
    Unclear,
}

/// The verdict from the bytes of calls served in the probe's spinning and sleeping halves.
fn verdict(spinning: f64, sleeping: f64) -> Verdict {
    if spinning.max(sleeping) < PROBE_MIN_LOAD {
        Verdict::Unclear
    } else if spinning > sleeping * (1.0 + DECISIVE) {
        Verdict::Helps
    } else if spinning < sleeping * (1.0 - DECISIVE) {
        Verdict::Hurts
    } else {
        Verdict::Unclear
    }
}

/// Whether to spin after work in slot `slot` of a cycle, given the cycle's verdict so far and
/// whether the pressure is under [`AFTER_WORK_SHARE`]. A probe runs only where the pressure
/// left room for awaiting ([`CONTENDED_SHARE`]) when its cycle began.
fn after_work_on(slot: u64, probing: bool, verdict: Verdict, room: bool) -> bool {
    if probing && slot < PROBE_SLOTS {
        return slot.is_multiple_of(2);
    }
    match verdict {
        Verdict::Helps => true,
        Verdict::Hurts => false,
        Verdict::Unclear => room,
    }
}

/// The current slot of [`PRESSURE_PERIOD`] by the wall clock, and the time to its end. By the
/// wall clock, so that the data nodes of a machine (or of NTP-synchronised machines) probe in
/// step: a write crosses both replicas, and one node's spinning shows in the other's rate.
fn wall_slot() -> (u64, Duration) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let period = PRESSURE_PERIOD.as_nanos();
    let slot = now.as_nanos() / period;
    let left = period - now.as_nanos() % period;
    (slot as u64, Duration::from_nanos(left as u64))
}

/// Reads the machine's CPU pressure every [`PRESSURE_PERIOD`] into [`PRESSURE`], and with
/// `probe`, decides for each slot whether gated spinners spin after work ([`AFTER_WORK_ON`]).
/// Ends at once, leaving the gated spinners idle, where the kernel does not report pressure.
///
/// Why probe: the pressure alone misleads. Without spinning, key-value writes at 16 clients
/// ran at 31–35% pressure with a fifth of the machine idle (wake-ups of sleeping threads count
/// as waiting for a CPU), with spinning at 27–29% and 15% faster; a limit of 30% holds either
/// state once in it. So each cycle starts with a probe that turns spinning on and off in
/// turns, compares the work the process got in either half (bytes of calls), and keeps what
/// brought more.
async fn steer(probe: bool) {
    // One per process: the pressure and the verdict are the process's, whatever number of
    // runtimes (the SQL node's workers) spin.
    if STEERING.swap(true, Ordering::Relaxed) {
        return;
    }
    let _steering = Steering;
    let Some(mut last) = cpu_pressure_us() else {
        tracing::debug!("no CPU pressure information (/proc/pressure/cpu): gated spinners do not spin");
        return;
    };
    let mut at = Instant::now();
    let mut seen = LOAD.load(Ordering::Relaxed);
    let (mut verdict, mut probing) = (Verdict::Unclear, false);
    let (mut spinning, mut sleeping) = (0.0, 0.0);
    let (mut slot, mut left) = wall_slot();
    loop {
        tokio::time::sleep(left).await;
        let (now_slot, now_left) = wall_slot();
        if now_slot == slot {
            // The wall clock runs a little slow against the timer's (NTP slewing it): the slot
            // has not ended yet.
            left = now_left;
            continue;
        }
        let Some(now) = cpu_pressure_us() else {
            AFTER_WORK_ON.store(false, Ordering::Relaxed);
            return;
        };
        let elapsed = at.elapsed();
        at = Instant::now();
        let share = now.saturating_sub(last) as f64 / (elapsed.as_micros() as f64).max(1.0);
        last = now;
        PRESSURE.store((share * 1000.0).min(1000.0) as u32, Ordering::Relaxed);
        let work = LOAD.load(Ordering::Relaxed);
        // Per period, in case the timer woke late.
        let got = work.wrapping_sub(seen) as f64 * PRESSURE_PERIOD.as_secs_f64() / elapsed.as_secs_f64().max(1e-3);
        seen = work;
        let ended = slot % CYCLE_SLOTS;
        if probing && ended < PROBE_SLOTS {
            *(if ended.is_multiple_of(2) { &mut spinning } else { &mut sleeping }) += got;
            if ended == PROBE_SLOTS - 1 {
                verdict = self::verdict(spinning, sleeping);
                tracing::debug!(spinning, sleeping, ?verdict, "probe of spinning after work");
                (spinning, sleeping) = (0.0, 0.0);
            }
        }
        (slot, left) = (now_slot, now_left);
        let next = slot % CYCLE_SLOTS;
        if next == 0 {
            probing = probe && room_under(CONTENDED_SHARE);
            verdict = Verdict::Unclear;
        }
        let on = probe && after_work_on(next, probing, verdict, room_under(AFTER_WORK_SHARE));
        AFTER_WORK_ON.store(on, Ordering::Relaxed);
    }
}

/// Microseconds so far in which some task waited for a CPU: `total` of the `some` line of
/// `/proc/pressure/cpu`.
fn cpu_pressure_us() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    parse_pressure(&text)
}

fn parse_pressure(text: &str) -> Option<u64> {
    let some = text.lines().find(|l| l.starts_with("some "))?;
    some.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
}

/// Turns of a giving-way spin per `sched_yield`. The call enters the scheduler (about a fifth
/// of a data node's time under key-value writes at 16 clients when made in every turn), and a
/// peer the scheduler placed on the spinning thread's CPU still runs within a few turns: every
/// fourth turn gave 6–19% more key-value writes at 1 and 16 clients than every turn, every
/// sixteenth fewer at 1 and 64 (benchmarks.md, "Twenty-ninth session").
const YIELD_EVERY: u32 = 4;

/// Arms `builder` to spin as `spin` says; returns the spinner, to be spawned on the built
/// runtime, or `None` if it does not spin at all. One spinner serves both kinds of spinning, so
/// that a thread that has just worked while it awaits a peer polls its sockets once per turn,
/// not once for each reason.
fn arm(builder: &mut tokio::runtime::Builder, spin: Spinning) -> Option<impl Future<Output = ()> + Send + 'static> {
    if spin.after_work_us == 0 && spin.await_us == 0 {
        return None;
    }
    let woken = Arc::new(Notify::new());
    if spin.after_work_us > 0 {
        let notify = woken.clone();
        // Called when the thread comes back from a real sleep, not after the spinner's own
        // non-blocking polls.
        builder.on_thread_unpark(move || notify.notify_one());
    }
    Some(spinner(woken, spin))
}

async fn spinner(woken: Arc<Notify>, spin: Spinning) {
    // Gated spinners give the CPU away now and then.
    let give_way = spin.after_work_gated || spin.await_us > 0;
    loop {
        tokio::select! {
            () = woken.notified() => {}
            () = AWAIT_WOKEN.notified(), if spin.await_us > 0 => {}
        }
        spin_while(give_way, || window_now(spin)).await;
    }
}

/// How long the thread should now keep polling without a message, or `None` if it should
/// sleep: the await window while it awaits a peer and the CPUs have room
/// ([`CONTENDED_SHARE`]), else the after-work window (when gated, only while the CPUs have
/// room by the lower [`AFTER_WORK_SHARE`]).
fn window_now(spin: Spinning) -> Option<Duration> {
    let us = |n: u32| Duration::from_micros(n.into());
    if spin.await_us > 0 && AWAITING.load(Ordering::Relaxed) > 0 && room_under(CONTENDED_SHARE) {
        return Some(us(spin.await_us));
    }
    let after_work = spin.after_work_us > 0 && (!spin.after_work_gated || AFTER_WORK_ON.load(Ordering::Relaxed));
    after_work.then(|| us(spin.after_work_us))
}

/// Keeps the thread polling while `window()` gives a window and less than that has passed
/// since the last message noted ([`note_work`]) or the start; with `give_way`, it also gives
/// the CPU away every [`YIELD_EVERY`] turns.
async fn spin_while(give_way: bool, window: impl Fn() -> Option<Duration>) {
    let mut since = Instant::now();
    let mut seen = WORK.load(Ordering::Relaxed);
    let mut turn = 0u32;
    while let Some(window) = window() {
        tokio::task::yield_now().await;
        turn = turn.wrapping_add(1);
        if give_way && turn.is_multiple_of(YIELD_EVERY) {
            // SAFETY: sched_yield takes no arguments and cannot fail on Linux.
            unsafe { libc::sched_yield() };
        }
        let now = Instant::now();
        let work = WORK.load(Ordering::Relaxed);
        if work != seen {
            seen = work;
            since = now;
        } else if now.duration_since(since) >= window {
            break;
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

    /// A single-threaded runtime with the spinner `spin` asks for, but without [`steer`]: the
    /// tests set the pressure and whether to spin after work themselves.
    fn spinning_runtime(spin: Spinning) -> tokio::runtime::Runtime {
        let mut builder = tokio::runtime::Builder::new_current_thread();
        let spinner = arm(&mut builder, spin).expect("a window is set");
        let rt = builder.enable_all().build().unwrap();
        rt.spawn(spinner);
        rt
    }

    /// Ten wake-ups 40 ms apart of a runtime whose spinner after work has a 20 ms window:
    /// the CPU time the thread used.
    fn cpu_of_ten_wake_ups(gated: bool) -> Duration {
        let after_work = Spinning { after_work_us: 20_000, after_work_gated: gated, await_us: 0 };
        let rt = spinning_runtime(after_work);
        let before = thread_cpu();
        rt.block_on(async {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        });
        thread_cpu() - before
    }

    /// The CPU time `rt`'s thread uses over 100 ms with (`guard`) or without an [`Awaiting`]
    /// guard held, and 100 ms after.
    fn cpu_of_awaiting(rt: &tokio::runtime::Runtime, guard: bool) -> Duration {
        let before = thread_cpu();
        rt.block_on(async {
            let awaiting = guard.then(awaiting);
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(awaiting);
            // The spinner notices the guard is gone, and the thread sleeps.
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        thread_cpu() - before
    }

    /// While the CPUs have room, a thread holding an [`Awaiting`] guard spins (at most the
    /// window without a message); without a guard, or with the CPUs contended, it sleeps. A
    /// gated spinner after work spins only while [`steer`] turned it on. One test for both:
    /// what they read is process-wide.
    #[test]
    fn gated_spinners_spin_only_when_the_cpus_have_room() {
        let rt = spinning_runtime(Spinning { await_us: 200_000, ..Default::default() });
        let cpu_over = |guard: bool| cpu_of_awaiting(&rt, guard);
        PRESSURE.store(0, Ordering::Relaxed);
        AFTER_WORK_ON.store(true, Ordering::Relaxed);
        let spun = cpu_over(true);
        assert!(spun >= Duration::from_millis(40), "spun only {spun:?} of 100 ms awaiting");
        assert!(spun <= Duration::from_millis(170), "spun {spun:?}: it did not stop when the answer came");
        let idle = cpu_over(false);
        assert!(idle <= Duration::from_millis(30), "spun {idle:?} with nothing awaited");
        let room = cpu_of_ten_wake_ups(true);
        assert!(room >= Duration::from_millis(50), "gated, spun only {room:?} after work with the CPUs free");

        AFTER_WORK_ON.store(false, Ordering::Relaxed);
        PRESSURE.store((AFTER_WORK_SHARE * 1000.0) as u32 + 1, Ordering::Relaxed);
        let after_work = cpu_of_ten_wake_ups(true);
        assert!(after_work <= Duration::from_millis(30), "gated, spun {after_work:?} after work turned off");
        assert!(cpu_over(true) >= Duration::from_millis(40), "awaiting spins up to its own, higher limit");

        PRESSURE.store(1000, Ordering::Relaxed);
        let contended = cpu_over(true);
        assert!(contended <= Duration::from_millis(30), "spun {contended:?} with the CPUs contended");
        PRESSURE.store(UNKNOWN, Ordering::Relaxed);
        assert!(cpu_over(true) <= Duration::from_millis(30), "spun with the pressure unknown");
        // Only one runtime may listen for awaits at a time: the guard wakes one spinner.
        drop(rt);

        // A data node's runtime, with both windows, between the two limits and after work
        // turned off: it spins while it awaits a peer, not after its work alone.
        let both = spinning_runtime(Spinning { after_work_us: 20_000, after_work_gated: true, await_us: 200_000 });
        PRESSURE.store(((AFTER_WORK_SHARE + CONTENDED_SHARE) * 500.0) as u32, Ordering::Relaxed);
        let spun = cpu_of_awaiting(&both, true);
        assert!(spun >= Duration::from_millis(40), "both windows: spun only {spun:?} of 100 ms awaiting");
        let idle = cpu_of_awaiting(&both, false);
        assert!(idle <= Duration::from_millis(30), "both windows: spun {idle:?} after work over its limit");
        PRESSURE.store(UNKNOWN, Ordering::Relaxed);
        // Last: a running steer sets the process-wide state the checks above set by hand.
        check_one_steer_per_process();
        PRESSURE.store(UNKNOWN, Ordering::Relaxed);
        AFTER_WORK_ON.store(false, Ordering::Relaxed);
    }

    #[test]
    fn a_probe_keeps_spinning_after_work_where_it_brought_more_work() {
        assert_eq!(verdict(100_000.0, 90_000.0), Verdict::Helps);
        assert_eq!(verdict(90_000.0, 100_000.0), Verdict::Hurts);
        assert_eq!(verdict(101_000.0, 100_000.0), Verdict::Unclear, "within the noise");
        assert_eq!(verdict(4_000.0, 1_000.0), Verdict::Unclear, "too little work to tell");
        // The probe turns spinning on and off in turns, whatever it found and the pressure.
        let probe: Vec<bool> = (0..PROBE_SLOTS).map(|s| after_work_on(s, true, Verdict::Hurts, false)).collect();
        assert_eq!(probe, [true, false, true, false]);
        // After it, its verdict holds; without one, the pressure decides.
        for room in [false, true] {
            assert!(after_work_on(PROBE_SLOTS, true, Verdict::Helps, room));
            assert!(!after_work_on(PROBE_SLOTS, true, Verdict::Hurts, room));
            assert_eq!(after_work_on(PROBE_SLOTS, true, Verdict::Unclear, room), room);
            // A cycle that began too contended to probe.
            assert_eq!(after_work_on(0, false, Verdict::Unclear, room), room);
        }
    }

    #[test]
    fn reads_the_some_total_of_cpu_pressure() {
        let text = "some avg10=13.67 avg60=27.20 avg300=15.55 total=175904149\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_pressure(text), Some(175_904_149));
        assert_eq!(parse_pressure("full avg10=0.00 total=5\n"), None);
        assert_eq!(parse_pressure("some avg10=0.00 total=x\n"), None);
    }

    /// One test for both: messages count process-wide, so two tests at once would mix.
    #[test]
    fn spins_after_wake_ups_and_messages_then_sleeps() {
        // Each wake-up is followed by 20 ms of spinning, then sleep: about 200 ms spinning of
        // 400 ms; a spinner that never stopped would use all 400.
        let used = cpu_of_ten_wake_ups(false);
        assert!(used >= Duration::from_millis(50), "spun only {used:?}");
        assert!(used <= Duration::from_millis(330), "spun {used:?}: it did not stop");

        let rt = spinning_runtime(Spinning { after_work_us: 20_000, ..Default::default() });
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

    /// The SQL node builds a runtime per worker, each spawning a `steer`: only one steers, and
    /// once its runtime is gone another may.
    fn check_one_steer_per_process() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let first = tokio::spawn(steer(false));
            tokio::task::yield_now().await;
            if first.is_finished() {
                // No /proc/pressure/cpu here: nothing steers at all.
                return;
            }
            let second = tokio::time::timeout(Duration::from_secs(5), steer(false)).await;
            assert!(second.is_ok(), "a second steer runs beside the first");
            first.abort();
            let _ = first.await;
            let third = tokio::time::timeout(Duration::from_millis(300), steer(false)).await;
            assert!(third.is_err(), "no steer runs after the first one ended");
        });
    }
}

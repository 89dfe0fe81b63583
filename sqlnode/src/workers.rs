//! The SQL node's workers: single-threaded runtimes, each on a thread of its own with its own
//! connections to the data nodes ([`Client::with_own_links`]), so a statement, its calls to the
//! data nodes and their answers all run on one thread and never wake another.
//!
//! Worker 0 is the runtime that accepts connections; it serves each new connection while it
//! serves fewer than `spread_after` of them. Past that, a new connection goes to the worker that
//! serves the fewest. On 2 cores one thread serves a few dozen sysbench connections best:
//! concurrent point selects merge into one batch per data node and nothing crosses threads
//! (tokio's multi-threaded runtime with two workers lost a third of the point selects at 16
//! threads). With a thousand connections, one thread never sleeps and still waits for a CPU
//! while the other idles (benchmarks.md, "Thirty-second session"); the other workers take that
//! load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use shoal_client::Client;
use tokio::runtime::Handle;

use crate::listen::DetachedStream;
use crate::session::Shared;

/// One worker: where its tasks run, its links to the data nodes, how many connections it serves.
struct Worker {
    runtime: Handle,
    client: Client,
    connections: Arc<AtomicUsize>,
}

pub struct Workers {
    workers: Vec<Worker>,
    spread_after: usize,
}

impl Workers {
    /// Worker 0 is the current runtime (with `client`); `count - 1` more start on threads of
    /// their own, each a runtime `build` makes.
    pub fn start(
        count: usize,
        spread_after: usize,
        client: &Client,
        build: impl Fn() -> std::io::Result<tokio::runtime::Runtime>,
    ) -> std::io::Result<Workers> {
        let mut workers =
            vec![Worker { runtime: Handle::current(), client: client.clone(), connections: Arc::default() }];
        for i in 1..count.max(1) {
            let rt = build()?;
            let runtime = rt.handle().clone();
            std::thread::Builder::new()
                .name(format!("sqlnode-{i}"))
                .stack_size(crate::sql::parse::WORKER_STACK_BYTES)
                // The runtime lives as long as the process: the thread blocks on it for good.
                .spawn(move || rt.block_on(std::future::pending::<()>()))?;
            workers.push(Worker { runtime, client: client.with_own_links(), connections: Arc::default() });
        }
        Ok(Workers { workers, spread_after })
    }

    /// Serves a new connection on the worker [`pick`] chooses; `done` is dropped when it ends.
    pub fn serve(&self, shared: Arc<Shared>, stream: DetachedStream, peer: String, done: impl Send + 'static) {
        let loads: Vec<usize> = self.workers.iter().map(|w| w.connections.load(Ordering::Relaxed)).collect();
        let worker = &self.workers[pick(&loads, self.spread_after)];
        let serving = Serving::new(worker.connections.clone());
        let client = worker.client.clone();
        // A socket belongs to the reactor of the runtime that registered it: it comes as a
        // std socket (still non-blocking) and the worker registers it.
        worker.runtime.spawn(async move {
            let _serving = serving;
            let _done = done;
            let stream = match stream.attach() {
                Ok(s) => s,
                Err(e) => return tracing::debug!(%peer, "take the connection over: {e}"),
            };
            if let Err(e) = crate::server::serve(shared, client, stream, peer.clone()).await {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
}

/// The worker for a new connection, given how many each serves: the first while it serves
/// fewer than `spread_after`, otherwise the one serving the fewest (the first of those).
fn pick(loads: &[usize], spread_after: usize) -> usize {
    match loads.first() {
        Some(&first) if first < spread_after => 0,
        _ => loads.iter().enumerate().min_by_key(|&(i, &n)| (n, i)).map_or(0, |(i, _)| i),
    }
}

/// Counts a connection on its worker until dropped, also when its task panics.
struct Serving(Arc<AtomicUsize>);

impl Serving {
    fn new(count: Arc<AtomicUsize>) -> Serving {
        count.fetch_add(1, Ordering::Relaxed);
        Serving(count)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_worker_alone_until_spread_after_then_least_loaded() {
        assert_eq!(pick(&[0, 0], 64), 0);
        assert_eq!(pick(&[63, 0], 64), 0);
        assert_eq!(pick(&[64, 0], 64), 1);
        assert_eq!(pick(&[64, 64, 63], 64), 2);
        // Ties go to the first of them, so the first worker takes turns too.
        assert_eq!(pick(&[70, 70], 64), 0);
        assert_eq!(pick(&[70, 69], 64), 1);
        // One worker, or spreading from the first connection.
        assert_eq!(pick(&[500], 64), 0);
        assert_eq!(pick(&[1, 0], 0), 1);
        assert_eq!(pick(&[], 64), 0);
    }

    #[test]
    fn serving_counts_until_dropped() {
        let n = Arc::new(AtomicUsize::new(0));
        let a = Serving::new(n.clone());
        let b = Serving::new(n.clone());
        assert_eq!(n.load(Ordering::Relaxed), 2);
        drop(a);
        drop(b);
        assert_eq!(n.load(Ordering::Relaxed), 0);
    }
}

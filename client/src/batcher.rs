//! Coalesces concurrent calls to one peer into batched requests.
//!
//! A call is sent at once when fewer than `max_inflight` batches are on the wire; otherwise it
//! waits in a bounded queue, and when a slot frees up everything waiting (up to `max_weight`)
//! goes out as one request. Light load pays no added latency; heavy load pays one message
//! header per batch instead of one per call. Used for client → data node key operations and
//! primary → backup replication.
//!
//! On a multi-threaded runtime, a call with nothing queued and a slot free goes out from the
//! caller's own task: the batching task and the task awaiting the answer are thread hand-offs
//! that a lone call gains nothing from. On a single-threaded runtime (the nodes' default)
//! every call goes through the batching task, a hand-off within the thread: the task is polled
//! after the tasks already ready in the same turn, so the calls they make go out with the
//! first one. Sent directly, the first call after an answer went alone and the rest waited a
//! round trip for the slot: batches alternated between one call and all the others (A/B on 2
//! cores: 16 sysbench clients 5–23% more point selects, 16 key-value clients 38–49% more
//! writes, one client within noise; benchmarks.md, "Twelfth session").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

/// Calls waiting for a free slot; a full queue makes callers wait (back-pressure).
pub const QUEUE_CALLS: usize = 4096;

type Call<I, O> = (I, oneshot::Sender<O>);
type SendFn<I, O> = dyn Fn(Vec<I>) -> Pin<Box<dyn Future<Output = Vec<O>> + Send>> + Send + Sync;

pub struct Batcher<I, O> {
    tx: mpsc::Sender<Call<I, O>>,
    slots: Arc<Semaphore>,
    send: Arc<SendFn<I, O>>,
    /// A lone call may go out from its caller's task (multi-threaded runtimes).
    direct: bool,
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// `send` gets a batch of items and returns one output per item, in order.
    pub fn new<F, Fut>(max_inflight: usize, max_weight: usize, weight: fn(&I) -> usize, send: F) -> Batcher<I, O>
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<O>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(QUEUE_CALLS);
        let slots = Arc::new(Semaphore::new(max_inflight.max(1)));
        let send: Arc<SendFn<I, O>> = Arc::new(move |items| Box::pin(send(items)));
        tokio::spawn(run(rx, slots.clone(), max_weight.max(1), weight, send.clone()));
        let direct = tokio::runtime::Handle::current().runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread;
        Batcher { tx, slots, send, direct }
    }

    /// Calls waiting for a free slot (those of the batches on the wire not counted).
    pub fn queued(&self) -> usize {
        QUEUE_CALLS - self.tx.capacity()
    }

    /// Sends `item` in the next batch and waits for its output. None if the batcher stopped.
    pub async fn call(&self, item: I) -> Option<O> {
        if self.direct && self.tx.capacity() == QUEUE_CALLS {
            if let Ok(permit) = self.slots.clone().try_acquire_owned() {
                let out = (self.send)(vec![item]).await;
                drop(permit);
                return out.into_iter().next();
            }
        }
        let (reply, rx) = oneshot::channel();
        self.tx.send((item, reply)).await.ok()?;
        rx.await.ok()
    }
}

async fn run<I: Send + 'static, O: Send + 'static>(
    mut rx: mpsc::Receiver<Call<I, O>>,
    slots: Arc<Semaphore>,
    max_weight: usize,
    weight: fn(&I) -> usize,
    send: Arc<SendFn<I, O>>,
) {
    let mut carried: Option<Call<I, O>> = None;
    loop {
        let first = match carried.take() {
            Some(c) => c,
            None => match rx.recv().await {
                Some(c) => c,
                None => return,
            },
        };
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let (item, reply) = first;
        let mut total = weight(&item);
        let (mut items, mut replies) = (vec![item], vec![reply]);
        while total < max_weight {
            match rx.try_recv() {
                Ok((item, reply)) if total + weight(&item) <= max_weight => {
                    total += weight(&item);
                    items.push(item);
                    replies.push(reply);
                }
                Ok(c) => {
                    carried = Some(c);
                    break;
                }
                Err(_) => break,
            }
        }
        let out = send(items);
        tokio::spawn(async move {
            let outputs = out.await;
            debug_assert_eq!(outputs.len(), replies.len(), "one output per item");
            for (reply, o) in replies.into_iter().zip(outputs) {
                let _ = reply.send(o);
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Calls 0..n, each from a task of its own, spawned before any of them runs.
    fn spawn_calls(b: &Arc<Batcher<u32, u32>>, n: u32) -> Vec<tokio::task::JoinHandle<(u32, Option<u32>)>> {
        (0..n)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { (i, b.call(i).await) })
            })
            .collect()
    }

    #[tokio::test] // a single-threaded runtime
    async fn calls_made_in_one_turn_go_out_together_even_the_first() {
        let sizes = Arc::new(std::sync::Mutex::new(vec![]));
        let seen = sizes.clone();
        let b = Arc::new(Batcher::new(
            1,
            64,
            |_: &u32| 1,
            move |items: Vec<u32>| {
                seen.lock().unwrap().push(items.len());
                async move { items }
            },
        ));
        // Ten tasks, all ready before any of them runs: the batching task, woken by the first
        // call, runs after the other nine made theirs.
        for c in spawn_calls(&b, 10) {
            let (i, out) = c.await.unwrap();
            assert_eq!(out, Some(i));
        }
        // A lone call later goes the same way, alone.
        assert_eq!(b.call(10).await, Some(10));
        assert_eq!(*sizes.lock().unwrap(), [10, 1]);
    }

    #[tokio::test]
    async fn concurrent_calls_share_batches_and_keep_their_outputs() {
        let batches = Arc::new(AtomicUsize::new(0));
        let seen = batches.clone();
        let b = Arc::new(Batcher::new(
            1,
            64,
            |_: &u32| 1,
            move |items: Vec<u32>| {
                seen.fetch_add(1, Ordering::Relaxed);
                async move {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    items.into_iter().map(|i| i * 2).collect::<Vec<u32>>()
                }
            },
        ));
        for c in spawn_calls(&b, 100) {
            let (i, out) = c.await.unwrap();
            assert_eq!(out, Some(i * 2));
        }
        let n = batches.load(Ordering::Relaxed);
        assert!(n < 100, "100 concurrent calls went out in {n} batches");
        assert!(n >= 2, "64 items at most per batch");
    }
}

//! A long-lived `ExecuteStream` to one data node: key-operation batches go out as tagged
//! messages on one HTTP/2 stream and their answers come back as they finish. A unary call
//! costs a whole HTTP/2 request (headers, trailers, a new stream, a hop through the channel's
//! buffer task) — in profiles, half of a SQL node's CPU per point select.
//!
//! The link opens on first use and is replaced when it breaks: every call waiting on a broken
//! link fails with NODE_NOT_READY, which callers retry like any unreachable node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use shoal_proto::pb::{self, data_node_client::DataNodeClient};
use shoal_proto::{ErrorCode, NodeId, ShoalError};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

/// Calls queued for sending on one link.
const LINK_QUEUE: usize = 1024;

type Waiting = Mutex<HashMap<u64, oneshot::Sender<pb::BatchResponse>>>;

struct Open {
    tx: mpsc::Sender<pb::TaggedBatch>,
    waiting: Arc<Waiting>,
    broken: Arc<AtomicBool>,
}

/// The stream to one node, opened lazily.
pub struct Link {
    node: NodeId,
    client: DataNodeClient<Channel>,
    open: tokio::sync::Mutex<Option<Arc<Open>>>,
    next_tag: AtomicU64,
}

fn broken(node: NodeId, why: impl std::fmt::Display) -> ShoalError {
    ShoalError::new(ErrorCode::NodeNotReady, format!("node {node}: {why}"))
}

/// Takes the caller's entry out of the waiting table when the call ends, also when the caller
/// gives up (a timeout drops the call).
struct Entry<'a> {
    waiting: &'a Waiting,
    tag: u64,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        self.waiting.lock().remove(&self.tag);
    }
}

impl Link {
    pub fn new(node: NodeId, client: DataNodeClient<Channel>) -> Link {
        Link { node, client, open: tokio::sync::Mutex::new(None), next_tag: AtomicU64::new(1) }
    }

    /// Sends one batch and waits for its answer.
    pub async fn call(&self, batch: pb::BatchRequest) -> Result<pb::BatchResponse, ShoalError> {
        let open = self.stream().await?;
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        open.waiting.lock().insert(tag, reply);
        let _entry = Entry { waiting: &open.waiting, tag };
        // The reader marks the link broken before it fails everything waiting: either it saw
        // this entry, or this call sees the mark.
        if open.broken.load(Ordering::SeqCst) {
            return Err(broken(self.node, "the call stream broke"));
        }
        if open.tx.send(pb::TaggedBatch { tag, batch: Some(batch) }).await.is_err() {
            return Err(broken(self.node, "the call stream closed"));
        }
        answer.await.map_err(|_| broken(self.node, "the call stream broke before the answer"))
    }

    /// The open stream, opening a new one if there is none or the last one broke.
    async fn stream(&self) -> Result<Arc<Open>, ShoalError> {
        let mut slot = self.open.lock().await;
        if let Some(open) = slot.as_ref().filter(|o| !o.broken.load(Ordering::SeqCst)) {
            return Ok(open.clone());
        }
        let (tx, rx) = mpsc::channel(LINK_QUEUE);
        let mut client = self.client.clone();
        let answers = client
            .execute_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|s| broken(self.node, s.message()))?
            .into_inner();
        let open = Arc::new(Open { tx, waiting: Default::default(), broken: Default::default() });
        tokio::spawn(read_answers(self.node, answers, open.waiting.clone(), open.broken.clone()));
        *slot = Some(open.clone());
        Ok(open)
    }
}

/// Hands each answer to its caller; when the stream ends, marks the link broken and fails
/// every call still waiting (dropping their senders).
async fn read_answers(
    node: NodeId,
    mut answers: tonic::Streaming<pb::TaggedResult>,
    waiting: Arc<Waiting>,
    broken: Arc<AtomicBool>,
) {
    loop {
        match answers.message().await {
            Ok(Some(m)) => {
                let reply = waiting.lock().remove(&m.tag);
                if let Some(reply) = reply {
                    let _ = reply.send(m.result.unwrap_or_default());
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(node, "call stream broke: {}", e.message());
                break;
            }
        }
    }
    broken.store(true, Ordering::SeqCst);
    waiting.lock().clear();
}

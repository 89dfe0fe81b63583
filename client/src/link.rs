//! A long-lived call stream to one data node (`ExecuteStream` for key operations,
//! `TxnExecuteStream`/`TxnCommitStream` for transactions, `ReplicateStream` and
//! `TxnControlStream` between data nodes): requests go out as tagged messages on one HTTP/2 stream
//! and their answers come back as they finish. A unary call costs a whole HTTP/2 request
//! (headers, trailers, a new stream, a hop through the channel's buffer task) — in profiles,
//! half of a SQL node's CPU per point select. The streams run straight on h2
//! (`shoal_proto::grpc_stream`): a caller encodes its request and queues it on the stream itself.
//!
//! The link opens on first use and is replaced when it breaks: every call waiting on a broken
//! link fails with NODE_NOT_READY, which callers retry like any unreachable node.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use shoal_proto::grpc_stream::{CallReader, CallSender, StreamConn};
use shoal_proto::hash::IdMap;
use shoal_proto::pb;
use shoal_proto::{ErrorCode, NodeId, ShoalError};
use tokio::sync::oneshot;

/// One kind of call stream: its request and answer, and how they are tagged.
pub trait Calls: Send + Sync + 'static {
    type Request: Send + 'static;
    type Answer: Default + Send + 'static;
    /// What goes on the wire: a request with its tag.
    type Out: prost::Message + Send + 'static;
    /// What comes back: an answer with its tag.
    type In: prost::Message + Default + Send + 'static;
    /// The streaming method's gRPC path.
    const PATH: &'static str;
    fn tag(tag: u64, req: Self::Request) -> Self::Out;
    fn untag(got: Self::In) -> (u64, Self::Answer);
}

/// Declares a kind of call stream: the request and answer types, the tagged messages that
/// carry them (the request in field `$field`, the answer in `result`), and the streaming method.
macro_rules! call_kind {
    ($(#[$doc:meta])* $name:ident: $req:ty => $answer:ty, $out:ident { $field:ident }, $in:ident, $method:literal) => {
        $(#[$doc])*
        pub struct $name;

        impl Calls for $name {
            type Request = $req;
            type Answer = $answer;
            type Out = pb::$out;
            type In = pb::$in;
            const PATH: &'static str = concat!("/shoal.v1.DataNode/", $method);
            fn tag(tag: u64, req: $req) -> pb::$out {
                pb::$out { tag, $field: Some(req) }
            }
            fn untag(got: pb::$in) -> (u64, $answer) {
                (got.tag, got.result.unwrap_or_default())
            }
        }
    };
}

call_kind!(
    /// Key-operation batches (`ExecuteStream`).
    ExecuteCalls: pb::BatchRequest => pb::BatchResponse, TaggedBatch { batch }, TaggedResult, "ExecuteStream"
);
call_kind!(
    /// Transactions' operations (`TxnExecuteStream`).
    TxnExecuteCalls: pb::TxnExecuteRequest => pb::TxnExecuteResponse, TaggedTxnExecute { req }, TaggedTxnResult,
    "TxnExecuteStream"
);
call_kind!(
    /// Commits and rollbacks sent to a transaction's coordinator (`TxnCommitStream`).
    TxnCommitCalls: pb::TxnCommitRequest => pb::TxnCommitResponse, TaggedTxnCommit { req }, TaggedTxnCommitResult,
    "TxnCommitStream"
);
call_kind!(
    /// Replication batches, primary -> replica (`ReplicateStream`).
    ReplicateCalls: pb::ReplicateBatchRequest => pb::ReplicateBatchResponse, TaggedReplicate { batch },
    TaggedReplicateResult, "ReplicateStream"
);
call_kind!(
    /// A coordinator's commit steps sent to participants and group peers (`TxnControlStream`).
    TxnControlCalls: pb::TxnControlRequest => pb::TxnControlResponse, TaggedTxnControl { req },
    TaggedTxnControlResult, "TxnControlStream"
);

type Waiting<A> = Mutex<IdMap<u64, oneshot::Sender<A>>>;

struct Open<C: Calls> {
    tx: CallSender,
    waiting: Arc<Waiting<C::Answer>>,
    broken: Arc<AtomicBool>,
}

/// The stream to one node, opened lazily.
pub struct Link<C: Calls> {
    node: NodeId,
    conn: Arc<StreamConn>,
    /// The stream calls go on; read by every call without waiting.
    current: Mutex<Option<Arc<Open<C>>>>,
    /// Held while a new stream opens, so concurrent callers open one, not one each.
    opening: tokio::sync::Mutex<()>,
    next_tag: AtomicU64,
}

fn broken(node: NodeId, why: impl std::fmt::Display) -> ShoalError {
    ShoalError::new(ErrorCode::NodeNotReady, format!("node {node}: {why}"))
}

/// Takes the caller's entry out of the waiting table when the call ends, also when the caller
/// gives up (a timeout drops the call).
struct Entry<'a, A> {
    waiting: &'a Waiting<A>,
    tag: u64,
}

impl<A> Drop for Entry<'_, A> {
    fn drop(&mut self) {
        self.waiting.lock().remove(&self.tag);
    }
}

impl<C: Calls> Link<C> {
    pub fn new(node: NodeId, conn: Arc<StreamConn>) -> Link<C> {
        Link {
            node,
            conn,
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            next_tag: AtomicU64::new(1),
        }
    }

    /// Sends one request and waits for its answer.
    pub async fn call(&self, req: C::Request) -> Result<C::Answer, ShoalError> {
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
        if let Err(e) = open.tx.send(&C::tag(tag, req)) {
            open.broken.store(true, Ordering::SeqCst);
            return Err(broken(self.node, format!("the call stream closed: {e}")));
        }
        answer.await.map_err(|_| broken(self.node, "the call stream broke before the answer"))
    }

    /// The stream, unless there is none or it broke.
    fn live(&self) -> Option<Arc<Open<C>>> {
        self.current.lock().as_ref().filter(|o| !o.broken.load(Ordering::SeqCst)).cloned()
    }

    /// The open stream, opening a new one if there is none or the last one broke.
    async fn stream(&self) -> Result<Arc<Open<C>>, ShoalError> {
        if let Some(open) = self.live() {
            return Ok(open);
        }
        let _opening = self.opening.lock().await;
        // Another caller may have opened it while this one waited.
        if let Some(open) = self.live() {
            return Ok(open);
        }
        let (tx, answers) = self.conn.open(C::PATH).await.map_err(|e| broken(self.node, e.message))?;
        let open = Arc::new(Open { tx, waiting: Default::default(), broken: Default::default() });
        tokio::spawn(read_answers::<C>(self.node, answers, open.waiting.clone(), open.broken.clone()));
        *self.current.lock() = Some(open.clone());
        Ok(open)
    }
}

/// Hands each answer to its caller; when the stream ends, marks the link broken and fails
/// every call still waiting (dropping their senders).
async fn read_answers<C: Calls>(
    node: NodeId,
    mut answers: CallReader,
    waiting: Arc<Waiting<C::Answer>>,
    broken: Arc<AtomicBool>,
) {
    loop {
        match answers.message::<C::In>().await {
            Ok(Some(m)) => {
                shoal_proto::spin::note_work();
                let (tag, answer) = C::untag(m);
                let reply = waiting.lock().remove(&tag);
                if let Some(reply) = reply {
                    let _ = reply.send(answer);
                }
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(node, "call stream broke: {}", e.message);
                break;
            }
        }
    }
    broken.store(true, Ordering::SeqCst);
    waiting.lock().clear();
}

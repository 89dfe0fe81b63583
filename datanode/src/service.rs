//! gRPC handlers of the DataNode service: convert, delegate, convert back.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use shoal_proto::aggregate::{Aggregate, Partial};
use shoal_proto::convert::{deltas_from_pb, values_from_pb, values_to_pb};
use shoal_proto::filter::Filter;
use shoal_proto::pb::{self, data_node_server::DataNode};
use shoal_proto::{ErrorCode, ShoalError};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use crate::node::Node;
use crate::ops::{self, Answer, KeyRange, Op, OpKind, MAX_BATCH_OPS};
use crate::scan::{self, ScanSpec, SCAN_QUEUE_BATCHES};
use crate::{sync, transport};

pub struct Service {
    pub node: Arc<Node>,
    /// Becomes true when the node stops: call streams end then.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// The next call on a stream, or None when the stream ended, broke, or the node is stopping.
async fn next_call<T>(calls: &mut tonic::Streaming<T>, stop: &mut tokio::sync::watch::Receiver<bool>) -> Option<T> {
    tokio::select! {
        call = calls.next() => call.and_then(Result::ok),
        _ = stop.wait_for(|&s| s) => None,
    }
}

fn op_from_pb(mut op: pb::Op) -> Result<Op, ShoalError> {
    let kind = match pb::OpKind::try_from(op.kind) {
        Ok(pb::OpKind::Read) => OpKind::Read,
        Ok(pb::OpKind::Insert) => OpKind::Insert,
        Ok(pb::OpKind::Update) => OpKind::Update,
        Ok(pb::OpKind::Upsert) => OpKind::Upsert,
        Ok(pb::OpKind::Delete) => OpKind::Delete,
        _ => return Err(ShoalError::new(ErrorCode::InvalidArgument, format!("unknown operation kind {}", op.kind))),
    };
    if op.range_count == 0 && op.keys.len() != op.key_partitions.len() {
        return Err(ShoalError::new(ErrorCode::InvalidArgument, "a many-key read needs one partition per key"));
    }
    if (!op.keys.is_empty() || op.range_count > 0) && kind != OpKind::Read {
        return Err(ShoalError::new(ErrorCode::InvalidArgument, "only reads may name many keys"));
    }
    if op.range_count > 0
        && (!op.keys.is_empty() || shoal_proto::codec::int_key_at(op.range_start, op.range_count - 1).is_none())
    {
        return Err(ShoalError::new(
            ErrorCode::InvalidArgument,
            "a range read names its keys by its start and count only, within 8-byte keys",
        ));
    }
    if !op.aggregates.is_empty() && op.range_count == 0 {
        return Err(ShoalError::new(ErrorCode::InvalidArgument, "only range reads compute aggregates"));
    }
    let aggregates = op.aggregates.iter().map(Aggregate::from_pb).collect::<Result<Vec<_>, _>>()?;
    let range = (op.range_count > 0).then(|| KeyRange {
        start: op.range_start,
        count: op.range_count,
        partitions: std::mem::take(&mut op.key_partitions),
    });
    Ok(Op {
        kind,
        table: op.table_id,
        partition: op.partition,
        keys: op.keys.into_iter().zip(op.key_partitions).collect(),
        range,
        key: values_from_pb(op.key),
        key_data: (!op.key_data.is_empty()).then_some(op.key_data),
        row: values_from_pb(op.row),
        columns: op.columns,
        deltas: deltas_from_pb(op.deltas),
        packed_rows: op.packed_rows,
        aggregates,
    })
}

fn result_to_pb((r, gci): OpAnswer) -> pb::OpResult {
    match r {
        Ok(Answer::Row(Some(row_data))) => {
            pb::OpResult { row_data: row_data.into(), found: true, gci, ..Default::default() }
        }
        Ok(Answer::Row(None)) => pb::OpResult { gci, ..Default::default() },
        Ok(Answer::Unchanged) => pb::OpResult { unchanged: true, ..Default::default() },
        Ok(Answer::Rows { rows, packed: true, .. }) => {
            let mut r = pb::OpResult::default();
            rows.into_pb(&mut r);
            r
        }
        Ok(Answer::Rows { rows, range: false, packed: false }) => {
            pb::OpResult { rows: rows.into_each(), ..Default::default() }
        }
        Ok(Answer::Rows { rows, range: true, packed: false }) => {
            let (rows, row_offsets) = rows.into_found();
            pb::OpResult { rows, row_offsets, ..Default::default() }
        }
        Ok(Answer::Aggregates(partials)) => {
            pb::OpResult { aggregates: partials.into_iter().map(Partial::to_pb).collect(), ..Default::default() }
        }
        Err(e) => pb::OpResult { error: Some(e.into()), ..Default::default() },
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Answers waiting to go out on one ExecuteStream (the caller reads them as they come).
const STREAM_QUEUE: usize = 256;
/// Batches of one ExecuteStream running at once; more wait (back-pressure on the caller).
const STREAM_INFLIGHT: usize = 256;

/// Runs a transaction's operations (unary TxnExecute, or one call on a TxnExecuteStream). The
/// caller runs it in a task of its own: locks taken must be recorded even if the client goes
/// away.
async fn run_txn_execute(node: &Arc<Node>, req: pb::TxnExecuteRequest) -> pb::TxnExecuteResponse {
    let failed =
        |e: ShoalError| pb::TxnExecuteResponse { error: Some(e.into()), results: vec![], holds: vec![], terms: vec![] };
    if req.ops.len() > MAX_BATCH_OPS {
        return failed(ShoalError::new(
            ErrorCode::TooLarge,
            format!("a batch holds at most {MAX_BATCH_OPS} operations"),
        ));
    }
    if let Err(e) = node.ensure_epoch(req.epoch).await {
        return failed(e);
    }
    let mut ops = Vec::with_capacity(req.ops.len());
    let mut bad = vec![];
    for (i, op) in req.ops.into_iter().enumerate() {
        let lock = match pb::LockMode::try_from(req.locks.get(i).copied().unwrap_or(0)) {
            Ok(pb::LockMode::None) => None,
            Ok(pb::LockMode::Shared) => Some(crate::partition::LockMode::Shared),
            Ok(pb::LockMode::Exclusive) => Some(crate::partition::LockMode::Exclusive),
            Err(_) => {
                bad.push(i);
                None
            }
        };
        let held_term = req.held_terms.get(i).copied().unwrap_or(0);
        match op_from_pb(op) {
            Ok(op) if !op.keys.is_empty() || op.range.is_some() => {
                return failed(ShoalError::new(
                    ErrorCode::InvalidArgument,
                    "a transaction reads its keys one operation each (many-key reads go in batches)",
                ))
            }
            Ok(op) => ops.push(crate::txn::TxnOp { op, lock, held_term }),
            Err(e) => return failed(e),
        }
    }
    if !bad.is_empty() {
        return failed(ShoalError::new(ErrorCode::InvalidArgument, format!("unknown lock mode at operations {bad:?}")));
    }
    let savepoints =
        crate::txn::Savepoints { at: req.savepoint, keep_from: req.keep_from, rollback_to: req.rollback_to };
    let results = crate::txn::execute(node, req.txn_id, req.tc, ops, savepoints).await;
    let holds = results.iter().map(|(_, h)| h.is_some()).collect();
    let terms = results.iter().map(|(_, h)| h.unwrap_or(0)).collect();
    pb::TxnExecuteResponse {
        error: None,
        results: results.into_iter().map(|(r, _)| result_to_pb((r, 0))).collect(),
        holds,
        terms,
    }
}

/// Runs a transaction's writes that rode on its commit (`TxnControlRequest.execute`): the
/// first failure, of the request or of one write, is the answer.
pub(crate) async fn run_attached(node: &Arc<Node>, req: pb::TxnExecuteRequest) -> Result<(), ShoalError> {
    let resp = run_txn_execute(node, req).await;
    if let Some(e) = resp.error {
        return Err(e.into());
    }
    match resp.results.into_iter().find_map(|r| r.error) {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Applies replicated parts in order: a later part may depend on an earlier one's epoch
/// catch-up.
async fn apply_replicated(node: &Arc<Node>, parts: Vec<pb::ReplicateRequest>) -> pb::ReplicateBatchResponse {
    let mut results = Vec::with_capacity(parts.len());
    for part in parts {
        let msg = transport::replicate_from_pb(part);
        let error = crate::replication::apply(node, msg).await.err().map(pb::Error::from);
        results.push(pb::ReplicateResponse { error });
    }
    pb::ReplicateBatchResponse { results }
}

/// Commits or rolls back a transaction this node coordinates.
async fn run_txn_commit(node: &Arc<Node>, req: pb::TxnCommitRequest) -> pb::TxnCommitResponse {
    let parts: Vec<_> = req.parts.iter().map(|p| (p.table_id, p.partition)).collect();
    match crate::txn::commit_as_tc(node, req.txn_id, parts, req.rollback, req.execute).await {
        Ok(gci) => pb::TxnCommitResponse { error: None, gci },
        Err(e) => pb::TxnCommitResponse { error: Some(e.into()), gci: 0 },
    }
}

/// Runs one step of a transaction's commit protocol sent by a coordinator (or, for OUTCOME, a
/// participant asking a dead coordinator's peer).
async fn run_txn_control(node: &Arc<Node>, mut req: pb::TxnControlRequest) -> pb::TxnControlResponse {
    if let Err(e) = node.ensure_epoch(req.epoch).await {
        return pb::TxnControlResponse { error: Some(e.into()), committed: false, gci: 0 };
    }
    crate::txn::forget_records(node, &req.forget);
    let phase = pb::TxnPhase::try_from(req.phase).unwrap_or_default();
    let parts: Vec<_> = req.parts.iter().map(|p| (p.table_id, p.partition)).collect();
    let run = crate::txn::Run::from_request(&mut req);
    match crate::txn::handle_control(node, phase, req.txn_id, req.gci, &parts, run).await {
        Ok(Some(gci)) => pb::TxnControlResponse { error: None, committed: true, gci },
        Ok(None) => pb::TxnControlResponse { error: None, committed: false, gci: 0 },
        Err(e) => pb::TxnControlResponse { error: Some(e.into()), committed: false, gci: 0 },
    }
}

/// An operation's outcome: a read's row (in the table's row encoding) or nothing, and the GCI
/// of a write.
type OpAnswer = (Result<Answer, ShoalError>, u64);

/// A batch's answer when the whole batch failed.
fn failed_batch(e: ShoalError) -> pb::BatchResponse {
    pb::BatchResponse { error: Some(e.into()), results: vec![], served_by: 0 }
}

/// Runs one batch of key operations (unary Execute, or one call on an ExecuteStream). A batch
/// with a write must run to its end once replication starts, even if its caller goes away: the
/// caller runs it in a task of its own (`serve_calls` does for every call it does not answer
/// inline; `execute` spawns one).
async fn run_batch(node: &Arc<Node>, req: pb::BatchRequest) -> pb::BatchResponse {
    // A many-key or range read counts once per key.
    if req.ops.iter().map(pb::Op::weight).sum::<usize>() > MAX_BATCH_OPS {
        return failed_batch(ShoalError::new(
            ErrorCode::TooLarge,
            format!("a batch holds at most {MAX_BATCH_OPS} operations"),
        ));
    }
    if let Err(e) = node.ensure_epoch(req.epoch).await {
        return failed_batch(e);
    }
    let at = ops::ReadAt::of(req.read_backup, req.as_primary);
    let ops: Vec<Result<Op, ShoalError>> = req.ops.into_iter().map(op_from_pb).collect();
    let results: Vec<OpAnswer> = if ops.iter().all(|o| o.as_ref().is_ok_and(|o| o.kind == OpKind::Read)) {
        // Reads finish without waiting on anything: answer inline.
        ops::read_many(node, ops, at).into_iter().map(|r| (r, 0)).collect()
    } else {
        let each = ops.into_iter().map(|op| {
            let node = node.clone();
            async move {
                let op = match op {
                    Ok(op) => op,
                    Err(e) => return (Err(e), 0),
                };
                match op.kind {
                    OpKind::Read => (ops::read(&node, op, at), 0),
                    _ => match ops::write(node, op).await {
                        Ok(Some(gci)) => (Ok(Answer::Row(None)), gci),
                        Ok(None) => (Ok(Answer::Unchanged), 0),
                        Err(e) => (Err(e), 0),
                    },
                }
            }
        });
        futures::future::join_all(each).await
    };
    pb::BatchResponse { error: None, results: results.into_iter().map(result_to_pb).collect(), served_by: node.id }
}

/// A call's tagged answer, being worked out.
type Answering<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl Service {
    /// Serves one call stream: each call is answered by `answer`, awaited in arrival order
    /// when `inline` says so, otherwise in its own task (at most `STREAM_INFLIGHT` at once);
    /// answers go back as they are ready. The stream ends when the caller closes it, it
    /// breaks, or the node stops.
    fn serve_calls<C: prost::Message + 'static, A: Send + 'static>(
        &self,
        mut calls: tonic::Streaming<C>,
        inline: fn(&Node, &C) -> bool,
        answer: fn(Arc<Node>, C) -> Answering<A>,
    ) -> BoxStream<A> {
        let mut stop = self.stop.clone();
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let node = self.node.clone();
        tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(STREAM_INFLIGHT));
            while let Some(call) = next_call(&mut calls, &mut stop).await {
                shoal_proto::spin::note_work();
                shoal_proto::spin::note_load(call.encoded_len());
                if inline(&node, &call) {
                    if tx.send(Ok(answer(node.clone(), call).await)).await.is_err() {
                        return;
                    }
                    continue;
                }
                let Ok(permit) = slots.clone().acquire_owned().await else { return };
                let (answering, tx) = (answer(node.clone(), call), tx.clone());
                tokio::spawn(async move {
                    let _ = tx.send(Ok(answering.await)).await;
                    drop(permit);
                });
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl DataNode for Service {
    async fn execute(&self, req: Request<pb::BatchRequest>) -> Result<Response<pb::BatchResponse>, Status> {
        // In a task of its own: tonic drops this future if the client goes away, and a write
        // that started replicating must finish.
        let node = self.node.clone();
        let batch = tokio::spawn(async move { run_batch(&node, req.into_inner()).await });
        Ok(Response::new(
            batch.await.unwrap_or_else(|e| failed_batch(ShoalError::internal(format!("batch task failed: {e}")))),
        ))
    }

    type ExecuteStreamStream = BoxStream<pb::TaggedResult>;

    async fn execute_stream(
        &self,
        req: Request<tonic::Streaming<pb::TaggedBatch>>,
    ) -> Result<Response<Self::ExecuteStreamStream>, Status> {
        // Reads of a known map finish without waiting on anything: answered in order, inline.
        // Anything else runs in its own task, so a slow write does not hold up the calls
        // behind it.
        let inline = |node: &Node, call: &pb::TaggedBatch| {
            call.batch.as_ref().is_some_and(|b| {
                b.epoch <= node.epoch()
                    && b.ops.len() <= MAX_BATCH_OPS
                    && b.ops.iter().all(|o| o.kind == pb::OpKind::Read as i32)
            })
        };
        let answer = |node: Arc<Node>, call: pb::TaggedBatch| -> Answering<pb::TaggedResult> {
            Box::pin(async move {
                let result = Some(run_batch(&node, call.batch.unwrap_or_default()).await);
                pb::TaggedResult { tag: call.tag, result }
            })
        };
        Ok(Response::new(self.serve_calls(req.into_inner(), inline, answer)))
    }

    type ScanStream = BoxStream<pb::ScanBatch>;

    async fn scan(&self, req: Request<pb::ScanRequest>) -> Result<Response<Self::ScanStream>, Status> {
        let req = req.into_inner();
        let (tx, rx) = mpsc::channel(SCAN_QUEUE_BATCHES);
        let map = self.node.map();
        let filters: Result<Vec<Filter>, ShoalError> = match map.table_by_id(req.table_id) {
            Some(t) => req.filters.into_iter().map(|f| Filter::from_pb(f, t)).collect(),
            None if req.epoch > map.epoch => Ok(vec![]), // checked again once the epoch is known
            None => Err(ShoalError::new(ErrorCode::NoSuchTable, format!("table id {} does not exist", req.table_id))),
        };
        match filters {
            Ok(filters) => {
                let spec = ScanSpec {
                    epoch: req.epoch,
                    table: req.table_id,
                    partition: req.partition,
                    filters,
                    projection: req.projection,
                    batch_rows: req.batch_rows,
                    read_backup: req.read_backup,
                    index: req.index.map(|r| scan::IndexScan {
                        id: r.index_id,
                        lower: shoal_proto::convert::values_from_pb(r.lower),
                        lower_inclusive: r.lower_inclusive,
                        upper: shoal_proto::convert::values_from_pb(r.upper),
                        upper_inclusive: r.upper_inclusive,
                        descending: r.descending,
                    }),
                };
                tokio::spawn(scan::run(self.node.clone(), spec, tx));
            }
            Err(e) => {
                let _ = tx.try_send(Err(e));
            }
        }
        let out = ReceiverStream::new(rx).map(|b| {
            Ok(match b {
                Ok((rows, last)) => pb::ScanBatch {
                    error: None,
                    rows: rows.into_iter().map(|r| pb::Row { values: values_to_pb(r) }).collect(),
                    last,
                },
                Err(e) => pb::ScanBatch { error: Some(e.into()), rows: vec![], last: true },
            })
        });
        Ok(Response::new(Box::pin(out)))
    }

    async fn replicate(
        &self,
        req: Request<pb::ReplicateBatchRequest>,
    ) -> Result<Response<pb::ReplicateBatchResponse>, Status> {
        let parts = req.into_inner().parts;
        if parts.len() > crate::transport::MAX_REPLICATE_PARTS {
            return Err(Status::invalid_argument("too many parts in one replication batch"));
        }
        Ok(Response::new(apply_replicated(&self.node, parts).await))
    }

    type ReplicateStreamStream = BoxStream<pb::TaggedReplicateResult>;

    async fn replicate_stream(
        &self,
        req: Request<tonic::Streaming<pb::TaggedReplicate>>,
    ) -> Result<Response<Self::ReplicateStreamStream>, Status> {
        // One at a time, in arrival order, as the parts of one unary batch.
        let answer = |node: Arc<Node>, call: pb::TaggedReplicate| -> Answering<pb::TaggedReplicateResult> {
            Box::pin(async move {
                let parts = call.batch.unwrap_or_default().parts;
                let result = if parts.len() > crate::transport::MAX_REPLICATE_PARTS {
                    let e = ShoalError::new(ErrorCode::TooLarge, "too many parts in one replication batch");
                    let error = Some(pb::Error::from(e));
                    pb::ReplicateBatchResponse {
                        results: parts.iter().map(|_| pb::ReplicateResponse { error: error.clone() }).collect(),
                    }
                } else {
                    apply_replicated(&node, parts).await
                };
                pb::TaggedReplicateResult { tag: call.tag, result: Some(result) }
            })
        };
        Ok(Response::new(self.serve_calls(req.into_inner(), |_, _| true, answer)))
    }

    type CopyPartitionStream = BoxStream<pb::CopyChunk>;

    async fn copy_partition(
        &self,
        req: Request<pb::CopyRequest>,
    ) -> Result<Response<Self::CopyPartitionStream>, Status> {
        let (tx, rx) = mpsc::channel(SCAN_QUEUE_BATCHES);
        tokio::spawn(sync::copy_out(self.node.clone(), transport::copy_from_pb(req.into_inner()), tx));
        let out = ReceiverStream::new(rx).map(|c| Ok(transport::chunk_to_pb(c)));
        Ok(Response::new(Box::pin(out)))
    }

    async fn info(&self, _req: Request<pb::NodeInfoRequest>) -> Result<Response<pb::NodeInfoResponse>, Status> {
        let node = &self.node;
        let rows = node.partitions().iter().map(|p| p.store.lock().rows()).sum();
        Ok(Response::new(pb::NodeInfoResponse {
            node_id: node.id,
            epoch: node.epoch(),
            lease_valid: node.lease_valid(),
            rows,
            memory_bytes: node.budget.used(),
            memory_limit_bytes: node.budget.limit(),
            progress: node.durability.progress.lock().clone(),
        }))
    }

    async fn txn_execute(
        &self,
        req: Request<pb::TxnExecuteRequest>,
    ) -> Result<Response<pb::TxnExecuteResponse>, Status> {
        let node = self.node.clone();
        let answer = tokio::spawn(async move { run_txn_execute(&node, req.into_inner()).await })
            .await
            .map_err(|e| Status::internal(format!("transaction task failed: {e}")))?;
        Ok(Response::new(answer))
    }

    type TxnExecuteStreamStream = BoxStream<pb::TaggedTxnResult>;

    async fn txn_execute_stream(
        &self,
        req: Request<tonic::Streaming<pb::TaggedTxnExecute>>,
    ) -> Result<Response<Self::TxnExecuteStreamStream>, Status> {
        // Each in its own task: a call waiting for a lock must not hold up the others.
        let answer = |node: Arc<Node>, call: pb::TaggedTxnExecute| -> Answering<pb::TaggedTxnResult> {
            Box::pin(async move {
                let result = Some(run_txn_execute(&node, call.req.unwrap_or_default()).await);
                pb::TaggedTxnResult { tag: call.tag, result }
            })
        };
        Ok(Response::new(self.serve_calls(req.into_inner(), |_, _| false, answer)))
    }

    type TxnCommitStreamStream = BoxStream<pb::TaggedTxnCommitResult>;

    async fn txn_commit_stream(
        &self,
        req: Request<tonic::Streaming<pb::TaggedTxnCommit>>,
    ) -> Result<Response<Self::TxnCommitStreamStream>, Status> {
        // Each in its own task, which runs to the end even if the client hangs up: a decision
        // must be carried out.
        let answer = |node: Arc<Node>, call: pb::TaggedTxnCommit| -> Answering<pb::TaggedTxnCommitResult> {
            Box::pin(async move {
                let result = Some(run_txn_commit(&node, call.req.unwrap_or_default()).await);
                pb::TaggedTxnCommitResult { tag: call.tag, result }
            })
        };
        Ok(Response::new(self.serve_calls(req.into_inner(), |_, _| false, answer)))
    }

    type TxnControlStreamStream = BoxStream<pb::TaggedTxnControlResult>;

    async fn txn_control_stream(
        &self,
        req: Request<tonic::Streaming<pb::TaggedTxnControl>>,
    ) -> Result<Response<Self::TxnControlStreamStream>, Status> {
        // Each in its own task: PREPARE and COMMIT wait for the backups, and a step once begun
        // runs to the end even if the coordinator goes away.
        let answer = |node: Arc<Node>, call: pb::TaggedTxnControl| -> Answering<pb::TaggedTxnControlResult> {
            Box::pin(async move {
                let result = Some(run_txn_control(&node, call.req.unwrap_or_default()).await);
                pb::TaggedTxnControlResult { tag: call.tag, result }
            })
        };
        Ok(Response::new(self.serve_calls(req.into_inner(), |_, _| false, answer)))
    }

    async fn gcp(&self, req: Request<pb::GcpRequest>) -> Result<Response<pb::GcpResponse>, Status> {
        let req = req.into_inner();
        let answer = |r: Result<bool, ShoalError>| {
            Ok(Response::new(match r {
                Ok(restorable) => pb::GcpResponse { error: None, restorable },
                Err(e) => pb::GcpResponse { error: Some(e.into()), restorable: false },
            }))
        };
        let node = &self.node;
        if req.incarnation != node.incarnation {
            return answer(Err(ShoalError::new(
                ErrorCode::StaleEpoch,
                format!("node {} runs incarnation {}, not {}", node.id, node.incarnation, req.incarnation),
            )));
        }
        let clock = &node.durability.clock;
        answer(match pb::GcpPhase::try_from(req.phase) {
            Ok(pb::GcpPhase::Prepare) => {
                clock.prepare();
                Ok(false)
            }
            Ok(pb::GcpPhase::Commit) => clock.commit(req.gci).await.map(|()| false),
            Ok(pb::GcpPhase::Abort) => {
                clock.abort();
                Ok(false)
            }
            Ok(pb::GcpPhase::Flush) => node.durability.flush(req.gci, req.gci_complete, node.any_filling()).await,
            _ => Err(ShoalError::new(ErrorCode::InvalidArgument, format!("unknown checkpoint phase {}", req.phase))),
        })
    }
}

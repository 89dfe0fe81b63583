//! How a data node reaches its peers. The replication and copy logic only sees this trait, so
//! tests drive several nodes in one process over a simulated network (`sim_tests.rs`), and the
//! daemon uses gRPC.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use shoal_client::link::{Link, ReplicateCalls, TxnControlCalls};
use shoal_client::Batcher;
use shoal_proto::grpc_stream::StreamConn;
use shoal_proto::hash::IdMap;
use shoal_proto::pb::{self, data_node_client::DataNodeClient};
use shoal_proto::{ClusterState, Epoch, ErrorCode, NodeId, NodeKind, PartitionId, ShoalError, TableId};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::storage::Image;

/// How long one transaction control call may take (PREPARE and COMMIT replicate to backups).
const TXN_CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// Chunks of a partition copy; the sender ends the stream after the last chunk.
pub type CopyStream = mpsc::Receiver<Result<Vec<Image>, ShoalError>>;

/// Row images a primary sends to one replica of a partition.
#[derive(Clone, Debug, PartialEq)]
pub struct Replicate {
    pub from: NodeId,
    pub table: TableId,
    pub partition: PartitionId,
    pub primary_term: Epoch,
    /// The sender's map epoch: the receiver catches up to it before applying.
    pub epoch: Epoch,
    /// The global checkpoint the write belongs to (0 for barriers).
    pub gci: u64,
    pub images: Vec<Image>,
    /// Images of a transaction, and what to do with them (None: apply, as for a single write).
    pub txn: Option<TxnTag>,
    /// Sequence numbers of this partition's earlier writes that the primary has applied
    /// itself since its last message (see `replication.rs`, reads as the primary).
    pub confirmed: Vec<u64>,
}

/// What a replica does with a transaction's images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnStep {
    /// Keep them aside (not visible): if the primary fails, the promoted replica finishes the
    /// transaction from them.
    Prepare,
    /// Apply them (with the message's GCI) and forget the kept ones.
    Commit,
    /// Forget the kept ones.
    Abort,
    /// Commit, sent by the transaction's coordinator for its own part: the message also
    /// carries its commit decision, which the replica records (as a RECORD would) before it
    /// applies the images, or refuses with TXN_ABORTED when it already told a participant the
    /// transaction aborted (then it applies nothing).
    Record,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnTag {
    pub id: u64,
    pub tc: NodeId,
    pub step: TxnStep,
}

/// A request to copy one partition to a starting node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyRequest {
    pub to: NodeId,
    pub table: TableId,
    pub partition: PartitionId,
    /// The sync epoch: the source must know it (and forward writes) first.
    pub epoch: Epoch,
}

pub trait Transport: Send + Sync + 'static {
    /// Delivers images to `to`. An error with code STALE_EPOCH means the replica knows a newer
    /// primary; any other error means "not delivered, maybe try again".
    fn replicate(&self, to: NodeId, msg: Replicate) -> BoxFuture<Result<(), ShoalError>>;
    /// Opens a copy of a partition from its primary `from`.
    fn copy(&self, from: NodeId, req: CopyRequest) -> BoxFuture<Result<CopyStream, ShoalError>>;
    /// Learns peer addresses from a new map.
    fn update_peers(&self, map: &ClusterState);
    /// Sends a transaction control step (see `txn.rs`). Ok(Some(gci)): a committed outcome.
    fn txn_control(&self, to: NodeId, req: pb::TxnControlRequest) -> BoxFuture<Result<Option<u64>, ShoalError>>;
}

// ----- conversions (the gRPC edge of replication and copy) -----

pub fn image_to_pb(img: &Image) -> pb::RowImage {
    pb::RowImage {
        key: img.key.clone(),
        row: img.data.clone().unwrap_or_default(),
        deleted: img.data.is_none(),
        seq: img.seq,
    }
}

pub fn image_from_pb(img: pb::RowImage) -> Image {
    Image { key: img.key, data: (!img.deleted).then_some(img.row), seq: img.seq }
}

fn replicate_to_pb(m: &Replicate) -> pb::ReplicateRequest {
    pb::ReplicateRequest {
        from: m.from,
        table_id: m.table,
        partition: m.partition,
        primary_term: m.primary_term,
        rows: m.images.iter().map(image_to_pb).collect(),
        epoch: m.epoch,
        gci: m.gci,
        txn_id: m.txn.map_or(0, |t| t.id),
        txn_phase: m.txn.map_or(pb::TxnPhase::Unspecified, |t| match t.step {
            TxnStep::Prepare => pb::TxnPhase::Prepare,
            TxnStep::Commit => pb::TxnPhase::Commit,
            TxnStep::Abort => pb::TxnPhase::Abort,
            TxnStep::Record => pb::TxnPhase::Record,
        }) as i32,
        txn_tc: m.txn.map_or(0, |t| t.tc),
        confirmed: m.confirmed.clone(),
    }
}

pub fn replicate_from_pb(r: pb::ReplicateRequest) -> Replicate {
    Replicate {
        from: r.from,
        table: r.table_id,
        partition: r.partition,
        primary_term: r.primary_term,
        epoch: r.epoch,
        gci: r.gci,
        images: r.rows.into_iter().map(image_from_pb).collect(),
        txn: match pb::TxnPhase::try_from(r.txn_phase) {
            Ok(pb::TxnPhase::Prepare) => Some(TxnTag { id: r.txn_id, tc: r.txn_tc, step: TxnStep::Prepare }),
            Ok(pb::TxnPhase::Commit) => Some(TxnTag { id: r.txn_id, tc: r.txn_tc, step: TxnStep::Commit }),
            Ok(pb::TxnPhase::Abort) => Some(TxnTag { id: r.txn_id, tc: r.txn_tc, step: TxnStep::Abort }),
            Ok(pb::TxnPhase::Record) => Some(TxnTag { id: r.txn_id, tc: r.txn_tc, step: TxnStep::Record }),
            _ => None,
        },
        confirmed: r.confirmed,
    }
}

pub fn copy_from_pb(r: pb::CopyRequest) -> CopyRequest {
    CopyRequest { to: r.to, table: r.table_id, partition: r.partition, epoch: r.epoch }
}

pub fn chunk_to_pb(chunk: Result<Vec<Image>, ShoalError>) -> pb::CopyChunk {
    match chunk {
        Ok(rows) => pb::CopyChunk { error: None, rows: rows.iter().map(image_to_pb).collect() },
        Err(e) => pb::CopyChunk { error: Some(e.into()), rows: vec![] },
    }
}

/// One attempt to reach a replica.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
/// Replication batches in flight to one peer before further writes queue and merge. One, as
/// for the client's calls (`shoal_client::MAX_INFLIGHT_PER_NODE`): under load, everything that
/// arrives while a batch is out leaves as the next one; 4 gave 10–30% fewer writes and
/// transfers at 64 clients on a 2-core machine.
const MAX_INFLIGHT_PER_PEER: usize = 1;
/// Most partition messages merged into one replication request.
pub const MAX_REPLICATE_PARTS: usize = 1024;
/// Copy chunks buffered ahead of the applying side.
const COPY_QUEUE: usize = 4;

type ReplicateBatcher = Batcher<Replicate, Result<(), ShoalError>>;

struct Peer {
    addr: String,
    client: DataNodeClient<Channel>,
    /// Merges concurrent writes' replication to this peer into one request.
    replicate: Arc<ReplicateBatcher>,
    /// Transaction steps sent to this peer.
    control: Link<TxnControlCalls>,
}

/// Peers over gRPC: one lazily connected channel per peer, kept while its address holds.
#[derive(Default)]
pub struct GrpcTransport {
    peers: ArcSwap<IdMap<NodeId, Arc<Peer>>>,
}

impl GrpcTransport {
    fn peer(&self, id: NodeId) -> Result<Arc<Peer>, ShoalError> {
        self.peers
            .load()
            .get(&id)
            .cloned()
            .ok_or_else(|| ShoalError::new(ErrorCode::NodeNotReady, format!("no address for node {id}")))
    }
}

async fn replicate_merged(
    link: Arc<Link<ReplicateCalls>>,
    to: NodeId,
    msgs: Vec<Replicate>,
) -> Vec<Result<(), ShoalError>> {
    let n = msgs.len();
    let req = pb::ReplicateBatchRequest { parts: msgs.iter().map(replicate_to_pb).collect() };
    let _awaiting = shoal_proto::spin::awaiting();
    let answer = match tokio::time::timeout(ATTEMPT_TIMEOUT, link.call(req)).await {
        Ok(Ok(resp)) => {
            let results = resp.results;
            if results.len() == n {
                return results.into_iter().map(|r| shoal_proto::convert::check(r.error)).collect();
            }
            unreachable(to, "answered a different number of results")
        }
        Ok(Err(e)) => e,
        Err(_) => unreachable(to, "timed out"),
    };
    vec![Err(answer); n]
}

fn unreachable(id: NodeId, what: impl std::fmt::Display) -> ShoalError {
    ShoalError::new(ErrorCode::NodeNotReady, format!("node {id}: {what}"))
}

impl Transport for GrpcTransport {
    fn txn_control(&self, to: NodeId, req: pb::TxnControlRequest) -> BoxFuture<Result<Option<u64>, ShoalError>> {
        let peer = self.peer(to);
        Box::pin(async move {
            let peer = peer?;
            let _awaiting = shoal_proto::spin::awaiting();
            let resp = match tokio::time::timeout(TXN_CONTROL_TIMEOUT, peer.control.call(req)).await {
                Err(_) => return Err(unreachable(to, "no answer")),
                Ok(r) => r?,
            };
            shoal_proto::convert::check(resp.error)?;
            Ok(resp.committed.then_some(resp.gci))
        })
    }

    fn replicate(&self, to: NodeId, msg: Replicate) -> BoxFuture<Result<(), ShoalError>> {
        let peer = self.peer(to);
        Box::pin(async move {
            let peer = peer?;
            peer.replicate.call(msg).await.unwrap_or_else(|| Err(unreachable(to, "sender stopped")))
        })
    }

    fn copy(&self, from: NodeId, req: CopyRequest) -> BoxFuture<Result<CopyStream, ShoalError>> {
        let peer = self.peer(from);
        Box::pin(async move {
            let mut client = peer?.client.clone();
            let pb_req =
                pb::CopyRequest { to: req.to, table_id: req.table, partition: req.partition, epoch: req.epoch };
            let mut stream =
                client.copy_partition(pb_req).await.map_err(|s| unreachable(from, s.message()))?.into_inner();
            let (tx, rx) = mpsc::channel(COPY_QUEUE);
            tokio::spawn(async move {
                while let Some(chunk) = stream.next().await {
                    let chunk = match chunk {
                        Ok(c) => shoal_proto::convert::check(c.error)
                            .map(|()| c.rows.into_iter().map(image_from_pb).collect()),
                        Err(s) => Err(unreachable(from, s.message())),
                    };
                    let failed = chunk.is_err();
                    if tx.send(chunk).await.is_err() || failed {
                        return;
                    }
                }
            });
            Ok(rx)
        })
    }

    fn update_peers(&self, map: &ClusterState) {
        let cur = self.peers.load();
        let data_nodes = || map.nodes.iter().filter(|n| n.kind == NodeKind::DataNode);
        if data_nodes().all(|n| cur.get(&n.id).is_some_and(|p| p.addr == n.addr)) {
            return;
        }
        let mut peers = IdMap::default();
        for n in data_nodes() {
            if let Some(p) = cur.get(&n.id).filter(|p| p.addr == n.addr) {
                peers.insert(n.id, p.clone());
                continue;
            }
            match shoal_proto::grpc::channel(&n.addr, Duration::from_millis(500)) {
                Ok(ch) => {
                    let client = DataNodeClient::new(ch)
                        .max_decoding_message_size(crate::MAX_MESSAGE_BYTES)
                        .max_encoding_message_size(crate::MAX_MESSAGE_BYTES);
                    let to = n.id;
                    let conn = Arc::new(StreamConn::new(
                        &n.addr,
                        Duration::from_millis(500),
                        shoal_proto::grpc::Transport::Auto,
                        crate::MAX_MESSAGE_BYTES,
                    ));
                    let link = Arc::new(Link::<ReplicateCalls>::new(to, conn.clone()));
                    let replicate = Arc::new(Batcher::new(
                        MAX_INFLIGHT_PER_PEER,
                        MAX_REPLICATE_PARTS,
                        |_: &Replicate| 1,
                        move |msgs| replicate_merged(link.clone(), to, msgs),
                    ));
                    let control = Link::new(to, conn);
                    peers.insert(n.id, Arc::new(Peer { addr: n.addr.clone(), client, replicate, control }));
                }
                Err(e) => tracing::warn!(node = n.id, addr = %n.addr, "bad peer address: {e}"),
            }
        }
        self.peers.store(Arc::new(peers));
    }
}

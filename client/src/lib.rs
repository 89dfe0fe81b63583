//! The native Shoal client (the NDB API counterpart): bootstraps from mgmd, caches and watches
//! the cluster map, routes every key to its partition's primary, batches keys per data node,
//! and retries transparently on stale epochs, moved primaries and failed nodes until the
//! request's deadline. The SQL node, the CLI, the benchmarks and the tests all use it.
//!
//! Unique indexes (`IndexSpec::unique`) are kept by the SQL node, which writes their hidden
//! tables in the same transaction as the rows (`sqlnode/src/unique.rs`); writes through this
//! API do not, so tables with unique indexes should be written through SQL.

mod alter;
pub mod batcher;
mod index;
mod key_range;
pub mod link;
mod many_key;
pub mod mgmd;
mod read_many;
mod replica_turns;
mod txn;
pub mod users;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use shoal_proto::codec::{self, check_row, encode_key};
use shoal_proto::convert::{check, deltas_to_pb, values_from_pb, values_to_pb};
use shoal_proto::filter::Filter;
use shoal_proto::grpc_stream::StreamConn;
use shoal_proto::hash::IdMap;
use shoal_proto::pb::{self, data_node_client::DataNodeClient, mgmd_client::MgmdClient};
pub use shoal_proto::Delta;
use shoal_proto::{ClusterState, ErrorCode, NodeId, NodeState, PartitionId, ShoalError, Table, TableSpec, Value};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

pub use batcher::Batcher;
pub use index::{IndexRange, IndexScanOptions};
pub use mgmd::MgmdPool;
pub use shoal_proto::grpc::Transport;
pub use shoal_proto::{Column, ColumnType};
pub use txn::{LockMode, Transaction};

pub type Result<T> = std::result::Result<T, ShoalError>;
pub type Row = Vec<Value>;

/// How a reader takes the rows it reads: as the client's [`Row`]s ([`Values`]), or as a type of
/// its own decoded straight from the encoded rows of an answer (a SQL node's values). Building a
/// `Row` per row only to convert it cost a SQL node a tenth of its instructions on sysbench's
/// 100-row ranges.
pub trait RowDecoder: Sync {
    type Row: Send;
    /// A row as a data node encodes it, in `table`'s layout.
    fn decode(&self, table: &Table, data: &[u8]) -> Result<Self::Row>;
    /// A row that came back decoded already (reads that went the general way).
    fn convert(&self, row: Row) -> Self::Row;
}

/// Rows as [`Row`]s.
pub struct Values;

impl RowDecoder for Values {
    type Row = Row;
    fn decode(&self, table: &Table, data: &[u8]) -> Result<Row> {
        codec::decode_row(table, data)
    }
    fn convert(&self, row: Row) -> Row {
        row
    }
}

/// Deadline for one client call, retries included, unless the options say otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);
/// Longest pause between retries.
const MAX_BACKOFF: Duration = Duration::from_millis(200);
/// Batched requests in flight to one data node (per read mode, reads apart from writes) before
/// further calls queue and merge. One: while a batch is out, everything behind it merges into
/// the next, so a busy client sends one message per round trip instead of one per call. On a
/// 2-core machine that gave 10–20% more reads and point selects than 4 (each message costs both
/// ends a system call and the receiver a wake-up), and a lone caller waits for nobody; the cost
/// is up to one more round trip when calls arrive while one is out on an idle machine. Reads
/// never queue behind writes, which wait for their replication. The default of
/// `ClientOptions::max_inflight_per_node`: `shoal bench kv` with 2 ran 6–11% fewer key reads
/// and writes at 16 and 64 clients (benchmarks.md, "Thirty-sixth session"); the SQL node
/// allows 2 (`shoal_sqlnode::client_options`).
pub const MAX_INFLIGHT_PER_NODE: usize = 1;
/// Calls waiting at a client's home replica of a node group before a lone key read as the
/// primary goes to the next replica instead (see `Client::home_route`).
const HOME_QUEUE: usize = 16;
/// Most operations in one request to a data node (the data node's limit).
pub const MAX_OPS_PER_REQUEST: usize = 1000;
/// A `sync` write waits at least this long for its global checkpoint, whatever is left of
/// the call's deadline (a checkpoint takes up to `gcp_interval_ms` plus a round).
const MIN_DURABLE_WAIT: Duration = Duration::from_secs(5);
/// Rows per scan batch requested from a data node.
pub const SCAN_BATCH_ROWS: u32 = 1000;
/// Scan batches buffered in the client ahead of the reader.
const SCAN_QUEUE: usize = 4;

#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long a call may take, retries included.
    pub deadline: Duration,
    /// Read from any complete replica instead of the primary (reads only). A backup may show a
    /// write its primary has not applied yet.
    pub read_backup: bool,
    /// Key reads of [`Client::read_many`] may go to any complete replica, which answers them
    /// exactly as the primary would (`BatchRequest.as_primary`): a backup refuses keys with
    /// writes its primary has not confirmed, and those are read at the primary. One request
    /// per node group for a batch of keys instead of one per primary.
    pub read_any_replica: bool,
    /// With `read_any_replica`, a lone key read goes to this client's home replica of its node
    /// group, so that concurrent ones merge into one batch, unless many calls already wait
    /// there (`Client::home_route`). For a client with many concurrent callers (a SQL node);
    /// a lone caller's reads ran slower at one node than taking turns between two.
    pub home_replica: bool,
    /// How to reach the data nodes: their local sockets when they run in this network namespace
    /// (the default), or TCP always (`shoal_proto::grpc`, "Local sockets").
    pub transport: Transport,
    /// Batched key-operation requests in flight to one data node per batcher before further
    /// calls queue and merge ([`MAX_INFLIGHT_PER_NODE`] by default; at least one).
    pub max_inflight_per_node: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: DEFAULT_DEADLINE,
            read_backup: false,
            read_any_replica: false,
            home_replica: false,
            transport: Transport::Auto,
            max_inflight_per_node: MAX_INFLIGHT_PER_NODE,
        }
    }
}

/// Which batcher a key-operation request goes through: its data node, how it reads
/// (`read_backup`, `as_primary`) and whether it writes.
type BatcherKey = (NodeId, (bool, bool), bool);

/// One key operation of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyOp {
    Read {
        table: String,
        key: Row,
    },
    Insert {
        table: String,
        row: Row,
    },
    Upsert {
        table: String,
        row: Row,
    },
    /// Sets `columns` (by position) to `values` in the row with primary key `key`, then adds
    /// the `deltas` to their integer columns.
    Update {
        table: String,
        key: Row,
        columns: Vec<u32>,
        values: Row,
        deltas: Vec<Delta>,
    },
    Delete {
        table: String,
        key: Row,
    },
}

impl KeyOp {
    /// The name of the table the operation is on.
    pub fn table(&self) -> &str {
        match self {
            KeyOp::Read { table, .. }
            | KeyOp::Insert { table, .. }
            | KeyOp::Upsert { table, .. }
            | KeyOp::Update { table, .. }
            | KeyOp::Delete { table, .. } => table,
        }
    }
}

/// What one operation of a batch gave: reads give the row if found; updates give None when
/// they changed the row and an empty row when it already held their values (nothing was
/// written: MySQL counts such a row as matched, not changed); other writes give None.
pub type OpOutcome = Result<Option<Row>>;

#[derive(Clone, Debug, Default)]
pub struct RetryStats {
    pub retries: u64,
}

/// When a write is acknowledged (DESIGN §3 invariant 1, §4 "Durability").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Once every live replica holds it in memory. A whole-cluster power loss can lose the
    /// writes after the last complete global checkpoint (at most about `gcp_interval_ms`).
    #[default]
    Memory,
    /// Once its global checkpoint is complete: on disk on every live replica.
    Sync,
}

#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    links: Arc<Links>,
    durability: Durability,
}

/// A client's connections to the data nodes. Their tasks run on the runtime that first used
/// them, so a program with several runtimes gives each its own ([`Client::with_own_links`]):
/// a call and its answer then never cross threads.
#[derive(Default)]
struct Links {
    nodes: Mutex<IdMap<NodeId, (String, DataNodeClient<Channel>)>>,
    /// Per data node, its address and the connection the call streams to it run on.
    stream_conns: Mutex<IdMap<NodeId, (String, Arc<StreamConn>)>>,
    /// Key-operation batchers per (data node, (read-backup, as-primary), writes).
    batchers: Mutex<IdMap<BatcherKey, AddressedBatcher>>,
    /// Transactions' call streams per data node (and the address they go to).
    txn_links: Mutex<IdMap<NodeId, (String, Arc<TxnLinks>)>>,
}

struct Inner {
    mgmd: MgmdPool,
    map: ArcSwap<ClusterState>,
    epoch_tx: watch::Sender<u64>,
    /// Newest complete global checkpoint (advances without a new epoch).
    gci_tx: watch::Sender<u64>,
    /// Highest GCI this client asked mgmd to hurry.
    hurried: AtomicU64,
    opts: ClientOptions,
    /// Hidden primary keys: a random prefix per client and a counter.
    hidden_prefix: u64,
    hidden_next: AtomicU64,
    retries: AtomicU64,
    /// Turns of read-backup calls across replicas (see `route`).
    spread: AtomicUsize,
    /// Which replica of each node group is this client's home for lone key reads as the
    /// primary (`route`'s `spread`): random per client, so clients share the replicas.
    home: usize,
    /// Whether reads that may go to any replica take turns or keep to `home` (`read_many_as`).
    turns: replica_turns::ReplicaTurns,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(h) = self.watcher.lock().take() {
            h.abort();
        }
    }
}

struct Prepared {
    partition: u32,
    op: pb::Op,
    is_read: bool,
}

/// An operation's answer: a read's row decoded with the layout of the table the read was
/// routed by (`table_id`; a table id's columns never change, so any map that still holds it
/// will do), or an unchanged update's empty row (see [`OpOutcome`]).
fn row_of<'m>(
    map: &'m ClusterState,
    memo: &mut TableMemo<'m>,
    table_id: Option<u32>,
    r: &pb::OpResult,
) -> Result<Option<Row>> {
    if r.unchanged {
        return Ok(Some(Row::new()));
    }
    if !r.found {
        return Ok(None);
    }
    let table = table_id
        .and_then(|id| memo.by_id(map, id))
        .ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, "the table read was dropped"))?;
    codec::decode_row(table, &r.row_data).map(Some)
}

/// The table the previous operation of a batch named: a batch's operations mostly name one
/// table, and the map finds tables by walking its list.
#[derive(Default)]
struct TableMemo<'m> {
    last: Option<&'m Table>,
}

impl<'m> TableMemo<'m> {
    fn by_name(&mut self, map: &'m ClusterState, name: &str) -> Option<&'m Table> {
        match self.last {
            Some(t) if t.spec.name.eq_ignore_ascii_case(name) => Some(t),
            _ => {
                self.last = map.table(name);
                self.last
            }
        }
    }

    fn by_id(&mut self, map: &'m ClusterState, id: u32) -> Option<&'m Table> {
        match self.last {
            Some(t) if t.id == id => Some(t),
            _ => {
                self.last = map.table_by_id(id);
                self.last
            }
        }
    }
}

impl Client {
    /// Connects to the cluster through any of its mgmd nodes.
    pub async fn connect(mgmd_addrs: &[String]) -> Result<Client> {
        Client::connect_with(mgmd_addrs, ClientOptions::default()).await
    }

    pub async fn connect_with(mgmd_addrs: &[String], opts: ClientOptions) -> Result<Client> {
        let mgmd = MgmdPool::new(mgmd_addrs, Duration::from_millis(1000))?;
        let deadline = Instant::now() + opts.deadline;
        let map = loop {
            match mgmd.fetch_newest().await {
                Ok(m) if !m.partitions.is_empty() => break m,
                Ok(_) | Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Ok(_) => return Err(ShoalError::new(ErrorCode::NodeNotReady, "the cluster is not bootstrapped")),
                Err(e) => return Err(e),
            }
        };
        let (epoch_tx, _) = watch::channel(map.epoch);
        let (gci_tx, _) = watch::channel(map.gci_complete);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let inner = Arc::new(Inner {
            mgmd,
            map: ArcSwap::from_pointee(map),
            epoch_tx,
            gci_tx,
            hurried: AtomicU64::new(0),
            opts,
            hidden_prefix: shoal_proto::hash::fmix64(nanos ^ u64::from(std::process::id())) << 32,
            hidden_next: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            spread: AtomicUsize::new(0),
            home: shoal_proto::hash::fmix64(nanos ^ 0x686f_6d65) as usize,
            turns: replica_turns::ReplicaTurns::default(),
            watcher: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        let handle = tokio::spawn(watch_map(weak));
        *inner.watcher.lock() = Some(handle);
        Ok(Client { inner, links: Arc::default(), durability: Durability::default() })
    }

    /// The same connection acknowledging writes at another durability level.
    pub fn with_durability(&self, durability: Durability) -> Client {
        Client { inner: self.inner.clone(), links: self.links.clone(), durability }
    }

    /// This client for another runtime: the same map, watcher and options, with connections
    /// to the data nodes of its own, opened on first use by the runtime that uses them.
    pub fn with_own_links(&self) -> Client {
        Client { inner: self.inner.clone(), links: Arc::default(), durability: self.durability }
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Waits until global checkpoint `gci` is complete for `node_group`, up to `deadline`.
    async fn wait_durable(&self, gci: u64, node_group: u32, deadline: Instant) -> Result<()> {
        let mut rx = self.inner.gci_tx.subscribe();
        // Ask mgmd to checkpoint now rather than at its next interval (once per GCI; concurrent
        // writers share the round: group commit).
        if *rx.borrow() < gci && self.inner.hurried.fetch_max(gci, Ordering::AcqRel) < gci {
            let me = self.clone();
            tokio::spawn(async move {
                let _ = me.inner.mgmd.hurry_checkpoint(gci).await;
            });
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        let reached = matches!(tokio::time::timeout(wait, rx.wait_for(|&g| g >= gci)).await, Ok(Ok(_)));
        if reached && !self.map().gci_durable(gci, node_group) {
            return Err(ShoalError::new(
                ErrorCode::Timeout,
                format!("the write's global checkpoint {gci} was rolled back by a system restart: it is lost"),
            ));
        }
        match reached {
            true => Ok(()),
            false => Err(ShoalError::new(
                ErrorCode::Timeout,
                format!("written, but global checkpoint {gci} did not complete in time: durability on disk is not confirmed"),
            )),
        }
    }

    /// The same cluster connection with other options.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    pub fn map(&self) -> Arc<ClusterState> {
        self.inner.map.load_full()
    }

    /// How many times this client retried an operation (failovers show up here).
    pub fn retries(&self) -> u64 {
        self.inner.retries.load(Ordering::Relaxed)
    }

    pub fn mgmd(&self) -> &MgmdPool {
        &self.inner.mgmd
    }

    pub fn table(&self, name: &str) -> Result<Table> {
        self.map()
            .table(name)
            .cloned()
            .ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, format!("table {name} does not exist")))
    }

    /// Fetches the newest map now.
    pub async fn refresh(&self) -> Result<()> {
        let m = self.inner.mgmd.fetch_newest().await?;
        self.inner.install(m);
        Ok(())
    }

    // ----- DDL -----

    pub async fn create_table(&self, spec: TableSpec, if_not_exists: bool) -> Result<Table> {
        self.create_table_with_indexes(spec, vec![], if_not_exists).await
    }

    pub async fn drop_table(&self, name: &str, if_exists: bool) -> Result<()> {
        let req = pb::DropTableRequest { name: name.to_string(), if_exists };
        self.catalog_change(req, |mut c, r| async move { c.drop_table(r).await }).await?;
        Ok(())
    }

    /// Runs one catalog change on the mgmd leader (`call` sends the request with a client)
    /// and waits until this client's map shows it.
    async fn catalog_change<R, F, Fut>(&self, req: R, call: F) -> Result<pb::AdminResponse>
    where
        R: Clone,
        F: Fn(MgmdClient<Channel>, R) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<pb::AdminResponse>, tonic::Status>>,
    {
        let resp = self
            .inner
            .mgmd
            .on_leader(|c| {
                let sent = call(c, req.clone());
                async move {
                    let r = sent.await?.into_inner();
                    let e = r.error.clone();
                    Ok((r, e))
                }
            })
            .await?;
        self.wait_for_epoch(resp.epoch).await;
        Ok(resp)
    }

    async fn wait_for_epoch(&self, epoch: u64) {
        let deadline = Instant::now() + self.inner.opts.deadline;
        while self.map().epoch < epoch && Instant::now() < deadline {
            if self.refresh().await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    // ----- key operations -----

    pub async fn insert(&self, table: &str, row: Row) -> Result<()> {
        self.one(KeyOp::Insert { table: table.into(), row }).await.map(|_| ())
    }

    pub async fn upsert(&self, table: &str, row: Row) -> Result<()> {
        self.one(KeyOp::Upsert { table: table.into(), row }).await.map(|_| ())
    }

    /// Sets the named columns of the row with this primary key.
    pub async fn update(&self, table: &str, key: Row, set: &[(&str, Value)]) -> Result<()> {
        let t = self.table(table)?;
        let mut columns = vec![];
        let mut values = vec![];
        for (name, v) in set {
            let c = t.column_index(name).ok_or_else(|| {
                ShoalError::new(ErrorCode::InvalidArgument, format!("table {table} has no column {name}"))
            })?;
            columns.push(c as u32);
            values.push(v.clone());
        }
        self.one(KeyOp::Update { table: table.into(), key, columns, values, deltas: vec![] }).await.map(|_| ())
    }

    pub async fn delete(&self, table: &str, key: Row) -> Result<()> {
        self.one(KeyOp::Delete { table: table.into(), key }).await.map(|_| ())
    }

    /// Reads one row by primary key.
    pub async fn get(&self, table: &str, key: Row) -> Result<Option<Row>> {
        self.one(KeyOp::Read { table: table.into(), key }).await
    }

    /// Reads many rows by primary key in one round trip per data node.
    pub async fn batch_get(&self, table: &str, keys: Vec<Row>) -> Result<Vec<Option<Row>>> {
        self.batch_get_columns(table, keys, &[]).await
    }

    /// [`Client::batch_get`] of only some columns (positions; empty = all): the rows come
    /// back whole, with the other columns NULL, and the data nodes send only what was asked.
    pub async fn batch_get_columns(&self, table: &str, keys: Vec<Row>, columns: &[u32]) -> Result<Vec<Option<Row>>> {
        self.read_many(table, keys, columns).await.into_iter().collect()
    }

    async fn one(&self, op: KeyOp) -> Result<Option<Row>> {
        self.batch(vec![op]).await.pop().unwrap_or_else(|| Err(ShoalError::internal("empty batch result")))
    }

    /// Runs key operations, batched per data node; each gets its own outcome. Operations are
    /// independent (no transaction): each is atomic and durable on every live replica when it
    /// succeeds.
    pub async fn batch(&self, ops: Vec<KeyOp>) -> Vec<OpOutcome> {
        let read_backup = self.inner.opts.read_backup;
        self.run_batch(ops, read_backup, None, &[]).await.0
    }

    /// Like [`Client::batch`], also giving the global checkpoint each successful write was
    /// committed in (0 for reads): a whole-cluster restart restores exactly the writes whose
    /// GCI is at most the last complete one.
    pub async fn batch_with_gci(&self, ops: Vec<KeyOp>) -> Vec<Result<(Option<Row>, u64)>> {
        let read_backup = self.inner.opts.read_backup;
        let (out, gcis) = self.run_batch(ops, read_backup, None, &[]).await;
        out.into_iter().zip(gcis).map(|(o, g)| o.map(|r| (r, g))).collect()
    }

    /// Reads a key from one particular data node (which must hold a complete replica), for
    /// checks of replication.
    pub async fn get_from_node(&self, node: NodeId, table: &str, key: Row) -> Result<Option<Row>> {
        self.run_batch(vec![KeyOp::Read { table: table.into(), key }], true, Some(node), &[])
            .await
            .0
            .pop()
            .unwrap_or_else(|| Err(ShoalError::internal("empty batch result")))
    }

    /// A row to insert into `table` with its hidden primary key chosen, when the table has one
    /// and the row lacks it (callers that must know the key choose it before inserting).
    pub fn with_hidden_key(&self, table: &Table, mut row: Row) -> Row {
        if table.hidden_pk && row.len() + 1 == table.columns().len() {
            let n = self.inner.hidden_next.fetch_add(1, Ordering::Relaxed);
            row.push(Value::Uint(self.inner.hidden_prefix | (n & 0xffff_ffff)));
        }
        row
    }

    fn prepare(&self, map: &ClusterState, op: &KeyOp) -> Result<Prepared> {
        self.prepare_with(map, &mut TableMemo::default(), op, &[])
    }

    /// `columns`: the columns a read asks for (empty = all).
    fn prepare_with<'m>(
        &self,
        map: &'m ClusterState,
        memo: &mut TableMemo<'m>,
        op: &KeyOp,
        columns: &[u32],
    ) -> Result<Prepared> {
        let (name, kind) = match op {
            KeyOp::Read { table, .. } => (table, pb::OpKind::Read),
            KeyOp::Insert { table, .. } => (table, pb::OpKind::Insert),
            KeyOp::Upsert { table, .. } => (table, pb::OpKind::Upsert),
            KeyOp::Update { table, .. } => (table, pb::OpKind::Update),
            KeyOp::Delete { table, .. } => (table, pb::OpKind::Delete),
        };
        let table = memo
            .by_name(map, name)
            .ok_or_else(|| ShoalError::new(ErrorCode::NoSuchTable, format!("table {name} does not exist")))?;
        if let KeyOp::Read { key, .. } = op {
            // Reads send the encoded key, which the data node looks up as it is.
            let key_data = codec::encode_key_ref(table, key)?;
            let partition = codec::partition_of_encoded_key(table, &key_data)?;
            let op = pb::Op {
                kind: kind as i32,
                table_id: table.id,
                partition,
                key_data: key_data.into(),
                columns: columns.to_vec(),
                ..Default::default()
            };
            return Ok(Prepared { partition, op, is_read: true });
        }
        let (key, row, columns, deltas) = match op {
            KeyOp::Read { key, .. } | KeyOp::Delete { key, .. } => (key.clone(), vec![], vec![], vec![]),
            KeyOp::Update { key, columns, values, deltas, .. } => {
                (key.clone(), values.clone(), columns.clone(), deltas_to_pb(deltas))
            }
            KeyOp::Insert { row, .. } | KeyOp::Upsert { row, .. } => {
                let row = check_row(table, self.with_hidden_key(table, row.clone()))?;
                (table.key_of(&row), row, vec![], vec![])
            }
        };
        let (_, key) = encode_key(table, key)?;
        let partition = codec::partition_of_key(table, &key);
        let key = if matches!(kind, pb::OpKind::Insert | pb::OpKind::Upsert) { vec![] } else { key };
        Ok(Prepared {
            partition,
            op: pb::Op {
                kind: kind as i32,
                table_id: table.id,
                partition,
                key: values_to_pb(key),
                row: values_to_pb(row),
                columns,
                deltas,
                ..Default::default()
            },
            is_read: kind == pb::OpKind::Read,
        })
    }

    async fn run_batch(
        &self,
        ops: Vec<KeyOp>,
        read_backup: bool,
        only_node: Option<NodeId>,
        columns: &[u32],
    ) -> (Vec<OpOutcome>, Vec<u64>) {
        let deadline = Instant::now() + self.inner.opts.deadline;
        let mut out: Vec<Option<OpOutcome>> = vec![None; ops.len()];
        let mut gcis: Vec<u64> = vec![0; ops.len()];
        // Node group of each operation's partition (for durability waits).
        let mut group_of: Vec<u32> = vec![0; ops.len()];
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        let mut backoff = Duration::from_millis(5);
        let mut last_err: IdMap<usize, ShoalError> = IdMap::default();
        // Read-backup reads of one call go to one replica where they can (one request
        // instead of one per replica); calls take turns across the replicas.
        let mut spread = self.inner.spread.fetch_add(1, Ordering::Relaxed);
        let mut refreshed_for_missing = false;
        // The table each operation was first prepared against: a retry that finds another
        // table under the name (ALTER TABLE swapped a copy in) must not write into it.
        let mut pinned: Vec<Option<u32>> = vec![None; ops.len()];
        loop {
            let mut missing = false;
            let map = self.map();
            let mut by_node: IdMap<NodeId, Vec<(usize, Prepared)>> = IdMap::default();
            let mut retry = vec![];
            let mut memo = TableMemo::default();
            for &i in &pending {
                if pinned[i].is_some_and(|t| map.table(ops[i].table()).map(|x| x.id) != Some(t)) {
                    out[i] = Some(Err(schema_changed()));
                    continue;
                }
                let prepared = match self.prepare_with(&map, &mut memo, &ops[i], columns) {
                    Ok(p) => {
                        pinned[i] = Some(p.op.table_id);
                        p
                    }
                    Err(e) if e.code == ErrorCode::NoSuchTable && !refreshed_for_missing => {
                        // Another client may have just created it: look at the newest map once.
                        missing = true;
                        retry.push(i);
                        last_err.insert(i, e);
                        continue;
                    }
                    Err(e) => {
                        out[i] = Some(Err(e));
                        continue;
                    }
                };
                group_of[i] = map.partitions.get(prepared.partition as usize).map_or(0, |p| p.node_group);
                match route(&map, prepared.partition, prepared.is_read, read_backup, only_node, spread) {
                    Some(node) => by_node.entry(node).or_default().push((i, prepared)),
                    None => {
                        last_err.insert(
                            i,
                            ShoalError::new(
                                ErrorCode::PartitionUnavailable,
                                format!("partition {} has no live replica", prepared.partition),
                            ),
                        );
                        retry.push(i);
                    }
                }
            }
            // One request per data node, split so none passes the node's batch limit.
            let mut requests = vec![];
            for (node, mut items) in by_node {
                while items.len() > MAX_OPS_PER_REQUEST {
                    let rest = items.split_off(MAX_OPS_PER_REQUEST);
                    requests.push((node, items));
                    items = rest;
                }
                requests.push((node, items));
            }
            let sends = requests.into_iter().map(|(node, items)| {
                let map = map.clone();
                async move {
                    let (idx, prepared): (Vec<usize>, Vec<Prepared>) = items.into_iter().unzip();
                    let (ops, members) = many_key::pack(prepared.into_iter().map(|p| p.op).collect());
                    let req = pb::BatchRequest { epoch: map.epoch, read_backup, ops, ..Default::default() };
                    (idx, self.send(node, req).await.map(|results| many_key::unpack(&members, results)))
                }
            });
            let mut saw_newer_epoch = false;
            let mut memo = TableMemo::default();
            for (idx, resp) in futures::future::join_all(sends).await {
                match resp {
                    Ok(results) => {
                        for (i, mut r) in idx.into_iter().zip(results) {
                            match check(r.error.take()) {
                                Ok(()) => {
                                    gcis[i] = r.gci;
                                    out[i] = Some(row_of(&map, &mut memo, pinned[i], &r));
                                }
                                Err(e) if e.is_retriable() => {
                                    saw_newer_epoch |= e.current_epoch > map.epoch;
                                    last_err.insert(i, e);
                                    retry.push(i);
                                }
                                // The node knows a newer map without the table: dropped, or
                                // replaced under its name by ALTER TABLE. The newest map tells
                                // which (the retry then answers SCHEMA_CHANGED or NO_SUCH_TABLE).
                                Err(e) if e.code == ErrorCode::NoSuchTable && !refreshed_for_missing => {
                                    missing = true;
                                    last_err.insert(i, e);
                                    retry.push(i);
                                }
                                Err(e) => out[i] = Some(Err(e)),
                            }
                        }
                    }
                    Err(e) if e.is_retriable() => {
                        saw_newer_epoch |= e.current_epoch > map.epoch;
                        for i in idx {
                            last_err.insert(i, e.clone());
                            retry.push(i);
                        }
                    }
                    Err(e) => {
                        for i in idx {
                            out[i] = Some(Err(e.clone()));
                        }
                    }
                }
            }
            if retry.is_empty() {
                break;
            }
            if Instant::now() + backoff >= deadline {
                for i in retry {
                    let e =
                        last_err.remove(&i).unwrap_or_else(|| ShoalError::new(ErrorCode::Timeout, "deadline passed"));
                    out[i] = Some(Err(ShoalError::new(
                        ErrorCode::Timeout,
                        format!("gave up after {:?}: {e}", self.inner.opts.deadline),
                    )));
                }
                break;
            }
            self.inner.retries.fetch_add(retry.len() as u64, Ordering::Relaxed);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            if saw_newer_epoch || missing || backoff >= Duration::from_millis(40) {
                refreshed_for_missing |= missing;
                let _ = self.refresh().await;
            }
            pending = retry;
            // A read-backup retry asks another replica.
            spread = spread.wrapping_add(1);
        }
        let mut out: Vec<OpOutcome> = out
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err(ShoalError::internal("operation without outcome"))))
            .collect();
        if self.durability == Durability::Sync {
            let wait_until = deadline.max(Instant::now() + MIN_DURABLE_WAIT);
            // One wait per node group, for the newest GCI any of its writes got.
            let mut newest: IdMap<u32, u64> = IdMap::default();
            for (i, &g) in gcis.iter().enumerate().filter(|(_, &g)| g > 0) {
                let e = newest.entry(group_of[i]).or_default();
                *e = (*e).max(g);
            }
            for (group, gci) in newest {
                if let Err(e) = self.wait_durable(gci, group, wait_until).await {
                    for (i, o) in out.iter_mut().enumerate() {
                        if gcis[i] > 0 && group_of[i] == group && o.is_ok() {
                            *o = Err(e.clone());
                        }
                    }
                }
            }
            // The newest GCI being durable says nothing of older ones: an operation done before
            // a whole-cluster crash and one retried after it land in different lives, and the
            // older one's GCI may have been rolled back by the system restart.
            let map = self.map();
            for (i, o) in out.iter_mut().enumerate() {
                if gcis[i] > 0 && o.is_ok() && !map.gci_durable(gcis[i], group_of[i]) {
                    *o = Err(ShoalError::new(
                        ErrorCode::Timeout,
                        format!(
                            "the write's global checkpoint {} was rolled back by a system restart: it is lost",
                            gcis[i]
                        ),
                    ));
                }
            }
        }
        (out, gcis)
    }

    fn node_client(&self, id: NodeId) -> Result<DataNodeClient<Channel>> {
        let addr = self.addr_of(id)?;
        cached_for(&self.links.nodes, id, &addr, || {
            let ch = shoal_proto::grpc::channel_over(&addr, Duration::from_millis(500), self.inner.opts.transport)?;
            Ok(DataNodeClient::new(ch)
                .max_decoding_message_size(MAX_ANSWER_BYTES)
                .max_encoding_message_size(MAX_ANSWER_BYTES))
        })
    }

    /// Node `id`'s address in the current map.
    fn addr_of(&self, id: NodeId) -> Result<String> {
        self.map()
            .node(id)
            .map(|n| n.addr.clone())
            .ok_or_else(|| ShoalError::internal(format!("node {id} is not in the map")))
    }

    /// Sends `req` to `node` through that node's batcher, which merges it with concurrent
    /// requests from other callers of this client.
    async fn send(&self, node: NodeId, req: pb::BatchRequest) -> Result<Vec<pb::OpResult>> {
        let writes = req.ops.iter().any(|o| o.kind != pb::OpKind::Read as i32);
        let batcher = self.batcher(node, (req.read_backup, req.as_primary), writes)?;
        send_through(node, &batcher, req).await
    }

    /// Where a lone key read as the primary of `partition` goes, with the batcher it goes
    /// through: the client's home replica of the node group, unless `HOME_QUEUE` calls or more
    /// wait there, then the next one. Concurrent lone reads (a SQL node's point selects) then
    /// merge into one batch per node group, where taking turns split them over the replicas,
    /// each batch paying a message's costs at both ends; once a batch is out and enough queue
    /// behind it, the next replica's round trip overlaps it. Sysbench point selects,
    /// `benches/ab_sysbench.sh`, medians against turns: 16 threads +9%, 64 even, 1024 even;
    /// but `shoal bench kv` with one client, which has nothing to merge, read a third slower at
    /// one node than taking turns (benchmarks.md, "Twenty-fifth session"), hence
    /// `ClientOptions::home_replica`. None when no replica can be asked this way: the read then
    /// goes the way every other read goes.
    fn home_route(
        &self,
        map: &ClusterState,
        partition: PartitionId,
        read: (bool, bool),
    ) -> Option<(NodeId, Arc<NodeBatcher>)> {
        let home = self.inner.home;
        let node = route(map, partition, true, true, None, home)?;
        let batcher = self.batcher(node, read, false).ok()?;
        if batcher.queued() < HOME_QUEUE {
            return Some((node, batcher));
        }
        let next = route(map, partition, true, true, None, home.wrapping_add(1))?;
        Some((next, self.batcher(next, read, false).ok()?))
    }

    /// The connection for call streams to node `id` at its current address.
    fn stream_conn(&self, id: NodeId) -> Result<Arc<StreamConn>> {
        let addr = self.addr_of(id)?;
        cached_for(&self.links.stream_conns, id, &addr, || {
            let transport = self.inner.opts.transport;
            Ok(Arc::new(StreamConn::new(&addr, Duration::from_millis(500), transport, MAX_ANSWER_BYTES)))
        })
    }

    /// The entry under `key` in `table` while it was made for node `id`'s current address;
    /// otherwise a new one from `make` (given the call-stream connection to that address)
    /// replaces it.
    fn per_address<K: std::hash::Hash + Eq, T>(
        &self,
        table: &Mutex<IdMap<K, (String, Arc<T>)>>,
        key: K,
        id: NodeId,
        make: impl FnOnce(Arc<StreamConn>) -> T,
    ) -> Result<Arc<T>> {
        let addr = self.addr_of(id)?;
        cached_for(table, key, &addr, || Ok(Arc::new(make(self.stream_conn(id)?))))
    }

    /// The streams that carry transactions' operations and commits to node `id`.
    fn txn_links(&self, id: NodeId) -> Result<Arc<TxnLinks>> {
        self.per_address(&self.links.txn_links, id, id, |conn| TxnLinks {
            execute: link::Link::new(id, conn.clone()),
            commit: link::Link::new(id, conn),
        })
    }

    /// The batcher of requests to node `id` read the way `read` says (`read_backup`,
    /// `as_primary`: requests merge only with ones read alike) and with or without writes.
    fn batcher(&self, id: NodeId, read: (bool, bool), writes: bool) -> Result<Arc<NodeBatcher>> {
        let attempt = self.inner.opts.deadline.min(Duration::from_secs(3));
        self.per_address(&self.links.batchers, (id, read, writes), id, |conn| {
            let link = Arc::new(link::Link::<link::ExecuteCalls>::new(id, conn));
            Batcher::new(
                self.inner.opts.max_inflight_per_node,
                MAX_OPS_PER_REQUEST,
                // A many-key or range read weighs a key each, as the data node counts it.
                |r: &pb::BatchRequest| r.ops.iter().map(pb::Op::weight).sum(),
                move |reqs: Vec<pb::BatchRequest>| execute_merged(link.clone(), id, attempt, reqs),
            )
        })
    }

    // ----- scans -----

    /// Streams every row of `table` that passes all `filters` (evaluated in the data nodes),
    /// partition by partition. Projection: column positions, empty for all. A failure before a
    /// partition sent its first rows is retried; one in the middle of a partition ends the
    /// stream with an error.
    pub fn scan(
        &self,
        table: &str,
        filters: Vec<Filter>,
        projection: Vec<u32>,
    ) -> tokio_stream::wrappers::ReceiverStream<Result<Row>> {
        self.scan_partitions(table, None, filters, projection)
    }

    /// Like [`Client::scan`], over one partition only when `only` is given (partition pruning:
    /// the SQL node knows every matching row has that partition key).
    pub fn scan_partitions(
        &self,
        table: &str,
        only: Option<u32>,
        filters: Vec<Filter>,
        projection: Vec<u32>,
    ) -> tokio_stream::wrappers::ReceiverStream<Result<Row>> {
        let (tx, rx) = mpsc::channel(SCAN_QUEUE * SCAN_BATCH_ROWS as usize);
        let client = self.clone();
        let table = table.to_string();
        tokio::spawn(async move {
            if let Err(e) = client.scan_into(&table, only, filters, projection, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }

    async fn scan_into(
        &self,
        table: &str,
        only: Option<u32>,
        filters: Vec<Filter>,
        projection: Vec<u32>,
        tx: &mpsc::Sender<Result<Row>>,
    ) -> Result<()> {
        let t = self.table(table)?;
        let base = pb::ScanRequest {
            epoch: 0,
            table_id: t.id,
            partition: 0,
            filters: filters.iter().map(Filter::to_pb).collect(),
            projection,
            batch_rows: SCAN_BATCH_ROWS,
            read_backup: self.inner.opts.read_backup,
            index: None,
        };
        for partition in 0..t.partition_count {
            if only.is_some_and(|p| p != partition) {
                continue;
            }
            self.scan_partition_retrying(partition, &base, tx).await?;
        }
        Ok(())
    }

    /// Scans one partition as `base` says (its epoch and partition filled in here), retrying
    /// elsewhere on retriable errors until rows have been sent or the deadline passes.
    async fn scan_partition_retrying(
        &self,
        partition: u32,
        base: &pb::ScanRequest,
        tx: &mpsc::Sender<Result<Row>>,
    ) -> Result<()> {
        let read_backup = base.read_backup;
        let deadline = Instant::now() + self.inner.opts.deadline;
        let mut spread = partition as usize;
        loop {
            let map = self.map();
            let req = pb::ScanRequest { epoch: map.epoch, partition, ..base.clone() };
            // Each attempt asks the next replica.
            spread = spread.wrapping_add(1);
            let result = match route(&map, partition, true, read_backup, None, spread) {
                None => Err((
                    false,
                    ShoalError::new(
                        ErrorCode::PartitionUnavailable,
                        format!("partition {partition} has no live replica"),
                    ),
                )),
                Some(node) => self.scan_partition(node, req, tx).await,
            };
            match result {
                Ok(()) => return Ok(()),
                Err((false, e)) if e.is_retriable() && Instant::now() < deadline => {
                    self.inner.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = self.refresh().await;
                }
                Err((_, e)) => return Err(e),
            }
        }
    }

    /// Err((rows_already_sent, error)).
    async fn scan_partition(
        &self,
        node: NodeId,
        req: pb::ScanRequest,
        tx: &mpsc::Sender<Result<Row>>,
    ) -> std::result::Result<(), (bool, ShoalError)> {
        let mut client = self.node_client(node).map_err(|e| (false, e))?;
        let mut stream = client
            .scan(req)
            .await
            .map_err(|s| (false, ShoalError::new(ErrorCode::NodeNotReady, format!("node {node}: {}", s.message()))))?
            .into_inner();
        let mut sent = false;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|s| {
                (sent, ShoalError::new(ErrorCode::NodeNotReady, format!("node {node}: {}", s.message())))
            })?;
            check(batch.error).map_err(|e| (sent, e))?;
            for row in batch.rows {
                sent = true;
                if tx.send(Ok(values_from_pb(row.values))).await.is_err() {
                    return Ok(()); // reader went away
                }
            }
            if batch.last {
                return Ok(());
            }
        }
        Err((sent, ShoalError::new(ErrorCode::NodeNotReady, format!("node {node} ended the scan early"))))
    }
}

/// A node's streams for transactions: operations, and commits (where it coordinates).
struct TxnLinks {
    execute: link::Link<link::TxnExecuteCalls>,
    commit: link::Link<link::TxnCommitCalls>,
}
type NodeBatcher = Batcher<pb::BatchRequest, Result<Vec<pb::OpResult>>>;

/// `req` sent to `node` through its batcher `batcher`.
async fn send_through(node: NodeId, batcher: &NodeBatcher, req: pb::BatchRequest) -> Result<Vec<pb::OpResult>> {
    batcher
        .call(req)
        .await
        .unwrap_or_else(|| Err(ShoalError::new(ErrorCode::NodeNotReady, format!("node {node}: sender stopped"))))
}

/// Most bytes of one answer from a data node.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The entry under `key` in `table` while it was made for `addr`; otherwise a new one from
/// `make` replaces it (made without the table's lock held: making one may take other locks).
fn cached_for<K: std::hash::Hash + Eq, T: Clone>(
    table: &Mutex<IdMap<K, (String, T)>>,
    key: K,
    addr: &str,
    make: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if let Some((a, t)) = table.lock().get(&key) {
        if a == addr {
            return Ok(t.clone());
        }
    }
    let made = make()?;
    table.lock().insert(key, (addr.to_string(), made.clone()));
    Ok(made)
}

/// A batcher and the node address it sends to.
type AddressedBatcher = (String, Arc<NodeBatcher>);

/// Sends several callers' requests to one data node as one, and splits the answer.
async fn execute_merged(
    link: Arc<link::Link<link::ExecuteCalls>>,
    node: NodeId,
    attempt: Duration,
    reqs: Vec<pb::BatchRequest>,
) -> Vec<Result<Vec<pb::OpResult>>> {
    // A request alone (most, below a few concurrent callers) goes as it is: no counts, no
    // merged copy of its operations, no split of its results.
    let reqs = match <[pb::BatchRequest; 1]>::try_from(reqs) {
        Ok([req]) => return vec![execute_checked(&link, node, attempt, req).await],
        Err(reqs) => reqs,
    };
    let counts: Vec<usize> = reqs.iter().map(|r| r.ops.len()).collect();
    let merged = pb::BatchRequest {
        epoch: reqs.iter().map(|r| r.epoch).max().unwrap_or(0),
        read_backup: reqs.first().is_some_and(|r| r.read_backup),
        as_primary: reqs.first().is_some_and(|r| r.as_primary),
        ops: reqs.into_iter().flat_map(|r| r.ops).collect(),
        schema_version: 0,
    };
    match execute_checked(&link, node, attempt, merged).await {
        Ok(results) => {
            let mut results = results.into_iter();
            counts.into_iter().map(|n| Ok(results.by_ref().take(n).collect())).collect()
        }
        Err(e) => counts.into_iter().map(|_| Err(e.clone())).collect(),
    }
}

/// The results of `req` from `node` within `attempt`: one per operation, or an error.
async fn execute_checked(
    link: &link::Link<link::ExecuteCalls>,
    node: NodeId,
    attempt: Duration,
    req: pb::BatchRequest,
) -> Result<Vec<pb::OpResult>> {
    let n = req.ops.len();
    match tokio::time::timeout(attempt, link.call(req)).await {
        Ok(Ok(resp)) => match check(resp.error) {
            Ok(()) if resp.results.len() == n => Ok(resp.results),
            Ok(()) => Err(ShoalError::internal(format!("node {node} answered a different number of results"))),
            Err(e) => Err(e),
        },
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ShoalError::new(ErrorCode::Timeout, format!("node {node} did not answer in {attempt:?}"))),
    }
}

/// Picks the node for an operation: the primary, or for a read-backup read the complete live
/// replica number `spread` (modulo their count, in node id order: operations of one call
/// with the same `spread` meet on as few nodes as the partitions allow).
fn route(
    map: &ClusterState,
    partition: PartitionId,
    is_read: bool,
    read_backup: bool,
    only: Option<NodeId>,
    spread: usize,
) -> Option<NodeId> {
    let pa = map.partition(partition)?;
    if let Some(n) = only {
        return Some(n);
    }
    if read_backup && is_read {
        let mut up: Vec<NodeId> = pa
            .replicas
            .iter()
            .filter(|r| !r.syncing() && map.node(r.node_id).is_some_and(|n| n.state == NodeState::Up))
            .map(|r| r.node_id)
            .collect();
        if !up.is_empty() {
            up.sort_unstable();
            return Some(up[spread % up.len()]);
        }
    }
    pa.primary
}

impl Inner {
    fn install(&self, m: ClusterState) {
        let cur = self.map.load();
        // gci_complete and users_version advance without a new epoch; within one epoch a newer
        // map has neither smaller (they come from one Raft log).
        let newer_same_epoch = (m.gci_complete, m.users_version) > (cur.gci_complete, cur.users_version);
        if m.epoch > cur.epoch || (m.epoch == cur.epoch && newer_same_epoch) {
            let (e, g) = (m.epoch, m.gci_complete);
            self.map.store(Arc::new(m));
            self.epoch_tx.send_if_modified(|old| std::mem::replace(old, e) != e);
            self.gci_tx.send_if_modified(|old| {
                let newer = g > *old;
                *old = (*old).max(g);
                newer
            });
        }
    }
}

/// Follows the map through a watch stream from one mgmd after another while the client lives.
async fn watch_map(inner: std::sync::Weak<Inner>) {
    let mut i = 0usize;
    loop {
        let Some(me) = inner.upgrade() else { return };
        let mut c = me.mgmd.client(i);
        let known = me.map.load().epoch;
        let timeout = me.mgmd.call_timeout();
        drop(me);
        if let Ok(Ok(resp)) =
            tokio::time::timeout(timeout, c.watch_cluster_state(pb::WatchRequest { known_epoch: known })).await
        {
            let mut stream = resp.into_inner();
            while let Some(Ok(state)) = stream.next().await {
                let Some(me) = inner.upgrade() else { return };
                if let Ok(s) = ClusterState::try_from(state) {
                    me.install(s);
                }
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A retry found a different table under the operation's table name.
pub(crate) fn schema_changed() -> ShoalError {
    ShoalError::new(ErrorCode::SchemaChanged, "the table was replaced (ALTER TABLE) during the operation")
}

/// The table a catalog change answered with.
pub(crate) fn table_of(resp: pb::AdminResponse) -> Result<Table> {
    let t = resp.table.ok_or_else(|| ShoalError::internal("mgmd answered without the table"))?;
    Table::try_from(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::{NodeKind, PartitionAssignment, Replica};

    /// One node group of data nodes 11, 12, 13 over four partitions with varying primaries
    /// and replica orders; 13 still syncing in partition 1.
    fn map() -> ClusterState {
        let node = |id, state| shoal_proto::Node {
            id,
            kind: NodeKind::DataNode,
            addr: String::new(),
            state,
            node_group: 0,
            pid: 0,
            incarnation: 1,
            sync_epoch: 0,
            restorable_gci: 0,
        };
        let part = |partition: u32, replicas: Vec<Replica>| PartitionAssignment {
            partition,
            node_group: 0,
            primary: Some(replicas[0].node_id),
            primary_term: 1,
            replicas,
        };
        let c = Replica::complete;
        ClusterState {
            epoch: 1,
            nodes: vec![node(11, NodeState::Up), node(12, NodeState::Up), node(13, NodeState::Up)],
            partitions: vec![
                part(0, vec![c(11), c(12), c(13)]),
                part(1, vec![c(12), c(11), Replica { node_id: 13, sync_epoch: 1 }]),
                part(2, vec![c(13), c(12), c(11)]),
                part(3, vec![c(12), c(13), c(11)]),
            ],
            ..ClusterState::default()
        }
    }

    #[test]
    fn read_backup_calls_meet_on_one_replica_and_take_turns() {
        let map = map();
        for spread in 0..6 {
            let nodes: Vec<_> = [0, 2, 3].iter().map(|&p| route(&map, p, true, true, None, spread).unwrap()).collect();
            assert!(nodes.iter().all(|&n| n == nodes[0]), "turn {spread}: {nodes:?}");
            assert_eq!(nodes[0], [11, 12, 13][spread % 3]);
        }
        // A syncing replica serves nothing: partition 1 takes turns over 11 and 12 only.
        let turns: Vec<_> = (0..4).map(|s| route(&map, 1, true, true, None, s).unwrap()).collect();
        assert_eq!(turns, [11, 12, 11, 12]);
        // Writes, and reads without read-backup, go to the primary.
        assert_eq!(route(&map, 2, false, true, None, 1), Some(13));
        assert_eq!(route(&map, 3, true, false, None, 0), Some(12));
    }
}

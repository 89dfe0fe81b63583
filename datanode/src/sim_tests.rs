//! Data nodes in one process over a simulated network, driven by the real mgmd state machine:
//! the replication and node-restart protocols tested without sockets.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_mgmd::state::{Command, JoinInfo, Model};
use shoal_proto::config::{ClusterConfig, ClusterSection, DataNodeConfig, MgmdConfig};
use shoal_proto::pb;
use shoal_proto::{codec, Column, ColumnType, ErrorCode, NodeId, ShoalError, Table, TableSpec, Value};
use tokio::sync::mpsc;

use crate::durability::Durability;
use crate::node::{Node, NodeSetup, Timing};
use crate::ops::{self, Op, OpKind, ReadAt};
use crate::storage::MemoryBudget;
use crate::transport::{BoxFuture, CopyRequest, CopyStream, Replicate, Transport};

/// The simulated network: delivers to nodes in this process unless a node is cut off.
#[derive(Default)]
struct Net {
    nodes: Mutex<HashMap<NodeId, Arc<Node>>>,
    cut: Mutex<HashSet<NodeId>>,
    /// While set, a replica's acknowledgement of images waits for it: the replica has applied
    /// them, its primary not yet.
    hold: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
}

struct SimTransport(Arc<Net>);

impl SimTransport {
    fn reach(&self, id: NodeId) -> Result<Arc<Node>, ShoalError> {
        if self.0.cut.lock().contains(&id) {
            return Err(ShoalError::new(ErrorCode::NodeNotReady, format!("node {id} unreachable")));
        }
        self.0.nodes.lock().get(&id).cloned().ok_or_else(|| ShoalError::new(ErrorCode::NodeNotReady, "no such node"))
    }
}

impl Transport for SimTransport {
    fn replicate(&self, to: NodeId, msg: Replicate) -> BoxFuture<Result<(), ShoalError>> {
        let target = self.reach(to);
        let hold = if msg.images.is_empty() { None } else { self.0.hold.lock().clone() };
        Box::pin(async move {
            let target = target?;
            crate::replication::apply(&target, msg).await?;
            if let Some(hold) = hold {
                let _ = hold.acquire().await;
            }
            Ok(())
        })
    }

    fn copy(&self, from: NodeId, req: CopyRequest) -> BoxFuture<Result<CopyStream, ShoalError>> {
        let source = self.reach(from);
        Box::pin(async move {
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(crate::sync::copy_out(source?, req, tx));
            Ok(rx)
        })
    }

    fn update_peers(&self, _map: &shoal_proto::ClusterState) {}

    fn txn_control(
        &self,
        to: NodeId,
        mut req: shoal_proto::pb::TxnControlRequest,
    ) -> BoxFuture<Result<Option<u64>, ShoalError>> {
        let target = self.reach(to);
        Box::pin(async move {
            let target = target?;
            let phase = shoal_proto::pb::TxnPhase::try_from(req.phase).unwrap_or_default();
            let parts: Vec<_> = req.parts.iter().map(|p| (p.table_id, p.partition)).collect();
            let run = crate::txn::Run::from_request(&mut req);
            crate::txn::handle_control(&target, phase, req.txn_id, req.gci, &parts, run).await
        })
    }
}

struct Sim {
    net: Arc<Net>,
    model: Model,
    reports: HashMap<NodeId, mpsc::Receiver<(NodeId, String)>>,
}

impl Sim {
    /// One node group of `replicas` data nodes (ids 11..), all up, with table `t`.
    async fn new(replicas: u32) -> Sim {
        let config = ClusterConfig {
            cluster: ClusterSection { name: "sim".into(), ..ClusterSection::new(replicas, 4) },
            mgmd: vec![MgmdConfig { id: 1, addr: "sim:1".into(), data_dir: "m".into() }],
            datanode: (0..replicas)
                .map(|i| DataNodeConfig {
                    id: 11 + i,
                    addr: format!("sim:{}", 11 + i),
                    node_group: 0,
                    data_dir: "d".into(),
                    data_memory_mb: 64,
                    threads: 0,
                    spin_us: 0,
                    await_spin_us: 0,
                    poll_idle_cpus: false,
                })
                .collect(),
            sqlnode: vec![],
        };
        let mut sim = Sim { net: Arc::new(Net::default()), model: Model::default(), reports: HashMap::new() };
        sim.apply(Command::Bootstrap { config });
        let joins = (0..replicas).map(|i| sim.boot(11 + i, 1)).collect();
        sim.apply(Command::Join { nodes: joins });
        let spec = TableSpec {
            name: "t".into(),
            columns: vec![Column::new("k", ColumnType::Int), Column::new("v", ColumnType::Int)],
            primary_key: vec![0],
            partition_key: vec![],
        };
        sim.apply(Command::CreateTable { spec, if_not_exists: false, indexes: vec![] });
        sim.publish_all();
        sim.settle().await;
        sim
    }

    /// Waits until every primary passed its activation barrier.
    async fn settle(&self) {
        let table = self.table();
        for _ in 0..500 {
            let active = self.model.cluster.partitions.iter().all(|pa| {
                let Some(primary) = pa.primary else { return true };
                self.node(primary).partition(table.id, pa.partition).is_some_and(|p| p.active_term() >= pa.primary_term)
            });
            if active {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("primaries did not activate");
    }

    /// Starts a node process (a fresh incarnation) holding a long lease.
    fn boot(&mut self, id: NodeId, incarnation: u64) -> JoinInfo {
        let (tx, rx) = mpsc::channel(64);
        let timing = Timing {
            heartbeat_interval: Duration::from_millis(100),
            lease: Duration::from_secs(3600),
            failure_timeout: Duration::from_secs(3601),
            lock_wait: Duration::from_secs(2),
            txn_inactive: Duration::from_secs(5),
        };
        let transport = Arc::new(SimTransport(self.net.clone()));
        let setup = NodeSetup {
            id,
            incarnation,
            addr: format!("sim:{id}"),
            timing,
            budget: MemoryBudget::new(64 << 20),
            durability: Durability::memory_only(),
            txn_limits: crate::txn::TxnLimits::default(),
        };
        let node = Node::new(setup, tx, transport);
        node.renew_lease(Instant::now(), Duration::from_secs(3600));
        self.net.nodes.lock().insert(id, node);
        self.reports.insert(id, rx);
        JoinInfo { id, addr: format!("sim:{id}"), pid: 1, incarnation, loaded_gci: Some(0) }
    }

    fn apply(&mut self, cmd: Command) {
        self.model.apply(cmd).expect("command applies");
    }

    fn node(&self, id: NodeId) -> Arc<Node> {
        self.net.nodes.lock()[&id].clone()
    }

    /// Gives node `id` the current map; returns the sync epochs of copies it must run.
    fn publish(&self, id: NodeId) -> Vec<u64> {
        crate::node::apply_map(&self.node(id), self.model.cluster.clone())
    }

    fn publish_all(&self) {
        let ids: Vec<NodeId> = self.net.nodes.lock().keys().copied().collect();
        for id in ids {
            self.publish(id);
        }
    }

    fn table(&self) -> Table {
        self.model.cluster.table("t").expect("table t").clone()
    }

    fn primary_of(&self, k: i64) -> NodeId {
        let p = codec::partition_of_key(&self.table(), &[Value::Int(k)]);
        self.model.cluster.partitions[p as usize].primary.expect("a primary")
    }

    fn op(&self, kind: OpKind, k: i64, v: i64) -> Op {
        op_on(&self.table(), kind, k, v)
    }

    async fn write(&self, at: NodeId, k: i64, v: i64) -> Result<(), ShoalError> {
        ops::write(self.node(at), self.op(OpKind::Upsert, k, v)).await.map(|_| ())
    }

    fn read_at(&self, at: NodeId, k: i64) -> Result<Option<i64>, ShoalError> {
        let row = one_row(ops::read(&self.node(at), self.op(OpKind::Read, k, 0), ReadAt::AnyReplica)?);
        let row = row.map(|d| codec::decode_row(&self.table(), &d)).transpose()?;
        Ok(row.map(|r| r[1].as_i64().expect("int value")))
    }
}

/// An operation on key `k` of the simulation's table (two integer columns), writing `v`.
fn op_on(table: &Table, kind: OpKind, k: i64, v: i64) -> Op {
    let partition = codec::partition_of_key(table, &[Value::Int(k)]);
    let (key, row) = match kind {
        OpKind::Insert | OpKind::Upsert => (vec![], vec![Value::Int(k), Value::Int(v)]),
        _ => (vec![Value::Int(k)], vec![]),
    };
    Op {
        kind,
        table: table.id,
        partition,
        key,
        key_data: None,
        keys: vec![],
        range: None,
        row,
        columns: vec![],
        deltas: vec![],
        packed_rows: false,
        aggregates: vec![],
    }
}

/// The row a one-key read answered.
fn one_row(answer: ops::Answer) -> Option<Vec<u8>> {
    match answer {
        ops::Answer::Row(row) => row,
        other => panic!("a one-key read answered {other:?}"),
    }
}

#[tokio::test]
async fn acknowledged_write_is_on_every_replica() {
    let sim = Sim::new(3).await;
    for k in 0..50 {
        sim.write(sim.primary_of(k), k, k * 10).await.unwrap();
        for id in [11, 12, 13] {
            assert_eq!(sim.read_at(id, k).unwrap(), Some(k * 10), "key {k} on node {id}");
        }
    }
    // A write sent to a backup is refused with a hint to the primary.
    let k = 7;
    let backup = [11, 12, 13].into_iter().find(|&n| n != sim.primary_of(k)).unwrap();
    let e = sim.write(backup, k, 1).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPrimary);
    assert_eq!(e.hint, sim.primary_of(k));
}

#[tokio::test]
async fn a_range_read_counts_through_its_keys_in_the_partitions_it_names() {
    let sim = Sim::new(2).await;
    for k in (-10..40).filter(|k| k % 3 != 0) {
        sim.write(sim.primary_of(k), k, k * 10).await.unwrap();
    }
    let t = sim.table();
    let start = codec::int_key_run(&t, -20, 80).unwrap();
    let range_op = |partitions: Vec<u32>| Op {
        range: Some(ops::KeyRange { start, count: 80, partitions }),
        ..sim.op(OpKind::Read, 0, 0)
    };
    // Each node's share: the partitions it is primary of. Together they read every row of the
    // run, each once, at its place in the run.
    let mut found = vec![];
    for id in [11, 12] {
        let mine: Vec<u32> =
            (0..t.partition_count).filter(|&p| sim.model.cluster.partitions[p as usize].primary == Some(id)).collect();
        let answer = ops::read_many(&sim.node(id), vec![Ok(range_op(mine))], ReadAt::Primary).pop().unwrap().unwrap();
        let ops::Answer::Rows { rows, range: true, .. } = answer else { panic!("a range read answered {answer:?}") };
        assert_eq!(rows.len(), 80, "one row per key of the run");
        for (at, row) in rows.iter().enumerate().filter(|(_, row)| !row.is_empty()) {
            let row = codec::decode_row(&t, row).unwrap();
            assert_eq!(row[0], Value::Int(-20 + at as i64));
            found.push((row[0].as_i64().unwrap(), row[1].as_i64().unwrap()));
        }
    }
    found.sort();
    let expected: Vec<(i64, i64)> = (-10..40).filter(|k| k % 3 != 0).map(|k| (k, k * 10)).collect();
    assert_eq!(found, expected);
    // A partition the node is not primary of fails the read (unless read-backup).
    let theirs: Vec<u32> =
        (0..t.partition_count).filter(|&p| sim.model.cluster.partitions[p as usize].primary != Some(11)).collect();
    let e =
        ops::read_many(&sim.node(11), vec![Ok(range_op(theirs.clone()))], ReadAt::Primary).pop().unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPrimary);
    assert!(ops::read_many(&sim.node(11), vec![Ok(range_op(theirs))], ReadAt::AnyReplica).pop().unwrap().is_ok());
}

#[tokio::test]
async fn unreachable_backup_is_reported_and_the_write_completes_once_it_is_removed() {
    let mut sim = Sim::new(2).await;
    let k = 3;
    let primary = sim.primary_of(k);
    let backup = if primary == 11 { 12 } else { 11 };
    sim.net.cut.lock().insert(backup);
    let node = sim.node(primary);
    let op = sim.op(OpKind::Upsert, k, 99);
    let write = tokio::spawn(ops::write(node, op));
    // The primary reports the silent backup to mgmd and keeps the write pending.
    let (reported, _) = tokio::time::timeout(Duration::from_secs(5), sim.reports.get_mut(&primary).unwrap().recv())
        .await
        .expect("a failure report")
        .unwrap();
    assert_eq!(reported, backup);
    assert!(!write.is_finished(), "no acknowledgement while a live replica lacks the write");
    assert_eq!(sim.read_at(primary, k).unwrap(), None, "the primary applies only after its replicas");
    // mgmd removes the backup: the write completes on the remaining replica.
    sim.apply(Command::Down { id: backup, incarnation: 1, reason: "reported".into() });
    sim.publish(primary);
    tokio::time::timeout(Duration::from_secs(5), write).await.expect("write finishes").unwrap().unwrap();
    assert_eq!(sim.read_at(primary, k).unwrap(), Some(99));
}

#[tokio::test]
async fn deposed_primary_cannot_commit() {
    let mut sim = Sim::new(2).await;
    let k = 5;
    sim.write(sim.primary_of(k), k, 1).await.unwrap();
    let old = sim.primary_of(k);
    let new = if old == 11 { 12 } else { 11 };
    // mgmd promotes the backup; the old primary has not heard (its lease is still valid here,
    // as it would be for a node the failure detector misjudged).
    sim.apply(Command::Down { id: old, incarnation: 1, reason: "test".into() });
    sim.publish(new);
    sim.settle().await;
    assert_eq!(sim.primary_of(k), new);
    let e = sim.write(old, k, 2).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotPrimary, "{e}");
    // Neither replica shows the refused write.
    assert_eq!(sim.read_at(old, k).unwrap(), Some(1));
    assert_eq!(sim.read_at(new, k).unwrap(), Some(1));
    sim.write(new, k, 3).await.unwrap();
    assert_eq!(sim.read_at(new, k).unwrap(), Some(3));
}

#[tokio::test]
async fn no_lease_no_service() {
    let sim = Sim::new(2).await;
    let k = 1;
    let primary = sim.primary_of(k);
    sim.node(primary).drop_lease();
    let e = sim.write(primary, k, 1).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NodeNotReady);
    let e = ops::read(&sim.node(primary), sim.op(OpKind::Read, k, 0), ReadAt::Primary).unwrap_err();
    assert_eq!(e.code, ErrorCode::NodeNotReady);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_copies_while_writes_and_deletes_continue() {
    let mut sim = Sim::new(2).await;
    for k in 0..400 {
        sim.write(sim.primary_of(k), k, 0).await.unwrap();
    }
    // Node 12 crashes and comes back empty as a new incarnation.
    sim.apply(Command::Down { id: 12, incarnation: 1, reason: "crash".into() });
    sim.publish(11);
    let join = sim.boot(12, 2);
    sim.apply(Command::Join { nodes: vec![join] });
    sim.publish(11);
    let sync_epoch = *sim.publish(12).first().expect("node 12 must copy");

    // Writes and deletes run on node 11 while node 12 copies.
    let writer = {
        let primary = sim.node(11);
        let table = sim.table();
        tokio::spawn(async move {
            for round in 1..=3i64 {
                for k in 0..400i64 {
                    let op = match (k + round) % 5 {
                        0 => op_on(&table, OpKind::Delete, k, 0),
                        _ => op_on(&table, OpKind::Upsert, k, round),
                    };
                    // Node 11 may still be activating as primary of node 12's partitions
                    // (NODE_NOT_READY): retried as the client would, within 2 s.
                    let mut tries = 0;
                    loop {
                        match ops::write(primary.clone(), op.clone()).await {
                            Ok(_) => break,
                            Err(e) if e.code == ErrorCode::KeyNotFound => break,
                            Err(e) if e.code == ErrorCode::NodeNotReady && tries < 200 => {
                                tries += 1;
                                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                            }
                            Err(e) => panic!("write failed: {e}"),
                        }
                    }
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let rows = crate::sync::run(&sim.node(12), sync_epoch).await.expect("sync completes");
    assert!(rows > 0);
    writer.await.unwrap();
    sim.apply(Command::Synced { id: 12, incarnation: 2, sync_epoch });
    sim.publish_all();
    for k in 0..400 {
        assert_eq!(sim.read_at(12, k).unwrap(), sim.read_at(11, k).unwrap(), "key {k} differs after the copy");
    }
}

#[tokio::test]
async fn full_node_answers_table_full_and_keeps_serving() {
    let mut sim = Sim::new(2).await;
    // Shrink node memory: replace both nodes with ones that have 64 KiB of data memory.
    for id in [11u32, 12] {
        let (tx, rx) = mpsc::channel(64);
        let old = sim.node(id);
        let setup = NodeSetup {
            id,
            incarnation: 1,
            addr: old.addr.clone(),
            timing: old.timing.clone(),
            budget: MemoryBudget::new(64 * 1024),
            durability: Durability::memory_only(),
            txn_limits: crate::txn::TxnLimits::default(),
        };
        let node = Node::new(setup, tx, Arc::new(SimTransport(sim.net.clone())));
        node.renew_lease(Instant::now(), Duration::from_secs(3600));
        sim.net.nodes.lock().insert(id, node);
        sim.reports.insert(id, rx);
        sim.publish(id);
    }
    sim.settle().await;
    let mut full_at = None;
    for k in 0..10_000 {
        match sim.write(sim.primary_of(k), k, k).await {
            Ok(()) => {}
            Err(e) => {
                assert_eq!(e.code, ErrorCode::TableFull, "{e}");
                full_at = Some(k);
                break;
            }
        }
    }
    let full_at = full_at.expect("64 KiB fills up");
    assert!(full_at > 100, "only {full_at} rows fit");
    // Reads and in-place updates still work; deletes make room again.
    assert_eq!(sim.read_at(sim.primary_of(0), 0).unwrap(), Some(0));
    sim.write(sim.primary_of(1), 1, 7).await.unwrap();
    for k in 0..50 {
        ops::write(sim.node(sim.primary_of(k)), sim.op(OpKind::Delete, k, 0)).await.unwrap();
    }
    sim.write(sim.primary_of(full_at), full_at, 1).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_primary_serves_only_after_the_old_one_stopped() {
    let mut sim = Sim::new(2).await;
    // Node 12 restarts and catches up; all primaries are on node 11 now.
    sim.apply(Command::Down { id: 12, incarnation: 1, reason: "restart".into() });
    sim.publish(11);
    let join = sim.boot(12, 2);
    sim.apply(Command::Join { nodes: vec![join] });
    sim.publish(11);
    let sync_epoch = *sim.publish(12).first().expect("node 12 must copy");
    crate::sync::run(&sim.node(12), sync_epoch).await.expect("sync completes");
    sim.apply(Command::Synced { id: 12, incarnation: 2, sync_epoch });
    sim.publish_all();
    let k = (0..100).find(|&k| {
        let p = codec::partition_of_key(&sim.table(), &[Value::Int(k)]);
        sim.model.misplaced_primaries().contains(&p)
    });
    let k = k.expect("a partition to move back to node 12");
    sim.write(11, k, 1).await.unwrap();

    // mgmd moves the partition back to node 12; only node 12 has heard so far.
    sim.apply(Command::Rebalance);
    assert_eq!(sim.primary_of(k), 12);
    sim.publish(12);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Node 12 must not serve yet; node 11 still believes it leads, but node 12 refuses its
    // writes, so nothing can commit on either side until the hand-over is complete.
    let e = sim.write(12, k, 2).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NodeNotReady, "{e}");
    assert_eq!(sim.write(11, k, 3).await.unwrap_err().code, ErrorCode::NotPrimary);
    let at_11 = one_row(ops::read(&sim.node(11), sim.op(OpKind::Read, k, 0), ReadAt::Primary).unwrap());
    let at_11 = at_11.map(|d| codec::decode_row(&sim.table(), &d).unwrap());
    assert_eq!(at_11.map(|r| r[1].clone()), Some(Value::Int(1)), "the old primary still has the committed value");
    // Node 11 learns the new map: from now on only node 12 serves.
    sim.publish(11);
    sim.settle().await;
    assert_eq!(sim.write(11, k, 4).await.unwrap_err().code, ErrorCode::NotPrimary);
    sim.write(12, k, 5).await.unwrap();
    assert_eq!(sim.read_at(11, k).unwrap(), Some(5));
    assert_eq!(sim.read_at(12, k).unwrap(), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_three_replicas_leaves_the_survivors_equal() {
    let mut sim = Sim::new(3).await;
    // Find a key led by node 11 and write it everywhere.
    let k = (0..200).find(|&k| sim.primary_of(k) == 11).expect("node 11 leads some key");
    sim.write(11, k, 1).await.unwrap();
    // Node 13 stops answering; node 11's next write reaches 12 only and stays unacknowledged.
    sim.net.cut.lock().insert(13);
    let pending = tokio::spawn(ops::write(sim.node(11), sim.op(OpKind::Upsert, k, 2)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!pending.is_finished());
    // Node 11 crashes; mgmd promotes a backup, and the other backup must copy from it.
    sim.net.cut.lock().insert(11);
    sim.net.cut.lock().remove(&13);
    sim.apply(Command::Down { id: 11, incarnation: 1, reason: "crash".into() });
    let mut copies = vec![];
    for id in [12, 13] {
        for epoch in sim.publish(id) {
            copies.push((id, epoch));
        }
    }
    assert_eq!(copies.len(), 1, "exactly one survivor refills: {copies:?}");
    sim.settle().await;
    let (id, epoch) = copies[0];
    crate::sync::run(&sim.node(id), epoch).await.expect("copy completes");
    sim.apply(Command::Synced { id, incarnation: 1, sync_epoch: epoch });
    sim.publish(12);
    sim.publish(13);
    assert_eq!(sim.read_at(12, k).unwrap(), sim.read_at(13, k).unwrap(), "survivors disagree on key {k}");
    let new_primary = sim.primary_of(k);
    sim.write(new_primary, k, 3).await.unwrap();
    assert_eq!(sim.read_at(12, k).unwrap(), Some(3));
    assert_eq!(sim.read_at(13, k).unwrap(), Some(3));
    pending.abort();
}

/// Runs an upsert of each `(k, v)` in transaction `txn` (coordinated by `tc`) at its
/// partition's primary; returns the parts the transaction holds.
async fn txn_upserts(sim: &Sim, tc: NodeId, txn: u64, kvs: &[(i64, i64)]) -> Vec<(shoal_proto::TableId, u32)> {
    let mut parts = vec![];
    for &(k, v) in kvs {
        let op = crate::txn::TxnOp { op: sim.op(OpKind::Upsert, k, v), lock: None, held_term: 0 };
        let slot = (op.op.table, op.op.partition);
        for (r, _) in crate::txn::execute(&sim.node(sim.primary_of(k)), txn, tc, vec![op], Default::default()).await {
            r.expect("upsert in the transaction");
        }
        if !parts.contains(&slot) {
            parts.push(slot);
        }
    }
    parts
}

/// What node `at` answers a participant asking for the outcome of `txn`.
async fn outcome_at(sim: &Sim, at: NodeId, txn: u64) -> Option<u64> {
    let node = sim.node(at);
    crate::txn::handle_control(&node, pb::TxnPhase::Outcome, txn, 0, &[], Default::default()).await.unwrap()
}

/// Every key of `keys` reads `v` at every node of `nodes`.
fn expect_everywhere(sim: &Sim, nodes: [NodeId; 2], keys: [i64; 2], v: i64) {
    for at in nodes {
        for k in keys {
            assert_eq!(sim.read_at(at, k).unwrap(), Some(v), "key {k} at node {at}");
        }
    }
}

/// A transaction over keys `a` and `b`, coordinated by `tc` (the primary of `a`) in a group of
/// two: its decision rides on the COMMIT images of `tc`'s own part to the other node `peer`.
/// Checks the commit, then that a peer which already answered "aborted" refuses the record and
/// applies nothing, the transaction aborts and frees its locks.
async fn decision_rides_on_own_commit(sim: &Sim, tc: NodeId, a: i64, b: i64) {
    let peer = if tc == 11 { 12 } else { 11 };
    let parts = txn_upserts(sim, tc, 0x51, &[(a, 1), (b, 1)]).await;
    assert_eq!(parts.len(), 2);
    let gci = crate::txn::commit_as_tc(&sim.node(tc), 0x51, parts, false, vec![]).await.expect("commit");
    expect_everywhere(sim, [tc, peer], [a, b], 1);
    // The peer learnt the decision from the images themselves: asked, it says commit.
    assert_eq!(outcome_at(sim, peer, 0x51).await, Some(gci));

    let parts = txn_upserts(sim, tc, 0x52, &[(a, 2), (b, 2)]).await;
    assert_eq!(outcome_at(sim, peer, 0x52).await, None, "nothing recorded yet: aborted");
    let e = crate::txn::commit_as_tc(&sim.node(tc), 0x52, parts, false, vec![]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::TxnAborted, "{e}");
    expect_everywhere(sim, [tc, peer], [a, b], 1);
    sim.write(sim.primary_of(a), a, 3).await.expect("the aborted transaction's lock on a is gone");
    sim.write(sim.primary_of(b), b, 3).await.expect("the aborted transaction's lock on b is gone");
    assert_eq!(sim.read_at(peer, a).unwrap(), Some(3));
}

/// Savepoints at the participants: rolling back to one undoes the writes made under it and
/// under later ones (newest first: a key written under both gets its image from before), leaves
/// the earlier ones, and the commit applies what is left.
#[tokio::test]
async fn rolling_back_to_a_savepoint_undoes_only_its_writes_and_later_ones() {
    use crate::txn::Savepoints;
    let sim = Sim::new(2).await;
    let (k, j) = (1, 2);
    sim.write(sim.primary_of(k), k, 1).await.unwrap();
    let tc = sim.primary_of(k);
    let txn = 0x61;
    let upsert = |key: i64, v: i64, at: u64| {
        let op = crate::txn::TxnOp { op: sim.op(OpKind::Upsert, key, v), lock: None, held_term: 0 };
        let node = sim.node(sim.primary_of(key));
        async move {
            for (r, _) in crate::txn::execute(&node, txn, tc, vec![op], Savepoints { at, ..Default::default() }).await {
                r.expect("upsert in the transaction");
            }
        }
    };
    upsert(k, 2, 1).await;
    upsert(k, 3, 2).await;
    upsert(k, 4, 2).await;
    upsert(j, 5, 2).await;
    upsert(j, 6, 3).await;
    for key in [k, j] {
        let node = sim.node(sim.primary_of(key));
        let rollback = Savepoints { rollback_to: 2, ..Default::default() };
        assert!(crate::txn::execute(&node, txn, tc, vec![], rollback).await.is_empty());
    }
    let mut parts: Vec<_> = [k, j]
        .iter()
        .map(|&key| {
            let op = sim.op(OpKind::Read, key, 0);
            (op.table, op.partition)
        })
        .collect();
    parts.dedup();
    crate::txn::commit_as_tc(&sim.node(tc), txn, parts, false, vec![]).await.expect("commit");
    for at in [11, 12] {
        assert_eq!(sim.read_at(at, k).unwrap(), Some(2), "key {k} at node {at}: savepoint 1's write stays");
        assert_eq!(sim.read_at(at, j).unwrap(), None, "key {j} at node {at}: written from savepoint 2 on only");
    }
}

#[tokio::test]
async fn commit_decision_rides_on_the_coordinators_own_commit() {
    // Two own partitions: their images are kept at the peer at PREPARE.
    let sim = Sim::new(2).await;
    let first = 1;
    let tc = sim.primary_of(first);
    let p = |k| sim.op(OpKind::Read, k, 0).partition;
    let second = (2..1000).find(|&k| sim.primary_of(k) == tc && p(k) != p(first)).expect("a second partition");
    decision_rides_on_own_commit(&sim, tc, first, second).await;
    // One own partition and one at the peer: the own images go to the peer only with the
    // decision.
    let sim = Sim::new(2).await;
    let tc = sim.primary_of(first);
    let other = (2..1000).find(|&k| sim.primary_of(k) != tc).expect("a partition the peer leads");
    decision_rides_on_own_commit(&sim, tc, first, other).await;
}

/// What node `at` answers to a read of key `k` made as the primary would answer it.
fn read_as_primary(sim: &Sim, at: NodeId, k: i64) -> Result<Option<i64>, ShoalError> {
    let row = one_row(ops::read(&sim.node(at), sim.op(OpKind::Read, k, 0), ReadAt::AsPrimary)?);
    let row = row.map(|d| codec::decode_row(&sim.table(), &d)).transpose()?;
    Ok(row.map(|r| r[1].as_i64().expect("int value")))
}

/// The same through a many-key read (the way `Client::read_many` asks): `Ok(None)` also when
/// the row is absent.
fn read_many_as_primary(sim: &Sim, at: NodeId, k: i64) -> Result<Option<i64>, ShoalError> {
    let t = sim.table();
    let (key, _) = codec::encode_key(&t, vec![Value::Int(k)]).unwrap();
    let mut op = sim.op(OpKind::Read, k, 0);
    op.keys = vec![(key.into(), op.partition)];
    op.packed_rows = true;
    let answer = ops::read(&sim.node(at), op, ReadAt::AsPrimary)?;
    let ops::Answer::Rows { rows, .. } = answer else { panic!("a many-key read answered {answer:?}") };
    let first = rows.iter().next().expect("one row per key");
    let row = (!first.is_empty()).then(|| codec::decode_row(&t, first)).transpose()?;
    Ok(row.map(|r| r[1].as_i64().expect("int value")))
}

/// Waits (up to a second) until node `at` answers `want` for key `k` read as the primary.
async fn confirmed(sim: &Sim, at: NodeId, k: i64, want: Option<i64>) {
    for _ in 0..100 {
        if read_as_primary(sim, at, k).ok() == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("node {at} never answered {want:?} as the primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_answers_as_the_primary_only_what_the_primary_confirmed() {
    let sim = Sim::new(2).await;
    let k = 5;
    let primary = sim.primary_of(k);
    let backup = if primary == 11 { 12 } else { 11 };
    let confirmations = tokio::spawn(crate::replication::confirm_loop(sim.node(primary)));

    sim.write(primary, k, 1).await.unwrap();
    confirmed(&sim, backup, k, Some(1)).await;
    assert_eq!(read_many_as_primary(&sim, backup, k).unwrap(), Some(1));

    // The backup has applied a write the primary has not: as the primary it refuses the key;
    // read as a backup it shows the new value; the primary still shows the old one.
    for (v, want_at_backup) in [(Some(2), Some(2)), (None, None)] {
        let hold = Arc::new(tokio::sync::Semaphore::new(0));
        *sim.net.hold.lock() = Some(hold.clone());
        let op = match v {
            Some(v) => sim.op(OpKind::Upsert, k, v),
            None => sim.op(OpKind::Delete, k, 0),
        };
        let write = tokio::spawn(ops::write(sim.node(primary), op));
        for _ in 0..100 {
            if sim.read_at(backup, k).unwrap() == want_at_backup {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(sim.read_at(backup, k).unwrap(), want_at_backup, "the backup applied the write");
        let before = if v == Some(2) { Some(1) } else { Some(2) };
        assert_eq!(read_as_primary(&sim, primary, k).unwrap(), before);
        assert_eq!(read_as_primary(&sim, backup, k).unwrap_err().code, ErrorCode::NotPrimary);
        assert_eq!(read_many_as_primary(&sim, backup, k).unwrap_err().code, ErrorCode::NotPrimary);
        // Waited a whole confirmation delay: still nothing to confirm.
        tokio::time::sleep(crate::replication::CONFIRM_DELAY * 3).await;
        assert_eq!(read_as_primary(&sim, backup, k).unwrap_err().code, ErrorCode::NotPrimary);

        *sim.net.hold.lock() = None;
        hold.add_permits(1);
        write.await.unwrap().unwrap();
        assert_eq!(read_as_primary(&sim, primary, k).unwrap(), want_at_backup);
        confirmed(&sim, backup, k, want_at_backup).await;
        assert_eq!(read_many_as_primary(&sim, backup, k).unwrap(), want_at_backup);
    }
    confirmations.abort();
}

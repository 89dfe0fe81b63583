//! In-process mgmd clusters on 127.0.0.1 ephemeral ports, driven through the gRPC API the
//! way data nodes and clients use it. Every wait is bounded.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shoal_mgmd::{MgmdOptions, Running};
use shoal_proto::config::{ClusterConfig, ClusterSection, DataNodeConfig, MgmdConfig};
use shoal_proto::pb;
use shoal_proto::pb::mgmd_client::MgmdClient;
use shoal_proto::{ErrorCode, NodeId};
use tokio::net::TcpListener;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(15);

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,openraft=warn"))
        .try_init();
}

struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let p = std::env::temp_dir().join(format!("shoal-mgmd-it-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create test dir");
        TestDir(p)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(mgmds: &[(NodeId, SocketAddr)]) -> ClusterConfig {
    ClusterConfig {
        cluster: ClusterSection { name: "it".into(), ..ClusterSection::new(2, 4) },
        mgmd: mgmds
            .iter()
            .map(|&(id, addr)| MgmdConfig { id, addr: addr.to_string(), data_dir: format!("mgmd-{id}") })
            .collect(),
        datanode: [11, 12]
            .iter()
            .map(|&id| DataNodeConfig {
                id,
                addr: format!("127.0.0.1:{}", 40000 + id),
                node_group: 0,
                data_dir: format!("dn-{id}"),
                data_memory_mb: 16,
                threads: 0,
                spin_us: 0,
                await_spin_us: 0,
                poll_idle_cpus: false,
            })
            .collect(),
        sqlnode: vec![],
    }
}

async fn start(id: NodeId, cfg: &ClusterConfig, dir: &Path, listener: TcpListener, snapshot_every: u64) -> Running {
    let mut opts = MgmdOptions::new(id, cfg.clone(), dir).expect("options");
    opts.snapshot_every_logs = snapshot_every;
    shoal_mgmd::start(opts, listener).await.expect("start mgmd")
}

async fn client(addr: SocketAddr) -> MgmdClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("endpoint").connect_lazy();
    MgmdClient::new(ch)
}

/// Polls `f` until it returns Some, for at most [`WAIT`].
async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn state(addr: SocketAddr) -> Option<pb::ClusterState> {
    let mut c = client(addr).await;
    tokio::time::timeout(Duration::from_secs(1), c.get_cluster_state(pb::Empty {}))
        .await
        .ok()?
        .ok()
        .map(|r| r.into_inner())
}

/// Waits until every mgmd in `addrs` names the same leader, one of them, and has applied the
/// bootstrap.
async fn agreed_leader(addrs: &[(NodeId, SocketAddr)]) -> NodeId {
    wait_for("a bootstrapped leader all mgmds agree on", || async {
        let mut leader = None;
        for &(_, a) in addrs {
            let s = state(a).await?;
            let member = addrs.iter().any(|(i, _)| *i == s.leader_id);
            if s.epoch == 0 || !member || leader.is_some_and(|l| l != s.leader_id) {
                return None;
            }
            leader = Some(s.leader_id);
        }
        leader
    })
    .await
}

fn spec(name: &str) -> pb::TableSpec {
    pb::TableSpec {
        name: name.into(),
        columns: vec![
            pb::Column { name: "k".into(), r#type: pb::ColumnType::Int as i32, nullable: false, ..Default::default() },
            pb::Column { name: "v".into(), r#type: pb::ColumnType::Text as i32, nullable: true, ..Default::default() },
        ],
        primary_key: vec![0],
        partition_key: vec![],
    }
}

fn code(e: &Option<pb::Error>) -> i32 {
    e.as_ref().map_or(0, |e| e.code)
}

async fn heartbeat(addr: SocketAddr, node: NodeId, incarnation: u64) -> Option<pb::HeartbeatResponse> {
    let mut c = client(addr).await;
    let req = pb::HeartbeatRequest {
        node_id: node,
        incarnation,
        addr: format!("127.0.0.1:{}", 40000 + node),
        pid: 1,
        epoch: 0,
        loaded: true,
        loaded_gci: 0,
        restoring: false,
        progress: String::new(),
    };
    tokio::time::timeout(Duration::from_secs(1), c.heartbeat(req)).await.ok()?.ok().map(|r| r.into_inner())
}

/// Heartbeats `node` every 100 ms to whichever mgmd answers without error (the leader),
/// like a live data node, until the returned sender is dropped or set.
fn keep_alive(addrs: Vec<SocketAddr>, node: NodeId, incarnation: u64) -> tokio::sync::watch::Sender<bool> {
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut at = 0;
        loop {
            let ok = heartbeat(addrs[at], node, incarnation).await.is_some_and(|r| code(&r.error) == 0);
            if !ok {
                at = (at + 1) % addrs.len();
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(if ok { 100 } else { 20 })) => {}
                _ = rx.wait_for(|&s| s) => break,
            }
        }
    });
    tx
}

async fn create(addr: SocketAddr, name: &str) -> pb::AdminResponse {
    client(addr)
        .await
        .create_table(pb::CreateTableRequest { spec: Some(spec(name)), if_not_exists: false, indexes: vec![] })
        .await
        .expect("rpc")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_mgmds_fail_over_and_keep_state() {
    init_logs();
    let dir = TestDir::new("three");
    let mut listeners = Vec::new();
    let mut addrs = Vec::new();
    for id in 1..=3 {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        addrs.push((id, l.local_addr().expect("addr")));
        listeners.push(l);
    }
    let cfg = config(&addrs);
    // Snapshots every 5 entries, so a restarted mgmd has to catch up by snapshot.
    let mut nodes: Vec<Option<Running>> = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        nodes.push(Some(start(i as NodeId + 1, &cfg, &dir.0, l, 5).await));
    }
    let addr_of = |id: NodeId| addrs.iter().find(|(i, _)| *i == id).map(|(_, a)| *a).expect("known mgmd");

    let leader = agreed_leader(&addrs).await;
    let follower = addrs.iter().map(|(i, _)| *i).find(|&i| i != leader).expect("a follower");

    // Followers never forward: they name the leader.
    let resp = client(addr_of(follower))
        .await
        .create_table(pb::CreateTableRequest { spec: Some(spec("t1")), if_not_exists: false, indexes: vec![] })
        .await
        .expect("rpc")
        .into_inner();
    let e = resp.error.expect("follower must refuse");
    assert_eq!(e.code, ErrorCode::NotLeader.number());
    assert_eq!(e.hint, leader);
    assert_eq!(e.hint_addr, addr_of(leader).to_string());

    // The leader creates it once; domain errors come back with their codes.
    let mut lc = client(addr_of(leader)).await;
    let resp = lc
        .create_table(pb::CreateTableRequest { spec: Some(spec("t1")), if_not_exists: false, indexes: vec![] })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(code(&resp.error), 0, "{:?}", resp.error);
    assert_eq!(resp.table.as_ref().map(|t| t.partition_count), Some(4));
    let resp = lc
        .create_table(pb::CreateTableRequest { spec: Some(spec("t1")), if_not_exists: false, indexes: vec![] })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(code(&resp.error), ErrorCode::TableExists.number());
    let resp = lc
        .create_table(pb::CreateTableRequest { spec: None, if_not_exists: false, indexes: vec![] })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(code(&resp.error), ErrorCode::InvalidArgument.number());
    let mut bad = spec("t2");
    bad.columns[0].r#type = 99;
    let resp = lc
        .create_table(pb::CreateTableRequest { spec: Some(bad), if_not_exists: false, indexes: vec![] })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(code(&resp.error), ErrorCode::InvalidArgument.number());
    let resp =
        lc.drop_table(pb::DropTableRequest { name: "nope".into(), if_exists: false }).await.expect("rpc").into_inner();
    assert_eq!(code(&resp.error), ErrorCode::NoSuchTable.number());
    let hb = heartbeat(addr_of(leader), 99, 1).await.expect("heartbeat rpc");
    assert_eq!(code(&hb.error), ErrorCode::InvalidArgument.number(), "unknown data node");
    let hb = heartbeat(addr_of(follower), 11, 1).await.expect("heartbeat rpc");
    assert_eq!(code(&hb.error), ErrorCode::NotLeader.number());

    // A watcher on a follower sees the current map first.
    let mut watch = client(addr_of(follower))
        .await
        .watch_cluster_state(pb::WatchRequest { known_epoch: 0 })
        .await
        .expect("watch")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.expect("first map in time");
    let first = first.expect("stream ok").expect("a map");
    assert!(first.epoch >= 1);

    // Both data nodes of the fresh group heartbeat; they join together and share primaries,
    // and once the leader is confirmed by a quorum they hold leases.
    let joined = wait_for("both data nodes up with leases", || async {
        let a = heartbeat(addr_of(leader), 11, 1).await?;
        let b = heartbeat(addr_of(leader), 12, 1).await?;
        let up = pb::NodeState::Up as i32;
        (a.state == up && b.state == up && a.lease_ms == 600 && b.lease_ms == 600).then_some(b.epoch)
    })
    .await;
    let s = state(addr_of(follower)).await.expect("state");
    assert!(s.epoch >= joined);
    for n in [11, 12] {
        assert!(s.partitions.iter().any(|p| p.primary == n), "node {n} leads some partitions: {:?}", s.partitions);
    }
    // The watcher hears about the join.
    let next = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.expect("next map in time");
    assert!(next.expect("stream ok").expect("a map").epoch > first.epoch);

    // Status names the leader and this node's raft position.
    let st = client(addr_of(follower)).await.status(pb::Empty {}).await.expect("status").into_inner();
    assert_eq!(st.mgmds.len(), 3);
    assert!(st.mgmds.iter().any(|m| m.id == leader && m.leader));
    assert!(st.mgmds.iter().any(|m| m.id == follower && m.raft_term > 0 && m.last_applied > 0));

    // Kill the leader. The other two elect a new one, which keeps the state, treats both data
    // nodes as just seen, and then declares the silent one (11) down and promotes 12.
    let old = nodes[(leader - 1) as usize].take().expect("running leader");
    old.shutdown().await.expect("shut down leader");
    let rest: Vec<(NodeId, SocketAddr)> = addrs.iter().copied().filter(|(i, _)| *i != leader).collect();
    let new_leader = agreed_leader(&rest).await;
    assert_ne!(new_leader, leader);
    let s = state(addr_of(new_leader)).await.expect("state");
    assert!(s.tables.iter().any(|t| t.spec.as_ref().is_some_and(|sp| sp.name == "t1")), "table survives failover");

    let alive_12 = keep_alive(rest.iter().map(|(_, a)| *a).collect(), 12, 1);
    let nl = addr_of(new_leader);
    let after = wait_for("node 11 declared down by the new leader", || async {
        let s = state(nl).await?;
        let n11 = s.nodes.iter().find(|n| n.id == 11)?;
        (n11.state == pb::NodeState::Down as i32).then_some(s)
    })
    .await;
    assert!(after.partitions.iter().all(|p| p.primary == 12), "12 took over every partition");
    let hb = heartbeat(nl, 12, 1).await.expect("heartbeat rpc");
    assert_eq!((code(&hb.error), hb.lease_ms), (0, 600), "the new leader grants leases");

    // 11 restarts (new incarnation): it joins the live group as a syncing replica, reports
    // synced, and is up; then a peer reports it failed and it goes down again.
    let starting = wait_for("node 11 rejoining as starting", || async {
        let hb = heartbeat(nl, 11, 2).await?;
        (hb.state == pb::NodeState::Starting as i32).then_some(hb.epoch)
    })
    .await;
    let s = state(nl).await.expect("state");
    assert!(s.partitions.iter().all(|p| p.replicas.iter().any(|r| r.node_id == 11 && r.syncing)));
    let mut c = client(nl).await;
    let stale = c
        .node_synced(pb::NodeSyncedRequest { node_id: 11, incarnation: 2, sync_epoch: starting - 1 })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(code(&stale.error), ErrorCode::StaleEpoch.number());
    let synced = c
        .node_synced(pb::NodeSyncedRequest { node_id: 11, incarnation: 2, sync_epoch: starting })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(code(&synced.error), 0, "{:?}", synced.error);
    // Up, and holding a fresh lease the report below has to wait out.
    wait_for("node 11 up with a lease", || async {
        let hb = heartbeat(nl, 11, 2).await?;
        (hb.state == pb::NodeState::Up as i32 && hb.lease_ms == 600).then_some(())
    })
    .await;
    let t0 = Instant::now();
    let reported = c
        .report_failure(pb::ReportFailureRequest { reporter: 12, node_id: 11, reason: "replication timed out".into() })
        .await
        .expect("rpc")
        .into_inner();
    assert_eq!(code(&reported.error), 0, "{:?}", reported.error);
    assert!(t0.elapsed() >= Duration::from_millis(500), "waited for the lease it just got to run out");
    let s = state(nl).await.expect("state");
    assert_eq!(s.nodes.iter().find(|n| n.id == 11).map(|n| n.state), Some(pb::NodeState::Down as i32));

    // More changes while the old leader is away: its log falls behind the others' snapshots.
    for i in 0..12 {
        let r = create(nl, &format!("late{i}")).await;
        assert_eq!(code(&r.error), 0, "{:?}", r.error);
    }
    let latest = state(nl).await.expect("state");

    // The old leader restarts from its data dir and catches up with the new epoch.
    let l = TcpListener::bind(addr_of(leader)).await.expect("rebind the old leader's port");
    nodes[(leader - 1) as usize] = Some(start(leader, &cfg, &dir.0, l, 5).await);
    let caught_up = wait_for("the restarted mgmd catching up", || async {
        let s = state(addr_of(leader)).await?;
        (s.epoch >= latest.epoch && s.leader_id == new_leader).then_some(s)
    })
    .await;
    assert_eq!(caught_up.tables.len(), latest.tables.len());
    let _ = alive_12.send(true);

    for n in nodes.into_iter().flatten() {
        n.shutdown().await.expect("shut down");
    }
    // The watch stream ends (cleanly or as a broken connection) once its mgmd stops.
    let end =
        tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = watch.message().await {} }).await;
    assert!(end.is_ok(), "watch stream must end on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_mgmd_restarts_from_snapshot_and_log() {
    init_logs();
    let dir = TestDir::new("single");
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let cfg = config(&[(1, addr)]);
    // Snapshot every 5 entries: 20 tables go through several snapshots and log purges.
    let running = start(1, &cfg, &dir.0, l, 5).await;
    agreed_leader(&[(1, addr)]).await;
    let mut c = client(addr).await;
    for i in 0..20 {
        let resp = c
            .create_table(pb::CreateTableRequest {
                spec: Some(spec(&format!("t{i}"))),
                if_not_exists: false,
                indexes: vec![],
            })
            .await
            .expect("rpc")
            .into_inner();
        assert_eq!(code(&resp.error), 0, "{:?}", resp.error);
    }
    let before = state(addr).await.expect("state");
    assert_eq!(before.tables.len(), 20);
    running.shutdown().await.expect("shut down");
    assert!(dir.0.join("mgmd-1").join("raft-snapshot").exists(), "a snapshot was written");

    // A second mgmd on the same data dir is refused while the first runs.
    let l = TcpListener::bind(addr).await.expect("rebind");
    let running = start(1, &cfg, &dir.0, l, 5).await;
    let l2 = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let mut opts = MgmdOptions::new(1, cfg.clone(), &dir.0).expect("options");
    opts.snapshot_every_logs = 5;
    let e = shoal_mgmd::start(opts, l2).await.err().expect("second mgmd on one dir must fail");
    assert!(e.to_string().contains("in use"), "{e}");

    let after = wait_for("state restored after restart", || async {
        let s = state(addr).await?;
        (s.epoch == before.epoch && s.leader_id == 1).then_some(s)
    })
    .await;
    let names = |s: &pb::ClusterState| -> Vec<String> {
        s.tables.iter().filter_map(|t| t.spec.as_ref().map(|sp| sp.name.clone())).collect()
    };
    assert_eq!(names(&after), names(&before));
    running.shutdown().await.expect("shut down");
}

//! Durability and restarts (DESIGN §2, §4 "Durability" and "Restarts"): real clusters, kill -9
//! of single nodes and of every process at once, damaged files.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestCluster;
use shoal_client::{Client, Durability, KeyOp};
use shoal_proto::{Column, ColumnType, TableSpec, Value};

fn kv_spec(name: &str) -> TableSpec {
    TableSpec {
        name: name.into(),
        columns: vec![Column::new("k", ColumnType::Int), Column::new("v", ColumnType::Text)],
        primary_key: vec![0],
        partition_key: vec![],
    }
}

/// The value written under key `k`: a few hundred bytes, so checkpoints have work to do.
fn value(k: i64) -> String {
    format!("v{k}-{}", "x".repeat(300))
}

/// What writers sent: acknowledged inserts with their GCI, and keys whose outcome is unknown.
#[derive(Default)]
struct History {
    acked: HashMap<i64, (String, u64)>,
    unknown: Vec<i64>,
}

/// `writers` tasks insert distinct keys for `run_for`, each insert a batch of `batch` rows.
/// Once `crashed` is set, answers no longer count as acknowledged: they may come from the
/// cluster's next life (the client retries across the restart).
async fn write_load(client: Client, writers: i64, batch: i64, run_for: Duration, crashed: Arc<AtomicBool>) -> History {
    let history = Arc::new(Mutex::new(History::default()));
    let deadline = Instant::now() + run_for;
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (client, history, crashed) = (client.clone(), history.clone(), crashed.clone());
            tokio::spawn(async move {
                let mut next = w * 1_000_000;
                while Instant::now() < deadline && !crashed.load(Ordering::SeqCst) {
                    let keys: Vec<i64> = (next..next + batch).collect();
                    next += batch;
                    let ops = keys
                        .iter()
                        .map(|&k| KeyOp::Insert { table: "t".into(), row: vec![Value::Int(k), Value::Text(value(k))] })
                        .collect();
                    let res = client.batch_with_gci(ops).await;
                    let late = crashed.load(Ordering::SeqCst);
                    let mut h = history.lock().unwrap();
                    for (k, r) in keys.into_iter().zip(res) {
                        match r {
                            Ok((_, gci)) if !late => {
                                h.acked.insert(k, (value(k), gci));
                            }
                            _ => h.unknown.push(k),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    Arc::try_unwrap(history).ok().expect("writers finished").into_inner().unwrap()
}

/// Every row of table t, by key.
async fn all_rows(client: &Client) -> HashMap<i64, String> {
    use tokio_stream::StreamExt;
    let rows: Vec<_> = client.scan("t", vec![], vec![]).collect().await;
    rows.into_iter()
        .map(|r| {
            let r = r.expect("scan row");
            let v = match &r[1] {
                Value::Text(s) => s.clone(),
                other => panic!("unexpected value {other:?}"),
            };
            (r[0].as_i64().unwrap(), v)
        })
        .collect()
}

/// The global checkpoint every data node restored to at its last start, read from its log.
fn restored_gcis(cluster: &TestCluster) -> Vec<u64> {
    let mut out = vec![];
    for e in std::fs::read_dir(cluster.dir.join("logs")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.starts_with("datanode") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap();
        let last = text.lines().rev().find_map(|l| {
            let at = l.find("restored own files up to global checkpoint ")?;
            l[at + 43..].split_whitespace().next()?.parse::<u64>().ok()
        });
        out.push(last.unwrap_or_else(|| panic!("{name} logged no restore")));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_kill_restores_exactly_the_last_complete_global_checkpoint() {
    let mut cluster = TestCluster::start_with_args(2, 2, 1, 0, &["--gcp-interval-ms", "100"]);
    let client = cluster.client().await;
    client.create_table(kv_spec("t"), false).await.unwrap();
    // Power loss in the middle of the load: the writers are still running.
    let crashed = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(write_load(client.clone(), 4, 4, Duration::from_secs(6), crashed.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    crashed.store(true, Ordering::SeqCst);
    cluster.crash_all_and_restart();
    let history = load.await.unwrap();
    let gcis = restored_gcis(&cluster);
    assert_eq!(gcis.len(), 4);
    assert!(gcis.iter().all(|&g| g == gcis[0]), "every node restores the same cut: {gcis:?}");
    let cut = gcis[0];
    let client = cluster.client().await;
    let rows = all_rows(&client).await;
    let (mut inside, mut after) = (0, 0);
    for (k, (v, gci)) in &history.acked {
        if *gci <= cut {
            inside += 1;
            assert_eq!(rows.get(k), Some(v), "key {k} committed in GCI {gci} <= {cut} is missing");
        } else {
            after += 1;
            assert_eq!(rows.get(k), None, "key {k} committed in GCI {gci} > {cut} survived the cut");
        }
    }
    // Rows nobody saw acknowledged may exist only if they were sent.
    for k in rows.keys() {
        assert!(history.acked.contains_key(k) || history.unknown.contains(k), "row {k} was never written");
    }
    eprintln!(
        "cut at GCI {cut}: {inside} acknowledged writes inside, {after} after, {} unknown",
        history.unknown.len()
    );
    assert!(inside > 100, "the cut should hold most of the load ({inside})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_writes_survive_a_whole_cluster_kill() {
    let mut cluster = TestCluster::start_with_args(1, 2, 1, 0, &["--gcp-interval-ms", "100"]);
    let client = cluster.client().await.with_durability(Durability::Sync);
    client.create_table(kv_spec("t"), false).await.unwrap();
    // Acknowledgements that arrive after the crash still count here: a sync write acknowledged
    // at any time must be there.
    let load = tokio::spawn(write_load(client.clone(), 8, 2, Duration::from_secs(5), Arc::default()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.crash_all_and_restart();
    let history = load.await.unwrap();
    let client = cluster.client().await;
    let rows = all_rows(&client).await;
    let cut = restored_gcis(&cluster);
    for (k, (v, gci)) in &history.acked {
        assert_eq!(
            rows.get(k),
            Some(v),
            "sync write of key {k} was acknowledged in GCI {gci} but is gone (restored {cut:?})"
        );
    }
    eprintln!("{} sync writes acknowledged, all present; {} unknown", history.acked.len(), history.unknown.len());
    assert!(history.acked.len() > 50, "the load did run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_declared_down_while_alive_restarts_from_its_files() {
    let cluster = TestCluster::start_with_args(1, 2, 1, 0, &["--gcp-interval-ms", "100"]);
    let client = cluster.client().await.with_durability(Durability::Sync);
    client.create_table(kv_spec("t"), false).await.unwrap();
    for k in 0..200 {
        client.upsert("t", vec![Value::Int(k), Value::Text(value(k))]).await.unwrap();
    }
    let pids = [cluster.pid(11), cluster.pid(12)];
    // Both nodes of the group freeze past the failure timeout: mgmd declares both down, and
    // when they wake they hold data but no node of the group may start it from memory.
    cluster.signal(11, libc::SIGSTOP);
    cluster.signal(12, libc::SIGSTOP);
    cluster.wait_status("both nodes declared down", Duration::from_secs(15), |s| {
        [11, 12].iter().all(|&id| TestCluster::node(s, id)["state"] == "down")
    });
    cluster.signal(11, libc::SIGCONT);
    cluster.signal(12, libc::SIGCONT);
    // They restart in place (same process id) from their own files and the group comes back.
    cluster.wait_status("the group back up", Duration::from_secs(60), |s| {
        [11, 12].iter().all(|&id| TestCluster::node(s, id)["state"] == "up")
    });
    assert_eq!([cluster.pid(11), cluster.pid(12)], pids);
    let restarted = (11..=12)
        .filter(|id| {
            let log = std::fs::read_to_string(cluster.dir.join("logs").join(format!("datanode-{id}.log")));
            log.unwrap_or_default().contains("restarting from this node's own files")
        })
        .count();
    assert!(restarted > 0, "no node restarted from its files");
    let client = cluster.client().await;
    let rows = all_rows(&client).await;
    for k in 0..200 {
        assert_eq!(rows.get(&k), Some(&value(k)), "sync write of key {k} is gone");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_catches_up_and_then_carries_the_data_alone() {
    let cluster = TestCluster::start(1, 2, 1);
    let client = cluster.client().await;
    client.create_table(kv_spec("t"), false).await.unwrap();
    let load = tokio::spawn(write_load(client.clone(), 4, 2, Duration::from_secs(8), Arc::default()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.signal(11, libc::SIGKILL);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(cluster.shoal(&["node", "start", "11"]).status.success());
    cluster.wait_status("node 11 up again", Duration::from_secs(30), |s| TestCluster::node(s, 11)["state"] == "up");
    let history = load.await.unwrap();
    // Now the node that never failed goes: the restarted one serves everything alone.
    cluster.signal(12, libc::SIGKILL);
    cluster
        .wait_status("node 11 primary of all", Duration::from_secs(30), |s| TestCluster::node(s, 11)["primaries"] == 8);
    let rows = all_rows(&client).await;
    for (k, (v, _)) in &history.acked {
        assert_eq!(rows.get(k), Some(v), "acknowledged key {k} is not on the restarted node");
    }
    assert!(history.acked.len() > 100, "the load did run");
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        total += if m.is_dir() { dir_bytes(&e.path()) } else { m.len() };
    }
    total
}

/// Flips a byte in the middle of `path`.
fn flip_byte(path: &std::path::Path, at_fraction: f64) {
    let mut b = std::fs::read(path).unwrap();
    let at = ((b.len() as f64) * at_fraction) as usize;
    b[at] ^= 0x5a;
    std::fs::write(path, b).unwrap();
}

/// The largest file of each finished local checkpoint of a node, newest checkpoint first.
fn checkpoint_files(node_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(dirs) = std::fs::read_dir(node_dir.join("lcp")) else { return vec![] };
    let mut ids: Vec<_> = dirs.flatten().map(|e| e.path()).filter(|d| d.join("meta").exists()).collect();
    ids.sort();
    ids.into_iter()
        .rev()
        .filter_map(|d| {
            let files = std::fs::read_dir(d).ok()?.flatten().map(|e| e.path());
            files
                .filter(|f| f.extension().is_some_and(|e| e == "lcp"))
                .max_by_key(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_checkpoint_and_redo_are_refused_never_half_loaded() {
    // Small checkpoints so several exist.
    let mut cluster = TestCluster::start_with_args(1, 2, 1, 0, &["--lcp-redo-mb", "1"]);
    let client = cluster.client().await;
    client.create_table(kv_spec("t"), false).await.unwrap();
    let history = write_load(client.clone(), 4, 50, Duration::from_secs(6), Arc::default()).await;
    // Wait until the load is in a complete global checkpoint and node 11 has a finished local
    // checkpoint, then crash everything.
    let newest = history.acked.values().map(|(_, g)| *g).max().unwrap();
    cluster.wait_status("the load is durable", Duration::from_secs(30), |s| s["gci_complete"].as_u64() >= Some(newest));
    let node11 = cluster.dir.join("datanode-11");
    assert!(!checkpoint_files(&node11).is_empty(), "no local checkpoint was written");
    // Disk use stays bounded: old checkpoints and the redo they cover are deleted (about 30 MB
    // were written through a 1 MB checkpoint trigger; on a loaded machine the clean-up after
    // the newest checkpoint may still be pending, hence the slack).
    let checkpoints = std::fs::read_dir(node11.join("lcp")).unwrap().count();
    let redo_bytes = dir_bytes(&node11.join("redo"));
    eprintln!("node 11 keeps {checkpoints} checkpoints and {} KB of redo", redo_bytes >> 10);
    assert!(checkpoints <= 4, "{checkpoints} checkpoints kept");
    assert!(redo_bytes < 20 << 20, "{redo_bytes} bytes of redo kept");
    drop(client);
    let dir = cluster.dir.clone();
    cluster.crash_all_and_restart_with(|| {
        // Node 11: damage every checkpoint it has (which one it restores depends on what mgmd
        // last recorded as restorable, so the newest alone may go unread): it must refuse
        // each, naming the file, and copy from node 12.
        for f in checkpoint_files(&node11) {
            eprintln!("damaging {}", f.display());
            flip_byte(&f, 0.5);
        }
        // Node 12: garbage appended to its newest redo segment (a torn tail).
        let part = dir.join("datanode-12/redo/part0");
        let mut segs: Vec<_> = std::fs::read_dir(&part).unwrap().flatten().map(|e| e.path()).collect();
        segs.sort();
        let last = segs.last().unwrap();
        let mut b = std::fs::read(last).unwrap();
        b.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
        std::fs::write(last, b).unwrap();
    });
    let client = cluster.client().await;
    let rows = all_rows(&client).await;
    let lost = history.acked.keys().filter(|k| !rows.contains_key(k)).count();
    assert_eq!(lost, 0, "acknowledged rows lost after restoring from damaged files");
    let log11 = std::fs::read_to_string(cluster.dir.join("logs/datanode-11.log")).unwrap();
    assert!(log11.contains(".lcp"), "node 11 names the damaged checkpoint file");
    let log12 = std::fs::read_to_string(cluster.dir.join("logs/datanode-12.log")).unwrap();
    assert!(log12.contains("cut off a torn tail"), "node 12 reports the torn redo tail");
    // Both nodes serve again with equal data.
    cluster.wait_status("both up", Duration::from_secs(30), |s| {
        TestCluster::node(s, 11)["state"] == "up" && TestCluster::node(s, 12)["state"] == "up"
    });
    for k in history.acked.keys().take(300) {
        let a = client.get_from_node(11, "t", vec![Value::Int(*k)]).await.unwrap();
        let b = client.get_from_node(12, "t", vec![Value::Int(*k)]).await.unwrap();
        assert_eq!(a, b, "replicas disagree on {k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_session_in_sync_mode_survives_a_whole_cluster_kill() {
    use mysql_async::prelude::*;
    let mut cluster = TestCluster::start_with_args(1, 2, 1, 1, &["--gcp-interval-ms", "100"]);
    let (host, port) = cluster.mysql_addrs[0].rsplit_once(':').unwrap();
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname(host.to_string())
        .tcp_port(port.parse().unwrap())
        .user(Some("root"))
        .prefer_socket(false);
    let mut c = mysql_async::Conn::new(opts.clone()).await.unwrap();
    c.query_drop("CREATE DATABASE d").await.unwrap();
    c.query_drop("CREATE TABLE d.t (id INT PRIMARY KEY, v VARCHAR(20))").await.unwrap();
    match c.query_drop("SET shoal_durability = 'fast'").await {
        Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1231),
        other => panic!("a bad durability value must be refused, got {other:?}"),
    }
    c.query_drop("SET SESSION shoal_durability = 'sync'").await.unwrap();
    for i in 0..20 {
        c.query_drop(format!("INSERT INTO d.t VALUES ({i}, 'v{i}')")).await.unwrap();
    }
    drop(c);
    cluster.crash_all_and_restart();
    let mut c = mysql_async::Conn::new(opts).await.unwrap();
    let n: Option<i64> = c.query_first("SELECT COUNT(*) FROM d.t").await.unwrap();
    assert_eq!(n, Some(20), "every INSERT acknowledged in sync mode survives");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_are_all_or_nothing_after_a_whole_cluster_kill() {
    let mut cluster = TestCluster::start_with_args(2, 2, 1, 0, &["--gcp-interval-ms", "100"]);
    let client = cluster.client().await;
    client.create_table(kv_spec("t"), false).await.unwrap();
    // Each transaction inserts 5 rows spread over partitions and node groups; acknowledged ones
    // are sync (on disk), the others may or may not survive, but never in part.
    let crashed = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
    let mut writers = vec![];
    for w in 0..4i64 {
        let (client, crashed, acked) = (client.with_durability(Durability::Sync), crashed.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !crashed.load(Ordering::SeqCst) && n < 10_000 {
                let txn = w * 100_000 + n;
                n += 1;
                let mut tx = client.begin();
                let mut ok = true;
                for i in 0..5 {
                    ok &= tx.insert("t", vec![Value::Int(txn * 10 + i), Value::Text(value(txn))]).await.is_ok();
                }
                if ok && tx.commit().await.is_ok() && !crashed.load(Ordering::SeqCst) {
                    acked.lock().unwrap().push(txn);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    crashed.store(true, Ordering::SeqCst);
    cluster.crash_all_and_restart();
    for w in writers {
        let _ = w.await;
    }
    let client = cluster.client().await;
    let rows = all_rows(&client).await;
    let mut by_txn: HashMap<i64, usize> = HashMap::new();
    for k in rows.keys() {
        *by_txn.entry(k / 10).or_default() += 1;
    }
    let partial: Vec<(&i64, &usize)> = by_txn.iter().filter(|(_, &n)| n != 5).collect();
    assert!(partial.is_empty(), "transactions restored in part: {partial:?}");
    let acked = acked.lock().unwrap();
    for txn in acked.iter() {
        assert_eq!(by_txn.get(txn), Some(&5), "acknowledged transaction {txn} is gone");
    }
    eprintln!("{} transactions acknowledged, {} restored whole", acked.len(), by_txn.len());
    assert!(acked.len() > 20, "the load ran");
}

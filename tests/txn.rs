//! Transactions (DESIGN §3.2, §3.4, §4 "Transactions") on real clusters: atomic transfers under
//! kill -9 of data nodes, lost updates, dirty reads, lock waits, deadlocks, vanished clients.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestCluster;
use shoal_client::{Client, KeyOp, LockMode, Transaction};
use shoal_proto::{Column, ColumnType, ErrorCode, ShoalError, TableSpec, Value};

fn accounts_spec() -> TableSpec {
    TableSpec {
        name: "accounts".into(),
        columns: vec![Column::new("id", ColumnType::Int), Column::new("balance", ColumnType::Int)],
        primary_key: vec![0],
        partition_key: vec![],
    }
}

fn balance(row: &Option<Vec<Value>>) -> i64 {
    row.as_ref().and_then(|r| r[1].as_i64()).expect("account row")
}

/// Errors after which the whole transaction is simply run again.
/// Sets account `id`'s balance (a write for `commit_with`).
fn set_balance(id: i64, balance: i64) -> KeyOp {
    KeyOp::Update {
        table: "accounts".into(),
        key: vec![Value::Int(id)],
        columns: vec![1],
        values: vec![Value::Int(balance)],
        deltas: vec![],
    }
}

fn retriable(e: &ShoalError) -> bool {
    e.is_retriable() || matches!(e.code, ErrorCode::TxnAborted | ErrorCode::LockWaitTimeout)
}

/// One transfer: two locked reads, two updates, commit. Ok(true) when committed.
async fn transfer(client: &Client, from: i64, to: i64, amount: i64) -> Result<bool, ShoalError> {
    let mut tx = client.begin();
    // Lock in key order: fewer deadlocks (they would still be broken by the lock timeout).
    let (a, b) = if from < to { (from, to) } else { (to, from) };
    let ra = tx.get("accounts", vec![Value::Int(a)], LockMode::Exclusive).await?;
    let rb = tx.get("accounts", vec![Value::Int(b)], LockMode::Exclusive).await?;
    let (bal_from, bal_to) = if from < to { (balance(&ra), balance(&rb)) } else { (balance(&rb), balance(&ra)) };
    if bal_from < amount {
        tx.rollback().await?;
        return Ok(false);
    }
    if amount % 2 == 1 {
        // Half the transfers send their writes with the commit (`commit_with`): both ways
        // of committing go through the faults.
        tx.commit_with(vec![set_balance(from, bal_from - amount), set_balance(to, bal_to + amount)]).await?;
        return Ok(true);
    }
    tx.update("accounts", vec![Value::Int(from)], vec![1], vec![Value::Int(bal_from - amount)]).await?;
    tx.update("accounts", vec![Value::Int(to)], vec![1], vec![Value::Int(bal_to + amount)]).await?;
    tx.commit().await?;
    Ok(true)
}

/// Every balance, read in one transaction with shared locks: a consistent snapshot once the
/// commit confirms every participant still held its locks.
async fn audit(client: &Client, n: i64) -> Result<Vec<i64>, ShoalError> {
    let mut tx = client.begin();
    let ops = (0..n)
        .map(|k| (shoal_client::KeyOp::Read { table: "accounts".into(), key: vec![Value::Int(k)] }, LockMode::Shared))
        .collect();
    let rows = tx.execute(ops).await;
    let mut out = Vec::with_capacity(n as usize);
    for r in rows {
        out.push(balance(&r?));
    }
    tx.commit().await?;
    Ok(out)
}

async fn bank(kill_tc_too: bool) {
    const ACCOUNTS: i64 = 1000;
    const START: i64 = 100;
    let cluster = TestCluster::start(2, 2, 1);
    let client = cluster.client().await;
    client.create_table(accounts_spec(), false).await.unwrap();
    for chunk in (0..ACCOUNTS).collect::<Vec<_>>().chunks(200) {
        let ops = chunk
            .iter()
            .map(|&k| shoal_client::KeyOp::Insert {
                table: "accounts".into(),
                row: vec![Value::Int(k), Value::Int(START)],
            })
            .collect();
        for r in client.batch(ops).await {
            r.unwrap();
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut workers = vec![];
    for w in 0..16u64 {
        let (client, stop, committed, failed, bad) =
            (client.clone(), stop.clone(), committed.clone(), failed.clone(), bad.clone());
        workers.push(tokio::spawn(async move {
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (w << 20);
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let from = (x % ACCOUNTS as u64) as i64;
                let to = ((x >> 20) % ACCOUNTS as u64) as i64;
                if from == to {
                    continue;
                }
                match transfer(&client, from, to, 1 + (x >> 40) as i64 % 20).await {
                    Ok(true) => {
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(false) => {}
                    Err(e) if retriable(&e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => bad.lock().unwrap().push(e.to_string()),
                }
            }
        }));
    }
    // Fault loop: kill -9 a data node every few seconds, restart it, wait until it is back.
    let nodes = [11u32, 12, 13, 14];
    let run_until = Instant::now() + Duration::from_secs(24);
    let mut i = 0;
    let mut audits = 0;
    while Instant::now() < run_until {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let victim = if kill_tc_too {
            nodes[i % nodes.len()]
        } else {
            // Only backups' nodes... every node is a TC for some transaction; alternate groups.
            nodes[(i * 2) % nodes.len()]
        };
        i += 1;
        cluster.signal(victim, libc::SIGKILL);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(cluster.shoal(&["node", "start", &victim.to_string()]).status.success());
        cluster.wait_status("victim back", Duration::from_secs(60), |s| {
            TestCluster::node(s, victim as u64)["state"] == "up"
        });
        // A consistent read of every balance in the middle of the load (it competes for the
        // locks with 16 writers, so it may need a few tries).
        for _ in 0..5 {
            match audit(&client, ACCOUNTS).await {
                Ok(b) => {
                    audits += 1;
                    assert_eq!(b.iter().sum::<i64>(), ACCOUNTS * START, "money created or destroyed (audit {audits})");
                    assert!(b.iter().all(|&x| x >= 0), "negative balance");
                    break;
                }
                Err(e) => eprintln!("audit: {e}"),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    // Once the load stopped every lock must come free: a final audit that keeps timing out
    // means a transaction was left holding locks.
    let final_deadline = Instant::now() + Duration::from_secs(30);
    let balances = loop {
        match audit(&client, ACCOUNTS).await {
            Ok(b) => break b,
            Err(e) => {
                assert!(Instant::now() < final_deadline, "the final audit never got its locks: {e}");
                eprintln!("final audit retry: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let total: i64 = balances.iter().sum();
    eprintln!(
        "bank: {} transfers committed, {} retried, {audits} audits during faults",
        committed.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
    assert!(bad.lock().unwrap().is_empty(), "non-retriable errors: {:?}", bad.lock().unwrap());
    assert_eq!(total, ACCOUNTS * START, "the total changed");
    assert!(balances.iter().all(|&b| b >= 0), "a balance went negative");
    assert!(committed.load(Ordering::Relaxed) > 100, "the load ran");
    assert!(audits > 0, "at least one audit ran during the faults");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_transfers_keep_the_total_while_data_nodes_are_killed() {
    bank(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_locked_increments_lose_no_update() {
    let cluster = TestCluster::start(1, 2, 1);
    let client = cluster.client().await;
    client.create_table(accounts_spec(), false).await.unwrap();
    client.insert("accounts", vec![Value::Int(0), Value::Int(0)]).await.unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let mut tasks = vec![];
    for _ in 0..8 {
        let (client, acked) = (client.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                loop {
                    let mut tx = client.begin();
                    let r = async {
                        let v = balance(&tx.get("accounts", vec![Value::Int(0)], LockMode::Exclusive).await?);
                        tx.update("accounts", vec![Value::Int(0)], vec![1], vec![Value::Int(v + 1)]).await?;
                        tx.commit().await
                    }
                    .await;
                    match r {
                        Ok(_) => {
                            acked.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Err(e) if retriable(&e) => continue,
                        Err(e) => panic!("increment failed: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let v = balance(&client.get("accounts", vec![Value::Int(0)]).await.unwrap());
    assert_eq!(v as u64, acked.load(Ordering::Relaxed));
    assert_eq!(v, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_uncommitted_or_aborted_writes() {
    let cluster = TestCluster::start(2, 2, 1);
    let client = cluster.client().await;
    client.create_table(accounts_spec(), false).await.unwrap();
    for k in 0..4 {
        client.insert("accounts", vec![Value::Int(k), Value::Int(0)]).await.unwrap();
    }
    // Writers set all four rows to an intermediate value (negative) and then to a fresh value
    // in one transaction, and then commit or roll back at random; readers record every value
    // they see. G1a: no value of an aborted transaction is read. G1b: no intermediate value is
    // read. And every value read was committed (or its commit's outcome is unknown).
    let aborted_values = Arc::new(Mutex::new(HashSet::new()));
    let unknown_values = Arc::new(Mutex::new(HashSet::new()));
    let committed_values = Arc::new(Mutex::new(HashSet::from([0i64])));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = vec![];
    for w in 0..3i64 {
        let (client, aborted_values, committed_values, unknown_values, stop) =
            (client.clone(), aborted_values.clone(), committed_values.clone(), unknown_values.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let value = w * 1_000_000 + n;
                let mut tx = client.begin();
                let mut ok = true;
                for k in 0..4 {
                    ok &= tx.update("accounts", vec![Value::Int(k)], vec![1], vec![Value::Int(-value)]).await.is_ok();
                }
                for k in 0..4 {
                    ok &= tx.update("accounts", vec![Value::Int(k)], vec![1], vec![Value::Int(value)]).await.is_ok();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                if ok && n % 2 == 0 {
                    if tx.commit().await.is_ok() {
                        committed_values.lock().unwrap().insert(value);
                    } else {
                        unknown_values.lock().unwrap().insert(value);
                    }
                } else {
                    aborted_values.lock().unwrap().insert(value);
                    let _ = tx.rollback().await;
                }
            }
        }));
    }
    for _ in 0..2 {
        let (client, seen, stop) = (client.clone(), seen.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let keys = (0..4).map(|k| vec![Value::Int(k)]).collect();
                if let Ok(rows) = client.batch_get("accounts", keys).await {
                    seen.lock().unwrap().extend(rows.iter().map(balance));
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let aborted_values = aborted_values.lock().unwrap();
    let seen = seen.lock().unwrap();
    let dirty: Vec<&i64> = seen.iter().filter(|v| aborted_values.contains(v)).collect();
    eprintln!(
        "{} reads, {} aborted transactions, {} committed",
        seen.len(),
        aborted_values.len(),
        committed_values.lock().unwrap().len()
    );
    assert!(dirty.is_empty(), "G1a: readers saw values of aborted transactions: {:?}", &dirty[..dirty.len().min(5)]);
    let intermediate: Vec<&i64> = seen.iter().filter(|&&v| v < 0).collect();
    assert!(
        intermediate.is_empty(),
        "G1b: readers saw intermediate values: {:?}",
        &intermediate[..intermediate.len().min(5)]
    );
    let (committed, unknown) = (committed_values.lock().unwrap(), unknown_values.lock().unwrap());
    let never: Vec<&i64> = seen.iter().filter(|v| !committed.contains(v) && !unknown.contains(v)).collect();
    assert!(never.is_empty(), "readers saw values nobody committed: {:?}", &never[..never.len().min(5)]);
    assert!(aborted_values.len() > 10 && seen.len() > 100, "the load ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_time_out_deadlocks_break_and_vanished_clients_free_their_locks() {
    let cluster = TestCluster::start(1, 2, 1);
    let client = cluster.client().await;
    client.create_table(accounts_spec(), false).await.unwrap();
    for k in 0..2 {
        client.insert("accounts", vec![Value::Int(k), Value::Int(10)]).await.unwrap();
    }
    // A lock wait times out with LOCK_WAIT_TIMEOUT.
    let mut a = client.begin();
    a.get("accounts", vec![Value::Int(0)], LockMode::Exclusive).await.unwrap();
    let mut b = client.begin();
    let t = Instant::now();
    let e = b.get("accounts", vec![Value::Int(0)], LockMode::Shared).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::LockWaitTimeout, "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // Plain reads take no lock and see the committed value.
    assert_eq!(balance(&client.get("accounts", vec![Value::Int(0)]).await.unwrap()), 10);
    b.rollback().await.unwrap();

    // A deadlock: a holds 0 and wants 1, c holds 1 and wants 0. One of them times out.
    let mut c = client.begin();
    c.get("accounts", vec![Value::Int(1)], LockMode::Exclusive).await.unwrap();
    let (ra, rc) = tokio::join!(
        a.get("accounts", vec![Value::Int(1)], LockMode::Exclusive),
        c.get("accounts", vec![Value::Int(0)], LockMode::Exclusive)
    );
    let errors: Vec<ErrorCode> = [ra.err(), rc.err()].into_iter().flatten().map(|e| e.code).collect();
    assert!(!errors.is_empty(), "the deadlock was not broken");
    assert!(errors.iter().all(|&c| c == ErrorCode::LockWaitTimeout), "{errors:?}");
    a.rollback().await.unwrap();
    c.rollback().await.unwrap();

    // A client that vanishes mid-transaction (no rollback, no drop): its lock is freed within
    // the inactivity timeout.
    let mut gone: Transaction = client.begin();
    gone.get("accounts", vec![Value::Int(0)], LockMode::Exclusive).await.unwrap();
    std::mem::forget(gone);
    let started = Instant::now();
    loop {
        let mut d = client.begin();
        match d.get("accounts", vec![Value::Int(0)], LockMode::Exclusive).await {
            Ok(_) => {
                d.rollback().await.unwrap();
                break;
            }
            Err(e) => assert_eq!(e.code, ErrorCode::LockWaitTimeout, "{e}"),
        }
        assert!(started.elapsed() < Duration::from_secs(15), "the vanished client's lock was never freed");
    }
    eprintln!("vanished client's lock freed after {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_partition_transaction_is_atomic_and_rollback_leaves_nothing() {
    let cluster = TestCluster::start(2, 2, 1);
    let client = cluster.client().await;
    client.create_table(accounts_spec(), false).await.unwrap();
    let mut tx = client.begin();
    for k in 0..50 {
        tx.insert("accounts", vec![Value::Int(k), Value::Int(k)]).await.unwrap();
    }
    // Invisible before the commit.
    assert_eq!(client.get("accounts", vec![Value::Int(3)]).await.unwrap(), None);
    // Visible to the transaction itself.
    assert_eq!(balance(&tx.get("accounts", vec![Value::Int(3)], LockMode::None).await.unwrap()), 3);
    let gci = tx.commit().await.unwrap();
    assert!(gci > 0);
    for k in 0..50 {
        assert_eq!(balance(&client.get("accounts", vec![Value::Int(k)]).await.unwrap()), k);
    }
    // Every replica has it.
    let map = client.map();
    let table = client.table("accounts").unwrap();
    for k in 0..50 {
        let p = shoal_proto::codec::partition_of_key(&table, &[Value::Int(k)]);
        for r in &map.partitions[p as usize].replicas {
            let got = client.get_from_node(r.node_id, "accounts", vec![Value::Int(k)]).await.unwrap();
            assert_eq!(balance(&got), k, "replica {} of key {k}", r.node_id);
        }
    }
    // A locking scan locks what it returns: a plain writer then waits.
    let mut reader = client.begin();
    let filter = shoal_proto::filter::Filter { column: 1, op: shoal_proto::filter::CmpOp::Lt, value: Value::Int(10) };
    let rows = reader.scan_locked("accounts", vec![filter], LockMode::Exclusive, 1000).await.unwrap();
    assert_eq!(rows.len(), 10);
    let mut other = client.begin();
    let e = other.update("accounts", vec![Value::Int(3)], vec![1], vec![Value::Int(0)]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::LockWaitTimeout);
    other.rollback().await.unwrap();
    reader.commit().await.unwrap();

    let mut tx = client.begin();
    for k in 0..50 {
        tx.update("accounts", vec![Value::Int(k)], vec![1], vec![Value::Int(-1)]).await.unwrap();
    }
    tx.insert("accounts", vec![Value::Int(1000), Value::Int(1)]).await.unwrap();
    tx.rollback().await.unwrap();
    for k in 0..50 {
        assert_eq!(balance(&client.get("accounts", vec![Value::Int(k)]).await.unwrap()), k);
    }
    assert_eq!(client.get("accounts", vec![Value::Int(1000)]).await.unwrap(), None);

    // Writes riding on the commit: all of them land, on every replica, or none does.
    let tx = client.begin();
    assert!(tx.commit_with((0..20).map(|k| set_balance(k, 100 + k)).collect()).await.unwrap() > 0);
    for k in 0..20 {
        let p = shoal_proto::codec::partition_of_key(&table, &[Value::Int(k)]);
        for r in &map.partitions[p as usize].replicas {
            let got = client.get_from_node(r.node_id, "accounts", vec![Value::Int(k)]).await.unwrap();
            assert_eq!(balance(&got), 100 + k, "replica {} of key {k}", r.node_id);
        }
    }
    // After a locked read and an update of its own, a duplicate key among the riding writes
    // fails the commit with that error and rolls everything back, locks included.
    let mut tx = client.begin();
    tx.get("accounts", vec![Value::Int(30)], LockMode::Exclusive).await.unwrap();
    tx.update("accounts", vec![Value::Int(31)], vec![1], vec![Value::Int(-5)]).await.unwrap();
    let writes = vec![
        set_balance(32, -5),
        KeyOp::Insert { table: "accounts".into(), row: vec![Value::Int(33), Value::Int(0)] },
        KeyOp::Insert { table: "accounts".into(), row: vec![Value::Int(2000), Value::Int(7)] },
    ];
    let e = tx.commit_with(writes).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::DuplicateKey, "{e}");
    for k in [30, 31, 32, 33] {
        assert_eq!(balance(&client.get("accounts", vec![Value::Int(k)]).await.unwrap()), k);
    }
    assert_eq!(client.get("accounts", vec![Value::Int(2000)]).await.unwrap(), None);
    let mut locker = client.begin();
    for k in [30, 31, 32] {
        locker.get("accounts", vec![Value::Int(k)], LockMode::Exclusive).await.unwrap();
    }
    locker.rollback().await.unwrap();
    // The same in a one-partition transaction (a one-phase commit).
    let mut tx = client.begin();
    tx.get("accounts", vec![Value::Int(40)], LockMode::Exclusive).await.unwrap();
    let dup = KeyOp::Insert { table: "accounts".into(), row: vec![Value::Int(40), Value::Int(0)] };
    assert_eq!(tx.commit_with(vec![dup]).await.unwrap_err().code, ErrorCode::DuplicateKey);
    let mut locker = client.begin();
    locker.get("accounts", vec![Value::Int(40)], LockMode::Exclusive).await.unwrap();
    locker.rollback().await.unwrap();
    // Reads have nowhere to go.
    let e = client.begin().commit_with(vec![KeyOp::Read { table: "accounts".into(), key: vec![Value::Int(1)] }]).await;
    assert_eq!(e.unwrap_err().code, ErrorCode::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_audits_see_a_consistent_total_during_transfers() {
    const ACCOUNTS: i64 = 200;
    let cluster = TestCluster::start(2, 2, 1);
    let client = cluster.client().await;
    client.create_table(accounts_spec(), false).await.unwrap();
    let ops = (0..ACCOUNTS)
        .map(|k| shoal_client::KeyOp::Insert { table: "accounts".into(), row: vec![Value::Int(k), Value::Int(100)] })
        .collect();
    for r in client.batch(ops).await {
        r.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = vec![];
    for w in 0..4u64 {
        let (client, stop) = (client.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut x = 0x2545_f491_4f6c_dd1du64 ^ (w << 24);
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (from, to) = ((x % ACCOUNTS as u64) as i64, ((x >> 20) % ACCOUNTS as u64) as i64);
                if from != to {
                    match transfer(&client, from, to, 1 + (x >> 40) as i64 % 20).await {
                        Ok(_) => {}
                        Err(e) if retriable(&e) => {}
                        Err(e) => panic!("transfer failed: {e}"),
                    }
                }
            }
        }));
    }
    let (mut audits, mut tries) = (0, 0);
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        tries += 1;
        if let Ok(b) = audit(&client, ACCOUNTS).await {
            audits += 1;
            assert_eq!(b.iter().sum::<i64>(), ACCOUNTS * 100, "audit {audits} saw a partial transfer");
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    eprintln!("{audits} of {tries} audits completed");
    assert!(audits >= 1, "audits ran ({audits} of {tries})");
}

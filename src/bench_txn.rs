//! `shoal bench txn`: bank transfers as cluster transactions.
//!
//! Each client loops: pick two accounts, read both with exclusive locks, update both, commit;
//! a transaction that loses a lock race (LOCK_WAIT_TIMEOUT) or is rolled back by a failure
//! (TXN_ABORTED) counts as a retry and runs again. `--single-partition` picks both accounts in
//! one partition (one participant: no two-phase commit); otherwise they are drawn at random
//! and mostly land on different partitions and node groups. At the end the total of all
//! balances is checked.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use hdrhistogram::Histogram;
use shoal_client::{Client, ClientOptions, KeyOp, LockMode};
use shoal_proto::{codec, Column, ColumnType, ErrorCode, ShoalError, TableSpec, Value};

use crate::bench::LoadRuntime;
use crate::local::LocalCluster;

pub const ACCOUNTS_TABLE: &str = "bench_accounts";
const START_BALANCE: i64 = 1000;

#[derive(clap::Args, Clone)]
pub struct TxnArgs {
    #[arg(long, default_value = "shoal-data")]
    pub dir: PathBuf,
    /// mgmd addresses instead of DIR/cluster.toml.
    #[arg(long)]
    pub mgmd: Vec<String>,
    #[arg(long, default_value_t = 16)]
    pub threads: usize,
    #[command(flatten)]
    pub runtime: LoadRuntime,
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    #[arg(long, default_value_t = 10_000)]
    pub accounts: i64,
    /// Both accounts of a transfer in the same partition.
    #[arg(long)]
    pub single_partition: bool,
    #[arg(long)]
    pub json: bool,
}

struct Worker {
    hist: Histogram<u64>,
    committed: u64,
    retries: u64,
    errors: u64,
    first_error: Option<String>,
}

fn row(k: i64, balance: i64) -> Vec<Value> {
    vec![Value::Int(k), Value::Int(balance)]
}

pub async fn run_txn(a: TxnArgs) -> Result<()> {
    if a.threads == 0 || a.accounts < 2 {
        bail!("--threads must be positive and --accounts at least 2");
    }
    let addrs = if a.mgmd.is_empty() { LocalCluster::open(&a.dir)?.config.mgmd_addrs() } else { a.mgmd.clone() };
    let client = Client::connect_with(&addrs, ClientOptions::default()).await.map_err(anyhow::Error::msg)?;
    let spec = TableSpec {
        name: ACCOUNTS_TABLE.into(),
        columns: vec![Column::new("id", ColumnType::Int), Column::new("balance", ColumnType::Int)],
        primary_key: vec![0],
        partition_key: vec![],
    };
    client.drop_table(ACCOUNTS_TABLE, true).await.map_err(anyhow::Error::msg)?;
    client.create_table(spec, false).await.map_err(anyhow::Error::msg)?;
    for chunk in (0..a.accounts).collect::<Vec<_>>().chunks(500) {
        let ops =
            chunk.iter().map(|&k| KeyOp::Insert { table: ACCOUNTS_TABLE.into(), row: row(k, START_BALANCE) }).collect();
        for r in client.batch(ops).await {
            r.map_err(anyhow::Error::msg)?;
        }
    }
    // Accounts by partition, for single-partition transfers.
    let table = client.table(ACCOUNTS_TABLE).map_err(anyhow::Error::msg)?;
    let mut by_partition: Vec<Vec<i64>> = vec![vec![]; table.partition_count as usize];
    for k in 0..a.accounts {
        by_partition[codec::partition_of_key(&table, &[Value::Int(k)]) as usize].push(k);
    }
    by_partition.retain(|p| p.len() >= 2);
    let by_partition = std::sync::Arc::new(by_partition);

    let started = Instant::now();
    let stop = started + Duration::from_secs(a.duration);
    let mut tasks = vec![];
    for t in 0..a.threads {
        let (client, a, by_partition) = (client.clone(), a.clone(), by_partition.clone());
        tasks.push(tokio::spawn(async move { worker(client, a, t, stop, by_partition).await }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3)?;
    let (mut committed, mut retries, mut errors, mut first_error) = (0, 0, 0, None);
    for t in tasks {
        let w = t.await?;
        hist.add(&w.hist)?;
        committed += w.committed;
        retries += w.retries;
        errors += w.errors;
        if first_error.is_none() {
            first_error = w.first_error;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total = total_balance(&client, a.accounts).await?;
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let expected = a.accounts * START_BALANCE;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "threads": a.threads, "single_partition": a.single_partition, "seconds": elapsed,
                "committed": committed, "tps": committed as f64 / elapsed, "retries": retries, "errors": errors,
                "p50_ms": ms(0.5), "p99_ms": ms(0.99), "max_ms": hist.max() as f64 / 1000.0,
                "total_ok": total == expected,
            })
        );
    } else {
        println!(
            "bench txn: threads {}, {} accounts, {}, {elapsed:.1} s",
            a.threads,
            a.accounts,
            if a.single_partition { "single-partition" } else { "multi-partition" }
        );
        println!(
            "committed {committed}: {:.0} transfers/s, retries {retries}, errors {errors}",
            committed as f64 / elapsed
        );
        println!(
            "latency per transfer: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            ms(0.5),
            ms(0.99),
            hist.max() as f64 / 1000.0
        );
        if let Some(e) = first_error {
            println!("first error: {e}");
        }
        println!("total {total} (expected {expected})");
    }
    if total != expected {
        bail!("the total of all balances changed: {total} != {expected}");
    }
    Ok(())
}

async fn total_balance(client: &Client, accounts: i64) -> Result<i64> {
    let mut total = 0;
    for chunk in (0..accounts).collect::<Vec<_>>().chunks(500) {
        let rows = client
            .batch_get(ACCOUNTS_TABLE, chunk.iter().map(|&k| vec![Value::Int(k)]).collect())
            .await
            .map_err(anyhow::Error::msg)?;
        total += rows.iter().map(|r| r.as_ref().and_then(|r| r[1].as_i64()).unwrap_or(0)).sum::<i64>();
    }
    Ok(total)
}

async fn transfer(client: &Client, from: i64, to: i64, amount: i64) -> Result<(), ShoalError> {
    let mut tx = client.begin();
    let (lo, hi) = (from.min(to), from.max(to));
    let rows = tx
        .execute(vec![
            (KeyOp::Read { table: ACCOUNTS_TABLE.into(), key: vec![Value::Int(lo)] }, LockMode::Exclusive),
            (KeyOp::Read { table: ACCOUNTS_TABLE.into(), key: vec![Value::Int(hi)] }, LockMode::Exclusive),
        ])
        .await;
    let mut bal = [0i64; 2];
    for (i, r) in rows.into_iter().enumerate() {
        bal[i] = r?.and_then(|r| r[1].as_i64()).ok_or_else(|| ShoalError::internal("account missing"))?;
    }
    let (b_from, b_to) = if from < to { (bal[0], bal[1]) } else { (bal[1], bal[0]) };
    let amount = amount.min(b_from);
    let update = |id: i64, balance: i64| KeyOp::Update {
        table: ACCOUNTS_TABLE.into(),
        key: vec![Value::Int(id)],
        columns: vec![1],
        values: vec![Value::Int(balance)],
        deltas: vec![],
    };
    // The two writes ride on the commit: one round trip to the participants fewer.
    tx.commit_with(vec![update(from, b_from - amount), update(to, b_to + amount)]).await.map(|_| ())
}

async fn worker(
    client: Client,
    a: TxnArgs,
    id: usize,
    stop: Instant,
    by_partition: std::sync::Arc<Vec<Vec<i64>>>,
) -> Worker {
    let mut w = Worker {
        hist: Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds"),
        committed: 0,
        retries: 0,
        errors: 0,
        first_error: None,
    };
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ ((id as u64 + 1) << 21);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    while Instant::now() < stop {
        let (from, to) = if a.single_partition && !by_partition.is_empty() {
            let p = &by_partition[(next() % by_partition.len() as u64) as usize];
            let i = (next() % p.len() as u64) as usize;
            let j = (i + 1 + (next() % (p.len() as u64 - 1)) as usize) % p.len();
            (p[i], p[j])
        } else {
            let from = (next() % a.accounts as u64) as i64;
            let to = (from + 1 + (next() % (a.accounts as u64 - 1)) as i64) % a.accounts;
            (from, to)
        };
        let began = Instant::now();
        match transfer(&client, from, to, 1 + (next() % 10) as i64).await {
            Ok(()) => {
                w.committed += 1;
                let _ = w.hist.record(began.elapsed().as_micros().max(1) as u64);
            }
            Err(e) if e.is_retriable() || matches!(e.code, ErrorCode::TxnAborted | ErrorCode::LockWaitTimeout) => {
                w.retries += 1
            }
            Err(e) => {
                w.errors += 1;
                if w.first_error.is_none() {
                    w.first_error = Some(e.to_string());
                }
            }
        }
    }
    w
}

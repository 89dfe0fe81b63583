//! `shoal bench kv`: a native key-value load generator (NDB's flexAsynch counterpart).
//!
//! T concurrent clients each loop for the duration: pick read or write by the write ratio, send
//! a batch of B keys, time the call. With `--verify` every client writes only its own keys and
//! remembers the last acknowledged value of each (and any write whose outcome it could not
//! learn); at the end every written key is read back and a key whose value is neither of those
//! counts as lost.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use hdrhistogram::Histogram;
use shoal_client::{Client, ClientOptions, Durability, KeyOp, Transport};
use shoal_proto::{Column, ColumnType, TableSpec, Value};

use crate::local::LocalCluster;

pub const BENCH_TABLE: &str = "bench_kv";

/// The runtime a load generator (`bench kv`, `bench txn`) runs its clients on.
#[derive(clap::Args, Clone)]
pub struct LoadRuntime {
    /// OS threads of the load generator's runtime. One (the default) runs every client
    /// task on a single-threaded runtime, as redis-benchmark and flexAsynch's threads do: a
    /// multi-threaded one spent its CPU waking its other worker, which the cluster's nodes
    /// needed (64-client reads: 213–235k → 419–424k ops/s on 2 cores).
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
}

impl LoadRuntime {
    pub fn build(&self) -> Result<tokio::runtime::Runtime> {
        if self.client_threads == 0 {
            bail!("--client-threads must be at least 1");
        }
        Ok(shoal_proto::config::runtime_builder(self.client_threads).enable_all().build()?)
    }
}

#[derive(clap::Args, Clone)]
pub struct KvArgs {
    #[arg(long, default_value = "shoal-data")]
    pub dir: PathBuf,
    /// mgmd addresses (instead of DIR/cluster.toml).
    #[arg(long)]
    pub mgmd: Vec<String>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    pub threads: usize,
    #[command(flatten)]
    pub runtime: LoadRuntime,
    /// Keys per call.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Share of calls that write (0 = reads only, 1 = writes only).
    #[arg(long, default_value_t = 0.5)]
    pub write_ratio: f64,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// Read from any replica, showing what it holds (a backup may show a write its primary has
    /// not applied yet).
    #[arg(long)]
    pub read_backup: bool,
    /// Read every key at its primary. By default a batch of keys goes to one replica of the
    /// node group, which answers as the primary would (`ClientOptions::read_any_replica`).
    #[arg(long, conflicts_with = "read_backup")]
    pub primary_reads: bool,
    /// Reach the data nodes over TCP even when they run on this host, as an application on
    /// another machine would (by default a local data node is dialed on its Unix socket).
    #[arg(long)]
    pub tcp: bool,
    /// When writes are acknowledged: `memory` (every live replica holds them) or `sync` (also
    /// on disk everywhere: their global checkpoint completed).
    #[arg(long, default_value = "memory", value_parser = ["memory", "sync"])]
    pub durability: String,
    /// Check at the end that every acknowledged write reads back.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Default)]
struct Expect {
    acked: Option<u64>,
    /// Writes after the last acknowledged one whose outcome is unknown.
    unknown: Vec<u64>,
}

struct Worker {
    hist: Histogram<u64>,
    reads: u64,
    writes: u64,
    errors: u64,
    first_error: Option<String>,
    expect: HashMap<u64, Expect>,
}

/// xorshift64*: cheap per-worker randomness, no shared state.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn value_of(version: u64, size: usize) -> Value {
    let mut v = version.to_be_bytes().to_vec();
    v.resize(size.max(8), b'x');
    Value::Bytes(v)
}

fn version_in(row: &[Value]) -> Option<u64> {
    match row.get(1) {
        Some(Value::Bytes(b)) if b.len() >= 8 => Some(u64::from_be_bytes(b[..8].try_into().ok()?)),
        _ => None,
    }
}

pub async fn run_kv(a: KvArgs) -> Result<()> {
    if a.threads == 0 || a.batch == 0 || a.keys == 0 || !(0.0..=1.0).contains(&a.write_ratio) {
        bail!("--threads, --batch and --keys must be positive and --write-ratio within 0..=1");
    }
    if a.verify && a.keys < a.threads as u64 {
        bail!("--verify needs at least one key per thread");
    }
    let addrs = if a.mgmd.is_empty() { LocalCluster::open(&a.dir)?.config.mgmd_addrs() } else { a.mgmd.clone() };
    let transport = if a.tcp { Transport::Tcp } else { Transport::Auto };
    let opts = ClientOptions {
        read_backup: a.read_backup,
        read_any_replica: !a.primary_reads,
        transport,
        ..ClientOptions::default()
    };
    let client = Client::connect_with(&addrs, opts).await.map_err(anyhow::Error::msg)?;
    let durability = if a.durability == "sync" { Durability::Sync } else { Durability::Memory };
    let client = client.with_durability(durability);
    let spec = TableSpec {
        name: BENCH_TABLE.into(),
        columns: vec![
            Column::new("k", ColumnType::Uint),
            Column { max_len: 8192, ..Column::new("v", ColumnType::Bytes) },
        ],
        primary_key: vec![0],
        partition_key: vec![],
    };
    client.create_table(spec, true).await.map_err(anyhow::Error::msg)?;

    // Every key exists before reads start, so reads measure finding a row.
    if a.write_ratio < 1.0 {
        preload(&client, &a).await?;
    }

    let started = Instant::now();
    let stop = started + Duration::from_secs(a.duration);
    let mut tasks = vec![];
    for t in 0..a.threads {
        let client = client.clone();
        let a = a.clone();
        tasks.push(tokio::spawn(async move { worker(client, a, t, stop).await }));
    }
    let mut workers = vec![];
    for t in tasks {
        workers.push(t.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();

    let mut hist = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3)?;
    let (mut reads, mut writes, mut errors) = (0, 0, 0);
    let mut first_error = None;
    for w in &workers {
        hist.add(&w.hist)?;
        reads += w.reads;
        writes += w.writes;
        errors += w.errors;
        if first_error.is_none() {
            first_error.clone_from(&w.first_error);
        }
    }
    let lost = if a.verify { Some(verify(&client, &workers).await?) } else { None };
    let ops = reads + writes;
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    if a.json {
        let doc = serde_json::json!({
            "threads": a.threads, "batch": a.batch, "write_ratio": a.write_ratio, "seconds": elapsed,
            "ops": ops, "ops_per_s": ops as f64 / elapsed, "calls": hist.len(),
            "p50_ms": ms(0.5), "p99_ms": ms(0.99), "p999_ms": ms(0.999), "max_ms": hist.max() as f64 / 1000.0,
            "errors": errors, "retries": client.retries(), "lost": lost, "durability": a.durability,
        });
        println!("{doc}");
    } else {
        println!(
            "bench kv: threads {}, batch {}, write ratio {:.2}, {:.1} s, keys {}, value {} B{}",
            a.threads,
            a.batch,
            a.write_ratio,
            elapsed,
            a.keys,
            a.value_size,
            match (a.read_backup, a.primary_reads) {
                (true, _) => ", read-backup",
                (_, true) => ", primary reads",
                _ => "",
            }
        );
        println!(
            "ops {ops}: {:.0} ops/s (reads {:.0}/s, writes {:.0}/s)",
            ops as f64 / elapsed,
            reads as f64 / elapsed,
            writes as f64 / elapsed
        );
        println!(
            "latency per call: p50 {:.3} ms, p99 {:.3} ms, p999 {:.3} ms, max {:.3} ms",
            ms(0.5),
            ms(0.99),
            ms(0.999),
            hist.max() as f64 / 1000.0
        );
        println!("errors {errors}, retries {}", client.retries());
        if let Some(e) = first_error {
            println!("first error: {e}");
        }
        if let Some(lost) = lost {
            println!("lost {lost}");
        }
    }
    if lost.is_some_and(|l| l > 0) {
        bail!("acknowledged writes were lost");
    }
    Ok(())
}

async fn preload(client: &Client, a: &KvArgs) -> Result<()> {
    const CHUNK: u64 = 200;
    let chunks: Vec<u64> = (0..a.keys.div_ceil(CHUNK)).collect();
    let per_task = chunks.len().div_ceil(a.threads.clamp(1, 8));
    let mut tasks = vec![];
    for part in chunks.chunks(per_task.max(1)) {
        let part = part.to_vec();
        let client = client.clone();
        let (keys, size) = (a.keys, a.value_size);
        tasks.push(tokio::spawn(async move {
            for c in part {
                let ops = (c * CHUNK..((c + 1) * CHUNK).min(keys))
                    .map(|k| KeyOp::Upsert { table: BENCH_TABLE.into(), row: vec![Value::Uint(k), value_of(0, size)] })
                    .collect();
                for r in client.batch(ops).await {
                    r?;
                }
            }
            Ok::<(), shoal_proto::ShoalError>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

async fn worker(client: Client, a: KvArgs, id: usize, stop: Instant) -> Worker {
    let mut w = Worker {
        hist: Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds"),
        reads: 0,
        writes: 0,
        errors: 0,
        first_error: None,
        expect: HashMap::new(),
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((id as u64 + 1) << 17));
    let threads = a.threads as u64;
    // With --verify a worker writes only keys k with k % threads == id.
    let own_keys = a.keys / threads;
    let mut version = (id as u64) << 40;
    while Instant::now() < stop {
        let write = rng.unit() < a.write_ratio;
        let keys: Vec<u64> = (0..a.batch)
            .map(|_| {
                if write && a.verify {
                    (rng.next() % own_keys.max(1)) * threads + id as u64
                } else {
                    rng.next() % a.keys
                }
            })
            .collect();
        // Writes are upserts; reads go the way a batch read of one table goes
        // (`Client::read_many`).
        let (ops, versions): (Vec<KeyOp>, Vec<Option<u64>>) = match write {
            true => keys
                .iter()
                .map(|&k| {
                    version += 1;
                    let row = vec![Value::Uint(k), value_of(version, a.value_size)];
                    let v = version_in(&row);
                    (KeyOp::Upsert { table: BENCH_TABLE.into(), row }, v)
                })
                .unzip(),
            false => (vec![], vec![None; keys.len()]),
        };
        let t0 = Instant::now();
        let results = match write {
            true => client.batch(ops).await,
            false => client.read_many(BENCH_TABLE, keys.iter().map(|&k| vec![Value::Uint(k)]).collect(), &[]).await,
        };
        let _ = w.hist.record((t0.elapsed().as_micros() as u64).max(1));
        for ((k, v), r) in keys.iter().zip(versions).zip(results) {
            if write {
                w.writes += 1;
            } else {
                w.reads += 1;
            }
            if let Err(e) = &r {
                w.errors += 1;
                if w.first_error.is_none() {
                    w.first_error = Some(e.to_string());
                }
            }
            if let (true, Some(v)) = (a.verify && write, v) {
                // Duplicate keys inside one batch run concurrently: their order is unknown.
                let dup = keys.iter().filter(|&&x| x == *k).count() > 1;
                let e = w.expect.entry(*k).or_default();
                match (&r, dup) {
                    (Ok(_), false) => {
                        e.acked = Some(v);
                        e.unknown.clear();
                    }
                    _ => e.unknown.push(v),
                }
            }
        }
    }
    w
}

async fn verify(client: &Client, workers: &[Worker]) -> Result<u64> {
    let mut lost = 0u64;
    let mut checked = 0u64;
    for w in workers {
        let keys: Vec<u64> = w.expect.keys().copied().collect();
        for chunk in keys.chunks(500) {
            let rows = client
                .batch_get(BENCH_TABLE, chunk.iter().map(|&k| vec![Value::Uint(k)]).collect())
                .await
                .map_err(anyhow::Error::msg)?;
            for (k, row) in chunk.iter().zip(rows) {
                let e = &w.expect[k];
                let got = row.as_deref().and_then(version_in);
                let fine = match got {
                    Some(v) => e.acked == Some(v) || e.unknown.contains(&v) || (e.acked.is_none() && v == 0),
                    None => e.acked.is_none(),
                };
                checked += 1;
                if !fine {
                    lost += 1;
                    if lost <= 5 {
                        eprintln!("key {k}: read version {got:?}, last acknowledged {:?}", e.acked);
                    }
                }
            }
        }
    }
    eprintln!("verified {checked} keys");
    Ok(lost)
}

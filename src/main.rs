//! `shoal`: run a local cluster, look at it, operate it, load it.

// mimalloc (see `shoal_proto::alloc`).
#[global_allocator]
static GLOBAL: shoal_proto::alloc::Allocator = shoal_proto::alloc::Allocator;

mod bench;
mod bench_txn;
mod health;
mod local;
mod status;
mod up;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

use local::LocalCluster;

#[derive(Parser)]
#[command(name = "shoal", version, about = "Shoal: a distributed in-memory SQL database")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a whole local cluster in the foreground (every node a child process on 127.0.0.1).
    Up(up::UpArgs),
    /// Show the cluster as mgmd sees it.
    Status(status::StatusArgs),
    /// Stop, start or kill one node of a local cluster.
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
    /// Exit 0 if node ID of a cluster config is really serving, else 1 (container health checks).
    Health(health::HealthArgs),
    /// Load generators.
    Bench {
        #[command(subcommand)]
        kind: BenchKind,
    },
}

#[derive(Subcommand)]
enum NodeAction {
    /// SIGTERM the node and wait for it to exit.
    Stop(NodeArgs),
    /// Start the node in the background.
    Start(NodeArgs),
    /// SIGKILL the node (a crash).
    Kill(NodeArgs),
}

#[derive(clap::Args)]
struct NodeArgs {
    id: u32,
    #[arg(long, default_value = "shoal-data")]
    dir: PathBuf,
}

#[derive(Subcommand)]
enum BenchKind {
    /// Key-value reads and writes through the native client (NDB's flexAsynch counterpart).
    Kv(bench::KvArgs),
    /// Bank transfers as cluster transactions (two locked reads, two updates, commit).
    Txn(bench_txn::TxnArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Up(a) => up::run(a),
        Cmd::Status(a) => runtime().and_then(|rt| rt.block_on(status::run(a))),
        Cmd::Node { action } => node(action),
        Cmd::Health(a) => runtime().and_then(|rt| rt.block_on(health::run(a))),
        Cmd::Bench { kind: BenchKind::Kv(a) } => a.runtime.build().and_then(|rt| rt.block_on(bench::run_kv(a))),
        Cmd::Bench { kind: BenchKind::Txn(a) } => a.runtime.build().and_then(|rt| rt.block_on(bench_txn::run_txn(a))),
    };
    if let Err(e) = result {
        eprintln!("shoal: {e:#}");
        std::process::exit(1);
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

fn node(action: NodeAction) -> Result<()> {
    let (args, what) = match &action {
        NodeAction::Stop(a) => (a, "stop"),
        NodeAction::Start(a) => (a, "start"),
        NodeAction::Kill(a) => (a, "kill"),
    };
    let cluster = LocalCluster::open(&args.dir)?;
    if cluster.kind_of(args.id).is_none() {
        bail!("no node {} in {}", args.id, args.dir.display());
    }
    match what {
        "start" => {
            let pid = cluster.start(args.id)?;
            println!("node {} started (pid {pid})", args.id);
        }
        "stop" => {
            if !cluster.signal(args.id, libc::SIGTERM, Duration::from_secs(15))? {
                bail!("node {} is not running or did not stop within 15 s", args.id);
            }
            println!("node {} stopped", args.id);
        }
        _ => {
            if !cluster.signal(args.id, libc::SIGKILL, Duration::from_secs(5))? {
                bail!("node {} is not running", args.id);
            }
            println!("node {} killed", args.id);
        }
    }
    Ok(())
}

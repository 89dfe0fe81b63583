//! shoal-sqlnode: a stateless SQL node. Speaks the MySQL protocol ([`server`]), parses, binds and
//! plans SQL ([`sql`]), and runs it over the cluster through the native client ([`exec`],
//! [`session`]). Any number of SQL nodes can serve one cluster.

mod alter;
pub mod auth;
pub mod error;
pub mod exec;
pub mod infoschema;
mod listen;
mod point;
pub mod server;
pub mod session;
pub mod sql;
pub mod trigger;
pub mod txn;
pub mod types;
mod unique;
pub mod users;
pub mod val;
pub mod view;
mod workers;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use shoal_proto::config::ClusterConfig;
use tokio::sync::Semaphore;

use crate::error::{code, SqlError};
use crate::listen::Listeners;
use crate::session::Shared;
use crate::workers::Workers;

#[derive(Parser, Debug)]
#[command(name = "shoal-sqlnode", about = "Shoal SQL node (MySQL protocol)")]
pub struct Args {
    /// This node's id (a [[sqlnode]] entry of the config).
    #[arg(long)]
    pub id: u32,
    /// Path of cluster.toml.
    #[arg(long)]
    pub config: PathBuf,
}

pub fn main_entry() {
    let args = Args::parse();
    shoal_proto::logging::init("info", false);
    // Worker 0, which accepts connections, runs on a thread of our own with the stack the
    // parser's depth limit assumes; `run` starts the others (see `workers`).
    let sql = std::thread::Builder::new().name("sqlnode".into()).stack_size(sql::parse::WORKER_STACK_BYTES);
    let result = match sql.spawn(move || worker_runtime(spin_us_of(&args)).map(|rt| rt.block_on(run(args)))) {
        Ok(t) => t.join().unwrap_or_else(|_| Ok(Err(anyhow::anyhow!("the SQL node's thread panicked")))),
        Err(e) => Err(e),
    };
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::error!("shoal-sqlnode failed: {e:#}");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("shoal-sqlnode: cannot start runtime: {e}");
            std::process::exit(1);
        }
    }
}

/// How the SQL node uses the cluster: its key reads (point selects, IN lists) go as the
/// primary to any replica (`ClientOptions::read_any_replica`), which answers exactly what the
/// primary would, so a lone read goes to the SQL node's home replica of its node group and
/// concurrent ones merge into one batch (`Client::home_route`). Two batched requests may be
/// out to one data node at once ([`INFLIGHT_PER_NODE`]).
fn client_options() -> shoal_client::ClientOptions {
    shoal_client::ClientOptions {
        read_any_replica: true,
        home_replica: true,
        max_inflight_per_node: INFLIGHT_PER_NODE,
        ..Default::default()
    }
}

/// Batched requests a SQL node worker keeps in flight to one data node. With one, the calls
/// that arrive while a batch is out wait for its whole round trip, and the worker, the data
/// node and the sysbench threads it answers take turns: with two, the data node reads the next
/// batch while the worker answers the last. On 2 cores against one (`benches/ab_sysbench.sh`,
/// medians; benchmarks.md, "Thirty-sixth session"): point selects at 16 threads +5% and +10%,
/// at 256 +7%, at 1, 64 and 1024 even; `oltp_read_write` at 16 threads +4% and +8%, at 1
/// thread +24% (a statement's requests to one node no longer wait for each other), at 64
/// even. Three ran 5% fewer point selects at 16 threads than two.
const INFLIGHT_PER_NODE: usize = 2;

/// The configured spin of node `args.id`; a config that cannot be read fails in `run`, with
/// the reason.
fn spin_us_of(args: &Args) -> u32 {
    ClusterConfig::load(&args.config)
        .ok()
        .and_then(|c| c.sqlnode.iter().find(|s| s.id == args.id).map(|s| s.spin_us))
        .unwrap_or(0)
}

/// A worker's runtime: single-threaded (every task polled on the thread that blocks on it: no
/// sibling worker to wake for each ready socket), spinning `spin_us` after its work where that
/// pays (`shoal_proto::spin`: gated as the data nodes' spinning is).
fn worker_runtime(spin_us: u32) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.thread_stack_size(sql::parse::WORKER_STACK_BYTES);
    let spin = shoal_proto::spin::Spinning { after_work_us: spin_us, after_work_gated: true, await_us: 0 };
    shoal_proto::spin::build(builder, spin)
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = ClusterConfig::load(&args.config).map_err(anyhow::Error::msg)?;
    let me = config
        .sqlnode
        .iter()
        .find(|s| s.id == args.id)
        .with_context(|| format!("node {} is not a [[sqlnode]] in {}", args.id, args.config.display()))?
        .clone();
    if me.poll_idle_cpus {
        tokio::spawn(shoal_proto::idle_poll::while_busy());
    }
    let listen = shoal_proto::config::listen_addr(&me.mysql_addr);
    let socket = me.socket.as_deref().map(|s| shoal_proto::config::path_from_config(&args.config, s));
    let listeners = Listeners::bind(&listen, socket.as_deref()).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    tracing::info!(id = me.id, "connecting to the cluster through mgmd {}", config.mgmd_addrs().join(","));
    let mgmds = config.mgmd_addrs();
    let client = tokio::select! {
        c = shoal_client::Client::connect_with(&mgmds, client_options()) => c.map_err(|e| anyhow::anyhow!("connect to the cluster: {e}"))?,
        _ = term.recv() => return Ok(()),
        _ = int.recv() => return Ok(()),
    };
    let shared = Arc::new(Shared::new(client, me.id));
    // Load the users before the first login needs them (a failure here is retried by it).
    if let Err(e) = shared.users().await {
        tracing::warn!("load the users: {e}");
    }
    let count = shoal_proto::config::worker_threads(me.threads);
    let spin_us = me.spin_us;
    let workers = Workers::start(count, me.spread_after as usize, &shared.client, move || worker_runtime(spin_us))
        .context("start the workers")?;
    let slots = Arc::new(Semaphore::new(server::MAX_CONNECTIONS as usize));
    match &socket {
        Some(s) => tracing::info!(id = me.id, "sql node serving MySQL on {} and {}", me.mysql_addr, s.display()),
        None => tracing::info!(id = me.id, "sql node serving MySQL on {}", me.mysql_addr),
    }
    loop {
        let (stream, peer) = tokio::select! {
            a = listeners.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little, keep serving.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        match slots.clone().try_acquire_owned() {
            Ok(permit) => workers.serve(shared.clone(), stream, peer, permit),
            Err(_) => {
                tokio::spawn(async move {
                    let Ok(stream) = stream.attach() else { return };
                    let _ = server::refuse(stream, &SqlError::new(code::TOO_MANY_CONNECTIONS, "Too many connections"))
                        .await;
                });
            }
        }
    }
    tracing::info!(id = me.id, "sql node stopping");
    Ok(())
}

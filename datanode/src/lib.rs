//! shoal-datanode: partition replicas in memory, synchronous replication inside the node group,
//! key operations and pushed-down scans.

pub mod checkpoint;
pub mod durability;
pub mod gcp;
pub mod index;
pub mod mgmd_link;
pub mod node;
pub mod ops;
pub mod partition;
pub mod redo;
pub mod replication;
pub mod scan;
pub mod service;
pub mod storage;
pub mod sync;
pub mod transport;
pub mod txn;
pub mod unconfirmed;

#[cfg(test)]
mod sim_tests;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use shoal_proto::config::ClusterConfig;
use shoal_proto::pb::data_node_server::DataNodeServer;

/// Largest gRPC message a data node accepts.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Queued failure reports about peers.
const FAILURE_REPORT_QUEUE: usize = 64;

#[derive(Parser, Debug)]
#[command(name = "shoal-datanode", about = "Shoal data node")]
pub struct Args {
    /// This node's id (a [[datanode]] entry of the config).
    #[arg(long)]
    pub id: u32,
    /// Path of cluster.toml.
    #[arg(long)]
    pub config: PathBuf,
    /// Initial node restart: discard this node's checkpoints and redo log (a replaced disk, or
    /// files known bad) and copy everything from the live replicas of its node group.
    #[arg(long)]
    pub initial: bool,
}

pub fn main_entry() {
    let args = Args::parse();
    shoal_proto::logging::init("info", false);
    // A config that cannot be read fails in `run`, with the reason.
    let me = ClusterConfig::load(&args.config).ok().and_then(|c| c.datanode.into_iter().find(|d| d.id == args.id));
    let (threads, spin_us, await_spin_us, poll_idle_cpus) =
        me.map_or((0, 0, 0, false), |d| (d.threads, d.spin_us, d.await_spin_us, d.poll_idle_cpus));
    let workers = shoal_proto::config::worker_threads(threads);
    let builder = shoal_proto::config::runtime_builder(workers);
    let rt = match shoal_proto::spin::build(
        builder,
        shoal_proto::spin::Spinning { after_work_us: spin_us, after_work_gated: true, await_us: await_spin_us },
    ) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shoal-datanode: cannot start runtime: {e}");
            std::process::exit(1);
        }
    };
    if poll_idle_cpus {
        rt.spawn(shoal_proto::idle_poll::while_busy());
    }
    if let Err(e) = rt.block_on(run(args)) {
        tracing::error!("shoal-datanode failed: {e:#}");
        std::process::exit(1);
    }
}

fn incarnation() -> u64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    shoal_proto::hash::fmix64(nanos ^ (u64::from(std::process::id()) << 40)) | 1
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let config = ClusterConfig::load(&args.config).map_err(anyhow::Error::msg)?;
    let me = config
        .datanode
        .iter()
        .find(|d| d.id == args.id)
        .with_context(|| format!("node {} is not a [[datanode]] in {}", args.id, args.config.display()))?
        .clone();
    let c = &config.cluster;
    let timing = node::Timing {
        heartbeat_interval: Duration::from_millis(c.heartbeat_interval_ms),
        lease: Duration::from_millis(c.lease_ms),
        failure_timeout: Duration::from_millis(c.failure_timeout_ms),
        lock_wait: Duration::from_millis(c.lock_wait_timeout_ms),
        txn_inactive: Duration::from_millis(c.transaction_inactive_timeout_ms),
    };
    let budget = storage::MemoryBudget::new(me.data_memory_mb * 1024 * 1024);
    let (report_tx, report_rx) = tokio::sync::mpsc::channel(FAILURE_REPORT_QUEUE);
    let transport = Arc::new(transport::GrpcTransport::default());
    let link = Arc::new(
        mgmd_link::MgmdLink::new(&config.mgmd_addrs(), timing.heartbeat_interval * 3).map_err(anyhow::Error::msg)?,
    );

    // Restore this node's own files up to the global checkpoint mgmd recorded for it, before
    // joining: mgmd starts a node group from disk only with a node that restored the newest.
    let data_dir = shoal_proto::config::path_from_config(&args.config, &me.data_dir);
    if args.initial {
        for sub in ["lcp", "redo"] {
            let d = data_dir.join(sub);
            if d.exists() {
                std::fs::remove_dir_all(&d).with_context(|| format!("--initial: remove {}", d.display()))?;
            }
        }
        tracing::warn!("--initial: discarded this node's checkpoints and redo log; it will copy from its peers");
    }
    let map = mgmd_link::fetch_map_at_start(&link).await;
    let target = map.node(me.id).map_or(0, |n| n.restorable_gci);
    let lcp = (c.lcp_redo_mb, Duration::from_secs(c.lcp_interval_s));
    let (dir, b) = (data_dir.clone(), budget.clone());
    let incarnation = incarnation();
    let progress: Arc<parking_lot::Mutex<String>> = Arc::default();
    // While loading, tell mgmd how far it got (shown by `shoal status`).
    let reporter = tokio::spawn(mgmd_link::report_restore(
        link.clone(),
        (me.id, incarnation, me.addr.clone(), std::process::id()),
        progress.clone(),
    ));
    let p = progress.clone();
    let recovered =
        tokio::task::spawn_blocking(move || durability::Durability::recover(&dir, target, &map, &b, lcp, p)).await;
    reporter.abort();
    let recovered = recovered.context("recovery task")??;
    let setup = node::NodeSetup {
        id: me.id,
        incarnation,
        addr: me.addr.clone(),
        timing: timing.clone(),
        budget,
        durability: recovered.durability,
        txn_limits: txn::TxnLimits {
            max_writes: c.max_txn_operations as usize,
            max_locks: c.max_locks_per_node as usize,
        },
    };
    let node = node::Node::new(setup, report_tx, transport);
    let loaded = recovered.loaded_gci;

    let listen = shoal_proto::config::listen_addr(&me.addr);
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("bind {listen}"))?;
    tracing::info!(id = me.id, incarnation = node.incarnation, "datanode {} listening on {}", me.id, me.addr);
    tokio::spawn(mgmd_link::heartbeat_loop(node.clone(), link.clone(), std::process::id(), loaded));
    tokio::spawn(durability::lcp_loop(node.clone()));
    tokio::spawn(txn::sweeper(node.clone()));
    tokio::spawn(replication::confirm_loop(node.clone()));
    tokio::spawn(mgmd_link::watch_loop(node.clone(), link.clone()));
    tokio::spawn(mgmd_link::report_loop(node.clone(), link.clone(), report_rx));

    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let svc = DataNodeServer::new(service::Service { node: node.clone(), stop })
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut stopped = stop_tx.subscribe();
    let serve = shoal_proto::grpc::server().add_service(svc).serve_with_incoming_shutdown(
        shoal_proto::grpc::incoming(listener, Some(&me.addr)),
        shutdown(node.clone(), link.clone(), stop_tx),
    );
    let drain = shoal_proto::grpc::SERVER_DRAIN;
    tokio::select! {
        r = serve => r.context("serve gRPC")?,
        _ = async {
            let _ = stopped.wait_for(|&s| s).await;
            tokio::time::sleep(drain).await;
        } => tracing::warn!("connections still open {drain:?} after stopping: closing them"),
    }
    tracing::info!("datanode {} stopped", me.id);
    Ok(())
}

/// How long a stopping node waits for its last writes to reach a complete global checkpoint.
const STOP_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// On SIGTERM: refuse new commits, and keep serving (checkpoint calls included) until every
/// commit this node stamped is in a complete global checkpoint, so a clean stop of the whole
/// cluster loses nothing. Then the server stops, after ending the call streams (it waits for
/// every open request, and a peer's stream would stay open until that peer exits).
async fn shutdown(node: Arc<node::Node>, link: Arc<mgmd_link::MgmdLink>, stop: tokio::sync::watch::Sender<bool>) {
    shutdown_signal().await;
    node.durability.close();
    let last = node.durability.clock.current();
    tracing::info!("stopping: new writes refused; waiting for global checkpoint {last}");
    let _ = link.hurry_checkpoint(last).await;
    let deadline = tokio::time::Instant::now() + STOP_FLUSH_TIMEOUT;
    while node.map().gci_complete < last && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if node.map().gci_complete < last {
        tracing::warn!("stopping before global checkpoint {last} completed: the newest writes may be taken back");
    }
    stop.send_replace(true);
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

//! shoal-mgmd: the management daemon. Holds the cluster configuration, catalog, partition map
//! and epoch in a Raft-replicated state machine ([`state`]), detects data node failures, grants
//! leases and serves the cluster map.
//!
//! Layout: [`state`] is the pure model; [`raft`] replicates it (openraft, our own files, gRPC
//! transport); [`leader`] holds what only the leader does (leases, joins, failure detection);
//! [`gcp`] drives global checkpoints across the data nodes; [`service`] is the gRPC edge; [`daemon`] wires them together; [`args`] is the command line.

pub mod args;
pub mod daemon;
pub mod gcp;
pub mod leader;
pub mod raft;
pub mod service;
pub mod state;

use anyhow::Context;
use clap::Parser;

pub use args::{MgmdArgs, MgmdOptions};
pub use daemon::{start, Running};

/// Default log filter (RUST_LOG replaces it). openraft's core logs an ERROR for every peer that
/// misses a leadership confirmation, and the leader confirms every 50 ms to grant leases, so
/// one mgmd down would write ~20 error lines a second; its fatal errors still reach us through
/// `Running::fatal`, which is logged.
pub const DEFAULT_LOG_FILTER: &str = "info,openraft::core::raft_core=off";

/// Worker threads of the mgmd's runtime: it is a small control-plane process.
pub const WORKER_THREADS: usize = 2;

/// Runs the mgmd described by `args` until SIGTERM or SIGINT (then stops cleanly and returns
/// `Ok`) or until Raft fails (returns the error).
pub async fn run(args: MgmdArgs) -> anyhow::Result<()> {
    let opts = args.resolve()?;
    let listen = shoal_proto::config::listen_addr(&opts.addr);
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("bind {listen}"))?;
    let running = start(opts, listener).await?;
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("install SIGTERM handler")?;
    let fatal = tokio::select! {
        _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); None }
        _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: shutting down"); None }
        e = running.fatal() => { tracing::error!("raft stopped: {e}"); Some(e) }
    };
    running.shutdown().await?;
    match fatal {
        Some(e) => anyhow::bail!("raft stopped: {e}"),
        None => Ok(()),
    }
}

/// The `shoal-mgmd` binary: parses the command line, sets up logging (`RUST_LOG`, default
/// `info`) and a two-thread runtime, runs, and exits 0 on a clean shutdown, 1 on error.
pub fn main_entry() {
    let args = MgmdArgs::parse();
    shoal_proto::logging::init(DEFAULT_LOG_FILTER, true);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .thread_name("mgmd")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("shoal-mgmd: build runtime: {e}");
            std::process::exit(1);
        }
    };
    let res = runtime.block_on(run(args));
    // Background tasks (stream forwarders, proposals) must not hold the exit up.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    if let Err(e) = res {
        tracing::error!("mgmd failed: {e:#}");
        std::process::exit(1);
    }
}

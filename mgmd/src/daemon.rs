//! Wiring: data dir, Raft, first-start initialization, leader tasks, the gRPC server, and an
//! orderly shutdown of all of them.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use shoal_proto::pb::mgmd_server::MgmdServer;
use shoal_proto::pb::raft_server::RaftServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::args::MgmdOptions;
use crate::leader::Leader;
use crate::raft::network::MAX_RAFT_MESSAGE_BYTES;
use crate::raft::server::RaftService;
use crate::raft::{self, Consensus, Published};
use crate::service::MgmdService;

/// An exclusive `flock` on `<data_dir>/LOCK`: two mgmds writing one Raft log would corrupt
/// it. The lock goes away with the process, so a crash never leaves a stale lock.
struct DirLock(#[allow(dead_code)] File);

fn lock_dir(dir: &Path) -> anyhow::Result<DirLock> {
    let path = dir.join("LOCK");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    // SAFETY: flock only reads the descriptor, which `f` keeps open for the call.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        bail!("data dir {} is in use by another mgmd ({})", dir.display(), std::io::Error::last_os_error());
    }
    Ok(DirLock(f))
}

/// A running mgmd.
pub struct Running {
    pub consensus: Consensus,
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    _lock: DirLock,
}

/// Starts an mgmd serving on `listener` (bound by the caller, so tests can use ephemeral
/// ports and know every address before any mgmd starts).
pub async fn start(opts: MgmdOptions, listener: TcpListener) -> anyhow::Result<Running> {
    std::fs::create_dir_all(&opts.data_dir).with_context(|| format!("create data dir {}", opts.data_dir.display()))?;
    let lock = lock_dir(&opts.data_dir)?;
    let addr = listener.local_addr().context("read listener address")?;

    let published = Published::new();
    let raft =
        raft::start(opts.id, &opts.config.cluster.name, &opts.data_dir, opts.snapshot_every_logs, published.clone())
            .await?;
    let consensus = Consensus {
        raft: raft.clone(),
        id: opts.id,
        mgmds: Arc::new(opts.config.mgmd.iter().map(|m| (m.id, m.addr.clone())).collect::<BTreeMap<_, _>>()),
        published,
    };

    // First start of the whole cluster: exactly one mgmd (the lowest id) forms it, so two
    // nodes can never initialize different memberships.
    let lowest = opts.config.mgmd.iter().map(|m| m.id).min();
    let initialized = raft.is_initialized().await.context("read raft state")?;
    if !initialized && lowest == Some(opts.id) {
        tracing::info!(members = ?consensus.mgmds, "mgmd {} initializing the raft group", opts.id);
        if let Err(e) = raft.initialize(consensus.members()).await {
            // NotAllowed means someone already did; anything else is worth a line but the
            // cluster can still form through the other mgmds' votes.
            tracing::warn!("initialize raft group: {e}");
        }
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let leader = Leader::new(consensus.clone(), Arc::new(opts.config.clone()));
    let tasks = leader.spawn(shutdown_rx.clone());

    let mgmd = MgmdService::new(consensus.clone(), leader, shutdown_rx.clone());
    let raft_svc = RaftServer::new(RaftService::new(raft))
        .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES);
    let mut stop = shutdown_rx;
    let server = tokio::spawn(
        shoal_proto::grpc::server()
            .add_service(MgmdServer::new(mgmd))
            .add_service(raft_svc)
            .serve_with_incoming_shutdown(shoal_proto::grpc::incoming(listener, None), async move {
                let _ = stop.wait_for(|&s| s).await;
            }),
    );
    tracing::info!("mgmd {} listening on {addr}", opts.id);
    Ok(Running { consensus, addr, shutdown: shutdown_tx, tasks, server, _lock: lock })
}

impl Running {
    /// Resolves when Raft stops on its own (a storage error): the daemon must then exit.
    pub async fn fatal(&self) -> String {
        let mut m = self.consensus.raft.metrics();
        loop {
            if let Err(e) = &m.borrow_and_update().running_state {
                return e.to_string();
            }
            if m.changed().await.is_err() {
                return "raft stopped".into();
            }
        }
    }

    /// Stops serving, then stops Raft. Bounded: a stuck client cannot hold it up.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let id = self.consensus.id;
        let _ = self.shutdown.send(true);
        let mut server = self.server;
        match tokio::time::timeout(shoal_proto::grpc::SERVER_DRAIN, &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!("grpc server ended with: {e}"),
            Ok(Err(e)) => tracing::warn!("grpc server task failed: {e}"),
            Err(_) => {
                tracing::warn!(
                    "grpc server did not drain within {:?}; dropping connections",
                    shoal_proto::grpc::SERVER_DRAIN
                );
                server.abort();
            }
        }
        let res = self.consensus.raft.shutdown().await;
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        res.context("shut down raft")?;
        tracing::info!("mgmd {id} stopped");
        Ok(())
    }
}

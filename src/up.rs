//! `shoal up`: a whole local cluster in the foreground.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use shoal_proto::NodeState;

use crate::local::{ended, reap, Layout, LocalCluster};

/// How long `shoal up` waits for the cluster to accept work.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(clap::Args)]
pub struct UpArgs {
    /// Directory holding the config, logs and every node's data.
    #[arg(long, default_value = "shoal-data")]
    pub dir: PathBuf,
    /// Node groups (a new cluster only).
    #[arg(long, default_value_t = 1)]
    pub node_groups: u32,
    /// Replicas per node group (a new cluster only).
    #[arg(long, default_value_t = 2)]
    pub replicas: u32,
    /// Management daemons: 1 or 3 (a new cluster only).
    #[arg(long, default_value_t = 1)]
    pub mgmds: u32,
    /// SQL nodes speaking the MySQL protocol (a new cluster only).
    #[arg(long, default_value_t = 1)]
    pub sql_nodes: u32,
    /// First port; mgmds use base.., data nodes base+10.., SQL nodes base+30.. (a new cluster only).
    #[arg(long, default_value_t = 7400)]
    pub base_port: u16,
    /// Milliseconds between global checkpoints: what a whole-cluster power loss can take back
    /// in the default durability mode (a new cluster only; `cluster.toml` holds it).
    #[arg(long, default_value_t = 200)]
    pub gcp_interval_ms: u64,
    /// Redo written (MB) that starts a local checkpoint on a data node (a new cluster only).
    #[arg(long, default_value_t = 64)]
    pub lcp_redo_mb: u64,
}

/// Prints a line to stdout, ignoring a closed stdout: `shoal up` whose reader went away
/// (a killed terminal or test harness) must still stop every node rather than panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub fn run(a: UpArgs) -> Result<()> {
    let cluster = if LocalCluster::config_path(&a.dir).exists() {
        let c = LocalCluster::open(&a.dir)?;
        say!("using the existing cluster in {}", a.dir.display());
        c
    } else {
        let layout = Layout {
            node_groups: a.node_groups,
            replicas: a.replicas,
            mgmds: a.mgmds,
            sql_nodes: a.sql_nodes,
            base_port: a.base_port,
            gcp_interval_ms: a.gcp_interval_ms,
            lcp_redo_mb: a.lcp_redo_mb,
        };
        let c = LocalCluster::create(&a.dir, &layout)?;
        say!("created a new cluster in {}", a.dir.display());
        c
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = rt.block_on(supervise(&cluster));
    say!("stopping every node");
    cluster.stop_all(Duration::from_secs(10));
    say!("stopped");
    result
}

async fn supervise(cluster: &LocalCluster) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    for id in cluster.node_ids() {
        match cluster.pid(id) {
            Some(pid) => say!("node {id} is already running (pid {pid}); using it"),
            None => {
                cluster.start(id)?;
            }
        }
    }
    let ready = wait_ready(cluster);
    tokio::pin!(ready);
    tokio::select! {
        r = &mut ready => r?,
        _ = term.recv() => return Ok(()),
        _ = int.recv() => return Ok(()),
    }
    let mgmds: Vec<&str> = cluster.config.mgmd.iter().map(|m| m.addr.as_str()).collect();
    say!(
        "ready: {} data nodes in {} node groups, mgmd {}",
        cluster.config.datanode.len(),
        cluster.config.node_groups(),
        mgmds.join(",")
    );
    for s in &cluster.config.sqlnode {
        let (host, port) = s.mysql_addr.rsplit_once(':').unwrap_or((&s.mysql_addr, "3306"));
        say!("sql node {}: mysql -h {host} -P {port} -u root", s.id);
        if let Some(socket) = &s.socket {
            say!("sql node {}: mysql -S {} -u root", s.id, cluster.socket_path(socket).display());
        }
    }
    if !cluster.config.sqlnode.is_empty() {
        say!("users: root has no password on a fresh cluster; ALTER USER root IDENTIFIED BY '...' sets one (then add -p)");
    }
    say!("status: shoal status --dir {}", cluster.dir.display());
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = tick.tick() => reap(),
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        }
    }
}

async fn wait_ready(cluster: &LocalCluster) -> Result<()> {
    let addrs = cluster.config.mgmd_addrs();
    let start = Instant::now();
    let pool = shoal_client::MgmdPool::new(&addrs, Duration::from_millis(500)).map_err(anyhow::Error::msg)?;
    loop {
        reap();
        for id in cluster.node_ids() {
            // Ended, not merely "not recognised": `start` wrote the pid of a child of ours,
            // which no other process can take before it is reaped (`ended` reports that).
            let how = match cluster.recorded_pid(id) {
                None => Some("no pid file".to_string()),
                Some(pid) => ended(pid).map(|how| format!("pid {pid}, {how}")),
            };
            if let Some(how) = how {
                let log = std::fs::read_dir(cluster.dir.join("logs"))
                    .ok()
                    .and_then(|mut d| {
                        d.find(|e| {
                            e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(&format!("-{id}.log")))
                        })
                    })
                    .and_then(|e| e.ok())
                    .map(|e| e.path());
                let tail = log
                    .as_ref()
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .map(|t| {
                        t.lines().rev().take(10).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
                    })
                    .unwrap_or_default();
                bail!("node {id} exited during start-up ({how}); the end of its log:\n{tail}");
            }
        }
        if let Ok(map) = pool.fetch_newest().await {
            // Up *as the processes we just started*: after a restart the map still shows the
            // previous processes as up until they are replaced or declared down.
            let data_nodes_up = map
                .nodes
                .iter()
                .filter(|n| n.kind == shoal_proto::NodeKind::DataNode)
                .all(|n| n.state == NodeState::Up && cluster.pid(n.id) == Some(n.pid));
            let served = !map.partitions.is_empty() && map.partitions.iter().all(|p| p.primary.is_some());
            let sql_listening = cluster.config.sqlnode.iter().all(|s| {
                s.mysql_addr
                    .parse()
                    .ok()
                    .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok())
            });
            if data_nodes_up && served && sql_listening {
                return Ok(());
            }
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(anyhow::anyhow!("the cluster did not become ready")).context(format!(
                "waited {:?}; see the logs in {}",
                READY_TIMEOUT,
                cluster.dir.join("logs").display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

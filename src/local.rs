//! A local cluster's directory: its config, one pid file and one log file per node, and how
//! node processes are started and signalled.
//!
//! Layout of DIR: `cluster.toml`, `run/<id>.pid`, `logs/<kind>-<id>.log`, and each node's data
//! dir (`mgmd-<id>/`, `datanode-<id>/`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use shoal_proto::config::{ClusterConfig, ClusterSection, DataNodeConfig, MgmdConfig, SqlNodeConfig};

pub const MGMD_BIN: &str = "shoal-mgmd";
pub const DATANODE_BIN: &str = "shoal-datanode";
pub const SQLNODE_BIN: &str = "shoal-sqlnode";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mgmd,
    DataNode,
    SqlNode,
}

impl Kind {
    fn bin(self) -> &'static str {
        match self {
            Kind::Mgmd => MGMD_BIN,
            Kind::DataNode => DATANODE_BIN,
            Kind::SqlNode => SQLNODE_BIN,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Mgmd => "mgmd",
            Kind::DataNode => "datanode",
            Kind::SqlNode => "sqlnode",
        }
    }
}

pub struct LocalCluster {
    pub dir: PathBuf,
    pub config: ClusterConfig,
}

pub struct Layout {
    pub node_groups: u32,
    pub replicas: u32,
    pub mgmds: u32,
    pub sql_nodes: u32,
    pub base_port: u16,
    pub gcp_interval_ms: u64,
    pub lcp_redo_mb: u64,
}

impl LocalCluster {
    pub fn config_path(dir: &Path) -> PathBuf {
        dir.join("cluster.toml")
    }

    /// The full path of a SQL node's configured `socket` (relative to the cluster's directory).
    pub fn socket_path(&self, socket: &str) -> PathBuf {
        shoal_proto::config::path_from_config(&LocalCluster::config_path(&self.dir), socket)
    }

    /// Opens the cluster in `dir`.
    pub fn open(dir: &Path) -> Result<LocalCluster> {
        let path = LocalCluster::config_path(dir);
        let config = ClusterConfig::load(&path).map_err(anyhow::Error::msg)?;
        Ok(LocalCluster { dir: dir.to_path_buf(), config })
    }

    /// Writes a new cluster config for a local cluster on 127.0.0.1.
    pub fn create(dir: &Path, layout: &Layout) -> Result<LocalCluster> {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let port = |offset: u32| -> Result<String> {
            let p = u32::from(layout.base_port) + offset;
            if p > 65535 {
                bail!("--base-port {} leaves no room for every node", layout.base_port);
            }
            Ok(format!("127.0.0.1:{p}"))
        };
        let mut mgmd = vec![];
        for i in 1..=layout.mgmds {
            mgmd.push(MgmdConfig { id: i, addr: port(i - 1)?, data_dir: format!("mgmd-{i}") });
        }
        // Every node of a local cluster shares this machine's cores: each node gets its share,
        // at least one thread (a node with one thread runs a single-threaded runtime, which on
        // 2 cores costs a fifth less CPU per statement or call than two workers that keep
        // waking each other; ARCHITECTURE.md, "Worker threads").
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
        let share = cores / (layout.node_groups * layout.replicas + layout.sql_nodes).max(1);
        let mut datanode = vec![];
        for g in 0..layout.node_groups {
            for r in 0..layout.replicas {
                let k = g * layout.replicas + r;
                let id = 11 + k;
                datanode.push(DataNodeConfig {
                    id,
                    addr: port(10 + k)?,
                    node_group: g,
                    data_dir: format!("datanode-{id}"),
                    data_memory_mb: 1024,
                    threads: share.max(1),
                    spin_us: shoal_proto::config::DEFAULT_DATANODE_SPIN_US,
                    await_spin_us: shoal_proto::config::DEFAULT_AWAIT_SPIN_US,
                    poll_idle_cpus: true,
                });
            }
        }
        let sqlnode = (0..layout.sql_nodes)
            .map(|i| {
                Ok(SqlNodeConfig {
                    id: 51 + i,
                    mysql_addr: port(30 + i)?,
                    // The SQL node's workers past the first serve only when it has many
                    // connections (`spread_after`): then every core may take a share.
                    threads: cores,
                    spread_after: shoal_proto::config::DEFAULT_SPREAD_AFTER,
                    spin_us: shoal_proto::config::DEFAULT_SQL_SPIN_US,
                    socket: socket_in(dir, 51 + i),
                    poll_idle_cpus: true,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let config = ClusterConfig {
            cluster: ClusterSection {
                name: "shoal".into(),
                gcp_interval_ms: layout.gcp_interval_ms,
                lcp_redo_mb: layout.lcp_redo_mb,
                ..ClusterSection::new(layout.replicas, 8)
            },
            mgmd,
            datanode,
            sqlnode,
        };
        config.validate().map_err(anyhow::Error::msg)?;
        let path = LocalCluster::config_path(dir);
        fs::write(&path, config.to_toml()).with_context(|| format!("write {}", path.display()))?;
        Ok(LocalCluster { dir: dir.to_path_buf(), config })
    }

    pub fn kind_of(&self, id: u32) -> Option<Kind> {
        if self.config.mgmd.iter().any(|m| m.id == id) {
            Some(Kind::Mgmd)
        } else if self.config.datanode.iter().any(|d| d.id == id) {
            Some(Kind::DataNode)
        } else if self.config.sqlnode.iter().any(|s| s.id == id) {
            Some(Kind::SqlNode)
        } else {
            None
        }
    }

    pub fn node_ids(&self) -> Vec<u32> {
        let mgmds = self.config.mgmd.iter().map(|m| m.id);
        mgmds.chain(self.config.datanode.iter().map(|d| d.id)).chain(self.config.sqlnode.iter().map(|s| s.id)).collect()
    }

    fn pid_path(&self, id: u32) -> PathBuf {
        self.dir.join("run").join(format!("{id}.pid"))
    }

    /// What the pid file of node `id` says, alive or not.
    pub fn recorded_pid(&self, id: u32) -> Option<u32> {
        fs::read_to_string(self.pid_path(id)).ok()?.trim().parse().ok()
    }

    /// The pid of node `id` if its process is alive.
    pub fn pid(&self, id: u32) -> Option<u32> {
        let pid = self.recorded_pid(id)?;
        if gone_or_zombie(pid).is_some() {
            return None;
        }
        // The pid may have been reused by something else: check it is one of ours. A process
        // in the middle of execve shows an empty command line for a moment (its new memory
        // has no arguments yet) — also just after `start`, whose spawn returns once the exec
        // is past the point of no return — so an empty one is read again before it counts.
        let mut cmdline = vec![];
        for attempt in 0..EXEC_WINDOW_READS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            if !cmdline.is_empty() {
                break;
            }
        }
        let cmdline = String::from_utf8_lossy(&cmdline);
        (cmdline.contains("shoal-") && cmdline.contains(&format!("--id\0{id}\0"))).then_some(pid)
    }

    /// Starts node `id` in the background (its own process group, output appended to its log
    /// file).
    pub fn start(&self, id: u32) -> Result<u32> {
        let kind = self.kind_of(id).with_context(|| format!("no node {id} in this cluster"))?;
        if let Some(pid) = self.pid(id) {
            bail!("node {id} is already running (pid {pid})");
        }
        let bin = sibling_binary(kind.bin())?;
        fs::create_dir_all(self.dir.join("run"))?;
        fs::create_dir_all(self.dir.join("logs"))?;
        let log_path = self.dir.join("logs").join(format!("{}-{id}.log", kind.name()));
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--id")
            .arg(id.to_string())
            .arg("--config")
            .arg(LocalCluster::config_path(&self.dir))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // A node must not die with the terminal's Ctrl-C or hang-up, which go to the foreground
        // process group: `shoal up` and `shoal node stop` signal it through its pid file. Its own
        // process group, not its own session: with the kernel's autogroup scheduling each
        // session is a CPU group of its own, and a node alone in an idle group waited up to 2.4 s
        // for a CPU while another session kept both cores busy (measured with `perf sched
        // timehist`) — long enough to miss heartbeats and be declared down.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::setpgid(0, 0);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("start {}", bin.display()))?;
        let pid = child.id();
        // A note about an earlier child that had this pid is not about this one.
        EXITS.lock().unwrap_or_else(|e| e.into_inner()).retain(|&(p, _)| p as u32 != pid);
        fs::write(self.pid_path(id), pid.to_string())?;
        // The child is reaped by whoever waits for it; we only keep its pid.
        std::mem::forget(child);
        Ok(pid)
    }

    /// Sends `signal` to node `id`; with `wait`, waits (bounded) for it to exit.
    pub fn signal(&self, id: u32, signal: i32, wait: Duration) -> Result<bool> {
        let Some(pid) = self.pid(id) else { return Ok(false) };
        // SAFETY: kill(2) with a pid we verified belongs to this cluster's node.
        if unsafe { libc::kill(pid as i32, signal) } != 0 {
            bail!("signal node {id} (pid {pid}): {}", std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            reap();
            if self.pid(id).is_none() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(self.pid(id).is_none())
    }

    /// Stops every node: SIGTERM, then SIGKILL for any still running after `grace`.
    pub fn stop_all(&self, grace: Duration) {
        // SQL nodes and data nodes first: a stopping data node waits until its last writes are
        // in a complete global checkpoint, which needs mgmd; mgmd goes last.
        let mut first: Vec<u32> = self.config.sqlnode.iter().map(|s| s.id).collect();
        first.extend(self.config.datanode.iter().map(|d| d.id));
        let last: Vec<u32> = self.config.mgmd.iter().map(|m| m.id).collect();
        let deadline = Instant::now() + grace;
        for ids in [&first, &last] {
            for &id in ids {
                let _ = self.signal(id, libc::SIGTERM, Duration::ZERO);
            }
            while Instant::now() < deadline && ids.iter().any(|&id| self.pid(id).is_some()) {
                reap();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for &id in first.iter().chain(&last) {
            let _ = self.signal(id, libc::SIGKILL, Duration::from_secs(2));
        }
    }
}

/// How the last children [`reap`] collected ended (pid, wait status), newest last; bounded.
static EXITS: std::sync::Mutex<Vec<(i32, i32)>> = std::sync::Mutex::new(Vec::new());
const EXITS_KEPT: usize = 64;

/// Collects exited children so their pids do not linger as zombies, and notes how each ended
/// ([`ended`]).
pub fn reap() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with WNOHANG on any child, writing only to our local `status`.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if r <= 0 {
            break;
        }
        let mut exits = EXITS.lock().unwrap_or_else(|e| e.into_inner());
        if exits.len() >= EXITS_KEPT {
            exits.remove(0);
        }
        exits.push((r, status));
    }
}

/// How many times [`LocalCluster::pid`] reads an empty command line, 1 ms apart, before it
/// takes the process for something other than a node.
const EXEC_WINDOW_READS: u32 = 20;

/// How process `pid` ended, if it did: "exit code N" or "killed by signal N" when [`reap`]
/// collected it (a child of this process: no other process can have its pid before then, and
/// `start` forgets the note when a new child gets the pid), else whether it is a zombie or gone.
pub fn ended(pid: u32) -> Option<String> {
    {
        let exits = EXITS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, status)) = exits.iter().rev().find(|&&(p, _)| p as u32 == pid) {
            return Some(if libc::WIFSIGNALED(status) {
                format!("killed by signal {}", libc::WTERMSIG(status))
            } else {
                format!("exit code {}", libc::WEXITSTATUS(status))
            });
        }
    }
    gone_or_zombie(pid)
}

/// "no such process" or "a zombie" when that is what `pid` is, else None.
fn gone_or_zombie(pid: u32) -> Option<String> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => Some("no such process".into()),
        Ok(stat) if stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')) => {
            Some("a zombie".into())
        }
        Ok(_) => None,
    }
}

/// The path of another Shoal binary installed next to this one.
pub fn sibling_binary(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("find the shoal binary")?;
    let dir = me.parent().context("the shoal binary has no directory")?;
    let candidates = [dir.join(name), dir.join("..").join(name)];
    for c in &candidates {
        if c.is_file() {
            return Ok(c.clone());
        }
    }
    bail!("{name} not found next to {} (build the workspace: cargo build)", me.display())
}

/// SQL node `id`'s Unix socket in `dir` (relative to it), or None where its full path would not
/// fit a socket address (108 bytes on Linux): the node then listens on TCP alone.
fn socket_in(dir: &Path, id: u32) -> Option<String> {
    let name = format!("sqlnode-{id}.sock");
    (shoal_proto::config::path_in(dir, &name).as_os_str().len() < 100).then_some(name)
}

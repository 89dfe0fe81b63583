//! The cluster configuration file (`cluster.toml`), NDB's config.ini counterpart. Every process
//! reads the same file; `shoal up` writes one for a local cluster.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::types::NodeId;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub cluster: ClusterSection,
    #[serde(default)]
    pub mgmd: Vec<MgmdConfig>,
    #[serde(default)]
    pub datanode: Vec<DataNodeConfig>,
    #[serde(default)]
    pub sqlnode: Vec<SqlNodeConfig>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    #[serde(default = "default_name")]
    pub name: String,
    /// Replicas per node group (1–4).
    pub replicas: u32,
    /// Partitions per table = node groups × this.
    #[serde(default = "default_partitions_per_node_group")]
    pub partitions_per_node_group: u32,
    /// How often data nodes heartbeat mgmd.
    #[serde(default = "default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u64,
    /// How long a data node may act as primary after sending a heartbeat that mgmd answered.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// mgmd declares a data node dead this long after its last heartbeat. Must exceed
    /// `lease_ms` plus the leader-confirmation window, so a node is always fenced by its own
    /// lease before anyone else is promoted.
    #[serde(default = "default_failure_timeout_ms")]
    pub failure_timeout_ms: u64,
    /// How often mgmd runs a global checkpoint (DESIGN §2): the most a whole-cluster power
    /// loss can take back in the default durability mode, and how long a `sync` write waits
    /// at most for its checkpoint to start.
    #[serde(default = "default_gcp_interval_ms")]
    pub gcp_interval_ms: u64,
    /// A data node starts a local checkpoint once this much redo was written since its last
    /// one (it also checkpoints after `lcp_interval_s` if anything changed).
    #[serde(default = "default_lcp_redo_mb")]
    pub lcp_redo_mb: u64,
    #[serde(default = "default_lcp_interval_s")]
    pub lcp_interval_s: u64,
    /// How long a transaction waits for a row lock before LOCK_WAIT_TIMEOUT (this also breaks
    /// deadlocks).
    #[serde(default = "default_lock_wait_timeout_ms")]
    pub lock_wait_timeout_ms: u64,
    /// A transaction idle this long (not committing) is rolled back and its locks freed.
    #[serde(default = "default_transaction_inactive_timeout_ms")]
    pub transaction_inactive_timeout_ms: u64,
    /// Most rows one transaction may write on one data node.
    #[serde(default = "default_max_txn_operations")]
    pub max_txn_operations: u64,
    /// Most row locks transactions may hold on one data node.
    #[serde(default = "default_max_locks_per_node")]
    pub max_locks_per_node: u64,
}

impl ClusterSection {
    /// A section with `replicas` and `partitions_per_node_group` and every other setting at
    /// its default (the values a config file that leaves them out gets).
    pub fn new(replicas: u32, partitions_per_node_group: u32) -> ClusterSection {
        ClusterSection {
            name: default_name(),
            replicas,
            partitions_per_node_group,
            heartbeat_interval_ms: default_heartbeat_interval_ms(),
            lease_ms: default_lease_ms(),
            failure_timeout_ms: default_failure_timeout_ms(),
            gcp_interval_ms: default_gcp_interval_ms(),
            lcp_redo_mb: default_lcp_redo_mb(),
            lcp_interval_s: default_lcp_interval_s(),
            lock_wait_timeout_ms: default_lock_wait_timeout_ms(),
            transaction_inactive_timeout_ms: default_transaction_inactive_timeout_ms(),
            max_txn_operations: default_max_txn_operations(),
            max_locks_per_node: default_max_locks_per_node(),
        }
    }
}

fn default_name() -> String {
    "shoal".into()
}
fn default_partitions_per_node_group() -> u32 {
    8
}
fn default_heartbeat_interval_ms() -> u64 {
    100
}
fn default_lease_ms() -> u64 {
    600
}
fn default_failure_timeout_ms() -> u64 {
    1000
}

fn default_lock_wait_timeout_ms() -> u64 {
    1000
}
fn default_transaction_inactive_timeout_ms() -> u64 {
    5000
}
fn default_max_txn_operations() -> u64 {
    10_000
}
fn default_max_locks_per_node() -> u64 {
    200_000
}
fn default_gcp_interval_ms() -> u64 {
    200
}
fn default_lcp_redo_mb() -> u64 {
    64
}
fn default_lcp_interval_s() -> u64 {
    300
}

/// How long an mgmd leader's confirmation by a Raft quorum stays good for granting leases.
pub const LEADER_CONFIRM_WINDOW_MS: u64 = 200;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MgmdConfig {
    pub id: NodeId,
    /// host:port of its gRPC endpoint.
    pub addr: String,
    pub data_dir: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataNodeConfig {
    pub id: NodeId,
    pub addr: String,
    pub node_group: u32,
    pub data_dir: String,
    /// Memory for rows and keys; a full node answers TABLE_FULL.
    #[serde(default = "default_data_memory_mb")]
    pub data_memory_mb: u64,
    /// Worker threads of the node's runtime (0: one per CPU core). See [`worker_threads`].
    #[serde(default)]
    pub threads: u32,
    /// Microseconds the node keeps polling its sockets after its last work before it sleeps,
    /// where that brings it more work or the machine's CPUs are not contended (0: never); see
    /// `crate::spin`.
    #[serde(default = "default_datanode_spin_us")]
    pub spin_us: u32,
    /// Microseconds the node keeps polling its sockets, without a message, while it awaits a
    /// peer's answer and the machine's CPUs are not contended (0: never); see `crate::spin`.
    #[serde(default = "default_await_spin_us")]
    pub await_spin_us: u32,
    /// While the node is busy, ask Linux to keep idle CPUs polling instead of halting (a CPU
    /// latency request of 0 µs; needs write access to `/dev/cpu_dma_latency`); see
    /// `crate::idle_poll`.
    #[serde(default = "yes")]
    pub poll_idle_cpus: bool,
}

/// A stateless SQL node: MySQL protocol in front of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlNodeConfig {
    pub id: NodeId,
    /// host:port where it speaks the MySQL protocol.
    pub mysql_addr: String,
    /// Workers: single-threaded runtimes, each on its own thread with its own connections to
    /// the data nodes (0: one per CPU core). The first serves every connection until it serves
    /// `spread_after`; see the SQL node's `workers` module.
    #[serde(default)]
    pub threads: u32,
    /// Connections the first worker serves alone before new ones go to the least busy worker.
    #[serde(default = "default_spread_after")]
    pub spread_after: u32,
    /// Microseconds the node keeps polling its sockets after its last work before it sleeps
    /// (0: never spin); see `crate::spin`.
    #[serde(default = "default_sql_spin_us")]
    pub spin_us: u32,
    /// A Unix socket where it also speaks the MySQL protocol (MySQL's `--socket`), for clients
    /// on the same machine; relative to the config file's directory. None: TCP only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// As a data node's `poll_idle_cpus`.
    #[serde(default = "yes")]
    pub poll_idle_cpus: bool,
}

/// The SQL node's default spin: with it, on 2 cores, sysbench ran 40–55% more point selects
/// with one thread, and `oltp_read_write` with 16 threads 2% more transactions by the median
/// of five alternated rounds (0–11% per round; benchmarks.md, "Twenty-third session"). Gated
/// where the CPUs are contended (`crate::spin`).
pub const DEFAULT_SQL_SPIN_US: u32 = 30;

fn default_sql_spin_us() -> u32 {
    DEFAULT_SQL_SPIN_US
}

/// The default of [`SqlNodeConfig::spread_after`]. On 2 cores with two workers, sysbench point
/// selects at 1024 threads ran 1.4–2.1 times what one worker ran, and at 16 threads (all on the
/// first worker) as many; splitting 16 connections 8/8 over the two gained nothing over one
/// worker serving all 16 (benchmarks.md, "Thirty-third session").
pub const DEFAULT_SPREAD_AFTER: u32 = 64;

fn default_spread_after() -> u32 {
    DEFAULT_SPREAD_AFTER
}

/// The data node's default spin after its work: with it, on 2 cores, one client's key-value
/// writes ran 2.4 times as fast and one sysbench thread's point selects 2.3 times; 16 threads'
/// point selects ran even (benchmarks.md, "Twenty-ninth session").
pub const DEFAULT_DATANODE_SPIN_US: u32 = 100;

fn default_datanode_spin_us() -> u32 {
    DEFAULT_DATANODE_SPIN_US
}

/// The data node's default spin while it awaits a peer: with it, on 2 cores, key-value writes
/// ran 20–45% faster at 1, 16 and 64 clients; 30 µs gave one client nothing (a backup's
/// wake-up took longer), 200 µs no more than 100 (benchmarks.md, "Twenty-eighth session").
pub const DEFAULT_AWAIT_SPIN_US: u32 = 100;

fn default_await_spin_us() -> u32 {
    DEFAULT_AWAIT_SPIN_US
}

fn yes() -> bool {
    true
}

fn default_data_memory_mb() -> u64 {
    1024
}

/// The worker threads a node runs with `threads` configured: that many, or one per CPU core for
/// 0. Nodes that share a machine do better with fewer: a data node's work per call is small, and
/// with more threads than its share of the cores, handing calls between its threads (a futex
/// wake-up each) cost more than the calls themselves (benchmarks.md, "worker threads").
pub fn worker_threads(threads: u32) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n as usize,
    }
}

/// The runtime for `workers` threads: with one, tokio's single-threaded runtime (every task
/// polled on the thread that blocks on it, no sibling worker to wake for each ready socket:
/// on 2 cores a fifth less CPU per call than two workers; ARCHITECTURE.md, "Worker threads");
/// otherwise the multi-threaded one with that many workers.
pub fn runtime_builder(workers: usize) -> tokio::runtime::Builder {
    if workers <= 1 {
        return tokio::runtime::Builder::new_current_thread();
    }
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.worker_threads(workers);
    b
}

/// Environment variable naming the host a node listens on instead of the host of its configured
/// address (the port stays). The configured `addr`/`mysql_addr` is what peers and clients dial —
/// in a container, its hostname; the container sets `SHOAL_LISTEN_HOST=0.0.0.0` so the socket
/// accepts on whatever address the container has, also after a network reconnect changed it.
pub const LISTEN_HOST_ENV: &str = "SHOAL_LISTEN_HOST";

/// The address a node binds for its configured address `addr`: `addr` itself, or its port on
/// the host named by `$SHOAL_LISTEN_HOST` when that is set.
pub fn listen_addr(addr: &str) -> String {
    listen_addr_on(addr, std::env::var(LISTEN_HOST_ENV).ok().as_deref())
}

fn listen_addr_on(addr: &str, host: Option<&str>) -> String {
    let host = host.map(str::trim).filter(|h| !h.is_empty());
    match (host, addr.rsplit_once(':')) {
        // A bare IPv6 host needs brackets in front of a port.
        (Some(h), Some((_, port))) if h.contains(':') && !h.starts_with('[') => format!("[{h}]:{port}"),
        (Some(h), Some((_, port))) => format!("{h}:{port}"),
        _ => addr.to_string(),
    }
}

/// A path from the config file at `config`: relative ones are relative to the file's directory.
pub fn path_from_config(config: &Path, path: &str) -> PathBuf {
    path_in(config.parent().unwrap_or(Path::new(".")), path)
}

/// `path` taken from `dir` when relative, made absolute so that logs and errors name files
/// unambiguously whatever the working directory.
pub fn path_in(dir: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    let full = if p.is_absolute() { p.to_path_buf() } else { dir.join(p) };
    std::path::absolute(&full).unwrap_or(full)
}

impl ClusterConfig {
    pub fn load(path: &Path) -> Result<ClusterConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let cfg: ClusterConfig = toml::from_str(&text).map_err(|e| format!("parse {}: {e}", path.display()))?;
        cfg.validate().map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(cfg)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    pub fn node_groups(&self) -> u32 {
        self.datanode.iter().map(|d| d.node_group + 1).max().unwrap_or(0)
    }

    pub fn partition_count(&self) -> u32 {
        self.node_groups() * self.cluster.partitions_per_node_group
    }

    pub fn mgmd_addrs(&self) -> Vec<String> {
        self.mgmd.iter().map(|m| m.addr.clone()).collect()
    }

    pub fn validate(&self) -> Result<(), String> {
        let c = &self.cluster;
        if !(1..=4).contains(&c.replicas) {
            return Err(format!("replicas must be 1..=4, not {}", c.replicas));
        }
        if !(1..=256).contains(&c.partitions_per_node_group) {
            return Err("partitions_per_node_group must be 1..=256".into());
        }
        if c.heartbeat_interval_ms == 0 || c.lease_ms < 2 * c.heartbeat_interval_ms {
            return Err("lease_ms must be at least two heartbeat intervals".into());
        }
        if c.failure_timeout_ms <= c.lease_ms + LEADER_CONFIRM_WINDOW_MS {
            return Err(format!(
                "failure_timeout_ms must exceed lease_ms + {LEADER_CONFIRM_WINDOW_MS} so a cut-off primary fences itself before a backup is promoted"
            ));
        }
        if !(10..=60_000).contains(&c.gcp_interval_ms) {
            return Err("gcp_interval_ms must be 10..=60000".into());
        }
        if c.lock_wait_timeout_ms == 0 || c.transaction_inactive_timeout_ms < c.lock_wait_timeout_ms {
            return Err(
                "lock_wait_timeout_ms must be positive and transaction_inactive_timeout_ms at least as long".into()
            );
        }
        if c.max_txn_operations == 0 || c.max_locks_per_node == 0 {
            return Err("max_txn_operations and max_locks_per_node must be positive".into());
        }
        if c.lcp_redo_mb == 0 || c.lcp_interval_s == 0 {
            return Err("lcp_redo_mb and lcp_interval_s must be positive".into());
        }
        if self.mgmd.is_empty() || self.mgmd.len() == 2 || self.mgmd.len() > 5 {
            return Err("there must be 1, 3 or 5 mgmd nodes".into());
        }
        if self.datanode.is_empty() {
            return Err("there must be at least one data node".into());
        }
        let mut ids: Vec<NodeId> = self
            .mgmd
            .iter()
            .map(|m| m.id)
            .chain(self.datanode.iter().map(|d| d.id))
            .chain(self.sqlnode.iter().map(|s| s.id))
            .collect();
        if ids.contains(&0) {
            return Err("node id 0 is reserved".into());
        }
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err("node ids must be unique".into());
        }
        for g in 0..self.node_groups() {
            let n = self.datanode.iter().filter(|d| d.node_group == g).count() as u32;
            if n != c.replicas {
                return Err(format!("node group {g} has {n} data nodes; every group needs exactly {}", c.replicas));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_nodes_spin_unless_told_otherwise() {
        let entry: SqlNodeConfig = toml::from_str("id = 51\nmysql_addr = \"127.0.0.1:3306\"").unwrap();
        assert_eq!((entry.spin_us, entry.spread_after), (DEFAULT_SQL_SPIN_US, DEFAULT_SPREAD_AFTER));
        let off: SqlNodeConfig = toml::from_str("id = 51\nmysql_addr = \"127.0.0.1:3306\"\nspin_us = 0").unwrap();
        assert_eq!(off.spin_us, 0);
    }

    #[test]
    fn data_nodes_spin_unless_told_otherwise() {
        let base = "id = 11\naddr = \"127.0.0.1:7410\"\nnode_group = 0\ndata_dir = \"d\"";
        let entry: DataNodeConfig = toml::from_str(base).unwrap();
        assert_eq!((entry.spin_us, entry.await_spin_us), (DEFAULT_DATANODE_SPIN_US, DEFAULT_AWAIT_SPIN_US));
        let off: DataNodeConfig = toml::from_str(&format!("{base}\nspin_us = 0\nawait_spin_us = 0")).unwrap();
        assert_eq!((off.spin_us, off.await_spin_us), (0, 0));
    }

    #[test]
    fn listen_host_replaces_only_the_host() {
        assert_eq!(listen_addr_on("datanode1:7410", None), "datanode1:7410");
        assert_eq!(listen_addr_on("datanode1:7410", Some(" ")), "datanode1:7410");
        assert_eq!(listen_addr_on("datanode1:7410", Some("0.0.0.0")), "0.0.0.0:7410");
        assert_eq!(listen_addr_on("[::1]:3306", Some("::")), "[::]:3306");
        assert_eq!(listen_addr_on("sql:3306", Some("[::]")), "[::]:3306");
    }
}

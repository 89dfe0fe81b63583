//! Command line of `shoal-mgmd`, and how it resolves into the daemon's options.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use shoal_proto::config::ClusterConfig;
use shoal_proto::NodeId;

use crate::raft::SNAPSHOT_EVERY_LOGS;

#[derive(clap::Parser, Clone, Debug)]
#[command(name = "shoal-mgmd", version, about = "Shoal management daemon")]
pub struct MgmdArgs {
    /// This mgmd's node id; the config must have an [[mgmd]] entry with it.
    #[arg(long)]
    pub id: NodeId,
    /// The cluster config file (TOML). Relative data dirs in it are relative to its directory.
    #[arg(long)]
    pub config: PathBuf,
}

/// Everything the daemon needs to start, resolved from the arguments.
#[derive(Clone, Debug)]
pub struct MgmdOptions {
    pub id: NodeId,
    pub config: ClusterConfig,
    /// host:port to serve gRPC on.
    pub addr: String,
    pub data_dir: PathBuf,
    /// Raft snapshot interval in log entries (tests lower it to exercise snapshots).
    pub snapshot_every_logs: u64,
}

impl MgmdOptions {
    /// Options for mgmd `id` of `config`, whose file lives in `config_dir`.
    pub fn new(id: NodeId, config: ClusterConfig, config_dir: &Path) -> anyhow::Result<MgmdOptions> {
        let me = config
            .mgmd
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| anyhow!("the config has no [[mgmd]] with id {id}"))?;
        let dir = Path::new(&me.data_dir);
        let data_dir = if dir.is_absolute() { dir.to_path_buf() } else { config_dir.join(dir) };
        Ok(MgmdOptions { id, addr: me.addr.clone(), data_dir, config, snapshot_every_logs: SNAPSHOT_EVERY_LOGS })
    }
}

impl MgmdArgs {
    pub fn resolve(&self) -> anyhow::Result<MgmdOptions> {
        let config = ClusterConfig::load(&self.config).map_err(|e| anyhow!(e)).context("load cluster config")?;
        let config_dir = match self.config.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        MgmdOptions::new(self.id, config, &config_dir)
    }
}

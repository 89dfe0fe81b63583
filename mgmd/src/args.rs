//! Command line of `shoal-mgmd`, and how it resolves into the daemon's options.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use shoal_proto::config::ClusterConfig;
use shoal_proto::NodeId;

use crate::raft::SNAPSHOT_EVERY_LOGS;

#[derive(clap::Parser, Clone, Debug)]
#[command(name = "shoal-mgmd", version, about = "Shoal management daemon")]
pub struct MgmdArgs {
    /// This mgmd's node id; the config must have an `[[mgmd]]` entry with it.
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
        let data_dir = shoal_proto::config::path_in(config_dir, &me.data_dir);
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    const CONFIG: &str = r#"
[cluster]
replicas = 1

[[mgmd]]
id = 1
addr = "127.0.0.1:1"
data_dir = "m1"

[[mgmd]]
id = 2
addr = "127.0.0.1:2"
data_dir = "/abs/m2"

[[mgmd]]
id = 3
addr = "127.0.0.1:3"
data_dir = "m3"

[[datanode]]
id = 11
addr = "127.0.0.1:11"
node_group = 0
data_dir = "d11"
"#;

    #[test]
    fn data_dirs_resolve_against_the_config_file() {
        let dir = shoal_proto::file::test_dir::TestDir::new("args");
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, CONFIG).unwrap();
        let args = MgmdArgs::parse_from(["shoal-mgmd", "--id", "1", "--config", path.to_str().unwrap()]);
        let opts = args.resolve().unwrap();
        assert_eq!(opts.data_dir, dir.path().join("m1"));
        assert_eq!(opts.addr, "127.0.0.1:1");
        let opts = MgmdArgs { id: 2, config: path.clone() }.resolve().unwrap();
        assert_eq!(opts.data_dir, PathBuf::from("/abs/m2"));
        let e = MgmdArgs { id: 7, config: path }.resolve().unwrap_err();
        assert!(e.to_string().contains("id 7"), "{e}");
        assert!(MgmdArgs::try_parse_from(["shoal-mgmd", "--id", "x", "--config", "c"]).is_err());
    }
}

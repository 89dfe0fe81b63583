//! `shoal status`: the cluster as mgmd sees it, for people (a table) or programs (`--json`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::{json, Value as Json};
use shoal_proto::pb;
use shoal_proto::{ClusterState, NodeKind};

use crate::local::LocalCluster;

/// Prints a line. A closed pipe (`shoal status | head`) ends the program quietly, as other Unix
/// tools do; SIGPIPE itself stays ignored, or a gRPC socket whose peer died would kill the CLI.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

#[derive(clap::Args)]
pub struct StatusArgs {
    #[arg(long, default_value = "shoal-data")]
    pub dir: PathBuf,
    /// Ask these mgmds instead of the ones in DIR/cluster.toml.
    #[arg(long)]
    pub mgmd: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

pub async fn run(a: StatusArgs) -> Result<()> {
    let local = LocalCluster::open(&a.dir).ok();
    let addrs = if !a.mgmd.is_empty() {
        a.mgmd.clone()
    } else if let Some(l) = &local {
        l.config.mgmd_addrs()
    } else {
        bail!("no cluster in {} and no --mgmd given", a.dir.display());
    };
    // Ask every mgmd on its own: whether it answers is its state.
    let mut answers: Vec<(String, Option<pb::StatusResponse>)> = vec![];
    for addr in &addrs {
        let pool = shoal_client::MgmdPool::new(std::slice::from_ref(addr), Duration::from_millis(800))
            .map_err(anyhow::Error::msg)?;
        answers.push((addr.clone(), pool.status().await.ok()));
    }
    let best = answers
        .iter()
        .filter_map(|(_, r)| r.as_ref())
        .max_by_key(|r| (r.mgmds.iter().any(|m| m.leader), r.state.as_ref().map_or(0, |s| s.epoch)));
    let Some(best) = best else { bail!("no mgmd answered ({})", addrs.join(", ")) };
    let state = ClusterState::try_from(best.state.clone().unwrap_or_default()).map_err(anyhow::Error::msg)?;
    let doc = to_json(&state, best, &answers, local.as_ref());
    if a.json {
        out!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_table(&doc);
    }
    Ok(())
}

fn to_json(
    state: &ClusterState,
    best: &pb::StatusResponse,
    answers: &[(String, Option<pb::StatusResponse>)],
    local: Option<&LocalCluster>,
) -> Json {
    let mut nodes = vec![];
    for n in &state.nodes {
        let local_pid = local.and_then(|l| l.pid(n.id));
        let mut o = json!({
            "id": n.id,
            "kind": n.kind.name(),
            "addr": n.addr,
        });
        match n.kind {
            NodeKind::Mgmd => {
                let answer = answers.iter().find(|(a, _)| *a == n.addr).and_then(|(_, r)| r.as_ref());
                let me = answer.and_then(|r| r.mgmds.iter().find(|m| m.id == n.id));
                o["state"] = json!(if answer.is_some() { "up" } else { "down" });
                o["pid"] = json!(local_pid);
                o["leader"] = json!(state.leader_id == n.id);
                if let Some(m) = me {
                    o["raft_term"] = json!(m.raft_term);
                    o["last_applied"] = json!(m.last_applied);
                }
            }
            _ => {
                o["state"] = json!(n.state.name());
                // A down node's last reported pid is history, not a process.
                let reported = (n.pid != 0 && n.state != shoal_proto::NodeState::Down).then_some(n.pid);
                o["pid"] = json!(local_pid.or(reported));
                o["node_group"] = json!(n.node_group);
                let primaries = state.partitions.iter().filter(|p| p.primary == Some(n.id)).count();
                o["primaries"] = json!(primaries);
                o["restorable_gci"] = json!(n.restorable_gci);
                if let Some(p) = best.progress.iter().find(|p| p.node_id == n.id) {
                    o["progress"] = json!(p.progress);
                }
            }
        }
        nodes.push(o);
    }
    // SQL nodes are stateless and not in mgmd's model: a local cluster knows them from its config.
    for sql in local.map(|l| l.config.sqlnode.as_slice()).unwrap_or_default() {
        let pid = local.and_then(|l| l.pid(sql.id));
        let listening = sql
            .mysql_addr
            .parse()
            .ok()
            .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_millis(300)).is_ok());
        let mut o = json!({
            "id": sql.id,
            "kind": NodeKind::SqlNode.name(),
            "addr": sql.mysql_addr,
            "mysql": sql.mysql_addr,
            "pid": pid,
            "state": if pid.is_some() && listening { "up" } else if pid.is_some() { "starting" } else { "down" },
        });
        if let (Some(l), Some(socket)) = (local, &sql.socket) {
            o["socket"] = json!(l.socket_path(socket));
        }
        nodes.push(o);
    }
    json!({
        "epoch": state.epoch,
        "gci_complete": state.gci_complete,
        "leader": state.leader_id,
        "nodes": nodes,
        "tables": state.tables.iter().map(|t| json!({
            "id": t.id,
            "name": t.spec.name,
            "columns": t.visible_columns(),
            "partitions": t.partition_count,
            "hidden_pk": t.hidden_pk,
        })).collect::<Vec<_>>(),
        "partitions": state.partitions.iter().map(|p| json!({
            "partition": p.partition,
            "node_group": p.node_group,
            "primary": p.primary,
            "primary_term": p.primary_term,
            "replicas": p.replicas.iter().map(|r| json!({"node": r.node_id, "syncing": r.syncing()})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn print_table(doc: &Json) {
    out!("epoch {}  mgmd leader {}  gci_complete {}", doc["epoch"], doc["leader"], doc["gci_complete"]);
    out!("{:<5} {:<9} {:<22} {:<9} {:<8} {:<6} detail", "id", "kind", "addr", "state", "pid", "group");
    for n in doc["nodes"].as_array().into_iter().flatten() {
        let detail = if n["kind"] == "mgmd" {
            if n["leader"] == true {
                "raft leader".to_string()
            } else {
                String::new()
            }
        } else if n["kind"] == "sqlnode" {
            match n["mysql"].as_str() {
                Some(m) => format!("mysql {m}"),
                None => String::new(),
            }
        } else {
            match n["progress"].as_str() {
                Some(p) => format!("{p}; restorable gci {}", n["restorable_gci"]),
                None => format!("primary of {} partitions, restorable gci {}", n["primaries"], n["restorable_gci"]),
            }
        };
        out!(
            "{:<5} {:<9} {:<22} {:<9} {:<8} {:<6} {}",
            n["id"].to_string(),
            n["kind"].as_str().unwrap_or(""),
            n["addr"].as_str().unwrap_or(""),
            n["state"].as_str().unwrap_or(""),
            n["pid"].as_u64().map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            n["node_group"].as_u64().map(|g| g.to_string()).unwrap_or_else(|| "-".into()),
            detail
        );
    }
    let tables = doc["tables"].as_array().map_or(0, |t| t.len());
    out!("{tables} tables, {} partitions", doc["partitions"].as_array().map_or(0, |p| p.len()));
}

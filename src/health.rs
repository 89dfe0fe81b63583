//! `shoal health`: is node N of a cluster config really serving? Exit status 0 when it is, 1 with
//! the reason on stderr when it is not. Made for container health checks (docker compose's
//! `healthcheck`, which shows the output in `docker inspect`), so it answers within `--timeout-ms`
//! whatever the network does.
//!
//! - mgmd: it answers `Status`, it knows a Raft leader, and that leader answers as leader.
//! - data node: the mgmd leader's map has the node `up` (joined and caught up, so it serves its
//!   partitions), and the node accepts connections on its address.
//! - SQL node: a MySQL login as `root` with the empty password on its `mysql_addr`, then
//!   COM_PING answered with OK; once root has a password, the login's 1045 counts too (the node
//!   checked it against the user table it loaded from the cluster). The SQL node accepts connections only once it has connected to
//!   the cluster, so a greeting alone already says more than "the port is open".

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use shoal_proto::config::ClusterConfig;
use shoal_proto::pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(clap::Args)]
pub struct HealthArgs {
    /// The cluster config file the node runs with.
    #[arg(long)]
    pub config: PathBuf,
    /// The node to check.
    #[arg(long)]
    pub id: u32,
    /// Give up (unhealthy) after this long.
    #[arg(long, default_value_t = 3000)]
    pub timeout_ms: u64,
}

/// Longest MySQL packet the check reads (a greeting or an OK/ERR is far smaller).
const MAX_HEALTH_PACKET_BYTES: usize = 64 * 1024;
/// mysql_native_password is what the SQL node announces and accepts.
const NATIVE_PASSWORD: &[u8] = b"mysql_native_password";
/// MySQL's ER_ACCESS_DENIED_ERROR.
const ACCESS_DENIED: u16 = 1045;

pub async fn run(a: HealthArgs) -> Result<()> {
    let config = ClusterConfig::load(&a.config).map_err(anyhow::Error::msg)?;
    let timeout = Duration::from_millis(a.timeout_ms);
    let check = check(&config, a.id, timeout);
    let verdict = match tokio::time::timeout(timeout, check).await {
        Ok(r) => r,
        Err(_) => Err(anyhow!("no answer within {} ms", a.timeout_ms)),
    };
    match verdict {
        Ok(what) => {
            println!("healthy: node {} {what}", a.id);
            Ok(())
        }
        Err(e) => Err(e.context(format!("unhealthy: node {}", a.id))),
    }
}

async fn check(config: &ClusterConfig, id: u32, timeout: Duration) -> Result<String> {
    if let Some(m) = config.mgmd.iter().find(|m| m.id == id) {
        return check_mgmd(&m.addr, timeout).await;
    }
    if let Some(d) = config.datanode.iter().find(|d| d.id == id) {
        return check_datanode(config, id, &d.addr, timeout).await;
    }
    if let Some(s) = config.sqlnode.iter().find(|s| s.id == id) {
        mysql_ping(&s.mysql_addr).await.with_context(|| format!("MySQL on {}", s.mysql_addr))?;
        return Ok(format!("serves MySQL on {}", s.mysql_addr));
    }
    bail!("the config has no node {id}")
}

async fn status_of(addr: &str, timeout: Duration) -> Result<pb::StatusResponse> {
    let pool = shoal_client::MgmdPool::new(&[addr.to_string()], timeout).map_err(anyhow::Error::msg)?;
    pool.status().await.map_err(|e| anyhow!("mgmd {addr} does not answer: {e}"))
}

async fn check_mgmd(addr: &str, timeout: Duration) -> Result<String> {
    let mine = status_of(addr, timeout).await?;
    let leader = mine.mgmds.iter().find(|m| m.leader).ok_or_else(|| anyhow!("mgmd {addr} knows no Raft leader"))?;
    if leader.addr != addr {
        let theirs = status_of(&leader.addr, timeout).await.context("ask the leader")?;
        if !theirs.mgmds.iter().any(|m| m.leader && m.id == leader.id) {
            bail!("mgmd {} was named leader by {addr} but does not say so itself", leader.id);
        }
    }
    Ok(format!("answers on {addr}; Raft leader is mgmd {}", leader.id))
}

async fn check_datanode(config: &ClusterConfig, id: u32, addr: &str, timeout: Duration) -> Result<String> {
    let pool = shoal_client::MgmdPool::new(&config.mgmd_addrs(), timeout).map_err(anyhow::Error::msg)?;
    let status = pool.status().await.map_err(|e| anyhow!("no mgmd answers: {e}"))?;
    let state = status.state.unwrap_or_default();
    let node = state.nodes.iter().find(|n| n.id == id).ok_or_else(|| anyhow!("mgmd does not know it yet"))?;
    let st = pb::NodeState::try_from(node.state).unwrap_or(pb::NodeState::Unspecified);
    if st != pb::NodeState::Up {
        bail!("mgmd has it {}", st.as_str_name().trim_start_matches("NODE_STATE_").to_lowercase());
    }
    TcpStream::connect(addr).await.with_context(|| format!("connect to {addr}"))?;
    Ok(format!("is up (epoch {}) and listens on {addr}", state.epoch))
}

/// Logs in to the MySQL endpoint at `addr` and pings it.
async fn mysql_ping(addr: &str) -> Result<()> {
    let mut s = TcpStream::connect(addr).await.context("connect")?;
    let (_, greeting) = read_packet(&mut s).await.context("read the greeting")?;
    match greeting.first() {
        Some(10) => {}
        Some(0xff) => bail!("refused: {}", err_text(&greeting)),
        _ => bail!("not a MySQL v10 greeting"),
    }
    // HandshakeResponse41: protocol 4.1, secure connection, plugin auth; user root with the
    // empty password, whose mysql_native_password response is empty.
    const CAPS: u32 = 0x1 | 0x200 | 0x8000 | 0x8_0000;
    let mut resp = vec![];
    resp.extend_from_slice(&CAPS.to_le_bytes());
    resp.extend_from_slice(&(1u32 << 24).to_le_bytes());
    resp.push(45); // utf8mb4_general_ci
    resp.extend_from_slice(&[0; 23]);
    resp.extend_from_slice(b"root\0");
    resp.push(0); // auth response length
    resp.extend_from_slice(NATIVE_PASSWORD);
    resp.push(0);
    write_packet(&mut s, 1, &resp).await?;
    let (seq, mut answer) = read_packet(&mut s).await.context("read the login answer")?;
    if answer.first() == Some(&0xfe) {
        // Auth switch: the empty password's response is empty whatever the plugin.
        write_packet(&mut s, seq.wrapping_add(1), &[]).await?;
        answer = read_packet(&mut s).await.context("read the login answer")?.1;
    }
    match answer.first() {
        Some(0) => {}
        // root has a password now: the refusal still says the node checked it against the
        // cluster's user table, which it holds only once it serves.
        Some(0xff) if answer.get(1..3) == Some(&ACCESS_DENIED.to_le_bytes()[..]) => return Ok(()),
        Some(0xff) => bail!("login refused: {}", err_text(&answer)),
        _ => bail!("unexpected login answer"),
    }
    write_packet(&mut s, 0, &[0x0e]).await?; // COM_PING
    let (_, pong) = read_packet(&mut s).await.context("read the ping answer")?;
    match pong.first() {
        Some(0) => {}
        Some(0xff) => bail!("ping refused: {}", err_text(&pong)),
        _ => bail!("unexpected ping answer"),
    }
    let _ = write_packet(&mut s, 0, &[0x01]).await; // COM_QUIT
    Ok(())
}

async fn read_packet(s: &mut TcpStream) -> Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await?;
    let len = usize::from(head[0]) | usize::from(head[1]) << 8 | usize::from(head[2]) << 16;
    if len > MAX_HEALTH_PACKET_BYTES {
        bail!("packet of {len} bytes");
    }
    let mut body = vec![0; len];
    s.read_exact(&mut body).await?;
    Ok((head[3], body))
}

async fn write_packet(s: &mut TcpStream, seq: u8, body: &[u8]) -> Result<()> {
    let len = (body.len() as u32).to_le_bytes();
    let mut p = Vec::with_capacity(4 + body.len());
    p.extend_from_slice(&[len[0], len[1], len[2], seq]);
    p.extend_from_slice(body);
    s.write_all(&p).await?;
    Ok(())
}

/// The message of an ERR packet: `0xff, code (2), '#', SQLSTATE (5), message`.
fn err_text(p: &[u8]) -> String {
    let code = if p.len() >= 3 { u16::from_le_bytes([p[1], p[2]]) } else { 0 };
    let msg = if p.len() > 9 && p[3] == b'#' { &p[9..] } else { p.get(3..).unwrap_or_default() };
    format!("{code} {}", String::from_utf8_lossy(msg))
}

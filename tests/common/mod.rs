//! Test harness: a real local cluster (`shoal up` and its node processes on 127.0.0.1) in a
//! fresh directory on free ports, always torn down, also when the test fails.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use shoal_client::Client;

/// Cluster tests share two cores and depend on timeouts: run one cluster at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

pub const SHOAL: &str = env!("CARGO_BIN_EXE_shoal");

pub struct TestCluster {
    pub dir: PathBuf,
    up: Option<Child>,
    pub mgmd_addrs: Vec<String>,
    /// host:port of each SQL node's MySQL endpoint.
    pub mysql_addrs: Vec<String>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn free_base_port(span: u16) -> u16 {
    let seed = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..200 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Below Linux's ephemeral range (32768 and up): a port checked free here could
        // otherwise be taken by some connection's local end before the node binds it.
        let base = 20_000 + (x % 12_000) as u16;
        if (0..span).all(|o| TcpListener::bind(("127.0.0.1", base + o)).is_ok()) {
            return base;
        }
    }
    panic!("no free port range found");
}

impl TestCluster {
    /// Starts `shoal up` with this layout (no SQL node) and waits for its `ready` line.
    pub fn start(node_groups: u32, replicas: u32, mgmds: u32) -> TestCluster {
        TestCluster::start_with_sql(node_groups, replicas, mgmds, 0)
    }

    /// Like [`TestCluster::start`], with `sql_nodes` SQL nodes (MySQL ports base+30..).
    pub fn start_with_sql(node_groups: u32, replicas: u32, mgmds: u32, sql_nodes: u32) -> TestCluster {
        TestCluster::start_with_args(node_groups, replicas, mgmds, sql_nodes, &[])
    }

    /// Like [`TestCluster::start_with_sql`], passing `extra` arguments to `shoal up`.
    pub fn start_with_args(node_groups: u32, replicas: u32, mgmds: u32, sql_nodes: u32, extra: &[&str]) -> TestCluster {
        let serial = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!(
            "shoal-test-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let span = if sql_nodes > 0 { 30 + sql_nodes as u16 } else { 10 + (node_groups * replicas) as u16 };
        let base = free_base_port(span);
        let mut layout = vec![
            "--node-groups".to_string(),
            node_groups.to_string(),
            "--replicas".into(),
            replicas.to_string(),
            "--mgmds".into(),
            mgmds.to_string(),
            "--base-port".into(),
            base.to_string(),
            "--sql-nodes".into(),
            sql_nodes.to_string(),
        ];
        layout.extend(extra.iter().map(|s| s.to_string()));
        let mgmd_addrs = (0..mgmds).map(|i| format!("127.0.0.1:{}", base + i as u16)).collect();
        let mysql_addrs = (0..sql_nodes).map(|i| format!("127.0.0.1:{}", base + 30 + i as u16)).collect();
        let mut cluster = TestCluster { dir, up: None, mgmd_addrs, mysql_addrs, _serial: serial };
        cluster.run_up(&layout);
        cluster
    }

    /// Runs `shoal up` on the cluster's directory and waits for its `ready` line.
    fn run_up(&mut self, extra: &[String]) {
        let mut up = Command::new(SHOAL);
        up.args(["up", "--dir"]).arg(&self.dir).args(extra).stdout(Stdio::piped()).stderr(Stdio::inherit());
        // A test binary killed from outside runs no Drop: `shoal up` must still stop its
        // nodes, so it gets SIGTERM when the thread that started it goes away.
        // SAFETY: prctl is async-signal-safe and touches only the child's own attributes.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut up, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut up = up.spawn().expect("start shoal up");
        let stdout = up.stdout.take().expect("piped stdout");
        self.up = Some(up);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                eprintln!("[shoal up] {line}");
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.starts_with("ready") => return,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.dump_logs();
                    panic!("shoal up exited before it was ready");
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() > deadline {
                self.dump_logs();
                panic!("cluster not ready in time");
            }
        }
    }

    /// Stops `shoal up` (SIGTERM: it stops every node) and runs it again on the same directory.
    pub fn restart(&mut self) {
        self.restart_with(|_| {});
    }

    /// Like [`TestCluster::restart`], running `between` on the cluster's directory (to edit its
    /// `cluster.toml`, say) while everything is down.
    pub fn restart_with(&mut self, between: impl FnOnce(&std::path::Path)) {
        self.stop_up();
        assert!(self.node_pids().iter().all(|&p| !is_ours(p)), "shoal up left nodes running");
        between(&self.dir);
        self.run_up(&[]);
    }

    /// kill -9 of every process at once (a power loss), then `shoal up` on the same directory.
    pub fn crash_all_and_restart(&mut self) {
        self.crash_all_and_restart_with(|| {});
    }

    /// Like [`TestCluster::crash_all_and_restart`], running `between` while everything is down.
    pub fn crash_all_and_restart_with(&mut self, between: impl FnOnce()) {
        let pids = self.node_pids();
        if let Some(up) = &self.up {
            unsafe { libc::kill(up.id() as i32, libc::SIGKILL) };
        }
        for &pid in &pids {
            if is_ours(pid) {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        if let Some(mut up) = self.up.take() {
            let _ = up.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while pids.iter().any(|&p| is_ours(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        between();
        self.run_up(&[]);
    }

    fn stop_up(&mut self) {
        if let Some(mut up) = self.up.take() {
            unsafe { libc::kill(up.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = up.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = up.kill();
            let _ = up.wait();
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.mgmd_addrs).await.expect("connect client")
    }

    /// Runs the shoal CLI against this cluster's directory.
    pub fn shoal(&self, args: &[&str]) -> Output {
        Command::new(SHOAL).args(args).arg("--dir").arg(&self.dir).output().expect("run shoal")
    }

    pub fn status(&self) -> Json {
        let out = self.shoal(&["status", "--json"]);
        assert!(out.status.success(), "shoal status failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status is JSON")
    }

    pub fn node(status: &Json, id: u64) -> &Json {
        status["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == id)).expect("node in status")
    }

    /// Polls `shoal status --json` until `cond` holds (bounded).
    pub fn wait_status(&self, what: &str, timeout: Duration, cond: impl Fn(&Json) -> bool) -> Json {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.shoal(&["status", "--json"]);
            if out.status.success() {
                if let Ok(s) = serde_json::from_slice::<Json>(&out.stdout) {
                    if cond(&s) {
                        return s;
                    }
                    if Instant::now() > deadline {
                        self.dump_logs();
                        panic!("timed out waiting for {what}; last status: {s:#}");
                    }
                }
            } else if Instant::now() > deadline {
                self.dump_logs();
                panic!("timed out waiting for {what}; status failed");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self, id: u32) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("run").join(format!("{id}.pid"))).ok()?.trim().parse().ok()
    }

    pub fn signal(&self, id: u32, sig: i32) {
        let pid = self.pid(id).expect("node has a pid file");
        // SAFETY: plain kill(2) on a child of this test's cluster.
        assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "signal node {id}");
    }

    pub fn alive(&self, id: u32) -> bool {
        let Some(pid) = self.pid(id) else { return false };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        !stat.is_empty() && !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z')
    }

    pub fn dump_logs(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("logs")) else { return };
        for e in entries.flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("===== {} (last {} lines)", e.path().display(), tail.len());
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }

    fn node_pids(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("run")) else { return vec![] };
        entries.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok()).collect()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
            // SHOAL_KEEP_LOGS=DIR keeps every node's whole log of a failed test for a closer look.
            if let Some(keep) = std::env::var_os("SHOAL_KEEP_LOGS") {
                let to = Path::new(&keep).join(self.dir.file_name().unwrap_or_default());
                let _ = std::fs::create_dir_all(&to);
                for e in std::fs::read_dir(self.dir.join("logs")).into_iter().flatten().flatten() {
                    let _ = std::fs::copy(e.path(), to.join(e.file_name()));
                }
                eprintln!("logs kept in {}", to.display());
            }
        }
        // Wake anything a test stopped, so it can exit.
        for pid in self.node_pids() {
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        self.stop_up();
        // Whatever `shoal up` did not stop (it may have died): kill by pid file.
        for pid in self.node_pids() {
            if is_ours(pid) {
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
        remove_dir(&self.dir);
    }
}

fn is_ours(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("shoal-"))
        .unwrap_or(false)
}

fn remove_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `f` until it returns Some or the timeout passes.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

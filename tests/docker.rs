//! The docker compose cluster users run (`deploy/docker/compose.yaml`), on an image built from
//! this build's binaries by `deploy/docker/build-image.sh`, driven through both SQL nodes with
//! Debian's `mysql` client: bulk load and read back, a data node killed and started again, a
//! data node cut off from the network for longer than its lease, and a full stop and start on
//! the same volumes that keeps every row.
//!
//! Needs a Docker engine and docker compose (the v2 plugin or docker-compose v1.29). Every
//! project, volume, network and image it makes carries this process's id and is removed when
//! the test ends, also when it fails; leftovers of a test process that was killed are removed
//! by the next run. Every wait is bounded. SHOAL_SKIP_DOCKER_TESTS=1 skips (machines without
//! Docker).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use shoal_proto::ErrorCode;

/// The binaries the image is built from (naming them makes cargo build them for this test).
const BINS: [&str; 4] = [
    env!("CARGO_BIN_EXE_shoal"),
    env!("CARGO_BIN_EXE_shoal-mgmd"),
    env!("CARGO_BIN_EXE_shoal-datanode"),
    env!("CARGO_BIN_EXE_shoal-sqlnode"),
];
const SQL_SERVICES: [&str; 2] = ["sqlnode51", "sqlnode52"];
/// Rows of the bulk load, written in multi-row INSERTs of `LOAD_BATCH_ROWS`.
const LOAD_ROWS: i64 = 10_000;
const LOAD_BATCH_ROWS: i64 = 500;
/// Bounds on waits.
const UP_TIMEOUT: Duration = Duration::from_secs(180);
const STATE_TIMEOUT: Duration = Duration::from_secs(90);
const DOCKER_TIMEOUT: Duration = Duration::from_secs(120);
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a statement is retried on retriable errors before the test fails.
const RETRY_FOR: Duration = Duration::from_secs(45);
/// Worker steps (a write through one SQL node, read back through the other) that must complete
/// while a data node is away, and after it is back.
const STEPS_PER_PHASE: u64 = 6;

/// Cluster error numbers to look for in a MySQL 1296 message (beyond the highest one in use).
const MAX_ERROR_CODE: i32 = 64;

static NEXT: AtomicU32 = AtomicU32::new(0);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn skip() -> bool {
    if std::env::var("SHOAL_SKIP_DOCKER_TESTS").is_ok_and(|v| v == "1") {
        eprintln!("SHOAL_SKIP_DOCKER_TESTS=1: skipping the docker test");
        return true;
    }
    false
}

/// Runs `cmd` (with `input` on stdin) and waits at most `timeout`; None if it did not finish
/// (it is killed).
fn run_bounded(mut cmd: Command, input: Option<String>, timeout: Duration) -> Option<Output> {
    cmd.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        std::thread::spawn(move || {
            let _ = stdin.write_all(text.as_bytes());
        });
    }
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => Some(out.expect("wait for a child process")),
        Err(_) => {
            // SAFETY: kill(2) of the child this function started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            None
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

/// Runs a command that must succeed within `timeout`; returns its stdout.
fn must(cmd: Command, timeout: Duration) -> String {
    let what = format!("{cmd:?}");
    let out = run_bounded(cmd, None, timeout).unwrap_or_else(|| panic!("{what} did not finish within {timeout:?}"));
    assert!(out.status.success(), "{what} failed: {}\n{}", text(&out.stderr), text(&out.stdout));
    text(&out.stdout)
}

fn docker(args: &[&str]) -> Command {
    let mut c = Command::new("docker");
    c.args(args);
    c
}

/// A MySQL error as the `mysql` client prints it: `ERROR 1205 (HY000) at line 1: ...`.
#[derive(Debug)]
struct SqlErr {
    code: u16,
    message: String,
}

impl SqlErr {
    /// The errors a client retries (README, "Errors"): 1205 (a cluster TIMEOUT), or 1296 naming
    /// a cluster error code that is retriable (`Got error NODE_NOT_READY '...' from the cluster`).
    fn retriable(&self) -> bool {
        let named = |n: i32| {
            let c = ErrorCode::from_number(n);
            c.is_retriable() && self.message.contains(&format!("Got error {} ", c.name()))
        };
        self.code == 1205 || (self.code == 1296 && (1..=MAX_ERROR_CODE).any(named))
    }
}

/// Runs `sql` through the `mysql` client against 127.0.0.1:`port`; tab-separated rows.
fn mysql(port: u16, sql: &str) -> Result<String, SqlErr> {
    let mut cmd = Command::new("mysql");
    cmd.args(["--protocol=TCP", "-h", "127.0.0.1", "-u", "root", "--batch", "--skip-column-names"])
        .arg(format!("--port={port}"))
        .arg("--connect-timeout=10");
    let Some(out) = run_bounded(cmd, Some(sql.to_string()), STATEMENT_TIMEOUT) else {
        return Err(SqlErr { code: 0, message: format!("no answer within {STATEMENT_TIMEOUT:?}") });
    };
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = text(&out.stderr);
    let code = err.strip_prefix("ERROR ").and_then(|r| r.split_whitespace().next()).and_then(|c| c.parse().ok());
    Err(SqlErr { code: code.unwrap_or(0), message: err })
}

/// `mysql`, retrying retriable errors for up to [`RETRY_FOR`]; counts the retries in `retries`.
fn mysql_retrying(port: u16, sql: &str, retries: &mut BTreeMap<u16, u32>) -> Result<String, SqlErr> {
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        match mysql(port, sql) {
            Err(e) if e.retriable() && Instant::now() < deadline => {
                *retries.entry(e.code).or_default() += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// A compose project of `deploy/docker/compose.yaml` on a test image; `down -v` and image
/// removal on drop.
struct Cluster {
    compose: Vec<String>,
    project: String,
    image: String,
    /// Host ports of the SQL nodes' MySQL endpoints (published on random ports).
    ports: [u16; 2],
}

impl Cluster {
    /// Builds the image from this build's binaries and starts the cluster; returns once every
    /// service is healthy.
    fn start() -> Cluster {
        let info = run_bounded(docker(&["info", "--format", "{{.ServerVersion}}"]), None, DOCKER_TIMEOUT);
        assert!(
            info.as_ref().is_some_and(|o| o.status.success()),
            "no Docker engine answers `docker info` (set SHOAL_SKIP_DOCKER_TESTS=1 to skip this test): {}",
            info.map(|o| text(&o.stderr)).unwrap_or_default()
        );
        sweep_leftovers();
        let compose = compose_command();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let mut cluster = Cluster {
            compose,
            project: format!("shoaltest{pid}x{n}"),
            image: format!("shoaltest:{pid}x{n}"),
            ports: [0, 0],
        };
        let bin_dir = Path::new(BINS[0]).parent().expect("binary dir");
        for b in BINS {
            assert_eq!(Path::new(b).parent(), Some(bin_dir), "every binary in one directory");
        }
        let t = Instant::now();
        let mut build = Command::new(repo().join("deploy/docker/build-image.sh"));
        build.arg("--debug").arg("--bin-dir").arg(bin_dir).args(["--tag", &cluster.image]);
        must(build, Duration::from_secs(300));
        eprintln!("[docker] image {} built in {:.1?}", cluster.image, t.elapsed());
        cluster.up();
        cluster
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.compose[0]);
        c.args(&self.compose[1..])
            .args(["-p", &self.project, "-f"])
            .arg(repo().join("deploy/docker/compose.yaml"))
            .args(args)
            .env("SHOAL_IMAGE", &self.image)
            .env("SHOAL_MYSQL_PORT_51", "0")
            .env("SHOAL_MYSQL_PORT_52", "0");
        c
    }

    /// `up -d`, then waits until every service is healthy (compose v1 has no `--wait`).
    fn up(&mut self) {
        let t = Instant::now();
        must(self.cmd(&["up", "-d"]), UP_TIMEOUT);
        let services = ["mgmd1", "datanode11", "datanode12", SQL_SERVICES[0], SQL_SERVICES[1]];
        let deadline = Instant::now() + UP_TIMEOUT;
        for s in services {
            self.wait_healthy(s, deadline);
        }
        for s in services {
            // Only the compose file's named volumes: an anonymous one would outlive the project.
            let mounts = self.inspect(s, "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}");
            for m in mounts.split_whitespace() {
                assert!(m.starts_with(&format!("{}_", self.project)), "{s} mounts an anonymous volume {m}");
            }
        }
        for (i, s) in SQL_SERVICES.iter().enumerate() {
            let addr = must(self.cmd(&["port", s, "3306"]), DOCKER_TIMEOUT);
            self.ports[i] =
                addr.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("port {addr}"));
        }
        eprintln!("[docker] cluster {} healthy in {:.1?}, MySQL on ports {:?}", self.project, t.elapsed(), self.ports);
    }

    /// The container of `service`, running or not (compose v2's `ps` lists only running ones).
    fn container(&self, service: &str) -> String {
        let project = format!("label=com.docker.compose.project={}", self.project);
        let service_label = format!("label=com.docker.compose.service={service}");
        let id = must(docker(&["ps", "-a", "-q", "--filter", &project, "--filter", &service_label]), DOCKER_TIMEOUT);
        assert!(!id.is_empty() && !id.contains('\n'), "one container for {service}: {id:?}");
        id
    }

    fn inspect(&self, service: &str, format: &str) -> String {
        must(docker(&["inspect", "--format", format, &self.container(service)]), DOCKER_TIMEOUT)
    }

    fn wait_healthy(&self, service: &str, deadline: Instant) {
        loop {
            let health = self.inspect(service, "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}");
            if health == "running healthy" {
                return;
            }
            assert!(Instant::now() < deadline, "{service} not healthy in time: {health}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `shoal status --json`, run inside the mgmd container (node addresses are container
    /// hostnames, which only resolve on the compose network).
    fn status(&self) -> Option<Json> {
        let id = self.container("mgmd1");
        let cmd = docker(&["exec", &id, "/usr/local/bin/shoal", "status", "--json", "--mgmd", "mgmd1:7400"]);
        let out = run_bounded(cmd, None, DOCKER_TIMEOUT)?;
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    }

    fn wait_status(&self, what: &str, cond: impl Fn(&Json) -> bool) -> Json {
        let deadline = Instant::now() + STATE_TIMEOUT;
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(s) = self.status() {
                if cond(&s) {
                    return s;
                }
                last = Some(s);
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("timed out waiting for {what}; last status: {last:#?}");
    }

    fn sql(&self, node: usize, sql: &str) -> String {
        mysql(self.ports[node], sql).unwrap_or_else(|e| panic!("through {}: {sql:.200}: {e:?}", SQL_SERVICES[node]))
    }

    /// The whole table through SQL node `node`, one `id\tname\tv` line per row.
    fn dump(&self, node: usize) -> String {
        self.sql(node, "SELECT id, name, v FROM d.t ORDER BY id")
    }

    /// For a failed test: every node's recent log and the cluster map.
    fn logs(&self) {
        if let Some(out) = run_bounded(self.cmd(&["logs", "--no-color", "--tail", "200"]), None, DOCKER_TIMEOUT) {
            eprintln!("===== compose logs\n{}\n{}", text(&out.stdout), text(&out.stderr));
        }
        if let Some(s) = self.status() {
            eprintln!("===== shoal status\n{s:#}");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.logs();
        }
        let down = run_bounded(self.cmd(&["down", "-v", "--remove-orphans", "--timeout", "10"]), None, DOCKER_TIMEOUT);
        if !down.as_ref().is_some_and(|o| o.status.success()) {
            eprintln!("compose down failed: {:?}", down.map(|o| text(&o.stderr)));
        }
        remove_project(&self.project);
        let _ = run_bounded(docker(&["rmi", "-f", &self.image]), None, DOCKER_TIMEOUT);
    }
}

/// `docker compose` if the v2 plugin is there, else `docker-compose` (v1).
fn compose_command() -> Vec<String> {
    let ok = |c: &[&str]| {
        let mut cmd = Command::new(c[0]);
        cmd.args(&c[1..]).arg("version");
        run_bounded(cmd, None, DOCKER_TIMEOUT).is_some_and(|o| o.status.success())
    };
    for c in [&["docker", "compose"][..], &["docker-compose"][..]] {
        if ok(c) {
            return c.iter().map(|s| s.to_string()).collect();
        }
    }
    panic!("neither `docker compose` nor `docker-compose` works");
}

/// Removes whatever is left of compose project `project`: containers, volumes, networks.
fn remove_project(project: &str) {
    let label = format!("label=com.docker.compose.project={project}");
    let list = |what: &[&str]| -> Vec<String> {
        let mut args = what.to_vec();
        args.extend(["--filter", &label, "-q"]);
        run_bounded(docker(&args), None, DOCKER_TIMEOUT)
            .map(|o| text(&o.stdout).lines().map(str::to_string).collect())
            .unwrap_or_default()
    };
    for (ls, rm) in [
        (&["ps", "-a"][..], &["rm", "-f", "-v"][..]),
        (&["volume", "ls"][..], &["volume", "rm", "-f"][..]),
        (&["network", "ls"][..], &["network", "rm"][..]),
    ] {
        let ids = list(ls);
        if !ids.is_empty() {
            let mut args = rm.to_vec();
            args.extend(ids.iter().map(String::as_str));
            let _ = run_bounded(docker(&args), None, DOCKER_TIMEOUT);
        }
    }
}

/// Projects and images of earlier test processes that were killed before they could clean up.
fn sweep_leftovers() {
    let Some(out) = run_bounded(
        docker(&[
            "ps",
            "-a",
            "--filter",
            "label=com.docker.compose.project",
            "--format",
            "{{.Label \"com.docker.compose.project\"}}",
        ]),
        None,
        DOCKER_TIMEOUT,
    ) else {
        return;
    };
    let mut projects: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    if let Some(v) = run_bounded(
        docker(&[
            "volume",
            "ls",
            "--filter",
            "label=com.docker.compose.project",
            "--format",
            "{{.Label \"com.docker.compose.project\"}}",
        ]),
        None,
        DOCKER_TIMEOUT,
    ) {
        projects.extend(text(&v.stdout).lines().map(str::to_string));
    }
    projects.sort();
    projects.dedup();
    let dead = |pid: &str| pid.parse::<u32>().is_ok_and(|p| !Path::new(&format!("/proc/{p}")).exists());
    for p in projects {
        if let Some(pid) = p.strip_prefix("shoaltest").and_then(|r| r.split('x').next()) {
            if dead(pid) {
                eprintln!("[docker] removing project {p} left by a killed test run");
                remove_project(&p);
            }
        }
    }
    if let Some(out) = run_bounded(docker(&["images", "shoaltest", "--format", "{{.Tag}}"]), None, DOCKER_TIMEOUT) {
        for tag in text(&out.stdout).lines() {
            if tag.split('x').next().is_some_and(dead) {
                let _ = run_bounded(docker(&["rmi", "-f", &format!("shoaltest:{tag}")]), None, DOCKER_TIMEOUT);
            }
        }
    }
}

fn node(status: &Json, id: u64) -> &Json {
    status["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == id)).expect("node in status")
}

fn node_state(status: &Json, id: u64) -> String {
    node(status, id)["state"].as_str().unwrap_or("").to_string()
}

/// Every partition has a primary that is up, and every replica of it is complete (not syncing).
fn settled(status: &Json) -> bool {
    status["partitions"].as_array().is_some_and(|ps| {
        !ps.is_empty()
            && ps.iter().all(|p| {
                let primary = p["primary"].as_u64().unwrap_or(0);
                primary != 0
                    && node_state(status, primary) == "up"
                    && p["replicas"].as_array().is_some_and(|r| r.len() == 2 && r.iter().all(|r| r["syncing"] == false))
            })
    })
}

/// What the table must hold: id -> (name, v).
type Model = BTreeMap<i64, (String, i64)>;

fn format_rows(model: &Model) -> String {
    model.iter().map(|(id, (name, v))| format!("{id}\t{name}\t{v}\n")).collect()
}

/// Creates `d.t` through SQL node 0 and loads [`LOAD_ROWS`] rows in multi-row INSERTs.
fn create_and_load(c: &Cluster) -> Model {
    c.sql(0, "CREATE DATABASE d");
    c.sql(0, "CREATE TABLE d.t (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(40) NOT NULL, v BIGINT NOT NULL)");
    let mut model = Model::new();
    let mut script = String::new();
    for start in (0..LOAD_ROWS).step_by(LOAD_BATCH_ROWS as usize) {
        let values: Vec<String> = (start..start + LOAD_BATCH_ROWS)
            .map(|i| {
                let row = (format!("row-{i}"), i * 7 % 1000);
                let s = format!("({i}, '{}', {})", row.0, row.1);
                model.insert(i, row);
                s
            })
            .collect();
        script.push_str(&format!("INSERT INTO d.t (id, name, v) VALUES {};\n", values.join(", ")));
    }
    let t = Instant::now();
    c.sql(0, &script);
    eprintln!("[docker] {LOAD_ROWS} rows written through {} in {:.1?}", SQL_SERVICES[0], t.elapsed());
    model
}

/// Both SQL nodes return exactly `model`.
fn check_table(c: &Cluster, model: &Model, when: &str) {
    let want = format_rows(model);
    for (n, service) in SQL_SERVICES.iter().enumerate() {
        let got = c.dump(n);
        if got != want {
            let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
            let first = g.iter().zip(&w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
            panic!(
                "{when}: table through {service} differs from what was acknowledged: {} rows, want {}; first difference at line {first}: got {:?}, want {:?}",
                g.len(),
                w.len(),
                g.get(first),
                w.get(first)
            );
        }
    }
}

/// How a worker ended: the retries it made by MySQL error code, and its next step number.
type WorkerEnd = (BTreeMap<u16, u32>, u64);

/// A writer/reader loop over both SQL nodes: step s replaces 5 new and 5 loaded rows through
/// SQL node s % 2 (retrying retriable errors), then reads those rows back through the other SQL
/// node and checks it sees exactly the acknowledged values.
struct Worker {
    stop: Arc<AtomicBool>,
    /// Steps completed, per writing SQL node.
    done: Arc<[AtomicU64; 2]>,
    handle: Option<std::thread::JoinHandle<Result<WorkerEnd, String>>>,
}

impl Worker {
    fn start(ports: [u16; 2], model: Arc<Mutex<Model>>, first_step: u64) -> Worker {
        let stop = Arc::new(AtomicBool::new(false));
        let done: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let (stop2, done2) = (stop.clone(), done.clone());
        let handle = std::thread::spawn(move || {
            let mut retries = BTreeMap::new();
            let mut s = first_step;
            while !stop2.load(Ordering::Relaxed) {
                let (w, r) = ((s % 2) as usize, (1 - s % 2) as usize);
                let fresh = (0..5).map(|j| 100_000 + s as i64 * 5 + j);
                let loaded = (0..5).map(|j| (s as i64 * 37 + j * 2000) % LOAD_ROWS);
                let rows: Model = fresh.chain(loaded).map(|id| (id, (format!("s{s}-{id}"), s as i64))).collect();
                let values: Vec<String> = rows.iter().map(|(id, (n, v))| format!("({id}, '{n}', {v})")).collect();
                let write = format!("REPLACE INTO d.t (id, name, v) VALUES {}", values.join(", "));
                mysql_retrying(ports[w], &write, &mut retries)
                    .map_err(|e| format!("step {s}: write through {}: {e:?}", SQL_SERVICES[w]))?;
                model.lock().unwrap().extend(rows.clone());
                let ids: Vec<String> = rows.keys().map(i64::to_string).collect();
                let read = format!("SELECT id, name, v FROM d.t WHERE id IN ({}) ORDER BY id", ids.join(", "));
                let got = mysql_retrying(ports[r], &read, &mut retries)
                    .map_err(|e| format!("step {s}: read through {}: {e:?}", SQL_SERVICES[r]))?;
                if got != format_rows(&rows) {
                    // For the diagnosis: is it a stale read that heals, or a lost write?
                    std::thread::sleep(Duration::from_secs(1));
                    let again: Vec<String> =
                        (0..2).map(|n| mysql(ports[n], &read).unwrap_or_else(|e| format!("{e:?}\n"))).collect();
                    return Err(format!(
                        "step {s}: {} does not show what {} acknowledged:\n{got}want:\n{}a second later through {}:\n{}and through {}:\n{}",
                        SQL_SERVICES[r],
                        SQL_SERVICES[w],
                        format_rows(&rows),
                        SQL_SERVICES[0],
                        again[0],
                        SQL_SERVICES[1],
                        again[1]
                    ));
                }
                done2[w].fetch_add(1, Ordering::Relaxed);
                s += 1;
            }
            Ok((retries, s))
        });
        Worker { stop, done, handle: Some(handle) }
    }

    fn counts(&self) -> [u64; 2] {
        [self.done[0].load(Ordering::Relaxed), self.done[1].load(Ordering::Relaxed)]
    }

    /// Waits until both SQL nodes have written (and the other read back) `n` more steps each.
    fn wait_steps(&mut self, n: u64, what: &str) {
        let start = self.counts();
        let deadline = Instant::now() + STATE_TIMEOUT;
        loop {
            let now = self.counts();
            if now[0] >= start[0] + n && now[1] >= start[1] + n {
                return;
            }
            if self.handle.as_ref().is_some_and(|h| h.is_finished()) {
                match self.handle.take().expect("running").join() {
                    Ok(Err(e)) => panic!("{what}: {e}"),
                    other => panic!("{what}: the worker stopped: {other:?}"),
                }
            }
            assert!(Instant::now() < deadline, "{what}: only {now:?} steps since {start:?} in {STATE_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the loop; returns the retries by MySQL error code and the next step number.
    fn finish(mut self, what: &str) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let res = self.handle.take().expect("running").join().expect("worker thread");
        match res {
            Ok((retries, next)) => {
                eprintln!("[docker] {what}: steps {:?}, retried errors {retries:?}", self.counts());
                next
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn docker_compose_cluster_load_kill_partition_restart() {
    if skip() {
        return;
    }
    let t0 = Instant::now();
    let mut c = Cluster::start();

    // 10,000 rows through one SQL node, read back through the other.
    let model = create_and_load(&c);
    check_table(&c, &model, "after the load");
    let model = Arc::new(Mutex::new(model));

    // Kill a data node: both SQL nodes keep writing and reading; it restarts, copies its
    // partitions back and is up again.
    let mut w = Worker::start(c.ports, model.clone(), 0);
    w.wait_steps(2, "before the kill");
    must(docker(&["kill", &c.container("datanode12")]), DOCKER_TIMEOUT);
    c.wait_status("node 12 down, node 11 primary of everything", |s| {
        node_state(s, 12) == "down" && node(s, 11)["primaries"] == 8
    });
    w.wait_steps(STEPS_PER_PHASE, "while node 12 is down");
    assert_eq!(c.inspect("datanode12", "{{.State.Status}}"), "exited", "a killed data node stays down until started");
    must(docker(&["start", &c.container("datanode12")]), DOCKER_TIMEOUT);
    c.wait_status("node 12 rejoined and caught up", |s| node_state(s, 12) == "up" && settled(s));
    c.wait_healthy("datanode12", Instant::now() + STATE_TIMEOUT);
    w.wait_steps(STEPS_PER_PHASE, "after node 12 is back");
    let next = w.finish("kill datanode12");
    check_table(&c, &model.lock().unwrap(), "after the kill and restart");

    // Cut a data node off the network for longer than its lease: mgmd promotes its backups, it
    // fences itself; reconnected, it rejoins as a backup. No acknowledged write is lost and both
    // SQL nodes keep seeing every acknowledged value (no split brain).
    let network = c.inspect("datanode11", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}");
    let network = network.split_whitespace().find(|n| n.ends_with("_shoal")).expect("the compose network").to_string();
    let mut w = Worker::start(c.ports, model.clone(), next);
    w.wait_steps(2, "before the partition");
    let cut = Instant::now();
    must(docker(&["network", "disconnect", &network, &c.container("datanode11")]), DOCKER_TIMEOUT);
    c.wait_status("node 11 down, node 12 primary of everything", |s| {
        node_state(s, 11) == "down" && node(s, 12)["primaries"] == 8
    });
    w.wait_steps(STEPS_PER_PHASE, "while node 11 is cut off");
    let lease = Duration::from_millis(600);
    assert!(cut.elapsed() > 3 * lease);
    must(
        docker(&["network", "connect", "--alias", "datanode11", &network, &c.container("datanode11")]),
        DOCKER_TIMEOUT,
    );
    eprintln!("[docker] datanode11 cut off for {:.1?}", cut.elapsed());
    c.wait_status("node 11 rejoined and caught up", |s| node_state(s, 11) == "up" && settled(s));
    w.wait_steps(STEPS_PER_PHASE, "after node 11 is back");
    w.finish("partition datanode11");
    check_table(&c, &model.lock().unwrap(), "after the partition");

    // An UPDATE and a DELETE through the other SQL node, then a clean stop (SIGTERM within the
    // grace period: every node exits 0), `down` (containers and network go, volumes stay) and
    // `up` again: every acknowledged row is back, restored by the data nodes from their redo
    // logs and checkpoints on their volumes; the catalog from mgmd's Raft log on its volume.
    let mut model = Arc::try_unwrap(model).expect("workers are done").into_inner().unwrap();
    c.sql(1, "UPDATE d.t SET name = 'changed', v = -1 WHERE id < 100");
    c.sql(1, "DELETE FROM d.t WHERE id >= 9900 AND id < 10000");
    for id in 0..100 {
        model.insert(id, ("changed".into(), -1));
    }
    model.retain(|&id, _| !(9900..10_000).contains(&id));
    check_table(&c, &model, "before the stop");
    // By default a write is durable once its global checkpoint completes (a whole-cluster stop
    // may take back the newest ones); a data node stamps at most two GCIs past the complete one.
    let gci = |s: &Json| s["gci_complete"].as_u64().unwrap_or(0);
    let acked_by = gci(&c.wait_status("a status", |_| true)) + 2;
    c.wait_status("every acknowledged write in a complete global checkpoint", |s| gci(s) >= acked_by);
    let t = Instant::now();
    must(c.cmd(&["stop"]), DOCKER_TIMEOUT);
    for s in ["mgmd1", "datanode11", "datanode12", SQL_SERVICES[0], SQL_SERVICES[1]] {
        assert_eq!(c.inspect(s, "{{.State.ExitCode}}"), "0", "{s} stopped cleanly on SIGTERM");
    }
    must(c.cmd(&["down"]), DOCKER_TIMEOUT);
    eprintln!("[docker] stopped and removed in {:.1?}", t.elapsed());
    c.up();
    check_table(&c, &model, "after compose down and up");
    eprintln!("[docker] whole test in {:.1?}", t0.elapsed());
}

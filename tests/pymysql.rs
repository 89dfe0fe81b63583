//! PyMySQL (PyPI) runs a small DB-API program against a real cluster's SQL node:
//! `tests/pymysql_dbapi.py` (parameters, a dict cursor, joins and subqueries, errors caught by
//! their MySQL numbers, and transactions as far as they exist today).

mod common;

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TestCluster;

/// Longest the Python program may run before the test kills it and fails.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

fn pymysql_importable() -> bool {
    Command::new("python3").args(["-c", "import pymysql"]).output().is_ok_and(|o| o.status.success())
}

/// The Python program, killed (and reaped) when the test ends however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

#[test]
fn pymysql_dbapi_program() {
    if !pymysql_importable() {
        // scripts/gate installs it; a plain `cargo test` on a fresh machine does it here.
        let pip = |extra: &[&str]| {
            Command::new("python3")
                .args(["-m", "pip", "install", "--user", "--quiet"])
                .args(extra)
                .arg("pymysql")
                .output()
                .expect("run python3 -m pip (python3 with pip is needed for this test)")
        };
        let mut out = pip(&[]);
        if !out.status.success() {
            // Debian's own Python refuses user installs unless told (PEP 668).
            out = pip(&["--break-system-packages"]);
        }
        assert!(
            out.status.success() && pymysql_importable(),
            "installing pymysql failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let cluster = TestCluster::start_with_sql(1, 2, 1, 1);
    let (host, port) = cluster.mysql_addrs[0].rsplit_once(':').expect("host:port");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pymysql_dbapi.py");
    let mut child = KillOnDrop(
        Command::new("python3")
            .args([script, host, port])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python3"),
    );
    let child = &mut child.0;
    let deadline = Instant::now() + SCRIPT_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for python3") {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let status = status.unwrap_or_else(|| panic!("the pymysql program ran longer than {SCRIPT_TIMEOUT:?}\n{out}{err}"));
    assert!(status.success(), "the pymysql program failed ({status}):\n{out}{err}");
    assert!(out.contains("pymysql DB-API script: ok"), "{out}{err}");
}

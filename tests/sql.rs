//! SQL node tests: a real cluster with one SQL node, driven through the MySQL protocol by
//! mysql_async (text and binary protocol) and by the Debian `mysql` command-line client.

mod common;

use std::process::Command;

use common::TestCluster;
use mysql_async::prelude::*;
use mysql_async::{Conn, OptsBuilder};

fn opts(addr: &str, user: &str, db: Option<&str>) -> OptsBuilder {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    OptsBuilder::default()
        .ip_or_hostname(host.to_string())
        .tcp_port(port.parse().expect("port"))
        .user(Some(user.to_string()))
        .db_name(db.map(str::to_string))
        .prefer_socket(false)
}

async fn connect(cluster: &TestCluster, db: Option<&str>) -> Conn {
    Conn::new(opts(&cluster.mysql_addrs[0], "root", db)).await.expect("connect to the SQL node")
}

/// The MySQL error number of a failed statement.
fn code_of<T: std::fmt::Debug>(r: Result<T, mysql_async::Error>) -> u16 {
    match r {
        Err(mysql_async::Error::Server(e)) => e.code,
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_ddl_dml_queries_and_errors_over_mysql_protocol() {
    let cluster = TestCluster::start_with_sql(1, 2, 1, 1);
    let mut c = connect(&cluster, None).await;

    // Driver queries.
    let v: Option<String> = c.query_first("SELECT @@version").await.unwrap();
    assert!(v.unwrap().ends_with("-shoal"));
    let (ap, wt): (u64, u64) = c.query_first("SELECT @@max_allowed_packet, @@wait_timeout").await.unwrap().unwrap();
    assert!(ap >= 1 << 20 && wt > 0);
    let two: Option<i64> = c.query_first("SELECT 1+1").await.unwrap();
    assert_eq!(two, Some(2));
    c.query_drop("SET NAMES utf8mb4").await.unwrap();
    c.query_drop("SET autocommit=1").await.unwrap();
    let db: Option<Option<String>> = c.query_first("SELECT DATABASE()").await.unwrap();
    assert_eq!(db, Some(None));

    // Databases.
    c.query_drop("CREATE DATABASE shop").await.unwrap();
    assert_eq!(code_of(c.query_drop("CREATE DATABASE shop").await), 1007);
    c.query_drop("CREATE DATABASE IF NOT EXISTS shop").await.unwrap();
    let dbs: Vec<String> = c.query("SHOW DATABASES").await.unwrap();
    assert!(dbs.contains(&"shop".to_string()), "{dbs:?}");
    assert_eq!(code_of(c.query_drop("USE nosuch").await), 1049);
    assert_eq!(code_of(c.query_drop("CREATE TABLE t (a INT PRIMARY KEY)").await), 1046);
    c.query_drop("USE shop").await.unwrap();

    // DDL.
    c.query_drop(
        "CREATE TABLE items (
            id INT NOT NULL,
            name VARCHAR(10) NOT NULL,
            price DECIMAL(8,2) DEFAULT 1.00,
            qty TINYINT UNSIGNED,
            added DATE,
            PRIMARY KEY (id)
        ) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    assert_eq!(code_of(c.query_drop("CREATE TABLE items (a INT)").await), 1050);
    c.query_drop("CREATE TABLE IF NOT EXISTS items (a INT)").await.unwrap();
    let tables: Vec<String> = c.query("SHOW TABLES").await.unwrap();
    assert_eq!(tables, vec!["items".to_string()]);
    let desc: Vec<mysql_async::Row> = c.query("DESCRIBE items").await.unwrap();
    assert_eq!(desc.len(), 5);
    let first: (String, String, String, String) =
        (desc[0].get(0).unwrap(), desc[0].get(1).unwrap(), desc[0].get(2).unwrap(), desc[0].get(3).unwrap());
    assert_eq!(first, ("id".into(), "int".into(), "NO".into(), "PRI".into()));
    let create: Option<(String, String)> = c.query_first("SHOW CREATE TABLE items").await.unwrap();
    assert!(create.unwrap().1.contains("PRIMARY KEY (`id`)"));

    // Multi-row INSERT with defaults, NULLs and a column list.
    c.query_drop(
        "INSERT INTO items (id, name, price, qty, added) VALUES
            (1, 'apple', 0.50, 10, '2024-01-05'), (2, 'pear', 0.75, 0, NULL), (3, 'kiwi', DEFAULT, NULL, '2024-02-01')",
    )
    .await
    .unwrap();
    assert_eq!(c.affected_rows(), 3);
    let mut values = vec![];
    for i in 4..=50 {
        values.push(format!("({i}, 'item{i}', {i}.25, {}, '2024-03-{:02}')", i % 7, i % 28 + 1));
    }
    c.query_drop(format!("INSERT INTO items VALUES {}", values.join(","))).await.unwrap();
    assert_eq!(c.affected_rows(), 47);

    // Point SELECT (key read), through the text and the binary protocol.
    type ItemRow = (i64, String, String, Option<u8>, Option<String>);
    let row: Option<ItemRow> =
        c.query_first("SELECT id, name, price, qty, added FROM items WHERE id = 1").await.unwrap();
    assert_eq!(row, Some((1, "apple".into(), "0.50".into(), Some(10), Some("2024-01-05".into()))));
    let row: Option<(i64, String, String)> =
        c.exec_first("SELECT id, name, price FROM items WHERE id = ?", (3,)).await.unwrap();
    assert_eq!(row, Some((3, "kiwi".into(), "1.00".into())));
    let none: Option<(i64,)> = c.exec_first("SELECT id FROM items WHERE id = ?", (999,)).await.unwrap();
    assert_eq!(none, None);
    let many: Vec<i64> = c.query("SELECT id FROM items WHERE id IN (5, 7, 999, 9) ORDER BY id").await.unwrap();
    assert_eq!(many, vec![5, 7, 9]);

    // Range / filtered SELECT with ORDER BY and LIMIT/OFFSET.
    let ids: Vec<i64> =
        c.query("SELECT id FROM items WHERE id > 10 AND qty < 3 ORDER BY id DESC LIMIT 3 OFFSET 1").await.unwrap();
    let mut want: Vec<i64> = (11..=50).filter(|i| i % 7 < 3).collect();
    want.reverse();
    assert_eq!(ids, want[1..4].to_vec());
    let names: Vec<String> = c
        .query("SELECT name FROM items WHERE name LIKE 'item4%' OR name = 'pear' ORDER BY name LIMIT 4")
        .await
        .unwrap();
    assert_eq!(names, vec!["item4", "item40", "item41", "item42"]);
    let nulls: Vec<i64> = c.query("SELECT id FROM items WHERE qty IS NULL OR added IS NULL ORDER BY id").await.unwrap();
    assert_eq!(nulls, vec![2, 3]);
    let between: Vec<i64> = c
        .exec("SELECT id FROM items WHERE added BETWEEN ? AND ? ORDER BY id", ("2024-01-01", "2024-02-28"))
        .await
        .unwrap();
    assert_eq!(between, vec![1, 3]);
    let exprs: Option<(String, String, i64, String)> = c
        .query_first("SELECT CONCAT(name, '-', id), UPPER(name), LENGTH(name) + 1, price * 2 FROM items WHERE id = 2")
        .await
        .unwrap();
    assert_eq!(exprs, Some(("pear-2".into(), "PEAR".into(), 5, "1.50".into())));

    // Aggregates and GROUP BY in the SQL node.
    let (n, sum, min, max): (i64, String, i64, i64) =
        c.query_first("SELECT COUNT(*), SUM(price), MIN(id), MAX(id) FROM items").await.unwrap().unwrap();
    let expected_sum: f64 = 0.5 + 0.75 + 1.0 + (4..=50).map(|i| i as f64 + 0.25).sum::<f64>();
    assert_eq!((n, min, max), (50, 1, 50));
    assert_eq!(sum, format!("{expected_sum:.2}"));
    let groups: Vec<(i64, i64)> = c
        .query("SELECT qty, COUNT(*) AS n FROM items WHERE qty IS NOT NULL GROUP BY qty HAVING n > 6 ORDER BY qty")
        .await
        .unwrap();
    let count = |q: i64| (4..=50).filter(|i| i % 7 == q).count() as i64 + i64::from(q == 0) + i64::from(q == 10);
    let want: Vec<(i64, i64)> = (0..7).map(|q| (q, count(q))).filter(|(_, n)| *n > 6).collect();
    assert_eq!(groups, want);
    let empty: Option<(i64, Option<String>)> =
        c.query_first("SELECT COUNT(*), SUM(price) FROM items WHERE id > 1000").await.unwrap();
    assert_eq!(empty, Some((0, None)));
    let avg: Option<String> = c.query_first("SELECT AVG(qty) FROM items WHERE id IN (1, 2)").await.unwrap();
    assert_eq!(avg, Some("5.0000".into()));

    // UPDATE (key and scan) and DELETE.
    c.query_drop("UPDATE items SET price = price + 1, qty = qty + 1 WHERE id = 1").await.unwrap();
    assert_eq!(c.affected_rows(), 1);
    let row: Option<(String, u8)> = c.query_first("SELECT price, qty FROM items WHERE id = 1").await.unwrap();
    assert_eq!(row, Some(("1.50".into(), 11)));
    c.exec_drop("UPDATE items SET name = ? WHERE qty = ?", ("six", 6)).await.unwrap();
    let sixes = (4..=50).filter(|i| i % 7 == 6).count() as u64;
    assert_eq!(c.affected_rows(), sixes);
    let n: Option<i64> = c.query_first("SELECT COUNT(*) FROM items WHERE name = 'six'").await.unwrap();
    assert_eq!(n, Some(sixes as i64));
    c.query_drop("DELETE FROM items WHERE id > 40").await.unwrap();
    assert_eq!(c.affected_rows(), 10);
    c.query_drop("DELETE FROM items WHERE id = 2").await.unwrap();
    let n: Option<i64> = c.query_first("SELECT COUNT(*) FROM items").await.unwrap();
    assert_eq!(n, Some(39));

    // AUTO_INCREMENT and tables without a primary key.
    c.query_drop("CREATE TABLE log (id BIGINT AUTO_INCREMENT PRIMARY KEY, msg TEXT)").await.unwrap();
    c.query_drop("INSERT INTO log (msg) VALUES ('a'), ('b')").await.unwrap();
    assert_eq!(c.last_insert_id(), Some(1));
    c.exec_drop("INSERT INTO log (msg) VALUES (?)", ("c",)).await.unwrap();
    assert_eq!(c.last_insert_id(), Some(3));
    let ids: Vec<(i64, String)> = c.query("SELECT id, msg FROM log ORDER BY id").await.unwrap();
    assert_eq!(ids, vec![(1, "a".into()), (2, "b".into()), (3, "c".into())]);
    c.query_drop("CREATE TABLE nokey (a INT, b VARCHAR(5))").await.unwrap();
    c.query_drop("INSERT INTO nokey VALUES (1, 'x'), (1, 'x'), (2, NULL)").await.unwrap();
    let n: Option<i64> = c.query_first("SELECT COUNT(*) FROM nokey WHERE a = 1").await.unwrap();
    assert_eq!(n, Some(2));
    c.query_drop("DELETE FROM nokey WHERE b IS NULL").await.unwrap();
    let all: Vec<(i64, String)> = c.query("SELECT * FROM nokey").await.unwrap();
    assert_eq!(all, vec![(1, "x".into()), (1, "x".into())]);

    // Errors carry MySQL's numbers, and the connection stays usable after each.
    assert_eq!(code_of(c.query_drop("INSERT INTO items (id, name) VALUES (1, 'again')").await), 1062);
    assert_eq!(code_of(c.query_drop("INSERT INTO items (id, name) VALUES (100, 'x'), (1, 'dup')").await), 1062);
    let n: Option<i64> = c.query_first("SELECT COUNT(*) FROM items WHERE id = 100").await.unwrap();
    assert_eq!(n, Some(0), "a failed multi-row INSERT leaves none of its rows");
    assert_eq!(code_of(c.query_drop("SELEKT 1").await), 1064);
    assert_eq!(code_of(c.query_drop("SELECT * FROM nosuch").await), 1146);
    assert_eq!(code_of(c.query_drop("SELECT nosuch FROM items").await), 1054);
    assert_eq!(code_of(c.query_drop("INSERT INTO items (id, name) VALUES (200, NULL)").await), 1048);
    assert_eq!(code_of(c.query_drop("INSERT INTO items (id) VALUES (201)").await), 1364);
    assert_eq!(code_of(c.query_drop("INSERT INTO items (id, name) VALUES (202, 'elevenchars')").await), 1406);
    assert_eq!(code_of(c.query_drop("INSERT INTO items (id, name, qty) VALUES (203, 'x', 256)").await), 1264);
    assert_eq!(code_of(c.query_drop("INSERT INTO items (id, name, price) VALUES (204, 'x', 1000000)").await), 1264);
    assert_eq!(code_of(c.query_drop("DROP TABLE nosuch").await), 1051);
    assert_eq!(code_of(c.query_drop("CREATE TRIGGER t1 BEFORE INSERT ON items FOR EACH ROW SET @x = 1").await), 1235);
    // A secondary index is built; a unique one is refused while the rows repeat a name.
    c.query_drop("CREATE INDEX k_name ON items (name)").await.unwrap();
    assert_eq!(code_of(c.query_drop("CREATE UNIQUE INDEX u_name ON items (name)").await), 1062);
    assert_eq!(code_of(c.query_drop("CREATE INDEX k_x ON nosuch (x)").await), 1146);
    let still: Option<i64> = c.query_first("SELECT 42").await.unwrap();
    assert_eq!(still, Some(42));

    // Access: only root without a password.
    let denied = Conn::new(opts(&cluster.mysql_addrs[0], "bob", None)).await;
    assert_eq!(code_of(denied.map(|_| ())), 1045);
    let denied = Conn::new(opts(&cluster.mysql_addrs[0], "root", None).pass(Some("wrong"))).await;
    assert_eq!(code_of(denied.map(|_| ())), 1045);

    // A second connection that names the database at connect time sees the same data.
    let mut c2 = connect(&cluster, Some("shop")).await;
    let n: Option<i64> = c2.query_first("SELECT COUNT(*) FROM items").await.unwrap();
    assert_eq!(n, Some(39));
    assert_eq!(code_of(Conn::new(opts(&cluster.mysql_addrs[0], "root", Some("nodb"))).await.map(|_| ())), 1049);

    c.query_drop("TRUNCATE TABLE log").await.unwrap();
    let n: Option<i64> = c.query_first("SELECT COUNT(*) FROM log").await.unwrap();
    assert_eq!(n, Some(0));

    // DROP TABLE and DROP DATABASE.
    c.query_drop("DROP TABLE nokey").await.unwrap();
    assert_eq!(code_of(c.query_drop("SELECT * FROM nokey").await), 1146);
    c.query_drop("DROP DATABASE shop").await.unwrap();
    assert_eq!(code_of(c2.query_drop("SELECT * FROM items").await), 1146);
    let dbs: Vec<String> = c.query("SHOW DATABASES").await.unwrap();
    assert!(!dbs.contains(&"shop".to_string()));
    c.disconnect().await.unwrap();
    c2.disconnect().await.unwrap();
}

/// Runs the `mysql` command-line client with `args`; returns stdout, or panics with stderr.
fn mysql_cli(addr: &str, args: &[&str]) -> std::process::Output {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    Command::new("mysql")
        .args(["-h", host, "-P", port, "-u", "root", "--batch", "--skip-ssl"])
        .args(args)
        .output()
        .expect("run mysql")
}

#[test]
fn debian_mysql_client_connects_and_runs_sql() {
    assert!(
        Command::new("mysql").arg("--version").output().is_ok_and(|o| o.status.success()),
        "the `mysql` client is missing: install Debian's mariadb-client (apt-get install -y mariadb-client); .ci/run does"
    );
    let cluster = TestCluster::start_with_sql(1, 1, 1, 1);
    let addr = &cluster.mysql_addrs[0];
    let script = "CREATE DATABASE cli; USE cli; \
        CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20), score DOUBLE); \
        INSERT INTO t VALUES (1, 'ann', 1.5), (2, 'bob', NULL), (3, 'cid', 2.25); \
        UPDATE t SET score = 3 WHERE id = 2; \
        DELETE FROM t WHERE id = 3; \
        SELECT id, name, score FROM t ORDER BY id; \
        SELECT COUNT(*) AS n, SUM(score) AS total FROM t;";
    let out = mysql_cli(addr, &["-e", script]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "mysql failed: {stderr}\n{stdout}");
    assert_eq!(stdout, "id\tname\tscore\n1\tann\t1.5\n2\tbob\t3\nn\ttotal\n2\t4.5\n", "stderr: {stderr}");

    // Connecting with a database (the client then reads table names for completion).
    let out = mysql_cli(addr, &["cli", "-e", "SHOW TABLES; DESCRIBE t; SELECT DATABASE(), @@version_comment"]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("Tables_in_cli\nt\n"), "{stdout}");
    assert!(stdout.contains("id\tint\tNO\tPRI\tNULL\t\n"), "{stdout}");
    assert!(stdout.ends_with("cli\tShoal\n"), "{stdout}");

    // Errors reach the client with MySQL's numbers and the exit status says so.
    let out = mysql_cli(addr, &["cli", "-e", "INSERT INTO t VALUES (1, 'dup', 0)"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ERROR 1062 (23000)"), "{stderr}");
    let out = mysql_cli(addr, &["-u", "nobody", "-e", "SELECT 1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("ERROR 1045 (28000)"));

    // Interactive-style session through stdin, as a person would type it.
    let mut child = Command::new("mysql")
        .args([
            "-h",
            addr.rsplit_once(':').unwrap().0,
            "-P",
            addr.rsplit_once(':').unwrap().1,
            "-u",
            "root",
            "--skip-ssl",
            "cli",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run mysql");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"SELECT name FROM t WHERE id = 1;\nSELECT 1 + 1 AS two;\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "name\nann\ntwo\n2\n");

    // Through the SQL node's Unix socket (`mysql -S`), which `shoal status` names; a socket
    // client logs in from `localhost`.
    let status = cluster.status();
    let socket =
        TestCluster::node(&status, 51)["socket"].as_str().expect("the SQL node's socket in status").to_string();
    let out = Command::new("mysql")
        .args(["-S", &socket, "-u", "root", "--batch", "cli", "-e", "SELECT name FROM t WHERE id = 1; SELECT USER()"])
        .output()
        .expect("run mysql");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "name\nann\nUSER()\nroot@localhost\n");
}

/// CPU time (ns) so far of each of process `pid`'s threads named `sqlnode-N`: the SQL node's
/// workers past the first.
fn worker_cpu_ns(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the SQL node's threads") {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default().trim().to_string();
        if name.starts_with("sqlnode-") {
            let stat = std::fs::read_to_string(task.join("schedstat")).unwrap_or_default();
            out.insert(name, stat.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0));
        }
    }
    out
}

/// A SQL node with three workers that spreads connections from the second on: each worker
/// serves its own connections, and what one connection does (DDL, writes, a transaction) the
/// connections on the other workers see at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_connections_spread_over_workers_share_one_cluster() {
    let mut cluster = TestCluster::start_with_sql(1, 2, 1, 1);
    cluster.restart_with(|dir| {
        let path = dir.join("cluster.toml");
        let toml = std::fs::read_to_string(&path).unwrap();
        let (head, entry) = toml.split_once("[[sqlnode]]\n").expect("a [[sqlnode]] entry");
        assert!(!entry.contains('['), "the [[sqlnode]] entry is the last section:\n{toml}");
        let keep: String = entry
            .lines()
            .filter(|l| !l.starts_with("threads") && !l.starts_with("spread_after"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&path, format!("{head}[[sqlnode]]\nthreads = 3\nspread_after = 1\n{keep}")).unwrap();
    });
    let pid = cluster.pid(51).expect("the SQL node's pid");
    let mut a = connect(&cluster, None).await;
    let mut b = connect(&cluster, None).await;
    let mut c = connect(&cluster, None).await;
    let before = worker_cpu_ns(pid);
    assert_eq!(before.len(), 2, "workers past the first: {before:?}");

    a.query_drop("CREATE DATABASE w").await.unwrap();
    a.query_drop("CREATE TABLE w.t (id INT PRIMARY KEY, v INT)").await.unwrap();
    b.query_drop("INSERT INTO w.t VALUES (1, 10)").await.unwrap();
    let v: Option<i64> = c.query_first("SELECT v FROM w.t WHERE id = 1").await.unwrap();
    assert_eq!(v, Some(10));
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("UPDATE w.t SET v = 11 WHERE id = 1").await.unwrap();
    let v: Option<i64> = c.query_first("SELECT v FROM w.t WHERE id = 1").await.unwrap();
    assert_eq!(v, Some(10), "an uncommitted update is not seen");
    a.query_drop("COMMIT").await.unwrap();
    let v: Option<i64> = b.query_first("SELECT v FROM w.t WHERE id = 1").await.unwrap();
    assert_eq!(v, Some(11));
    for i in 2..50 {
        b.exec_drop("INSERT INTO w.t VALUES (?, ?)", (i, i)).await.unwrap();
        let v: Option<i64> = c.exec_first("SELECT v FROM w.t WHERE id = ?", (i,)).await.unwrap();
        assert_eq!(v, Some(i));
    }
    let ids: Vec<u64> = [
        a.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap(),
        b.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap(),
        c.query_first("SELECT CONNECTION_ID()").await.unwrap().unwrap(),
    ]
    .into();
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2], "{ids:?}");

    // The second and third connections ran on the other two workers.
    let after = worker_cpu_ns(pid);
    for (name, ns) in &after {
        assert!(*ns > before[name], "worker {name} served nothing: {before:?} then {after:?}");
    }
    a.query_drop("DROP DATABASE w").await.unwrap();
    for conn in [a, b, c] {
        conn.disconnect().await.unwrap();
    }
}

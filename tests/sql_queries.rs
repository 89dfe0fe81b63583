//! SQL node query tests beyond one table: joins, subqueries, set operations, derived tables,
//! views, INSERT ... SELECT and DISTINCT aggregates, over a real cluster through mysql_async.

mod common;

use common::TestCluster;
use mysql_async::prelude::*;
use mysql_async::{Conn, OptsBuilder};

fn code_of<T: std::fmt::Debug>(r: Result<T, mysql_async::Error>) -> u16 {
    match r {
        Err(mysql_async::Error::Server(e)) => e.code,
        other => panic!("expected a server error, got {other:?}"),
    }
}

/// Root on the cluster's first SQL node.
fn root_opts(cluster: &TestCluster) -> OptsBuilder {
    let (host, port) = cluster.mysql_addrs[0].rsplit_once(':').unwrap();
    OptsBuilder::default()
        .ip_or_hostname(host.to_string())
        .tcp_port(port.parse().unwrap())
        .user(Some("root"))
        .prefer_socket(false)
}

async fn rows(c: &mut Conn, sql: &str) -> Vec<String> {
    text_rows(c.query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")))
}

/// Each row as its cells in text, comma-separated (text and binary protocol rows alike).
fn text_rows(rs: Vec<mysql_async::Row>) -> Vec<String> {
    rs.into_iter()
        .map(|r| {
            (0..r.len())
                .map(|i| match r.as_ref(i) {
                    Some(mysql_async::Value::NULL) | None => "NULL".to_string(),
                    Some(mysql_async::Value::Bytes(b)) => String::from_utf8_lossy(b).into_owned(),
                    Some(v) => v.as_sql(true),
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_subqueries_unions_views() {
    let cluster = TestCluster::start_with_sql(1, 2, 1, 1);
    let mut c = Conn::new(root_opts(&cluster)).await.expect("connect");
    c.query_drop("CREATE DATABASE q").await.unwrap();
    c.query_drop("USE q").await.unwrap();
    c.query_drop("CREATE TABLE dept (id INT PRIMARY KEY, name VARCHAR(20))").await.unwrap();
    c.query_drop("CREATE TABLE emp (id INT PRIMARY KEY, name VARCHAR(20), dept INT, pay INT)").await.unwrap();
    c.query_drop("INSERT INTO dept VALUES (1, 'eng'), (2, 'ops'), (3, 'empty')").await.unwrap();
    c.query_drop(
        "INSERT INTO emp VALUES (1, 'ann', 1, 100), (2, 'bob', 1, 80), (3, 'cy', 2, 90), (4, 'dee', NULL, 70)",
    )
    .await
    .unwrap();

    // Joins: inner (ON and WHERE), left, right, comma, self-join with aliases.
    assert_eq!(
        rows(&mut c, "SELECT e.name, d.name FROM emp e JOIN dept d ON e.dept = d.id ORDER BY e.id").await,
        ["ann,eng", "bob,eng", "cy,ops"]
    );
    assert_eq!(
        rows(&mut c, "SELECT e.name, d.name FROM emp e, dept d WHERE e.dept = d.id AND d.name = 'ops'").await,
        ["cy,ops"]
    );
    assert_eq!(
        rows(&mut c, "SELECT e.name, d.name FROM emp e LEFT JOIN dept d ON e.dept = d.id ORDER BY e.id").await,
        ["ann,eng", "bob,eng", "cy,ops", "dee,NULL"]
    );
    assert_eq!(
        rows(
            &mut c,
            "SELECT d.name, COUNT(e.id) FROM emp e RIGHT JOIN dept d ON e.dept = d.id GROUP BY d.name ORDER BY 1"
        )
        .await,
        ["empty,0", "eng,2", "ops,1"]
    );
    assert_eq!(
        rows(&mut c, "SELECT a.name, b.name FROM emp a JOIN emp b ON a.dept = b.dept AND a.id < b.id").await,
        ["ann,bob"]
    );
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM emp CROSS JOIN dept").await, ["12"]);
    // EXPLAIN says how each table is read and joined.
    assert_eq!(
        rows(&mut c, "EXPLAIN SELECT e.name FROM emp e JOIN dept d ON e.dept = d.id WHERE d.name = 'ops' AND e.id = 3")
            .await,
        [
            "e,primary key read,,",
            "d,scan with 1 pushed-down filter(s),name Eq Text(\"ops\"),inner join, hash on 1 column(s)"
        ]
    );
    assert_eq!(
        rows(&mut c, "EXPLAIN SELECT name FROM dept d WHERE EXISTS (SELECT 1 FROM emp e WHERE e.dept = d.id)").await,
        ["d,full scan,,", "subquery 1 (correlated: once per row) > e,full scan,,"]
    );
    // The binary protocol (prepared statements) runs the same plans.
    let r: Vec<(String, String)> = c
        .exec("SELECT e.name, d.name FROM emp e JOIN dept d ON e.dept = d.id WHERE e.pay > ? ORDER BY e.id", (85,))
        .await
        .unwrap();
    assert_eq!(r, [("ann".to_string(), "eng".to_string()), ("cy".into(), "ops".into())]);
    let n: Option<i64> = c
        .exec_first("SELECT COUNT(*) FROM emp WHERE dept IN (SELECT id FROM dept WHERE name = ?)", ("eng",))
        .await
        .unwrap();
    assert_eq!(n, Some(2));

    // USING and NATURAL: the common columns once, first in `*`.
    assert_eq!(
        rows(&mut c, "SELECT * FROM emp JOIN dept USING (id) ORDER BY id").await,
        ["1,ann,1,100,eng", "2,bob,1,80,ops", "3,cy,2,90,empty"]
    );
    assert_eq!(
        rows(&mut c, "SELECT id, dept.name FROM emp LEFT JOIN dept USING (id) ORDER BY id").await,
        ["1,eng", "2,ops", "3,empty", "4,NULL"]
    );
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM emp NATURAL JOIN dept").await, ["0"]);
    assert_eq!(code_of(c.query_drop("SELECT * FROM emp JOIN dept USING (pay)").await), 1054);
    assert_eq!(code_of(c.query_drop("SELECT * FROM emp, emp").await), 1066);
    assert_eq!(code_of(c.query_drop("SELECT id FROM emp, dept").await), 1052);

    // Subqueries: scalar, IN, NOT IN with NULLs, EXISTS (correlated), ANY/ALL.
    assert_eq!(
        rows(&mut c, "SELECT name FROM emp WHERE pay > (SELECT AVG(pay) FROM emp) ORDER BY id").await,
        ["ann", "cy"]
    );
    assert_eq!(
        rows(&mut c, "SELECT name FROM emp WHERE dept IN (SELECT id FROM dept WHERE name <> 'eng') ORDER BY id").await,
        ["cy"]
    );
    assert_eq!(
        rows(&mut c, "SELECT name FROM dept WHERE id NOT IN (SELECT dept FROM emp)").await,
        Vec::<String>::new()
    );
    assert_eq!(
        rows(&mut c, "SELECT name FROM dept d WHERE NOT EXISTS (SELECT 1 FROM emp e WHERE e.dept = d.id)").await,
        ["empty"]
    );
    assert_eq!(
        rows(&mut c, "SELECT name, (SELECT COUNT(*) FROM emp x WHERE x.pay > emp.pay) FROM emp ORDER BY id").await,
        ["ann,0", "bob,2", "cy,1", "dee,3"]
    );
    assert_eq!(rows(&mut c, "SELECT name FROM emp WHERE pay >= ALL (SELECT pay FROM emp)").await, ["ann"]);
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM emp WHERE pay < ANY (SELECT pay FROM emp)").await, ["3"]);
    assert_eq!(code_of(c.query_drop("SELECT (SELECT id FROM emp)").await), 1242);
    assert_eq!(code_of(c.query_drop("SELECT 1 IN (SELECT id, name FROM emp)").await), 1241);

    // Window functions.
    assert_eq!(
        rows(
            &mut c,
            "SELECT name, pay, RANK() OVER (ORDER BY pay DESC), SUM(pay) OVER (PARTITION BY dept) FROM emp ORDER BY id"
        )
        .await,
        ["ann,100,1,180", "bob,80,3,180", "cy,90,2,90", "dee,70,4,70"]
    );
    assert_eq!(
        rows(&mut c, "SELECT dept, COUNT(*), ROW_NUMBER() OVER (ORDER BY COUNT(*) DESC, dept) AS r FROM emp GROUP BY dept ORDER BY r")
            .await,
        ["1,2,1", "NULL,1,2", "2,1,3"]
    );
    assert_eq!(
        rows(&mut c, "SELECT name, LAG(name) OVER (ORDER BY id) FROM emp ORDER BY id").await,
        ["ann,NULL", "bob,ann", "cy,bob", "dee,cy"]
    );
    // Named windows, and windows defined on them.
    assert_eq!(
        rows(
            &mut c,
            "SELECT name, RANK() OVER w, SUM(pay) OVER (w ROWS UNBOUNDED PRECEDING), COUNT(*) OVER d FROM emp \
             WINDOW w AS (ORDER BY pay DESC), d AS (PARTITION BY dept) ORDER BY id"
        )
        .await,
        ["ann,1,100,2", "bob,3,270,2", "cy,2,190,1", "dee,4,340,1"]
    );
    assert_eq!(code_of(c.query_drop("SELECT RANK() OVER w FROM emp WINDOW v AS (ORDER BY id)").await), 3579);
    assert_eq!(
        code_of(c.query_drop("SELECT RANK() OVER (w ORDER BY id) FROM emp WINDOW w AS (ORDER BY pay)").await),
        3582
    );
    assert_eq!(code_of(c.query_drop("SELECT name FROM emp WHERE ROW_NUMBER() OVER () > 1").await), 3593);

    // Common table expressions and DUAL.
    assert_eq!(
        rows(
            &mut c,
            "WITH d AS (SELECT id, name FROM dept), e (who, dept) AS (SELECT name, dept FROM emp WHERE dept IN \
             (SELECT id FROM d)) SELECT e.who, d.name FROM e JOIN d ON e.dept = d.id ORDER BY 1"
        )
        .await,
        ["ann,eng", "bob,eng", "cy,ops"]
    );
    assert_eq!(rows(&mut c, "SELECT 1 + 1 FROM DUAL").await, ["2"]);

    // Set operations, derived tables, DISTINCT aggregates.
    assert_eq!(
        rows(&mut c, "SELECT dept FROM emp UNION SELECT id FROM dept ORDER BY 1").await,
        ["NULL", "1", "2", "3"]
    );
    assert_eq!(
        rows(&mut c, "SELECT COUNT(*) FROM (SELECT dept FROM emp UNION ALL SELECT id FROM dept) AS u").await,
        ["7"]
    );
    assert_eq!(code_of(c.query_drop("SELECT 1 UNION SELECT 1, 2").await), 1222);
    assert_eq!(rows(&mut c, "SELECT t.n FROM (SELECT name AS n, pay FROM emp) AS t WHERE t.pay < 80").await, ["dee"]);
    assert_eq!(code_of(c.query_drop("SELECT * FROM (SELECT 1)").await), 1248);
    assert_eq!(rows(&mut c, "SELECT COUNT(DISTINCT dept), SUM(DISTINCT dept) FROM emp").await, ["2,3"]);
    // DISTINCT ordered by its own columns drops neighbours after sorting; ordered by something
    // else it hashes.
    assert_eq!(rows(&mut c, "SELECT DISTINCT dept FROM emp ORDER BY dept DESC").await, ["2", "1", "NULL"]);
    assert_eq!(rows(&mut c, "SELECT DISTINCT dept, pay > 0 FROM emp ORDER BY 2, 1").await, ["NULL,1", "1,1", "2,1"]);
    assert_eq!(rows(&mut c, "SELECT DISTINCT dept FROM emp ORDER BY dept IS NULL, dept").await, ["1", "2", "NULL"]);
    assert_eq!(
        rows(
            &mut c,
            "SELECT dept, GROUP_CONCAT(name ORDER BY name DESC SEPARATOR '|') FROM emp GROUP BY dept ORDER BY 1"
        )
        .await,
        ["NULL,dee", "1,bob|ann", "2,cy"]
    );
    assert_eq!(rows(&mut c, "SELECT GROUP_CONCAT(DISTINCT dept ORDER BY dept) FROM emp").await, ["1,2"]);
    // One text sort key sorts by its bytes: NULL first (last descending), equal keys in their
    // order either way.
    let texts = "(SELECT 'b' AS n, 1 AS i UNION ALL SELECT NULL, 2 UNION ALL SELECT 'a', 3 UNION ALL SELECT 'b', 4 \
                 UNION ALL SELECT 'ab', 5) AS t";
    assert_eq!(
        rows(&mut c, &format!("SELECT n, i FROM {texts} ORDER BY n")).await,
        ["NULL,2", "a,3", "ab,5", "b,1", "b,4"]
    );
    assert_eq!(
        rows(&mut c, &format!("SELECT n, i FROM {texts} ORDER BY n DESC")).await,
        ["b,1", "b,4", "ab,5", "a,3", "NULL,2"]
    );
    assert_eq!(
        rows(&mut c, "SELECT DATE_FORMAT(DATE_ADD('2024-02-28', INTERVAL 1 DAY), '%Y/%m/%d'), DAYNAME('2024-02-29')")
            .await,
        ["2024/02/29,Thursday"]
    );

    // Views: stored queries over the view's database, in SHOW TABLES, read-only.
    c.query_drop("CREATE VIEW rich AS SELECT name, pay FROM emp WHERE pay >= 90").await.unwrap();
    assert_eq!(code_of(c.query_drop("CREATE VIEW rich AS SELECT 1").await), 1050);
    assert_eq!(code_of(c.query_drop("CREATE VIEW emp AS SELECT 1").await), 1050);
    assert_eq!(code_of(c.query_drop("CREATE VIEW bad AS SELECT nosuch FROM emp").await), 1054);
    c.query_drop("CREATE DATABASE other").await.unwrap();
    c.query_drop("USE other").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT name FROM q.rich ORDER BY pay").await, ["cy", "ann"]);
    c.query_drop("USE q").await.unwrap();
    c.query_drop("CREATE VIEW richest (who) AS SELECT name FROM rich WHERE pay = (SELECT MAX(pay) FROM emp)")
        .await
        .unwrap();
    assert_eq!(rows(&mut c, "SELECT who FROM richest").await, ["ann"]);
    assert_eq!(
        rows(&mut c, "SHOW FULL TABLES").await,
        ["dept,BASE TABLE", "emp,BASE TABLE", "rich,VIEW", "richest,VIEW"]
    );
    assert_eq!(code_of(c.query_drop("INSERT INTO rich VALUES ('x', 1)").await), 1146);
    assert_eq!(code_of(c.query_drop("DROP VIEW emp").await), 1347);
    c.query_drop("DROP VIEW richest, rich").await.unwrap();
    assert_eq!(code_of(c.query_drop("DROP VIEW rich").await), 1051);
    c.query_drop("DROP VIEW IF EXISTS rich").await.unwrap();

    // INSERT ... SELECT.
    c.query_drop("CREATE TABLE pay_copy (name VARCHAR(20) PRIMARY KEY, pay INT)").await.unwrap();
    c.query_drop("INSERT INTO pay_copy SELECT e.name, e.pay FROM emp e JOIN dept d ON e.dept = d.id").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT SUM(pay) FROM pay_copy").await, ["270"]);
    assert_eq!(code_of(c.query_drop("INSERT INTO pay_copy SELECT id FROM emp").await), 1136);

    // INSERT ... ON DUPLICATE KEY UPDATE: VALUES(), the row alias, affected-row counts.
    let r = c
        .query_iter(
            "INSERT INTO pay_copy VALUES ('ann', 1), ('zed', 5) ON DUPLICATE KEY UPDATE pay = pay + VALUES(pay)",
        )
        .await
        .unwrap();
    assert_eq!(r.affected_rows(), 3, "one row updated (2) and one inserted (1)");
    drop(r);
    c.query_drop("INSERT INTO pay_copy VALUES ('zed', 7) AS n ON DUPLICATE KEY UPDATE pay = n.pay * 10").await.unwrap();
    let r = c.query_iter("INSERT INTO pay_copy VALUES ('zed', 0) ON DUPLICATE KEY UPDATE pay = pay").await.unwrap();
    assert_eq!(r.affected_rows(), 0, "an unchanged row counts 0");
    drop(r);
    assert_eq!(
        rows(&mut c, "SELECT name, pay FROM pay_copy WHERE name IN ('ann', 'zed') ORDER BY 1").await,
        ["ann,101", "zed,70"]
    );
    assert_eq!(
        code_of(c.query_drop("INSERT INTO pay_copy VALUES ('ann', 1) ON DUPLICATE KEY UPDATE name = 'x'").await),
        1235
    );

    // UPDATE and DELETE with subqueries, correlated or not.
    c.query_drop("UPDATE emp SET pay = pay + 1 WHERE dept IN (SELECT id FROM dept WHERE name = 'ops')").await.unwrap();
    c.query_drop("UPDATE emp SET pay = (SELECT COUNT(*) FROM emp e2 WHERE e2.dept = emp.dept) WHERE id <= 2")
        .await
        .unwrap();
    c.query_drop("DELETE FROM emp WHERE NOT EXISTS (SELECT 1 FROM dept WHERE dept.id = emp.dept)").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT name, pay FROM emp ORDER BY id").await, ["ann,2", "bob,2", "cy,91"]);

    // UPDATE / DELETE ... ORDER BY ... LIMIT.
    c.query_drop("INSERT INTO pay_copy VALUES ('p1', 1), ('p2', 2), ('p3', 3), ('p4', 4)").await.unwrap();
    c.query_drop("UPDATE pay_copy SET pay = pay * 100 WHERE name LIKE 'p%' ORDER BY pay DESC LIMIT 2").await.unwrap();
    c.query_drop("DELETE FROM pay_copy WHERE name LIKE 'p%' ORDER BY pay LIMIT 1").await.unwrap();
    assert_eq!(
        rows(&mut c, "SELECT name, pay FROM pay_copy WHERE name LIKE 'p%' ORDER BY name").await,
        ["p2,2", "p3,300", "p4,400"]
    );

    // PARTITION BY KEY: rows of one customer share a partition; equality on it reads only that.
    c.query_drop(
        "CREATE TABLE orders (cust INT, id INT, total INT, PRIMARY KEY (cust, id)) PARTITION BY KEY (cust) PARTITIONS 8",
    )
    .await
    .unwrap();
    c.query_drop("INSERT INTO orders VALUES (1, 1, 10), (1, 2, 20), (2, 3, 30), (3, 4, 40), (1, 5, 50)").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT SUM(total) FROM orders WHERE cust = 1").await, ["80"]);
    let plan = rows(&mut c, "EXPLAIN SELECT * FROM orders WHERE cust = 1 AND total > 15").await;
    assert!(plan[0].contains("in partition") || plan[0].contains("scan of partition"), "{plan:?}");
    let ddl = rows(&mut c, "SHOW CREATE TABLE orders").await;
    assert!(ddl[0].contains("PARTITION BY KEY (`cust`)"), "{ddl:?}");
    assert_eq!(
        code_of(c.query_drop("CREATE TABLE bad (a INT, b INT, PRIMARY KEY (a)) PARTITION BY KEY (b)").await),
        1503
    );
    assert_eq!(code_of(c.query_drop("CREATE TABLE bad (a INT PRIMARY KEY) PARTITION BY HASH (a)").await), 1235);

    // information_schema, queried like any table.
    assert_eq!(
        rows(
            &mut c,
            "SELECT t.table_name, COUNT(*) FROM information_schema.tables t JOIN information_schema.columns c \
             ON c.table_schema = t.table_schema AND c.table_name = t.table_name \
             WHERE t.table_schema = 'q' AND t.table_type = 'BASE TABLE' GROUP BY t.table_name ORDER BY 1"
        )
        .await,
        ["dept,2", "emp,4", "orders,3", "pay_copy,2"]
    );
    assert_eq!(
        rows(&mut c, "SELECT column_type, column_key FROM information_schema.columns WHERE table_name = 'orders' AND column_name = 'cust'")
            .await,
        ["int,PRI"]
    );
    // A UNION of numbers and text is text: sorted and compared as text.
    assert_eq!(rows(&mut c, "SELECT 10 UNION SELECT '9' UNION SELECT 10 ORDER BY 1").await, ["10", "9"]);

    // Recursive common table expressions: counting, walking a tree through a join, a cycle
    // that UNION (not UNION ALL) ends, and MySQL's errors for what a recursion may not do.
    assert_eq!(
        rows(&mut c, "WITH RECURSIVE c (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 5) SELECT n FROM c")
            .await,
        ["1", "2", "3", "4", "5"]
    );
    assert_eq!(
        rows(
            &mut c,
            "WITH RECURSIVE fib (n, a, b) AS (SELECT 1, 0, 1 UNION ALL SELECT n + 1, b, a + b FROM fib WHERE n < 10) \
             SELECT a FROM fib WHERE n = 10"
        )
        .await,
        ["34"]
    );
    c.query_drop("CREATE TABLE edge (src INT, dst INT, PRIMARY KEY (src, dst))").await.unwrap();
    c.query_drop("INSERT INTO edge VALUES (1, 2), (1, 3), (2, 4), (4, 5), (3, 6), (5, 1), (7, 8)").await.unwrap();
    assert_eq!(
        rows(
            &mut c,
            "WITH RECURSIVE below (id, depth) AS (SELECT 2, 0 UNION ALL SELECT e.dst, b.depth + 1 FROM edge e \
             JOIN below b ON e.src = b.id WHERE e.dst <> 1) SELECT id, depth FROM below ORDER BY id"
        )
        .await,
        ["2,0", "4,1", "5,2"]
    );
    // 1 → 2 → 4 → 5 → 1 is a cycle: UNION drops the rows seen before, so the recursion ends.
    assert_eq!(
        rows(
            &mut c,
            "WITH RECURSIVE r AS (SELECT 1 AS n UNION SELECT edge.dst FROM r, edge WHERE edge.src = r.n) \
             SELECT GROUP_CONCAT(n ORDER BY n) FROM r"
        )
        .await,
        ["1,2,3,4,5,6"]
    );
    // The same with UNION ALL never ends: stopped after cte_max_recursion_depth rounds.
    let cycle = "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT edge.dst FROM r, edge WHERE edge.src = r.n) \
                 SELECT COUNT(*) FROM r";
    assert_eq!(code_of(c.query_drop(cycle).await), 3636);
    assert_eq!(rows(&mut c, "SELECT @@cte_max_recursion_depth").await, ["1000"]);
    // A session that allows deeper recursion gets it.
    c.query_drop("SET @@session.cte_max_recursion_depth = 5000").await.unwrap();
    assert_eq!(
        rows(
            &mut c,
            "WITH RECURSIVE s AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM s WHERE n < 3000) SELECT SUM(n) FROM s"
        )
        .await,
        ["4501500"]
    );
    assert_eq!(code_of(c.query_drop("SET cte_max_recursion_depth = 'deep'").await), 1231);
    c.query_drop("SET cte_max_recursion_depth = DEFAULT").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT @@cte_max_recursion_depth").await, ["1000"]);
    // A CTE under WITH RECURSIVE that does not name itself is an ordinary one.
    assert_eq!(rows(&mut c, "WITH RECURSIVE x AS (SELECT 1 AS a) SELECT * FROM x").await, ["1"]);
    let recursion_errors = [
        ("WITH RECURSIVE x (n) AS (SELECT n FROM x) SELECT * FROM x", 3573),
        ("WITH RECURSIVE x (n) AS (SELECT n + 1 FROM x UNION ALL SELECT 1) SELECT * FROM x", 3574),
        ("WITH RECURSIVE x (n) AS (SELECT 1 UNION ALL SELECT COUNT(*) FROM x) SELECT * FROM x", 3575),
        ("WITH RECURSIVE x (n) AS (SELECT 1 UNION ALL SELECT a.n FROM x a, x b) SELECT * FROM x", 3577),
        (
            "WITH RECURSIVE x (n) AS (SELECT 1 UNION ALL SELECT src FROM edge WHERE src IN (SELECT n FROM x)) \
             SELECT * FROM x",
            3577,
        ),
    ];
    for (sql, code) in recursion_errors {
        assert_eq!(code_of(c.query_drop(sql).await), code, "{sql}");
    }
    let plan = rows(
        &mut c,
        "EXPLAIN WITH RECURSIVE c (n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 3) SELECT n FROM c",
    )
    .await
    .join("\n");
    assert!(plan.contains("recursive reference"), "{plan}");

    c.query_drop("DROP DATABASE q").await.unwrap();
    c.query_drop("DROP DATABASE other").await.unwrap();
}

/// Ordered indexes through SQL: KEY in CREATE TABLE, CREATE INDEX / ALTER TABLE ADD INDEX on a
/// loaded table, range plans in EXPLAIN, results equal to what a full scan gives, SHOW INDEX,
/// SHOW CREATE TABLE, DROP INDEX and the errors MySQL gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_indexes_serve_ranges() {
    let cluster = TestCluster::start_with_sql(2, 2, 1, 1);
    let mut c = Conn::new(root_opts(&cluster)).await.expect("connect");
    c.query_drop("CREATE DATABASE ix").await.unwrap();
    c.query_drop("USE ix").await.unwrap();
    c.query_drop("CREATE TABLE t (id INT PRIMARY KEY, k INT, s VARCHAR(10), f DOUBLE, KEY k_idx (k))").await.unwrap();
    let values: Vec<String> = (1..=200)
        .map(|i| {
            let k = if i % 9 == 0 { "NULL".to_string() } else { ((i * 31) % 40).to_string() };
            format!("({i}, {k}, 's{:03}', {})", (i * 7) % 100, f64::from(i) / 4.0 - 20.0)
        })
        .collect();
    c.query_drop(format!("INSERT INTO t VALUES {}", values.join(","))).await.unwrap();

    let plan = rows(&mut c, "EXPLAIN SELECT id FROM t WHERE k BETWEEN 10 AND 12").await.join("\n");
    assert!(plan.contains("range scan of index k_idx"), "{plan}");
    let plan = rows(&mut c, "EXPLAIN SELECT id FROM t WHERE id > 150").await.join("\n");
    assert!(plan.contains("range scan of index PRIMARY"), "{plan}");
    // Each range query against the same query forced through a full scan (`+ 0` hides the
    // column from the planner).
    let queries = [
        ("k BETWEEN 10 AND 12", "k + 0 BETWEEN 10 AND 12"),
        ("k < 3", "k + 0 < 3"),
        ("k >= 38", "k + 0 >= 38"),
        ("k > 5 AND k <= 7 AND id < 100", "k + 0 > 5 AND k + 0 <= 7 AND id + 0 < 100"),
        ("k = 20", "k + 0 = 20"),
        ("id BETWEEN 90 AND 110", "id + 0 BETWEEN 90 AND 110"),
        ("id > 195", "id + 0 > 195"),
        ("k = 4.5", "k + 0 = 4.5"),
        ("k IS NULL AND id > 100", "k + 0 IS NULL AND id + 0 > 100"),
    ];
    for (indexed, scanned) in queries {
        let a = rows(&mut c, &format!("SELECT id, k, s FROM t WHERE {indexed} ORDER BY id")).await;
        let b = rows(&mut c, &format!("SELECT id, k, s FROM t WHERE {scanned} ORDER BY id")).await;
        assert_eq!(a, b, "WHERE {indexed}");
    }
    assert_eq!(rows(&mut c, "SELECT COUNT(*), SUM(k) FROM t WHERE id BETWEEN 1 AND 100").await, ["100,1616"]);

    // Aggregates over a run of primary keys are folded in the data nodes; the answers are the
    // ones the SQL node computes from the rows (`id + 0` hides the key from the planner).
    let plan = rows(&mut c, "EXPLAIN SELECT SUM(k) FROM t WHERE id BETWEEN 1 AND 100").await.join("\n");
    assert!(plan.contains("aggregates computed in the data nodes"), "{plan}");
    let plan = rows(&mut c, "EXPLAIN SELECT SUM(k) FROM t WHERE id + 0 BETWEEN 1 AND 100").await.join("\n");
    assert!(!plan.contains("aggregates computed"), "{plan}");
    let aggregates = [
        "COUNT(*), COUNT(k), SUM(k), AVG(k), MIN(k), MAX(k), COUNT(s)",
        "SUM(f), MAX(k), 7",
        "SUM(DISTINCT k), MIN(s)",
    ];
    for what in aggregates {
        for (lo, hi) in [(1, 100), (150, 260), (300, 400), (-5, 30)] {
            let a = rows(&mut c, &format!("SELECT {what} FROM t WHERE id BETWEEN {lo} AND {hi}")).await;
            let b = rows(&mut c, &format!("SELECT {what} FROM t WHERE id + 0 BETWEEN {lo} AND {hi}")).await;
            assert_eq!(a, b, "{what} over {lo}..{hi}");
        }
    }
    // In a transaction that has written, the rows are read (and show its own writes).
    c.query_drop("BEGIN").await.unwrap();
    let before = rows(&mut c, "SELECT SUM(k) FROM t WHERE id BETWEEN 1 AND 100").await;
    assert_eq!(before, ["1616"]);
    c.query_drop("UPDATE t SET k = k + 1000 WHERE id = 5").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT SUM(k) FROM t WHERE id BETWEEN 1 AND 100").await, ["2616"]);
    c.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT SUM(k) FROM t WHERE id BETWEEN 1 AND 100").await, ["1616"]);

    // ORDER BY … LIMIT walks an index in order and stops early; the answer is what sorting
    // everything gives (ties broken by id to make it unique).
    let plan = rows(&mut c, "EXPLAIN SELECT id FROM t ORDER BY k DESC LIMIT 5").await.join("\n");
    assert!(plan.contains("ordered scan of index k_idx") && plan.contains("stops after 5"), "{plan}");
    let plan = rows(&mut c, "EXPLAIN SELECT id FROM t ORDER BY k, id LIMIT 5").await.join("\n");
    assert!(plan.contains("ordered scan of index k_idx"), "entries sort by primary key after k: {plan}");
    let ordered = [
        ("SELECT id, k FROM t ORDER BY k, id LIMIT 7", "SELECT id, k FROM t ORDER BY k + 0, id LIMIT 7"),
        (
            "SELECT id, k FROM t ORDER BY k DESC LIMIT 3 OFFSET 2",
            "SELECT id, k FROM t ORDER BY k + 0 DESC LIMIT 3 OFFSET 2",
        ),
        (
            "SELECT id FROM t WHERE id > 20 ORDER BY id LIMIT 4",
            "SELECT id FROM t WHERE id > 20 ORDER BY id + 0 LIMIT 4",
        ),
        ("SELECT id FROM t ORDER BY id DESC LIMIT 4", "SELECT id FROM t ORDER BY id + 0 DESC LIMIT 4"),
        (
            "SELECT id FROM t WHERE s > 's050' ORDER BY id LIMIT 3",
            "SELECT id FROM t WHERE s > 's050' ORDER BY id + 0 LIMIT 3",
        ),
    ];
    for (indexed, sorted) in ordered {
        let a = rows(&mut c, indexed).await;
        // Ties in k come back in any order: compare the k column only for those.
        let b = rows(&mut c, sorted).await;
        let ks = |v: &[String]| v.iter().map(|r| r.rsplit(',').next().unwrap().to_string()).collect::<Vec<_>>();
        assert_eq!(ks(&a), ks(&b), "{indexed}");
        assert_eq!(a.len(), b.len());
    }

    // An index added to a loaded table, then kept up to date by writes.
    c.query_drop("CREATE INDEX f_idx ON t (f)").await.unwrap();
    c.query_drop("ALTER TABLE t ADD INDEX (s, k)").await.unwrap();
    c.query_drop("UPDATE t SET f = -100 WHERE id = 50").await.unwrap();
    c.query_drop("DELETE FROM t WHERE id = 51").await.unwrap();
    let plan = rows(&mut c, "EXPLAIN SELECT id FROM t WHERE f < -19").await.join("\n");
    assert!(plan.contains("range scan of index f_idx"), "{plan}");
    assert_eq!(rows(&mut c, "SELECT id FROM t WHERE f < -19.5 ORDER BY id").await, ["1", "50"]);
    assert_eq!(rows(&mut c, "SELECT id FROM t WHERE s = 's010' AND k = 30").await, ["130"]);
    assert_eq!(
        rows(&mut c, "SHOW INDEX FROM t")
            .await
            .iter()
            .map(|r| r.split(',').take(5).collect::<Vec<_>>().join(","))
            .collect::<Vec<_>>(),
        ["t,0,PRIMARY,1,id", "t,1,k_idx,1,k", "t,1,f_idx,1,f", "t,1,s,1,s", "t,1,s,2,k"]
    );
    let create = rows(&mut c, "SHOW CREATE TABLE t").await.join("\n");
    assert!(create.contains("KEY `k_idx` (`k`)") && create.contains("KEY `s` (`s`,`k`)"), "{create}");
    // MySQL's errors: duplicate key name, unknown column, unknown index, repeated values.
    assert_eq!(code_of(c.query_drop("CREATE INDEX k_idx ON t (s)").await), 1061);
    assert_eq!(code_of(c.query_drop("CREATE INDEX x ON t (nope)").await), 1072);
    assert_eq!(code_of(c.query_drop("DROP INDEX nope ON t").await), 1091);
    assert_eq!(code_of(c.query_drop("CREATE UNIQUE INDEX u ON t (s)").await), 1062);
    assert_eq!(code_of(c.query_drop("CREATE UNIQUE INDEX k_idx ON t (id)").await), 1061);
    c.query_drop("DROP INDEX k_idx ON t").await.unwrap();
    c.query_drop("ALTER TABLE t DROP INDEX f_idx").await.unwrap();
    let plan = rows(&mut c, "EXPLAIN SELECT id FROM t WHERE k BETWEEN 10 AND 12").await.join("\n");
    assert!(!plan.contains("k_idx"), "{plan}");
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM t WHERE k BETWEEN 10 AND 12").await, ["15"]);
    c.disconnect().await.unwrap();
}

/// ALTER TABLE ADD/DROP/MODIFY/CHANGE/RENAME COLUMN and SET/DROP DEFAULT (by copy, or in place
/// when only names and defaults change): rows converted,
/// indexes following their columns, writes from another session during the ALTER neither lost
/// nor failed, MySQL's errors; RENAME TABLE keeping rows and indexes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_table_adds_and_drops_columns() {
    let cluster = TestCluster::start_with_sql(2, 2, 1, 1);
    let opts = root_opts(&cluster).db_name(Some("alt"));
    let mut c = Conn::new(root_opts(&cluster)).await.expect("connect");
    c.query_drop("CREATE DATABASE alt").await.unwrap();
    c.query_drop("USE alt").await.unwrap();
    c.query_drop("CREATE TABLE a (id INT PRIMARY KEY, v INT, s VARCHAR(10), KEY v_idx (v))").await.unwrap();
    let values: Vec<String> = (1..=300).map(|i| format!("({i}, {}, 's{i}')", i % 17)).collect();
    c.query_drop(format!("INSERT INTO a VALUES {}", values.join(","))).await.unwrap();

    // Another session keeps inserting while the table is altered: every acknowledged row must
    // be there afterwards.
    let writer = tokio::spawn({
        let opts = opts.clone();
        async move {
            let mut w = Conn::new(opts).await.expect("connect");
            let mut done = vec![];
            for id in 1000..1060 {
                w.query_drop(format!("INSERT INTO a (id, v, s) VALUES ({id}, 1, 'w')"))
                    .await
                    .expect("insert during ALTER");
                done.push(id);
            }
            done
        }
    });
    c.query_drop("ALTER TABLE a ADD COLUMN n INT NOT NULL DEFAULT 7 AFTER id").await.unwrap();
    let done = writer.await.unwrap();
    // NOT NULL without DEFAULT: existing rows get the type's zero, as in MySQL.
    c.query_drop("ALTER TABLE a ADD COLUMN z VARCHAR(5), ADD COLUMN q BIGINT NOT NULL FIRST").await.unwrap();
    assert_eq!(
        rows(
            &mut c,
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_NAME = 'a' ORDER BY ORDINAL_POSITION"
        )
        .await,
        ["q", "id", "n", "v", "s", "z"]
    );
    assert_eq!(rows(&mut c, "SELECT q, id, n, v, s, z FROM a WHERE id = 5").await, ["0,5,7,5,s5,NULL"]);
    let ids = rows(&mut c, "SELECT id FROM a WHERE id >= 1000 ORDER BY id").await;
    assert_eq!(ids, done.iter().map(|i| i.to_string()).collect::<Vec<_>>(), "writes during the ALTER");
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM a WHERE id < 1000").await, ["300"]);
    // The index came along and still serves ranges.
    let plan = rows(&mut c, "EXPLAIN SELECT id FROM a WHERE v = 3").await.join("\n");
    assert!(plan.contains("index v_idx"), "{plan}");
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM a WHERE v = 3 AND id < 1000").await, ["18"]);

    // Dropping a column drops it from its indexes, and an index left empty.
    c.query_drop("ALTER TABLE a DROP COLUMN v").await.unwrap();
    assert_eq!(code_of(c.query_drop("SELECT v FROM a").await), 1054);
    assert!(!rows(&mut c, "SHOW INDEX FROM a").await.join("\n").contains("v_idx"));
    assert_eq!(rows(&mut c, "SELECT id, n, s FROM a WHERE id = 17").await, ["17,7,s17"]);
    // MySQL's errors, and a failed ALTER leaves the table writable.
    assert_eq!(code_of(c.query_drop("ALTER TABLE a ADD COLUMN n INT").await), 1060);
    assert_eq!(code_of(c.query_drop("ALTER TABLE a DROP COLUMN nope").await), 1091);
    assert_eq!(code_of(c.query_drop("ALTER TABLE a DROP COLUMN id").await), 1235);
    c.query_drop("INSERT INTO a (q, id, n, s) VALUES (1, 2000, 1, 'x')").await.unwrap();
    // A table without a primary key keeps its rows.
    c.query_drop("CREATE TABLE h (x INT, y INT)").await.unwrap();
    c.query_drop("INSERT INTO h VALUES (1, 2), (1, 2), (3, 4)").await.unwrap();
    c.query_drop("ALTER TABLE h DROP COLUMN y, ADD COLUMN w INT DEFAULT 9").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT x, w FROM h ORDER BY x").await, ["1,9", "1,9", "3,9"]);

    // MODIFY widens types, rows kept (each value converted as INSERT converts it).
    c.query_drop("CREATE TABLE m (id INT PRIMARY KEY, k INT, s VARCHAR(10), KEY k_idx (k), UNIQUE KEY s_u (s))")
        .await
        .unwrap();
    c.query_drop("INSERT INTO m VALUES (1, 10, 'one'), (2, 20, 'two'), (3, NULL, 'three'), (4, 40, NULL)")
        .await
        .unwrap();
    c.query_drop("ALTER TABLE m MODIFY k BIGINT, MODIFY COLUMN s VARCHAR(20)").await.unwrap();
    c.query_drop("UPDATE m SET k = 5000000000 WHERE id = 1").await.unwrap();
    c.query_drop("INSERT INTO m VALUES (5, 50, 'a string of 20 chars')").await.unwrap();
    let all = ["1,5000000000,one", "2,20,two", "3,NULL,three", "4,40,NULL", "5,50,a string of 20 chars"];
    assert_eq!(rows(&mut c, "SELECT id, k, s FROM m ORDER BY id").await, all);
    // Narrowing that some value does not fit fails as MySQL's ALTER does, changing nothing.
    let create = rows(&mut c, "SHOW CREATE TABLE m").await;
    assert!(create[0].contains("`k` bigint DEFAULT NULL") && create[0].contains("`s` varchar(20)"), "{create:?}");
    assert_eq!(code_of(c.query_drop("ALTER TABLE m MODIFY s VARCHAR(3)").await), 1265);
    assert_eq!(code_of(c.query_drop("ALTER TABLE m MODIFY k INT").await), 1264);
    assert_eq!(code_of(c.query_drop("ALTER TABLE m MODIFY s INT, ADD COLUMN z INT").await), 1366);
    assert_eq!(code_of(c.query_drop("ALTER TABLE m MODIFY k BIGINT NOT NULL").await), 1138);
    assert_eq!(code_of(c.query_drop("ALTER TABLE m MODIFY nope INT").await), 1054);
    assert_eq!(code_of(c.query_drop("ALTER TABLE m MODIFY k INT AUTO_INCREMENT").await), 1235);
    assert_eq!(rows(&mut c, "SHOW CREATE TABLE m").await, create);
    assert_eq!(rows(&mut c, "SELECT id, k, s FROM m ORDER BY id").await, all);
    c.query_drop("INSERT INTO m VALUES (6, 60, 'six')").await.unwrap();
    // The primary key's type changes when its values convert; it stays the key.
    c.query_drop("ALTER TABLE m MODIFY id BIGINT").await.unwrap();
    let plan = rows(&mut c, "EXPLAIN SELECT s FROM m WHERE id = 3").await.join("\n");
    assert!(plan.contains("primary key read"), "{plan}");
    assert_eq!(rows(&mut c, "SELECT s FROM m WHERE id = 3").await, ["three"]);
    // CHANGE renames a column: its index and the primary key follow.
    c.query_drop("ALTER TABLE m CHANGE k kk BIGINT, CHANGE COLUMN id mid BIGINT").await.unwrap();
    let index = rows(&mut c, "SHOW INDEX FROM m").await;
    let index: Vec<String> = index.iter().map(|r| r.split(',').take(5).collect::<Vec<_>>().join(",")).collect();
    assert_eq!(index, ["m,0,PRIMARY,1,mid", "m,1,k_idx,1,kk", "m,0,s_u,1,s"]);
    let plan = rows(&mut c, "EXPLAIN SELECT mid FROM m WHERE kk = 20").await.join("\n");
    assert!(plan.contains("index k_idx"), "{plan}");
    assert_eq!(rows(&mut c, "SELECT mid FROM m WHERE kk = 20").await, ["2"]);
    assert_eq!(rows(&mut c, "SELECT s FROM m WHERE mid = 2").await, ["two"]);
    assert_eq!(code_of(c.query_drop("SELECT k FROM m").await), 1054);
    assert_eq!(code_of(c.query_drop("ALTER TABLE m CHANGE kk s INT").await), 1060);
    // RENAME COLUMN keeps the definition; the unique index goes along and holds.
    c.query_drop("ALTER TABLE m RENAME COLUMN s TO label").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT mid FROM m WHERE label = 'two'").await, ["2"]);
    assert_eq!(code_of(c.query_drop("INSERT INTO m (mid, label) VALUES (7, 'one')").await), 1062);
    // SET / DROP DEFAULT change the default only.
    c.query_drop("ALTER TABLE m ALTER COLUMN kk SET DEFAULT 77").await.unwrap();
    let create = rows(&mut c, "SHOW CREATE TABLE m").await.join("\n");
    assert!(create.contains("`kk` bigint DEFAULT 77"), "{create}");
    c.query_drop("INSERT INTO m (mid, label) VALUES (10, 'ten')").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT kk FROM m WHERE mid IN (2, 10) ORDER BY mid").await, ["20", "77"]);
    c.query_drop("ALTER TABLE m ALTER kk DROP DEFAULT").await.unwrap();
    let create = rows(&mut c, "SHOW CREATE TABLE m").await.join("\n");
    assert!(create.contains("`kk` bigint DEFAULT NULL"), "{create}");
    c.query_drop("INSERT INTO m (mid, label) VALUES (11, 'eleven')").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT kk FROM m WHERE mid = 11").await, ["NULL"]);
    // Several operations in one ALTER; a NOT NULL column without default then needs a value.
    c.query_drop(
        "ALTER TABLE m ADD COLUMN w INT NOT NULL DEFAULT 1, ALTER COLUMN w DROP DEFAULT, DROP INDEX k_idx, \
         MODIFY label VARCHAR(30) AFTER mid",
    )
    .await
    .unwrap();
    assert_eq!(rows(&mut c, "SELECT mid, label, kk, w FROM m WHERE mid = 1").await, ["1,one,5000000000,1"]);
    assert_eq!(code_of(c.query_drop("INSERT INTO m (mid, label) VALUES (12, 'twelve')").await), 1364);
    assert!(!rows(&mut c, "SHOW INDEX FROM m").await.join("\n").contains("k_idx"));

    // RENAME TABLE moves names only: rows, indexes and the unique index's entries stay.
    let count = rows(&mut c, "SELECT COUNT(*) FROM m").await;
    c.query_drop("RENAME TABLE m TO m2").await.unwrap();
    assert_eq!(code_of(c.query_drop("SELECT * FROM m").await), 1146);
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM m2").await, count);
    assert_eq!(code_of(c.query_drop("INSERT INTO m2 (mid, label, w) VALUES (20, 'two', 0)").await), 1062);
    assert_eq!(rows(&mut c, "SELECT mid FROM m2 WHERE label = 'three'").await, ["3"]);
    // Into another database, and back with another table in one statement.
    c.query_drop("CREATE DATABASE alt2").await.unwrap();
    c.query_drop("ALTER TABLE m2 RENAME TO alt2.m3").await.unwrap();
    assert_eq!(rows(&mut c, "SHOW TABLES FROM alt2").await, ["m3"]);
    assert_eq!(code_of(c.query_drop("INSERT INTO alt2.m3 (mid, label, w) VALUES (21, 'one', 0)").await), 1062);
    c.query_drop("ALTER TABLE alt2.m3 ADD COLUMN extra INT").await.unwrap();
    c.query_drop("RENAME TABLE alt2.m3 TO m, h TO h2").await.unwrap();
    assert_eq!(code_of(c.query_drop("INSERT INTO m (mid, label, w) VALUES (22, 'ten', 0)").await), 1062);
    c.query_drop("INSERT INTO m (mid, label, w) VALUES (22, 'new', 0)").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT x FROM h2 ORDER BY x").await, ["1", "1", "3"]);
    // A swap through a free name.
    c.query_drop("RENAME TABLE m TO tmp, h2 TO m, tmp TO h2").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM m").await, ["3"]);
    assert_eq!(rows(&mut c, "SELECT label FROM h2 WHERE mid = 22").await, ["new"]);
    // MySQL's errors: a missing source, a taken target, a missing database; nothing changes.
    assert_eq!(message_of(c.query_drop("RENAME TABLE nope TO x").await), "1146 Table 'alt.nope' doesn't exist");
    assert_eq!(message_of(c.query_drop("RENAME TABLE m TO x, h2 TO a").await), "1050 Table 'a' already exists");
    assert_eq!(code_of(c.query_drop("ALTER TABLE m RENAME TO h2").await), 1050);
    assert_eq!(code_of(c.query_drop("ALTER TABLE m ADD COLUMN y INT, RENAME TO h2").await), 1050);
    assert_eq!(code_of(c.query_drop("ALTER TABLE nope RENAME TO x").await), 1146);
    assert_eq!(code_of(c.query_drop("RENAME TABLE m TO nodb.m").await), 1049);
    assert_eq!(code_of(c.query_drop("SELECT * FROM x").await), 1146);
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM m").await, ["3"]);
    assert_eq!(code_of(c.query_drop("SELECT y FROM m").await), 1054);
    // RENAME INDEX changes the name only: the unique index holds under its new one.
    c.query_drop("ALTER TABLE h2 RENAME INDEX s_u TO label_u").await.unwrap();
    let index = rows(&mut c, "SHOW INDEX FROM h2").await.join("\n");
    assert!(index.contains("label_u") && !index.contains("s_u"), "{index}");
    let dup = message_of(c.query_drop("INSERT INTO h2 (mid, label, w) VALUES (23, 'new', 0)").await);
    assert!(dup.starts_with("1062 ") && dup.contains("label_u"), "{dup}");
    c.query_drop("CREATE INDEX w_idx ON h2 (w)").await.unwrap();
    c.query_drop("ALTER TABLE h2 RENAME KEY LABEL_U TO label_u").await.unwrap();
    assert_eq!(code_of(c.query_drop("ALTER TABLE h2 RENAME INDEX nope TO x").await), 1176);
    assert_eq!(code_of(c.query_drop("ALTER TABLE h2 RENAME INDEX label_u TO w_idx").await), 1061);
    assert_eq!(code_of(c.query_drop("ALTER TABLE h2 RENAME INDEX label_u TO `PRIMARY`").await), 1280);
    // Forms not there yet: a clear 1235, and the connection goes on.
    assert_eq!(code_of(c.query_drop("ALTER TABLE h2 RENAME INDEX label_u TO s2, ADD COLUMN q INT").await), 1235);
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM m").await, ["3"]);

    // ADD / DROP PRIMARY KEY copy the rows under the new key (or a hidden one).
    c.query_drop("CREATE TABLE pk (a INT, b VARCHAR(5))").await.unwrap();
    c.query_drop("INSERT INTO pk VALUES (1, 'x'), (2, 'y'), (2, 'z')").await.unwrap();
    assert_eq!(code_of(c.query_drop("ALTER TABLE pk ADD PRIMARY KEY (a)").await), 1062);
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM pk").await, ["3"], "a failed ALTER leaves the table");
    c.query_drop("ALTER TABLE pk ADD PRIMARY KEY (a, b)").await.unwrap();
    let create = rows(&mut c, "SHOW CREATE TABLE pk").await.join("\n");
    assert!(create.contains("PRIMARY KEY (`a`,`b`)") && create.contains("`a` int NOT NULL"), "{create}");
    assert_eq!(code_of(c.query_drop("INSERT INTO pk VALUES (2, 'z')").await), 1062);
    assert_eq!(rows(&mut c, "SELECT b FROM pk WHERE a = 2 AND b = 'y'").await, ["y"]);
    assert_eq!(code_of(c.query_drop("ALTER TABLE pk ADD PRIMARY KEY (b)").await), 1068);
    c.query_drop("ALTER TABLE pk DROP PRIMARY KEY").await.unwrap();
    c.query_drop("INSERT INTO pk VALUES (2, 'z')").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM pk WHERE a = 2").await, ["3"]);
    assert_eq!(code_of(c.query_drop("ALTER TABLE pk DROP PRIMARY KEY").await), 1091);
    // The old key's columns stay NOT NULL, as in MySQL.
    assert_eq!(code_of(c.query_drop("INSERT INTO pk VALUES (3, NULL)").await), 1048);
    c.query_drop("CREATE TABLE pn (a INT, b INT)").await.unwrap();
    c.query_drop("INSERT INTO pn VALUES (1, NULL)").await.unwrap();
    assert_eq!(code_of(c.query_drop("ALTER TABLE pn ADD PRIMARY KEY (b)").await), 1138);
    c.query_drop("CREATE TABLE ai (id INT AUTO_INCREMENT PRIMARY KEY, v INT)").await.unwrap();
    assert_eq!(code_of(c.query_drop("ALTER TABLE ai DROP PRIMARY KEY").await), 1075);
    c.disconnect().await.unwrap();
}

fn message_of<T: std::fmt::Debug>(r: Result<T, mysql_async::Error>) -> String {
    match r {
        Err(mysql_async::Error::Server(e)) => format!("{} {}", e.code, e.message),
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_indexes_hold_across_sql_nodes() {
    let cluster = TestCluster::start_with_sql(2, 2, 1, 2);
    let mut c = Conn::new(root_opts(&cluster)).await.expect("connect");
    c.query_drop("CREATE DATABASE uq").await.unwrap();
    c.query_drop("USE uq").await.unwrap();
    c.query_drop(
        "CREATE TABLE u (id INT PRIMARY KEY, email VARCHAR(40) UNIQUE, a INT, b DOUBLE, UNIQUE KEY ab (a, b))",
    )
    .await
    .unwrap();
    c.query_drop("INSERT INTO u VALUES (1, 'x@a', 1, 1.5), (2, 'y@a', 1, 2.5), (3, NULL, NULL, 1.5)").await.unwrap();
    // A taken value: MySQL's 1062 naming the key; a multi-row INSERT is all or nothing.
    let dup = c.query_drop("INSERT INTO u VALUES (10, 'z@a', 5, 0), (11, 'x@a', 6, 0)").await;
    assert_eq!(message_of(dup), "1062 Duplicate entry 'x@a' for key 'u.email'");
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM u").await, ["3"]);
    let dup = c.query_drop("INSERT INTO u VALUES (12, NULL, 1, 2.5)").await;
    assert_eq!(message_of(dup), "1062 Duplicate entry '1-2.5' for key 'u.ab'");
    // NULLs never collide; -0 and +0 are one value.
    c.query_drop("INSERT INTO u VALUES (4, NULL, NULL, 1.5), (5, NULL, 7, 0)").await.unwrap();
    assert_eq!(code_of(c.query_drop("INSERT INTO u VALUES (6, NULL, 7, -0.0)").await), 1062);
    // INSERT IGNORE skips the row that collides.
    c.query_drop("INSERT IGNORE INTO u VALUES (7, 'x@a', 8, 0), (8, 'w@a', 8, 1)").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT id FROM u WHERE id >= 7").await, ["8"]);
    // UPDATE: onto a taken value fails and changes nothing; a freed value is free.
    assert_eq!(code_of(c.query_drop("UPDATE u SET email = 'y@a' WHERE id = 1").await), 1062);
    assert_eq!(rows(&mut c, "SELECT email FROM u WHERE id = 1").await, ["x@a"]);
    c.query_drop("UPDATE u SET email = 'x2@a' WHERE id = 1").await.unwrap();
    c.query_drop("INSERT INTO u (id, email) VALUES (20, 'x@a')").await.unwrap();
    // DELETE frees the value.
    c.query_drop("DELETE FROM u WHERE id = 20").await.unwrap();
    c.query_drop("INSERT INTO u (id, email) VALUES (21, 'x@a')").await.unwrap();
    // ON DUPLICATE KEY UPDATE updates the row holding the unique value; REPLACE removes it.
    c.query_drop("INSERT INTO u (id, email, a) VALUES (30, 'y@a', 0) ON DUPLICATE KEY UPDATE a = 99").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT id, a FROM u WHERE email = 'y@a'").await, ["2,99"]);
    c.query_drop("REPLACE INTO u (id, email) VALUES (31, 'y@a')").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT id FROM u WHERE email = 'y@a'").await, ["31"]);
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM u WHERE id = 2").await, ["0"]);
    c.query_drop("INSERT INTO u (id, a, b) VALUES (32, 1, 2.5)").await.unwrap();
    // Equality on a unique key reads its entry, then the row: two single-partition reads.
    let plan = rows(&mut c, "EXPLAIN SELECT id FROM u WHERE email = 'x@a'").await.join("\n");
    assert!(plan.contains("unique key read of index email"), "{plan}");
    assert_eq!(rows(&mut c, "SELECT id FROM u WHERE email = 'x@a'").await, ["21"]);
    assert!(rows(&mut c, "SELECT id FROM u WHERE email = 'nobody'").await.is_empty());
    c.query_drop("UPDATE u SET a = 5 WHERE email = 'x@a'").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT a FROM u WHERE id = 21").await, ["5"]);
    // Shown as MySQL shows it; the hidden tables are not tables anyone sees.
    let create = rows(&mut c, "SHOW CREATE TABLE u").await.join("\n");
    assert!(
        create.contains("UNIQUE KEY `email` (`email`)") && create.contains("UNIQUE KEY `ab` (`a`,`b`)"),
        "{create}"
    );
    assert_eq!(rows(&mut c, "SHOW TABLES").await, ["u"]);

    // An uncommitted value holds its slot: another SQL node's writer waits for the outcome.
    let mut other = Conn::new(
        OptsBuilder::from_opts(root_opts(&cluster))
            .tcp_port(cluster.mysql_addrs[1].rsplit_once(':').unwrap().1.parse().unwrap())
            .db_name(Some("uq")),
    )
    .await
    .expect("connect to the second SQL node");
    c.query_drop("BEGIN").await.unwrap();
    c.query_drop("INSERT INTO u (id, email) VALUES (40, 'held@a')").await.unwrap();
    let waiter = tokio::spawn(async move {
        let r = other.query_drop("INSERT INTO u (id, email) VALUES (41, 'held@a')").await;
        (other, r)
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    c.query_drop("ROLLBACK").await.unwrap();
    let (mut other, r) = waiter.await.unwrap();
    r.expect("the value is free once the holder rolled back");

    // Many writers on two SQL nodes race for 40 values: each is taken exactly once.
    let mut tasks = vec![];
    for w in 0..8u32 {
        let addr = cluster.mysql_addrs[(w % 2) as usize].clone();
        let opts = OptsBuilder::from_opts(root_opts(&cluster))
            .tcp_port(addr.rsplit_once(':').unwrap().1.parse().unwrap())
            .db_name(Some("uq"));
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(opts).await.expect("connect");
            let mut won = 0u32;
            for i in 0..40u32 {
                let v = (i * 7 + w * 3) % 40;
                let id = 1000 + w * 100 + i;
                match conn.query_drop(format!("INSERT INTO u (id, email) VALUES ({id}, 'race{v}')")).await {
                    Ok(()) => won += 1,
                    Err(mysql_async::Error::Server(e)) if e.code == 1062 || e.code == 1205 => {}
                    Err(e) => panic!("writer {w}: {e}"),
                }
            }
            won
        }));
    }
    let mut won = 0;
    for t in tasks {
        won += t.await.unwrap();
    }
    let taken = rows(&mut other, "SELECT COUNT(*), COUNT(DISTINCT email) FROM u WHERE email LIKE 'race%'").await;
    assert_eq!(taken, [format!("{won},{won}")]);
    assert!(won <= 40);

    // CREATE UNIQUE INDEX checks the rows there (and fails on a repeated value, leaving no
    // index behind); once built, it holds.
    c.query_drop("CREATE TABLE v (id INT PRIMARY KEY, k INT, f FLOAT)").await.unwrap();
    c.query_drop("INSERT INTO v VALUES (1, 1, 0.5), (2, 2, 0.5), (3, NULL, 1.5), (4, NULL, 2.5)").await.unwrap();
    let dup = c.query_drop("CREATE UNIQUE INDEX f_u ON v (f)").await;
    assert_eq!(message_of(dup), "1062 Duplicate entry '0.5' for key 'v.f_u'");
    assert!(!rows(&mut c, "SHOW INDEX FROM v").await.join("\n").contains("f_u"));
    c.query_drop("INSERT INTO v VALUES (5, 5, 0.5)").await.unwrap();
    c.query_drop("CREATE UNIQUE INDEX k_u ON v (k)").await.unwrap();
    assert!(rows(&mut c, "SHOW INDEX FROM v").await.join("\n").contains("v,0,k_u,1,k"));
    assert_eq!(code_of(c.query_drop("INSERT INTO v VALUES (6, 2, 9)").await), 1062);
    // The second SQL node learns of the index through the table swap.
    assert_eq!(code_of(other.query_drop("INSERT INTO v VALUES (7, 1, 9)").await), 1062);
    c.query_drop("INSERT INTO v VALUES (6, NULL, 9)").await.unwrap();
    c.query_drop("ALTER TABLE v ADD UNIQUE (id, f)").await.unwrap();
    assert_eq!(code_of(c.query_drop("INSERT INTO v VALUES (9, 1, 9)").await), 1062, "k_u survives the copy");
    // DROP INDEX lifts the constraint.
    c.query_drop("DROP INDEX k_u ON v").await.unwrap();
    c.query_drop("INSERT INTO v VALUES (8, 2, 9)").await.unwrap();
    assert_eq!(rows(&mut c, "SELECT COUNT(*) FROM v WHERE k = 2").await, ["2"]);
    // A unique prefix (`s(2)`) makes the prefix unique; a plain index ignores its prefix.
    c.query_drop("CREATE TABLE p (id INT PRIMARY KEY, s VARCHAR(20), UNIQUE KEY s2 (s(2)), KEY s3 (s(3)))")
        .await
        .unwrap();
    c.query_drop("INSERT INTO p VALUES (1, 'abc'), (2, 'x'), (3, NULL)").await.unwrap();
    let dup = c.query_drop("INSERT INTO p VALUES (4, 'abd')").await;
    assert_eq!(message_of(dup), "1062 Duplicate entry 'ab' for key 'p.s2'");
    assert_eq!(rows(&mut c, "SELECT id FROM p WHERE s = 'abc'").await, ["1"]);
    assert!(rows(&mut c, "SELECT id FROM p WHERE s = 'abz'").await.is_empty());
    let create = rows(&mut c, "SHOW CREATE TABLE p").await.join("\n");
    assert!(create.contains("UNIQUE KEY `s2` (`s`(2))") && create.contains("KEY `s3` (`s`(3))"), "{create}");
    assert_eq!(code_of(c.query_drop("CREATE INDEX bad ON p (id(2))").await), 1089);
    c.query_drop("ALTER TABLE p ADD COLUMN n INT").await.unwrap();
    assert_eq!(code_of(c.query_drop("INSERT INTO p (id, s) VALUES (5, 'abe')").await), 1062, "after a copy");
    c.query_drop("DROP TABLE u, v, p").await.unwrap();
    other.disconnect().await.unwrap();
    c.disconnect().await.unwrap();
}

/// Prepared point selects skip the planner (`sqlnode/src/point.rs`); their answers must not
/// change for it, also when the table, the database or the parameter's type changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_point_selects_follow_schema_changes() {
    let cluster = TestCluster::start_with_sql(1, 2, 1, 1);
    let mut c = Conn::new(root_opts(&cluster)).await.expect("connect");
    for db in ["ps", "ps2"] {
        c.query_drop(format!("CREATE DATABASE {db}")).await.unwrap();
        c.query_drop(format!("CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(10), d DECIMAL(5,2))")).await.unwrap();
    }
    c.query_drop("INSERT INTO ps.t VALUES (1, 'a', 1.5), (2, NULL, NULL)").await.unwrap();
    c.query_drop("INSERT INTO ps2.t VALUES (1, 'other', 9)").await.unwrap();
    c.query_drop("USE ps").await.unwrap();
    let q = "SELECT v, d FROM t WHERE id = ?";
    type Row = (Option<String>, Option<String>);
    let one = |v: &str, d: &str| Some((Some(v.to_string()), Some(d.to_string())));
    assert_eq!(c.exec_first::<Row, _, _>(q, (1,)).await.unwrap(), one("a", "1.50"));
    assert_eq!(c.exec_first::<Row, _, _>(q, (2,)).await.unwrap(), Some((None, None)));
    assert_eq!(c.exec_first::<Row, _, _>(q, ("1",)).await.unwrap(), one("a", "1.50"), "a string parameter");
    assert_eq!(c.exec_first::<Row, _, _>(q, (1.5,)).await.unwrap(), None);
    assert_eq!(c.exec_first::<Row, _, _>(q, (999,)).await.unwrap(), None);
    assert_eq!(c.exec_first::<Row, _, _>(q, (mysql_async::Value::NULL,)).await.unwrap(), None);
    // Writes show; ALTER TABLE swaps in a new table (new id, new layout).
    c.query_drop("UPDATE t SET v = 'b' WHERE id = 1").await.unwrap();
    assert_eq!(c.exec_first::<Row, _, _>(q, (1,)).await.unwrap(), one("b", "1.50"));
    c.query_drop("ALTER TABLE t ADD COLUMN z INT FIRST").await.unwrap();
    assert_eq!(c.exec_first::<Row, _, _>(q, (1,)).await.unwrap(), one("b", "1.50"));
    // Another current database: the unqualified name means another table.
    c.query_drop("USE ps2").await.unwrap();
    assert_eq!(c.exec_first::<Row, _, _>(q, (1,)).await.unwrap(), one("other", "9.00"));
    c.query_drop("DROP TABLE ps2.t").await.unwrap();
    assert_eq!(code_of(c.exec_first::<Row, _, _>(q, (1,)).await), 1146);
    c.disconnect().await.unwrap();
}

/// Connections share what PREPARE made of a text (`Shared::prepared` in the SQL node): a statement
/// prepared again after a schema change, or in another current database, must announce the
/// columns it will return, not those of an earlier connection's PREPARE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prepared_statements_follow_schema_changes_and_databases() {
    let cluster = TestCluster::start_with_sql(1, 2, 1, 1);
    let connect = |db: &'static str| {
        let opts = root_opts(&cluster).db_name(Some(db));
        async move { Conn::new(opts).await.expect("connect") }
    };
    let mut admin = Conn::new(root_opts(&cluster)).await.expect("connect");
    for (db, cols) in [("sp1", "id INT PRIMARY KEY, v VARCHAR(10)"), ("sp2", "id INT PRIMARY KEY, a INT, b INT, c INT")]
    {
        admin.query_drop(format!("CREATE DATABASE {db}")).await.unwrap();
        admin.query_drop(format!("CREATE TABLE {db}.t ({cols})")).await.unwrap();
    }
    admin.query_drop("INSERT INTO sp1.t VALUES (1, 'x')").await.unwrap();
    admin.query_drop("INSERT INTO sp2.t VALUES (1, 2, 3, 4)").await.unwrap();
    let q = "SELECT * FROM t WHERE id = ?";
    let names = |s: &mysql_async::Statement| s.columns().iter().map(|c| c.name_str().into_owned()).collect::<Vec<_>>();

    let (mut a, mut b) = (connect("sp1").await, connect("sp1").await);
    for c in [&mut a, &mut b] {
        let stmt = c.prep(q).await.unwrap();
        assert_eq!(names(&stmt), ["id", "v"]);
        assert_eq!(text_rows(c.exec(&stmt, (1,)).await.unwrap()), ["1,x"]);
    }
    admin.query_drop("ALTER TABLE sp1.t ADD COLUMN w INT").await.unwrap();
    let mut after = connect("sp1").await;
    let stmt = after.prep(q).await.unwrap();
    assert_eq!(names(&stmt), ["id", "v", "w"], "prepared after ALTER TABLE");
    assert_eq!(text_rows(after.exec(&stmt, (1,)).await.unwrap()), ["1,x,NULL"]);
    let mut other = connect("sp2").await;
    let stmt = other.prep(q).await.unwrap();
    assert_eq!(names(&stmt), ["id", "a", "b", "c"], "the same text in another database");
    assert_eq!(text_rows(other.exec(&stmt, (1,)).await.unwrap()), ["1,2,3,4"]);
    for c in [a, b, after, other, admin] {
        c.disconnect().await.unwrap();
    }
}

/// The binary protocol's rows of `sql` prepared and run with `params`, as [`text_rows`].
async fn exec_rows(c: &mut Conn, sql: &str, params: mysql_async::Params) -> Vec<String> {
    text_rows(c.exec(sql, params).await.unwrap_or_else(|e| panic!("{sql}: {e}")))
}

/// Prepared statements other than point selects are parsed once, at PREPARE, and bind each
/// placeholder to its value at every execution (`Prepared::parsed` in the SQL node): each must
/// answer as the statement with the values written into it does, execution after execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_answer_as_their_literal_forms() {
    use mysql_async::Value::NULL;
    let cluster = TestCluster::start_with_sql(1, 2, 1, 1);
    let mut c = Conn::new(root_opts(&cluster)).await.expect("connect");
    c.query_drop("CREATE DATABASE pp").await.unwrap();
    c.query_drop("USE pp").await.unwrap();
    c.query_drop("CREATE TABLE t (id INT PRIMARY KEY, k INT, c VARCHAR(20), d DECIMAL(6,2), KEY (k))").await.unwrap();
    c.query_drop(
        "INSERT INTO t VALUES (1, 10, 'a', 1.50), (2, 20, 'it''s', -2.25), (3, 20, NULL, NULL), (4, -5, 'é?', 0)",
    )
    .await
    .unwrap();
    let cases: Vec<(&str, mysql_async::Params, &str)> = vec![
        (
            "SELECT c FROM t WHERE id BETWEEN ? AND ? ORDER BY id",
            (2, 4).into(),
            "SELECT c FROM t WHERE id BETWEEN 2 AND 4 ORDER BY id",
        ),
        (
            "SELECT id, d FROM t\n WHERE k IN (?, ?) AND c LIKE ? -- a ? in a comment\n ORDER BY id DESC LIMIT ?",
            (20, -5, "%", 2).into(),
            "SELECT id, d FROM t WHERE k IN (20, -5) AND c LIKE '%' ORDER BY id DESC LIMIT 2",
        ),
        (
            "SELECT SUM(k), COUNT(*) FROM t WHERE id > ? AND c = ?",
            (0, "it's").into(),
            "SELECT SUM(k), COUNT(*) FROM t WHERE id > 0 AND c = 'it''s'",
        ),
        ("SELECT id FROM t WHERE k = -?", (5,).into(), "SELECT id FROM t WHERE k = -5"),
        ("SELECT id FROM t WHERE c = ?", (NULL,).into(), "SELECT id FROM t WHERE c = NULL"),
        ("SELECT id FROM t WHERE c <=> ?", (NULL,).into(), "SELECT id FROM t WHERE c <=> NULL"),
        (
            "SELECT 'é?', id, d * ? FROM t WHERE id = ? + ?",
            ("2", 1u64, 1).into(),
            "SELECT 'é?', id, d * '2' FROM t WHERE id = 1 + 1",
        ),
        (
            "SELECT DISTINCT k FROM t WHERE id IN (SELECT id FROM t WHERE k > ?) ORDER BY k",
            (15,).into(),
            "SELECT DISTINCT k FROM t WHERE id IN (SELECT id FROM t WHERE k > 15) ORDER BY k",
        ),
    ];
    for (prepared, params, literal) in cases {
        let want = rows(&mut c, literal).await;
        assert!(!want.is_empty() || prepared.contains("c = ?"), "{literal} answers nothing");
        assert_eq!(exec_rows(&mut c, prepared, params).await, want, "{prepared}");
    }

    // Writes.
    c.exec_drop(
        "INSERT INTO t (id, k, c, d) VALUES (?, ?, ?, ?), (?, ?, ?, ?)",
        (5, 50, "five", "5.5", 6, 60, NULL, NULL),
    )
    .await
    .unwrap();
    c.exec_drop("UPDATE t SET k = k + ?, c = ? WHERE id = ?", (1, "x'y", 5)).await.unwrap();
    assert_eq!(rows(&mut c, "SELECT * FROM t WHERE id >= 5 ORDER BY id").await, ["5,51,x'y,5.50", "6,60,NULL,NULL"]);
    c.exec_drop("DELETE FROM t WHERE k >= ? ORDER BY id LIMIT ?", (51, 1)).await.unwrap();
    assert_eq!(c.affected_rows(), 1);
    assert_eq!(rows(&mut c, "SELECT id FROM t WHERE id >= 5").await, ["6"]);

    // One statement executed again takes the new values; nothing of the last execution stays.
    let stmt = c.prep("SELECT c FROM t WHERE id = ? OR k = ? ORDER BY id").await.unwrap();
    assert_eq!(exec_rows(&mut c, "SELECT c FROM t WHERE id = ? OR k = ? ORDER BY id", (1, 0).into()).await, ["a"]);
    let again: Vec<Option<String>> = c.exec(&stmt, (2, 20)).await.unwrap();
    assert_eq!(again, [Some("it's".to_string()), None]);
    let again: Vec<Option<String>> = c.exec(&stmt, (4, -1)).await.unwrap();
    assert_eq!(again, [Some("é?".to_string())]);

    // `SELECT ?` names its column `?`, as MySQL does; a `?` in a plain query is no placeholder.
    let mut r = c.exec_iter("SELECT ?, id FROM t WHERE id = ?", ("v", 1)).await.unwrap();
    let names: Vec<String> = r.columns().unwrap().iter().map(|c| c.name_str().into_owned()).collect();
    assert_eq!(names, ["?", "id"]);
    let got: Vec<(String, i64)> = r.collect().await.unwrap();
    assert_eq!(got, [("v".to_string(), 1)]);
    assert_eq!(code_of(c.query_drop("SELECT id FROM t WHERE id = ?").await), 1064);
    // Statements that are no query or DML still run prepared (the values written in).
    c.exec_drop("CREATE TABLE u (a INT PRIMARY KEY, b INT DEFAULT 7)", ()).await.unwrap();
    c.exec_drop("INSERT INTO u (a) SELECT id FROM t WHERE k > ?", (15,)).await.unwrap();
    assert_eq!(rows(&mut c, "SELECT a, b FROM u ORDER BY a").await, ["2,7", "3,7", "6,7"]);
    c.disconnect().await.unwrap();
}

/// Root on the cluster's SQL node `i`.
fn root_opts_at(cluster: &TestCluster, i: usize) -> OptsBuilder {
    let (host, port) = cluster.mysql_addrs[i].rsplit_once(':').unwrap();
    OptsBuilder::default()
        .ip_or_hostname(host.to_string())
        .tcp_port(port.parse().unwrap())
        .user(Some("root"))
        .prefer_socket(false)
}

/// Triggers created through one SQL node fire for statements on another, row by row, inside
/// the statement's transaction: a failing trigger takes the whole statement back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_fire_for_each_row_on_every_sql_node() {
    let cluster = TestCluster::start_with_sql(1, 2, 1, 2);
    let mut a = Conn::new(root_opts_at(&cluster, 0)).await.expect("connect");
    for sql in [
        "CREATE DATABASE tg",
        "USE tg",
        "CREATE TABLE acct (id INT PRIMARY KEY, bal INT NOT NULL, name VARCHAR(20))",
        "CREATE TABLE audit (id INT AUTO_INCREMENT PRIMARY KEY, what VARCHAR(10), acct INT, oldbal INT, newbal INT)",
        "CREATE TABLE counts (what VARCHAR(10) PRIMARY KEY, n INT)",
        "INSERT INTO counts VALUES ('audit', 0)",
        "CREATE TRIGGER acct_bi BEFORE INSERT ON acct FOR EACH ROW BEGIN\n\
           IF NEW.bal < 0 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'negative balance'; END IF;\n\
           SET NEW.name = UPPER(NEW.name);\n\
         END",
        "CREATE TRIGGER acct_ai AFTER INSERT ON acct FOR EACH ROW \
         INSERT INTO audit (what, acct, newbal) VALUES ('insert', NEW.id, NEW.bal)",
        "CREATE DEFINER = CURRENT_USER TRIGGER acct_au AFTER UPDATE ON acct FOR EACH ROW \
         INSERT INTO audit (what, acct, oldbal, newbal) VALUES ('update', NEW.id, OLD.bal, NEW.bal)",
        "CREATE TRIGGER tg.acct_bd BEFORE DELETE ON tg.acct FOR EACH ROW \
         INSERT INTO audit (what, acct, oldbal) VALUES ('delete', OLD.id, OLD.bal);",
        // A trigger's write fires the written table's own triggers.
        "CREATE TRIGGER audit_ai AFTER INSERT ON audit FOR EACH ROW UPDATE counts SET n = n + 1 WHERE what = 'audit'",
    ] {
        a.query_drop(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    // The other SQL node learns of the triggers from the cluster map.
    let mut b = Conn::new(root_opts_at(&cluster, 1)).await.expect("connect");
    b.query_drop("USE tg").await.unwrap();
    let mut shown = 0;
    for _ in 0..50 {
        shown = b.query::<mysql_async::Row, _>("SHOW TRIGGERS").await.unwrap().len();
        if shown == 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(shown, 5);
    b.query_drop("INSERT INTO acct VALUES (1, 100, 'ann'), (2, 50, 'bob')").await.unwrap();
    assert_eq!(rows(&mut b, "SELECT * FROM acct ORDER BY id").await, ["1,100,ANN", "2,50,BOB"]);
    // The second row's BEFORE trigger fails: the first row and its audit row go too.
    let e = b.query_drop("INSERT INTO acct VALUES (3, 10, 'cy'), (4, -1, 'dee')").await.unwrap_err();
    match e {
        mysql_async::Error::Server(e) => {
            assert_eq!((e.code, e.state.as_str(), e.message.as_str()), (1644, "45000", "negative balance"))
        }
        other => panic!("{other}"),
    }
    assert_eq!(rows(&mut b, "SELECT COUNT(*) FROM acct").await, ["2"]);
    // UPDATE and DELETE by primary key, also as prepared statements (their key fast paths
    // must not skip the triggers).
    b.exec_drop("UPDATE acct SET bal = bal + ? WHERE id = ?", (5, 1)).await.unwrap();
    b.query_drop("UPDATE acct SET bal = bal * 2").await.unwrap();
    b.exec_drop("DELETE FROM acct WHERE id = ?", (2,)).await.unwrap();
    // INSERT IGNORE of a taken key: no AFTER INSERT for the row it skipped.
    b.query_drop("INSERT IGNORE INTO acct VALUES (1, 7, 'x')").await.unwrap();
    assert_eq!(
        rows(&mut b, "SELECT what, acct, oldbal, newbal FROM audit ORDER BY what, acct, oldbal").await,
        [
            "delete,2,100,NULL",
            "insert,1,NULL,100",
            "insert,2,NULL,50",
            "update,1,100,105",
            "update,1,105,210",
            "update,2,50,100"
        ]
    );
    assert_eq!(rows(&mut b, "SELECT n FROM counts").await, ["6"]);
    // A rolled-back transaction takes its triggers' writes with it.
    b.query_drop("BEGIN").await.unwrap();
    b.query_drop("UPDATE acct SET bal = 0 WHERE id = 1").await.unwrap();
    b.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(rows(&mut b, "SELECT COUNT(*) FROM audit").await, ["6"]);

    // What MySQL refuses, with its codes.
    let refused = [
        ("CREATE TRIGGER acct_ai AFTER DELETE ON counts FOR EACH ROW DELETE FROM audit", 1359),
        ("DROP TRIGGER nope", 1360),
        ("CREATE TRIGGER x AFTER INSERT ON acct FOR EACH ROW SET NEW.bal = 1", 1362),
        ("CREATE TRIGGER x BEFORE UPDATE ON acct FOR EACH ROW SET OLD.bal = 1", 1362),
        ("CREATE TRIGGER x BEFORE DELETE ON acct FOR EACH ROW DELETE FROM audit WHERE acct = NEW.id", 1363),
        ("CREATE TRIGGER x BEFORE INSERT ON acct FOR EACH ROW DELETE FROM audit WHERE acct = OLD.id", 1363),
        ("CREATE TRIGGER x BEFORE INSERT ON acct FOR EACH ROW SELECT 1", 1415),
        ("CREATE TRIGGER x BEFORE INSERT ON acct FOR EACH ROW SET NEW.nope = 1", 1054),
        ("CREATE TRIGGER x BEFORE INSERT ON acct FOR EACH ROW DROP TABLE audit", 1422),
        ("CREATE TRIGGER other.x BEFORE INSERT ON acct FOR EACH ROW SET NEW.bal = 1", 1435),
        ("CREATE TRIGGER x BEFORE INSERT ON nope FOR EACH ROW SET NEW.bal = 1", 1146),
        ("CREATE TRIGGER x BEFORE INSERT ON acct FOR EACH ROW", 1064),
        ("INSERT INTO acct VALUES (1, 1, 'a') ON DUPLICATE KEY UPDATE bal = 2", 1235),
    ];
    for (sql, code) in refused {
        assert_eq!(code_of(a.query_drop(sql).await), code, "{sql}");
    }
    a.query_drop("CREATE VIEW v AS SELECT * FROM acct").await.unwrap();
    assert_eq!(code_of(a.query_drop("CREATE TRIGGER x BEFORE INSERT ON v FOR EACH ROW SET NEW.bal = 1").await), 1361);
    // A trigger may not write the table whose statement fired it (checked when it fires).
    a.query_drop("CREATE TRIGGER counts_bu BEFORE UPDATE ON counts FOR EACH ROW DELETE FROM counts").await.unwrap();
    assert_eq!(code_of(a.query_drop("UPDATE counts SET n = 0").await), 1442);
    a.query_drop("DROP TRIGGER counts_bu").await.unwrap();
    a.query_drop("DROP TRIGGER IF EXISTS counts_bu").await.unwrap();

    // SHOW CREATE TRIGGER gives the statement back; ALTER TABLE keeps the triggers, DROP TABLE
    // drops them.
    let create: Vec<(String, String, String, String, String, String, String)> =
        a.query("SHOW CREATE TRIGGER acct_ai").await.unwrap();
    assert_eq!(
        create[0].2,
        "CREATE DEFINER=`root`@`%` TRIGGER `acct_ai` AFTER INSERT ON `acct` FOR EACH ROW \
         INSERT INTO audit (what, acct, newbal) VALUES ('insert', NEW.id, NEW.bal)"
    );
    assert_eq!(
        rows(
            &mut a,
            "SELECT TRIGGER_NAME, EVENT_MANIPULATION, EVENT_OBJECT_TABLE, ACTION_ORDER, ACTION_TIMING \
             FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = 'tg' ORDER BY 1"
        )
        .await,
        [
            "acct_ai,INSERT,acct,1,AFTER",
            "acct_au,UPDATE,acct,1,AFTER",
            "acct_bd,DELETE,acct,1,BEFORE",
            "acct_bi,INSERT,acct,1,BEFORE",
            "audit_ai,INSERT,audit,1,AFTER"
        ]
    );
    a.query_drop("ALTER TABLE acct ADD COLUMN note VARCHAR(10)").await.unwrap();
    a.query_drop("INSERT INTO acct (id, bal, name) VALUES (7, 1, 'eve')").await.unwrap();
    assert_eq!(rows(&mut a, "SELECT name FROM acct WHERE id = 7").await, ["EVE"]);
    a.query_drop("CREATE DATABASE tg2").await.unwrap();
    assert_eq!(code_of(a.query_drop("RENAME TABLE acct TO tg2.acct").await), 1435);
    a.query_drop("RENAME TABLE acct TO acct2, acct2 TO acct").await.unwrap();
    a.query_drop("DROP TABLE acct").await.unwrap();
    let left: Vec<String> =
        rows(&mut a, "SHOW TRIGGERS").await.iter().map(|r| r.split(',').next().unwrap().into()).collect();
    assert_eq!(left, ["audit_ai"]);
    a.query_drop("CREATE TABLE acct (id INT PRIMARY KEY)").await.unwrap();
    a.query_drop("CREATE TRIGGER acct_ai AFTER INSERT ON acct FOR EACH ROW DELETE FROM counts").await.unwrap();
}

//! SQL transactions over the MySQL protocol (mysql_async): BEGIN / COMMIT / ROLLBACK,
//! autocommit off, SELECT … FOR UPDATE, lock wait timeouts, no lost updates.

mod common;

use std::time::{Duration, Instant};

use common::TestCluster;
use mysql_async::prelude::*;
use mysql_async::{Conn, OptsBuilder};

fn opts(addr: &str) -> OptsBuilder {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    OptsBuilder::default()
        .ip_or_hostname(host.to_string())
        .tcp_port(port.parse().expect("port"))
        .user(Some("root"))
        .db_name(Some("bank"))
        .prefer_socket(false)
}

fn code_of<T: std::fmt::Debug>(r: Result<T, mysql_async::Error>) -> u16 {
    match r {
        Err(mysql_async::Error::Server(e)) => e.code,
        other => panic!("expected a server error, got {other:?}"),
    }
}

async fn balance(c: &mut Conn, id: i64) -> Option<i64> {
    c.query_first(format!("SELECT balance FROM accounts WHERE id = {id}")).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_commit_rollback_and_locking_reads() {
    let cluster = TestCluster::start_with_sql(2, 2, 1, 1);
    let addr = cluster.mysql_addrs[0].clone();
    let mut setup = Conn::new(opts(&addr).db_name(None::<String>)).await.unwrap();
    setup.query_drop("CREATE DATABASE bank").await.unwrap();
    setup.query_drop("CREATE TABLE bank.accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)").await.unwrap();
    setup.query_drop("INSERT INTO bank.accounts VALUES (1, 100), (2, 100), (3, 100), (4, 100)").await.unwrap();
    let mut a = Conn::new(opts(&addr)).await.unwrap();
    let mut b = Conn::new(opts(&addr)).await.unwrap();

    // Uncommitted writes are invisible to others and visible to their own transaction.
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("UPDATE accounts SET balance = balance - 30 WHERE id = 1").await.unwrap();
    a.query_drop("UPDATE accounts SET balance = balance + 30 WHERE id = 3").await.unwrap();
    a.query_drop("INSERT INTO accounts VALUES (5, 7)").await.unwrap();
    assert_eq!(balance(&mut a, 1).await, Some(70));
    assert_eq!(balance(&mut b, 1).await, Some(100));
    assert_eq!(balance(&mut b, 5).await, None);
    a.query_drop("COMMIT").await.unwrap();
    assert_eq!(balance(&mut b, 1).await, Some(70));
    assert_eq!(balance(&mut b, 3).await, Some(130));
    assert_eq!(balance(&mut b, 5).await, Some(7));

    // ROLLBACK undoes everything.
    a.query_drop("START TRANSACTION").await.unwrap();
    a.query_drop("UPDATE accounts SET balance = 0 WHERE id IN (1, 2)").await.unwrap();
    a.query_drop("DELETE FROM accounts WHERE id = 5").await.unwrap();
    a.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(balance(&mut b, 1).await, Some(70));
    assert_eq!(balance(&mut b, 2).await, Some(100));
    assert_eq!(balance(&mut b, 5).await, Some(7));

    // SELECT … FOR UPDATE locks the row: a writer elsewhere waits, then times out (1205).
    a.query_drop("BEGIN").await.unwrap();
    let v: Option<i64> = a.query_first("SELECT balance FROM accounts WHERE id = 2 FOR UPDATE").await.unwrap();
    assert_eq!(v, Some(100));
    let t = Instant::now();
    b.query_drop("BEGIN").await.unwrap();
    assert_eq!(code_of(b.query_drop("UPDATE accounts SET balance = 1 WHERE id = 2").await), 1205);
    assert!(t.elapsed() < Duration::from_secs(10));
    b.query_drop("ROLLBACK").await.unwrap();
    // A locking scan (no key in the WHERE) locks what it returns too.
    let n: Vec<i64> = a.query("SELECT id FROM accounts WHERE balance >= 100 FOR UPDATE").await.unwrap();
    assert!(n.contains(&3));
    b.query_drop("BEGIN").await.unwrap();
    assert_eq!(code_of(b.query_drop("UPDATE accounts SET balance = 1 WHERE id = 3").await), 1205);
    b.query_drop("ROLLBACK").await.unwrap();
    a.query_drop("COMMIT").await.unwrap();
    b.query_drop("UPDATE accounts SET balance = 100 WHERE id = 2").await.unwrap();

    // autocommit off: statements open a transaction that ROLLBACK takes back.
    a.query_drop("SET autocommit = 0").await.unwrap();
    a.query_drop("INSERT INTO accounts VALUES (6, 1)").await.unwrap();
    assert_eq!(balance(&mut b, 6).await, None);
    a.query_drop("ROLLBACK").await.unwrap();
    a.query_drop("INSERT INTO accounts VALUES (7, 1)").await.unwrap();
    a.query_drop("COMMIT").await.unwrap();
    a.query_drop("SET autocommit = 1").await.unwrap();
    assert_eq!(balance(&mut b, 6).await, None);
    assert_eq!(balance(&mut b, 7).await, Some(1));

    // UPDATE and DELETE of one row by its key go out as a single key write: MySQL's counts
    // hold (matched, changed), bad values still fail only when the row exists, and inside a
    // transaction ROLLBACK takes them back.
    let counts = |c: &Conn| (c.affected_rows(), c.info().to_string());
    b.query_drop("UPDATE accounts SET balance = 1 WHERE id = 7").await.unwrap();
    assert_eq!(counts(&b), (0, "Rows matched: 1  Changed: 0  Warnings: 0".into()));
    b.query_drop("UPDATE accounts SET balance = 2 WHERE id = 7").await.unwrap();
    assert_eq!(counts(&b), (1, "Rows matched: 1  Changed: 1  Warnings: 0".into()));
    b.query_drop("UPDATE accounts SET balance = 2 WHERE id = 999").await.unwrap();
    assert_eq!(counts(&b), (0, "Rows matched: 0  Changed: 0  Warnings: 0".into()));
    assert_eq!(code_of(b.query_drop("UPDATE accounts SET balance = NULL WHERE id = 7").await), 1048);
    b.query_drop("UPDATE accounts SET balance = NULL WHERE id = 999").await.unwrap();
    b.query_drop("DELETE FROM accounts WHERE id = 999").await.unwrap();
    assert_eq!(b.affected_rows(), 0);
    b.query_drop("BEGIN").await.unwrap();
    b.query_drop("DELETE FROM accounts WHERE id = 7").await.unwrap();
    assert_eq!(b.affected_rows(), 1);
    b.query_drop("UPDATE accounts SET balance = 5 WHERE id = 1").await.unwrap();
    assert_eq!(balance(&mut b, 7).await, None);
    assert_eq!(balance(&mut a, 1).await, Some(70), "uncommitted");
    b.query_drop("ROLLBACK").await.unwrap();
    assert_eq!(balance(&mut a, 7).await, Some(2));
    assert_eq!(balance(&mut a, 1).await, Some(70));
    // `col = col ± n` is added where the row is; past the column's range the general path
    // answers with MySQL's error and changes nothing.
    b.query_drop("UPDATE accounts SET balance = balance + 5 WHERE id = 7").await.unwrap();
    assert_eq!(counts(&b), (1, "Rows matched: 1  Changed: 1  Warnings: 0".into()));
    b.query_drop("UPDATE accounts SET balance = balance - 0 WHERE id = 7").await.unwrap();
    assert_eq!(b.affected_rows(), 0);
    let huge = "UPDATE accounts SET balance = balance + 9223372036854775807 WHERE id = 7";
    assert_eq!(code_of(b.query_drop(huge).await), 1690);
    assert_eq!(balance(&mut b, 7).await, Some(7));

    // A connection that goes away mid-transaction leaves no lock behind.
    let mut gone = Conn::new(opts(&addr)).await.unwrap();
    gone.query_drop("BEGIN").await.unwrap();
    gone.query_drop("UPDATE accounts SET balance = 0 WHERE id = 4").await.unwrap();
    drop(gone);
    let started = Instant::now();
    loop {
        match b.query_drop("UPDATE accounts SET balance = 99 WHERE id = 4").await {
            Ok(()) => break,
            Err(e) => assert!(started.elapsed() < Duration::from_secs(15), "lock never freed: {e}"),
        }
    }
    assert_eq!(balance(&mut b, 4).await, Some(99));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sql_increments_lose_nothing() {
    let cluster = TestCluster::start_with_sql(1, 2, 1, 1);
    let addr = cluster.mysql_addrs[0].clone();
    let mut setup = Conn::new(opts(&addr).db_name(None::<String>)).await.unwrap();
    setup.query_drop("CREATE DATABASE bank").await.unwrap();
    setup.query_drop("CREATE TABLE bank.accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)").await.unwrap();
    setup.query_drop("INSERT INTO bank.accounts VALUES (1, 0)").await.unwrap();
    let mut tasks = vec![];
    for _ in 0..4 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::new(opts(&addr)).await.unwrap();
            let mut done = 0;
            while done < 10 {
                let r: Result<(), mysql_async::Error> = async {
                    c.query_drop("BEGIN").await?;
                    let v: Option<i64> = c.query_first("SELECT balance FROM accounts WHERE id = 1 FOR UPDATE").await?;
                    c.query_drop(format!("UPDATE accounts SET balance = {} WHERE id = 1", v.unwrap() + 1)).await?;
                    c.query_drop("COMMIT").await
                }
                .await;
                match r {
                    Ok(()) => done += 1,
                    Err(mysql_async::Error::Server(e)) if e.code == 1205 || e.code == 1213 => {
                        let _ = c.query_drop("ROLLBACK").await;
                    }
                    Err(e) => panic!("increment failed: {e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut c = Conn::new(opts(&addr)).await.unwrap();
    assert_eq!(balance(&mut c, 1).await, Some(40));
}

/// Scans inside a transaction see its own pending writes, as MySQL's do: rows it inserted,
/// not the ones it deleted, the new values of the ones it updated, through full scans,
/// pushed-down filters, ordered-index ranges (in index order under ORDER BY … LIMIT), unique
/// keys, joins, aggregates, FOR UPDATE, and the scans UPDATE and DELETE make. Others see none
/// of it until COMMIT; ROLLBACK takes it all back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_see_the_transactions_own_writes() {
    let cluster = TestCluster::start_with_sql(2, 2, 1, 1);
    let addr = cluster.mysql_addrs[0].clone();
    let mut setup = Conn::new(opts(&addr).db_name(None::<String>)).await.unwrap();
    setup.query_drop("CREATE DATABASE bank").await.unwrap();
    setup
        .query_drop("CREATE TABLE bank.t (id INT PRIMARY KEY, v INT, w VARCHAR(10), UNIQUE KEY uv (v), KEY kw (w))")
        .await
        .unwrap();
    setup.query_drop("CREATE TABLE bank.n (a INT, b INT)").await.unwrap();
    setup.query_drop("INSERT INTO bank.t VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')").await.unwrap();
    let mut a = Conn::new(opts(&addr)).await.unwrap();
    let mut b = Conn::new(opts(&addr)).await.unwrap();
    type Row3 = (i64, i64, String);
    let all = "SELECT id, v, w FROM t ORDER BY id";

    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO t VALUES (5, 5, 'e'), (6, 6, 'f')").await.unwrap();
    a.query_drop("DELETE FROM t WHERE id = 2").await.unwrap();
    a.query_drop("UPDATE t SET w = 'zz' WHERE id = 1").await.unwrap();
    let mine: Vec<Row3> = a.query(all).await.unwrap();
    let expected: Vec<Row3> = vec![(1, 1, "zz".into()), (3, 3, "c".into()), (5, 5, "e".into()), (6, 6, "f".into())];
    assert_eq!(mine, expected);
    let theirs: Vec<Row3> = b.query(all).await.unwrap();
    assert_eq!(theirs, vec![(1, 1, "a".into()), (2, 2, "b".into()), (3, 3, "c".into())]);
    // An ordered-index range walk with a LIMIT: the moved row at its new place, in order.
    let ids: Vec<i64> = a.query("SELECT id FROM t WHERE w > 'b' ORDER BY w LIMIT 3").await.unwrap();
    assert_eq!(ids, vec![3, 5, 6]);
    let ids: Vec<i64> = a.query("SELECT id FROM t WHERE w >= 'e' AND w < 'g' ORDER BY id").await.unwrap();
    assert_eq!(ids, vec![5, 6]);
    let ids: Vec<i64> = a.query("SELECT id FROM t WHERE w <= 'b' ORDER BY id").await.unwrap();
    assert_eq!(ids, Vec::<i64>::new(), "the deleted row and the moved one are out of the range");
    let agg: Option<(i64, i64)> = a.query_first("SELECT COUNT(*), SUM(v) FROM t").await.unwrap();
    assert_eq!(agg, Some((4, 15)));
    // UPDATE and DELETE find the pending rows too.
    a.query_drop("UPDATE t SET v = v + 10 WHERE id >= 5").await.unwrap();
    assert_eq!(a.affected_rows(), 2);
    let ids: Vec<i64> = a.query("SELECT id FROM t WHERE v > 10 ORDER BY id").await.unwrap();
    assert_eq!(ids, vec![5, 6]);
    let v: Option<i64> = a.query_first("SELECT id FROM t WHERE v = 15").await.unwrap();
    assert_eq!(v, Some(5), "through the unique key's pending entry");
    let locked: Vec<i64> = a.query("SELECT id FROM t WHERE v > 10 ORDER BY id FOR UPDATE").await.unwrap();
    assert_eq!(locked, vec![5, 6]);
    a.query_drop("DELETE FROM t WHERE w = 'f'").await.unwrap();
    assert_eq!(a.affected_rows(), 1);
    // A table without a primary key (hidden key), and a join over both.
    a.query_drop("INSERT INTO n VALUES (1, 1), (5, 2)").await.unwrap();
    a.query_drop("UPDATE n SET b = 9 WHERE a = 1").await.unwrap();
    let joined: Vec<(i64, i64)> = a.query("SELECT t.id, n.b FROM t JOIN n ON t.id = n.a ORDER BY t.id").await.unwrap();
    assert_eq!(joined, vec![(1, 9), (5, 2)]);
    let none: Vec<(i64, i64)> = b.query("SELECT a, b FROM n").await.unwrap();
    assert!(none.is_empty());
    a.query_drop("COMMIT").await.unwrap();
    let after: Vec<Row3> = b.query(all).await.unwrap();
    assert_eq!(after, vec![(1, 1, "zz".into()), (3, 3, "c".into()), (5, 15, "e".into())]);

    // ROLLBACK: what the scans saw inside is gone.
    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO t VALUES (7, 7, 'g')").await.unwrap();
    a.query_drop("DELETE FROM t WHERE w = 'c'").await.unwrap();
    let n: Option<i64> = a.query_first("SELECT COUNT(*) FROM t WHERE w <> 'x'").await.unwrap();
    assert_eq!(n, Some(3));
    a.query_drop("ROLLBACK").await.unwrap();
    let n: Option<i64> = a.query_first("SELECT COUNT(*) FROM t WHERE w <> 'x'").await.unwrap();
    assert_eq!(n, Some(3));
    let ids: Vec<i64> = a.query("SELECT id FROM t ORDER BY id").await.unwrap();
    assert_eq!(ids, vec![1, 3, 5]);
}

/// Inside a transaction a statement that fails takes back only what it wrote, as InnoDB's
/// do: the transaction's earlier work stays and it goes on. SAVEPOINT, ROLLBACK TO SAVEPOINT
/// and RELEASE SAVEPOINT, with MySQL's 1305 for a name that is not set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_statements_and_savepoints_roll_back_their_own_writes() {
    let cluster = TestCluster::start_with_sql(2, 2, 1, 1);
    let addr = cluster.mysql_addrs[0].clone();
    let mut setup = Conn::new(opts(&addr).db_name(None::<String>)).await.unwrap();
    setup.query_drop("CREATE DATABASE bank").await.unwrap();
    setup.query_drop("CREATE TABLE bank.t (id INT PRIMARY KEY, v TINYINT, u INT, UNIQUE KEY uu (u))").await.unwrap();
    setup.query_drop("INSERT INTO bank.t VALUES (1, 1, 1), (2, 2, 2), (3, 100, 3)").await.unwrap();
    let mut a = Conn::new(opts(&addr)).await.unwrap();
    let mut b = Conn::new(opts(&addr)).await.unwrap();
    let rows = "SELECT id, v, u FROM t ORDER BY id";
    type Row3 = (i64, i64, i64);

    a.query_drop("BEGIN").await.unwrap();
    a.query_drop("INSERT INTO t VALUES (4, 4, 4)").await.unwrap();
    // Row 3 overflows TINYINT after rows 1 and 2 were written: the statement fails whole.
    assert_eq!(code_of(a.query_drop("UPDATE t SET v = v + 100 ORDER BY id").await), 1264);
    // A multi-row UPDATE that runs into the unique key after its first row.
    assert_eq!(code_of(a.query_drop("UPDATE t SET u = 9 WHERE id IN (1, 2)").await), 1062);
    // A multi-row INSERT whose third row is a duplicate.
    assert_eq!(code_of(a.query_drop("INSERT INTO t VALUES (5, 5, 5), (6, 6, 6), (1, 0, 0)").await), 1062);
    let mine: Vec<Row3> = a.query(rows).await.unwrap();
    assert_eq!(mine, vec![(1, 1, 1), (2, 2, 2), (3, 100, 3), (4, 4, 4)]);
    // The transaction goes on and commits its own work.
    a.query_drop("UPDATE t SET v = 7 WHERE id = 1").await.unwrap();
    a.query_drop("COMMIT").await.unwrap();
    let after: Vec<Row3> = b.query(rows).await.unwrap();
    assert_eq!(after, vec![(1, 7, 1), (2, 2, 2), (3, 100, 3), (4, 4, 4)]);

    // Savepoints.
    a.query_drop("START TRANSACTION").await.unwrap();
    a.query_drop("UPDATE t SET v = 10 WHERE id = 1").await.unwrap();
    a.query_drop("SAVEPOINT s1").await.unwrap();
    a.query_drop("UPDATE t SET v = 11 WHERE id = 1").await.unwrap();
    a.query_drop("DELETE FROM t WHERE id = 2").await.unwrap();
    a.query_drop("INSERT INTO t VALUES (8, 8, 8)").await.unwrap();
    a.query_drop("SAVEPOINT s2").await.unwrap();
    a.query_drop("UPDATE t SET v = 12 WHERE id = 1").await.unwrap();
    a.query_drop("ROLLBACK TO SAVEPOINT s2").await.unwrap();
    let v: Option<i64> = a.query_first("SELECT v FROM t WHERE id = 1").await.unwrap();
    assert_eq!(v, Some(11));
    a.query_drop("ROLLBACK TO s1").await.unwrap();
    let mine: Vec<Row3> = a.query(rows).await.unwrap();
    assert_eq!(mine, vec![(1, 10, 1), (2, 2, 2), (3, 100, 3), (4, 4, 4)]);
    // s2 went with the rollback to s1, which stays and can be rolled back to again.
    assert_eq!(code_of(a.query_drop("ROLLBACK TO SAVEPOINT s2").await), 1305);
    a.query_drop("INSERT INTO t VALUES (9, 9, 9)").await.unwrap();
    a.query_drop("ROLLBACK TO SAVEPOINT S1").await.unwrap();
    a.query_drop("RELEASE SAVEPOINT s1").await.unwrap();
    assert_eq!(code_of(a.query_drop("ROLLBACK TO SAVEPOINT s1").await), 1305);
    assert_eq!(code_of(a.query_drop("RELEASE SAVEPOINT nope").await), 1305);
    let theirs: Option<i64> = b.query_first("SELECT v FROM t WHERE id = 1").await.unwrap();
    assert_eq!(theirs, Some(7), "nothing is visible before COMMIT");
    a.query_drop("COMMIT").await.unwrap();
    let after: Vec<Row3> = b.query(rows).await.unwrap();
    assert_eq!(after, vec![(1, 10, 1), (2, 2, 2), (3, 100, 3), (4, 4, 4)]);
    // Savepoints end with their transaction; outside one SAVEPOINT is accepted and keeps nothing.
    assert_eq!(code_of(a.query_drop("ROLLBACK TO SAVEPOINT s1").await), 1305);
    a.query_drop("SAVEPOINT outside").await.unwrap();
    assert_eq!(code_of(a.query_drop("ROLLBACK TO SAVEPOINT outside").await), 1305);

    // autocommit off: the first statement's failure takes back only its own rows.
    a.query_drop("SET autocommit = 0").await.unwrap();
    assert_eq!(code_of(a.query_drop("INSERT INTO t VALUES (20, 1, 20), (21, 1, 1)").await), 1062);
    a.query_drop("INSERT INTO t VALUES (22, 1, 22)").await.unwrap();
    a.query_drop("COMMIT").await.unwrap();
    a.query_drop("SET autocommit = 1").await.unwrap();
    let ids: Vec<i64> = b.query("SELECT id FROM t WHERE id >= 20 ORDER BY id").await.unwrap();
    assert_eq!(ids, vec![22]);
}

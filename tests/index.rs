//! Ordered indexes in the data nodes (issue 5): created with the table or later on a loaded
//! table, kept in step with inserts, updates, deletes and transactions, merged in order across
//! partitions, rebuilt by a restarted node, dropped.

mod common;

use std::time::Duration;

use common::TestCluster;
use shoal_client::{Client, IndexRange, IndexScanOptions, KeyOp};
use shoal_proto::filter::{CmpOp, Filter};
use shoal_proto::{Column, ColumnType, IndexSpec, TableSpec, Value};
use tokio_stream::StreamExt;

fn spec() -> TableSpec {
    TableSpec {
        name: "items".into(),
        columns: vec![
            Column::new("id", ColumnType::Int),
            Column::new("k", ColumnType::Int).nullable(),
            Column::new("name", ColumnType::Text),
        ],
        primary_key: vec![0],
        partition_key: vec![],
    }
}

fn index(name: &str, columns: Vec<u32>) -> IndexSpec {
    IndexSpec { id: 0, name: name.into(), columns, unique: false, prefix_lens: vec![] }
}

async fn ids(client: &Client, range: IndexRange, opts: IndexScanOptions) -> Vec<i64> {
    let mut s = client.scan_index("items", range, opts);
    let mut out = vec![];
    while let Some(r) = s.next().await {
        out.push(r.unwrap()[0].as_i64().unwrap());
    }
    out
}

fn by_k(lower: Option<i64>, upper: Option<i64>, descending: bool) -> IndexRange {
    IndexRange {
        index: "by_k".into(),
        lower: lower.map(Value::Int).into_iter().collect(),
        lower_inclusive: true,
        upper: upper.map(Value::Int).into_iter().collect(),
        upper_inclusive: true,
        descending,
    }
}

/// What the index should return: ids ordered by (k, id), NULL k first, within [lo, hi].
fn expected(rows: &[(i64, Option<i64>)], lo: Option<i64>, hi: Option<i64>, descending: bool) -> Vec<i64> {
    let mut v: Vec<(Option<i64>, i64)> = rows
        .iter()
        .filter(|(_, k)| lo.is_none() || k.is_some_and(|k| k >= lo.unwrap()))
        .filter(|(_, k)| hi.is_none() || k.is_some_and(|k| k <= hi.unwrap()))
        .map(|&(id, k)| (k, id))
        .collect();
    v.sort();
    if descending {
        v.reverse();
    }
    v.into_iter().map(|(_, id)| id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_indexes_range_scan_in_order_across_partitions_and_survive_restarts() {
    let cluster = TestCluster::start(2, 2, 1);
    let client = cluster.client().await;
    let t = client.create_table_with_indexes(spec(), vec![index("PRIMARY", vec![0])], false).await.unwrap();
    assert_eq!(t.indexes.len(), 1);
    // 300 rows, k repeating (so ties are ordered by primary key) and some NULL.
    let mut rows: Vec<(i64, Option<i64>)> = (0..300).map(|id| (id, (id % 7 != 3).then_some((id * 37) % 50))).collect();
    let insert = |&(id, k): &(i64, Option<i64>)| KeyOp::Insert {
        table: "items".into(),
        row: vec![Value::Int(id), k.map_or(Value::Null, Value::Int), Value::Text(format!("n{id}"))],
    };
    for r in client.batch(rows[..150].iter().map(insert).collect()).await {
        r.unwrap();
    }
    // An index created on a loaded table is built from the rows, then kept up to date.
    let t = client.create_index("items", index("by_k", vec![1]), false).await.unwrap();
    assert_eq!(t.indexes.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), vec!["PRIMARY", "by_k"]);
    let dup = client.create_index("items", index("BY_K", vec![2]), false).await.unwrap_err();
    assert_eq!(dup.code, shoal_proto::ErrorCode::TableExists);
    for r in client.batch(rows[150..].iter().map(insert).collect()).await {
        r.unwrap();
    }
    let all = IndexScanOptions::default();
    assert_eq!(ids(&client, by_k(None, None, false), all.clone()).await, expected(&rows, None, None, false));
    assert_eq!(ids(&client, by_k(None, None, true), all.clone()).await, expected(&rows, None, None, true));
    assert_eq!(
        ids(&client, by_k(Some(10), Some(20), false), all.clone()).await,
        expected(&rows, Some(10), Some(20), false)
    );
    // Small batches make every partition resume many times.
    let small = IndexScanOptions { batch_hint: 3, ..Default::default() };
    assert_eq!(ids(&client, by_k(Some(40), None, true), small.clone()).await, expected(&rows, Some(40), None, true));
    // Filters and projection still apply (id < 100, only the id column).
    let filtered = IndexScanOptions {
        filters: vec![Filter { column: 0, op: CmpOp::Lt, value: Value::Int(100) }],
        projection: vec![0],
        ..Default::default()
    };
    let low: Vec<(i64, Option<i64>)> = rows.iter().copied().filter(|r| r.0 < 100).collect();
    assert_eq!(ids(&client, by_k(Some(5), Some(45), false), filtered).await, expected(&low, Some(5), Some(45), false));
    // The primary key in order.
    let pk = IndexRange {
        index: "PRIMARY".into(),
        lower: vec![Value::Int(95)],
        lower_inclusive: false,
        upper: vec![Value::Int(105)],
        upper_inclusive: true,
        descending: false,
    };
    assert_eq!(ids(&client, pk, all.clone()).await, (96..=105).collect::<Vec<_>>());

    // Updates move rows in the index, deletes remove them, transactions too.
    for id in (0..300).step_by(10) {
        client.update("items", vec![Value::Int(id)], &[("k", Value::Int(1000 + id))]).await.unwrap();
        rows[id as usize].1 = Some(1000 + id);
    }
    for id in (5..300).step_by(20) {
        client.delete("items", vec![Value::Int(id)]).await.unwrap();
    }
    rows.retain(|r| !(r.0 >= 5 && (r.0 - 5) % 20 == 0));
    let mut tx = client.begin();
    tx.update("items", vec![Value::Int(1)], vec![1], vec![Value::Int(-5)]).await.unwrap();
    tx.update("items", vec![Value::Int(2)], vec![1], vec![Value::Null]).await.unwrap();
    tx.commit().await.unwrap();
    rows.iter_mut().find(|r| r.0 == 1).unwrap().1 = Some(-5);
    rows.iter_mut().find(|r| r.0 == 2).unwrap().1 = None;
    assert_eq!(ids(&client, by_k(None, None, false), small.clone()).await, expected(&rows, None, None, false));

    // A restarted data node rebuilds its indexes from the rows it restores and copies.
    cluster.signal(11, libc::SIGKILL);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(cluster.shoal(&["node", "start", "11"]).status.success());
    cluster.wait_status("node 11 back", Duration::from_secs(60), |s| TestCluster::node(s, 11)["state"] == "up");
    // Let the primaries move back to it, then read every partition from its replicas too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ids(&client, by_k(None, None, false), all.clone()).await, expected(&rows, None, None, false));
    let backup = Client::connect_with(
        &cluster.mgmd_addrs,
        shoal_client::ClientOptions { read_backup: true, ..Default::default() },
    )
    .await
    .unwrap();
    assert_eq!(ids(&backup, by_k(None, None, true), all.clone()).await, expected(&rows, None, None, true));

    client.drop_index("items", "by_k", false).await.unwrap();
    let mut s = client.scan_index("items", by_k(None, None, false), all);
    assert!(s.next().await.unwrap().is_err(), "a dropped index cannot be scanned");
    assert!(client.drop_index("items", "by_k", false).await.is_err());
    client.drop_index("items", "by_k", true).await.unwrap();
}

/// ALTER TABLE's read-only mark is a lease: when its SQL node stops renewing it (it died
/// during the copy), mgmd lets writes in again, and the copy can no longer be swapped in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_read_only_mark_is_lifted_and_its_copy_refused() {
    let cluster = TestCluster::start(1, 2, 1);
    let client = cluster.client().await;
    client.create_table(spec(), false).await.unwrap();
    client.create_table(TableSpec { name: "items_copy".into(), ..spec() }, false).await.unwrap();
    let row = |id: i64| vec![Value::Int(id), Value::Int(1), Value::Text("x".into())];
    client.insert("items", row(1)).await.unwrap();
    assert!(client.set_read_only("items", true).await.unwrap().read_only);
    let quick = Client::connect_with(
        &cluster.mgmd_addrs,
        shoal_client::ClientOptions { deadline: Duration::from_millis(300), ..Default::default() },
    )
    .await
    .unwrap();
    assert!(quick.insert("items", row(2)).await.is_err(), "a read-only table refuses writes");
    assert_eq!(client.get("items", vec![Value::Int(1)]).await.unwrap(), Some(row(1)), "reads go on");
    // Nobody renews the mark: after the lease (10 s) writes come back.
    let started = std::time::Instant::now();
    common::eventually("writes allowed again", Duration::from_secs(30), || async {
        quick.insert("items", row(3)).await.ok()
    })
    .await;
    assert!(started.elapsed() >= Duration::from_secs(5), "the mark held for its lease");
    let e = client.replace_table("items", "items_copy").await.unwrap_err();
    assert_eq!(e.code, shoal_proto::ErrorCode::SchemaChanged);
    assert_eq!(client.get("items", vec![Value::Int(3)]).await.unwrap(), Some(row(3)));
}

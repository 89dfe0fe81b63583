//! Ordered indexes from the client side: DDL (create/drop) and ordered range scans.
//!
//! Each partition replica keeps its own ordered index (`datanode/src/index.rs`), so a range
//! scan asks every partition (or the one a pruned scan names) for its rows in the range, in
//! index order, and merges the streams: the caller sees one stream in index order across the
//! whole table. Each partition sends at most `batch_hint` rows per batch, so an
//! `ORDER BY … LIMIT n` reads about n rows per partition rather than every row in the range.

use shoal_proto::codec::encode_index_key;
use shoal_proto::convert::values_to_pb;
use shoal_proto::filter::Filter;
use shoal_proto::pb;
use shoal_proto::{ErrorCode, IndexSpec, ShoalError, Table, TableSpec, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::{table_of, Client, Result, Row, SCAN_BATCH_ROWS};

/// A range of an ordered index: the index columns, compared as a prefix, between the bounds
/// (an empty bound is open).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IndexRange {
    pub index: String,
    pub lower: Vec<Value>,
    pub lower_inclusive: bool,
    pub upper: Vec<Value>,
    pub upper_inclusive: bool,
    pub descending: bool,
}

impl IndexRange {
    /// Whether `row` (all columns of `table`) lies in the range, compared as the data nodes
    /// compare their index entries (memcomparable bytes; a bound is a prefix: an inclusive
    /// bound admits every key that starts with it, an exclusive one none). For rows the caller
    /// holds that a scan did not return (a transaction's own pending writes). False when the
    /// table has no such index or a value does not fit its column.
    pub fn admits(&self, table: &Table, row: &[Value]) -> bool {
        let Some(index) = table.indexes.iter().find(|i| i.name.eq_ignore_ascii_case(&self.index)) else {
            return false;
        };
        let cols: Vec<_> = index.columns.iter().map(|&c| &table.columns()[c as usize]).collect();
        let values: Vec<Value> =
            index.columns.iter().map(|&c| row.get(c as usize).cloned().unwrap_or(Value::Null)).collect();
        let encode = |values: &[Value]| -> Option<Vec<u8>> {
            let mut out = vec![];
            encode_index_key(&mut out, &cols[..values.len().min(cols.len())], values).ok()?;
            Some(out)
        };
        let (Some(key), Some(lower), Some(upper)) = (encode(&values), encode(&self.lower), encode(&self.upper)) else {
            return false;
        };
        let above_lower = lower.is_empty()
            || if self.lower_inclusive { key >= lower } else { key > lower && !key.starts_with(&lower) };
        let below_upper = upper.is_empty()
            || if self.upper_inclusive { key <= upper || key.starts_with(&upper) } else { key < upper };
        above_lower && below_upper
    }
}

/// What an index scan returns besides the range: filters, projection, pruning, batch size.
#[derive(Clone, Debug, Default)]
pub struct IndexScanOptions {
    pub filters: Vec<Filter>,
    /// Column positions to return; empty = every column.
    pub projection: Vec<u32>,
    /// Only this partition (partition pruning).
    pub only: Option<u32>,
    /// Rows per batch from each partition (0 = the default): the caller's LIMIT, if any.
    pub batch_hint: u32,
}

impl Client {
    /// Creates a table together with its ordered indexes (one catalog change).
    pub async fn create_table_with_indexes(
        &self,
        spec: TableSpec,
        indexes: Vec<IndexSpec>,
        if_not_exists: bool,
    ) -> Result<Table> {
        let req = pb::CreateTableRequest {
            spec: Some(pb::TableSpec::from(&spec)),
            if_not_exists,
            indexes: indexes.iter().map(pb::IndexSpec::from).collect(),
        };
        let resp = self.catalog_change(req, |mut c, r| async move { c.create_table(r).await }).await?;
        table_of(resp)
    }

    /// Adds an ordered index to `table`; every data node builds it from its rows when it
    /// installs the new map. Returns the table as it is now.
    pub async fn create_index(&self, table: &str, index: IndexSpec, if_not_exists: bool) -> Result<Table> {
        let req = pb::CreateIndexRequest {
            table: table.to_string(),
            index: Some(pb::IndexSpec::from(&index)),
            if_not_exists,
        };
        let resp = self.catalog_change(req, |mut c, r| async move { c.create_index(r).await }).await?;
        table_of(resp)
    }

    pub async fn drop_index(&self, table: &str, name: &str, if_exists: bool) -> Result<()> {
        let req = pb::DropIndexRequest { table: table.to_string(), name: name.to_string(), if_exists };
        self.catalog_change(req, |mut c, r| async move { c.drop_index(r).await }).await?;
        Ok(())
    }

    /// Streams the rows of `table` in `range` of one of its ordered indexes, in index order
    /// (descending if the range says so) across all partitions. Errors end the stream with
    /// an error.
    pub fn scan_index(&self, table: &str, range: IndexRange, opts: IndexScanOptions) -> ReceiverStream<Result<Row>> {
        let (tx, rx) = mpsc::channel(SCAN_BATCH_ROWS as usize);
        let client = self.clone();
        let table = table.to_string();
        tokio::spawn(async move {
            if let Err(e) = client.scan_index_into(&table, range, opts, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        ReceiverStream::new(rx)
    }

    async fn scan_index_into(
        &self,
        table: &str,
        range: IndexRange,
        opts: IndexScanOptions,
        out: &mpsc::Sender<Result<Row>>,
    ) -> Result<()> {
        let t = self.table(table)?;
        let index = t.indexes.iter().find(|i| i.name.eq_ignore_ascii_case(&range.index)).cloned().ok_or_else(|| {
            ShoalError::new(ErrorCode::InvalidArgument, format!("{table} has no index {}", range.index))
        })?;
        // The merge orders rows as the index does, by index values then primary key, so each
        // partition sends those columns last (and they are cut before the caller sees them).
        let width = if opts.projection.is_empty() { t.columns().len() } else { opts.projection.len() };
        let order_cols: Vec<u32> = index.columns.iter().chain(&t.spec.primary_key).copied().collect();
        let mut projection = opts.projection.clone();
        if !projection.is_empty() {
            projection.extend(&order_cols);
        }
        let key_at: Vec<usize> = if opts.projection.is_empty() {
            order_cols.iter().map(|&c| c as usize).collect()
        } else {
            (width..width + order_cols.len()).collect()
        };
        let batch = match opts.batch_hint {
            0 => SCAN_BATCH_ROWS,
            n => n.clamp(1, SCAN_BATCH_ROWS),
        };
        let base = pb::ScanRequest {
            epoch: 0,
            table_id: t.id,
            partition: 0,
            filters: opts.filters.iter().map(Filter::to_pb).collect(),
            projection,
            batch_rows: batch,
            read_backup: self.inner.opts.read_backup,
            index: Some(pb::IndexRange {
                index_id: index.id,
                lower: values_to_pb(range.lower.clone()),
                lower_inclusive: range.lower_inclusive,
                upper: values_to_pb(range.upper.clone()),
                upper_inclusive: range.upper_inclusive,
                descending: range.descending,
            }),
        };
        let partitions: Vec<u32> = (0..t.partition_count).filter(|p| opts.only.is_none_or(|o| o == *p)).collect();
        let mut inputs = Vec::with_capacity(partitions.len());
        for p in partitions {
            let (tx, rx) = mpsc::channel(batch as usize);
            let (client, base) = (self.clone(), base.clone());
            tokio::spawn(async move {
                if let Err(e) = client.scan_partition_retrying(p, &base, &tx).await {
                    let _ = tx.send(Err(e)).await;
                }
            });
            inputs.push(rx);
        }
        let cols: Vec<_> = order_cols.iter().map(|&c| &t.columns()[c as usize]).collect();
        let sort_key = |row: &Row| -> Vec<u8> {
            let values: Vec<Value> = key_at.iter().map(|&i| row.get(i).cloned().unwrap_or(Value::Null)).collect();
            let mut k = vec![];
            // Rows come from the data nodes with their columns' own types: this cannot fail.
            let _ = encode_index_key(&mut k, &cols, &values);
            k
        };
        // The head row of each input (None once it is exhausted).
        let mut heads: Vec<Option<(Vec<u8>, Row)>> = Vec::with_capacity(inputs.len());
        for rx in &mut inputs {
            heads.push(next_row(rx).await?.map(|r| (sort_key(&r), r)));
        }
        loop {
            let pick = heads
                .iter()
                .enumerate()
                .filter_map(|(i, h)| h.as_ref().map(|(k, _)| (i, k)))
                .reduce(|a, b| if (b.1 < a.1) != range.descending && b.1 != a.1 { b } else { a })
                .map(|(i, _)| i);
            let Some(i) = pick else { return Ok(()) };
            let (_, mut row) = heads[i].take().expect("picked a live head");
            heads[i] = next_row(&mut inputs[i]).await?.map(|r| (sort_key(&r), r));
            row.truncate(width);
            if out.send(Ok(row)).await.is_err() {
                return Ok(()); // the reader went away (a LIMIT was reached): the inputs stop too
            }
        }
    }
}

async fn next_row(rx: &mut mpsc::Receiver<Result<Row>>) -> Result<Option<Row>> {
    rx.recv().await.transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::{Column, ColumnType};

    /// `d.t (id INT, a INT, b TEXT)` with an ordered index `ab` on (a, b).
    fn table() -> Table {
        let spec = TableSpec {
            name: "d.t".into(),
            columns: vec![
                Column::new("id", ColumnType::Int),
                Column::new("a", ColumnType::Int).nullable(),
                Column::new("b", ColumnType::Text).nullable(),
            ],
            primary_key: vec![0],
            partition_key: vec![],
        };
        let (spec, hidden_pk) = spec.normalize().unwrap();
        let index = IndexSpec { id: 1, name: "ab".into(), columns: vec![1, 2], unique: false, prefix_lens: vec![] };
        Table {
            id: 7,
            spec,
            partition_count: 4,
            schema_version: 1,
            hidden_pk,
            indexes: vec![index],
            ..Default::default()
        }
    }

    fn range(lower: Vec<Value>, lower_inclusive: bool, upper: Vec<Value>, upper_inclusive: bool) -> IndexRange {
        IndexRange { index: "AB".into(), lower, lower_inclusive, upper, upper_inclusive, descending: false }
    }

    fn row(a: Option<i64>, b: &str) -> Vec<Value> {
        vec![Value::Int(1), a.map_or(Value::Null, Value::Int), Value::Text(b.into())]
    }

    /// Bounds are prefixes of the index columns, as the data nodes read them: an inclusive
    /// bound admits every key starting with it, an exclusive one none.
    #[test]
    fn a_range_admits_rows_as_the_data_nodes_compare_entries() {
        let t = table();
        let a5 = vec![Value::Int(5)];
        // a >= 5, a > 5, a <= 5, a < 5 on a two-column index.
        assert!(range(a5.clone(), true, vec![], true).admits(&t, &row(Some(5), "x")));
        assert!(!range(a5.clone(), false, vec![], true).admits(&t, &row(Some(5), "x")));
        assert!(range(a5.clone(), false, vec![], true).admits(&t, &row(Some(6), "")));
        assert!(range(vec![], true, a5.clone(), true).admits(&t, &row(Some(5), "zzz")));
        assert!(!range(vec![], true, a5.clone(), false).admits(&t, &row(Some(5), "")));
        assert!(range(vec![], true, a5.clone(), false).admits(&t, &row(Some(4), "zzz")));
        // a = 5 AND b BETWEEN 'b' AND 'd'.
        let lo = vec![Value::Int(5), Value::Text("b".into())];
        let hi = vec![Value::Int(5), Value::Text("d".into())];
        let between = range(lo, true, hi, true);
        assert!(between.admits(&t, &row(Some(5), "b")));
        assert!(between.admits(&t, &row(Some(5), "c")));
        assert!(between.admits(&t, &row(Some(5), "d")));
        assert!(!between.admits(&t, &row(Some(5), "da")));
        assert!(!between.admits(&t, &row(Some(5), "a")));
        assert!(!between.admits(&t, &row(Some(6), "c")));
        // NULL sorts first: below any bound, inside an open one.
        assert!(!range(a5, true, vec![], true).admits(&t, &row(None, "x")));
        assert!(range(vec![], true, vec![], true).admits(&t, &row(None, "x")));
        // An index the table does not have admits nothing.
        let mut other = range(vec![], true, vec![], true);
        other.index = "nope".into();
        assert!(!other.admits(&t, &row(Some(1), "")));
    }
}

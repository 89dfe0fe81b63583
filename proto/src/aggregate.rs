//! Aggregates a range read folds where its rows are (`Op.aggregates`): COUNT, SUM, MIN and
//! MAX of integer columns. Each data node folds its share of the rows into a [`Partial`] per
//! aggregate; the caller merges the nodes' partials ([`Partial::merge`]) and finishes them
//! with its own SQL rules (a SQL node's SUM of integers is a DECIMAL, AVG divides). A
//! `SUM(k) ... WHERE id BETWEEN ? AND ?` then moves one value per node instead of a hundred
//! rows, and nobody decodes the rows into values to add them up.

use crate::codec;
use crate::error::{ErrorCode, ShoalError};
use crate::pb;
use crate::types::{ColumnType, Table};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AggregateKind {
    /// Rows found.
    CountRows,
    /// Rows whose column is not NULL.
    Count,
    Sum,
    Min,
    Max,
}

/// One aggregate to fold: its kind and the column it reads (unused for `CountRows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aggregate {
    pub kind: AggregateKind,
    pub column: u32,
}

/// Some rows' share of an aggregate: `n` the rows counted (for SUM, MIN and MAX: those whose
/// column is not NULL) and, for SUM, MIN and MAX over at least one row, the result so far. A
/// sum of 64-bit values needs more than 64 bits; 128 hold the sum of 2^64 of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Partial {
    pub n: u64,
    pub value: Option<i128>,
}

impl Partial {
    /// Folds one more value in (None: NULL, counted by `CountRows` only): a share of one row.
    fn add(&mut self, kind: AggregateKind, v: Option<i128>) -> Result<(), ShoalError> {
        let n = u64::from(v.is_some() || kind == AggregateKind::CountRows);
        self.merge(kind, Partial { n, value: v })
    }

    /// Adds another share of the same aggregate (another node's).
    pub fn merge(&mut self, kind: AggregateKind, other: Partial) -> Result<(), ShoalError> {
        self.n += other.n;
        self.value = match (kind, self.value, other.value) {
            (AggregateKind::CountRows | AggregateKind::Count, _, _) => None,
            (_, a, None) => a,
            (_, None, b) => b,
            (AggregateKind::Sum, Some(a), Some(b)) => Some(a.checked_add(b).ok_or_else(overflow)?),
            (AggregateKind::Min, Some(a), Some(b)) => Some(a.min(b)),
            (AggregateKind::Max, Some(a), Some(b)) => Some(a.max(b)),
        };
        Ok(())
    }

    pub fn to_pb(self) -> pb::AggregateValue {
        pb::AggregateValue { n: self.n, value: self.value.map(|v| v.to_le_bytes().to_vec()).unwrap_or_default() }
    }

    pub fn from_pb(v: &pb::AggregateValue) -> Result<Partial, ShoalError> {
        let value = match v.value.len() {
            0 => None,
            16 => Some(i128::from_le_bytes(v.value[..].try_into().unwrap_or([0; 16]))),
            n => return Err(invalid(format!("an aggregate value has 16 bytes, not {n}"))),
        };
        Ok(Partial { n: v.n, value })
    }
}

impl Aggregate {
    pub fn to_pb(self) -> pb::Aggregate {
        let kind = match self.kind {
            AggregateKind::CountRows => pb::AggregateKind::AggregateCountRows,
            AggregateKind::Count => pb::AggregateKind::AggregateCount,
            AggregateKind::Sum => pb::AggregateKind::AggregateSum,
            AggregateKind::Min => pb::AggregateKind::AggregateMin,
            AggregateKind::Max => pb::AggregateKind::AggregateMax,
        };
        pb::Aggregate { kind: kind as i32, column: self.column }
    }

    pub fn from_pb(a: &pb::Aggregate) -> Result<Aggregate, ShoalError> {
        let kind = match pb::AggregateKind::try_from(a.kind) {
            Ok(pb::AggregateKind::AggregateCountRows) => AggregateKind::CountRows,
            Ok(pb::AggregateKind::AggregateCount) => AggregateKind::Count,
            Ok(pb::AggregateKind::AggregateSum) => AggregateKind::Sum,
            Ok(pb::AggregateKind::AggregateMin) => AggregateKind::Min,
            Ok(pb::AggregateKind::AggregateMax) => AggregateKind::Max,
            Err(_) => return Err(invalid(format!("unknown aggregate kind {}", a.kind))),
        };
        Ok(Aggregate { kind, column: a.column })
    }
}

/// What one aggregate reads of a row: its column's null bit and, for SUM, MIN and MAX, the
/// column's fixed slot (offset and integer type).
struct Read {
    kind: AggregateKind,
    column: usize,
    slot: Option<(usize, ColumnType)>,
}

/// Folds rows of one table into one partial per aggregate, reading each aggregate's column
/// straight from the encoded row (its null bit and, for integers, its fixed slot).
pub struct Folder {
    reads: Vec<Read>,
    /// The length of the table's rows' null bitmap (each fixed slot is checked as read).
    bitmap: usize,
    pub partials: Vec<Partial>,
}

impl Folder {
    /// Fails for a column the table does not have, or SUM, MIN or MAX of a column that is not
    /// an integer.
    pub fn new(table: &Table, aggs: &[Aggregate]) -> Result<Folder, ShoalError> {
        let cols = table.columns();
        let mut reads = Vec::with_capacity(aggs.len());
        for a in aggs {
            let column = a.column as usize;
            if a.kind == AggregateKind::CountRows {
                reads.push(Read { kind: a.kind, column: 0, slot: None });
                continue;
            }
            let c = cols.get(column).ok_or_else(|| invalid(format!("no column {column} to aggregate")))?;
            let slot = match (a.kind, c.ty) {
                (AggregateKind::Count, _) => None,
                (_, ty @ (ColumnType::Int | ColumnType::Uint)) => codec::fixed_offset(table, column).map(|o| (o, ty)),
                (_, ty) => return Err(invalid(format!("{:?} of a {} column", a.kind, ty.name()))),
            };
            reads.push(Read { kind: a.kind, column, slot });
        }
        Ok(Folder { reads, bitmap: cols.len().div_ceil(8), partials: vec![Partial::default(); aggs.len()] })
    }

    /// Folds one encoded row of the table in.
    pub fn add_row(&mut self, data: &[u8]) -> Result<(), ShoalError> {
        if data.len() < self.bitmap {
            return Err(short());
        }
        for (Read { kind, column, slot }, partial) in self.reads.iter().zip(&mut self.partials) {
            let null = *kind != AggregateKind::CountRows && data[column / 8] & (1 << (column % 8)) != 0;
            let v = match (null, slot) {
                (true, _) => None,
                (false, None) => Some(0),
                (false, Some((off, ty))) => {
                    let eight: [u8; 8] = data.get(*off..off + 8).and_then(|s| s.try_into().ok()).ok_or_else(short)?;
                    Some(match ty {
                        ColumnType::Uint => i128::from(u64::from_le_bytes(eight)),
                        _ => i128::from(i64::from_le_bytes(eight)),
                    })
                }
            };
            partial.add(*kind, v)?;
        }
        Ok(())
    }
}

fn short() -> ShoalError {
    ShoalError::new(ErrorCode::Internal, "corrupt row: shorter than its fixed part")
}

fn overflow() -> ShoalError {
    ShoalError::new(ErrorCode::InvalidArgument, "an aggregate's sum overflowed 128 bits")
}

fn invalid(msg: String) -> ShoalError {
    ShoalError::new(ErrorCode::InvalidArgument, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Column, TableSpec};
    use crate::Value;

    fn table() -> Table {
        let spec = TableSpec {
            name: "d.t".into(),
            columns: vec![
                Column::new("id", ColumnType::Int),
                Column::new("name", ColumnType::Text).nullable(),
                Column::new("k", ColumnType::Int).nullable(),
                Column::new("u", ColumnType::Uint),
            ],
            primary_key: vec![0],
            partition_key: vec![],
        };
        let (spec, hidden_pk) = spec.normalize().unwrap();
        Table { id: 1, spec, partition_count: 2, schema_version: 1, hidden_pk, ..Default::default() }
    }

    fn row(t: &Table, id: i64, name: Option<&str>, k: Option<i64>, u: u64) -> Vec<u8> {
        let name = name.map_or(Value::Null, |s| Value::Text(s.into()));
        let k = k.map_or(Value::Null, Value::Int);
        codec::encode_row(t, &[Value::Int(id), name, k, Value::Uint(u)]).unwrap()
    }

    fn agg(kind: AggregateKind, column: u32) -> Aggregate {
        Aggregate { kind, column }
    }

    #[test]
    fn folds_and_merges_as_one_pass_over_every_row_would() {
        use AggregateKind::*;
        let t = table();
        let aggs =
            [agg(CountRows, 0), agg(Count, 1), agg(Sum, 2), agg(Min, 2), agg(Max, 2), agg(Sum, 3), agg(Count, 2)];
        let rows = [
            row(&t, 1, Some("a"), Some(i64::MAX), u64::MAX),
            row(&t, 2, None, None, u64::MAX),
            row(&t, 3, Some("c"), Some(-5), 1),
            row(&t, 4, Some("d"), Some(i64::MAX), 0),
        ];
        let mut whole = Folder::new(&t, &aggs).unwrap();
        rows.iter().for_each(|r| whole.add_row(r).unwrap());
        // Two nodes' shares, merged: the same.
        let (mut a, mut b) = (Folder::new(&t, &aggs).unwrap(), Folder::new(&t, &aggs).unwrap());
        a.add_row(&rows[0]).unwrap();
        a.add_row(&rows[1]).unwrap();
        b.add_row(&rows[2]).unwrap();
        b.add_row(&rows[3]).unwrap();
        let mut merged = a.partials.clone();
        for ((m, x), g) in merged.iter_mut().zip(b.partials).zip(&aggs) {
            m.merge(g.kind, x).unwrap();
        }
        assert_eq!(merged, whole.partials);
        let p = |n, value| Partial { n, value };
        let big = 2 * i128::from(i64::MAX);
        assert_eq!(
            whole.partials,
            [
                p(4, None),
                p(3, None),
                p(3, Some(big - 5)),
                p(3, Some(-5)),
                p(3, Some(i128::from(i64::MAX))),
                p(4, Some(2 * i128::from(u64::MAX) + 1)),
                p(3, None),
            ]
        );
        // Over wire form and back.
        for x in &whole.partials {
            assert_eq!(Partial::from_pb(&x.to_pb()).unwrap(), *x);
        }
        for g in aggs {
            assert_eq!(Aggregate::from_pb(&g.to_pb()).unwrap(), g);
        }
        // No rows: nothing counted, no value; a share with none leaves the other as it is.
        let none = Folder::new(&t, &aggs).unwrap().partials;
        assert!(none.iter().all(|x| *x == Partial::default()));
        let mut m = whole.partials[3];
        m.merge(Min, Partial::default()).unwrap();
        assert_eq!(m, whole.partials[3]);
    }

    #[test]
    fn bad_aggregates_and_rows_are_errors() {
        let t = table();
        assert!(Folder::new(&t, &[agg(AggregateKind::Sum, 1)]).is_err(), "SUM of text");
        assert!(Folder::new(&t, &[agg(AggregateKind::Max, 9)]).is_err(), "no such column");
        assert!(Folder::new(&t, &[agg(AggregateKind::Count, 1)]).is_ok(), "COUNT of text");
        let mut f = Folder::new(&t, &[agg(AggregateKind::Sum, 2)]).unwrap();
        assert!(f.add_row(&[0, 1, 2]).is_err());
        assert!(f.add_row(&[]).is_err());
        assert!(Partial::from_pb(&pb::AggregateValue { n: 1, value: vec![1, 2] }).is_err());
        assert!(Aggregate::from_pb(&pb::Aggregate { kind: 99, column: 0 }).is_err());
        let mut s = Partial { n: 1, value: Some(i128::MAX) };
        assert!(s.merge(AggregateKind::Sum, Partial { n: 1, value: Some(1) }).is_err());
    }
}

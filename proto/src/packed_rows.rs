//! The rows of a many-key or range read as they travel: every row back to back in one buffer,
//! and where each one ends (`OpResult.packed_rows`, `OpResult.row_ends`). A row is empty when
//! its key has none. One buffer and one list of ends instead of a `repeated bytes` with a
//! length prefix, a buffer handle and a vector slot per row: decoding those was 8% of a SQL
//! node's instructions per sysbench `oltp_read_write` transaction.

use prost::bytes::Bytes;

use crate::error::ShoalError;
use crate::pb;

/// Rows in one buffer, each `data[ends[i - 1]..ends[i]]` (the first from 0). Checked when
/// made: the ends never go back and never pass the buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackedRows {
    data: Bytes,
    ends: Vec<u32>,
}

impl PackedRows {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        start..self.ends[i] as usize
    }

    /// Row `i`; panics past the end, as slices do.
    pub fn get(&self, i: usize) -> &[u8] {
        &self.data[self.range(i)]
    }

    /// Row `i` as a handle on the shared buffer (no copy).
    pub fn slice(&self, i: usize) -> Bytes {
        self.data.slice(self.range(i))
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The packed form of a many-key or range read's answer (`OpResult.packed_rows` and
    /// `row_ends`), or the older one (`OpResult.rows`, copied into one buffer: only a data
    /// node that predates packing answers so). The rows are taken out of `r`.
    pub fn from_pb(r: &mut pb::OpResult) -> Result<PackedRows, ShoalError> {
        if !r.rows.is_empty() {
            let mut w = RowsWriter::with_capacity(r.rows.len(), r.rows.iter().map(Bytes::len).sum());
            for row in std::mem::take(&mut r.rows) {
                w.buf().extend_from_slice(&row);
                w.end_row();
            }
            return Ok(w.finish());
        }
        let ends = std::mem::take(&mut r.row_ends);
        if !ends.len().is_multiple_of(4) {
            return Err(bad(format!("row ends take {} bytes, not 4 per row", ends.len())));
        }
        let ends: Vec<u32> = ends.chunks_exact(4).map(|e| u32::from_le_bytes([e[0], e[1], e[2], e[3]])).collect();
        let data = std::mem::take(&mut r.packed_rows);
        if !ends.is_sorted() || ends.last().is_some_and(|&e| e as usize > data.len()) {
            return Err(bad(format!("row ends out of order or past the {} bytes of rows", data.len())));
        }
        Ok(PackedRows { data, ends })
    }

    /// Puts the rows into `r` in the packed form.
    pub fn into_pb(self, r: &mut pb::OpResult) {
        r.row_ends = self.ends.iter().flat_map(|e| e.to_le_bytes()).collect::<Vec<u8>>().into();
        r.packed_rows = self.data;
    }

    /// The rows in the older form (`OpResult.rows`), for a caller that did not ask for them
    /// packed: each a handle on the shared buffer.
    pub fn into_each(self) -> Vec<Bytes> {
        (0..self.len()).map(|i| self.slice(i)).collect()
    }

    /// A range read's rows in the older form: those not empty, each with its place in the run
    /// (`OpResult.rows` and `row_offsets`).
    pub fn into_found(self) -> (Vec<Bytes>, Vec<u32>) {
        (0..self.len()).filter(|&i| !self.get(i).is_empty()).map(|i| (self.slice(i), i as u32)).unzip()
    }
}

fn bad(what: String) -> ShoalError {
    ShoalError::internal(format!("packed rows: {what}"))
}

/// Builds [`PackedRows`]: write a row's bytes into [`RowsWriter::buf`], then end it.
#[derive(Debug, Default)]
pub struct RowsWriter {
    data: Vec<u8>,
    ends: Vec<u32>,
}

impl RowsWriter {
    pub fn with_capacity(rows: usize, bytes: usize) -> RowsWriter {
        RowsWriter { data: Vec::with_capacity(bytes), ends: Vec::with_capacity(rows) }
    }

    /// Where the current row's bytes go.
    pub fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }

    /// Ends the current row (empty if nothing was written since the last end). The buffer of
    /// one answer stays far below 4 GiB: a data node reads at most `MAX_BATCH_OPS` (1,000)
    /// keys per batch, each row at most `MAX_ROW_BYTES` (64 KiB).
    pub fn end_row(&mut self) {
        self.ends.push(u32::try_from(self.data.len()).expect("an answer's rows fit in 4 GiB"));
    }

    pub fn finish(self) -> PackedRows {
        PackedRows { data: self.data.into(), ends: self.ends }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn rows(list: &[&[u8]]) -> PackedRows {
        let mut w = RowsWriter::default();
        for r in list {
            w.buf().extend_from_slice(r);
            w.end_row();
        }
        w.finish()
    }

    #[test]
    fn rows_cross_the_wire_packed_or_one_by_one() {
        let sent = rows(&[b"ab", b"", b"cde"]);
        assert_eq!(sent.iter().collect::<Vec<_>>(), [&b"ab"[..], b"", b"cde"]);
        let mut r = pb::OpResult::default();
        sent.clone().into_pb(&mut r);
        assert_eq!(r.row_ends.len(), 12);
        let got = PackedRows::from_pb(&mut r).unwrap();
        assert_eq!(got, sent);
        assert_eq!(got.slice(2), Bytes::from_static(b"cde"));
        assert!(r.packed_rows.is_empty() && r.row_ends.is_empty(), "taken out of the message");
        // The older form: one `bytes` per row.
        let mut old = pb::OpResult { rows: sent.clone().into_each(), ..Default::default() };
        assert_eq!(PackedRows::from_pb(&mut old).unwrap(), sent);
        assert_eq!(
            sent.clone().into_found(),
            (vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cde")], vec![0, 2])
        );
        // Nothing at all: no rows.
        assert!(PackedRows::from_pb(&mut pb::OpResult::default()).unwrap().is_empty());
    }

    #[test]
    fn damaged_ends_are_refused() {
        let ends = |e: &[u32]| Bytes::from(e.iter().flat_map(|e| e.to_le_bytes()).collect::<Vec<u8>>());
        let data = Bytes::from_static(b"abcd");
        for bad_ends in [ends(&[2, 1]), ends(&[5]), Bytes::from_static(&[1, 0, 0])] {
            let mut r = pb::OpResult { packed_rows: data.clone(), row_ends: bad_ends, ..Default::default() };
            assert_eq!(PackedRows::from_pb(&mut r).unwrap_err().code, ErrorCode::Internal);
        }
        let mut r = pb::OpResult { packed_rows: data, row_ends: ends(&[1, 4]), ..Default::default() };
        assert_eq!(PackedRows::from_pb(&mut r).unwrap().get(1), b"bcd");
    }
}

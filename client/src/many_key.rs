//! Many-key reads: the reads of one table in a request to a data node travel as one operation
//! carrying all their encoded keys (`Op.keys`), answered by one result with a row per key
//! (packed: `shoal_proto::packed_rows`). Framing per key — an `Op` and an `OpResult` each,
//! with the table, the wanted columns and the flags repeated — was a large part of what a
//! 100-row range read cost on both ends. Callers keep seeing one result per operation:
//! [`unpack`] splits the answer.

use shoal_proto::packed_rows::PackedRows;
use shoal_proto::pb;
use shoal_proto::ShoalError;

/// The operations to send for `ops` (in this order), and for each the positions in `ops` it
/// carries. Reads by encoded key of one table and column list become one many-key read when
/// there are two or more of them; everything else goes as it is.
pub(crate) fn pack(ops: Vec<pb::Op>) -> (Vec<pb::Op>, Vec<Vec<usize>>) {
    let mut out: Vec<pb::Op> = Vec::with_capacity(ops.len());
    let mut members: Vec<Vec<usize>> = Vec::with_capacity(ops.len());
    // Index in `out` of the many-key read of each (table, columns) seen so far: a request
    // names a handful of tables, so a list does.
    let mut groups: Vec<usize> = vec![];
    for (i, op) in ops.into_iter().enumerate() {
        let packable = op.kind == pb::OpKind::Read as i32 && !op.key_data.is_empty() && op.keys.is_empty();
        if !packable {
            out.push(op);
            members.push(vec![i]);
            continue;
        }
        let group = groups.iter().copied().find(|&g| out[g].table_id == op.table_id && out[g].columns == op.columns);
        match group {
            Some(g) => {
                let many = &mut out[g];
                if many.keys.is_empty() {
                    // The second read of the group: the first becomes a many-key read.
                    many.keys.push(std::mem::take(&mut many.key_data));
                    many.key_partitions.push(many.partition);
                    many.partition = 0;
                    many.packed_rows = true;
                }
                many.keys.push(op.key_data);
                many.key_partitions.push(op.partition);
                members[g].push(i);
            }
            None => {
                groups.push(out.len());
                out.push(op);
                members.push(vec![i]);
            }
        }
    }
    (out, members)
}

/// One result per operation [`pack`] was given, in its order, from the results of the packed
/// operations.
pub(crate) fn unpack(members: &[Vec<usize>], results: Vec<pb::OpResult>) -> Vec<pb::OpResult> {
    let n = members.iter().map(Vec::len).sum();
    let mut out: Vec<Option<pb::OpResult>> = vec![None; n];
    for (carried, mut r) in members.iter().zip(results) {
        if let [i] = carried.as_slice() {
            out[*i] = Some(r);
            continue;
        }
        if r.error.is_some() {
            for &i in carried {
                out[i] = Some(pb::OpResult { error: r.error.clone(), ..Default::default() });
            }
            continue;
        }
        let rows = PackedRows::from_pb(&mut r).and_then(|rows| match rows.len() == carried.len() {
            true => Ok(rows),
            false => Err(ShoalError::internal(format!("{} rows answered {} keys", rows.len(), carried.len()))),
        });
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                for &i in carried {
                    out[i] = Some(pb::OpResult { error: Some(e.clone().into()), ..Default::default() });
                }
                continue;
            }
        };
        for (at, &i) in carried.iter().enumerate() {
            let row = rows.slice(at);
            out[i] = Some(pb::OpResult { found: !row.is_empty(), row_data: row, ..Default::default() });
        }
    }
    out.into_iter()
        .map(|r| {
            r.unwrap_or_else(|| pb::OpResult {
                error: Some(ShoalError::internal("no answer").into()),
                ..Default::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::bytes::Bytes;

    fn read(table: u32, partition: u32, key: &'static [u8]) -> pb::Op {
        pb::Op {
            kind: pb::OpKind::Read as i32,
            table_id: table,
            partition,
            key_data: Bytes::from_static(key),
            ..Default::default()
        }
    }

    #[test]
    fn reads_of_one_table_travel_together_and_answer_in_order() {
        let write = pb::Op { kind: pb::OpKind::Delete as i32, table_id: 1, partition: 3, ..Default::default() };
        let ops = vec![read(1, 0, b"a"), read(2, 5, b"x"), write, read(1, 7, b"b"), read(1, 0, b"c")];
        let (packed, members) = pack(ops);
        assert_eq!(members, vec![vec![0, 3, 4], vec![1], vec![2]]);
        assert_eq!(packed[0].keys, vec![Bytes::from_static(b"a"), Bytes::from_static(b"b"), Bytes::from_static(b"c")]);
        assert_eq!(packed[0].key_partitions, vec![0, 7, 0]);
        assert!(packed[0].key_data.is_empty() && packed[0].packed_rows);
        assert_eq!(packed[1].key_data, Bytes::from_static(b"x"), "a lone read goes as it is");
        assert!(packed[1].keys.is_empty() && !packed[1].packed_rows);

        let mut many = pb::OpResult::default();
        let rows = [Bytes::from_static(b"ra"), Bytes::new(), Bytes::from_static(b"rc")];
        crate::read_many::tests::packed_rows(&rows).into_pb(&mut many);
        let results = vec![
            many,
            pb::OpResult { found: true, row_data: Bytes::from_static(b"rx"), ..Default::default() },
            pb::OpResult { gci: 9, ..Default::default() },
        ];
        let each = unpack(&members, results);
        let rows: Vec<(bool, &[u8])> = each.iter().map(|r| (r.found, r.row_data.as_ref())).collect();
        assert_eq!(rows, vec![(true, &b"ra"[..]), (true, b"rx"), (false, b""), (false, b""), (true, b"rc")]);
        assert_eq!(each[2].gci, 9);
    }

    #[test]
    fn an_error_or_a_short_answer_fails_every_key_it_carried() {
        let (_, members) = pack(vec![read(1, 0, b"a"), read(1, 1, b"b")]);
        let failed = pb::OpResult {
            error: Some(ShoalError::new(shoal_proto::ErrorCode::NotPrimary, "moved").into()),
            ..Default::default()
        };
        assert!(unpack(&members, vec![failed]).iter().all(|r| r.error.is_some()));
        let short = pb::OpResult { found: true, rows: vec![Bytes::from_static(b"r")], ..Default::default() };
        assert!(unpack(&members, vec![short]).iter().all(|r| r.error.is_some()));
    }
}

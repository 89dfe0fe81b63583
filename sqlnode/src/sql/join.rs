//! Joins in the SQL node: inner, left and right, over rows already read.
//!
//! One side drives (the left one; the right one for RIGHT JOIN) and streams its rows; the other
//! is held in memory — the rows a scan or derived table already holds, or a nested join's rows
//! gathered once (bounded by `MAX_BUFFERED_ROWS`). When the ON condition (or WHERE) has column
//! equalities the planner found hashable, the held side is indexed on them once per run and each
//! driving row looks up its candidates; otherwise every pair is tried (nested loops). Either way
//! the whole ON condition decides, so hashing only narrows the candidates. Rows come out in the
//! driving side's order. Pushing joins into the data nodes is its own issue (DESIGN §6).

use std::borrow::Cow;
use std::collections::HashMap;

use crate::error::SqlResult;
use crate::sql::expr::Outer;
use crate::sql::query::{From, Join, JoinKind};
use crate::sql::select::{derived_rows, each_row, too_many, MAX_BUFFERED_ROWS};
use crate::val::Val;

/// The rows of a FROM tree, borrowed when they are already in memory.
fn held_rows<'a>(from: &'a From, outer: Option<&Outer<'_>>) -> SqlResult<Cow<'a, [Vec<Val>]>> {
    match from {
        From::Scan(s) => match s.rows.get() {
            Some(r) => Ok(Cow::Borrowed(r.as_slice())),
            None => Err(crate::error::SqlError::internal(format!("table {} was not read", s.table.name))),
        },
        From::Derived(d) => Ok(Cow::Borrowed(derived_rows(d)?.as_slice())),
        From::Values(v) => Ok(Cow::Borrowed(v.rows.as_slice())),
        From::Work { table, .. } => Ok(Cow::Owned(table.rows().to_vec())),
        other => {
            let mut rows = vec![];
            let mut over = false;
            each_row(other, outer, &mut |r| {
                if rows.len() >= MAX_BUFFERED_ROWS {
                    over = true;
                    return Ok(false);
                }
                rows.push(r);
                Ok(true)
            })?;
            if over {
                return Err(too_many("rows", MAX_BUFFERED_ROWS));
            }
            Ok(Cow::Owned(rows))
        }
    }
}

/// A hash key for join matching, or None when a key value is NULL (NULL matches nothing).
/// Numbers hash by their double value and text by its bytes: values that compare equal hash
/// equal (the planner hashes only numeric-numeric and text-text pairs).
fn join_key(row: &[Val], cols: impl Iterator<Item = usize>) -> Option<Vec<u8>> {
    let mut k = vec![];
    for c in cols {
        match row.get(c)? {
            Val::Null => return None,
            Val::Str(s) => {
                k.push(1);
                k.extend_from_slice(&(s.len() as u64).to_le_bytes());
                k.extend_from_slice(s.as_bytes());
            }
            Val::Bytes(b) => {
                k.push(1);
                k.extend_from_slice(&(b.len() as u64).to_le_bytes());
                k.extend_from_slice(b);
            }
            v => {
                let f = v.to_f64().unwrap_or(0.0);
                let f = if f == 0.0 { 0.0 } else { f };
                k.push(0);
                k.extend_from_slice(&f.to_bits().to_le_bytes());
            }
        }
    }
    Some(k)
}

/// Calls `f` with every row of the join until it returns false; false when stopped.
pub fn each(j: &Join, outer: Option<&Outer<'_>>, f: &mut dyn FnMut(Vec<Val>) -> SqlResult<bool>) -> SqlResult<bool> {
    // For RIGHT JOIN the right side drives; rows are still laid out left columns first.
    let right_drives = j.kind == JoinKind::Right;
    let (driver, held) = if right_drives { (&j.right, &j.left) } else { (&j.left, &j.right) };
    let held_rows = held_rows(held, outer)?;
    let (driver_cols, held_cols): (Vec<usize>, Vec<usize>) =
        if right_drives { j.hash.iter().map(|&(l, r)| (r, l)).unzip() } else { j.hash.iter().copied().unzip() };
    let index: Option<HashMap<Vec<u8>, Vec<usize>>> = (!j.hash.is_empty()).then(|| {
        let mut m: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
        for (i, r) in held_rows.iter().enumerate() {
            if let Some(k) = join_key(r, held_cols.iter().copied()) {
                m.entry(k).or_default().push(i);
            }
        }
        m
    });
    // Nested loops: every held row is a candidate.
    let all: Vec<usize> = if index.is_none() { (0..held_rows.len()).collect() } else { vec![] };
    let outer_join = j.kind != JoinKind::Inner;
    let held_width = if right_drives { j.left_width } else { j.right_width };
    each_row(driver, outer, &mut |d| {
        let candidates: &[usize] = match &index {
            Some(ix) => match join_key(&d, driver_cols.iter().copied()) {
                Some(k) => ix.get(&k).map_or(&[], |v| v.as_slice()),
                None => &[],
            },
            None => &all,
        };
        let mut matched = false;
        for &i in candidates {
            let h = &held_rows[i];
            let row = if right_drives { concat(h, &d) } else { concat(&d, h) };
            if let Some(on) = &j.on {
                if on.eval_in(&row, &[], outer)?.truth() != Some(true) {
                    continue;
                }
            }
            matched = true;
            if !f(row)? {
                return Ok(false);
            }
        }
        if outer_join && !matched {
            let nulls = vec![Val::Null; held_width];
            let row = if right_drives { concat(&nulls, &d) } else { concat(&d, &nulls) };
            if !f(row)? {
                return Ok(false);
            }
        }
        Ok(true)
    })
}

fn concat(a: &[Val], b: &[Val]) -> Vec<Val> {
    let mut r = Vec::with_capacity(a.len() + b.len());
    r.extend_from_slice(a);
    r.extend_from_slice(b);
    r
}

//! sqllogictest files: parsing, result formatting and comparison, without a database.
//!
//! The corpus in `../shared/sqllogictest/` is SQLite's, with expected results regenerated against
//! MySQL 8 (dolthub/sqllogictest). Its rules, as this module applies them:
//!
//! - `statement ok|error`, then SQL up to a blank line; `query <types> <sort> [label]`, then SQL,
//!   `----` and one expected value per line (or `N values hashing to <md5>`).
//! - `skipif <engine>` / `onlyif <engine>` (anything after the engine is a comment) guard the
//!   next record; the engine here is `mysql`. `halt` (when its guards let it run) ends the file.
//! - Values are formatted by the record's column type: `I` integers (a whole number written
//!   with a fraction, such as `3.0000`, compares as `3`), `R` reals printed with three decimals,
//!   `T` text; NULL is `NULL`, the empty string `(empty)`.
//! - `rowsort` sorts rows, `valuesort` sorts all values, `nosort` keeps the server's order;
//!   comparison happens after sorting. A hashed result is the MD5 of every value followed by a
//!   newline.
#![allow(dead_code)]

pub mod md5;

/// The engine name this runner answers to in `skipif` / `onlyif`.
pub const ENGINE: &str = "mysql";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    None,
    Row,
    Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    Values(Vec<String>),
    Hash { count: usize, md5: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Statement { ok: bool },
    Query { types: Vec<u8>, sort: Sort, expected: Expected },
    Halt,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// 1-based line of the record's first line (after its guards).
    pub line: usize,
    pub sql: String,
    pub kind: Kind,
}

/// Parses a test file into the records that run for [`ENGINE`] (guards already applied).
pub fn parse(text: &str) -> Result<Vec<Record>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = vec![];
    let mut i = 0;
    // Guards of the next record: (onlyif?, engine).
    let mut guards: Vec<(bool, String)> = vec![];
    while i < lines.len() {
        let line = lines[i].trim_end();
        let words: Vec<&str> = line.split_whitespace().collect();
        let first = words.first().copied().unwrap_or("");
        if first.is_empty() || first.starts_with('#') {
            i += 1;
            continue;
        }
        let runs = |guards: &[(bool, String)]| {
            let skipped = guards.iter().any(|(only, e)| !only && e == ENGINE);
            let onlys: Vec<&String> = guards.iter().filter(|(only, _)| *only).map(|(_, e)| e).collect();
            !skipped && (onlys.is_empty() || onlys.iter().any(|e| *e == ENGINE))
        };
        match first {
            "skipif" | "onlyif" => {
                let engine = words.get(1).ok_or_else(|| format!("line {}: {first} without an engine", i + 1))?;
                guards.push((first == "onlyif", engine.to_string()));
                i += 1;
            }
            "hash-threshold" => {
                // Whether a result is hashed is written in the expected result itself.
                i += 1;
            }
            "halt" => {
                if runs(&guards) {
                    out.push(Record { line: i + 1, sql: String::new(), kind: Kind::Halt });
                }
                guards.clear();
                i += 1;
            }
            "statement" | "query" => {
                let start = i + 1;
                i += 1;
                let mut sql = vec![];
                while i < lines.len() && !lines[i].trim().is_empty() && lines[i].trim_end() != "----" {
                    sql.push(lines[i]);
                    i += 1;
                }
                let mut results = vec![];
                if i < lines.len() && lines[i].trim_end() == "----" {
                    i += 1;
                    while i < lines.len() && !lines[i].trim().is_empty() {
                        results.push(lines[i].trim_end().to_string());
                        i += 1;
                    }
                }
                let kind = if first == "statement" {
                    match words.get(1).copied() {
                        Some("ok") => Kind::Statement { ok: true },
                        Some("error") => Kind::Statement { ok: false },
                        other => return Err(format!("line {start}: statement {other:?}")),
                    }
                } else {
                    let types = words.get(1).ok_or_else(|| format!("line {start}: query without types"))?;
                    let sort = match words.get(2).copied() {
                        None | Some("nosort") => Sort::None,
                        Some("rowsort") => Sort::Row,
                        Some("valuesort") => Sort::Value,
                        Some(other) => return Err(format!("line {start}: unknown sort mode {other}")),
                    };
                    Kind::Query { types: types.as_bytes().to_vec(), sort, expected: expected(results) }
                };
                if runs(&guards) {
                    out.push(Record { line: start, sql: sql.join("\n"), kind });
                }
                guards.clear();
            }
            other => return Err(format!("line {}: unknown record {other}", i + 1)),
        }
    }
    Ok(out)
}

fn expected(results: Vec<String>) -> Expected {
    if let [one] = results.as_slice() {
        let w: Vec<&str> = one.split_whitespace().collect();
        if let [n, "values", "hashing", "to", h] = w.as_slice() {
            if let Ok(count) = n.parse() {
                return Expected::Hash { count, md5: h.to_string() };
            }
        }
    }
    Expected::Values(results)
}

/// One value as the corpus writes it for a column of type `ty` (`None` is SQL NULL).
pub fn format_value(v: Option<&[u8]>, ty: u8) -> String {
    let Some(bytes) = v else { return "NULL".into() };
    let s = String::from_utf8_lossy(bytes).into_owned();
    match ty {
        b'I' => {
            if s.parse::<i128>().is_ok() {
                return s;
            }
            match s.parse::<f64>() {
                Ok(f) if f.is_finite() && f.trunc() == f && f.abs() < 1e19 => format!("{}", f as i128),
                _ => s,
            }
        }
        b'R' => match s.parse::<f64>() {
            Ok(f) => format!("{f:.3}"),
            Err(_) => s,
        },
        _ if s.is_empty() => "(empty)".into(),
        _ => s,
    }
}

/// Why a query's result does not match, or None when it does. `rows` are formatted values.
pub fn check(types: &[u8], sort: Sort, expected: &Expected, mut rows: Vec<Vec<String>>) -> Option<String> {
    if let Some(r) = rows.first() {
        if r.len() != types.len() {
            return Some(format!("{} columns, expected {}", r.len(), types.len()));
        }
    }
    if sort == Sort::Row {
        rows.sort();
    }
    let mut values: Vec<String> = rows.into_iter().flatten().collect();
    if sort == Sort::Value {
        values.sort();
    }
    match expected {
        Expected::Values(want) => {
            if values.len() != want.len() {
                return Some(format!("{} values, expected {}", values.len(), want.len()));
            }
            let bad = values.iter().zip(want).position(|(a, b)| a != b)?;
            Some(format!("value {bad} is {:?}, expected {:?}", values[bad], want[bad]))
        }
        Expected::Hash { count, md5: want } => {
            if values.len() != *count {
                return Some(format!("{} values, expected {count}", values.len()));
            }
            let mut h = md5::Md5::new();
            for v in &values {
                h.update(v.as_bytes());
                h.update(b"\n");
            }
            let got = h.hex();
            (got != *want).then(|| format!("hash {got}, expected {want}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_guards_queries_and_hashes() {
        let text = "hash-threshold 8\n\nstatement ok\nCREATE TABLE t(a INT)\n\n\
                    skipif mysql # not here\nstatement ok\nSELECT 1\n\n\
                    onlyif mysql # only here\nquery II rowsort label-1\nSELECT a,\n b FROM t\n----\n1\n2\n\n\
                    onlyif sqlite\nhalt\n\n\
                    query T nosort\nSELECT x\n----\n30 values hashing to abc\n\n\
                    statement error\nSELEC\n\nskipif sqlite\nhalt\n\nstatement ok\nnever\n";
        let r = parse(text).unwrap();
        assert_eq!(r.len(), 6, "{r:#?}");
        assert_eq!(r[0].kind, Kind::Statement { ok: true });
        assert_eq!(r[1].sql, "SELECT a,\n b FROM t");
        assert_eq!(
            r[1].kind,
            Kind::Query {
                types: b"II".to_vec(),
                sort: Sort::Row,
                expected: Expected::Values(vec!["1".into(), "2".into()])
            }
        );
        assert!(matches!(&r[2].kind, Kind::Query { expected: Expected::Hash { count: 30, .. }, .. }));
        assert_eq!(r[3].kind, Kind::Statement { ok: false });
        assert_eq!(r[4].kind, Kind::Halt);
        // Records after a halt are parsed; the runner stops at the halt.
        assert_eq!(r[5].sql, "never");
    }

    #[test]
    fn formats_like_the_corpus() {
        assert_eq!(format_value(None, b'I'), "NULL");
        assert_eq!(format_value(Some(b"42"), b'I'), "42");
        assert_eq!(format_value(Some(b"3.0000"), b'I'), "3");
        assert_eq!(format_value(Some(b"-2.5"), b'I'), "-2.5");
        assert_eq!(format_value(Some(b"7"), b'R'), "7.000");
        assert_eq!(format_value(Some(b"0.12345"), b'R'), "0.123");
        assert_eq!(format_value(Some(b"-1.0005"), b'R'), "-1.000");
        assert_eq!(format_value(Some(b""), b'T'), "(empty)");
        assert_eq!(format_value(Some(b"abc"), b'T'), "abc");
    }

    #[test]
    fn compares_sorted_and_hashed_results() {
        let rows = vec![vec!["2".to_string(), "b".into()], vec!["1".into(), "a".into()]];
        let want = Expected::Values(vec!["1".into(), "a".into(), "2".into(), "b".into()]);
        assert_eq!(check(b"IT", Sort::Row, &want, rows.clone()), None);
        assert!(check(b"IT", Sort::None, &want, rows.clone()).is_some());
        let vs = Expected::Values(vec!["1".into(), "2".into(), "a".into(), "b".into()]);
        assert_eq!(check(b"IT", Sort::Value, &vs, rows.clone()), None);
        // md5("1\na\n2\nb\n")
        let mut h = md5::Md5::new();
        h.update(b"1\na\n2\nb\n");
        let hashed = Expected::Hash { count: 4, md5: h.hex() };
        assert_eq!(check(b"IT", Sort::Row, &hashed, rows), None);
    }
}

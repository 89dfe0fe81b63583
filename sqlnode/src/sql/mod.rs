//! The SQL layer without sockets or cluster: parsing, binding, expressions, access paths, query
//! plans and their in-memory execution (joins, subqueries, set operations).

pub mod bind;
pub mod expr;
pub mod join;
pub mod parse;
pub mod plan;
pub mod query;
pub mod select;
pub mod subquery;

#[cfg(test)]
mod robustness {
    use sqlparser::ast::{SelectItem, SetExpr, Statement};

    use super::bind::{Binder, Env};
    use super::parse::{classify, parse_one, placeholders, select_item_texts, substitute};
    use crate::val::Val;

    const CORPUS: &[&str] = &[
        "SELECT 1+1, 'a' LIKE 'a%', CAST('12' AS SIGNED), COALESCE(NULL, 2.5) * 3 / 0",
        "SELECT CONCAT('x', 1), SUBSTRING('hello', -2, 5), ROUND(2.555, 2), -9223372036854775808 - 1",
        "SELECT CASE WHEN 1 THEN 'a' ELSE NULL END, 5 BETWEEN 1 AND 9, 3 IN (1, NULL, 3), NOT NULL",
        "SET SESSION autocommit = 1, NAMES utf8mb4",
        "SHOW FULL COLUMNS FROM t FROM d LIKE 'x%'",
        "CREATE TABLE t (a INT PRIMARY KEY AUTO_INCREMENT, b VARCHAR(10) DEFAULT 'x', c DECIMAL(5,2))",
        "INSERT INTO t (a, b) VALUES (1, 'it''s'), (2, ?)",
        "UPDATE t SET b = CONCAT(b, ?) WHERE a IN (1, 2, 3) LIMIT 2",
        "SELECT a, COUNT(*) AS n FROM t WHERE b IS NOT NULL GROUP BY a HAVING n > 1 ORDER BY 2 DESC LIMIT 1, 5",
    ];

    /// Mutated statements never panic the parser, the binder or the evaluator.
    #[test]
    fn mutated_sql_never_panics() {
        let env = Env { version: "8.0.36-shoal".into(), ..Env::default() };
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let alphabet: Vec<char> = "()',;*+-/%<>=!`\"\\ ?.0123456789eE@aAzZ_é\u{0}\n".chars().collect();
        for base in CORPUS {
            for _ in 0..300 {
                let mut chars: Vec<char> = base.chars().collect();
                for _ in 0..(1 + next() % 4) {
                    let pos = (next() as usize) % (chars.len() + 1);
                    let c = alphabet[(next() as usize) % alphabet.len()];
                    match next() % 3 {
                        0 if pos < chars.len() => {
                            chars.remove(pos);
                        }
                        1 if pos < chars.len() => chars[pos] = c,
                        _ => chars.insert(pos, c),
                    }
                }
                let sql: String = chars.into_iter().collect();
                let _ = classify(&sql);
                let _ = select_item_texts(&sql);
                let at = placeholders(&sql);
                let sql = substitute(&sql, &at, &vec![Val::Str("o'k\\".into()); at.len()]);
                let Ok(Statement::Query(q)) = parse_one(&sql) else { continue };
                let SetExpr::Select(s) = *q.body else { continue };
                if !s.from.is_empty() {
                    continue;
                }
                for item in &s.projection {
                    if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
                        if let Ok(bound) = Binder::new(&env, None, "field list").bind(e) {
                            let _ = bound.eval(&[], &[]);
                        }
                    }
                }
            }
        }
    }
}

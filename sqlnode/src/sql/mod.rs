//! The SQL layer without sockets or cluster: parsing, binding, expressions, access paths, query
//! plans and their in-memory execution (joins, subqueries, set operations).

pub mod account;
pub mod agg_pushdown;
pub mod bind;
pub mod explain;
pub mod expr;
pub mod func;
pub mod join;
pub mod parse;
pub mod plan;
pub mod query;
pub mod select;
pub mod subquery;
pub mod window;

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
        "CREATE DEFINER=`r`@`%` TRIGGER d.tr BEFORE UPDATE ON t FOR EACH ROW BEGIN IF NEW.a < OLD.a THEN \
         SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no'; ELSE SET NEW.b = CONCAT(OLD.b, 'x'); END IF; END",
        "DROP TRIGGER IF EXISTS d.tr",
    ];

    const QUERIES: &[&str] = &[
        "SELECT a, b FROM t1 JOIN t2 ON t1.a = t2.x WHERE c > 1.5 ORDER BY 1 LIMIT 3",
        "SELECT * FROM t1 LEFT JOIN t2 ON a = x AND y IS NULL RIGHT JOIN t1 AS z ON z.a = t2.y",
        "SELECT a, (SELECT COUNT(*) FROM t2 WHERE t2.x < t1.a) FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE y = a)",
        "SELECT b FROM t1 WHERE a IN (SELECT x FROM t2) OR a > ALL (SELECT y FROM t2) GROUP BY b HAVING COUNT(*) > 0",
        "SELECT a FROM t1 UNION SELECT x FROM t2 INTERSECT SELECT y FROM t2 EXCEPT SELECT 1 ORDER BY 1 DESC LIMIT 2",
        "SELECT d.k, COUNT(DISTINCT d.k) FROM (SELECT a AS k FROM t1, t2 WHERE a = x) AS d GROUP BY d.k",
        "SELECT MIN(DISTINCT c), SUM(a) / COUNT(*) FROM t1 CROSS JOIN t2 WHERE NOT (a BETWEEN x AND y)",
        "SELECT a, RANK() OVER (PARTITION BY b ORDER BY c DESC), SUM(a) OVER (ORDER BY a ROWS BETWEEN 1 PRECEDING \
         AND 2 FOLLOWING), NTILE(3) OVER (ORDER BY a), LEAD(b, 2, 'z') OVER (ORDER BY a) FROM t1",
        "SELECT b, COUNT(*), PERCENT_RANK() OVER (ORDER BY COUNT(*)), LAST_VALUE(b) OVER () FROM t1 GROUP BY b",
    ];

    /// Two tables: t1 (a INT primary key, b VARCHAR(8), c DOUBLE) with 4 rows, t2 (x, y INT).
    fn catalog() -> crate::sql::query::Catalog {
        use crate::sql::query::{Catalog, Entry};
        use shoal_proto::{Column, ColumnType, Table, TableSpec};

        let table = |id, name: &str, cols: Vec<(&str, ColumnType, &str)>, pk: Vec<u32>| {
            let columns = cols
                .into_iter()
                .map(|(n, ty, sql)| {
                    let mut c = Column::new(n, ty).nullable();
                    c.sql_type = sql.into();
                    c
                })
                .collect();
            let (spec, hidden_pk) =
                TableSpec { name: format!("d.{name}"), columns, primary_key: pk, partition_key: vec![] }
                    .normalize()
                    .unwrap();
            crate::sql::bind::TableRef::new(
                "d",
                name,
                Table { id, spec, partition_count: 4, schema_version: 1, hidden_pk, ..Default::default() },
            )
        };
        let mut catalog = Catalog::new(Some("d".into()));
        let t1 = table(
            1,
            "t1",
            vec![
                ("a", ColumnType::Int, "int"),
                ("b", ColumnType::Text, "varchar(8)"),
                ("c", ColumnType::Float, "double"),
            ],
            vec![0],
        );
        let t2 = table(2, "t2", vec![("x", ColumnType::Int, "int"), ("y", ColumnType::Int, "int")], vec![]);
        catalog.insert("d", "t1", Entry::Table(t1));
        catalog.insert("d", "t2", Entry::Table(t2));
        catalog
    }

    /// The rows of a table of [`catalog`].
    fn rows_of(name: &str) -> Vec<Vec<Val>> {
        if name == "t1" {
            (0..4).map(|i| vec![Val::Int(i), Val::Str(format!("s{}", i % 2)), Val::Float(i as f64 * 0.75)]).collect()
        } else {
            (0..3).map(|i| vec![Val::Int(i), if i == 1 { Val::Null } else { Val::Int(3 - i) }]).collect()
        }
    }

    /// Runs a query over [`catalog`] in memory.
    fn run(sql: &str) -> Vec<Vec<Val>> {
        let env = Env { version: "8.0.36-shoal".into(), ..Env::default() };
        let catalog = catalog();
        let Ok(Statement::Query(q)) = parse_one(sql) else { panic!("{sql} does not parse") };
        let plan = crate::sql::query::Planner::new(&env, &catalog).query(&q, sql, &[], None).unwrap();
        let mut scans = vec![];
        plan.scans(&mut scans);
        for s in scans {
            let _ = s.rows.set(rows_of(&s.table.name));
        }
        crate::sql::select::run(&plan, None).unwrap()
    }

    /// An output that is a plain column takes the row's value instead of a copy
    /// (`SelectRun::moves`): whatever else reads that column must still see it.
    #[test]
    fn outputs_that_take_their_column_leave_it_to_the_rest() {
        let s = |x: &str| Val::Str(x.into());
        assert_eq!(
            run("SELECT b, CONCAT(b, 'x') FROM t1 WHERE a < 2 ORDER BY a"),
            [vec![s("s0"), s("s0x")], vec![s("s1"), s("s1x")]]
        );
        assert_eq!(
            run("SELECT CONCAT(b, 'x'), b FROM t1 WHERE a < 2 ORDER BY a DESC"),
            [vec![s("s1x"), s("s1")], vec![s("s0x"), s("s0")]]
        );
        assert_eq!(
            run("SELECT b, a, b FROM t1 WHERE a < 2 ORDER BY b DESC, a"),
            [vec![s("s1"), Val::Int(1), s("s1")], vec![s("s0"), Val::Int(0), s("s0")]]
        );
        assert_eq!(run("SELECT b FROM t1 ORDER BY CONCAT(b, a) DESC"), [[s("s1")], [s("s1")], [s("s0")], [s("s0")]]);
        assert_eq!(
            run("SELECT a, a * 2 FROM t1 ORDER BY a DESC LIMIT 2"),
            [[Val::Int(3), Val::Int(6)], [Val::Int(2), Val::Int(4)]]
        );
        assert_eq!(run("SELECT DISTINCT b FROM t1 ORDER BY b"), [[s("s0")], [s("s1")]]);
        assert_eq!(
            run("SELECT b, COUNT(*), MAX(b) FROM t1 GROUP BY b HAVING b > 's' ORDER BY b DESC"),
            [[s("s1"), Val::Int(2), s("s1")], [s("s0"), Val::Int(2), s("s0")]]
        );
    }

    /// The next number of a xorshift sequence (state `x`, never 0).
    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// `base` with `edits` random edits, each deleting, replacing or inserting one character
    /// (from `alphabet`) at a random place.
    fn mutate(base: &str, edits: u64, x: &mut u64, alphabet: &[char]) -> String {
        let mut chars: Vec<char> = base.chars().collect();
        for _ in 0..edits {
            let pos = (xorshift(x) as usize) % (chars.len() + 1);
            let c = alphabet[(xorshift(x) as usize) % alphabet.len()];
            match xorshift(x) % 3 {
                0 if pos < chars.len() => {
                    chars.remove(pos);
                }
                1 if pos < chars.len() => chars[pos] = c,
                _ => chars.insert(pos, c),
            }
        }
        chars.into_iter().collect()
    }

    /// Mutated queries over two tables never panic the planner or the executor.
    #[test]
    fn mutated_queries_never_panic() {
        use crate::sql::query::Planner;

        let catalog = catalog();
        let env = Env { version: "8.0.36-shoal".into(), ..Env::default() };
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let alphabet: Vec<char> = "()',*+-/<>=! ?.0123abxyt12ANDORNOTIN".chars().collect();
        let mut ran = 0;
        for base in QUERIES {
            for round in 0..2000 {
                // The first round of each query runs it as written.
                let edits = if round == 0 { 0 } else { 1 + xorshift(&mut x) % 3 };
                let sql = mutate(base, edits, &mut x, &alphabet);
                let Ok(Statement::Query(q)) = parse_one(&sql) else { continue };
                let planner = Planner::new(&env, &catalog);
                let Ok(plan) = planner.query(&q, &sql, &[], None) else {
                    assert!(round > 0, "{sql} does not plan");
                    continue;
                };
                let mut scans = vec![];
                plan.scans(&mut scans);
                for s in scans {
                    let _ = s.rows.set(rows_of(&s.table.name));
                }
                let r = crate::sql::select::run(&plan, None);
                assert!(round > 0 || r.is_ok(), "{sql}: {r:?}");
                ran += 1;
            }
        }
        assert!(ran > 350, "only {ran} mutated queries planned and ran");
    }

    /// Mutated statements never panic the parser, the binder or the evaluator.
    #[test]
    fn mutated_sql_never_panics() {
        let env = Env { version: "8.0.36-shoal".into(), ..Env::default() };
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let alphabet: Vec<char> = "()',;*+-/%<>=!`\"\\ ?.0123456789eE@aAzZ_é\u{0}\n".chars().collect();
        for base in CORPUS {
            for _ in 0..300 {
                let edits = 1 + xorshift(&mut x) % 4;
                let sql = mutate(base, edits, &mut x, &alphabet);
                let _ = classify(&sql);
                if let Ok(t) = crate::trigger::parse::parse_create(&sql) {
                    let _ = crate::trigger::parse::program(&t.body);
                    let _ = crate::trigger::parse::row_refs(&t.body);
                }
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

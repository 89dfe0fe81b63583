//! Parsing. Session and catalog statements (SET, USE, SHOW, DESCRIBE, BEGIN/COMMIT, CREATE/DROP
//! DATABASE) are recognized here from their tokens, because sqlparser's coverage of them varies
//! (it does not parse `SET SESSION a=1, NAMES x`, for one); everything else goes through
//! sqlparser's MySQL dialect.

use sqlparser::ast::Statement;
use sqlparser::dialect::MySqlDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Location, Token, Tokenizer};

use crate::error::{SqlError, SqlResult};
use crate::val::{format_double, Val};

/// Longest statement text accepted (MySQL's max_allowed_packet bounds it the same way).
pub const MAX_SQL_BYTES: usize = 16 * 1024 * 1024;
/// Deepest expression nesting the parser follows (sqlparser counts about two levels per
/// parenthesis). Binding and evaluation recurse as deep; a test checks that this depth fits in
/// [`WORKER_STACK_BYTES`], so deep input is a syntax error, never a stack overflow.
pub const MAX_PARSE_DEPTH: usize = 128;
/// Stack of the SQL node's worker threads: statements are parsed, bound and evaluated
/// recursively on them (debug builds need several KiB per level).
pub const WORKER_STACK_BYTES: usize = 16 << 20;

/// BEGIN, COMMIT or ROLLBACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnControl {
    Begin,
    Commit,
    Rollback,
}

/// SAVEPOINT name, ROLLBACK TO [SAVEPOINT] name, RELEASE SAVEPOINT name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SavepointOp {
    Set(String),
    RollbackTo(String),
    Release(String),
}

/// A statement handled without sqlparser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admin {
    Savepoint(SavepointOp),
    /// Nothing but whitespace and comments.
    Empty,
    /// SET of session variables: (name, value text). Accepted; `autocommit` is remembered.
    Set(Vec<(String, String)>),
    Use(String),
    ShowDatabases {
        like: Option<String>,
    },
    ShowTables {
        db: Option<String>,
        full: bool,
        like: Option<String>,
    },
    ShowColumns {
        db: Option<String>,
        table: String,
        full: bool,
    },
    ShowCreateTable {
        db: Option<String>,
        table: String,
    },
    ShowCreateDatabase(String),
    ShowIndex {
        db: Option<String>,
        table: String,
    },
    ShowWarnings,
    ShowVariables {
        like: Option<String>,
    },
    ShowStatus,
    ShowEngines,
    ShowCollation,
    ShowCharset,
    ShowProcesslist,
    Txn(TxnControl),
    CreateDatabase {
        name: String,
        if_not_exists: bool,
    },
    DropDatabase {
        name: String,
        if_exists: bool,
    },
    /// CREATE/DROP/ALTER USER, SET PASSWORD, GRANT, REVOKE, SHOW GRANTS.
    Account(crate::sql::account::AccountStmt),
    /// CREATE TRIGGER, as written (`crate::trigger::parse` reads it).
    CreateTrigger(String),
    DropTrigger {
        db: Option<String>,
        name: String,
        if_exists: bool,
    },
    ShowTriggers {
        db: Option<String>,
        like: Option<String>,
    },
    ShowCreateTrigger {
        db: Option<String>,
        name: String,
    },
    /// `ALTER TABLE [db.]t RENAME {INDEX|KEY} from TO to`, alone.
    RenameIndex {
        db: Option<String>,
        table: String,
        from: String,
        to: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// An unquoted word, upper-cased.
    Kw(String),
    /// A name (quoted or not), as written.
    Name(String),
    Str(String),
    Num(String),
    Punct(char),
    Other,
}

fn tokens(sql: &str) -> SqlResult<Vec<Tok>> {
    let toks = Tokenizer::new(&MySqlDialect {}, sql).tokenize().map_err(|e| SqlError::parse(e.to_string()))?;
    let mut out = vec![];
    for t in toks {
        out.push(match t {
            Token::Whitespace(_) | Token::EOF => continue,
            // Unquoted words carry their keyword (upper case) and their name as written.
            Token::Word(w) if w.quote_style.is_none() => {
                Tok::Kw(format!("{}\0{}", w.value.to_ascii_uppercase(), w.value))
            }
            Token::Word(w) => Tok::Name(w.value),
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => Tok::Str(s),
            Token::Number(n, _) => Tok::Num(n),
            Token::SemiColon => Tok::Punct(';'),
            Token::Comma => Tok::Punct(','),
            Token::Period => Tok::Punct('.'),
            Token::Eq => Tok::Punct('='),
            Token::LParen => Tok::Punct('('),
            Token::RParen => Tok::Punct(')'),
            Token::Char(c) => Tok::Punct(c),
            _ => Tok::Other,
        });
    }
    while out.last() == Some(&Tok::Punct(';')) {
        out.pop();
    }
    Ok(out)
}

impl Tok {
    /// The keyword (upper case) of an unquoted word.
    fn kw(&self) -> Option<&str> {
        match self {
            Tok::Kw(k) => Some(k.split('\0').next().unwrap_or("")),
            _ => None,
        }
    }

    /// The name of a word, quoted or not.
    fn name(&self) -> Option<String> {
        match self {
            Tok::Kw(k) => k.split_once('\0').map(|(_, n)| n.to_string()),
            Tok::Name(n) => Some(n.clone()),
            _ => None,
        }
    }

    fn text(&self) -> String {
        match self {
            Tok::Kw(_) | Tok::Name(_) => self.name().unwrap_or_default(),
            Tok::Str(s) | Tok::Num(s) => s.clone(),
            Tok::Punct(c) => c.to_string(),
            Tok::Other => String::new(),
        }
    }
}

struct Cursor {
    t: Vec<Tok>,
    i: usize,
}

impl Cursor {
    fn peek_kw(&self) -> Option<&str> {
        self.t.get(self.i).and_then(Tok::kw)
    }
    fn eat(&mut self, kw: &str) -> bool {
        if self.peek_kw() == Some(kw) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn eat_any(&mut self, kws: &[&str]) -> bool {
        kws.iter().any(|k| self.eat(k))
    }
    fn name(&mut self) -> SqlResult<String> {
        let n = self.t.get(self.i).and_then(Tok::name).ok_or_else(|| SqlError::parse("expected a name"))?;
        self.i += 1;
        Ok(n)
    }
    /// `name` or `db.name`.
    fn qualified(&mut self) -> SqlResult<(Option<String>, String)> {
        let first = self.name()?;
        if self.t.get(self.i) == Some(&Tok::Punct('.')) {
            self.i += 1;
            let second = self.name()?;
            return Ok((Some(first), second));
        }
        Ok((None, first))
    }
    fn done(&self) -> bool {
        self.i >= self.t.len()
    }
    fn end(&self) -> SqlResult<()> {
        if self.done() {
            Ok(())
        } else {
            Err(SqlError::parse(format!("unexpected '{}'", self.t[self.i].text())))
        }
    }
    fn like(&mut self) -> SqlResult<Option<String>> {
        if self.eat("LIKE") {
            match self.t.get(self.i) {
                Some(Tok::Str(s)) => {
                    self.i += 1;
                    return Ok(Some(s.clone()));
                }
                _ => return Err(SqlError::parse("LIKE needs a string")),
            }
        }
        Ok(None)
    }
    fn db_after_from(&mut self) -> SqlResult<Option<String>> {
        if self.eat_any(&["FROM", "IN"]) {
            return Ok(Some(self.name()?));
        }
        Ok(None)
    }
}

/// The statement starts with SELECT, INSERT, UPDATE, DELETE, REPLACE or WITH (after
/// whitespace; a leading comment does not count): none of those is one `classify` handles.
pub fn is_query_or_dml(sql: &str) -> bool {
    let s = sql.trim_start();
    let end = s.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(s.len());
    let first = &s[..end];
    ["SELECT", "INSERT", "UPDATE", "DELETE", "REPLACE", "WITH"].iter().any(|k| first.eq_ignore_ascii_case(k))
}

/// A bare `BEGIN`, `COMMIT` or `ROLLBACK` (any case, surrounding whitespace and one `;`
/// allowed): what drivers and sysbench send around every transaction. Other spellings (`BEGIN
/// WORK`, `START TRANSACTION`, comments) go through `classify` like any admin statement.
pub fn bare_transaction_control(sql: &str) -> Option<TxnControl> {
    let s = sql.trim();
    let s = s.strip_suffix(';').unwrap_or(s).trim_end();
    [("BEGIN", TxnControl::Begin), ("COMMIT", TxnControl::Commit), ("ROLLBACK", TxnControl::Rollback)]
        .into_iter()
        .find(|(k, _)| s.eq_ignore_ascii_case(k))
        .map(|(_, a)| a)
}

/// Recognizes the statements this module handles itself; None means "give it to sqlparser".
pub fn classify(sql: &str) -> SqlResult<Option<Admin>> {
    if crate::sql::account::is_account_statement(sql) {
        return crate::sql::account::parse(sql).map(|s| Some(Admin::Account(s)));
    }
    if crate::trigger::parse::is_create_trigger(sql) {
        return Ok(Some(Admin::CreateTrigger(sql.to_string())));
    }
    if let Some((db, name, if_exists)) = crate::trigger::parse::parse_drop(sql)? {
        return Ok(Some(Admin::DropTrigger { db, name, if_exists }));
    }
    let t = tokens(sql)?;
    if t.is_empty() {
        return Ok(Some(Admin::Empty));
    }
    let mut c = Cursor { t, i: 0 };
    let first = c.peek_kw().unwrap_or("").to_string();
    c.i += 1;
    let admin = match first.as_str() {
        "SET" => Admin::Set(parse_set(&c.t[1..])),
        "USE" => {
            let n = c.name()?;
            c.end()?;
            Admin::Use(n)
        }
        "BEGIN" => {
            c.eat("WORK");
            c.end()?;
            Admin::Txn(TxnControl::Begin)
        }
        "START" if c.eat("TRANSACTION") => Admin::Txn(TxnControl::Begin),
        "COMMIT" => Admin::Txn(TxnControl::Commit),
        "ROLLBACK" => {
            c.eat("WORK");
            if c.eat("TO") {
                c.eat("SAVEPOINT");
                let name = c.name()?;
                c.end()?;
                Admin::Savepoint(SavepointOp::RollbackTo(name))
            } else if c.done() {
                Admin::Txn(TxnControl::Rollback)
            } else {
                return Err(SqlError::not_supported("ROLLBACK AND CHAIN / RELEASE"));
            }
        }
        "SAVEPOINT" => {
            let name = c.name()?;
            c.end()?;
            Admin::Savepoint(SavepointOp::Set(name))
        }
        "RELEASE" if c.eat("SAVEPOINT") => {
            let name = c.name()?;
            c.end()?;
            Admin::Savepoint(SavepointOp::Release(name))
        }
        "DESCRIBE" | "DESC" | "EXPLAIN" if matches!(c.t.get(1), Some(Tok::Kw(_) | Tok::Name(_))) && c.t.len() <= 4 => {
            // `DESC t`, `DESCRIBE db.t`; EXPLAIN of a query falls through to sqlparser.
            if matches!(c.peek_kw(), Some("SELECT" | "INSERT" | "UPDATE" | "DELETE" | "REPLACE" | "WITH")) {
                return Ok(None);
            }
            let (db, table) = c.qualified()?;
            c.end()?;
            Admin::ShowColumns { db, table, full: false }
        }
        "CREATE" if matches!(c.peek_kw(), Some("DATABASE" | "SCHEMA")) => {
            c.i += 1;
            let if_not_exists = c.eat("IF");
            if if_not_exists && !(c.eat("NOT") && c.eat("EXISTS")) {
                return Err(SqlError::parse("expected IF NOT EXISTS"));
            }
            let name = c.name()?;
            // Options such as CHARACTER SET / COLLATE are accepted and ignored.
            Admin::CreateDatabase { name, if_not_exists }
        }
        // sqlparser takes every other ALTER.
        "ALTER" => match rename_index(&mut c) {
            Some(admin) => admin,
            None => return Ok(None),
        },
        "DROP" if matches!(c.peek_kw(), Some("DATABASE" | "SCHEMA")) => {
            c.i += 1;
            let if_exists = c.eat("IF");
            if if_exists && !c.eat("EXISTS") {
                return Err(SqlError::parse("expected IF EXISTS"));
            }
            let name = c.name()?;
            c.end()?;
            Admin::DropDatabase { name, if_exists }
        }
        "SHOW" => {
            let full = c.eat("FULL");
            c.eat_any(&["SESSION", "GLOBAL", "LOCAL"]);
            let what = c.peek_kw().unwrap_or("").to_string();
            c.i += 1;
            match what.as_str() {
                "DATABASES" | "SCHEMAS" => Admin::ShowDatabases { like: c.like()? },
                "TABLES" => {
                    let db = c.db_after_from()?;
                    Admin::ShowTables { db, full, like: c.like()? }
                }
                "TRIGGERS" => {
                    let db = c.db_after_from()?;
                    Admin::ShowTriggers { db, like: c.like()? }
                }
                "COLUMNS" | "FIELDS" => {
                    if !c.eat_any(&["FROM", "IN"]) {
                        return Err(SqlError::parse("expected FROM"));
                    }
                    let (mut db, table) = c.qualified()?;
                    if let Some(d) = c.db_after_from()? {
                        db = Some(d);
                    }
                    Admin::ShowColumns { db, table, full }
                }
                "INDEX" | "INDEXES" | "KEYS" => {
                    if !c.eat_any(&["FROM", "IN"]) {
                        return Err(SqlError::parse("expected FROM"));
                    }
                    let (mut db, table) = c.qualified()?;
                    if let Some(d) = c.db_after_from()? {
                        db = Some(d);
                    }
                    Admin::ShowIndex { db, table }
                }
                "CREATE" => {
                    if c.eat("TABLE") {
                        let (db, table) = c.qualified()?;
                        c.end()?;
                        Admin::ShowCreateTable { db, table }
                    } else if c.eat("TRIGGER") {
                        let (db, name) = c.qualified()?;
                        c.end()?;
                        Admin::ShowCreateTrigger { db, name }
                    } else if c.eat_any(&["DATABASE", "SCHEMA"]) {
                        let n = c.name()?;
                        Admin::ShowCreateDatabase(n)
                    } else {
                        return Err(SqlError::not_supported("this SHOW CREATE"));
                    }
                }
                "WARNINGS" | "ERRORS" => Admin::ShowWarnings,
                "VARIABLES" => Admin::ShowVariables { like: c.like()? },
                "STATUS" => Admin::ShowStatus,
                "ENGINES" => Admin::ShowEngines,
                "COLLATION" => Admin::ShowCollation,
                "CHARACTER" | "CHARSET" => Admin::ShowCharset,
                "PROCESSLIST" => Admin::ShowProcesslist,
                other => return Err(SqlError::not_supported(format!("SHOW {other}"))),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(admin))
}

/// `TABLE [db.]t RENAME {INDEX|KEY} a TO b` and nothing more, after ALTER (sqlparser does not
/// take it); None for any other ALTER.
fn rename_index(c: &mut Cursor) -> Option<Admin> {
    if !c.eat("TABLE") {
        return None;
    }
    let (db, table) = c.qualified().ok()?;
    if !(c.eat("RENAME") && c.eat_any(&["INDEX", "KEY"])) {
        return None;
    }
    let from = c.name().ok()?;
    if !c.eat("TO") {
        return None;
    }
    let to = c.name().ok()?;
    c.end().ok()?;
    Some(Admin::RenameIndex { db, table, from, to })
}

/// 1235 for MySQL statements sqlparser does not parse but Shoal knows it does not support
/// (`ALTER TABLE … RENAME INDEX|KEY` with other operations), so they are refused as unsupported rather than as bad
/// syntax. Only asked after a parse error.
pub fn unparsed_form(sql: &str) -> Option<SqlError> {
    let words: Vec<&str> = sql.split_whitespace().take(64).collect();
    let is = |i: usize, w: &str| words.get(i).is_some_and(|x| x.eq_ignore_ascii_case(w));
    if !(is(0, "ALTER") && is(1, "TABLE")) {
        return None;
    }
    let renames_index = (2..words.len()).any(|i| is(i, "RENAME") && (is(i + 1, "INDEX") || is(i + 1, "KEY")));
    renames_index.then(|| SqlError::not_supported("ALTER TABLE … RENAME INDEX with other operations"))
}

/// Loosely reads `SET [SESSION|GLOBAL] a = x, @@b = y, NAMES utf8mb4 ...` into (name, value).
fn parse_set(t: &[Tok]) -> Vec<(String, String)> {
    let mut out = vec![];
    for part in t.split(|x| *x == Tok::Punct(',')) {
        let mut words: Vec<String> = vec![];
        let mut value = String::new();
        let mut seen_eq = false;
        for x in part {
            match x {
                Tok::Punct('=') if !seen_eq => seen_eq = true,
                _ if seen_eq => value.push_str(&x.text()),
                Tok::Punct('@') | Tok::Punct('.') => {}
                _ => words.push(x.text()),
            }
        }
        // `@@session.x` comes as one word `@@session` before `x`: the scope goes either way.
        let words: Vec<String> = words
            .into_iter()
            .map(|w| w.trim_start_matches('@').to_string())
            .filter(|w| !["SESSION", "GLOBAL", "LOCAL", "PERSIST"].contains(&w.to_ascii_uppercase().as_str()))
            .collect();
        if let Some(name) = words.first() {
            let name = name.to_ascii_lowercase();
            let value = if seen_eq { value } else { words[1..].join(" ") };
            out.push((name, value));
        }
    }
    out
}

/// Splits MySQL's `PARTITION BY [LINEAR] KEY (cols) [PARTITIONS n]` off the end of a CREATE
/// TABLE (sqlparser does not parse it): the statement without it and the partition-key column
/// names. None when there is no such clause. The partition count is the cluster's, so
/// `PARTITIONS n` is accepted and not used; other partitioning kinds are refused.
pub fn split_partition_by(sql: &str) -> SqlResult<Option<(String, Vec<String>)>> {
    let toks =
        Tokenizer::new(&MySqlDialect {}, sql).tokenize_with_location().map_err(|e| SqlError::parse(e.to_string()))?;
    let words: Vec<(usize, &sqlparser::tokenizer::TokenWithSpan)> =
        toks.iter().enumerate().filter(|(_, t)| !matches!(t.token, Token::Whitespace(_))).collect();
    let kw = |i: usize| match words.get(i).map(|(_, t)| &t.token) {
        Some(Token::Word(w)) if w.quote_style.is_none() => w.value.to_ascii_uppercase(),
        _ => String::new(),
    };
    if kw(0) != "CREATE" || !(1..4).any(|i| kw(i) == "TABLE") {
        return Ok(None);
    }
    let mut depth = 0i32;
    for (n, (_, t)) in words.iter().enumerate() {
        match t.token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            _ => {}
        }
        if depth != 0 || kw(n) != "PARTITION" || kw(n + 1) != "BY" {
            continue;
        }
        let mut i = n + 2;
        if kw(i) == "LINEAR" {
            i += 1;
        }
        if kw(i) != "KEY" {
            return Err(SqlError::not_supported("PARTITION BY other than KEY (cols)"));
        }
        i += 1;
        if !matches!(words.get(i).map(|(_, t)| &t.token), Some(Token::LParen)) {
            return Err(SqlError::parse("PARTITION BY KEY needs a column list"));
        }
        i += 1;
        let mut cols = vec![];
        loop {
            match words.get(i).map(|(_, t)| &t.token) {
                Some(Token::Word(w)) => cols.push(w.value.clone()),
                _ => return Err(SqlError::parse("PARTITION BY KEY needs column names")),
            }
            i += 1;
            match words.get(i).map(|(_, t)| &t.token) {
                Some(Token::Comma) => i += 1,
                Some(Token::RParen) => {
                    i += 1;
                    break;
                }
                _ => return Err(SqlError::parse("bad PARTITION BY KEY column list")),
            }
        }
        if kw(i) == "PARTITIONS" {
            if !matches!(words.get(i + 1).map(|(_, t)| &t.token), Some(Token::Number(..))) {
                return Err(SqlError::parse("PARTITIONS needs a number"));
            }
            i += 2;
        }
        while matches!(words.get(i).map(|(_, t)| &t.token), Some(Token::SemiColon | Token::EOF)) {
            i += 1;
        }
        if i < words.len() {
            return Err(SqlError::not_supported("table options after PARTITION BY"));
        }
        // Byte offset of the PARTITION keyword.
        let loc = t.span.start;
        let mut off = 0usize;
        for (li, l) in sql.split_inclusive('\n').enumerate() {
            if li as u64 + 1 == loc.line {
                off += l.chars().take(loc.column.saturating_sub(1) as usize).map(char::len_utf8).sum::<usize>();
                break;
            }
            off += l.len();
        }
        return Ok(Some((sql[..off.min(sql.len())].to_string(), cols)));
    }
    Ok(None)
}

/// Parses one statement with sqlparser's MySQL dialect.
pub fn parse_one(sql: &str) -> SqlResult<Statement> {
    if sql.len() > MAX_SQL_BYTES {
        return Err(SqlError::parse("statement too long"));
    }
    let mut stmts = Parser::new(&MySqlDialect {})
        .with_recursion_limit(MAX_PARSE_DEPTH)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_statements())
        .map_err(|e| SqlError::parse(e.to_string()))?;
    match stmts.len() {
        1 => Ok(stmts.remove(0)),
        0 => Err(SqlError::parse("empty query")),
        _ => Err(SqlError::parse("multi-statements are off: send one statement at a time")),
    }
}

/// Index of the quote that closes the string or quoted name opening at `open` (`b.len()` when
/// it never closes). Doubled quotes and, outside backticks, backslash escapes stay inside.
fn closing_quote(b: &[u8], open: usize) -> usize {
    let q = b[open];
    let mut i = open + 1;
    while i < b.len() {
        if b[i] == b'\\' && q != b'`' {
            i += 2;
            continue;
        }
        if b[i] == q {
            if i + 1 < b.len() && b[i + 1] == q {
                i += 2;
                continue;
            }
            return i;
        }
        i += 1;
    }
    b.len()
}

/// Byte offsets of the `?` placeholders of a statement (outside strings, quoted names and
/// comments).
pub fn placeholders(sql: &str) -> Vec<usize> {
    let b = sql.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\'' | b'"' | b'`' => i = closing_quote(b, i),
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'-' if b.get(i + 1) == Some(&b'-') && b.get(i + 2).is_none_or(|c| c.is_ascii_whitespace()) => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 1;
            }
            b'?' => out.push(i),
            _ => {}
        }
        i += 1;
    }
    out
}

/// The text of each select-list item of a `SELECT` statement as written (MySQL names unaliased
/// result columns by it). None when the statement is not a plain SELECT.
pub fn select_item_texts(sql: &str) -> Option<Vec<String>> {
    const ENDS: &[&str] =
        &["FROM", "WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "INTO", "UNION", "FOR", "LOCK", "WINDOW", "PROCEDURE"];
    const MODIFIERS: &[&str] = &[
        "DISTINCT",
        "ALL",
        "DISTINCTROW",
        "HIGH_PRIORITY",
        "STRAIGHT_JOIN",
        "SQL_NO_CACHE",
        "SQL_CACHE",
        "SQL_CALC_FOUND_ROWS",
        "SQL_SMALL_RESULT",
        "SQL_BIG_RESULT",
        "SQL_BUFFER_RESULT",
    ];
    let b = sql.as_bytes();
    let mut i = 0;
    let mut depth = 0i32;
    let mut items = vec![];
    let mut start: Option<usize> = None;
    let mut seen_select = false;
    while i < b.len() {
        let c = b[i];
        match c {
            b'\'' | b'"' | b'`' => {
                start.get_or_insert(i);
                i = closing_quote(b, i) + 1;
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = sql[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                i = end;
                continue;
            }
            b'(' => {
                if seen_select {
                    start.get_or_insert(i);
                }
                depth += 1;
            }
            b')' => depth -= 1,
            b',' if depth == 0 && seen_select => {
                items.push(sql[start?..i].trim().to_string());
                start = None;
                i += 1;
                continue;
            }
            _ if c.is_ascii_alphabetic() || c == b'_' || c == b'@' => {
                let w_end = sql[i..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '@' || ch == '.'))
                    .map_or(b.len(), |e| i + e);
                let word = sql[i..w_end].to_ascii_uppercase();
                if !seen_select {
                    if word != "SELECT" {
                        return None;
                    }
                    seen_select = true;
                } else if depth == 0 && start.is_none() && MODIFIERS.contains(&word.as_str()) {
                } else if depth == 0 && ENDS.contains(&word.as_str()) {
                    break;
                } else {
                    start.get_or_insert(i);
                }
                i = w_end;
                continue;
            }
            _ if c.is_ascii_whitespace() => {}
            b';' if depth == 0 => break,
            _ => {
                if seen_select {
                    start.get_or_insert(i);
                }
            }
        }
        i += 1;
    }
    if let Some(s) = start {
        items.push(sql[s..i.min(b.len())].trim().to_string());
    }
    seen_select.then_some(items)
}

/// The SQL literal for a parameter value.
pub fn sql_literal(v: &Val) -> String {
    match v {
        Val::Null => "NULL".into(),
        Val::Int(i) => i.to_string(),
        Val::UInt(u) => u.to_string(),
        Val::Float(f) if f.is_finite() => {
            let s = format_double(*f);
            if s.contains(['e', 'E']) {
                s
            } else {
                format!("{s}e0")
            }
        }
        Val::Float(_) => "NULL".into(),
        Val::Dec(d) => d.to_string(),
        Val::Str(s) => {
            let mut out = String::with_capacity(s.len() + 2);
            out.push('\'');
            for ch in s.chars() {
                match ch {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    '\0' => out.push_str("\\0"),
                    c => out.push(c),
                }
            }
            out.push('\'');
            out
        }
        Val::Bytes(b) => {
            if b.is_empty() {
                return "''".into();
            }
            let mut out = String::from("X'");
            for x in b {
                out.push_str(&format!("{x:02X}"));
            }
            out.push('\'');
            out
        }
    }
}

/// A prepared statement's text parsed with its placeholders (`at`) left in place, when it is a
/// query or DML (the statements whose values all go through the binder, which takes each
/// placeholder's value from `Env::params`); None sends its executions the substituting way.
pub fn parse_with_placeholders(sql: &str, at: &[usize]) -> Option<Box<Statement>> {
    if !is_query_or_dml(sql) {
        return None;
    }
    let stmt = parse_one(sql).ok()?;
    let dml = matches!(stmt, Statement::Query(_) | Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_));
    // Every `?` the text has is a placeholder of the statement (none became part of something
    // else the parser reads differently).
    (dml && placeholders(&stmt.to_string()).len() == at.len()).then(|| Box::new(stmt))
}

/// Where the placeholders at byte offsets `at` stand, as sqlparser's spans count: lines and
/// characters from 1.
pub fn locations(sql: &str, at: &[usize]) -> Vec<Location> {
    at.iter()
        .map(|&pos| {
            let before = &sql[..pos];
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            let line = before.matches('\n').count() as u64 + 1;
            Location::new(line, before[line_start..].chars().count() as u64 + 1)
        })
        .collect()
}

/// The value a placeholder bound to `v` takes: what the literal [`substitute`] writes for it
/// would give (an unsigned integer that fits is a signed one, an empty byte string is text,
/// a float that is not finite is NULL).
pub fn param_value(v: &Val) -> Val {
    match v {
        Val::UInt(u) => i64::try_from(*u).map_or(Val::UInt(*u), Val::Int),
        Val::Float(f) if !f.is_finite() => Val::Null,
        Val::Bytes(b) if b.is_empty() => Val::Str(String::new()),
        other => other.clone(),
    }
}

/// Replaces the placeholders at `at` with the literals of `params`.
pub fn substitute(sql: &str, at: &[usize], params: &[Val]) -> String {
    let mut out = String::with_capacity(sql.len() + params.len() * 8);
    let mut last = 0;
    for (&pos, v) in at.iter().zip(params) {
        out.push_str(&sql[last..pos]);
        out.push_str(&sql_literal(v));
        last = pos + 1;
    }
    out.push_str(&sql[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_dml_skip_classify_and_none_of_them_is_an_admin_statement() {
        for sql in [
            "SELECT 1",
            "  select c from t where id=?",
            "Insert into t values (1)",
            "UPDATE t SET a=1",
            "delete from t",
            "REPLACE INTO t VALUES (1)",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "\nselect\t1",
        ] {
            assert!(is_query_or_dml(sql), "{sql}");
            assert_eq!(classify(sql).unwrap(), None, "{sql}");
        }
        for sql in ["SET autocommit=0", "selected", "/* c */ SELECT 1", "(SELECT 1)", "SHOW TABLES", "BEGIN", ""] {
            assert!(!is_query_or_dml(sql), "{sql}");
        }
    }

    #[test]
    fn admin_statements() {
        assert_eq!(classify("  ").unwrap(), Some(Admin::Empty));
        assert_eq!(classify("/* x */ ;").unwrap(), Some(Admin::Empty));
        assert_eq!(classify("use `My Db`;").unwrap(), Some(Admin::Use("My Db".into())));
        assert_eq!(classify("show databases").unwrap(), Some(Admin::ShowDatabases { like: None }));
        assert_eq!(
            classify("SHOW FULL TABLES FROM d LIKE 't%'").unwrap(),
            Some(Admin::ShowTables { db: Some("d".into()), full: true, like: Some("t%".into()) })
        );
        assert_eq!(
            classify("describe d.t").unwrap(),
            Some(Admin::ShowColumns { db: Some("d".into()), table: "t".into(), full: false })
        );
        assert_eq!(
            classify("SHOW COLUMNS FROM t FROM d").unwrap(),
            Some(Admin::ShowColumns { db: Some("d".into()), table: "t".into(), full: false })
        );
        assert_eq!(
            classify("show create table `t`").unwrap(),
            Some(Admin::ShowCreateTable { db: None, table: "t".into() })
        );
        assert_eq!(
            classify("CREATE DATABASE IF NOT EXISTS shop").unwrap(),
            Some(Admin::CreateDatabase { name: "shop".into(), if_not_exists: true })
        );
        assert_eq!(
            classify("drop schema shop").unwrap(),
            Some(Admin::DropDatabase { name: "shop".into(), if_exists: false })
        );
        assert_eq!(classify("START TRANSACTION").unwrap(), Some(Admin::Txn(TxnControl::Begin)));
        assert_eq!(bare_transaction_control(" commit ;"), Some(TxnControl::Commit));
        assert_eq!(bare_transaction_control("BEGIN"), Some(TxnControl::Begin));
        assert_eq!(bare_transaction_control("Rollback"), Some(TxnControl::Rollback));
        assert_eq!(bare_transaction_control("BEGIN WORK"), None);
        let sp = |op| Some(Admin::Savepoint(op));
        assert_eq!(classify("SAVEPOINT a1").unwrap(), sp(SavepointOp::Set("a1".into())));
        assert_eq!(classify("rollback work to savepoint `a1`").unwrap(), sp(SavepointOp::RollbackTo("a1".into())));
        assert_eq!(classify("ROLLBACK TO a1").unwrap(), sp(SavepointOp::RollbackTo("a1".into())));
        assert_eq!(classify("RELEASE SAVEPOINT a1;").unwrap(), sp(SavepointOp::Release("a1".into())));
        assert_eq!(classify("ROLLBACK AND CHAIN").unwrap_err().code, 1235);
        assert!(classify("SAVEPOINT").is_err());
        assert_eq!(bare_transaction_control("COMMITTED"), None);
        assert_eq!(classify("select 1").unwrap(), None);
        assert_eq!(classify("create table t (a int)").unwrap(), None);
        assert_eq!(classify("explain select 1").unwrap(), None);
        assert_eq!(classify("SHOW FROBS").unwrap_err().code, 1235);
        assert_eq!(
            classify("ALTER TABLE d.t RENAME KEY a TO `b c`").unwrap(),
            Some(Admin::RenameIndex { db: Some("d".into()), table: "t".into(), from: "a".into(), to: "b c".into() })
        );
        assert_eq!(classify("ALTER TABLE t RENAME INDEX a TO b, ADD COLUMN c INT").unwrap(), None);
        assert_eq!(classify("ALTER TABLE t ADD COLUMN c INT").unwrap(), None);
        let create = "CREATE DEFINER = root TRIGGER t1 AFTER DELETE ON items FOR EACH ROW BEGIN END";
        assert_eq!(classify(create).unwrap(), Some(Admin::CreateTrigger(create.into())));
        assert_eq!(
            classify("DROP TRIGGER IF EXISTS d.t1").unwrap(),
            Some(Admin::DropTrigger { db: Some("d".into()), name: "t1".into(), if_exists: true })
        );
        assert_eq!(
            classify("SHOW TRIGGERS FROM d LIKE 't%'").unwrap(),
            Some(Admin::ShowTriggers { db: Some("d".into()), like: Some("t%".into()) })
        );
        assert_eq!(
            classify("SHOW CREATE TRIGGER t1").unwrap(),
            Some(Admin::ShowCreateTrigger { db: None, name: "t1".into() })
        );
    }

    #[test]
    fn forms_sqlparser_rejects_are_refused_as_unsupported() {
        for sql in ["ALTER TABLE t RENAME INDEX a TO b", "ALTER TABLE t ADD COLUMN z INT, RENAME KEY a TO b"] {
            assert_eq!(unparsed_form(sql).map(|e| e.code), Some(crate::error::code::NOT_SUPPORTED_YET), "{sql}");
        }
        for sql in ["ALTER TABLE t RENAME COLUMN a TO b", "SELECT rename index FROM t", "SELECT trigger FROM t"] {
            assert!(unparsed_form(sql).is_none(), "{sql}");
        }
    }

    #[test]
    fn set_is_read_loosely() {
        let sql = "SET SESSION autocommit=1, NAMES utf8mb4, @@sql_mode = 'X', @@session.a = 2, @@GLOBAL.b = 3";
        let Some(Admin::Set(v)) = classify(sql).unwrap() else { panic!("not a SET") };
        assert_eq!(
            v,
            vec![
                ("autocommit".into(), "1".into()),
                ("names".into(), "utf8mb4".into()),
                ("sql_mode".into(), "X".into()),
                ("a".into(), "2".into()),
                ("b".into(), "3".into())
            ]
        );
    }

    #[test]
    fn placeholders_skip_strings_and_comments() {
        let sql = "SELECT '?', `a?`, ? /* ? */ FROM t WHERE a = ? -- ?\n AND b = \"it\\\"s?\" # ?";
        let at = placeholders(sql);
        assert_eq!(at.len(), 2);
        let out = substitute(sql, &at, &[Val::Int(1), Val::Str("o'k\\".into())]);
        assert!(out.contains("`a?`, 1 /*"), "{out}");
        assert!(out.contains("a = 'o''k\\\\'"), "{out}");
        assert_eq!(sql_literal(&Val::Float(1.5)), "1.5e0");
        assert_eq!(sql_literal(&Val::Bytes(vec![0, 255])), "X'00FF'");
    }

    #[test]
    fn select_items_as_written() {
        assert_eq!(
            select_item_texts("SELECT DISTINCT a, count(*) , 3 in (1,2), 'x,y' FROM t WHERE b = 1").unwrap(),
            vec!["a", "count(*)", "3 in (1,2)", "'x,y'"]
        );
        assert_eq!(select_item_texts("select not 1, 1 is null").unwrap(), vec!["not 1", "1 is null"]);
        assert_eq!(
            select_item_texts("SELECT (SELECT (SELECT 1)), (1)+2").unwrap(),
            vec!["(SELECT (SELECT 1))", "(1)+2"]
        );
        assert_eq!(select_item_texts("insert into t values (1)"), None);
    }

    /// The deepest statement the parser accepts parses, binds and evaluates within the worker
    /// stack; deeper ones are syntax errors.
    #[test]
    fn deep_nesting_fits_the_stack() {
        let run = || {
            let mut deepest = None;
            for depth in (10..200).step_by(5) {
                let sql = format!("SELECT {}1{}", "(-".repeat(depth), ")".repeat(depth));
                match parse_one(&sql) {
                    Ok(stmt) => {
                        let sqlparser::ast::Statement::Query(q) = stmt else { panic!("not a query") };
                        let sqlparser::ast::SetExpr::Select(s) = *q.body else { panic!("not a select") };
                        let sqlparser::ast::SelectItem::UnnamedExpr(e) = &s.projection[0] else { panic!("no expr") };
                        let env = crate::sql::bind::Env::default();
                        let bound = crate::sql::bind::Binder::new(&env, None, "field list").bind(e).unwrap();
                        let _ = bound.eval(&[], &[]).unwrap();
                        let _ = e.to_string();
                        deepest = Some(depth);
                    }
                    Err(err) => {
                        assert_eq!(err.code, 1064);
                        break;
                    }
                }
            }
            deepest
        };
        let deepest = std::thread::Builder::new().stack_size(WORKER_STACK_BYTES).spawn(run).unwrap().join().unwrap();
        assert!(deepest.is_some_and(|d| (40..200).contains(&d)), "deepest accepted nesting {deepest:?}");
        // Nested subqueries go through the planner and the executor at every level.
        let subqueries = || {
            let env = crate::sql::bind::Env::default();
            let catalog = crate::sql::query::Catalog::new(None);
            let mut planned = 0;
            for depth in (2..100).step_by(4) {
                let sql = format!("SELECT {}1{}", "(SELECT -".repeat(depth), ")".repeat(depth));
                let Ok(sqlparser::ast::Statement::Query(q)) = parse_one(&sql) else { break };
                let planner = crate::sql::query::Planner::new(&env, &catalog);
                match planner.query(&q, &sql, &[], None) {
                    Ok(plan) => {
                        let _ = crate::sql::select::run(&plan, None).unwrap();
                        planned = depth;
                    }
                    Err(e) => assert_eq!(e.code, 1235, "{e}"),
                }
            }
            planned
        };
        let planned =
            std::thread::Builder::new().stack_size(WORKER_STACK_BYTES).spawn(subqueries).unwrap().join().unwrap();
        assert!(planned >= 10, "nested subqueries planned to depth {planned}");
    }

    #[test]
    fn partition_by_key_is_split_off() {
        let (rest, cols) =
            split_partition_by("create table t (a int, b int, primary key (a, b)) partition by key (b) partitions 4;")
                .unwrap()
                .unwrap();
        assert_eq!(rest.trim_end(), "create table t (a int, b int, primary key (a, b))");
        assert_eq!(cols, vec!["b"]);
        assert!(parse_one(&rest).is_ok());
        assert_eq!(split_partition_by("CREATE TABLE t (a INT) PARTITION BY LINEAR KEY (a)").unwrap().unwrap().1, ["a"]);
        assert_eq!(split_partition_by("CREATE TABLE t (a INT) PARTITION BY HASH (a)").unwrap_err().code, 1235);
        assert_eq!(split_partition_by("SELECT 'PARTITION BY KEY (a)'").unwrap(), None);
        assert_eq!(split_partition_by("CREATE TABLE t (a INT)").unwrap(), None);
    }

    #[test]
    fn parse_errors_are_1064() {
        assert_eq!(parse_one("SELEC 1").unwrap_err().code, 1064);
        assert_eq!(parse_one("select 1; select 2").unwrap_err().code, 1064);
        assert!(parse_one("select a from t where b = 1 order by a desc limit 3").is_ok());
    }
}

#[cfg(test)]
mod placeholder_tests {
    use super::*;
    use crate::sql::bind::{Binder, Env};

    /// The spans sqlparser gives the placeholders of `sql`, in text order, read off the
    /// statement's debug form (the AST has no visitor without a feature we do not build).
    fn placeholder_spans(sql: &str) -> Vec<Location> {
        let dbg = format!("{:?}", parse_one(sql).unwrap());
        let mut out = vec![];
        let mut rest = dbg.as_str();
        while let Some(i) = rest.find("Placeholder(") {
            rest = &rest[i..];
            // `Placeholder("?"), span: Span(Location(line,column)..Location(...))`
            let s = &rest[rest.find("Span(Location(").unwrap() + "Span(Location(".len()..];
            let (line, column) = s[..s.find(')').unwrap()].split_once(',').unwrap();
            out.push(Location::new(line.trim().parse().unwrap(), column.trim().parse().unwrap()));
            rest = &rest[1..];
        }
        out.sort_by_key(|l| (l.line, l.column));
        out
    }

    #[test]
    fn placeholder_locations_are_the_parser_spans() {
        for sql in [
            "SELECT c FROM t WHERE id BETWEEN ? AND ?",
            "SELECT ?, 'é?', `x?` FROM t WHERE a IN (?, ?, -?) AND b LIKE ? -- ?\n ORDER BY c LIMIT ?",
            "SELECT /* ? */ 'ü',\n  ?\n\t+ ?   FROM t\nWHERE  x = ?",
            "INSERT INTO t (a, b) VALUES (?, ?), (?, 'né?')",
            "UPDATE t SET k = k + ?, c = ? WHERE id = ?",
            "DELETE FROM t WHERE id = ? ORDER BY id LIMIT ?",
        ] {
            let at = placeholders(sql);
            assert_eq!(locations(sql, &at), placeholder_spans(sql), "{sql}");
            assert!(parse_with_placeholders(sql, &at).is_some(), "{sql}");
        }
        // Not a query or DML, or a `?` the statement does not take as a placeholder: the
        // substituting way.
        let sql = "CREATE TABLE t (a INT DEFAULT ?)";
        assert!(parse_with_placeholders(sql, &placeholders(sql)).is_none());
    }

    #[test]
    fn a_placeholder_takes_the_value_its_substituted_literal_would() {
        let env = Env::default();
        for v in [
            Val::Null,
            Val::Int(7),
            Val::Int(-7),
            Val::Int(i64::MIN + 1),
            Val::UInt(7),
            Val::UInt(u64::MAX),
            Val::Float(1.5),
            Val::Float(-2.25e-10),
            Val::Float(f64::NAN),
            Val::Dec(crate::val::Dec::parse("-12.340").unwrap()),
            Val::Str("it's a \\ test\0 é".into()),
            Val::Str(String::new()),
            Val::Bytes(vec![0, 255, 10]),
            Val::Bytes(vec![]),
        ] {
            let sql = format!("SELECT {}", sql_literal(&v));
            let Statement::Query(q) = parse_one(&sql).unwrap() else { panic!() };
            let sqlparser::ast::SetExpr::Select(s) = *q.body else { panic!() };
            let sqlparser::ast::SelectItem::UnnamedExpr(e) = &s.projection[0] else { panic!() };
            let via_text = Binder::new(&env, None, "field list").bind(e).unwrap().eval(&[], &[]).unwrap();
            assert_eq!(format!("{:?}", param_value(&v)), format!("{via_text:?}"), "{v:?}");
        }
    }
}

//! CREATE / DROP TRIGGER and a trigger body, read from the statement's text. sqlparser does not
//! take MySQL's trigger bodies (`BEGIN … END` with `;` inside, `SET NEW.col`, SIGNAL), so
//! the statements are read here from its tokens, and a body's plain SQL statements and
//! expressions are kept as text: `NEW.col` / `OLD.col` become literals when the trigger fires,
//! and the text then goes through the SQL node's own parser and executor.

use shoal_proto::TriggerEvent;
use sqlparser::dialect::MySqlDialect;
use sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{code, SqlError, SqlResult};

/// Deepest nesting of BEGIN / IF blocks in a body.
const MAX_BLOCK_DEPTH: usize = 16;

/// `CREATE [DEFINER = …] TRIGGER [IF NOT EXISTS] [db.]name {BEFORE|AFTER} {INSERT|UPDATE|DELETE}
/// ON [db.]table FOR EACH ROW body`.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateTrigger {
    pub db: Option<String>,
    pub name: String,
    pub if_not_exists: bool,
    pub before: bool,
    pub event: TriggerEvent,
    pub table_db: Option<String>,
    pub table: String,
    /// The statement after FOR EACH ROW, as written (without a trailing `;`).
    pub body: String,
}

/// One statement of a trigger body.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// `BEGIN … END`.
    Block(Vec<Step>),
    /// `IF c THEN … [ELSEIF c THEN …] [ELSE …] END IF`: (condition text, steps) per arm.
    If { arms: Vec<(String, Vec<Step>)>, otherwise: Vec<Step> },
    /// `SET NEW.col = expr, …`: (column name, expression text), in order.
    SetNew(Vec<(String, String)>),
    /// `SIGNAL SQLSTATE 'xxxxx' [SET MESSAGE_TEXT = '…', MYSQL_ERRNO = n]`.
    Signal { state: String, message: Option<String>, errno: Option<u16> },
    /// Any other statement (INSERT, UPDATE, DELETE, REPLACE), as text.
    Sql(String),
}

/// A reference to the row a trigger fires for: `NEW.col` or `OLD.col`, at `start..end`.
#[derive(Clone, Debug, PartialEq)]
pub struct RowRef {
    pub new: bool,
    pub column: String,
    pub start: usize,
    pub end: usize,
}

/// Tokens without whitespace and comments, each with its byte offset and length in `sql`.
fn lex(sql: &str) -> SqlResult<Vec<(Token, usize, usize)>> {
    let toks =
        Tokenizer::new(&MySqlDialect {}, sql).tokenize_with_location().map_err(|e| SqlError::parse(e.to_string()))?;
    // Locations are (line, column) in characters, from 1: turned into byte offsets.
    let mut line_starts = vec![0usize];
    line_starts.extend(sql.match_indices('\n').map(|(i, _)| i + 1));
    let offset = |line: u64, col: u64| -> usize {
        let start = line_starts.get(line.saturating_sub(1) as usize).copied().unwrap_or(sql.len());
        let rest = &sql[start..];
        rest.char_indices().nth(col.saturating_sub(1) as usize).map_or(sql.len(), |(i, _)| start + i)
    };
    let mut out = vec![];
    let mut all: Vec<(Token, usize)> = vec![];
    for t in toks {
        let at = offset(t.span.start.line, t.span.start.column);
        all.push((t.token, at));
    }
    for (i, (tok, at)) in all.iter().enumerate() {
        if matches!(tok, Token::Whitespace(_) | Token::EOF) {
            continue;
        }
        let next = all.get(i + 1).map_or(sql.len(), |(_, n)| *n);
        out.push((tok.clone(), *at, next - at));
    }
    Ok(out)
}

fn kw(t: &Token) -> Option<String> {
    match t {
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
        _ => None,
    }
}

fn name_of(t: &Token) -> Option<String> {
    match t {
        Token::Word(w) => Some(w.value.clone()),
        _ => None,
    }
}

/// Whether `sql` is a CREATE TRIGGER (TRIGGER among its first words).
pub fn is_create_trigger(sql: &str) -> bool {
    let words: Vec<&str> = sql.split_whitespace().take(8).collect();
    let is = |i: usize, w: &str| words.get(i).is_some_and(|x| x.eq_ignore_ascii_case(w));
    let definer = words.get(1).and_then(|w| w.get(..7)).is_some_and(|w| w.eq_ignore_ascii_case("DEFINER"));
    is(0, "CREATE") && (is(1, "TRIGGER") || definer && (2..words.len()).any(|i| is(i, "TRIGGER")))
}

struct Cursor<'a> {
    sql: &'a str,
    t: Vec<(Token, usize, usize)>,
    i: usize,
}

impl Cursor<'_> {
    fn peek_kw(&self) -> Option<String> {
        self.t.get(self.i).and_then(|(t, ..)| kw(t))
    }

    fn eat(&mut self, word: &str) -> bool {
        if self.peek_kw().as_deref() == Some(word) {
            self.i += 1;
            return true;
        }
        false
    }

    fn expect(&mut self, word: &str) -> SqlResult<()> {
        if self.eat(word) {
            return Ok(());
        }
        Err(SqlError::parse(format!("expected {word} near '{}'", self.near())))
    }

    fn near(&self) -> String {
        match self.t.get(self.i) {
            Some((_, at, _)) => self.sql[*at..].chars().take(40).collect(),
            None => "end of statement".into(),
        }
    }

    fn punct(&self, p: &Token) -> bool {
        self.t.get(self.i).is_some_and(|(t, ..)| t == p)
    }

    fn name(&mut self) -> SqlResult<String> {
        let n = self.t.get(self.i).and_then(|(t, ..)| name_of(t));
        let n = n.ok_or_else(|| SqlError::parse(format!("expected a name near '{}'", self.near())))?;
        self.i += 1;
        Ok(n)
    }

    /// `name` or `db.name`.
    fn qualified(&mut self) -> SqlResult<(Option<String>, String)> {
        let first = self.name()?;
        if self.punct(&Token::Period) {
            self.i += 1;
            return Ok((Some(first), self.name()?));
        }
        Ok((None, first))
    }

    fn done(&self) -> bool {
        self.i >= self.t.len()
    }

    fn offset(&self) -> usize {
        self.t.get(self.i).map_or(self.sql.len(), |(_, at, _)| *at)
    }

    /// The text from the current token to (not including) token `j`.
    fn text_to(&self, j: usize) -> String {
        let end = self.t.get(j).map_or(self.sql.len(), |(_, at, _)| *at);
        self.sql[self.offset()..end].trim().to_string()
    }
}

pub fn parse_create(sql: &str) -> SqlResult<CreateTrigger> {
    let mut c = Cursor { sql, t: lex(sql)?, i: 0 };
    c.expect("CREATE")?;
    if c.eat("DEFINER") {
        // `= user@host | CURRENT_USER[()]`: every definer runs as the caller (see run.rs).
        while !c.done() && c.peek_kw().as_deref() != Some("TRIGGER") {
            c.i += 1;
        }
    }
    c.expect("TRIGGER")?;
    let if_not_exists = c.eat("IF");
    if if_not_exists {
        c.expect("NOT")?;
        c.expect("EXISTS")?;
    }
    let (db, name) = c.qualified()?;
    let before = match c.peek_kw().as_deref() {
        Some("BEFORE") => true,
        Some("AFTER") => false,
        _ => return Err(SqlError::parse(format!("expected BEFORE or AFTER near '{}'", c.near()))),
    };
    c.i += 1;
    let event = match c.peek_kw().as_deref() {
        Some("INSERT") => TriggerEvent::Insert,
        Some("UPDATE") => TriggerEvent::Update,
        Some("DELETE") => TriggerEvent::Delete,
        _ => return Err(SqlError::parse(format!("expected INSERT, UPDATE or DELETE near '{}'", c.near()))),
    };
    c.i += 1;
    c.expect("ON")?;
    let (table_db, table) = c.qualified()?;
    c.expect("FOR")?;
    c.expect("EACH")?;
    c.expect("ROW")?;
    if matches!(c.peek_kw().as_deref(), Some("FOLLOWS" | "PRECEDES")) {
        return Err(SqlError::not_supported("FOLLOWS / PRECEDES (a trigger fires after those created before it)"));
    }
    if c.done() {
        return Err(SqlError::parse("a trigger needs a body after FOR EACH ROW"));
    }
    let body = sql[c.offset()..].trim().trim_end_matches(';').trim_end().to_string();
    if body.len() > shoal_proto::MAX_TRIGGER_BODY_BYTES {
        return Err(SqlError::new(code::TOO_BIG_ROWSIZE, "a trigger body holds at most 16 KiB"));
    }
    Ok(CreateTrigger { db, name, if_not_exists, before, event, table_db, table, body })
}

/// `DROP TRIGGER [IF EXISTS] [db.]name`: (db, name, if_exists); None when `sql` is not one.
pub fn parse_drop(sql: &str) -> SqlResult<Option<(Option<String>, String, bool)>> {
    let words: Vec<&str> = sql.split_whitespace().take(2).collect();
    if !(words.len() == 2 && words[0].eq_ignore_ascii_case("DROP") && words[1].eq_ignore_ascii_case("TRIGGER")) {
        return Ok(None);
    }
    let mut c = Cursor { sql, t: lex(sql)?, i: 2 };
    let if_exists = c.eat("IF");
    if if_exists {
        c.expect("EXISTS")?;
    }
    let (db, name) = c.qualified()?;
    while c.punct(&Token::SemiColon) {
        c.i += 1;
    }
    if !c.done() {
        return Err(SqlError::parse(format!("unexpected '{}'", c.near())));
    }
    Ok(Some((db, name, if_exists)))
}

/// A body's statements.
pub fn program(body: &str) -> SqlResult<Vec<Step>> {
    let mut c = Cursor { sql: body, t: lex(body)?, i: 0 };
    let step = statement(&mut c, 0, false)?;
    while c.punct(&Token::SemiColon) {
        c.i += 1;
    }
    if !c.done() {
        return Err(SqlError::parse(format!("unexpected '{}' after the trigger body", c.near())));
    }
    Ok(vec![step])
}

/// One statement at the cursor. `in_block`: it ends at `;` (inside BEGIN … END or IF), else
/// at the end of the body.
fn statement(c: &mut Cursor<'_>, depth: usize, in_block: bool) -> SqlResult<Step> {
    if depth > MAX_BLOCK_DEPTH {
        return Err(SqlError::parse("trigger body nested too deep"));
    }
    match c.peek_kw().as_deref() {
        Some("BEGIN") => {
            c.i += 1;
            let steps = statements(c, depth + 1, &["END"])?;
            c.expect("END")?;
            Ok(Step::Block(steps))
        }
        Some("IF") => {
            c.i += 1;
            let mut arms = vec![];
            let mut otherwise = vec![];
            loop {
                let cond = expression(c, &[Token::SemiColon], &["THEN"])?;
                c.expect("THEN")?;
                let steps = statements(c, depth + 1, &["ELSEIF", "ELSE", "END"])?;
                arms.push((cond, steps));
                if c.eat("ELSEIF") {
                    continue;
                }
                if c.eat("ELSE") {
                    otherwise = statements(c, depth + 1, &["END"])?;
                }
                c.expect("END")?;
                c.expect("IF")?;
                break;
            }
            Ok(Step::If { arms, otherwise })
        }
        Some("SET") => {
            c.i += 1;
            let mut sets = vec![];
            loop {
                let target = c.qualified()?;
                let column = match target {
                    (Some(row), col) if row.eq_ignore_ascii_case("NEW") => col,
                    (Some(row), _) if row.eq_ignore_ascii_case("OLD") => {
                        return Err(SqlError::new(
                            code::TRG_CANT_CHANGE_ROW,
                            "Updating of OLD row is not allowed in trigger",
                        ))
                    }
                    _ => return Err(SqlError::not_supported("SET of variables in a trigger (only SET NEW.col)")),
                };
                if !(c.punct(&Token::Eq) || c.punct(&Token::Assignment)) {
                    return Err(SqlError::parse(format!("expected = near '{}'", c.near())));
                }
                c.i += 1;
                sets.push((column, expression(c, &[Token::Comma, Token::SemiColon], &["END"])?));
                if !c.punct(&Token::Comma) {
                    break;
                }
                c.i += 1;
            }
            Ok(Step::SetNew(sets))
        }
        Some("SIGNAL") => {
            c.i += 1;
            c.expect("SQLSTATE")?;
            c.eat("VALUE");
            let state = match c.t.get(c.i) {
                Some((Token::SingleQuotedString(s), ..)) if valid_sqlstate(s) => s.clone(),
                _ => return Err(SqlError::new(code::SP_BAD_SQLSTATE, format!("Bad SQLSTATE: '{}'", c.near()))),
            };
            c.i += 1;
            let (mut message, mut errno) = (None, None);
            if c.eat("SET") {
                loop {
                    let item = c.peek_kw().unwrap_or_default();
                    c.i += 1;
                    if !c.punct(&Token::Eq) {
                        return Err(SqlError::parse(format!("expected = near '{}'", c.near())));
                    }
                    c.i += 1;
                    match (item.as_str(), c.t.get(c.i).map(|(t, ..)| t)) {
                        ("MESSAGE_TEXT", Some(Token::SingleQuotedString(s))) => message = Some(s.clone()),
                        ("MYSQL_ERRNO", Some(Token::Number(n, _))) => {
                            errno = Some(n.parse::<u16>().ok().filter(|n| *n > 0).ok_or_else(|| {
                                SqlError::new(
                                    code::WRONG_VALUE_FOR_VAR,
                                    format!("Variable 'MYSQL_ERRNO' can't be set to the value of '{n}'"),
                                )
                            })?)
                        }
                        _ => {
                            return Err(SqlError::not_supported(
                                "SIGNAL items other than a literal MESSAGE_TEXT or MYSQL_ERRNO",
                            ))
                        }
                    }
                    c.i += 1;
                    if !c.punct(&Token::Comma) {
                        break;
                    }
                    c.i += 1;
                }
            }
            Ok(Step::Signal { state, message, errno })
        }
        Some(
            k @ ("DECLARE" | "WHILE" | "LOOP" | "REPEAT" | "CASE" | "CALL" | "LEAVE" | "ITERATE" | "RETURN" | "OPEN"
            | "FETCH" | "CLOSE" | "RESIGNAL" | "GET"),
        ) => Err(SqlError::not_supported(format!("{k} in a trigger"))),
        _ => {
            // A plain statement: to the `;` that ends it (inside a block) or to the end.
            let mut j = c.i;
            if in_block {
                while j < c.t.len() && c.t[j].0 != Token::SemiColon {
                    j += 1;
                }
            } else {
                j = c.t.len();
                while j > c.i && c.t[j - 1].0 == Token::SemiColon {
                    j -= 1;
                }
            }
            if j == c.i {
                return Err(SqlError::parse(format!("expected a statement near '{}'", c.near())));
            }
            let text = c.text_to(j);
            c.i = j;
            Ok(Step::Sql(text))
        }
    }
}

/// Statements up to one of the keywords `until` (not consumed), each ended by `;`.
fn statements(c: &mut Cursor<'_>, depth: usize, until: &[&str]) -> SqlResult<Vec<Step>> {
    let mut out = vec![];
    loop {
        while c.punct(&Token::SemiColon) {
            c.i += 1;
        }
        if c.done() {
            return Err(SqlError::parse(format!("expected {} before the end of the trigger body", until.join(" or "))));
        }
        if c.peek_kw().is_some_and(|k| until.contains(&k.as_str())) {
            return Ok(out);
        }
        out.push(statement(c, depth, true)?);
        if !c.punct(&Token::SemiColon) && !c.peek_kw().is_some_and(|k| until.contains(&k.as_str())) {
            return Err(SqlError::parse(format!("expected ; near '{}'", c.near())));
        }
    }
}

/// An expression's text, up to one of the tokens `stop` or keywords `stop_kw` outside
/// parentheses and CASE … END.
fn expression(c: &mut Cursor<'_>, stop: &[Token], stop_kw: &[&str]) -> SqlResult<String> {
    let (mut parens, mut cases) = (0usize, 0usize);
    let mut j = c.i;
    while j < c.t.len() {
        let (t, ..) = &c.t[j];
        let k = kw(t);
        if parens == 0 && cases == 0 && (stop.contains(t) || k.as_deref().is_some_and(|k| stop_kw.contains(&k))) {
            break;
        }
        match (t, k.as_deref()) {
            (Token::LParen, _) => parens += 1,
            (Token::RParen, _) => parens = parens.saturating_sub(1),
            (_, Some("CASE")) => cases += 1,
            (_, Some("END")) => cases = cases.saturating_sub(1),
            _ => {}
        }
        j += 1;
    }
    if j == c.i {
        return Err(SqlError::parse(format!("expected an expression near '{}'", c.near())));
    }
    let text = c.text_to(j);
    c.i = j;
    Ok(text)
}

fn valid_sqlstate(s: &str) -> bool {
    s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()) && !s.starts_with("00")
}

/// The `NEW.col` / `OLD.col` references in `text`, in order.
pub fn row_refs(text: &str) -> SqlResult<Vec<RowRef>> {
    let t = lex(text)?;
    let mut out = vec![];
    let mut i = 0;
    while i + 2 < t.len() {
        let which = kw(&t[i].0);
        let is_row = matches!(which.as_deref(), Some("NEW" | "OLD"));
        // Not the tail of a qualified name (`db.new.x`).
        let after_dot = i > 0 && t[i - 1].0 == Token::Period;
        if is_row && !after_dot && t[i + 1].0 == Token::Period {
            if let Some(column) = name_of(&t[i + 2].0) {
                let (_, at, _) = t[i];
                let (_, col_at, col_len) = &t[i + 2];
                // The column token's own text, without what follows it.
                let col_text = text[*col_at..col_at + col_len].trim_end();
                out.push(RowRef {
                    new: which.as_deref() == Some("NEW"),
                    column,
                    start: at,
                    end: col_at + col_text.len(),
                });
                i += 3;
                continue;
            }
        }
        i += 1;
    }
    Ok(out)
}

/// `text` with each reference replaced by `value(reference)`.
pub fn replace_refs(
    text: &str,
    refs: &[RowRef],
    mut value: impl FnMut(&RowRef) -> SqlResult<String>,
) -> SqlResult<String> {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for r in refs {
        out.push_str(&text[last..r.start]);
        out.push_str(&value(r)?);
        last = r.end;
    }
    out.push_str(&text[last..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_trigger_reads_its_parts_and_keeps_the_body_as_written() {
        let t = parse_create(
            "CREATE DEFINER=`root`@`%` TRIGGER IF NOT EXISTS d.tr BEFORE UPDATE ON d.t FOR EACH ROW\n  SET NEW.a = 1;",
        )
        .unwrap();
        assert_eq!(
            t,
            CreateTrigger {
                db: Some("d".into()),
                name: "tr".into(),
                if_not_exists: true,
                before: true,
                event: TriggerEvent::Update,
                table_db: Some("d".into()),
                table: "t".into(),
                body: "SET NEW.a = 1".into(),
            }
        );
        let t = parse_create("create trigger t1r1 after delete on t1 for each row begin end;").unwrap();
        assert_eq!((t.before, t.event, t.body.as_str()), (false, TriggerEvent::Delete, "begin end"));
        for bad in [
            "CREATE TRIGGER t1r1 UPDATE ON t1 BEGIN SELECT 1; END;",
            "CREATE TRIGGER t1r1 AFTER UPDATE ON t1 BEGIN SELECT 1; END;",
            "CREATE TRIGGER t1r1 AFTER UPDATE ON t1 FOR EACH ROW",
        ] {
            assert_eq!(parse_create(bad).unwrap_err().code, code::PARSE, "{bad}");
        }
        let order = parse_create("CREATE TRIGGER a AFTER UPDATE ON t FOR EACH ROW FOLLOWS b SET NEW.x = 1");
        assert_eq!(order.unwrap_err().code, code::NOT_SUPPORTED_YET);
        assert!(is_create_trigger("CREATE DEFINER = CURRENT_USER TRIGGER x"));
        assert!(is_create_trigger("create trigger x"));
        assert!(!is_create_trigger("CREATE TABLE log (trigger INT)"));
    }

    #[test]
    fn drop_trigger_takes_an_optional_database_and_if_exists() {
        assert_eq!(parse_drop("DROP TRIGGER t1r1").unwrap(), Some((None, "t1r1".into(), false)));
        assert_eq!(parse_drop("drop trigger if exists `d`.x;").unwrap(), Some((Some("d".into()), "x".into(), true)));
        assert_eq!(parse_drop("DROP TABLE t").unwrap(), None);
        assert!(parse_drop("DROP TRIGGER a b").is_err());
    }

    #[test]
    fn bodies_become_steps() {
        assert_eq!(program("begin end").unwrap(), vec![Step::Block(vec![])]);
        assert_eq!(
            program("INSERT INTO log VALUES (NEW.a, 'x;y')").unwrap(),
            vec![Step::Sql("INSERT INTO log VALUES (NEW.a, 'x;y')".into())]
        );
        let p = program(
            "BEGIN\n  IF NEW.a < 0 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'negative';\n  \
             ELSEIF NEW.a = CASE WHEN OLD.a > 1 THEN 2 END THEN SET NEW.b = (1 + 2), NEW.c := 'q';\n  \
             ELSE UPDATE t2 SET n = n + 1; END IF;\n  DELETE FROM t3;\nEND",
        )
        .unwrap();
        let want = Step::Block(vec![
            Step::If {
                arms: vec![
                    (
                        "NEW.a < 0".into(),
                        vec![Step::Signal { state: "45000".into(), message: Some("negative".into()), errno: None }],
                    ),
                    (
                        "NEW.a = CASE WHEN OLD.a > 1 THEN 2 END".into(),
                        vec![Step::SetNew(vec![("b".into(), "(1 + 2)".into()), ("c".into(), "'q'".into())])],
                    ),
                ],
                otherwise: vec![Step::Sql("UPDATE t2 SET n = n + 1".into())],
            },
            Step::Sql("DELETE FROM t3".into()),
        ]);
        assert_eq!(p, vec![want]);
        assert_eq!(program("SET OLD.a = 1").unwrap_err().code, code::TRG_CANT_CHANGE_ROW);
        assert_eq!(program("SET @x = 1").unwrap_err().code, code::NOT_SUPPORTED_YET);
        assert_eq!(program("BEGIN DECLARE x INT; END").unwrap_err().code, code::NOT_SUPPORTED_YET);
        assert_eq!(program("SIGNAL SQLSTATE '00000'").unwrap_err().code, code::SP_BAD_SQLSTATE);
        for bad in ["BEGIN INSERT INTO t VALUES (1)", "IF 1 THEN DELETE FROM t; END", "BEGIN END END"] {
            assert_eq!(program(bad).unwrap_err().code, code::PARSE, "{bad}");
        }
    }

    #[test]
    fn row_references_are_found_outside_strings_and_replaced() {
        let text = "INSERT INTO log VALUES (NEW.a, old.`b c`, 'NEW.a', d.new.x, NEW . a)";
        let refs = row_refs(text).unwrap();
        let cols: Vec<(bool, &str)> = refs.iter().map(|r| (r.new, r.column.as_str())).collect();
        assert_eq!(cols, vec![(true, "a"), (false, "b c"), (true, "a")]);
        let out = replace_refs(text, &refs, |r| Ok(if r.new { "1".into() } else { "'x'".into() })).unwrap();
        assert_eq!(out, "INSERT INTO log VALUES (1, 'x', 'NEW.a', d.new.x, 1)");
    }
}

//! Account statements, parsed here with their own small tokenizer: sqlparser does not know
//! MySQL's `'user'@'host'` names and parses few of these forms.
//!
//! ```text
//! CREATE USER [IF NOT EXISTS] user [IDENTIFIED {BY 'pw' | WITH plugin [BY 'pw']}] [, ...]
//! DROP USER [IF EXISTS] user [, ...]
//! ALTER USER [IF EXISTS] user IDENTIFIED ...
//! SET PASSWORD [FOR user] = 'pw'
//! GRANT ALL [PRIVILEGES] ON {*.* | db.* | *} TO user [, ...] [WITH GRANT OPTION]
//! REVOKE ALL [PRIVILEGES] ON ... FROM user [, ...]
//! SHOW GRANTS [FOR user]
//! ```
//!
//! A user is `name[@host]` (host '%' when left out), each part a word or a quoted string, or
//! CURRENT_USER[()] / USER().

use shoal_proto::{AccountName, AuthPlugin};

use crate::error::{SqlError, SqlResult};

/// A password as the statement gave it. Its Debug output hides it, so logging a parsed
/// statement can never leak one.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(pub String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(<hidden>)")
    }
}

/// The account a statement names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserSpec {
    Named(AccountName),
    /// CURRENT_USER, CURRENT_USER() or USER(): the session's own account.
    Current,
}

/// `IDENTIFIED [WITH plugin] BY 'pw'`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Auth {
    /// None: the server's default (mysql_native_password).
    pub plugin: Option<AuthPlugin>,
    pub password: Password,
}

/// Where a GRANT or REVOKE applies: `*.*`, `db.*`, or `*` (the current database).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Global,
    Database(String),
    CurrentDatabase,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccountStmt {
    CreateUser { if_not_exists: bool, users: Vec<(UserSpec, Option<Auth>)> },
    DropUser { if_exists: bool, users: Vec<UserSpec> },
    AlterUser { if_exists: bool, user: UserSpec, auth: Auth },
    SetPassword { user: UserSpec, password: Password },
    Grant { scope: Scope, users: Vec<UserSpec>, grant_option: bool },
    Revoke { scope: Scope, users: Vec<UserSpec> },
    ShowGrants { user: UserSpec },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum T {
    /// An unquoted word.
    Word(String),
    /// A quoted string or identifier ('…', "…", `…`), unescaped.
    Quoted(String),
    Punct(char),
}

/// Splits the statement into words, quoted strings and punctuation; comments and whitespace go.
fn tokenize(sql: &str) -> SqlResult<Vec<T>> {
    let b: Vec<char> = sql.chars().collect();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' || (c == '-' && b.get(i + 1) == Some(&'-')) {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && b.get(i + 1) == Some(&'*') {
            i += 2;
            while i < b.len() && !(b[i] == '*' && b.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            if i >= b.len() {
                return Err(SqlError::parse("unterminated comment"));
            }
            i += 2;
        } else if c == '\'' || c == '"' || c == '`' {
            let mut s = String::new();
            i += 1;
            loop {
                let Some(&ch) = b.get(i) else { return Err(SqlError::parse("unterminated quoted string")) };
                i += 1;
                if ch == c {
                    if b.get(i) == Some(&c) {
                        // A doubled quote stands for itself.
                        s.push(c);
                        i += 1;
                        continue;
                    }
                    break;
                }
                if ch == '\\' && c != '`' {
                    let Some(&e) = b.get(i) else { return Err(SqlError::parse("unterminated quoted string")) };
                    i += 1;
                    s.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        'r' => '\r',
                        '0' => '\0',
                        'Z' => '\u{1a}',
                        other => other,
                    });
                    continue;
                }
                s.push(ch);
            }
            out.push(T::Quoted(s));
        } else if c.is_alphanumeric() || c == '_' || c == '$' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '$') {
                i += 1;
            }
            out.push(T::Word(b[start..i].iter().collect()));
        } else {
            out.push(T::Punct(c));
            i += 1;
        }
    }
    while out.last() == Some(&T::Punct(';')) {
        out.pop();
    }
    Ok(out)
}

struct Cur {
    t: Vec<T>,
    i: usize,
}

impl Cur {
    fn peek_kw(&self) -> Option<String> {
        match self.t.get(self.i) {
            Some(T::Word(w)) => Some(w.to_ascii_uppercase()),
            _ => None,
        }
    }
    fn eat(&mut self, kw: &str) -> bool {
        if self.peek_kw().as_deref() == Some(kw) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, kw: &str) -> SqlResult<()> {
        if self.eat(kw) {
            Ok(())
        } else {
            Err(SqlError::parse(format!("expected {kw} near '{}'", self.here())))
        }
    }
    fn punct(&mut self, p: char) -> bool {
        if self.t.get(self.i) == Some(&T::Punct(p)) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn here(&self) -> String {
        match self.t.get(self.i) {
            Some(T::Word(w)) => w.clone(),
            // Never echo a quoted string: it may be a password.
            Some(T::Quoted(_)) => "a quoted string".to_string(),
            Some(T::Punct(c)) => c.to_string(),
            None => String::new(),
        }
    }
    fn done(&self) -> bool {
        self.i >= self.t.len()
    }
    fn end(&self) -> SqlResult<()> {
        if self.done() {
            Ok(())
        } else {
            Err(SqlError::not_supported(format!("account statements with '{}'", self.here())))
        }
    }
    /// A name part: a word or a quoted string.
    fn part(&mut self) -> SqlResult<String> {
        match self.t.get(self.i) {
            Some(T::Word(w) | T::Quoted(w)) => {
                let w = w.clone();
                self.i += 1;
                Ok(w)
            }
            _ => Err(SqlError::parse(format!("expected a user name near '{}'", self.here()))),
        }
    }
    fn string(&mut self) -> SqlResult<String> {
        match self.t.get(self.i) {
            Some(T::Quoted(s)) => {
                let s = s.clone();
                self.i += 1;
                Ok(s)
            }
            _ => Err(SqlError::parse(format!("expected a quoted string near '{}'", self.here()))),
        }
    }
    fn user(&mut self) -> SqlResult<UserSpec> {
        if matches!(self.peek_kw().as_deref(), Some("CURRENT_USER" | "USER")) {
            let is_user_fn = self.peek_kw().as_deref() == Some("USER");
            let save = self.i;
            self.i += 1;
            let parens = self.punct('(') && self.punct(')');
            if parens || !is_user_fn {
                return Ok(UserSpec::Current);
            }
            self.i = save; // a user named `user`
        }
        let name = self.part()?;
        let host = if self.punct('@') { self.part()? } else { "%".to_string() };
        Ok(UserSpec::Named(AccountName { name, host }))
    }
    fn users(&mut self) -> SqlResult<Vec<UserSpec>> {
        let mut out = vec![self.user()?];
        while self.punct(',') {
            out.push(self.user()?);
        }
        Ok(out)
    }
    /// `IDENTIFIED BY 'pw'` or `IDENTIFIED WITH plugin [BY 'pw']`, after IDENTIFIED.
    fn auth(&mut self) -> SqlResult<Auth> {
        let mut plugin = None;
        if self.eat("WITH") {
            let name = self.part()?;
            plugin = Some(AuthPlugin::from_name(&name).ok_or_else(|| {
                SqlError::new(crate::error::code::PLUGIN_IS_NOT_LOADED, format!("Plugin '{name}' is not loaded"))
            })?);
            if self.eat("AS") {
                return Err(SqlError::not_supported("IDENTIFIED ... AS 'hash'"));
            }
            if !self.eat("BY") {
                return Ok(Auth { plugin, password: Password(String::new()) });
            }
        } else {
            self.expect("BY")?;
        }
        if self.eat("RANDOM") {
            return Err(SqlError::not_supported("IDENTIFIED BY RANDOM PASSWORD"));
        }
        Ok(Auth { plugin, password: Password(self.string()?) })
    }
    fn if_exists(&mut self) -> SqlResult<bool> {
        if self.eat("IF") {
            self.expect("EXISTS")?;
            return Ok(true);
        }
        Ok(false)
    }
    /// `ALL` (optionally `PRIVILEGES`) `ON` a scope.
    fn all_on(&mut self) -> SqlResult<Scope> {
        if !self.eat("ALL") {
            return Err(SqlError::not_supported("GRANT and REVOKE of privileges other than ALL [PRIVILEGES]"));
        }
        self.eat("PRIVILEGES");
        if self.punct(',') {
            return Err(SqlError::not_supported("GRANT and REVOKE of privileges other than ALL [PRIVILEGES]"));
        }
        self.expect("ON")?;
        if self.eat("TABLE") {
            return Err(SqlError::not_supported("table-level privileges"));
        }
        let db = if self.punct('*') { None } else { Some(self.part()?) };
        if !self.punct('.') {
            return match db {
                None => Ok(Scope::CurrentDatabase),
                Some(_) => Err(SqlError::not_supported("table-level privileges")),
            };
        }
        if !self.punct('*') {
            return Err(SqlError::not_supported("table-level privileges"));
        }
        Ok(db.map_or(Scope::Global, Scope::Database))
    }
}

/// Whether `sql` is an account statement (its first two words decide), so that
/// [`parse`] should read it.
pub fn is_account_statement(sql: &str) -> bool {
    // Runs for every statement: no allocation.
    let mut words = sql.split(|c: char| c.is_whitespace() || c == '(' || c == ';').filter(|w| !w.is_empty());
    let first = words.next().unwrap_or("");
    let second = words.next().unwrap_or("");
    let is = |w: &str, kw: &str| w.eq_ignore_ascii_case(kw);
    if ["CREATE", "DROP", "ALTER", "RENAME"].iter().any(|k| is(first, k)) {
        return is(second, "USER");
    }
    if is(first, "GRANT") || is(first, "REVOKE") {
        return true;
    }
    if is(first, "SHOW") {
        return is(second, "GRANTS");
    }
    let password_first = second.get(..9).is_some_and(|p| is(p, "PASSWORD="));
    is(first, "SET") && (is(second, "PASSWORD") || password_first)
}

pub fn parse(sql: &str) -> SqlResult<AccountStmt> {
    let mut c = Cur { t: tokenize(sql)?, i: 0 };
    let first = c.peek_kw().unwrap_or_default();
    c.i += 1;
    let stmt = match first.as_str() {
        "CREATE" => {
            c.expect("USER")?;
            let if_not_exists = if c.eat("IF") {
                c.expect("NOT")?;
                c.expect("EXISTS")?;
                true
            } else {
                false
            };
            let mut users = vec![];
            loop {
                let u = c.user()?;
                let auth = if c.eat("IDENTIFIED") { Some(c.auth()?) } else { None };
                users.push((u, auth));
                if !c.punct(',') {
                    break;
                }
            }
            AccountStmt::CreateUser { if_not_exists, users }
        }
        "DROP" => {
            c.expect("USER")?;
            let if_exists = c.if_exists()?;
            AccountStmt::DropUser { if_exists, users: c.users()? }
        }
        "ALTER" => {
            c.expect("USER")?;
            let if_exists = c.if_exists()?;
            let user = c.user()?;
            if !c.eat("IDENTIFIED") {
                return Err(SqlError::not_supported("ALTER USER other than IDENTIFIED BY"));
            }
            let auth = c.auth()?;
            if c.punct(',') {
                return Err(SqlError::not_supported("ALTER USER of several accounts"));
            }
            AccountStmt::AlterUser { if_exists, user, auth }
        }
        "RENAME" => return Err(SqlError::not_supported("RENAME USER")),
        "SET" => {
            c.expect("PASSWORD")?;
            let user = if c.eat("FOR") { c.user()? } else { UserSpec::Current };
            if !c.punct('=') {
                return Err(SqlError::parse("expected = after SET PASSWORD"));
            }
            if c.peek_kw().as_deref() == Some("PASSWORD") {
                return Err(SqlError::not_supported("SET PASSWORD = PASSWORD('...')"));
            }
            AccountStmt::SetPassword { user, password: Password(c.string()?) }
        }
        "GRANT" => {
            let scope = c.all_on()?;
            c.expect("TO")?;
            let users = c.users()?;
            let grant_option = if c.eat("WITH") {
                c.expect("GRANT")?;
                c.expect("OPTION")?;
                true
            } else {
                false
            };
            AccountStmt::Grant { scope, users, grant_option }
        }
        "REVOKE" => {
            let scope = c.all_on()?;
            c.expect("FROM")?;
            AccountStmt::Revoke { scope, users: c.users()? }
        }
        "SHOW" => {
            c.expect("GRANTS")?;
            let user = if c.eat("FOR") { c.user()? } else { UserSpec::Current };
            if c.eat("USING") {
                return Err(SqlError::not_supported("SHOW GRANTS ... USING"));
            }
            AccountStmt::ShowGrants { user }
        }
        _ => return Err(SqlError::parse("not an account statement")),
    };
    c.end()?;
    Ok(stmt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(n: &str, h: &str) -> UserSpec {
        UserSpec::Named(AccountName::new(n, h))
    }

    fn pw(s: &str) -> Password {
        Password(s.into())
    }

    #[test]
    fn account_statements_parse() {
        assert_eq!(
            parse("CREATE USER IF NOT EXISTS 'ann'@'%' IDENTIFIED BY 'it''s', bob@localhost, `c d`@'10.0.0.%' IDENTIFIED WITH caching_sha2_password BY \"x\\\\y\";").unwrap(),
            AccountStmt::CreateUser {
                if_not_exists: true,
                users: vec![
                    (named("ann", "%"), Some(Auth { plugin: None, password: pw("it's") })),
                    (named("bob", "localhost"), None),
                    (
                        named("c d", "10.0.0.%"),
                        Some(Auth { plugin: Some(AuthPlugin::CachingSha2Password), password: pw("x\\y") })
                    ),
                ],
            }
        );
        assert_eq!(
            parse("drop user if exists 'a', b@'h'").unwrap(),
            AccountStmt::DropUser { if_exists: true, users: vec![named("a", "%"), named("b", "h")] }
        );
        assert_eq!(
            parse("ALTER USER USER() IDENTIFIED WITH mysql_native_password BY 'n'").unwrap(),
            AccountStmt::AlterUser {
                if_exists: false,
                user: UserSpec::Current,
                auth: Auth { plugin: Some(AuthPlugin::NativePassword), password: pw("n") }
            }
        );
        assert_eq!(
            parse("SET PASSWORD FOR 'root'@'%' = ''").unwrap(),
            AccountStmt::SetPassword { user: named("root", "%"), password: pw("") }
        );
        assert_eq!(
            parse("SET PASSWORD = 'p'").unwrap(),
            AccountStmt::SetPassword { user: UserSpec::Current, password: pw("p") }
        );
        assert_eq!(
            parse("GRANT ALL PRIVILEGES ON *.* TO 'a'@'%' WITH GRANT OPTION").unwrap(),
            AccountStmt::Grant { scope: Scope::Global, users: vec![named("a", "%")], grant_option: true }
        );
        assert_eq!(
            parse("grant all on `shop`.* to a, b").unwrap(),
            AccountStmt::Grant {
                scope: Scope::Database("shop".into()),
                users: vec![named("a", "%"), named("b", "%")],
                grant_option: false
            }
        );
        assert_eq!(
            parse("REVOKE ALL ON * FROM a").unwrap(),
            AccountStmt::Revoke { scope: Scope::CurrentDatabase, users: vec![named("a", "%")] }
        );
        assert_eq!(parse("SHOW GRANTS").unwrap(), AccountStmt::ShowGrants { user: UserSpec::Current });
        assert_eq!(
            parse("SHOW GRANTS FOR CURRENT_USER()").unwrap(),
            AccountStmt::ShowGrants { user: UserSpec::Current }
        );
        assert_eq!(parse("SHOW GRANTS FOR /* c */ x@'y'").unwrap(), AccountStmt::ShowGrants { user: named("x", "y") });
        assert_eq!(parse("SHOW GRANTS FOR user").unwrap(), AccountStmt::ShowGrants { user: named("user", "%") });
    }

    #[test]
    fn unsupported_and_bad_account_statements_get_mysql_errors() {
        use crate::error::code;
        for (sql, want) in [
            ("GRANT SELECT ON db.* TO a", code::NOT_SUPPORTED_YET),
            ("GRANT ALL ON db.t TO a", code::NOT_SUPPORTED_YET),
            ("GRANT ALL ON *.* TO a REQUIRE SSL", code::NOT_SUPPORTED_YET),
            ("CREATE USER a IDENTIFIED WITH sha256_password BY 'x'", code::PLUGIN_IS_NOT_LOADED),
            ("CREATE USER a IDENTIFIED WITH mysql_native_password AS '*ABC'", code::NOT_SUPPORTED_YET),
            ("RENAME USER a TO b", code::NOT_SUPPORTED_YET),
            ("CREATE USER 'a", code::PARSE),
            ("CREATE USER", code::PARSE),
            ("DROP USER a@", code::PARSE),
            ("CREATE USER a IDENTIFIED BY x", code::PARSE),
            ("GRANT ALL ON *.* a", code::PARSE),
            ("SET PASSWORD 'x'", code::PARSE),
        ] {
            assert_eq!(parse(sql).map_err(|e| e.code), Err(want), "{sql}");
        }
        // Never panics on odd input.
        for cut in 0.."CREATE USER 'ann'@'%' IDENTIFIED BY 'x'".len() {
            let _ = parse(&"CREATE USER 'ann'@'%' IDENTIFIED BY 'x'"[..cut]);
        }
    }

    #[test]
    fn account_statements_are_recognized_by_their_first_words() {
        for yes in ["CREATE USER a", "drop  user a", "GRANT ALL ON *.* TO a", "show grants", "SET PASSWORD = 'x'"] {
            assert!(is_account_statement(yes), "{yes}");
        }
        for no in ["CREATE TABLE user (a INT)", "SET autocommit=1", "SHOW TABLES", "SELECT user()", "SET passwords=1"] {
            assert!(!is_account_statement(no), "{no}");
        }
        let p = format!("{:?}", parse("CREATE USER a IDENTIFIED BY 'secret'").unwrap());
        assert!(!p.contains("secret"), "passwords stay out of Debug output: {p}");
    }
}

//! SQL users: the account statements (CREATE/DROP/ALTER USER, SET PASSWORD, GRANT, REVOKE, SHOW
//! GRANTS) and the privilege checks every statement passes.
//!
//! **Where users live.** In the catalog held by mgmd (Raft-replicated, so they survive
//! restarts), changed through the client's user calls. Each SQL node caches the whole user
//! table ([`Shared::users`]) and reloads it only when the cluster map's `users_version` moves,
//! so logins and privilege checks need no mgmd round trip, and an account created on one SQL
//! node is usable on every other one as soon as its map watch brings the new version.
//!
//! **Privileges** are ALL on `*.*` or ALL on `db.*`:
//! - ALL on `*.*`: everything, including managing accounts and grants.
//! - ALL on `db.*`: every statement on database `db` (its tables and views, CREATE/DROP
//!   DATABASE `db`).
//! - Everyone: log in, statements that read no table (`SELECT 1`, `@@variables`, SET, SHOW
//!   VARIABLES), `information_schema` (rows only of databases they may use), SHOW DATABASES (the
//!   same), their own SHOW GRANTS, and ALTER USER / SET PASSWORD of their own account.
//!
//! A database the account may not use answers 1044 (USE, SHOW TABLES, CREATE/DROP DATABASE);
//! a table in it 1142, before anything says whether it exists (as MySQL does). A session
//! whose account was dropped keeps running with no privileges.

use std::sync::Arc;

use shoal_client::users::Users;
use shoal_proto::users::{account_list, MAX_USER_HOST_BYTES, MAX_USER_NAME_BYTES};
use shoal_proto::{AccountName, AuthPlugin, ErrorCode, ShoalError, UserAccount};

use crate::auth;
use crate::error::{code, SqlError, SqlResult};
use crate::infoschema::INFORMATION_SCHEMA;
use crate::session::{Outcome, ResultSet, Session, Shared};
use crate::sql::account::{AccountStmt, Auth, Scope, UserSpec};
use crate::types::WireType;
use crate::val::Val;

/// After mgmd failed to answer a reload of the users, statements use the cached table for
/// this long before one of them tries again.
pub const USERS_RELOAD_BACKOFF_MS: u64 = 1000;

impl Shared {
    /// The cached user table, first reloaded from mgmd if the cluster map says it is behind
    /// (one mgmd call per change of users, shared by every connection waiting for it).
    pub async fn users(&self) -> Result<Arc<Users>, ShoalError> {
        self.users_at_least(self.client.map().users_version).await
    }

    /// Like [`Shared::users`], at least at `version` (what a user command of ours produced).
    pub async fn users_at_least(&self, version: u64) -> Result<Arc<Users>, ShoalError> {
        let fresh = |c: &Option<Arc<Users>>| c.as_ref().filter(|u| u.version >= version).cloned();
        if let Some(u) = fresh(&self.users.read()) {
            return Ok(u);
        }
        let mut last_failure = self.users_refresh.lock().await;
        if let Some(u) = fresh(&self.users.read()) {
            return Ok(u);
        }
        // mgmd did not answer a moment ago: serve from the cache rather than make every
        // statement wait for another attempt.
        let cached = self.users.read().clone();
        if let (Some(u), Some(t)) = (&cached, *last_failure) {
            if t.elapsed() < std::time::Duration::from_millis(USERS_RELOAD_BACKOFF_MS) {
                return Ok(u.clone());
            }
        }
        match self.client.list_users().await {
            Ok(u) => {
                *last_failure = None;
                let u = Arc::new(u);
                let mut cur = self.users.write();
                if cur.as_ref().is_none_or(|c| c.version <= u.version) {
                    *cur = Some(u.clone());
                }
                Ok(u)
            }
            Err(e) => {
                // A stale table is still the best answer; having none is an error.
                tracing::warn!("load the users from mgmd: {e}");
                *last_failure = Some(std::time::Instant::now());
                cached.ok_or(e)
            }
        }
    }

    /// The cached user table as it is now (empty before the first load).
    pub fn users_now(&self) -> Arc<Users> {
        self.users.read().clone().unwrap_or_default()
    }
}

/// `'name'@'host'` checked against MySQL's length limits (1470) before it goes anywhere.
fn check_account(a: &AccountName) -> SqlResult<()> {
    if a.name.is_empty() {
        return Err(SqlError::not_supported("anonymous accounts (an empty user name)"));
    }
    if a.name.len() > MAX_USER_NAME_BYTES {
        return Err(SqlError::new(
            code::WRONG_STRING_LENGTH,
            format!("String '{}' is too long for user name (should be no longer than {MAX_USER_NAME_BYTES})", a.name),
        ));
    }
    if a.host.len() > MAX_USER_HOST_BYTES {
        return Err(SqlError::new(
            code::WRONG_STRING_LENGTH,
            format!("String '{}' is too long for host name (should be no longer than {MAX_USER_HOST_BYTES})", a.host),
        ));
    }
    a.validate().map_err(|e| SqlError::new(code::CANNOT_USER, e.message))
}

/// `` `name`@`host` `` as SHOW GRANTS prints accounts.
fn quoted_account(a: &AccountName) -> String {
    format!("`{}`@`{}`", a.name.replace('`', "``"), a.host.replace('`', "``"))
}

/// The rows of SHOW GRANTS for an account.
pub fn grant_lines(u: &UserAccount) -> Vec<String> {
    let who = quoted_account(&u.account);
    let mut lines = vec![if u.global_all {
        // ALL on *.* includes managing accounts and grants.
        format!("GRANT ALL PRIVILEGES ON *.* TO {who} WITH GRANT OPTION")
    } else {
        format!("GRANT USAGE ON *.* TO {who}")
    }];
    for db in &u.databases {
        lines.push(format!("GRANT ALL PRIVILEGES ON `{}`.* TO {who}", db.replace('`', "``")));
    }
    lines
}

/// 1396 for a user command mgmd refused: "Operation CREATE USER failed for 'a'@'%'".
fn cannot_user(op: &str, accounts: &[AccountName], e: &ShoalError) -> SqlError {
    match e.code {
        // mgmd's message is the list of accounts it failed for.
        ErrorCode::UserExists | ErrorCode::NoSuchUser => {
            SqlError::new(code::CANNOT_USER, format!("Operation {op} failed for {}", e.message))
        }
        // The last account with ALL on *.* would go.
        ErrorCode::InvalidArgument => SqlError::new(
            code::CANNOT_USER,
            format!("Operation {op} failed for {}: {}", account_list(accounts), e.message),
        ),
        _ => SqlError::from_cluster(e),
    }
}

impl Session {
    /// Runs `f` on the session's account as the user cache has it now (None once it was
    /// dropped). No copy: privilege checks run on every statement.
    fn with_account<R>(&self, f: impl FnOnce(Option<&UserAccount>) -> R) -> R {
        let users = self.shared.users_now();
        f(users.accounts.iter().find(|u| u.account.is(&self.account.name, &self.account.host)))
    }

    fn is_admin(&self) -> bool {
        self.with_account(|a| a.is_some_and(|u| u.global_all))
    }

    /// Whether the session may use database `db`.
    pub fn can_use_db(&self, db: &str) -> bool {
        db.eq_ignore_ascii_case(INFORMATION_SCHEMA) || self.with_account(|a| a.is_some_and(|u| u.can_use(db)))
    }

    /// 1044 unless the session may use database `db`.
    pub fn check_db(&self, db: &str) -> SqlResult<()> {
        if self.can_use_db(db) {
            return Ok(());
        }
        Err(SqlError::new(
            code::DBACCESS_DENIED,
            format!("Access denied for user '{}'@'{}' to database '{db}'", self.account.name, self.account.host),
        ))
    }

    /// 1142 unless the session may use table `db`.`table`; the statement kind names the command.
    pub fn check_table(&self, db: &str, table: &str) -> SqlResult<()> {
        if self.can_use_db(db) {
            return Ok(());
        }
        Err(SqlError::new(
            code::TABLEACCESS_DENIED,
            format!("{} command denied to user '{}'@'{}' for table '{table}'", self.command, self.user, self.host),
        ))
    }

    /// Databases the session may see (SHOW DATABASES, information_schema).
    pub fn visible_databases(&self) -> Vec<String> {
        let dbs = self.databases();
        self.with_account(|a| dbs.into_iter().filter(|d| a.is_some_and(|u| u.can_use(d))).collect())
    }

    fn require_admin(&self, privilege: &str) -> SqlResult<()> {
        if self.is_admin() {
            return Ok(());
        }
        Err(SqlError::new(
            code::SPECIFIC_ACCESS_DENIED,
            format!("Access denied; you need (at least one of) the {privilege} privilege(s) for this operation"),
        ))
    }

    fn account_of(&self, u: &UserSpec) -> SqlResult<AccountName> {
        let a = match u {
            UserSpec::Named(a) => a.clone(),
            UserSpec::Current => self.account.clone(),
        };
        check_account(&a)?;
        Ok(a)
    }

    fn accounts_of(&self, users: &[UserSpec]) -> SqlResult<Vec<AccountName>> {
        users.iter().map(|u| self.account_of(u)).collect()
    }

    fn scope_db(&self, scope: &Scope) -> SqlResult<Option<String>> {
        Ok(match scope {
            Scope::Global => None,
            Scope::Database(d) => Some(d.clone()),
            Scope::CurrentDatabase => Some(self.db_for(None)?),
        })
    }

    /// Brings this node's cache up to what a user command of ours produced, so the next
    /// statement here sees it.
    async fn after_user_change(&self, version: u64) {
        if let Err(e) = self.shared.users_at_least(version).await {
            tracing::warn!("reload the users after a change: {e}");
        }
    }

    pub async fn account_statement(&mut self, stmt: AccountStmt) -> SqlResult<Outcome> {
        // Decide on the newest users the map knows of.
        self.shared.users().await.map_err(|e| SqlError::from_cluster(&e))?;
        match stmt {
            AccountStmt::CreateUser { if_not_exists, users } => {
                self.require_admin("CREATE USER")?;
                let mut accounts = vec![];
                for (u, a) in &users {
                    let account = self.account_of(u)?;
                    let password = match a {
                        Some(Auth { plugin, password }) => {
                            auth::hashes(plugin.unwrap_or(AuthPlugin::NativePassword), &password.0)
                        }
                        None => auth::hashes(AuthPlugin::NativePassword, ""),
                    };
                    accounts.push(UserAccount { account, password, global_all: false, databases: vec![] });
                }
                let names: Vec<AccountName> = accounts.iter().map(|a| a.account.clone()).collect();
                let v = self
                    .client()
                    .create_users(&accounts, if_not_exists)
                    .await
                    .map_err(|e| cannot_user("CREATE USER", &names, &e))?;
                self.after_user_change(v).await;
                Ok(Outcome::ok())
            }
            AccountStmt::DropUser { if_exists, users } => {
                self.require_admin("CREATE USER")?;
                let names = self.accounts_of(&users)?;
                let v = self
                    .client()
                    .drop_users(&names, if_exists)
                    .await
                    .map_err(|e| cannot_user("DROP USER", &names, &e))?;
                self.after_user_change(v).await;
                Ok(Outcome::ok())
            }
            AccountStmt::AlterUser { if_exists, user, auth } => {
                let target = self.account_of(&user)?;
                if target != self.account {
                    self.require_admin("CREATE USER")?;
                }
                // Without WITH, the account keeps its plugin (MySQL).
                let current = self
                    .shared
                    .users_now()
                    .accounts
                    .iter()
                    .find(|u| u.account.is(&target.name, &target.host))
                    .map(|u| u.password.plugin);
                let plugin = auth.plugin.or(current).unwrap_or(AuthPlugin::NativePassword);
                let hashes = auth::hashes(plugin, &auth.password.0);
                let v = self
                    .client()
                    .set_password(&target, &hashes, if_exists)
                    .await
                    .map_err(|e| cannot_user("ALTER USER", std::slice::from_ref(&target), &e))?;
                self.after_user_change(v).await;
                Ok(Outcome::ok())
            }
            AccountStmt::SetPassword { user, password } => {
                let target = self.account_of(&user)?;
                if target != self.account {
                    self.require_admin("CREATE USER")?;
                }
                // SET PASSWORD keeps the account's plugin.
                let users = self.shared.users_now();
                let current = users.accounts.iter().find(|u| u.account.is(&target.name, &target.host));
                let Some(current) = current else {
                    return Err(SqlError::new(
                        code::PASSWORD_NO_MATCH,
                        "Can't find any matching row in the user table",
                    ));
                };
                let hashes = auth::hashes(current.password.plugin, &password.0);
                let v = self.client().set_password(&target, &hashes, false).await.map_err(|e| match e.code {
                    ErrorCode::NoSuchUser => {
                        SqlError::new(code::PASSWORD_NO_MATCH, "Can't find any matching row in the user table")
                    }
                    _ => SqlError::from_cluster(&e),
                })?;
                self.after_user_change(v).await;
                Ok(Outcome::ok())
            }
            AccountStmt::Grant { scope, users, grant_option } => {
                self.require_admin("GRANT OPTION")?;
                let db = self.scope_db(&scope)?;
                if grant_option && db.is_some() {
                    // Only ALL on *.* lets an account grant; a per-database grant option is not modelled.
                    return Err(SqlError::not_supported("WITH GRANT OPTION on a database"));
                }
                let names = self.accounts_of(&users)?;
                let v = self.client().grant(&names, db.as_deref(), false).await.map_err(|e| match e.code {
                    ErrorCode::NoSuchUser => SqlError::new(
                        code::CANT_CREATE_USER_WITH_GRANT,
                        "You are not allowed to create a user with GRANT",
                    ),
                    _ => SqlError::from_cluster(&e),
                })?;
                self.after_user_change(v).await;
                Ok(Outcome::ok())
            }
            AccountStmt::Revoke { scope, users } => {
                self.require_admin("GRANT OPTION")?;
                let db = self.scope_db(&scope)?;
                let names = self.accounts_of(&users)?;
                let no_grant = |a: &AccountName| {
                    SqlError::new(
                        code::NONEXISTING_GRANT,
                        format!("There is no such grant defined for user '{}' on host '{}'", a.name, a.host),
                    )
                };
                // Name the first account without the grant, as MySQL does; mgmd decides anyway.
                let cache = self.shared.users_now();
                for a in &names {
                    let held =
                        cache.accounts.iter().find(|u| u.account.is(&a.name, &a.host)).is_some_and(|u| match &db {
                            None => u.global_all,
                            Some(d) => u.databases.iter().any(|x| x.eq_ignore_ascii_case(d)),
                        });
                    if !held {
                        return Err(no_grant(a));
                    }
                }
                let v = self.client().grant(&names, db.as_deref(), true).await.map_err(|e| match e.code {
                    ErrorCode::NoSuchGrant => no_grant(&names[0]),
                    _ => cannot_user("REVOKE", &names, &e),
                })?;
                self.after_user_change(v).await;
                Ok(Outcome::ok())
            }
            AccountStmt::ShowGrants { user } => {
                let target = self.account_of(&user)?;
                if target != self.account && !self.is_admin() {
                    return Err(SqlError::new(
                        code::DBACCESS_DENIED,
                        format!(
                            "Access denied for user '{}'@'{}' to database 'mysql'",
                            self.account.name, self.account.host
                        ),
                    ));
                }
                let users = self.shared.users_now();
                let Some(u) = users.accounts.iter().find(|u| u.account.is(&target.name, &target.host)) else {
                    return Err(SqlError::new(
                        code::NONEXISTING_GRANT,
                        format!("There is no such grant defined for user '{}' on host '{}'", target.name, target.host),
                    ));
                };
                let title = format!("Grants for {}@{}", u.account.name, u.account.host);
                Ok(Outcome::Rows(ResultSet {
                    columns: vec![crate::session::ColumnMeta::named(&title, Some(WireType::Str { len: 1024 }))].into(),
                    rows: grant_lines(u).into_iter().map(|l| vec![Val::Str(l)]).collect(),
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::PasswordHashes;

    #[test]
    fn show_grants_lines() {
        let mut u = UserAccount {
            account: AccountName::new("ann", "%"),
            password: PasswordHashes::default(),
            global_all: false,
            databases: vec!["shop".into(), "we`ird".into()],
        };
        assert_eq!(
            grant_lines(&u),
            vec![
                "GRANT USAGE ON *.* TO `ann`@`%`".to_string(),
                "GRANT ALL PRIVILEGES ON `shop`.* TO `ann`@`%`".to_string(),
                "GRANT ALL PRIVILEGES ON `we``ird`.* TO `ann`@`%`".to_string(),
            ]
        );
        u.global_all = true;
        u.databases.clear();
        assert_eq!(grant_lines(&u), vec!["GRANT ALL PRIVILEGES ON *.* TO `ann`@`%` WITH GRANT OPTION".to_string()]);
    }

    #[test]
    fn account_names_are_checked_with_mysql_errors() {
        assert!(check_account(&AccountName::new("ann", "%")).is_ok());
        assert_eq!(check_account(&AccountName::new(&"a".repeat(33), "%")).unwrap_err().code, code::WRONG_STRING_LENGTH);
        assert_eq!(
            check_account(&AccountName::new("a", &"h".repeat(256))).unwrap_err().code,
            code::WRONG_STRING_LENGTH
        );
        assert_eq!(check_account(&AccountName::new("", "%")).unwrap_err().code, code::NOT_SUPPORTED_YET);
        assert_eq!(check_account(&AccountName::new("a\u{1}", "%")).unwrap_err().code, code::CANNOT_USER);
    }
}

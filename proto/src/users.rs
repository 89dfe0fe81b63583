//! SQL users as the catalog holds them: MySQL accounts `'name'@'host'` with password hashes
//! (never the password) and privileges, which are ALL on `*.*` or ALL on `db.*`.
//!
//! The SQL node hashes passwords and checks them at login; mgmd only stores and replicates
//! these records. Both hashes are kept for every account, so a client may log in with either
//! `mysql_native_password` or `caching_sha2_password` whatever the account's plugin says.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, ShoalError};

/// Longest user name (MySQL 8's limit is 32 characters).
pub const MAX_USER_NAME_BYTES: usize = 32;
/// Longest host part of an account (MySQL 8's limit).
pub const MAX_USER_HOST_BYTES: usize = 255;
/// Most accounts in one cluster.
pub const MAX_USERS: usize = 1024;
/// Most database grants one account holds.
pub const MAX_GRANTS_PER_USER: usize = 256;
/// Longest database name in a grant (as for tables and columns).
pub const MAX_GRANT_DB_BYTES: usize = crate::types::MAX_NAME_BYTES;
/// Length of SHA1(SHA1(password)).
pub const NATIVE_HASH_BYTES: usize = 20;
/// Length of SHA256(SHA256(password)).
pub const SHA2_HASH_BYTES: usize = 32;

/// How an account authenticates; the server asks a client that answered with another plugin
/// to switch to this one (as MySQL does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AuthPlugin {
    #[default]
    NativePassword,
    CachingSha2Password,
}

impl AuthPlugin {
    /// The plugin's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            AuthPlugin::NativePassword => "mysql_native_password",
            AuthPlugin::CachingSha2Password => "caching_sha2_password",
        }
    }

    pub fn from_name(name: &str) -> Option<AuthPlugin> {
        match name.to_ascii_lowercase().as_str() {
            "mysql_native_password" => Some(AuthPlugin::NativePassword),
            "caching_sha2_password" => Some(AuthPlugin::CachingSha2Password),
            _ => None,
        }
    }
}

/// `'name'@'host'`. The name compares exactly, the host case-insensitively (MySQL).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AccountName {
    pub name: String,
    pub host: String,
}

impl AccountName {
    pub fn new(name: &str, host: &str) -> AccountName {
        AccountName { name: name.to_string(), host: host.to_string() }
    }

    pub fn is(&self, name: &str, host: &str) -> bool {
        self.name == name && self.host.eq_ignore_ascii_case(host)
    }

    pub fn validate(&self) -> Result<(), ShoalError> {
        let bad = |m: String| ShoalError::new(ErrorCode::InvalidArgument, m);
        if self.name.is_empty() {
            return Err(bad("anonymous accounts (an empty user name) are not supported".into()));
        }
        if self.name.len() > MAX_USER_NAME_BYTES || self.name.chars().any(char::is_control) {
            return Err(bad(format!("user name must be 1..={MAX_USER_NAME_BYTES} printable bytes")));
        }
        if self.host.is_empty() || self.host.len() > MAX_USER_HOST_BYTES || self.host.chars().any(char::is_control) {
            return Err(bad(format!("host name must be 1..={MAX_USER_HOST_BYTES} printable bytes")));
        }
        Ok(())
    }
}

impl std::fmt::Display for AccountName {
    /// As MySQL quotes accounts in its messages: `'name'@'host'`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "'{}'@'{}'", self.name, self.host)
    }
}

/// A list of accounts as MySQL prints it in "Operation ... failed for" messages.
pub fn account_list(accounts: &[AccountName]) -> String {
    accounts.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// Password hashes of one account; empty ones mean the empty password.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PasswordHashes {
    pub plugin: AuthPlugin,
    /// SHA1(SHA1(password)): what `mysql_native_password` checks against.
    pub native: Vec<u8>,
    /// SHA256(SHA256(password)): what the `caching_sha2_password` fast path checks against.
    pub sha2: Vec<u8>,
}

impl PasswordHashes {
    pub fn validate(&self) -> Result<(), ShoalError> {
        let ok = (self.native.is_empty() && self.sha2.is_empty())
            || (self.native.len() == NATIVE_HASH_BYTES && self.sha2.len() == SHA2_HASH_BYTES);
        if !ok {
            return Err(ShoalError::new(
                ErrorCode::InvalidArgument,
                format!("password hashes must be both empty or {NATIVE_HASH_BYTES} and {SHA2_HASH_BYTES} bytes"),
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserAccount {
    pub account: AccountName,
    pub password: PasswordHashes,
    /// ALL PRIVILEGES ON *.*: every database, and managing users and grants.
    pub global_all: bool,
    /// ALL PRIVILEGES ON `db`.*, as granted (compared case-insensitively, like database names).
    pub databases: Vec<String>,
}

impl UserAccount {
    /// The account a fresh cluster starts with: root from any host, no password, everything.
    pub fn initial_root() -> UserAccount {
        UserAccount {
            account: AccountName::new("root", "%"),
            password: PasswordHashes::default(),
            global_all: true,
            databases: vec![],
        }
    }

    /// Whether the account may use database `db` (ALL on *.* or on `db`.*).
    pub fn can_use(&self, db: &str) -> bool {
        self.global_all || self.databases.iter().any(|d| d.eq_ignore_ascii_case(db))
    }

    pub fn validate(&self) -> Result<(), ShoalError> {
        self.account.validate()?;
        self.password.validate()?;
        if self.databases.len() > MAX_GRANTS_PER_USER {
            return Err(ShoalError::new(
                ErrorCode::TooLarge,
                format!("an account holds at most {MAX_GRANTS_PER_USER} database grants"),
            ));
        }
        for d in &self.databases {
            check_grant_db(d)?;
        }
        Ok(())
    }
}

/// A database name in a grant.
pub fn check_grant_db(db: &str) -> Result<(), ShoalError> {
    if db.is_empty() || db.len() > MAX_GRANT_DB_BYTES || db.chars().any(char::is_control) {
        return Err(ShoalError::new(
            ErrorCode::InvalidArgument,
            format!("database name in a grant must be 1..={MAX_GRANT_DB_BYTES} printable bytes"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_validate_and_print_as_mysql_does() {
        let a = AccountName::new("ann", "%");
        assert!(a.validate().is_ok());
        assert_eq!(a.to_string(), "'ann'@'%'");
        assert!(a.is("ann", "%") && !a.is("Ann", "%"));
        assert!(AccountName::new("x", "LocalHost").is("x", "localhost"));
        assert!(AccountName::new("", "%").validate().is_err());
        assert!(AccountName::new(&"x".repeat(33), "%").validate().is_err());
        assert!(AccountName::new("x", "").validate().is_err());
        assert!(AccountName::new("a\nb", "%").validate().is_err());
        assert_eq!(account_list(&[a.clone(), AccountName::new("b", "h")]), "'ann'@'%','b'@'h'");
        let mut u = UserAccount::initial_root();
        assert!(u.validate().is_ok() && u.can_use("anything"));
        u.global_all = false;
        u.databases = vec!["Shop".into()];
        assert!(u.can_use("shop") && !u.can_use("other"));
        u.password.native = vec![0; 20];
        assert!(u.validate().is_err(), "one hash without the other");
        u.password.sha2 = vec![0; 32];
        assert!(u.validate().is_ok());
    }
}

//! Authentication without sockets: password hashes, the checks of `mysql_native_password` and
//! of the `caching_sha2_password` fast path, and which account a login is (MySQL's host
//! matching). Pure functions; `server.rs` runs the exchange and `users.rs` the statements.
//!
//! Stored per account (never the password): SHA1(SHA1(pw)) and SHA256(SHA256(pw)); both empty
//! for the empty password.
//!
//! - `mysql_native_password`: the client sends SHA1(pw) XOR SHA1(scramble ‖ SHA1(SHA1(pw))).
//!   XOR with SHA1(scramble ‖ stored) gives a candidate SHA1(pw), whose SHA1 must be `stored`.
//! - `caching_sha2_password`: the client sends SHA256(pw) XOR SHA256(SHA256(SHA256(pw)) ‖
//!   scramble). The same reasoning with SHA256 checks it against the stored hash. MySQL does
//!   this only for accounts in its in-memory cache and otherwise asks for the password itself
//!   (over TLS or RSA); Shoal keeps the hash every account, so every login takes this fast path.

use sha1::{Digest, Sha1};
use sha2::Sha256;
use shoal_proto::users::{NATIVE_HASH_BYTES, SHA2_HASH_BYTES};
use shoal_proto::{AuthPlugin, PasswordHashes, UserAccount};

use crate::val::like;

/// SHA1(SHA1(password)); empty for the empty password.
pub fn native_hash(password: &str) -> Vec<u8> {
    if password.is_empty() {
        return vec![];
    }
    Sha1::digest(Sha1::digest(password.as_bytes())).to_vec()
}

/// SHA256(SHA256(password)); empty for the empty password.
pub fn sha2_hash(password: &str) -> Vec<u8> {
    if password.is_empty() {
        return vec![];
    }
    Sha256::digest(Sha256::digest(password.as_bytes())).to_vec()
}

/// The hashes stored for `password`, to be checked with `plugin` first.
pub fn hashes(plugin: AuthPlugin, password: &str) -> PasswordHashes {
    PasswordHashes { plugin, native: native_hash(password), sha2: sha2_hash(password) }
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// Checks a `mysql_native_password` answer to `scramble` against SHA1(SHA1(pw)).
pub fn native_ok(scramble: &[u8], response: &[u8], stored: &[u8]) -> bool {
    if stored.is_empty() {
        return response.is_empty();
    }
    if response.len() != NATIVE_HASH_BYTES || stored.len() != NATIVE_HASH_BYTES {
        return false;
    }
    let mut h = Sha1::new();
    h.update(scramble);
    h.update(stored);
    let candidate = xor(response, &h.finalize());
    constant_time_eq(&Sha1::digest(&candidate), stored)
}

/// Checks a `caching_sha2_password` fast-path answer to `scramble` against SHA256(SHA256(pw)).
pub fn sha2_ok(scramble: &[u8], response: &[u8], stored: &[u8]) -> bool {
    if stored.is_empty() {
        return response.is_empty();
    }
    if response.len() != SHA2_HASH_BYTES || stored.len() != SHA2_HASH_BYTES {
        return false;
    }
    let mut h = Sha256::new();
    h.update(stored);
    h.update(scramble);
    let candidate = xor(response, &h.finalize());
    constant_time_eq(&Sha256::digest(&candidate), stored)
}

/// Compares without an early exit, so timing says nothing about how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an account's host part matches the client's address. `%` and `_` are wildcards
/// (case-insensitive, like MySQL); `localhost` means the loopback addresses, since clients
/// reach Shoal over TCP only.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    if pattern == "%" {
        return true;
    }
    if pattern.eq_ignore_ascii_case("localhost") {
        return matches!(host, "127.0.0.1" | "::1" | "localhost") || host.starts_with("127.");
    }
    like(&host.to_ascii_lowercase(), &pattern.to_ascii_lowercase(), '\\')
}

/// How specific a host pattern is: literal hosts first, then patterns by how much comes
/// before their first wildcard, `%` last (MySQL sorts accounts this way and takes the first
/// that matches).
fn specificity(pattern: &str) -> (bool, usize) {
    match pattern.find(['%', '_']) {
        None => (true, pattern.len()),
        Some(i) => (false, i),
    }
}

/// The account a client logging in as `user` from `host` is, if any.
pub fn find_account<'a>(accounts: &'a [UserAccount], user: &str, host: &str) -> Option<&'a UserAccount> {
    accounts
        .iter()
        .filter(|a| a.account.name == user && host_matches(&a.account.host, host))
        .max_by_key(|a| specificity(&a.account.host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::AccountName;

    /// What a client computes for `mysql_native_password`.
    fn native_answer(scramble: &[u8], pw: &str) -> Vec<u8> {
        let stage1 = Sha1::digest(pw.as_bytes());
        let stage2 = Sha1::digest(stage1);
        let mut h = Sha1::new();
        h.update(scramble);
        h.update(stage2);
        xor(&stage1, &h.finalize())
    }

    /// What a client computes for the `caching_sha2_password` fast path.
    fn sha2_answer(scramble: &[u8], pw: &str) -> Vec<u8> {
        let d1 = Sha256::digest(pw.as_bytes());
        let d2 = Sha256::digest(d1);
        let mut h = Sha256::new();
        h.update(d2);
        h.update(scramble);
        xor(&d1, &h.finalize())
    }

    #[test]
    fn native_password_checks() {
        let scramble = b"abcdefghijklmnopqrst";
        let stored = native_hash("secret");
        assert_eq!(stored.len(), 20);
        let resp = native_answer(scramble, "secret");
        assert!(native_ok(scramble, &resp, &stored));
        assert!(!native_ok(scramble, &resp, &native_hash("other")));
        assert!(!native_ok(b"another scramble....", &resp, &stored), "an answer is bound to its scramble");
        assert!(native_ok(scramble, &[], &native_hash("")));
        assert!(!native_ok(scramble, &resp, &native_hash("")), "a password where none is set");
        assert!(!native_ok(scramble, &[], &stored), "no password where one is set");
        assert!(!native_ok(scramble, &[1, 2, 3], &stored));
        // MySQL's documented value: PASSWORD('secret') = '*14E65567ABDB5135D0CFD9A70B3032C179A49EE7'.
        let hex: String = stored.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(hex, "14E65567ABDB5135D0CFD9A70B3032C179A49EE7");
    }

    #[test]
    fn caching_sha2_fast_path_checks() {
        let scramble = b"ABCDEFGHIJKLMNOPQRST";
        let stored = sha2_hash("pässword");
        assert_eq!(stored.len(), 32);
        let resp = sha2_answer(scramble, "pässword");
        assert!(sha2_ok(scramble, &resp, &stored));
        assert!(!sha2_ok(scramble, &resp, &sha2_hash("password")));
        assert!(!sha2_ok(b"abcdefghijklmnopqrst", &resp, &stored));
        assert!(sha2_ok(scramble, &[], &sha2_hash("")));
        assert!(!sha2_ok(scramble, &[], &stored));
        assert!(!sha2_ok(scramble, &resp[..31], &stored));
        // A native answer never passes as a sha2 one.
        assert!(!sha2_ok(scramble, &native_answer(scramble, "pässword"), &stored));
        let h = hashes(AuthPlugin::CachingSha2Password, "x");
        assert!(h.validate().is_ok() && h.plugin == AuthPlugin::CachingSha2Password);
        assert!(hashes(AuthPlugin::NativePassword, "").validate().is_ok());
    }

    fn acct(name: &str, host: &str) -> UserAccount {
        UserAccount {
            account: AccountName::new(name, host),
            password: PasswordHashes::default(),
            global_all: false,
            databases: vec![],
        }
    }

    #[test]
    fn logins_find_the_most_specific_matching_account() {
        assert!(host_matches("%", "10.1.2.3"));
        assert!(host_matches("10.1.%", "10.1.2.3"));
        assert!(!host_matches("10.1.%", "10.2.2.3"));
        assert!(host_matches("localhost", "127.0.0.1") && host_matches("LOCALHOST", "::1"));
        assert!(!host_matches("localhost", "10.0.0.1"));
        assert!(host_matches("Db.Example", "db.example"));
        let all = vec![acct("ann", "%"), acct("ann", "10.1.%"), acct("ann", "10.1.2.3"), acct("bob", "localhost")];
        let host_of = |user: &str, host: &str| find_account(&all, user, host).map(|a| a.account.host.clone());
        assert_eq!(host_of("ann", "10.1.2.3").as_deref(), Some("10.1.2.3"));
        assert_eq!(host_of("ann", "10.1.9.9").as_deref(), Some("10.1.%"));
        assert_eq!(host_of("ann", "192.168.0.1").as_deref(), Some("%"));
        assert_eq!(host_of("bob", "127.0.0.1").as_deref(), Some("localhost"));
        assert_eq!(host_of("bob", "10.0.0.1"), None);
        assert_eq!(host_of("Ann", "10.1.2.3"), None, "user names are case-sensitive");
    }
}

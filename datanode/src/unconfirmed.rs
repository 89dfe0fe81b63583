//! A backup's writes that its primary has not yet confirmed applying itself: what keeps a
//! backup from answering a read differently than the primary would.
//!
//! A backup applies a write before its primary does (the primary applies last, once every
//! replica has it). Until the primary has applied it too, a read at the primary shows the row
//! as it was, and a read at the backup as it will be. A read made "as the primary"
//! (`BatchRequest.as_primary`, the client's `read_any_replica`) may go to any complete
//! replica, which must then answer exactly what the primary would: a backup refuses the keys
//! listed here (NOT_PRIMARY, and the client asks the primary). The primary confirms each write
//! it applied on its next message to the backup (`ReplicateRequest.confirmed`: it rides on the
//! next write's replication, or goes alone after a quiet `CONFIRM_DELAY`), and the key leaves
//! the list.
//!
//! Confirming late only sends more reads to the primary; the list never lets a read see a
//! write early. Entries carry the primary term they were written under and only that term's
//! primary confirms them; an entry whose primary was replaced stays until the key is written
//! again or this replica becomes primary (`clear`).

use std::collections::HashMap;

#[derive(Default)]
pub struct Unconfirmed {
    /// Key → (primary term, sequence number) of its newest unconfirmed write. Hashed with
    /// std's default hasher, not the row index's foldhash: a second user of foldhash's hashing
    /// of byte keys made the compiler stop inlining it into the row index's lookup
    /// (`PartitionStore::find`), which then took 26% more instructions (callgrind, a data node
    /// under sysbench `oltp_read_write`).
    by_key: HashMap<Box<[u8]>, (u64, u64)>,
    /// Sequence number → key, for confirmations (they name writes by sequence number).
    by_seq: HashMap<u64, Box<[u8]>, foldhash::fast::RandomState>,
}

impl Unconfirmed {
    /// A write to `key` applied here as a backup, not yet confirmed by its primary.
    pub fn add(&mut self, key: &[u8], term: u64, seq: u64) {
        if let Some((_, old)) = self.by_key.insert(key.into(), (term, seq)) {
            self.by_seq.remove(&old);
        }
        self.by_seq.insert(seq, key.into());
    }

    /// The primary of `term` applied its write `seq`.
    pub fn confirm(&mut self, term: u64, seq: u64) {
        let Some(key) = self.by_seq.remove(&seq) else { return };
        match self.by_key.remove_entry(&key) {
            Some((_, (t, s))) if t == term && s == seq => {}
            // Another term's write under the same number: not this confirmation's.
            Some((k, v)) => {
                self.by_key.insert(k, v);
                self.by_seq.insert(seq, key);
            }
            None => {}
        }
    }

    /// Whether `key` has a write here its primary may not show yet.
    pub fn holds(&self, key: &[u8]) -> bool {
        !self.by_key.is_empty() && self.by_key.contains_key(key)
    }

    /// Forgets every entry: this replica is the primary now, and what it holds is what it shows.
    pub fn clear(&mut self) {
        self.by_key.clear();
        self.by_seq.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_held_until_its_newest_write_is_confirmed_by_the_same_term() {
        let mut u = Unconfirmed::default();
        u.add(b"k", 3, 10);
        u.add(b"k", 3, 11);
        assert!(u.holds(b"k"));
        // The older write's confirmation does not free the newer one.
        u.confirm(3, 10);
        assert!(u.holds(b"k"));
        // Another term's confirmation under the same number does not either.
        u.confirm(4, 11);
        assert!(u.holds(b"k"));
        u.confirm(3, 11);
        assert!(!u.holds(b"k"));
        assert!(u.by_key.is_empty() && u.by_seq.is_empty());
        // Unknown numbers change nothing.
        u.confirm(3, 99);
        u.add(b"j", 3, 12);
        u.clear();
        assert!(!u.holds(b"j"));
    }
}

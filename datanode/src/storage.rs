//! One partition replica's rows in memory.
//!
//! Rows live in a slab of slots (NDB's row ids): a slot holds the encoded key, the encoded row
//! (see `shoal_proto::codec`) and the sequence number of the write that produced it. The
//! primary-key hash index maps a key to its slot. Scans and node-restart copies walk the slab by
//! slot number, so they can drop the partition lock between chunks and resume where they were;
//! while any such cursor is open, freed slots are not reused, so rows stay where the cursor
//! expects them (a row deleted and inserted again behind a cursor is a new row and shows up
//! again, as a second committed version would under READ COMMITTED).
//!
//! Sequence numbers order the writes of one partition. Replicas apply a row image only if it
//! is newer than what they hold, which makes replication and copy idempotent and lets a copy
//! race with live writes. While a replica is being filled by a copy it also remembers deletes
//! (tombstones), so an old copied row cannot resurrect a row deleted since.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;
use shoal_proto::Table;

use crate::index::OrderedIndex;
use crate::unconfirmed::Unconfirmed;

/// Bookkeeping bytes charged per row on top of its key and data.
pub const ROW_OVERHEAD_BYTES: u64 = 48;

/// The data memory of one node, shared by all its partitions.
#[derive(Debug)]
pub struct MemoryBudget {
    used: AtomicU64,
    limit: u64,
}

impl MemoryBudget {
    pub fn new(limit_bytes: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget { used: AtomicU64::new(0), limit: limit_bytes })
    }

    /// Reserves `n` bytes unless that would pass the limit.
    pub fn try_reserve(&self, n: u64) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            if cur + n > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(cur, cur + n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Charges `n` bytes whatever the limit: replicas mirror what their primary admitted.
    pub fn force(&self, n: u64) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    pub fn release(&self, n: u64) {
        let _ = self.used.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| Some(u.saturating_sub(n)));
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// A row as a replica holds it: key and data in one allocation, so that a lookup compares
/// the key and reads the row from the same cache lines (one memory miss fewer per key read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSlot {
    buf: Box<[u8]>,
    key_len: u32,
    pub seq: u64,
}

impl RowSlot {
    fn new(key: &[u8], data: &[u8], seq: u64) -> RowSlot {
        let mut buf = Vec::with_capacity(key.len() + data.len());
        buf.extend_from_slice(key);
        buf.extend_from_slice(data);
        RowSlot { buf: buf.into_boxed_slice(), key_len: key.len() as u32, seq }
    }

    pub fn key(&self) -> &[u8] {
        &self.buf[..self.key_len as usize]
    }

    pub fn data(&self) -> &[u8] {
        &self.buf[self.key_len as usize..]
    }

    pub fn charge(key_len: usize, data_len: usize) -> u64 {
        ROW_OVERHEAD_BYTES + key_len as u64 + data_len as u64
    }

    fn bytes(&self) -> u64 {
        RowSlot::charge(self.key_len as usize, self.buf.len() - self.key_len as usize)
    }
}

/// A row's place in its [`PartitionStore`], as [`PartitionStore::locate`] found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowAt(u32);

/// A row image as replication and copy carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub key: Vec<u8>,
    /// None = the row was deleted.
    pub data: Option<Vec<u8>>,
    pub seq: u64,
}

pub struct PartitionStore {
    slots: Vec<Option<RowSlot>>,
    free: Vec<u32>,
    index: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    rows: u64,
    budget: Arc<MemoryBudget>,
    /// Deletes seen while a copy fills this replica: key → seq of the delete.
    tombstones: Option<HashMap<Box<[u8]>, u64>>,
    open_cursors: u32,
    /// Ordered indexes, kept in step with every row change (see `index.rs`), and the table
    /// layout their entries are decoded with.
    indexes: Vec<OrderedIndex>,
    layout: Option<Arc<Table>>,
    /// Writes applied here as a backup that the primary has not confirmed applying itself.
    pub unconfirmed: Unconfirmed,
}

impl PartitionStore {
    pub fn new(budget: Arc<MemoryBudget>) -> PartitionStore {
        PartitionStore {
            slots: Vec::new(),
            free: Vec::new(),
            index: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            rows: 0,
            budget,
            tombstones: None,
            open_cursors: 0,
            indexes: Vec::new(),
            layout: None,
            unconfirmed: Unconfirmed::default(),
        }
    }

    /// Makes the replica keep the indexes `table` has now: new ones are built from the rows,
    /// dropped ones freed. Cheap when nothing changed.
    pub fn set_indexes(&mut self, table: &Table) {
        let same = self.indexes.len() == table.indexes.len()
            && self.indexes.iter().zip(&table.indexes).all(|(have, want)| have.spec == *want);
        if same && self.layout.as_ref().is_some_and(|l| l.schema_version == table.schema_version) {
            return;
        }
        self.layout = Some(Arc::new(table.clone()));
        if same {
            return;
        }
        let freed: u64 = self.indexes.iter().map(OrderedIndex::bytes).sum();
        self.budget.release(freed);
        self.indexes = table.indexes.iter().cloned().map(OrderedIndex::new).collect();
        let mut charge = 0;
        for slot in self.slots.iter().flatten() {
            charge += index_add(&mut self.indexes, self.layout.as_deref(), slot.key(), slot.data());
        }
        self.budget.force(charge);
    }

    /// An index of this replica, by id.
    pub fn index(&self, id: u32) -> Option<&OrderedIndex> {
        self.indexes.iter().find(|i| i.spec.id == id)
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        let h = self.hasher.hash_one(key);
        let slots = &self.slots;
        self.index.find(h, |&i| slots[i as usize].as_ref().is_some_and(|s| s.key() == key)).copied()
    }

    pub fn get(&self, key: &[u8]) -> Option<&RowSlot> {
        self.find(key).and_then(|i| self.slots[i as usize].as_ref())
    }

    /// Where `key`'s row is, for reading many rows in two passes ([`PartitionStore::row_at`]).
    pub fn locate(&self, key: &[u8]) -> Option<RowAt> {
        self.find(key).map(RowAt)
    }

    /// The row of `key` that [`PartitionStore::locate`] found at `at`; looked up again if the
    /// store changed since and the place holds another row or none.
    pub fn row_at(&self, at: RowAt, key: &[u8]) -> Option<&RowSlot> {
        match self.slots.get(at.0 as usize) {
            Some(Some(slot)) if slot.key() == key => Some(slot),
            _ => self.get(key),
        }
    }

    /// Writes a row. The caller reserved `reserved` bytes of the budget for it beforehand; the
    /// rest of its charge is taken now and the replaced row's charge is given back.
    pub fn put_reserved(&mut self, key: &[u8], data: Vec<u8>, seq: u64, reserved: u64) {
        let new_bytes = RowSlot::charge(key.len(), data.len());
        if new_bytes > reserved {
            self.budget.force(new_bytes - reserved);
        } else {
            self.budget.release(reserved - new_bytes);
        }
        let charge = match self.find(key) {
            Some(i) => {
                let slot = self.slots[i as usize].as_mut().expect("indexed slot is occupied");
                self.budget.release(slot.bytes());
                let old = std::mem::replace(slot, RowSlot::new(key, &data, seq));
                let (charge, freed) = index_update(&mut self.indexes, self.layout.as_deref(), key, old.data(), &data);
                self.budget.release(freed);
                charge
            }
            None => {
                let charge = index_add(&mut self.indexes, self.layout.as_deref(), key, &data);
                self.insert_new(key, data, seq);
                charge
            }
        };
        self.budget.force(charge);
    }

    fn insert_new(&mut self, key: &[u8], data: Vec<u8>, seq: u64) {
        let slot = RowSlot::new(key, &data, seq);
        let i = match (self.open_cursors, self.free.pop()) {
            (0, Some(i)) => {
                self.slots[i as usize] = Some(slot);
                i
            }
            (_, popped) => {
                if let Some(i) = popped {
                    self.free.push(i);
                }
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        let h = self.hasher.hash_one(key);
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.index.insert_unique(h, i, |&j| {
            hasher.hash_one(slots[j as usize].as_ref().expect("indexed slot is occupied").key())
        });
        self.rows += 1;
    }

    pub fn delete(&mut self, key: &[u8]) -> bool {
        let h = self.hasher.hash_one(key);
        let slots = &self.slots;
        let Ok(entry) = self.index.find_entry(h, |&i| slots[i as usize].as_ref().is_some_and(|s| s.key() == key))
        else {
            return false;
        };
        let (i, _) = entry.remove();
        if let Some(slot) = self.slots[i as usize].take() {
            self.budget.release(slot.bytes());
            let freed = index_remove(&mut self.indexes, self.layout.as_deref(), slot.key(), slot.data());
            self.budget.release(freed);
        }
        self.free.push(i);
        self.rows -= 1;
        true
    }

    /// Whether `img` is newer than what this replica holds or buried (so `apply` would take it).
    pub fn is_newer(&self, img: &Image) -> bool {
        let held = self.get(&img.key).map(|s| s.seq);
        let buried = self.tombstones.as_ref().and_then(|t| t.get(img.key.as_slice()).copied());
        held.into_iter().chain(buried).max().is_none_or(|s| s < img.seq)
    }

    /// Applies a replicated or copied image if it is newer than what this replica holds.
    /// Returns whether it changed anything.
    pub fn apply(&mut self, img: Image) -> bool {
        if !self.is_newer(&img) {
            return false;
        }
        match img.data {
            Some(data) => {
                let charge = RowSlot::charge(img.key.len(), data.len());
                self.budget.force(charge);
                self.put_reserved(&img.key, data, img.seq, charge);
                if let Some(t) = &mut self.tombstones {
                    t.remove(img.key.as_slice());
                }
            }
            None => {
                self.delete(&img.key);
                if let Some(t) = &mut self.tombstones {
                    t.insert(img.key.into_boxed_slice(), img.seq);
                }
            }
        }
        true
    }

    /// Empties the replica and starts remembering deletes for a copy.
    pub fn begin_fill(&mut self) {
        self.clear();
        self.tombstones = Some(HashMap::new());
    }

    pub fn end_fill(&mut self) {
        self.tombstones = None;
    }

    pub fn clear(&mut self) {
        let bytes: u64 = self.slots.iter().flatten().map(RowSlot::bytes).sum();
        let index_bytes: u64 = self.indexes.iter().map(OrderedIndex::bytes).sum();
        self.budget.release(bytes + index_bytes);
        self.indexes.iter_mut().for_each(OrderedIndex::clear);
        self.slots.clear();
        self.free.clear();
        self.index.clear();
        self.rows = 0;
        self.tombstones = None;
    }

    pub fn open_cursor(&mut self) {
        self.open_cursors += 1;
    }

    pub fn close_cursor(&mut self) {
        self.open_cursors = self.open_cursors.saturating_sub(1);
    }

    /// Visits occupied slots from `start` until `f` returns false or `max_slots` slots were
    /// looked at. Returns the slot to resume from, or None at the end.
    pub fn walk(&self, start: u32, max_slots: u32, mut f: impl FnMut(&RowSlot) -> bool) -> Option<u32> {
        let end = (start as usize).saturating_add(max_slots as usize).min(self.slots.len());
        for i in start as usize..end {
            if let Some(slot) = &self.slots[i] {
                if !f(slot) {
                    return Some(i as u32 + 1);
                }
            }
        }
        (end < self.slots.len()).then_some(end as u32)
    }
}

/// Adds a row's entries to every index; returns the bytes to charge.
fn index_add(indexes: &mut [OrderedIndex], layout: Option<&Table>, key: &[u8], data: &[u8]) -> u64 {
    let Some(table) = layout else { return 0 };
    let mut charge = 0;
    for ix in indexes {
        if let Some((entry, prefix)) = ix.entry(table, key, data) {
            charge += ix.insert(entry, prefix);
        }
    }
    charge
}

/// Removes a row's entries from every index; returns the bytes freed.
fn index_remove(indexes: &mut [OrderedIndex], layout: Option<&Table>, key: &[u8], data: &[u8]) -> u64 {
    let Some(table) = layout else { return 0 };
    let mut freed = 0;
    for ix in indexes {
        if let Some((entry, _)) = ix.entry(table, key, data) {
            freed += ix.remove(&entry);
        }
    }
    freed
}

/// Moves a changed row's index entries: an entry whose columns kept their values stays as it
/// is (an UPDATE of other columns touches no index). Returns (bytes to charge, bytes freed).
fn index_update(
    indexes: &mut [OrderedIndex],
    layout: Option<&Table>,
    key: &[u8],
    old: &[u8],
    new: &[u8],
) -> (u64, u64) {
    let Some(table) = layout else { return (0, 0) };
    let (mut charge, mut freed) = (0, 0);
    for ix in indexes {
        if ix.same_entry(table, old, new) {
            continue;
        }
        let (was, now) = (ix.entry(table, key, old), ix.entry(table, key, new));
        if let (Some((w, _)), Some((n, _))) = (&was, &now) {
            if w == n {
                continue;
            }
        }
        if let Some((w, _)) = was {
            freed += ix.remove(&w);
        }
        if let Some((n, prefix)) = now {
            charge += ix.insert(n, prefix);
        }
    }
    (charge, freed)
}

impl Drop for PartitionStore {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> PartitionStore {
        PartitionStore::new(MemoryBudget::new(1 << 20))
    }

    fn img(k: u8, v: Option<u8>, seq: u64) -> Image {
        Image { key: vec![k], data: v.map(|v| vec![v; 10]), seq }
    }

    #[test]
    fn put_get_delete_and_memory() {
        let mut s = store();
        let budget = s.budget.clone();
        for k in 0..100u32 {
            let c = RowSlot::charge(4, 10);
            assert!(budget.try_reserve(c));
            s.put_reserved(&k.to_be_bytes(), vec![1; 10], u64::from(k), c);
        }
        assert_eq!(s.rows(), 100);
        assert_eq!(budget.used(), 100 * RowSlot::charge(4, 10));
        assert_eq!(s.get(&7u32.to_be_bytes()).unwrap().data(), &[1; 10]);
        assert!(s.delete(&7u32.to_be_bytes()));
        assert!(!s.delete(&7u32.to_be_bytes()));
        assert!(s.get(&7u32.to_be_bytes()).is_none());
        assert_eq!(s.rows(), 99);
        s.clear();
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_located_row_is_found_again_even_after_the_store_changed() {
        let mut s = store();
        s.apply(img(1, Some(5), 1));
        s.apply(img(2, Some(6), 2));
        let at = s.locate(&[1]).unwrap();
        assert!(s.locate(&[3]).is_none());
        assert_eq!(s.row_at(at, &[1]).unwrap().data()[0], 5);
        // Row 1 leaves its place and row 3 takes it: row 1 is looked up again (gone), and row 2
        // asked for at row 1's old place is found where it is.
        s.apply(img(1, None, 3));
        s.apply(img(3, Some(7), 4));
        assert!(s.row_at(at, &[1]).is_none());
        assert_eq!(s.row_at(at, &[2]).unwrap().data()[0], 6);
        assert_eq!(s.row_at(at, &[3]).unwrap().data()[0], 7);
    }

    #[test]
    fn budget_refuses_past_limit() {
        let b = MemoryBudget::new(100);
        assert!(b.try_reserve(60));
        assert!(!b.try_reserve(60));
        b.release(60);
        assert!(b.try_reserve(100));
    }

    #[test]
    fn images_apply_newest_wins() {
        let mut s = store();
        assert!(s.apply(img(1, Some(5), 10)));
        assert!(!s.apply(img(1, Some(4), 9)), "older image is ignored");
        assert_eq!(s.get(&[1]).unwrap().data()[0], 5);
        assert!(s.apply(img(1, None, 11)));
        assert!(s.get(&[1]).is_none());
    }

    #[test]
    fn fill_keeps_deleted_rows_deleted() {
        let mut s = store();
        s.begin_fill();
        // A live delete arrives before the copy's older version of the row.
        s.apply(img(1, None, 20));
        assert!(!s.apply(img(1, Some(3), 15)));
        assert!(s.get(&[1]).is_none());
        // A newer copy row still lands.
        assert!(s.apply(img(2, Some(3), 15)));
        s.end_fill();
        assert_eq!(s.rows(), 1);
    }

    #[test]
    fn cursor_sees_each_row_once_while_rows_move() {
        let mut s = store();
        for k in 0..10u8 {
            s.apply(img(k, Some(k), u64::from(k) + 1));
        }
        s.open_cursor();
        let mut seen = vec![];
        let mut at = Some(0);
        while let Some(start) = at {
            at = s.walk(start, 3, |slot| {
                seen.push(slot.key()[0]);
                true
            });
            // Delete and re-insert a row already visited: it must not reappear behind us.
            if seen.contains(&0) && s.get(&[0]).is_some() {
                s.apply(img(0, None, 100));
                s.apply(img(0, Some(9), 101));
            }
        }
        s.close_cursor();
        // Untouched rows are seen exactly once; the re-inserted one once per version.
        for k in 1..10u8 {
            assert_eq!(seen.iter().filter(|&&x| x == k).count(), 1, "row {k}");
        }
        assert_eq!(seen.iter().filter(|&&k| k == 0).count(), 2);
        let mut uniq = seen.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 10);
    }
}

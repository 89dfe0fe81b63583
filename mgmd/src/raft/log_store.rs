//! The Raft log and vote, persisted in the mgmd's data dir in our own format.
//!
//! `raft-log` is append-only: a stream of [`super::file`] frames whose payloads are JSON
//! `Record`s. The in-memory copy is rebuilt on open by replaying them in order. One
//! `append` call is one write plus one fsync, and only then is openraft told the entries are
//! durable. After a purge leaves most of the file dead, the live records are rewritten into a
//! fresh file (temp file + rename).
//!
//! `raft-vote` holds the vote alone and is replaced atomically on every change.
//!
//! openraft serializes every write-IO call (append, truncate, purge, vote, committed), so the
//! file needs no ordering of its own beyond the mutex that hands it to the blocking pool.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{OptionalSend, StorageIOError};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use super::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use shoal_proto::file::{self, FileError};

pub const LOG_FILE: &str = "raft-log";
pub const VOTE_FILE: &str = "raft-vote";

/// Never compact a log file smaller than this: rewriting small files buys nothing.
pub const COMPACT_MIN_FILE_BYTES: u64 = 256 * 1024;
/// Compact once the file holds this many times the bytes of its live records.
pub const COMPACT_DEAD_RATIO: u64 = 4;

/// One record of the log file, as read back.
#[derive(Debug, Deserialize)]
enum Record {
    Append(Entry),
    /// Entries at this index and above are gone (a new leader overwrote them).
    Truncate(u64),
    /// Entries up to this log id are gone (covered by a snapshot).
    Purge(LogId),
    Committed(Option<LogId>),
}

/// The same records as written: borrowing, so appending does not clone entries.
#[derive(Serialize)]
enum RecordRef<'a> {
    Append(&'a Entry),
    Truncate(u64),
    Purge(&'a LogId),
    Committed(Option<&'a LogId>),
}

/// What the log holds, in memory. Shared with the readers replication tasks use.
#[derive(Debug, Default)]
struct Mem {
    /// Index → entry and the size of its frame in the file.
    entries: BTreeMap<u64, (Entry, u64)>,
    last_purged: Option<LogId>,
    committed: Option<LogId>,
}

impl Mem {
    fn apply(&mut self, record: Record, frame_bytes: u64) {
        match record {
            Record::Append(e) => {
                self.entries.insert(e.log_id.index, (e, frame_bytes));
            }
            Record::Truncate(from) => {
                self.entries.split_off(&from);
            }
            Record::Purge(upto) => self.purge(upto),
            Record::Committed(c) => self.committed = c,
        }
    }

    fn purge(&mut self, upto: LogId) {
        self.entries = self.entries.split_off(&(upto.index + 1));
        if self.last_purged.as_ref().is_none_or(|p| p.index < upto.index) {
            self.last_purged = Some(upto);
        }
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.entries.values().next_back().map(|(e, _)| e.log_id).or(self.last_purged)
    }

    fn live_bytes(&self) -> u64 {
        self.entries.values().map(|(_, n)| n).sum()
    }
}

/// The open log file. Only touched from the blocking pool, whose fsyncs hold its lock: a
/// runtime worker waiting for that lock would stall the whole mgmd while the disk is slow (on a
/// shared disk, long enough for the failure detector to lose every heartbeat). Its length
/// lives in `len`, shared with `LogStore::file_len` so readers outside the pool need no lock.
struct LogFile {
    path: PathBuf,
    file: File,
    len: Arc<AtomicU64>,
}

impl LogFile {
    fn append(&mut self, buf: &[u8], sync: bool) -> Result<(), FileError> {
        self.file.write_all(buf).map_err(|e| FileError::io("append to", &self.path, e))?;
        self.len.fetch_add(buf.len() as u64, Ordering::Relaxed);
        if sync {
            self.file.sync_data().map_err(|e| FileError::io("fsync", &self.path, e))?;
        }
        Ok(())
    }

    /// Replaces the file with `buf` (the live records) and reopens it for appending.
    fn replace(&mut self, buf: &[u8]) -> Result<(), FileError> {
        file::write_atomic(&self.path, buf)?;
        self.file = file::open_append(&self.path)?;
        self.len.store(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

pub struct LogStore {
    mem: Arc<RwLock<Mem>>,
    file: Arc<Mutex<LogFile>>,
    /// The log file's length (see `LogFile`).
    file_len: Arc<AtomicU64>,
    vote_path: PathBuf,
    vote: Option<Vote>,
    compact_min_bytes: u64,
}

/// Reads entries for replication; sees every append as soon as it returns.
#[derive(Clone)]
pub struct LogReader {
    mem: Arc<RwLock<Mem>>,
}

fn frame(payload: &impl Serialize) -> Result<Vec<u8>, serde_json::Error> {
    let json = serde_json::to_vec(payload)?;
    let mut buf = Vec::with_capacity(json.len() + file::FRAME_HEADER_BYTES);
    file::encode_frame(&json, &mut buf);
    Ok(buf)
}

fn corrupt(path: &Path, offset: u64, reason: String) -> FileError {
    FileError::Corrupt { path: path.to_path_buf(), offset, reason }
}

impl LogStore {
    /// Opens (or creates) the log and vote in `dir`, replaying the log. A torn tail is cut off
    /// with a warning; any other damage is an error naming the file.
    pub fn open(dir: &Path) -> Result<LogStore, FileError> {
        let vote_path = dir.join(VOTE_FILE);
        let vote = match file::read_whole(&vote_path)? {
            None => None,
            Some(frames) => {
                let v: Vote = serde_json::from_slice(&frames[0])
                    .map_err(|e| corrupt(&vote_path, 0, format!("decode vote: {e}")))?;
                Some(v)
            }
        };

        let path = dir.join(LOG_FILE);
        let buf = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(FileError::io("read", &path, e)),
        };
        let scan = file::scan_frames(&path, &buf, b'{')?;
        let mut mem = Mem::default();
        let mut offset = 0u64;
        for payload in &scan.payloads {
            let frame_bytes = (payload.len() + file::FRAME_HEADER_BYTES) as u64;
            // The checksum matched, so bytes that do not decode are not a torn write but a
            // bug or a foreign file: refuse rather than guess.
            let record: Record = serde_json::from_slice(payload)
                .map_err(|e| corrupt(&path, offset, format!("decode log record: {e}")))?;
            mem.apply(record, frame_bytes);
            offset += frame_bytes;
        }

        let mut f = file::open_append(&path)?;
        if let Some(reason) = scan.tail_reason {
            let dropped = buf.len() - scan.valid_len;
            tracing::warn!(
                file = %path.display(),
                dropped_bytes = dropped,
                valid_bytes = scan.valid_len,
                "raft log ends in a torn record ({reason}); cutting off {dropped} bytes"
            );
            f.set_len(scan.valid_len as u64).map_err(|e| FileError::io("truncate", &path, e))?;
            f.sync_all().map_err(|e| FileError::io("fsync", &path, e))?;
        }
        // O_APPEND writes go to the end regardless; the seek keeps `len` and the cursor honest.
        f.seek(SeekFrom::End(0)).map_err(|e| FileError::io("seek", &path, e))?;
        file::sync_dir(&path)?;

        tracing::info!(
            dir = %dir.display(),
            entries = mem.entries.len(),
            last_purged = ?mem.last_purged,
            committed = ?mem.committed,
            vote = ?vote,
            "opened raft log"
        );
        let file_len = Arc::new(AtomicU64::new(scan.valid_len as u64));
        Ok(LogStore {
            mem: Arc::new(RwLock::new(mem)),
            file: Arc::new(Mutex::new(LogFile { path, file: f, len: file_len.clone() })),
            file_len,
            vote_path,
            vote,
            compact_min_bytes: COMPACT_MIN_FILE_BYTES,
        })
    }

    #[cfg(test)]
    fn with_compact_min_bytes(mut self, n: u64) -> LogStore {
        self.compact_min_bytes = n;
        self
    }

    #[cfg(test)]
    fn file_len(&self) -> u64 {
        self.file_len.load(Ordering::Relaxed)
    }

    /// Runs `f` on the log file in the blocking pool: fsync must not stall a runtime worker.
    async fn with_file<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut LogFile) -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, FileError> {
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || f(&mut file.lock()))
            .await
            .map_err(|e| FileError::io("write", Path::new(LOG_FILE), std::io::Error::other(e)))?
    }

    async fn write(&self, buf: Vec<u8>, sync: bool) -> Result<(), FileError> {
        self.with_file(move |f| f.append(&buf, sync)).await
    }

    /// Rewrites the file with only the live records when it is mostly dead ones.
    async fn maybe_compact(&self) -> Result<(), StorageError> {
        let file_len = self.file_len.load(Ordering::Relaxed);
        let buf = {
            let mem = self.mem.read();
            let live = mem.live_bytes();
            if file_len < self.compact_min_bytes || file_len < COMPACT_DEAD_RATIO * live {
                return Ok(());
            }
            let live_records = || -> Result<Vec<u8>, serde_json::Error> {
                let mut buf = Vec::with_capacity(live as usize + 256);
                if let Some(p) = &mem.last_purged {
                    buf.extend_from_slice(&frame(&RecordRef::Purge(p))?);
                }
                for (e, _) in mem.entries.values() {
                    buf.extend_from_slice(&frame(&RecordRef::Append(e))?);
                }
                buf.extend_from_slice(&frame(&RecordRef::Committed(mem.committed.as_ref()))?);
                Ok(buf)
            };
            live_records().map_err(|e| StorageIOError::write_logs(&e))?
        };
        let new_len = buf.len();
        self.with_file(move |f| f.replace(&buf)).await.map_err(|e| StorageIOError::write_logs(&e))?;
        tracing::info!(from_bytes = file_len, to_bytes = new_len, "compacted raft log");
        Ok(())
    }
}

fn read_range<RB: RangeBounds<u64>>(mem: &RwLock<Mem>, range: RB) -> Vec<Entry> {
    mem.read().entries.range(range).map(|(_, (e, _))| e.clone()).collect()
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(read_range(&self.mem, range))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(read_range(&self.mem, range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let mem = self.mem.read();
        Ok(LogState { last_purged_log_id: mem.last_purged, last_log_id: mem.last_log_id() })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader { mem: self.mem.clone() }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let json = serde_json::to_vec(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        let path = self.vote_path.clone();
        tokio::task::spawn_blocking(move || file::write_frames_atomic(&path, &[&json]))
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?
            .map_err(|e| StorageIOError::write_vote(&e))?;
        self.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.vote)
    }

    /// Not fsynced on its own: it rides along with the next append's fsync. Losing it in a
    /// crash only means replaying a little less on restart, never anything wrong.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let buf = frame(&RecordRef::Committed(committed.as_ref())).map_err(|e| StorageIOError::write_logs(&e))?;
        self.mem.write().committed = committed;
        self.write(buf, false).await.map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.mem.read().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut buf = Vec::new();
        let mut framed = Vec::new();
        for e in entries {
            let f = frame(&RecordRef::Append(&e)).map_err(|err| StorageIOError::write_log_entry(e.log_id, &err))?;
            buf.extend_from_slice(&f);
            framed.push((e, f.len() as u64));
        }
        {
            let mut mem = self.mem.write();
            for (e, n) in framed {
                debug_assert!(
                    mem.last_log_id().is_none_or(|l| l.index + 1 == e.log_id.index),
                    "log append must be contiguous"
                );
                mem.entries.insert(e.log_id.index, (e, n));
            }
        }
        match self.write(buf, true).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(&e).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::info!(from = %log_id, "truncating raft log");
        let buf = frame(&RecordRef::Truncate(log_id.index)).map_err(|e| StorageIOError::write_logs(&e))?;
        self.mem.write().entries.split_off(&log_id.index);
        self.write(buf, true).await.map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(upto = %log_id, "purging raft log");
        let buf = frame(&RecordRef::Purge(&log_id)).map_err(|e| StorageIOError::write_logs(&e))?;
        self.mem.write().purge(log_id);
        self.write(buf, true).await.map_err(|e| StorageIOError::write_logs(&e))?;
        self.maybe_compact().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload};
    use shoal_proto::file::test_dir::TestDir;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64) -> Entry {
        let cmd = Command::DropTable { name: format!("t{index}"), if_exists: true };
        Entry { log_id: log_id(term, index), payload: EntryPayload::Normal(cmd) }
    }

    async fn all(store: &mut LogStore) -> Vec<u64> {
        store.try_get_log_entries(..).await.unwrap().iter().map(|e| e.log_id.index).collect()
    }

    #[tokio::test]
    async fn round_trip_through_reopen() {
        let dir = TestDir::new("log-rt");
        {
            let mut s = LogStore::open(dir.path()).unwrap();
            assert!(s.read_vote().await.unwrap().is_none());
            s.blocking_append((1..=5).map(|i| entry(1, i))).await.unwrap();
            s.blocking_append((6..=8).map(|i| entry(1, i))).await.unwrap();
            s.truncate(log_id(1, 7)).await.unwrap();
            s.blocking_append((7..=9).map(|i| entry(2, i))).await.unwrap();
            s.purge(log_id(1, 2)).await.unwrap();
            s.save_committed(Some(log_id(2, 8))).await.unwrap();
            s.save_vote(&Vote::new(2, 1)).await.unwrap();
        }
        let mut s = LogStore::open(dir.path()).unwrap();
        assert_eq!(all(&mut s).await, vec![3, 4, 5, 6, 7, 8, 9]);
        let e = s.try_get_log_entries(7..8).await.unwrap();
        assert_eq!(e[0].log_id, log_id(2, 7), "the truncated entry was replaced");
        let st = s.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 2)));
        assert_eq!(st.last_log_id, Some(log_id(2, 9)));
        assert_eq!(s.read_committed().await.unwrap(), Some(log_id(2, 8)));
        assert_eq!(s.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
        // Everything purged: the last log id falls back to the purge point.
        s.purge(log_id(2, 9)).await.unwrap();
        let st = s.get_log_state().await.unwrap();
        assert_eq!(st.last_log_id, Some(log_id(2, 9)));
    }

    #[tokio::test]
    async fn torn_tail_is_cut_off() {
        let dir = TestDir::new("log-torn");
        let path = dir.path().join(LOG_FILE);
        {
            let mut s = LogStore::open(dir.path()).unwrap();
            s.blocking_append((1..=3).map(|i| entry(1, i))).await.unwrap();
        }
        let whole = std::fs::metadata(&path).unwrap().len();
        // A crash in the middle of the next append: half a frame reaches the disk.
        let half = frame(&RecordRef::Append(&entry(1, 4))).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&half[..half.len() / 2]).unwrap();
        drop(f);
        {
            let mut s = LogStore::open(dir.path()).unwrap();
            assert_eq!(all(&mut s).await, vec![1, 2, 3]);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), whole, "the torn bytes are cut off");
            // Appends after the cut land on a clean boundary.
            s.blocking_append([entry(1, 4)]).await.unwrap();
        }
        let mut s = LogStore::open(dir.path()).unwrap();
        assert_eq!(all(&mut s).await, vec![1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn damage_in_the_middle_refuses_to_open() {
        let dir = TestDir::new("log-mid");
        let path = dir.path().join(LOG_FILE);
        {
            let mut s = LogStore::open(dir.path()).unwrap();
            s.blocking_append((1..=3).map(|i| entry(1, i))).await.unwrap();
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let first = frame(&RecordRef::Append(&entry(1, 1))).unwrap().len();
        bytes[first + file::FRAME_HEADER_BYTES + 3] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let e = LogStore::open(dir.path()).err().expect("open must fail").to_string();
        assert!(e.contains(LOG_FILE) && e.contains("checksum"), "{e}");
    }

    #[tokio::test]
    async fn corrupt_vote_refuses_to_open() {
        let dir = TestDir::new("log-vote");
        {
            let mut s = LogStore::open(dir.path()).unwrap();
            s.save_vote(&Vote::new(3, 1)).await.unwrap();
        }
        let path = dir.path().join(VOTE_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[file::FRAME_HEADER_BYTES] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = LogStore::open(dir.path()).err().expect("open must fail").to_string();
        assert!(e.contains(VOTE_FILE), "{e}");
    }

    #[tokio::test]
    async fn purge_compacts_the_file() {
        let dir = TestDir::new("log-compact");
        {
            let mut s = LogStore::open(dir.path()).unwrap().with_compact_min_bytes(4096);
            for i in 0..40 {
                s.blocking_append((i * 10 + 1..=i * 10 + 10).map(|j| entry(1, j))).await.unwrap();
            }
            let before = s.file_len();
            s.save_committed(Some(log_id(1, 400))).await.unwrap();
            s.purge(log_id(1, 390)).await.unwrap();
            let after = s.file_len();
            assert!(after * 10 < before, "compaction should shrink {before} bytes, got {after}");
            assert_eq!(after, std::fs::metadata(dir.path().join(LOG_FILE)).unwrap().len());
            // The reopened handle appends after the rewritten records.
            s.blocking_append([entry(1, 401)]).await.unwrap();
        }
        let mut s = LogStore::open(dir.path()).unwrap();
        assert_eq!(all(&mut s).await, (391..=401).collect::<Vec<_>>());
        let st = s.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 390)));
        assert_eq!(s.read_committed().await.unwrap(), Some(log_id(1, 400)));
    }
}

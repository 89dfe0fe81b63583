//! The redo log: every committed row change of this node, in our own file format (DESIGN §4
//! "Durability").
//!
//! Layout under `DIR/redo/`: one directory per log part (`part0`, `part1`, …; a partition always
//! logs to part `partition % parts`, so parts never share a lock), each holding segment files
//! `<segment>.redo`. Segment numbers are shared by all parts and only grow: a local checkpoint
//! starts by rotating every part to a new segment, so "the redo since that checkpoint" is a set
//! of whole files and older files can be deleted once a newer checkpoint is usable.
//!
//! A segment is a stream of frames (`shoal_proto::file`: length + CRC32C + payload). Payloads:
//!
//! ```text
//! write:  'R' kind(1 = put, 2 = delete) gci:u64 table:u32 partition:u32 seq:u64 key_len:u32 key row…
//! marker: 'R' 3 gci:u64
//! ```
//!
//! A *marker* for GCI g is appended to every part when the node flushes for global checkpoint
//! g; every write stamped ≤ g precedes it (the checkpoint protocol waits for those writes to
//! finish first). Recovery to g replays a part up to its first marker ≥ g and refuses a part
//! that has none: a damaged log is reported, never silently replayed short.
//!
//! Writes go to an in-memory buffer per part (appended under the partition's store lock, so the
//! log order of a row's changes is their apply order). A writer thread per part drains the
//! buffers to disk continuously; `flush` (run once per global checkpoint) additionally fsyncs, so
//! one fsync covers every commit of the interval: group commit. The buffer is bounded; writers
//! wait for room before they commit (back-pressure when the disk is slower than the writes).
//!
//! *Lives*: each start of the node begins a new segment and records, in `redo/lives`, the GCI
//! it restored to. A record written in an earlier life with a GCI above a later life's restore
//! point was rolled back by that restart (it never became part of a complete checkpoint), so
//! replay ignores it even when it replays past it.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use shoal_proto::file::{self, FileError};
use shoal_proto::{ErrorCode, PartitionId, ShoalError, TableId};
use tokio::sync::{watch, Notify};

use crate::storage::Image;

/// First byte of every redo payload.
pub const REDO_TAG: u8 = b'R';
const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;
const KIND_MARKER: u8 = 3;
const WRITE_HEADER_BYTES: usize = 1 + 1 + 8 + 4 + 4 + 8 + 4;

/// Log parts per node.
pub const DEFAULT_PARTS: usize = 4;
/// Bytes buffered per part before committers wait for the disk.
pub const BUFFER_LIMIT_BYTES: usize = 32 * 1024 * 1024;
/// A writer drains a part's buffer once it holds this much, or after `DRAIN_INTERVAL`: the disk
/// sees a few large writes, not one per commit, and committers do not wake the writer thread
/// (a futex wake and a context switch each) for every record. Nothing waits for these writes:
/// durability comes from `flush_checkpoint`, which drains and fsyncs at once.
const DRAIN_BYTES: usize = 256 * 1024;
const DRAIN_INTERVAL: Duration = Duration::from_millis(20);
/// How long `flush` waits for the disk before reporting a disk error.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before a writer retries after a failed write (disk full, say).
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A decoded redo payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Write { gci: u64, table: TableId, partition: PartitionId, image: Image },
    Marker { gci: u64 },
}

/// Appends the frame of a row change to `out`.
pub fn encode_write(out: &mut Vec<u8>, gci: u64, table: TableId, partition: PartitionId, img: &Image) {
    let data_len = img.data.as_ref().map_or(0, Vec::len);
    let len = WRITE_HEADER_BYTES + img.key.len() + data_len;
    out.reserve(file::FRAME_HEADER_BYTES + len);
    let frame_start = out.len();
    out.extend_from_slice(&[0u8; file::FRAME_HEADER_BYTES]);
    let start = out.len();
    out.push(REDO_TAG);
    out.push(if img.data.is_some() { KIND_PUT } else { KIND_DELETE });
    out.extend_from_slice(&gci.to_le_bytes());
    out.extend_from_slice(&table.to_le_bytes());
    out.extend_from_slice(&partition.to_le_bytes());
    out.extend_from_slice(&img.seq.to_le_bytes());
    out.extend_from_slice(&(img.key.len() as u32).to_le_bytes());
    out.extend_from_slice(&img.key);
    if let Some(d) = &img.data {
        out.extend_from_slice(d);
    }
    seal_frame(out, frame_start, start);
}

/// Appends the frame of a checkpoint marker to `out`.
pub fn encode_marker(out: &mut Vec<u8>, gci: u64) {
    let frame_start = out.len();
    out.extend_from_slice(&[0u8; file::FRAME_HEADER_BYTES]);
    let start = out.len();
    out.push(REDO_TAG);
    out.push(KIND_MARKER);
    out.extend_from_slice(&gci.to_le_bytes());
    seal_frame(out, frame_start, start);
}

/// Fills in the length and checksum of the frame whose payload starts at `start`.
fn seal_frame(out: &mut [u8], frame_start: usize, start: usize) {
    let len = (out.len() - start) as u32;
    let crc = crc32c::crc32c(&out[start..]);
    out[frame_start..frame_start + 4].copy_from_slice(&len.to_le_bytes());
    out[frame_start + 4..frame_start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Decodes one payload (its frame's checksum already matched).
pub fn decode(p: &[u8]) -> Result<Entry, &'static str> {
    if p.len() < 10 || p[0] != REDO_TAG {
        return Err("not a redo record");
    }
    let gci = u64_at(p, 2);
    match p[1] {
        KIND_MARKER if p.len() == 10 => Ok(Entry::Marker { gci }),
        KIND_PUT | KIND_DELETE if p.len() >= WRITE_HEADER_BYTES => {
            let table = u32_at(p, 10);
            let partition = u32_at(p, 14);
            let seq = u64_at(p, 18);
            let key_len = u32_at(p, 26) as usize;
            let rest = &p[WRITE_HEADER_BYTES..];
            if key_len > rest.len() {
                return Err("key runs past the record");
            }
            let key = rest[..key_len].to_vec();
            let data = if p[1] == KIND_PUT {
                Some(rest[key_len..].to_vec())
            } else if rest.len() == key_len {
                None
            } else {
                return Err("delete record carries row bytes");
            };
            Ok(Entry::Write { gci, table, partition, image: Image { key, data, seq } })
        }
        _ => Err("unknown redo record kind"),
    }
}

fn segment_name(seg: u64) -> String {
    format!("{seg:012}.redo")
}

fn part_dir(dir: &Path, part: usize) -> PathBuf {
    dir.join(format!("part{part}"))
}

/// Segment numbers present in one part's directory, ascending.
pub fn list_segments(dir: &Path, part: usize) -> Result<Vec<u64>, FileError> {
    let pdir = part_dir(dir, part);
    let rd = match fs::read_dir(&pdir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(FileError::io("list", &pdir, e)),
    };
    let mut segs: Vec<u64> =
        rd.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str()?.strip_suffix(".redo")?.parse().ok()).collect();
    segs.sort_unstable();
    Ok(segs)
}

/// The node's lives: for each start, the first segment it wrote and the GCI it restored to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lives(pub Vec<(u64, u64)>);

impl Lives {
    fn path(dir: &Path) -> PathBuf {
        dir.join("lives")
    }

    pub fn load(dir: &Path) -> Result<Lives, FileError> {
        let path = Lives::path(dir);
        let Some(frames) = file::read_whole(&path)? else { return Ok(Lives::default()) };
        let text = String::from_utf8_lossy(&frames[0]).into_owned();
        let mut lives = vec![];
        for line in text.lines().filter(|l| !l.is_empty()) {
            let mut it = line.split(' ').map(str::parse::<u64>);
            match (it.next(), it.next()) {
                (Some(Ok(seg)), Some(Ok(gci))) => lives.push((seg, gci)),
                _ => {
                    return Err(FileError::Corrupt { path, offset: 0, reason: format!("bad line {line:?}") });
                }
            }
        }
        Ok(Lives(lives))
    }

    fn store(&self, dir: &Path) -> Result<(), FileError> {
        let mut text = String::new();
        for (seg, gci) in &self.0 {
            text.push_str(&format!("{seg} {gci}\n"));
        }
        if text.is_empty() {
            text.push('\n');
        }
        file::write_frames_atomic(&Lives::path(dir), &[text.as_bytes()])
    }

    /// The highest GCI a record in `seg` may carry and still count: later lives restored to
    /// their GCI and so rolled back anything above it that was written before them.
    pub fn cutoff(&self, seg: u64) -> u64 {
        self.0.iter().filter(|(first, _)| *first > seg).map(|(_, gci)| *gci).min().unwrap_or(u64::MAX)
    }
}

/// What replaying one part found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReplayStats {
    pub records: u64,
    pub applied: u64,
    pub bytes: u64,
    /// Bytes of torn tails cut off.
    pub dropped_bytes: u64,
}

/// Replays one part from segment `from_seg` up to its first marker ≥ `target`, calling `apply`
/// for every write with a GCI ≤ `target` that no later life rolled back. The rest of the part
/// is then only checked: a torn tail of a segment (a crash during a write) is cut off, the
/// file truncated at its last whole record, with a log line. Damage followed by intact
/// records before the marker, or a part that ends before the marker, is an error naming the
/// file: the log cannot restore `target`.
pub fn replay_part(
    dir: &Path,
    part: usize,
    from_seg: u64,
    target: u64,
    lives: &Lives,
    mut apply: impl FnMut(TableId, PartitionId, Image),
) -> Result<ReplayStats, String> {
    let mut stats = ReplayStats::default();
    // With no complete checkpoint (target 0) nothing on disk counts; the tails are still cut.
    let mut reached = target == 0;
    for seg in list_segments(dir, part).map_err(|e| e.to_string())?.into_iter().filter(|&s| s >= from_seg) {
        let path = part_dir(dir, part).join(segment_name(seg));
        let buf = fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let scan = match file::scan_frames(&path, &buf, REDO_TAG) {
            Ok(scan) => scan,
            Err(e) if reached => {
                // Past what the restore needs: report it, the next checkpoint makes it moot.
                tracing::warn!("redo beyond the restored checkpoint is damaged: {e}");
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        let cutoff = lives.cutoff(seg).min(target);
        for payload in &scan.payloads {
            if reached {
                break;
            }
            stats.records += 1;
            stats.bytes += (payload.len() + file::FRAME_HEADER_BYTES) as u64;
            match decode(payload).map_err(|e| format!("{}: {e}", path.display()))? {
                Entry::Marker { gci } if gci >= target => reached = true,
                Entry::Marker { .. } => {}
                Entry::Write { gci, table, partition, image } => {
                    if gci <= cutoff {
                        stats.applied += 1;
                        apply(table, partition, image);
                    }
                }
            }
        }
        if let Some(reason) = scan.tail_reason {
            let dropped = buf.len() - scan.valid_len;
            stats.dropped_bytes += dropped as u64;
            tracing::warn!(
                "redo {}: cut off a torn tail of {dropped} bytes at byte {} ({reason})",
                path.display(),
                scan.valid_len
            );
            let f =
                fs::OpenOptions::new().write(true).open(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
            f.set_len(scan.valid_len as u64).map_err(|e| format!("truncate {}: {e}", path.display()))?;
            f.sync_all().map_err(|e| format!("fsync {}: {e}", path.display()))?;
        }
    }
    if reached {
        return Ok(stats);
    }
    Err(format!(
        "redo part {part} in {} ends before the marker of global checkpoint {target}: the log is incomplete",
        dir.display()
    ))
}

/// Name of the file that records that old segments were deleted.
const DELETED_MARK: &str = "truncated";

/// Whether any segment of the log in `dir` was ever deleted (after a checkpoint): then only a
/// checkpoint plus the redo after it can restore the node.
pub fn deleted_any(dir: &Path) -> bool {
    dir.join(DELETED_MARK).exists()
}

// ----- the live log -----

struct PartState {
    seg: u64,
    buf: Vec<u8>,
    /// Buffers of earlier segments not yet written (after a rotation).
    sealed: VecDeque<(u64, Vec<u8>)>,
    pending_bytes: usize,
    flush_req: u64,
    /// Why the last write or fsync failed; cleared by the next success.
    error: Option<String>,
    stop: bool,
}

struct Part {
    index: usize,
    dir: PathBuf,
    state: Mutex<PartState>,
    wake: Condvar,
    flushed: watch::Sender<u64>,
    room: Notify,
}

/// A node's redo log, open for appending.
pub struct Redo {
    dir: PathBuf,
    parts: Vec<Arc<Part>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    lives: Mutex<Lives>,
    /// Bytes appended since the last rotation (drives local checkpoints).
    since_rotation: std::sync::atomic::AtomicU64,
    /// This life appended something (a write or a checkpoint marker).
    appended: std::sync::atomic::AtomicBool,
}

impl Redo {
    /// Starts a new life: the next segment number after every existing one, recorded in
    /// `lives` with the GCI this start restored to, and one writer thread per part.
    pub fn open(dir: &Path, parts: usize, restored_gci: u64) -> Result<Arc<Redo>, FileError> {
        let mut next = 1;
        for p in 0..parts {
            fs::create_dir_all(part_dir(dir, p)).map_err(|e| FileError::io("create", &part_dir(dir, p), e))?;
            if let Some(&last) = list_segments(dir, p)?.last() {
                next = next.max(last + 1);
            }
        }
        let mut lives = Lives::load(dir)?;
        lives.0.push((next, restored_gci));
        lives.store(dir)?;
        let redo = Arc::new(Redo {
            dir: dir.to_path_buf(),
            parts: (0..parts)
                .map(|index| {
                    Arc::new(Part {
                        index,
                        dir: part_dir(dir, index),
                        state: Mutex::new(PartState {
                            seg: next,
                            buf: Vec::new(),
                            sealed: VecDeque::new(),
                            pending_bytes: 0,
                            flush_req: 0,
                            error: None,
                            stop: false,
                        }),
                        wake: Condvar::new(),
                        flushed: watch::channel(0).0,
                        room: Notify::new(),
                    })
                })
                .collect(),
            threads: Mutex::new(vec![]),
            lives: Mutex::new(lives),
            since_rotation: Default::default(),
            appended: Default::default(),
        });
        let mut threads = redo.threads.lock();
        for part in &redo.parts {
            let part = part.clone();
            let t = std::thread::Builder::new()
                .name(format!("redo-{}", part.index))
                .spawn(move || writer(part))
                .map_err(|e| FileError::io("start redo writer", dir, e))?;
            threads.push(t);
        }
        drop(threads);
        Ok(redo)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    fn part_of(&self, partition: PartitionId) -> &Part {
        &self.parts[partition as usize % self.parts.len()]
    }

    /// Fails while a part cannot write to disk: committing more would only grow the buffer.
    pub fn check_writable(&self, partition: PartitionId) -> Result<(), ShoalError> {
        match &self.part_of(partition).state.lock().error {
            Some(e) => Err(ShoalError::new(ErrorCode::DiskError, format!("redo log cannot be written: {e}"))),
            None => Ok(()),
        }
    }

    /// Waits until the part of `partition` has room in its buffer.
    pub async fn wait_for_room(&self, partition: PartitionId) {
        let part = self.part_of(partition);
        loop {
            let notified = part.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if part.state.lock().pending_bytes < BUFFER_LIMIT_BYTES {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
    }

    /// Appends a row change. Called under the partition's store lock, so a row's records are
    /// in the order its changes were applied.
    pub fn append(&self, gci: u64, table: TableId, partition: PartitionId, img: &Image) {
        self.appended.store(true, std::sync::atomic::Ordering::Relaxed);
        let part = self.part_of(partition);
        let mut st = part.state.lock();
        let before = st.buf.len();
        encode_write(&mut st.buf, gci, table, partition, img);
        let n = st.buf.len() - before;
        st.pending_bytes += n;
        let full = before < DRAIN_BYTES && st.buf.len() >= DRAIN_BYTES;
        drop(st);
        self.since_rotation.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        if full {
            part.wake.notify_one();
        }
    }

    /// Appends the marker of global checkpoint `gci` to every part and makes everything
    /// appended so far durable (one fsync per part for the whole interval).
    pub async fn flush_checkpoint(&self, gci: u64) -> Result<(), ShoalError> {
        self.appended.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut targets = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            let mut st = part.state.lock();
            let before = st.buf.len();
            encode_marker(&mut st.buf, gci);
            st.pending_bytes += st.buf.len() - before;
            st.flush_req += 1;
            targets.push((part.clone(), st.flush_req));
            drop(st);
            part.wake.notify_one();
        }
        for (part, target) in targets {
            let mut rx = part.flushed.subscribe();
            let done = tokio::time::timeout(FLUSH_TIMEOUT, rx.wait_for(|&f| f >= target)).await;
            if !matches!(done, Ok(Ok(_))) {
                let why = part.state.lock().error.clone().unwrap_or_else(|| "flush timed out".into());
                return Err(ShoalError::new(ErrorCode::DiskError, format!("redo part {}: {why}", part.index)));
            }
        }
        Ok(())
    }

    /// Forgets this life in `lives` if it appended nothing: a start that mgmd refused before
    /// the node took part in the cluster (it restored an older global checkpoint than mgmd
    /// recorded for it, and is asked to restore again). Its restore point rolled nothing back,
    /// and recorded as a life it would void the earlier lives' records above it, which the
    /// next start needs. Returns whether it forgot the life.
    pub fn forget_unused_life(&self) -> Result<bool, FileError> {
        if self.appended.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(false);
        }
        let mut lives = self.lives.lock();
        if lives.0.pop().is_none() {
            return Ok(false);
        }
        lives.store(&self.dir)?;
        Ok(true)
    }

    /// Starts a new segment in every part; returns its number. Everything appended before
    /// the call is in older segments.
    pub fn rotate(&self) -> u64 {
        let mut seg = 0;
        for part in &self.parts {
            let mut st = part.state.lock();
            if !st.buf.is_empty() {
                let (s, b) = (st.seg, std::mem::take(&mut st.buf));
                st.sealed.push_back((s, b));
            }
            st.seg += 1;
            seg = seg.max(st.seg);
        }
        // Parts advance together; a part behind (never the case today) is brought level.
        for part in &self.parts {
            let mut st = part.state.lock();
            if st.seg < seg {
                if !st.buf.is_empty() {
                    let (s, b) = (st.seg, std::mem::take(&mut st.buf));
                    st.sealed.push_back((s, b));
                }
                st.seg = seg;
            }
            drop(st);
            part.wake.notify_one();
        }
        self.since_rotation.store(0, std::sync::atomic::Ordering::Relaxed);
        seg
    }

    pub fn bytes_since_rotation(&self) -> u64 {
        self.since_rotation.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Deletes segments older than `seg` (a usable checkpoint covers them) and forgets lives
    /// that no longer matter for the remaining ones.
    pub fn delete_before(&self, seg: u64) -> Result<u64, FileError> {
        let mut deleted = 0;
        // Recorded first: from now on the log alone cannot rebuild the node (see deleted_any).
        let mark = self.dir.join(DELETED_MARK);
        if !mark.exists() {
            file::write_frames_atomic(&mark, &[b"segments were deleted"])?;
        }
        for p in 0..self.parts.len() {
            for s in list_segments(&self.dir, p)?.into_iter().filter(|&s| s < seg) {
                let path = part_dir(&self.dir, p).join(segment_name(s));
                fs::remove_file(&path).map_err(|e| FileError::io("delete", &path, e))?;
                deleted += 1;
            }
        }
        let mut lives = self.lives.lock();
        let keep_from = lives.0.iter().rposition(|(first, _)| *first <= seg).unwrap_or(0);
        if keep_from > 0 {
            lives.0.drain(..keep_from);
            lives.store(&self.dir)?;
        }
        Ok(deleted)
    }
}

impl Drop for Redo {
    fn drop(&mut self) {
        for part in &self.parts {
            part.state.lock().stop = true;
            part.wake.notify_one();
        }
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// One part's writer thread: writes buffers as they fill, fsyncs on request.
fn writer(part: Arc<Part>) {
    let mut files: BTreeMap<u64, (File, u64)> = BTreeMap::new();
    let mut new_file = false;
    let mut flushed = 0u64;
    let mut failures = 0u64;
    loop {
        let (batches, req) = {
            let mut st = part.state.lock();
            let mut waited = false;
            loop {
                let idle = st.buf.is_empty() && st.sealed.is_empty() && st.flush_req <= flushed;
                if idle && st.stop {
                    return;
                }
                // Only records, and not many: give them `DRAIN_INTERVAL` to gather company.
                let small = st.sealed.is_empty() && st.flush_req <= flushed && st.buf.len() < DRAIN_BYTES;
                if !idle && (!small || waited || st.stop) {
                    break;
                }
                waited = !idle;
                part.wake.wait_for(&mut st, if idle { Duration::from_millis(100) } else { DRAIN_INTERVAL });
            }
            let mut b: Vec<(u64, Vec<u8>)> = st.sealed.drain(..).collect();
            if !st.buf.is_empty() {
                let seg = st.seg;
                b.push((seg, std::mem::take(&mut st.buf)));
            }
            (b, st.flush_req)
        };
        let mut written = 0usize;
        let mut failed: Option<(usize, String)> = None;
        for (i, (seg, bytes)) in batches.iter().enumerate() {
            match write_batch(&part.dir, &mut files, &mut new_file, *seg, bytes) {
                Ok(()) => written += bytes.len(),
                Err(e) => {
                    failed = Some((i, e));
                    break;
                }
            }
        }
        let mut sync_error = None;
        if failed.is_none() && req > flushed {
            sync_error = sync_files(&part.dir, &mut files, &mut new_file).err();
        }
        let mut st = part.state.lock();
        st.pending_bytes = st.pending_bytes.saturating_sub(written);
        if let Some((i, e)) = failed.or(sync_error.map(|e| (batches.len(), e))) {
            // Keep what was not written, in order, ahead of anything appended since.
            for b in batches.into_iter().skip(i).rev() {
                st.sealed.push_front(b);
            }
            if failures.is_multiple_of(50) {
                tracing::error!(part = part.index, "redo log write failed; writes are refused until it works: {e}");
            }
            failures += 1;
            st.error = Some(e);
            drop(st);
            part.room.notify_waiters();
            std::thread::sleep(RETRY_PAUSE);
            continue;
        }
        if st.error.take().is_some() {
            tracing::info!(part = part.index, "redo log writes work again");
        }
        failures = 0;
        drop(st);
        part.room.notify_waiters();
        if req > flushed {
            flushed = req;
            part.flushed.send_replace(req);
        }
    }
}

/// Appends `bytes` to segment `seg`. A failed write is undone (the file cut back to its old
/// length), so a retry never leaves a half record in the middle of the log.
fn write_batch(
    dir: &Path,
    files: &mut BTreeMap<u64, (File, u64)>,
    new_file: &mut bool,
    seg: u64,
    bytes: &[u8],
) -> Result<(), String> {
    if let std::collections::btree_map::Entry::Vacant(v) = files.entry(seg) {
        let path = dir.join(segment_name(seg));
        let f = file::open_append(&path).map_err(|e| e.to_string())?;
        let len = f.metadata().map_err(|e| format!("stat {}: {e}", path.display()))?.len();
        v.insert((f, len));
        *new_file = true;
    }
    let (f, len) = files.get_mut(&seg).expect("inserted above");
    match f.write_all(bytes) {
        Ok(()) => {
            *len += bytes.len() as u64;
            Ok(())
        }
        Err(e) => {
            let _ = f.set_len(*len);
            Err(format!("write {}: {e}", dir.join(segment_name(seg)).display()))
        }
    }
}

/// Fsyncs every file written since the last call (and the directory when files were created),
/// then closes all but the newest.
fn sync_files(dir: &Path, files: &mut BTreeMap<u64, (File, u64)>, new_file: &mut bool) -> Result<(), String> {
    for (seg, (f, _)) in files.iter() {
        f.sync_data().map_err(|e| format!("fsync {}: {e}", dir.join(segment_name(*seg)).display()))?;
    }
    if *new_file {
        let d = File::open(dir).map_err(|e| format!("open {}: {e}", dir.display()))?;
        d.sync_all().map_err(|e| format!("fsync {}: {e}", dir.display()))?;
        *new_file = false;
    }
    while files.len() > 1 {
        files.pop_first();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::file::test_dir::TestDir;

    /// A small deterministic generator: the codec tests need many varied records, not a
    /// property-testing dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn bytes(&mut self, max: usize) -> Vec<u8> {
            let n = (self.next() % (max as u64 + 1)) as usize;
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn random_entry(r: &mut Rng) -> Entry {
        if r.next().is_multiple_of(5) {
            return Entry::Marker { gci: r.next() };
        }
        let data = (!r.next().is_multiple_of(3)).then(|| r.bytes(200));
        Entry::Write {
            gci: r.next(),
            table: r.next() as u32,
            partition: r.next() as u32,
            image: Image { key: r.bytes(40), data, seq: r.next() },
        }
    }

    fn encode(e: &Entry, out: &mut Vec<u8>) {
        match e {
            Entry::Write { gci, table, partition, image } => encode_write(out, *gci, *table, *partition, image),
            Entry::Marker { gci } => encode_marker(out, *gci),
        }
    }

    #[test]
    fn codec_round_trips_and_detects_every_truncation() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300 {
            let entries: Vec<Entry> = (0..1 + r.next() % 6).map(|_| random_entry(&mut r)).collect();
            let mut buf = Vec::new();
            let mut ends = vec![];
            for e in &entries {
                encode(e, &mut buf);
                ends.push(buf.len());
            }
            let scan = file::scan_frames(Path::new("t"), &buf, REDO_TAG).unwrap();
            let back: Vec<Entry> = scan.payloads.iter().map(|p| decode(p).unwrap()).collect();
            assert_eq!(back, entries);
            // Any truncation keeps exactly the whole records before the cut.
            let cut = (r.next() % buf.len() as u64) as usize;
            let scan = file::scan_frames(Path::new("t"), &buf[..cut], REDO_TAG).unwrap();
            let whole = ends.iter().filter(|&&e| e <= cut).count();
            assert_eq!(scan.payloads.len(), whole);
            assert_eq!(scan.valid_len, if whole == 0 { 0 } else { ends[whole - 1] });
            assert_eq!(scan.tail_reason.is_some(), cut != scan.valid_len);
            // A flipped byte is never decoded as the original records.
            let mut bad = buf.clone();
            let at = (r.next() % bad.len() as u64) as usize;
            bad[at] ^= 1 << (r.next() % 8);
            if let Ok(scan) = file::scan_frames(Path::new("t"), &bad, REDO_TAG) {
                let back: Vec<Entry> = scan.payloads.iter().filter_map(|p| decode(p).ok()).collect();
                assert_ne!(back, entries, "flip at {at} went unnoticed");
            }
        }
    }

    fn img(k: u8, seq: u64) -> Image {
        Image { key: vec![k], data: Some(vec![k; 4]), seq }
    }

    fn replay_all(dir: &Path, parts: usize, target: u64) -> Result<Vec<(u32, Image)>, String> {
        let lives = Lives::load(dir).unwrap();
        let mut out = vec![];
        for p in 0..parts {
            replay_part(dir, p, 0, target, &lives, |_, partition, i| out.push((partition, i)))?;
        }
        Ok(out)
    }

    #[tokio::test]
    async fn replay_stops_at_the_marker_and_honours_later_lives() {
        let d = TestDir::new("redo");
        let redo = Redo::open(d.path(), 2, 0).unwrap();
        redo.append(1, 7, 0, &img(1, 1));
        redo.append(1, 7, 1, &img(2, 1));
        redo.flush_checkpoint(1).await.unwrap();
        redo.append(2, 7, 0, &img(3, 2));
        redo.flush_checkpoint(2).await.unwrap();
        // Written but never part of a complete checkpoint: the crash rolls it back.
        redo.append(3, 7, 0, &img(4, 3));
        redo.flush_checkpoint(3).await.unwrap();
        drop(redo);

        let keys = |v: Vec<(u32, Image)>| v.into_iter().map(|(_, i)| i.key[0]).collect::<Vec<_>>();
        assert_eq!(keys(replay_all(d.path(), 2, 1).unwrap()), vec![1, 2]);
        assert_eq!(keys(replay_all(d.path(), 2, 3).unwrap()), vec![1, 3, 4, 2]);
        // The next life restored to 2: record 4 (GCI 3) is void from now on.
        let redo = Redo::open(d.path(), 2, 2).unwrap();
        redo.append(4, 7, 0, &img(5, 4));
        redo.flush_checkpoint(4).await.unwrap();
        drop(redo);
        assert_eq!(keys(replay_all(d.path(), 2, 4).unwrap()), vec![1, 3, 5, 2]);
        // A checkpoint this log never completed cannot be restored from it.
        let e = replay_all(d.path(), 2, 9).unwrap_err();
        assert!(e.contains("ends before the marker of global checkpoint 9"), "{e}");
    }

    #[tokio::test]
    async fn a_refused_start_that_wrote_nothing_rolls_nothing_back() {
        let d = TestDir::new("redo-refused");
        let redo = Redo::open(d.path(), 1, 0).unwrap();
        for g in 1..=3 {
            redo.append(g, 7, 0, &img(g as u8, g));
            redo.flush_checkpoint(g).await.unwrap();
        }
        drop(redo);
        let keys = |v: Vec<(u32, Image)>| v.into_iter().map(|(_, i)| i.key[0]).collect::<Vec<_>>();
        // A start restored 1 (its map was older than mgmd's record of 3) and was refused
        // before it wrote anything: forgotten, it voids nothing, and the next start restores 3.
        let refused = Redo::open(d.path(), 1, 1).unwrap();
        assert!(refused.forget_unused_life().unwrap());
        drop(refused);
        assert_eq!(keys(replay_all(d.path(), 1, 3).unwrap()), vec![1, 2, 3]);
        // A life that wrote stays: its restore point voids the older records above it.
        let served = Redo::open(d.path(), 1, 1).unwrap();
        served.append(4, 7, 0, &img(9, 4));
        assert!(!served.forget_unused_life().unwrap());
        served.flush_checkpoint(4).await.unwrap();
        drop(served);
        assert_eq!(keys(replay_all(d.path(), 1, 4).unwrap()), vec![1, 9]);
    }

    #[tokio::test]
    async fn torn_tail_is_cut_and_middle_damage_refused() {
        let d = TestDir::new("redo-torn");
        let redo = Redo::open(d.path(), 1, 0).unwrap();
        redo.append(1, 7, 0, &img(1, 1));
        redo.flush_checkpoint(1).await.unwrap();
        redo.append(2, 7, 0, &img(2, 2));
        redo.flush_checkpoint(2).await.unwrap();
        drop(redo);
        let seg = part_dir(d.path(), 0).join(segment_name(1));
        let full = fs::read(&seg).unwrap();
        // Tear the last record (the marker of 2).
        fs::write(&seg, &full[..full.len() - 3]).unwrap();
        assert_eq!(replay_all(d.path(), 1, 1).unwrap().len(), 1);
        let e = replay_all(d.path(), 1, 2).unwrap_err();
        assert!(e.contains("ends before the marker"), "{e}");
        assert!(fs::metadata(&seg).unwrap().len() < full.len() as u64 - 3, "torn tail was cut off");
        // Flip a byte inside the first record: intact records follow, so it is an error.
        let mut bad = full.clone();
        bad[file::FRAME_HEADER_BYTES + 5] ^= 0x10;
        fs::write(&seg, &bad).unwrap();
        let e = replay_all(d.path(), 1, 1).unwrap_err();
        assert!(e.contains(&seg.display().to_string()), "{e}");
    }

    /// A small tmpfs mounted for one test, unmounted on drop.
    struct SmallDisk(PathBuf);

    impl SmallDisk {
        fn mount(at: &Path, size: &str) -> Option<SmallDisk> {
            fs::create_dir_all(at).ok()?;
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(at)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            ok.then(|| SmallDisk(at.to_path_buf()))
        }
    }

    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    #[tokio::test]
    async fn full_disk_refuses_writes_and_recovers_without_losing_records() {
        let d = TestDir::new("redo-full");
        let Some(disk) = SmallDisk::mount(&d.path().join("mnt"), "256k") else {
            eprintln!("SKIPPED: mounting a tmpfs needs root (CAP_SYS_ADMIN); this test cannot run here");
            return;
        };
        let filler = disk.0.join("filler");
        fs::write(&filler, vec![0u8; 200 * 1024]).unwrap();
        let redo = Redo::open(&disk.0.join("redo"), 1, 0).unwrap();
        let big = |k: u8| Image { key: vec![k], data: Some(vec![k; 2000]), seq: u64::from(k) + 1 };
        let mut appended = 0u8;
        let started = std::time::Instant::now();
        while redo.check_writable(0).is_ok() {
            assert!(started.elapsed() < Duration::from_secs(10), "the disk never filled up");
            if appended < 200 {
                redo.append(1, 7, 0, &big(appended));
                appended += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let e = redo.check_writable(0).unwrap_err();
        assert_eq!(e.code, ErrorCode::DiskError);
        assert!(e.message.contains("No space left"), "{e}");
        // Space comes back: the kept records are written, and writes are accepted again.
        fs::remove_file(&filler).unwrap();
        redo.flush_checkpoint(1).await.unwrap();
        redo.check_writable(0).unwrap();
        drop(redo);
        let lives = Lives::load(&disk.0.join("redo")).unwrap();
        let mut keys = vec![];
        replay_part(&disk.0.join("redo"), 0, 0, 1, &lives, |_, _, img| keys.push(img.key[0])).unwrap();
        assert_eq!(keys, (0..appended).collect::<Vec<_>>(), "every record appended survives the full disk");
    }

    #[tokio::test]
    async fn rotation_and_deletion_keep_the_log_bounded() {
        let d = TestDir::new("redo-rotate");
        let redo = Redo::open(d.path(), 2, 0).unwrap();
        redo.append(1, 7, 0, &img(1, 1));
        let seg = redo.rotate();
        assert_eq!(seg, 2);
        redo.append(1, 7, 1, &img(2, 2));
        redo.flush_checkpoint(1).await.unwrap();
        assert_eq!(list_segments(d.path(), 0).unwrap(), vec![1, 2]);
        assert_eq!(redo.delete_before(seg).unwrap(), 1);
        assert_eq!(list_segments(d.path(), 0).unwrap(), vec![2]);
        let lives = Lives::load(d.path()).unwrap();
        let mut got = vec![];
        for p in 0..2 {
            replay_part(d.path(), p, seg, 1, &lives, |_, _, i| got.push(i.key[0])).unwrap();
        }
        assert_eq!(got, vec![2]);
    }
}

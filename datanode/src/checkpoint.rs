//! Local checkpoint files (LCP, DESIGN §4 "Durability"): every partition replica's rows written
//! to disk so the redo log before the checkpoint can be deleted.
//!
//! Layout: `DIR/lcp/<id>/t<table>-p<partition>.lcp`, one file per partition replica, and
//! `DIR/lcp/<id>/meta` written last (atomically): a checkpoint without `meta` never finished and
//! is ignored. The meta says which redo segment the checkpoint started at and the highest GCI
//! any row in it can carry (`end_gci`): the checkpoint is fuzzy (rows change while it is
//! written), so it is usable to restore GCI g only if `end_gci ≤ g`, together with the redo
//! from `start_seg` up to g. Replay is idempotent because every row carries its sequence number.
//!
//! A partition file is a stream of frames (`shoal_proto::file`), every payload starting with 'C':
//!
//! ```text
//! header: 'C' 1 table:u32 partition:u32
//! row:    'C' 2 seq:u64 key_len:u32 key row…
//! end:    'C' 3 rows:u64 seq:u64        (the partition's sequence counter)
//! ```
//!
//! Reading is strict: any bad frame, a missing header or end, or a wrong row count refuses the
//! whole file with an error naming it. A checkpoint is never half-loaded.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shoal_proto::file::{self, FileError};
use shoal_proto::{PartitionId, TableId};

use crate::partition::Partition;
use crate::scan::CursorGuard;
use crate::storage::Image;

pub const LCP_TAG: u8 = b'C';
const KIND_HEADER: u8 = 1;
const KIND_ROW: u8 = 2;
const KIND_END: u8 = 3;
/// Rows copied out under one hold of a partition's lock.
const CHUNK_ROWS: u32 = 1000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LcpFile {
    pub table: TableId,
    pub partition: PartitionId,
    pub rows: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LcpMeta {
    pub id: u64,
    /// Redo segment the checkpoint started at: replay from here.
    pub start_seg: u64,
    /// No row in the checkpoint carries a GCI above this.
    pub end_gci: u64,
    /// Whether every replica was complete for the whole checkpoint (no node-restart copy was
    /// filling one). Only complete checkpoints can restore the node.
    pub complete: bool,
    pub files: Vec<LcpFile>,
}

pub fn root(dir: &Path) -> PathBuf {
    dir.join("lcp")
}

fn lcp_dir(dir: &Path, id: u64) -> PathBuf {
    root(dir).join(format!("{id:012}"))
}

fn file_name(table: TableId, partition: PartitionId) -> String {
    format!("t{table}-p{partition}.lcp")
}

/// A checkpoint directory on disk.
pub struct Listed {
    pub id: u64,
    /// Its meta, or why the meta is unusable; None when the checkpoint never finished.
    pub meta: Option<Result<LcpMeta, String>>,
}

/// Every checkpoint directory, oldest first.
pub fn list(dir: &Path) -> Result<Vec<Listed>, FileError> {
    let r = root(dir);
    let rd = match fs::read_dir(&r) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(FileError::io("list", &r, e)),
    };
    let mut ids: Vec<u64> = rd.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    ids.sort_unstable();
    Ok(ids
        .into_iter()
        .map(|id| {
            let meta = match file::read_whole(&lcp_dir(dir, id).join("meta")) {
                Ok(None) => None,
                Ok(Some(frames)) => Some(
                    serde_json::from_slice::<LcpMeta>(&frames[0])
                        .map_err(|e| format!("{}: {e}", lcp_dir(dir, id).join("meta").display())),
                ),
                Err(e) => Some(Err(e.to_string())),
            };
            Listed { id, meta }
        })
        .collect())
}

pub fn remove(dir: &Path, id: u64) -> Result<(), FileError> {
    let d = lcp_dir(dir, id);
    fs::remove_dir_all(&d).map_err(|e| FileError::io("delete", &d, e))
}

/// Creates the directory of checkpoint `id`.
pub fn begin(dir: &Path, id: u64) -> Result<(), FileError> {
    let d = lcp_dir(dir, id);
    fs::create_dir_all(&d).map_err(|e| FileError::io("create", &d, e))?;
    file::sync_dir(&d)
}

/// Finishes checkpoint `id`: its meta makes it visible.
pub fn finish(dir: &Path, meta: &LcpMeta) -> Result<(), FileError> {
    let json = serde_json::to_vec(meta).map_err(|e| FileError::Corrupt {
        path: lcp_dir(dir, meta.id),
        offset: 0,
        reason: format!("encode meta: {e}"),
    })?;
    file::write_frames_atomic(&lcp_dir(dir, meta.id).join("meta"), &[&json])
}

fn frame(out: &mut Vec<u8>, payload: &[u8]) {
    file::encode_frame(payload, out);
}

/// Writes one partition replica's rows into checkpoint `id`, walking the slab a chunk at a
/// time so writers are never held up for long. Returns what the meta records of the file.
pub fn write_partition(dir: &Path, id: u64, part: &std::sync::Arc<Partition>) -> Result<LcpFile, FileError> {
    let path = lcp_dir(dir, id).join(file_name(part.table, part.id));
    let f = File::create(&path).map_err(|e| FileError::io("create", &path, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut payload = Vec::with_capacity(256);
    payload.push(LCP_TAG);
    payload.push(KIND_HEADER);
    payload.extend_from_slice(&part.table.to_le_bytes());
    payload.extend_from_slice(&part.id.to_le_bytes());
    frame(&mut buf, &payload);
    let mut rows = 0u64;
    let mut bytes = 0u64;
    let cursor = CursorGuard::open(part.clone());
    let mut at = Some(0u32);
    while let Some(start) = at {
        at = cursor.0.store.lock().walk(start, CHUNK_ROWS, |slot| {
            payload.clear();
            payload.push(LCP_TAG);
            payload.push(KIND_ROW);
            payload.extend_from_slice(&slot.seq.to_le_bytes());
            payload.extend_from_slice(&(slot.key().len() as u32).to_le_bytes());
            payload.extend_from_slice(slot.key());
            payload.extend_from_slice(slot.data());
            frame(&mut buf, &payload);
            rows += 1;
            true
        });
        bytes += buf.len() as u64;
        w.write_all(&buf).map_err(|e| FileError::io("write", &path, e))?;
        buf.clear();
    }
    drop(cursor);
    payload.clear();
    payload.push(LCP_TAG);
    payload.push(KIND_END);
    payload.extend_from_slice(&rows.to_le_bytes());
    payload.extend_from_slice(&part.seq().to_le_bytes());
    frame(&mut buf, &payload);
    bytes += buf.len() as u64;
    w.write_all(&buf).map_err(|e| FileError::io("write", &path, e))?;
    let f = w.into_inner().map_err(|e| FileError::io("write", &path, e.into_error()))?;
    f.sync_all().map_err(|e| FileError::io("fsync", &path, e))?;
    Ok(LcpFile { table: part.table, partition: part.id, rows, bytes })
}

/// The rows of one partition file and its sequence counter.
pub struct PartitionRows {
    pub rows: Vec<Image>,
    pub seq: u64,
}

/// Reads one partition file of checkpoint `meta`, refusing any damage.
pub fn read_partition(dir: &Path, meta: &LcpMeta, f: &LcpFile) -> Result<PartitionRows, FileError> {
    let path = lcp_dir(dir, meta.id).join(file_name(f.table, f.partition));
    let buf = fs::read(&path).map_err(|e| FileError::io("read", &path, e))?;
    let corrupt =
        |offset: usize, reason: String| FileError::Corrupt { path: path.clone(), offset: offset as u64, reason };
    let mut pos = 0;
    let mut out = PartitionRows { rows: Vec::with_capacity(f.rows as usize), seq: 0 };
    let mut header = false;
    let mut ended = false;
    while pos < buf.len() {
        let (p, n) = file::frame_at(&buf[pos..]).map_err(|r| corrupt(pos, r.to_string()))?;
        if ended || p.len() < 2 || p[0] != LCP_TAG {
            return Err(corrupt(pos, "unexpected record".into()));
        }
        match p[1] {
            KIND_HEADER if !header && p.len() == 10 => {
                let table = u32::from_le_bytes(p[2..6].try_into().expect("4 bytes"));
                let partition = u32::from_le_bytes(p[6..10].try_into().expect("4 bytes"));
                if (table, partition) != (f.table, f.partition) {
                    return Err(corrupt(pos, format!("holds table {table} partition {partition}")));
                }
                header = true;
            }
            KIND_ROW if header && p.len() >= 14 => {
                let seq = u64::from_le_bytes(p[2..10].try_into().expect("8 bytes"));
                let key_len = u32::from_le_bytes(p[10..14].try_into().expect("4 bytes")) as usize;
                if 14 + key_len > p.len() {
                    return Err(corrupt(pos, "key runs past the record".into()));
                }
                out.rows.push(Image { key: p[14..14 + key_len].to_vec(), data: Some(p[14 + key_len..].to_vec()), seq });
            }
            KIND_END if header && p.len() == 18 => {
                let rows = u64::from_le_bytes(p[2..10].try_into().expect("8 bytes"));
                out.seq = u64::from_le_bytes(p[10..18].try_into().expect("8 bytes"));
                if rows != out.rows.len() as u64 || rows != f.rows {
                    return Err(corrupt(pos, format!("{} rows where {rows} were written", out.rows.len())));
                }
                ended = true;
            }
            k => return Err(corrupt(pos, format!("unexpected record kind {k}"))),
        }
        pos += n;
    }
    if !ended {
        return Err(corrupt(pos, "file ends before its last record (truncated)".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemoryBudget;
    use shoal_proto::file::test_dir::TestDir;
    use std::sync::Arc;

    fn filled(n: u8) -> Arc<Partition> {
        let p = Arc::new(Partition::new(3, 1, MemoryBudget::new(1 << 20)));
        for k in 0..n {
            p.store.lock().apply(Image { key: vec![k], data: Some(vec![k; 5]), seq: u64::from(k) + 1 });
            p.saw_seq(u64::from(k) + 1);
        }
        p
    }

    #[test]
    fn partition_files_round_trip_and_refuse_damage() {
        let d = TestDir::new("lcp");
        begin(d.path(), 1).unwrap();
        let f = write_partition(d.path(), 1, &filled(50)).unwrap();
        assert_eq!(f.rows, 50);
        let meta = LcpMeta { id: 1, start_seg: 4, end_gci: 9, complete: true, files: vec![f.clone()] };
        finish(d.path(), &meta).unwrap();
        let listed = list(d.path()).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].meta.clone().unwrap().unwrap(), meta);
        let back = read_partition(d.path(), &meta, &f).unwrap();
        assert_eq!(back.rows.len(), 50);
        assert_eq!(back.seq, 50);
        assert_eq!(back.rows[7], Image { key: vec![7], data: Some(vec![7; 5]), seq: 8 });

        let path = lcp_dir(d.path(), 1).join(file_name(3, 1));
        let good = fs::read(&path).unwrap();
        // Truncated: refused, naming the file.
        fs::write(&path, &good[..good.len() - 5]).unwrap();
        let e = read_partition(d.path(), &meta, &f).err().unwrap().to_string();
        assert!(e.contains("t3-p1.lcp"), "{e}");
        // Cut exactly at a record boundary: the missing end record is noticed.
        fs::write(&path, &good[..good.len() - 26]).unwrap();
        assert!(read_partition(d.path(), &meta, &f).is_err());
        // A flipped byte anywhere is refused.
        for at in [3, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x20;
            fs::write(&path, &bad).unwrap();
            assert!(read_partition(d.path(), &meta, &f).is_err(), "flip at {at}");
        }
        // A checkpoint without meta is listed as unfinished.
        begin(d.path(), 2).unwrap();
        assert!(list(d.path()).unwrap()[1].meta.is_none());
    }
}

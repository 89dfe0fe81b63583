//! The on-disk framing every Shoal file uses (mgmd's Raft files, data nodes' redo logs and
//! checkpoints), and atomic whole-file replacement.
//!
//! A file is a sequence of frames:
//!
//! ```text
//! [u32 LE payload length][u32 LE CRC32C of payload][payload bytes]
//! ```
//!
//! The append-only Raft log is a stream of frames that may end in a torn frame after a crash
//! (the last write was not fully on disk); [`scan_frames`] finds where the whole frames end so
//! the caller can cut the tail off. Small files that are replaced as a whole (vote, snapshot)
//! go through [`write_atomic`] and are read back with [`read_whole`], which refuses any damage:
//! they are never half-written, so damage there means the disk lied and we stop loudly.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Bytes before each payload: length and checksum.
pub const FRAME_HEADER_BYTES: usize = 8;
/// Largest payload we write or accept. A length field above this is corruption, not data.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("corrupt file {}: {reason} at byte {offset}", path.display())]
    Corrupt { path: PathBuf, offset: u64, reason: String },
}

impl FileError {
    pub fn io(what: &'static str, path: &Path, source: io::Error) -> FileError {
        FileError::Io { what, path: path.to_path_buf(), source }
    }
}

/// Appends one frame holding `payload` to `out`.
pub fn encode_frame(payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(!payload.is_empty() && payload.len() <= MAX_FRAME_BYTES);
    out.reserve(FRAME_HEADER_BYTES + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The frame that starts at `buf[0]`, if it is whole and its checksum matches.
/// Returns the payload and the frame's total length.
pub fn frame_at(buf: &[u8]) -> Result<(&[u8], usize), &'static str> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Err("short frame header");
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    // We never write empty payloads: a zero length is what a zero-filled tail looks like.
    if len == 0 || len > MAX_FRAME_BYTES {
        return Err("bad frame length");
    }
    let end = FRAME_HEADER_BYTES + len;
    if buf.len() < end {
        return Err("frame runs past the end of the file");
    }
    let payload = &buf[FRAME_HEADER_BYTES..end];
    if crc32c::crc32c(payload) != crc {
        return Err("frame checksum mismatch");
    }
    Ok((payload, end))
}

/// The result of reading a stream of frames.
#[derive(Debug)]
pub struct Scan<'a> {
    pub payloads: Vec<&'a [u8]>,
    /// Bytes covered by whole frames; everything after is a torn tail.
    pub valid_len: usize,
    /// Why the first bad frame was rejected (None when the whole buffer is valid).
    pub tail_reason: Option<&'static str>,
}

/// Reads frames from the start of `buf` until the end or the first bad frame.
///
/// A bad frame followed only by garbage is a torn tail (a crash during the last write) and is
/// reported through `valid_len`. A bad frame followed by a frame that checks out is damage in
/// the middle of the file: cutting there would silently drop records that were acknowledged,
/// so that is an error.
pub fn scan_frames<'a>(path: &Path, buf: &'a [u8], first_byte: u8) -> Result<Scan<'a>, FileError> {
    let mut payloads = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        match frame_at(&buf[pos..]) {
            Ok((payload, n)) => {
                payloads.push(payload);
                pos += n;
            }
            Err(reason) => {
                if let Some(next) = find_valid_frame(&buf[pos + 1..], first_byte) {
                    return Err(FileError::Corrupt {
                        path: path.to_path_buf(),
                        offset: pos as u64,
                        reason: format!(
                            "{reason}, followed by an intact record at byte {}; refusing to cut off acknowledged records",
                            pos + 1 + next
                        ),
                    });
                }
                return Ok(Scan { payloads, valid_len: pos, tail_reason: Some(reason) });
            }
        }
    }
    Ok(Scan { payloads, valid_len: pos, tail_reason: None })
}

/// Offset of the first position in `buf` where an intact frame starts. Every payload of one
/// kind of file starts with the same byte (`{` for JSON, a format tag for binary records), so
/// a candidate must start with it: that keeps this scan cheap and makes a chance match in torn
/// bytes (already 2^-32 through the CRC) even less likely.
fn find_valid_frame(buf: &[u8], first_byte: u8) -> Option<usize> {
    (0..buf.len().saturating_sub(FRAME_HEADER_BYTES))
        .find(|&i| buf.get(i + FRAME_HEADER_BYTES) == Some(&first_byte) && frame_at(&buf[i..]).is_ok())
}

/// Reads a file written by [`write_atomic`]: `None` if it does not exist, every payload if it
/// is intact, an error naming the file if any byte is wrong.
pub fn read_whole(path: &Path) -> Result<Option<Vec<Vec<u8>>>, FileError> {
    let buf = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FileError::io("read", path, e)),
    };
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let (payload, n) = frame_at(&buf[pos..]).map_err(|reason| FileError::Corrupt {
            path: path.to_path_buf(),
            offset: pos as u64,
            reason: reason.to_string(),
        })?;
        out.push(payload.to_vec());
        pos += n;
    }
    if out.is_empty() {
        return Err(FileError::Corrupt { path: path.to_path_buf(), offset: 0, reason: "empty file".into() });
    }
    Ok(Some(out))
}

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new file, never
/// a mix: write a temp file, fsync it, rename it over the target, fsync the directory (the
/// rename itself is only durable once the directory is).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let tmp = tmp_path(path);
    let mut f = File::create(&tmp).map_err(|e| FileError::io("create", &tmp, e))?;
    f.write_all(bytes).map_err(|e| FileError::io("write", &tmp, e))?;
    f.sync_all().map_err(|e| FileError::io("fsync", &tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| FileError::io("rename into place", path, e))?;
    sync_dir(path)
}

/// Encodes `payloads` as frames and writes them with [`write_atomic`].
pub fn write_frames_atomic(path: &Path, payloads: &[&[u8]]) -> Result<(), FileError> {
    let mut buf = Vec::new();
    for p in payloads {
        encode_frame(p, &mut buf);
    }
    write_atomic(path, &buf)
}

pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Fsyncs the directory holding `path`, making creates and renames in it durable.
pub fn sync_dir(path: &Path) -> Result<(), FileError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| FileError::io("fsync directory", dir, e))
}

/// Opens `path` for appending, creating it if needed.
pub fn open_append(path: &Path) -> Result<File, FileError> {
    OpenOptions::new().create(true).append(true).read(true).open(path).map_err(|e| FileError::io("open", path, e))
}

/// Scratch directories for tests of code that writes files (used by several crates' tests).
#[doc(hidden)]
pub mod test_dir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    pub struct TestDir(PathBuf);

    impl TestDir {
        pub fn new(tag: &str) -> TestDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let p = std::env::temp_dir().join(format!(
                "shoal-{tag}-{}-{}-{nanos}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).expect("create test dir");
            TestDir(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_dir::TestDir;
    use super::*;

    fn frames(payloads: &[&[u8]]) -> Vec<u8> {
        let mut buf = Vec::new();
        for p in payloads {
            encode_frame(p, &mut buf);
        }
        buf
    }

    #[test]
    fn frames_round_trip() {
        let buf = frames(&[b"{\"a\":1}", b"{\"b\":2}"]);
        let scan = scan_frames(Path::new("x"), &buf, b'{').unwrap();
        assert_eq!(scan.payloads, vec![&b"{\"a\":1}"[..], &b"{\"b\":2}"[..]]);
        assert_eq!(scan.valid_len, buf.len());
        assert!(scan.tail_reason.is_none());
    }

    #[test]
    fn torn_tail_is_reported() {
        let mut buf = frames(&[b"{\"a\":1}", b"{\"b\":2}"]);
        let whole = buf.len();
        let extra = frames(&[b"{\"c\":3}"]);
        for cut in 1..extra.len() {
            buf.truncate(whole);
            buf.extend_from_slice(&extra[..cut]);
            let scan = scan_frames(Path::new("x"), &buf, b'{').unwrap();
            assert_eq!(scan.payloads.len(), 2, "cut at {cut}");
            assert_eq!(scan.valid_len, whole);
            assert!(scan.tail_reason.is_some());
        }
        // A zero-filled tail (what some filesystems leave after a crash) is torn too.
        buf.truncate(whole);
        buf.extend_from_slice(&[0u8; 100]);
        assert_eq!(scan_frames(Path::new("x"), &buf, b'{').unwrap().valid_len, whole);
    }

    #[test]
    fn garbage_in_the_middle_is_an_error() {
        let a = frames(&[b"{\"a\":1}"]);
        let mut buf = a.clone();
        buf.extend_from_slice(b"garbage!garbage!");
        buf.extend_from_slice(&frames(&[b"{\"b\":2}"]));
        let e = scan_frames(Path::new("log"), &buf, b'{').unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("log") && msg.contains(&format!("byte {}", a.len())), "{msg}");
        // A flipped bit inside a middle record is caught by its checksum.
        let mut buf = frames(&[b"{\"a\":1}", b"{\"b\":2}", b"{\"c\":3}"]);
        buf[a.len() + FRAME_HEADER_BYTES + 2] ^= 0x40;
        assert!(scan_frames(Path::new("log"), &buf, b'{').is_err());
    }

    #[test]
    fn atomic_files_refuse_damage() {
        let dir = TestDir::new("file");
        let p = dir.path().join("vote");
        assert!(read_whole(&p).unwrap().is_none());
        write_frames_atomic(&p, &[b"{\"v\":1}"]).unwrap();
        assert_eq!(read_whole(&p).unwrap().unwrap(), vec![b"{\"v\":1}".to_vec()]);
        assert!(!tmp_path(&p).exists());
        let mut bytes = fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&p, &bytes).unwrap();
        let e = read_whole(&p).unwrap_err().to_string();
        assert!(e.contains("checksum") && e.contains("vote"), "{e}");
        fs::write(&p, b"").unwrap();
        assert!(read_whole(&p).is_err());
    }
}

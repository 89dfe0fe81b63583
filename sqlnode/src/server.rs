//! The MySQL client/server protocol (protocol 41): handshake and authentication
//! (`mysql_native_password` and the `caching_sha2_password` fast path against the catalog's
//! accounts, see `authenticate`), the text protocol (COM_QUERY) and the binary protocol of
//! prepared statements (COM_STMT_PREPARE / EXECUTE / SEND_LONG_DATA / CLOSE / RESET),
//! COM_INIT_DB, COM_PING, COM_FIELD_LIST, COM_QUIT. Our own, rather than opensrv-mysql: it
//! answers a failed login with 1045, never answers an unknown command with OK, and bounds every
//! packet.
//!
//! Packets: 3-byte little-endian length, 1-byte sequence number, payload; a payload of 2^24-1
//! bytes continues in the next packet. Statements never see the network: [`Session`] turns SQL
//! into an [`Outcome`] and this module encodes it.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use shoal_client::Client;
use shoal_proto::hash::IdMap;
use shoal_proto::{AccountName, AuthPlugin};

use crate::auth;
use crate::error::{code, SqlError};
use crate::session::{ColumnMeta, Outcome, Session, Shared, VERSION};
use crate::types::{parse_datetime, IntKind, WireType};
use crate::val::{Dec, Val};

/// Largest packet (after joining continuation packets) a client may send: max_allowed_packet.
pub const MAX_PACKET_BYTES: usize = 64 * 1024 * 1024;
/// Most client connections one SQL node serves at once.
pub const MAX_CONNECTIONS: u32 = 10_000;
/// Output buffered before it is written to the socket in the middle of a result set.
const FLUSH_BYTES: usize = 256 * 1024;
/// A connection's read buffer. Requests are small (a sysbench statement execution is about 30
/// bytes, an insert a few hundred), and a larger packet bypasses the buffer. Small per-connection
/// buffers pack several connections' into one page: with 1024 sysbench connections, 2 KiB and 1
/// KiB (against 16 KiB each) cut the SQL node's user CPU per point select by 0.2–0.5 µs, 3–8%
/// (benchmarks.md, "Thirty-fifth session"), and 10,000 connections hold 30 MB of buffers, not 320.
const READ_BUFFER_BYTES: usize = 2 * 1024;
/// A connection's output buffer when it starts, and what it goes back to after a large answer
/// (more than [`IDLE_OUT_MAX_BYTES`]), so a connection that once read many rows does not keep
/// their buffer while it idles.
const OUT_BUFFER_BYTES: usize = 1024;
const IDLE_OUT_MAX_BYTES: usize = 64 * 1024;

const MAX_PAYLOAD: usize = 0xFF_FFFF;
const NATIVE_PASSWORD: &str = "mysql_native_password";

// Capability flags.
const CLIENT_LONG_PASSWORD: u32 = 1;
const CLIENT_FOUND_ROWS: u32 = 2;
const CLIENT_LONG_FLAG: u32 = 4;
const CLIENT_CONNECT_WITH_DB: u32 = 8;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_INTERACTIVE: u32 = 0x400;
const CLIENT_SSL: u32 = 0x800;
const CLIENT_TRANSACTIONS: u32 = 0x2000;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
const CLIENT_MULTI_RESULTS: u32 = 0x2_0000;
const CLIENT_PS_MULTI_RESULTS: u32 = 0x4_0000;
const CLIENT_PLUGIN_AUTH: u32 = 0x8_0000;
const CLIENT_CONNECT_ATTRS: u32 = 0x10_0000;
const CLIENT_PLUGIN_AUTH_LENENC_DATA: u32 = 0x20_0000;
const CLIENT_DEPRECATE_EOF: u32 = 0x100_0000;

const SERVER_CAPABILITIES: u32 = CLIENT_LONG_PASSWORD
    | CLIENT_FOUND_ROWS
    | CLIENT_LONG_FLAG
    | CLIENT_CONNECT_WITH_DB
    | CLIENT_PROTOCOL_41
    | CLIENT_INTERACTIVE
    | CLIENT_TRANSACTIONS
    | CLIENT_SECURE_CONNECTION
    | CLIENT_MULTI_RESULTS
    | CLIENT_PS_MULTI_RESULTS
    | CLIENT_PLUGIN_AUTH
    | CLIENT_CONNECT_ATTRS
    | CLIENT_PLUGIN_AUTH_LENENC_DATA
    | CLIENT_DEPRECATE_EOF;

const STATUS_IN_TRANS: u16 = 1;
const STATUS_AUTOCOMMIT: u16 = 2;

/// utf8mb4_bin and binary collation ids.
const CHARSET_UTF8MB4_BIN: u16 = 46;
const CHARSET_BINARY: u16 = 63;

// Column flags.
const NOT_NULL_FLAG: u16 = 1;
const PRI_KEY_FLAG: u16 = 2;
const BLOB_FLAG: u16 = 16;
const UNSIGNED_FLAG: u16 = 32;
const BINARY_FLAG: u16 = 128;
const AUTO_INCREMENT_FLAG: u16 = 512;
const NUM_FLAG: u16 = 32768;

// Column types.
const T_DECIMAL: u8 = 0;
const T_TINY: u8 = 1;
const T_SHORT: u8 = 2;
const T_LONG: u8 = 3;
const T_FLOAT: u8 = 4;
const T_DOUBLE: u8 = 5;
const T_NULL: u8 = 6;
const T_TIMESTAMP: u8 = 7;
const T_LONGLONG: u8 = 8;
const T_INT24: u8 = 9;
const T_DATE: u8 = 10;
const T_TIME: u8 = 11;
const T_DATETIME: u8 = 12;
const T_YEAR: u8 = 13;
const T_NEWDECIMAL: u8 = 246;
const T_BLOB: u8 = 252;
const T_VAR_STRING: u8 = 253;

fn put_lenenc_int(out: &mut Vec<u8>, n: u64) {
    match n {
        0..=250 => out.push(n as u8),
        251..=0xFFFF => {
            out.push(0xFC);
            out.extend_from_slice(&(n as u16).to_le_bytes());
        }
        0x1_0000..=0xFF_FFFF => {
            out.push(0xFD);
            out.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
        }
        _ => {
            out.push(0xFE);
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
}

fn put_lenenc_str(out: &mut Vec<u8>, s: &[u8]) {
    put_lenenc_int(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// Reads protocol fields out of one payload; every read is bounds-checked.
struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

fn malformed() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed packet")
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, i: 0 }
    }
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        let end = self.i.checked_add(n).ok_or_else(malformed)?;
        let s = self.b.get(self.i..end).ok_or_else(malformed)?;
        self.i = end;
        Ok(s)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> io::Result<u16> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> io::Result<u32> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn lenenc_int(&mut self) -> io::Result<u64> {
        Ok(match self.u8()? {
            n @ 0..=250 => u64::from(n),
            0xFC => u64::from(self.u16()?),
            0xFD => {
                let s = self.take(3)?;
                u64::from(s[0]) | u64::from(s[1]) << 8 | u64::from(s[2]) << 16
            }
            0xFE => self.u64()?,
            _ => return Err(malformed()),
        })
    }
    fn lenenc_bytes(&mut self) -> io::Result<&'a [u8]> {
        let n = self.lenenc_int()?;
        self.take(usize::try_from(n).map_err(|_| malformed())?)
    }
    fn nul_str(&mut self) -> io::Result<&'a [u8]> {
        let rest = self.b.get(self.i..).ok_or_else(malformed)?;
        let end = rest.iter().position(|&c| c == 0).ok_or_else(malformed)?;
        self.i += end + 1;
        Ok(&rest[..end])
    }
    fn rest(&mut self) -> &'a [u8] {
        let r = self.b.get(self.i..).unwrap_or_default();
        self.i = self.b.len();
        r
    }
    fn at_end(&self) -> bool {
        self.i >= self.b.len()
    }
}

/// The client's handshake response.
#[derive(Debug, Default, PartialEq, Eq)]
struct HandshakeResponse {
    caps: u32,
    user: String,
    auth: Vec<u8>,
    db: Option<String>,
    plugin: Option<String>,
}

fn parse_handshake_response(p: &[u8]) -> io::Result<HandshakeResponse> {
    let mut r = Reader::new(p);
    let caps = r.u32()?;
    if caps & CLIENT_PROTOCOL_41 == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "client does not speak protocol 41"));
    }
    let _max_packet = r.u32()?;
    let _charset = r.u8()?;
    r.take(23)?;
    if caps & CLIENT_SSL != 0 && r.at_end() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "client asked for TLS, which this server does not offer",
        ));
    }
    let user = String::from_utf8_lossy(r.nul_str()?).into_owned();
    let auth = if caps & CLIENT_PLUGIN_AUTH_LENENC_DATA != 0 {
        r.lenenc_bytes()?.to_vec()
    } else if caps & CLIENT_SECURE_CONNECTION != 0 {
        let n = r.u8()?;
        r.take(usize::from(n))?.to_vec()
    } else {
        r.nul_str()?.to_vec()
    };
    let db = if caps & CLIENT_CONNECT_WITH_DB != 0 && !r.at_end() {
        let d = String::from_utf8_lossy(r.nul_str()?).into_owned();
        (!d.is_empty()).then_some(d)
    } else {
        None
    };
    let plugin = if caps & CLIENT_PLUGIN_AUTH != 0 && !r.at_end() {
        Some(String::from_utf8_lossy(r.nul_str().unwrap_or_default()).into_owned())
    } else {
        None
    };
    // Connection attributes are read by nobody; skip them.
    Ok(HandshakeResponse { caps, user, auth, db, plugin })
}

fn new_scramble() -> [u8; 20] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 20];
    let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
    seed.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    let mut x = seed.finish() | 1;
    for b in &mut out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Printable, never NUL or '$' (some clients stop at either).
        let mut c = 0x21 + (x % 94) as u8;
        if c == b'$' {
            c += 1;
        }
        *b = c;
    }
    out
}

/// Per prepared statement: what the binary protocol needs between executions.
#[derive(Default)]
struct StmtState {
    params: usize,
    types: Vec<(u8, bool)>,
    long_data: IdMap<u16, Vec<u8>>,
}

/// Most bytes of long data one statement may accumulate.
const MAX_LONG_DATA_BYTES: usize = MAX_PACKET_BYTES;

pub struct Conn<S> {
    io: BufReader<S>,
    out: Vec<u8>,
    seq: u8,
    caps: u32,
    peer: String,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub fn new(stream: S, peer: String) -> Conn<S> {
        Conn {
            io: BufReader::with_capacity(READ_BUFFER_BYTES, stream),
            out: Vec::with_capacity(OUT_BUFFER_BYTES),
            seq: 0,
            caps: 0,
            peer,
        }
    }

    /// Reads one logical packet (continuations joined). None at a clean end of stream.
    async fn read_packet(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut payload = vec![];
        loop {
            let mut hdr = [0u8; 4];
            match self.io.read_exact(&mut hdr).await {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && payload.is_empty() => return Ok(None),
                Err(e) => return Err(e),
            }
            let len = usize::from(hdr[0]) | usize::from(hdr[1]) << 8 | usize::from(hdr[2]) << 16;
            self.seq = hdr[3].wrapping_add(1);
            if payload.len() + len > MAX_PACKET_BYTES {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "packet larger than max_allowed_packet"));
            }
            let start = payload.len();
            payload.resize(start + len, 0);
            self.io.read_exact(&mut payload[start..]).await?;
            if len < MAX_PAYLOAD {
                shoal_proto::spin::note_work();
                shoal_proto::spin::note_load(payload.len());
                return Ok(Some(payload));
            }
        }
    }

    /// Queues one packet (split into continuations when long).
    fn packet(&mut self, payload: &[u8]) {
        let mut rest = payload;
        loop {
            let n = rest.len().min(MAX_PAYLOAD);
            self.out.extend_from_slice(&(n as u32).to_le_bytes()[..3]);
            self.out.push(self.seq);
            self.seq = self.seq.wrapping_add(1);
            self.out.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if n < MAX_PAYLOAD {
                break;
            }
        }
    }

    /// Queues one packet whose payload `encode` appends in place (no payload buffer of its own:
    /// a result set's rows go straight into the output).
    fn packet_with(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        let start = self.out.len();
        self.out.extend_from_slice(&[0; 4]);
        encode(&mut self.out);
        let n = self.out.len() - start - 4;
        if n < MAX_PAYLOAD {
            self.out[start..start + 3].copy_from_slice(&(n as u32).to_le_bytes()[..3]);
            self.out[start + 3] = self.seq;
            self.seq = self.seq.wrapping_add(1);
        } else {
            let payload = self.out.split_off(start + 4);
            self.out.truncate(start);
            self.packet(&payload);
        }
    }

    async fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.io.get_mut().write_all(&self.out).await?;
            self.out.clear();
        }
        self.io.get_mut().flush().await
    }

    /// Between commands: gives back an output buffer that a large answer grew (everything in
    /// it has been written by now).
    fn shrink_idle(&mut self) {
        if self.out.capacity() > IDLE_OUT_MAX_BYTES && self.out.is_empty() {
            self.out = Vec::with_capacity(OUT_BUFFER_BYTES);
        }
    }

    fn deprecate_eof(&self) -> bool {
        self.caps & CLIENT_DEPRECATE_EOF != 0
    }

    fn ok(&mut self, affected: u64, last_insert_id: u64, status: u16, info: &str, header: u8) {
        self.packet_with(|p| {
            p.push(header);
            put_lenenc_int(p, affected);
            put_lenenc_int(p, last_insert_id);
            p.extend_from_slice(&status.to_le_bytes());
            p.extend_from_slice(&0u16.to_le_bytes());
            if !info.is_empty() {
                // Length-encoded, as mysqld writes it (and as libmariadb reads it).
                put_lenenc_str(p, info.as_bytes());
            }
        });
    }

    fn eof(&mut self, status: u16) {
        self.packet_with(|p| {
            p.push(0xFE);
            p.extend_from_slice(&0u16.to_le_bytes());
            p.extend_from_slice(&status.to_le_bytes());
        });
    }

    /// The end of a result set: EOF, or OK with the EOF header under CLIENT_DEPRECATE_EOF.
    fn end_of_rows(&mut self, status: u16) {
        if self.deprecate_eof() {
            self.ok(0, 0, status, "", 0xFE);
        } else {
            self.eof(status);
        }
    }

    fn err(&mut self, e: &SqlError) {
        let mut p = vec![0xFF];
        p.extend_from_slice(&e.code.to_le_bytes());
        p.push(b'#');
        let state = if e.state.len() == 5 { e.state } else { "HY000" };
        p.extend_from_slice(state.as_bytes());
        // Bounded: a message never makes a packet huge.
        let msg = if e.message.len() > 2048 { &e.message[..e.message.floor_char_boundary(2048)] } else { &e.message };
        p.extend_from_slice(msg.as_bytes());
        self.packet(&p);
    }

    fn column_def(&mut self, m: &ColumnMeta, ty: WireType) {
        let (code, len, mut flags, decimals, charset) = wire_column(ty);
        if m.not_null {
            flags |= NOT_NULL_FLAG;
        }
        if m.primary_key {
            flags |= PRI_KEY_FLAG;
        }
        if m.auto_increment {
            flags |= AUTO_INCREMENT_FLAG;
        }
        self.packet_with(|p| {
            put_lenenc_str(p, b"def");
            put_lenenc_str(p, m.db.as_bytes());
            put_lenenc_str(p, m.table.as_bytes());
            put_lenenc_str(p, m.org_table.as_bytes());
            put_lenenc_str(p, m.name.as_bytes());
            put_lenenc_str(p, m.org_name.as_bytes());
            put_lenenc_int(p, 0x0c);
            p.extend_from_slice(&charset.to_le_bytes());
            p.extend_from_slice(&len.to_le_bytes());
            p.push(code);
            p.extend_from_slice(&flags.to_le_bytes());
            p.push(decimals);
            p.extend_from_slice(&[0, 0]);
        });
    }

    /// Sends an outcome: a result set (text or binary rows) or OK.
    async fn outcome(&mut self, out: Outcome, status: u16, binary: bool) -> io::Result<()> {
        match out {
            Outcome::Done { affected, last_insert_id, info } => {
                self.ok(affected, last_insert_id, status, &info, 0);
            }
            Outcome::Rows(rs) => {
                let types: Vec<WireType> = rs
                    .columns
                    .iter()
                    .enumerate()
                    .map(|(i, m)| final_type(m.ty, rs.rows.iter().map(|r| &r[i])))
                    .collect();
                self.packet_with(|p| put_lenenc_int(p, rs.columns.len() as u64));
                for (m, &ty) in rs.columns.iter().zip(&types) {
                    self.column_def(m, ty);
                }
                if !self.deprecate_eof() {
                    self.eof(status);
                }
                for row in &rs.rows {
                    self.packet_with(|p| match binary {
                        true => binary_row(row, &types, p),
                        false => text_row(row, &types, p),
                    });
                    if self.out.len() > FLUSH_BYTES {
                        self.flush().await?;
                    }
                }
                self.end_of_rows(status);
            }
        }
        Ok(())
    }
}

/// (type code, display length, flags, decimals, charset) for result metadata.
fn wire_column(ty: WireType) -> (u8, u32, u16, u8, u16) {
    match ty {
        WireType::Int { kind, unsigned, width } => {
            let (code, len) = match kind {
                IntKind::Tiny => (T_TINY, 4),
                IntKind::Small => (T_SHORT, 6),
                IntKind::Medium => (T_INT24, 9),
                IntKind::Int => (T_LONG, 11),
                IntKind::Big => (T_LONGLONG, 20),
            };
            let flags = NUM_FLAG | if unsigned { UNSIGNED_FLAG } else { 0 };
            (code, width.unwrap_or(len), flags, 0, CHARSET_BINARY)
        }
        WireType::Float => (T_FLOAT, 12, NUM_FLAG, 31, CHARSET_BINARY),
        WireType::Double => (T_DOUBLE, 22, NUM_FLAG, 31, CHARSET_BINARY),
        WireType::Decimal { p, s } => (T_NEWDECIMAL, u32::from(p) + 2, NUM_FLAG, s, CHARSET_BINARY),
        WireType::Str { len } => (T_VAR_STRING, len, 0, 0, CHARSET_UTF8MB4_BIN),
        WireType::Blob { len, binary } => {
            let flags = BLOB_FLAG | if binary { BINARY_FLAG } else { 0 };
            (T_BLOB, len, flags, 0, if binary { CHARSET_BINARY } else { CHARSET_UTF8MB4_BIN })
        }
        WireType::Bytes { len } => (T_VAR_STRING, len, BINARY_FLAG, 0, CHARSET_BINARY),
        WireType::Date => (T_DATE, 10, BINARY_FLAG, 0, CHARSET_BINARY),
        WireType::Datetime { fsp, timestamp } => {
            let len = 19 + if fsp > 0 { u32::from(fsp) + 1 } else { 0 };
            (if timestamp { T_TIMESTAMP } else { T_DATETIME }, len, BINARY_FLAG, fsp, CHARSET_BINARY)
        }
        WireType::Null => (T_NULL, 0, BINARY_FLAG, 0, CHARSET_BINARY),
    }
}

/// Whether the binary protocol can encode `v` as `ty`.
fn fits(ty: WireType, v: &Val) -> bool {
    match (ty, v) {
        (_, Val::Null) => true,
        (WireType::Int { kind, unsigned, .. }, Val::Int(_) | Val::UInt(_)) => {
            let (lo, hi) = kind.range(unsigned);
            let n = v.to_dec().map_or(0, |d| d.m);
            n >= lo && n <= hi
        }
        (WireType::Int { .. }, _) => false,
        (WireType::Float | WireType::Double, Val::Float(_)) => true,
        (WireType::Float | WireType::Double, _) => false,
        (WireType::Decimal { .. }, Val::Dec(_) | Val::Int(_) | Val::UInt(_)) => true,
        (WireType::Decimal { .. }, _) => false,
        (WireType::Date | WireType::Datetime { .. }, Val::Str(s)) => parse_datetime(s).is_some(),
        (WireType::Date | WireType::Datetime { .. }, _) => false,
        (WireType::Null, _) => false,
        (WireType::Str { .. } | WireType::Blob { .. } | WireType::Bytes { .. }, _) => true,
    }
}

/// The type a result column is sent as: the one the binder inferred if every value fits it,
/// else one from the values, else VARCHAR.
fn final_type<'a>(declared: Option<WireType>, mut values: impl Iterator<Item = &'a Val> + Clone) -> WireType {
    if let Some(t) = declared {
        if values.clone().all(|v| fits(t, v)) {
            return t;
        }
    }
    let Some(first) = values.clone().find(|v| !v.is_null()) else {
        return declared.unwrap_or(WireType::Str { len: 0 });
    };
    let guess = match WireType::of_val(first) {
        WireType::Str { .. } => WireType::Str { len: 255 },
        WireType::Bytes { .. } => WireType::Bytes { len: 255 },
        other => other,
    };
    if values.all(|v| fits(guess, v)) {
        guess
    } else {
        WireType::Str { len: 255 }
    }
}

/// Appends a value's text form as a length-encoded string; strings and bytes go in as they are.
fn put_text(p: &mut Vec<u8>, v: &Val) {
    match v {
        Val::Str(s) => put_lenenc_str(p, s.as_bytes()),
        Val::Bytes(b) => put_lenenc_str(p, b),
        _ => put_lenenc_str(p, &v.to_text().unwrap_or_default()),
    }
}

/// Appends a text-protocol row's payload to `p`.
fn text_row(row: &[Val], types: &[WireType], p: &mut Vec<u8>) {
    for (v, ty) in row.iter().zip(types) {
        match (v, ty) {
            (Val::Null, _) => p.push(0xFB),
            (Val::Float(f), WireType::Float) => put_lenenc_str(p, crate::val::format_float(*f).as_bytes()),
            _ => put_text(p, v),
        }
    }
}

/// Appends a binary-protocol row's payload to `p`.
fn binary_row(row: &[Val], types: &[WireType], p: &mut Vec<u8>) {
    p.push(0);
    let bitmap_at = p.len();
    p.resize(bitmap_at + (row.len() + 7 + 2) / 8, 0);
    for (i, (v, ty)) in row.iter().zip(types).enumerate() {
        if v.is_null() {
            let bit = i + 2;
            p[bitmap_at + bit / 8] |= 1 << (bit % 8);
            continue;
        }
        match ty {
            WireType::Int { kind, .. } => {
                let n = v.to_dec().map_or(0, |d| d.m) as i64;
                match kind {
                    IntKind::Tiny => p.push(n as u8),
                    IntKind::Small => p.extend_from_slice(&(n as u16).to_le_bytes()),
                    IntKind::Medium | IntKind::Int => p.extend_from_slice(&(n as u32).to_le_bytes()),
                    IntKind::Big => {
                        let u = match v {
                            Val::UInt(u) => *u,
                            _ => n as u64,
                        };
                        p.extend_from_slice(&u.to_le_bytes());
                    }
                }
            }
            WireType::Float => p.extend_from_slice(&(v.to_f64().unwrap_or(0.0) as f32).to_le_bytes()),
            WireType::Double => p.extend_from_slice(&v.to_f64().unwrap_or(0.0).to_le_bytes()),
            WireType::Date | WireType::Datetime { .. } => {
                let dt = v.to_string_lossy().and_then(|s| parse_datetime(&s));
                let Some(dt) = dt else {
                    p.push(0);
                    continue;
                };
                let date_only = matches!(ty, WireType::Date)
                    || (dt.hour == 0 && dt.minute == 0 && dt.second == 0 && dt.micros == 0);
                let len: u8 = if date_only {
                    4
                } else if dt.micros == 0 {
                    7
                } else {
                    11
                };
                p.push(len);
                p.extend_from_slice(&(dt.year as u16).to_le_bytes());
                p.push(dt.month as u8);
                p.push(dt.day as u8);
                if len >= 7 {
                    p.extend_from_slice(&[dt.hour as u8, dt.minute as u8, dt.second as u8]);
                }
                if len == 11 {
                    p.extend_from_slice(&dt.micros.to_le_bytes());
                }
            }
            WireType::Null => {}
            WireType::Decimal { .. } | WireType::Str { .. } | WireType::Blob { .. } | WireType::Bytes { .. } => {
                put_text(p, v);
            }
        }
    }
}

/// Decodes the parameters of COM_STMT_EXECUTE.
fn parse_params(r: &mut Reader<'_>, st: &mut StmtState) -> io::Result<Vec<Val>> {
    let n = st.params;
    if n == 0 {
        return Ok(vec![]);
    }
    let nulls = r.take(n.div_ceil(8))?.to_vec();
    if r.u8()? == 1 {
        let mut types = Vec::with_capacity(n);
        for _ in 0..n {
            let t = r.u8()?;
            let f = r.u8()?;
            types.push((t, f & 0x80 != 0));
        }
        st.types = types;
    }
    if st.types.len() != n {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "parameter types were never sent"));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        if nulls[i / 8] & (1 << (i % 8)) != 0 {
            out.push(Val::Null);
            continue;
        }
        if let Some(data) = st.long_data.remove(&(i as u16)) {
            out.push(bytes_val(data));
            continue;
        }
        let (t, unsigned) = st.types[i];
        out.push(match t {
            T_NULL => Val::Null,
            T_TINY => {
                let b = r.u8()?;
                if unsigned {
                    Val::UInt(u64::from(b))
                } else {
                    Val::Int(i64::from(b as i8))
                }
            }
            T_SHORT | T_YEAR => {
                let v = r.u16()?;
                if unsigned {
                    Val::UInt(u64::from(v))
                } else {
                    Val::Int(i64::from(v as i16))
                }
            }
            T_LONG | T_INT24 => {
                let v = r.u32()?;
                if unsigned {
                    Val::UInt(u64::from(v))
                } else {
                    Val::Int(i64::from(v as i32))
                }
            }
            T_LONGLONG => {
                let v = r.u64()?;
                if unsigned {
                    Val::UInt(v)
                } else {
                    Val::Int(v as i64)
                }
            }
            T_FLOAT => Val::Float(f64::from(f32::from_le_bytes(r.take(4)?.try_into().map_err(|_| malformed())?))),
            T_DOUBLE => Val::Float(f64::from_le_bytes(r.take(8)?.try_into().map_err(|_| malformed())?)),
            T_DATE | T_DATETIME | T_TIMESTAMP => {
                let len = r.u8()?;
                let b = r.take(usize::from(len))?;
                let g = |i: usize| b.get(i).copied().unwrap_or(0);
                let year = u16::from_le_bytes([g(0), g(1)]);
                let mut s = format!("{year:04}-{:02}-{:02}", g(2), g(3));
                if t != T_DATE || len > 4 {
                    s.push_str(&format!(" {:02}:{:02}:{:02}", g(4), g(5), g(6)));
                    if len >= 11 {
                        let us = u32::from_le_bytes([g(7), g(8), g(9), g(10)]);
                        s.push_str(&format!(".{us:06}"));
                    }
                }
                Val::Str(s)
            }
            T_TIME => {
                let len = r.u8()?;
                let b = r.take(usize::from(len))?;
                let g = |i: usize| b.get(i).copied().unwrap_or(0);
                let days = u32::from_le_bytes([g(1), g(2), g(3), g(4)]);
                let sign = if g(0) == 1 { "-" } else { "" };
                Val::Str(format!("{sign}{:02}:{:02}:{:02}", days * 24 + u32::from(g(5)), g(6), g(7)))
            }
            T_DECIMAL | T_NEWDECIMAL => {
                let b = r.lenenc_bytes()?;
                let s = String::from_utf8_lossy(b);
                Dec::parse(&s).map(Val::Dec).unwrap_or(Val::Str(s.into_owned()))
            }
            _ => bytes_val(r.lenenc_bytes()?.to_vec()),
        });
    }
    Ok(out)
}

fn bytes_val(b: Vec<u8>) -> Val {
    match String::from_utf8(b) {
        Ok(s) => Val::Str(s),
        Err(e) => Val::Bytes(e.into_bytes()),
    }
}

/// The client's address without its port (`[::1]:5000` → `::1`).
fn peer_host(peer: &str) -> String {
    let h = peer.rsplit_once(':').map_or(peer, |(h, _)| h);
    h.trim_start_matches('[').trim_end_matches(']').to_string()
}

/// The plugin a client answered the handshake with (none named: a pre-4.1-plugin client,
/// which speaks mysql_native_password).
fn answered_plugin(hs: &HandshakeResponse) -> Option<AuthPlugin> {
    match hs.plugin.as_deref() {
        None | Some("") => Some(AuthPlugin::NativePassword),
        Some(p) => AuthPlugin::from_name(p),
    }
}

/// Runs the authentication exchange after the handshake response: finds the account (user
/// name and client host, see `auth::find_account`), asks the client to switch to the
/// account's plugin if it answered with another one (as MySQL does), and checks the answer.
/// Sends the error itself and returns None when the login is refused.
///
/// `caching_sha2_password` always takes the fast path (every account's SHA256(SHA256(pw)) is
/// known): a right answer gets "fast auth success" (0x01 0x03) and OK, a wrong one 1045. Full
/// authentication (the password itself over TLS or RSA) is never requested; a client that
/// sends something else than a fast-path answer is refused with 1251.
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    c: &mut Conn<S>,
    shared: &Shared,
    hs: &HandshakeResponse,
    scramble: &[u8; 20],
    host: &str,
) -> io::Result<Option<AccountName>> {
    let users = match shared.users().await {
        Ok(u) => u,
        Err(e) => {
            c.err(&SqlError::new(code::UNKNOWN, format!("Cannot check users: the cluster is not reachable ({e})")));
            c.flush().await?;
            return Ok(None);
        }
    };
    let account = auth::find_account(&users.accounts, &hs.user, host);
    let mut answer = hs.auth.clone();
    let mut plugin = answered_plugin(hs);
    if let Some(a) = account {
        let want = a.password.plugin;
        // A client whose default plugin is not the one the greeting named (native) answers
        // without data (libmariadb does) and waits for a switch; so an answer counts only when
        // it is in the account's plugin and is a full native or sha2 answer, else we switch.
        let usable = plugin == Some(want)
            && (want == AuthPlugin::NativePassword || answer.len() == shoal_proto::users::SHA2_HASH_BYTES);
        if !usable {
            let mut p = vec![0xFE];
            p.extend_from_slice(want.name().as_bytes());
            p.push(0);
            p.extend_from_slice(scramble);
            p.push(0);
            c.packet(&p);
            c.flush().await?;
            let Some(again) = c.read_packet().await? else { return Ok(None) };
            answer = again;
            plugin = Some(want);
        }
    }
    let verdict = match (account, plugin) {
        (Some(a), Some(AuthPlugin::NativePassword)) => auth::native_ok(scramble, &answer, &a.password.native),
        (Some(a), Some(AuthPlugin::CachingSha2Password)) => {
            if !answer.is_empty() && answer.len() != shoal_proto::users::SHA2_HASH_BYTES {
                c.err(&SqlError::new(
                    code::NOT_SUPPORTED_AUTH_MODE,
                    "caching_sha2_password full authentication (TLS or RSA key exchange) is not supported by \
                     Shoal: every account takes the fast path, so send the scrambled password",
                ));
                c.flush().await?;
                tracing::info!(peer = %c.peer, user = %hs.user, "refused a caching_sha2_password full authentication");
                return Ok(None);
            }
            let ok = auth::sha2_ok(scramble, &answer, &a.password.sha2);
            if ok && !answer.is_empty() {
                // AuthMoreData "fast auth success": the OK packet follows.
                c.packet(&[0x01, 0x03]);
            }
            ok
        }
        _ => false,
    };
    match account {
        Some(a) if verdict => Ok(Some(a.account.clone())),
        _ => {
            let using = if answer.is_empty() { "NO" } else { "YES" };
            c.err(&SqlError::new(
                code::ACCESS_DENIED,
                format!("Access denied for user '{}'@'{host}' (using password: {using})", hs.user),
            ));
            c.flush().await?;
            tracing::info!(peer = %c.peer, user = %hs.user, "access denied");
            Ok(None)
        }
    }
}

/// Runs a statement and turns a panic (a bug) into an error for this statement only: the
/// connection and the node stay up. A plain function around `catch_unwind`, not an async one:
/// an async `guard` took the statement's future as an argument and moved it once more into
/// `catch_unwind`, a copy of its kilobytes on every statement (1.2% of a point select).
fn guard(
    f: impl std::future::Future<Output = Result<Outcome, SqlError>>,
) -> impl std::future::Future<Output = Result<Outcome, SqlError>> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(f).catch_unwind().map(|r| {
        r.unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!("statement panicked (a bug): {what}");
            Err(SqlError::internal(format!("internal error: {what}")))
        })
    })
}

fn status_of(s: &Session) -> u16 {
    let mut st = 0;
    if s.autocommit {
        st |= STATUS_AUTOCOMMIT;
    }
    if s.in_transaction {
        st |= STATUS_IN_TRANS;
    }
    st
}

/// Answers a connection that cannot be served with one error packet.
pub async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(stream: S, e: &SqlError) -> io::Result<()> {
    let mut c = Conn::new(stream, String::new());
    c.caps = CLIENT_PROTOCOL_41;
    c.err(e);
    c.flush().await
}

/// Serves one client connection until it quits or breaks.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    shared: Arc<Shared>,
    client: Client,
    stream: S,
    peer: String,
) -> io::Result<()> {
    let mut c = Conn::new(stream, peer);
    let scramble = new_scramble();
    let connection_id = shared.next_connection_id();
    // Handshake v10.
    let mut p = vec![10u8];
    p.extend_from_slice(VERSION.as_bytes());
    p.push(0);
    p.extend_from_slice(&connection_id.to_le_bytes());
    p.extend_from_slice(&scramble[..8]);
    p.push(0);
    p.extend_from_slice(&(SERVER_CAPABILITIES as u16).to_le_bytes());
    p.push(CHARSET_UTF8MB4_BIN as u8);
    p.extend_from_slice(&STATUS_AUTOCOMMIT.to_le_bytes());
    p.extend_from_slice(&((SERVER_CAPABILITIES >> 16) as u16).to_le_bytes());
    p.push(21);
    p.extend_from_slice(&[0; 10]);
    p.extend_from_slice(&scramble[8..]);
    p.push(0);
    p.extend_from_slice(NATIVE_PASSWORD.as_bytes());
    p.push(0);
    c.seq = 0;
    c.packet(&p);
    c.flush().await?;

    let Some(resp) = c.read_packet().await? else { return Ok(()) };
    let hs = parse_handshake_response(&resp)?;
    c.caps = hs.caps & SERVER_CAPABILITIES;
    let host = peer_host(&c.peer);
    let Some(account) = authenticate(&mut c, &shared, &hs, &scramble, &host).await? else { return Ok(()) };
    let mut session = Session::new(shared, client.clone(), hs.user.clone(), c.caps & CLIENT_FOUND_ROWS != 0);
    session.connection_id = connection_id;
    session.account = account.clone();
    session.host = host.clone();
    if let Some(db) = &hs.db {
        if let Err(e) = session.use_db(db).await {
            c.err(&e);
            c.flush().await?;
            return Ok(());
        }
    }
    c.ok(0, 0, status_of(&session), "", 0);
    c.flush().await?;

    let mut stmts: IdMap<u32, StmtState> = IdMap::default();
    loop {
        c.shrink_idle();
        let packet = match c.read_packet().await {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                c.err(&SqlError::new(
                    code::NET_PACKET_TOO_LARGE,
                    format!("Got a packet bigger than 'max_allowed_packet' bytes or a malformed one: {e}"),
                ));
                c.flush().await?;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let Some((&cmd, body)) = packet.split_first() else {
            c.err(&SqlError::new(code::UNKNOWN_COM, "Unknown command"));
            c.flush().await?;
            continue;
        };
        match cmd {
            0x01 => return Ok(()), // COM_QUIT
            0x02 => {
                // COM_INIT_DB
                let db = String::from_utf8_lossy(body).into_owned();
                match session.use_db(&db).await {
                    Ok(()) => c.ok(0, 0, status_of(&session), "", 0),
                    Err(e) => c.err(&e),
                }
            }
            0x03 => {
                // COM_QUERY
                let sql = String::from_utf8_lossy(body).into_owned();
                let out = guard(session.query(&sql)).await;
                match out {
                    Ok(o) => c.outcome(o, status_of(&session), false).await?,
                    Err(e) => {
                        tracing::debug!(peer = %c.peer, code = e.code, "query failed: {}", e.message);
                        c.err(&e)
                    }
                }
            }
            0x04 => {
                // COM_FIELD_LIST (deprecated): an empty column list.
                c.end_of_rows(status_of(&session));
            }
            0x0e => c.ok(0, 0, status_of(&session), "", 0), // COM_PING
            0x09 => {
                // COM_STATISTICS: a plain string.
                c.packet(b"Uptime: 0  Threads: 1  Questions: 0");
            }
            0x16 => {
                // COM_STMT_PREPARE
                let sql = String::from_utf8_lossy(body).into_owned();
                match session.prepare(&sql).await {
                    Ok((id, params, columns)) => {
                        stmts.insert(id, StmtState { params, ..StmtState::default() });
                        let mut p = vec![0u8];
                        p.extend_from_slice(&id.to_le_bytes());
                        p.extend_from_slice(&(columns.len() as u16).to_le_bytes());
                        p.extend_from_slice(&(params as u16).to_le_bytes());
                        p.push(0);
                        p.extend_from_slice(&0u16.to_le_bytes());
                        c.packet(&p);
                        if params > 0 {
                            let m = ColumnMeta::named("?", None);
                            for _ in 0..params {
                                c.column_def(&m, WireType::Str { len: 0 });
                            }
                            if !c.deprecate_eof() {
                                c.eof(status_of(&session));
                            }
                        }
                        if !columns.is_empty() {
                            for m in &columns {
                                c.column_def(m, final_type(m.ty, std::iter::empty()));
                            }
                            if !c.deprecate_eof() {
                                c.eof(status_of(&session));
                            }
                        }
                    }
                    Err(e) => c.err(&e),
                }
            }
            0x17 => {
                // COM_STMT_EXECUTE
                let mut r = Reader::new(body);
                let id = r.u32().unwrap_or(0);
                let Some(st) = stmts.get_mut(&id) else {
                    c.err(&SqlError::new(
                        code::UNKNOWN_STMT_HANDLER,
                        format!("Unknown prepared statement handler ({id}) given to mysqld_stmt_execute"),
                    ));
                    c.flush().await?;
                    continue;
                };
                let params = (|| -> io::Result<Vec<Val>> {
                    let _flags = r.u8()?;
                    let _iterations = r.u32()?;
                    parse_params(&mut r, st)
                })();
                st.long_data.clear();
                match params {
                    Err(e) => c.err(&SqlError::new(
                        code::WRONG_ARGUMENTS,
                        format!("Incorrect arguments to mysqld_stmt_execute: {e}"),
                    )),
                    Ok(params) => match guard(session.execute(id, &params)).await {
                        Ok(o) => c.outcome(o, status_of(&session), true).await?,
                        Err(e) => c.err(&e),
                    },
                }
            }
            0x18 => {
                // COM_STMT_SEND_LONG_DATA: no answer.
                let mut r = Reader::new(body);
                if let (Ok(id), Ok(param)) = (r.u32(), r.u16()) {
                    if let Some(st) = stmts.get_mut(&id) {
                        let data = r.rest();
                        let total: usize = st.long_data.values().map(Vec::len).sum();
                        if total + data.len() <= MAX_LONG_DATA_BYTES {
                            st.long_data.entry(param).or_default().extend_from_slice(data);
                        }
                    }
                }
                continue;
            }
            0x19 => {
                // COM_STMT_CLOSE: no answer.
                let id = Reader::new(body).u32().unwrap_or(0);
                stmts.remove(&id);
                session.prepared.remove(&id);
                continue;
            }
            0x1a => {
                // COM_STMT_RESET
                let id = Reader::new(body).u32().unwrap_or(0);
                match stmts.get_mut(&id) {
                    Some(st) => {
                        st.long_data.clear();
                        c.ok(0, 0, status_of(&session), "", 0);
                    }
                    None => c.err(&SqlError::new(
                        code::UNKNOWN_STMT_HANDLER,
                        format!("Unknown prepared statement handler ({id}) given to mysqld_stmt_reset"),
                    )),
                }
            }
            0x1b => {
                // COM_SET_OPTION: multi-statements stay off; answer EOF as MySQL does.
                c.eof(status_of(&session));
            }
            0x1f => {
                // COM_RESET_CONNECTION
                let db = session.db.clone();
                let shared = session.shared.clone();
                session = Session::new(shared, client.clone(), hs.user.clone(), c.caps & CLIENT_FOUND_ROWS != 0);
                session.connection_id = connection_id;
                session.account = account.clone();
                session.host = host.clone();
                session.db = db;
                stmts.clear();
                c.ok(0, 0, status_of(&session), "", 0);
            }
            other => {
                c.err(&SqlError::new(code::UNKNOWN_COM, format!("Unknown command 0x{other:02x}")));
            }
        }
        c.flush().await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_encoded_in_place_match_copied_ones_also_when_split() {
        for len in [0, 5, MAX_PAYLOAD - 1, MAX_PAYLOAD, MAX_PAYLOAD + 7] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let (a, _) = tokio::io::duplex(64);
            let (b, _) = tokio::io::duplex(64);
            let (mut copied, mut in_place) = (Conn::new(a, String::new()), Conn::new(b, String::new()));
            copied.seq = 7;
            in_place.seq = 7;
            copied.packet(&payload);
            in_place.packet_with(|p| p.extend_from_slice(&payload));
            assert!(copied.out == in_place.out, "payload of {len} bytes");
            assert_eq!(copied.seq, in_place.seq);
        }
    }

    #[tokio::test]
    async fn a_large_answer_gives_its_buffer_back_and_a_large_request_reads_whole() {
        let (a, mut peer) = tokio::io::duplex(1 << 20);
        let mut c = Conn::new(a, String::new());
        // A request larger than the read buffer, then a small one.
        let big: Vec<u8> = (0..3 * READ_BUFFER_BYTES).map(|i| i as u8).collect();
        for payload in [&big[..], b"\x0e"] {
            let mut framed = (payload.len() as u32).to_le_bytes()[..3].to_vec();
            framed.push(0);
            framed.extend_from_slice(payload);
            tokio::io::AsyncWriteExt::write_all(&mut peer, &framed).await.unwrap();
        }
        assert_eq!(c.read_packet().await.unwrap().unwrap(), big);
        assert_eq!(c.read_packet().await.unwrap().unwrap(), b"\x0e");

        c.packet(&vec![7; 4 * IDLE_OUT_MAX_BYTES]);
        c.shrink_idle();
        assert!(c.out.capacity() > IDLE_OUT_MAX_BYTES, "unsent output stays");
        c.flush().await.unwrap();
        c.shrink_idle();
        assert!(c.out.capacity() <= IDLE_OUT_MAX_BYTES);
        // What was sent arrived whole.
        let mut got = vec![0; 4 + 4 * IDLE_OUT_MAX_BYTES];
        tokio::io::AsyncReadExt::read_exact(&mut peer, &mut got).await.unwrap();
        assert!(got[4..].iter().all(|&b| b == 7));
    }

    #[test]
    fn handshake_response_parses_and_bad_ones_fail() {
        let mut p = vec![];
        let caps = CLIENT_PROTOCOL_41 | CLIENT_SECURE_CONNECTION | CLIENT_PLUGIN_AUTH | CLIENT_CONNECT_WITH_DB;
        p.extend_from_slice(&caps.to_le_bytes());
        p.extend_from_slice(&(1u32 << 24).to_le_bytes());
        p.push(45);
        p.extend_from_slice(&[0; 23]);
        p.extend_from_slice(b"root\0");
        p.push(0);
        p.extend_from_slice(b"shop\0");
        p.extend_from_slice(b"mysql_native_password\0");
        let hs = parse_handshake_response(&p).unwrap();
        assert_eq!(hs.user, "root");
        assert_eq!(hs.db.as_deref(), Some("shop"));
        assert!(hs.auth.is_empty());
        assert_eq!(hs.plugin.as_deref(), Some(NATIVE_PASSWORD));
        for cut in 0..p.len() - 1 {
            let _ = parse_handshake_response(&p[..cut]); // never panics
        }
        assert!(parse_handshake_response(&p[..10]).is_err());
    }

    #[test]
    fn params_decode_and_truncation_is_an_error() {
        let mut st = StmtState { params: 3, ..StmtState::default() };
        let mut b = vec![0b0000_0100u8, 1];
        b.extend_from_slice(&[T_LONGLONG, 0, T_VAR_STRING, 0, T_LONG, 0]);
        b.extend_from_slice(&(-5i64).to_le_bytes());
        b.push(2);
        b.extend_from_slice(b"hi");
        let v = parse_params(&mut Reader::new(&b), &mut st).unwrap();
        assert_eq!(v, vec![Val::Int(-5), Val::Str("hi".into()), Val::Null]);
        for cut in 0..b.len() - 1 {
            let mut st = StmtState { params: 3, ..StmtState::default() };
            assert!(parse_params(&mut Reader::new(&b[..cut]), &mut st).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn rows_encode() {
        let types = [
            WireType::Int { kind: IntKind::Int, unsigned: false, width: None },
            WireType::Str { len: 10 },
            WireType::Date,
        ];
        let row = [Val::Int(-2), Val::Null, Val::Str("2024-01-02".into())];
        let mut t = vec![];
        text_row(&row, &types, &mut t);
        assert_eq!(t, b"\x02-2\xfb\x0a2024-01-02".to_vec());
        let mut b = vec![];
        binary_row(&row, &types, &mut b);
        assert_eq!(b[0], 0);
        assert_eq!(b[1], 0b0000_1000, "NULL bit of column 1 at offset 2");
        assert_eq!(&b[2..6], &(-2i32 as u32).to_le_bytes());
        assert_eq!(&b[6..], &[4, 0xE8, 0x07, 1, 2]);
        assert_eq!(final_type(None, [Val::Int(1), Val::Str("x".into())].iter()), WireType::Str { len: 255 });
        assert_eq!(
            final_type(
                Some(WireType::Int { kind: IntKind::Tiny, unsigned: false, width: None }),
                [Val::Int(300)].iter()
            ),
            WireType::Int { kind: IntKind::Big, unsigned: false, width: None }
        );
    }
}

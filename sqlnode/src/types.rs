//! SQL column types and how they live in the cluster's storage types.
//!
//! | SQL | storage (`ColumnType`) | notes |
//! |---|---|---|
//! | TINYINT … BIGINT | Int | range-checked per declared type (1264) |
//! | … UNSIGNED | Uint | |
//! | BOOLEAN / BOOL | Int | as MySQL: `tinyint(1)` |
//! | FLOAT, DOUBLE, REAL | Float | FLOAT is rounded to single precision |
//! | DECIMAL(p,s), p ≤ 18 | Int | the exact value × 10^s; ordering and pushed-down filters stay exact |
//! | CHAR/VARCHAR(n), TEXT kinds | Text | at most n characters (1406); max_len = 4n bytes (utf8mb4) |
//! | BINARY/VARBINARY(n), BLOB kinds | Bytes | at most n bytes (1406) |
//! | DATE | Text | canonical `YYYY-MM-DD`, so byte order is date order |
//! | DATETIME(fsp), TIMESTAMP(fsp) | Text | canonical `YYYY-MM-DD hh:mm:ss[.f…]`; no time zone conversion |
//!
//! The declared type is kept in `Column::sql_type` (canonical lower-case text such as
//! `varchar(20)` or `decimal(10,2)`) and parsed back by [`SqlType::parse_stored`].

use shoal_client::RowDecoder;
use shoal_proto::codec::{self, Field, FieldReader};
use shoal_proto::{Column, ColumnType, ShoalError, Table, Value, MAX_ROW_BYTES};
use sqlparser::ast::{CharacterLength, DataType, ExactNumberInfo};

use crate::error::{code, SqlError, SqlResult};
use crate::val::{Dec, Val};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntKind {
    Tiny,
    Small,
    Medium,
    Int,
    Big,
}

impl IntKind {
    fn name(self) -> &'static str {
        match self {
            IntKind::Tiny => "tinyint",
            IntKind::Small => "smallint",
            IntKind::Medium => "mediumint",
            IntKind::Int => "int",
            IntKind::Big => "bigint",
        }
    }

    fn bits(self) -> u32 {
        match self {
            IntKind::Tiny => 8,
            IntKind::Small => 16,
            IntKind::Medium => 24,
            IntKind::Int => 32,
            IntKind::Big => 64,
        }
    }

    pub fn range(self, unsigned: bool) -> (i128, i128) {
        let b = self.bits();
        if unsigned {
            (0, (1i128 << b) - 1)
        } else {
            (-(1i128 << (b - 1)), (1i128 << (b - 1)) - 1)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextKind {
    Tiny,
    Text,
    Medium,
    Long,
}

impl TextKind {
    fn max_bytes(self) -> u32 {
        match self {
            TextKind::Tiny => 255,
            TextKind::Text => 65535,
            TextKind::Medium | TextKind::Long => MAX_ROW_BYTES as u32,
        }
    }
    fn prefix(self) -> &'static str {
        match self {
            TextKind::Tiny => "tiny",
            TextKind::Text => "",
            TextKind::Medium => "medium",
            TextKind::Long => "long",
        }
    }
}

/// Largest DECIMAL precision (digits) stored exactly in a 64-bit integer.
pub const MAX_DECIMAL_PRECISION: u8 = 18;
/// Most characters in a CHAR column (MySQL's limit).
pub const MAX_CHAR_LEN: u32 = 255;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlType {
    Int { kind: IntKind, unsigned: bool, width: Option<u32> },
    Float,
    Double,
    Decimal { p: u8, s: u8 },
    Char(u32),
    Varchar(u32),
    Text(TextKind),
    Binary(u32),
    Varbinary(u32),
    Blob(TextKind),
    Date,
    Datetime(u8),
    Timestamp(u8),
}

impl std::fmt::Display for SqlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            SqlType::Int { kind, unsigned, width } => {
                f.write_str(kind.name())?;
                if let Some(w) = width {
                    write!(f, "({w})")?;
                }
                if unsigned {
                    f.write_str(" unsigned")?;
                }
                Ok(())
            }
            SqlType::Float => f.write_str("float"),
            SqlType::Double => f.write_str("double"),
            SqlType::Decimal { p, s } => write!(f, "decimal({p},{s})"),
            SqlType::Char(n) => write!(f, "char({n})"),
            SqlType::Varchar(n) => write!(f, "varchar({n})"),
            SqlType::Text(k) => write!(f, "{}text", k.prefix()),
            SqlType::Binary(n) => write!(f, "binary({n})"),
            SqlType::Varbinary(n) => write!(f, "varbinary({n})"),
            SqlType::Blob(k) => write!(f, "{}blob", k.prefix()),
            SqlType::Date => f.write_str("date"),
            SqlType::Datetime(0) => f.write_str("datetime"),
            SqlType::Datetime(p) => write!(f, "datetime({p})"),
            SqlType::Timestamp(0) => f.write_str("timestamp"),
            SqlType::Timestamp(p) => write!(f, "timestamp({p})"),
        }
    }
}

fn char_len(l: &Option<CharacterLength>, default: u32) -> SqlResult<u32> {
    match l {
        None => Ok(default),
        Some(CharacterLength::IntegerLength { length, .. }) => {
            u32::try_from(*length).map_err(|_| SqlError::new(code::TOO_BIG_ROWSIZE, "column length too big"))
        }
        Some(CharacterLength::Max) => Err(SqlError::not_supported("VARCHAR(MAX)")),
    }
}

fn decimal(info: &ExactNumberInfo) -> SqlResult<SqlType> {
    let (p, s) = match *info {
        ExactNumberInfo::None => (10, 0),
        ExactNumberInfo::Precision(p) => (p, 0),
        ExactNumberInfo::PrecisionAndScale(p, s) => (p, u64::try_from(s).unwrap_or(u64::MAX)),
    };
    if p == 0 || p > 65 || s > 30 || s > p {
        return Err(SqlError::new(code::PARSE, format!("Invalid DECIMAL precision {p} or scale {s}")));
    }
    if p > u64::from(MAX_DECIMAL_PRECISION) {
        return Err(SqlError::not_supported(format!("DECIMAL with precision above {MAX_DECIMAL_PRECISION} (got {p})")));
    }
    Ok(SqlType::Decimal { p: p as u8, s: s as u8 })
}

fn fsp(p: &Option<u64>) -> SqlResult<u8> {
    match p {
        None => Ok(0),
        Some(p @ 0..=6) => Ok(*p as u8),
        Some(p) => Err(SqlError::new(code::PARSE, format!("Too-big precision {p} specified; maximum is 6"))),
    }
}

impl SqlType {
    /// The SQL type of a CREATE TABLE column definition.
    pub fn from_ast(dt: &DataType) -> SqlResult<SqlType> {
        use DataType as D;
        let int = |kind, unsigned, width: &Option<u64>| SqlType::Int { kind, unsigned, width: width.map(|w| w as u32) };
        Ok(match dt {
            D::TinyInt(w) => int(IntKind::Tiny, false, w),
            D::TinyIntUnsigned(w) => int(IntKind::Tiny, true, w),
            D::SmallInt(w) | D::Int2(w) => int(IntKind::Small, false, w),
            D::SmallIntUnsigned(w) | D::Int2Unsigned(w) => int(IntKind::Small, true, w),
            D::MediumInt(w) => int(IntKind::Medium, false, w),
            D::MediumIntUnsigned(w) => int(IntKind::Medium, true, w),
            D::Int(w) | D::Integer(w) | D::Int4(w) => int(IntKind::Int, false, w),
            D::IntUnsigned(w) | D::IntegerUnsigned(w) | D::Int4Unsigned(w) => int(IntKind::Int, true, w),
            D::BigInt(w) | D::Int8(w) => int(IntKind::Big, false, w),
            D::BigIntUnsigned(w) | D::Int8Unsigned(w) => int(IntKind::Big, true, w),
            D::Bool | D::Boolean => SqlType::Int { kind: IntKind::Tiny, unsigned: false, width: Some(1) },
            D::Float(_) | D::FloatUnsigned(_) | D::Float4 => SqlType::Float,
            D::Double(_)
            | D::DoubleUnsigned(_)
            | D::DoublePrecision
            | D::DoublePrecisionUnsigned
            | D::Real
            | D::RealUnsigned
            | D::Float8 => SqlType::Double,
            D::Decimal(i) | D::DecimalUnsigned(i) | D::Numeric(i) | D::Dec(i) | D::DecUnsigned(i) => decimal(i)?,
            D::Char(l) | D::Character(l) => {
                let n = char_len(l, 1)?;
                if n > MAX_CHAR_LEN {
                    return Err(SqlError::new(
                        code::TOO_BIG_ROWSIZE,
                        format!("Column length too big (max = {MAX_CHAR_LEN}); use BLOB or TEXT instead"),
                    ));
                }
                SqlType::Char(n)
            }
            D::Varchar(l) | D::CharVarying(l) | D::CharacterVarying(l) | D::Nvarchar(l) => {
                if l.is_none() {
                    return Err(SqlError::parse("VARCHAR needs a length"));
                }
                SqlType::Varchar(char_len(l, 0)?)
            }
            D::Text => SqlType::Text(TextKind::Text),
            D::TinyText => SqlType::Text(TextKind::Tiny),
            D::MediumText => SqlType::Text(TextKind::Medium),
            D::LongText => SqlType::Text(TextKind::Long),
            D::Binary(n) => SqlType::Binary(n.unwrap_or(1).min(u64::from(u32::MAX)) as u32),
            D::Varbinary(n) => {
                let Some(n) = n else { return Err(SqlError::parse("VARBINARY needs a length")) };
                let n: u32 = n.to_string().parse().map_err(|_| SqlError::not_supported("VARBINARY(MAX)"))?;
                SqlType::Varbinary(n)
            }
            D::Blob(_) => SqlType::Blob(TextKind::Text),
            D::TinyBlob => SqlType::Blob(TextKind::Tiny),
            D::MediumBlob => SqlType::Blob(TextKind::Medium),
            D::LongBlob => SqlType::Blob(TextKind::Long),
            D::Date => SqlType::Date,
            D::Datetime(p) => SqlType::Datetime(fsp(p)?),
            D::Timestamp(p, _) => SqlType::Timestamp(fsp(p)?),
            other => return Err(SqlError::not_supported(format!("column type {other}"))),
        })
    }

    /// Parses the canonical text written by `Display` (as stored in `Column::sql_type`).
    pub fn parse_stored(text: &str) -> Option<SqlType> {
        let t = text.trim().to_ascii_lowercase();
        let (t, unsigned) = match t.strip_suffix(" unsigned") {
            Some(rest) => (rest.to_string(), true),
            None => (t, false),
        };
        let (name, args) = match t.split_once('(') {
            Some((n, rest)) => (n.to_string(), Some(rest.trim_end_matches(')').to_string())),
            None => (t.clone(), None),
        };
        let num = |s: &str| s.trim().parse::<u32>().ok();
        let one = || args.as_deref().and_then(num);
        let int = |kind| Some(SqlType::Int { kind, unsigned, width: one() });
        match name.as_str() {
            "tinyint" => int(IntKind::Tiny),
            "smallint" => int(IntKind::Small),
            "mediumint" => int(IntKind::Medium),
            "int" => int(IntKind::Int),
            "bigint" => int(IntKind::Big),
            "float" => Some(SqlType::Float),
            "double" => Some(SqlType::Double),
            "decimal" => {
                let a = args?;
                let (p, s) = a.split_once(',')?;
                Some(SqlType::Decimal { p: num(p)? as u8, s: num(s)? as u8 })
            }
            "char" => Some(SqlType::Char(one()?)),
            "varchar" => Some(SqlType::Varchar(one()?)),
            "tinytext" => Some(SqlType::Text(TextKind::Tiny)),
            "text" => Some(SqlType::Text(TextKind::Text)),
            "mediumtext" => Some(SqlType::Text(TextKind::Medium)),
            "longtext" => Some(SqlType::Text(TextKind::Long)),
            "binary" => Some(SqlType::Binary(one()?)),
            "varbinary" => Some(SqlType::Varbinary(one()?)),
            "tinyblob" => Some(SqlType::Blob(TextKind::Tiny)),
            "blob" => Some(SqlType::Blob(TextKind::Text)),
            "mediumblob" => Some(SqlType::Blob(TextKind::Medium)),
            "longblob" => Some(SqlType::Blob(TextKind::Long)),
            "date" => Some(SqlType::Date),
            "datetime" => Some(SqlType::Datetime(one().unwrap_or(0) as u8)),
            "timestamp" => Some(SqlType::Timestamp(one().unwrap_or(0) as u8)),
            _ => None,
        }
    }

    /// The SQL type of a catalog column: its recorded SQL type, or one derived from the storage
    /// type for tables made through the native client.
    pub fn of_column(c: &Column) -> SqlType {
        if let Some(t) = SqlType::parse_stored(&c.sql_type) {
            return t;
        }
        match c.ty {
            ColumnType::Int => SqlType::Int { kind: IntKind::Big, unsigned: false, width: None },
            ColumnType::Uint => SqlType::Int { kind: IntKind::Big, unsigned: true, width: None },
            ColumnType::Bool => SqlType::Int { kind: IntKind::Tiny, unsigned: false, width: Some(1) },
            ColumnType::Float => SqlType::Double,
            ColumnType::Text => SqlType::Varchar(c.max_len),
            ColumnType::Bytes => SqlType::Varbinary(c.max_len),
        }
    }

    /// Storage type and longest value in bytes.
    pub fn storage(self) -> SqlResult<(ColumnType, u32)> {
        let cap = |n: u64| -> SqlResult<u32> {
            if n > MAX_ROW_BYTES as u64 {
                Err(SqlError::new(
                    code::TOO_BIG_ROWSIZE,
                    format!("Column length too big: at most {MAX_ROW_BYTES} bytes per row; use a shorter type"),
                ))
            } else {
                Ok(n as u32)
            }
        };
        Ok(match self {
            SqlType::Int { unsigned: true, .. } => (ColumnType::Uint, 0),
            SqlType::Int { .. } | SqlType::Decimal { .. } => (ColumnType::Int, 0),
            SqlType::Float | SqlType::Double => (ColumnType::Float, 0),
            SqlType::Char(n) | SqlType::Varchar(n) => (ColumnType::Text, cap(u64::from(n.max(1)) * 4)?),
            SqlType::Text(k) => (ColumnType::Text, k.max_bytes()),
            SqlType::Binary(n) | SqlType::Varbinary(n) => (ColumnType::Bytes, cap(u64::from(n.max(1)))?),
            SqlType::Blob(k) => (ColumnType::Bytes, k.max_bytes()),
            SqlType::Date | SqlType::Datetime(_) | SqlType::Timestamp(_) => (ColumnType::Text, 32),
        })
    }

    pub fn is_text(self) -> bool {
        matches!(self, SqlType::Char(_) | SqlType::Varchar(_) | SqlType::Text(_))
    }

    /// Converts a value for a column of this type as INSERT/UPDATE do in strict mode.
    /// `row` is the 1-based row number for messages.
    pub fn store(self, col: &str, v: &Val, row: usize) -> SqlResult<Value> {
        let out_of_range = || {
            SqlError::new(code::WARN_DATA_OUT_OF_RANGE, format!("Out of range value for column '{col}' at row {row}"))
        };
        let too_long = || SqlError::new(code::DATA_TOO_LONG, format!("Data too long for column '{col}' at row {row}"));
        if v.is_null() {
            return Ok(Value::Null);
        }
        match self {
            SqlType::Int { kind, unsigned, .. } => {
                let n: i128 = match v {
                    Val::Int(i) => i128::from(*i),
                    Val::UInt(u) => i128::from(*u),
                    Val::Dec(d) => d.rescale(0).ok_or_else(out_of_range)?.m,
                    Val::Float(f) => {
                        if !f.is_finite() || f.abs() > 1e30 {
                            return Err(out_of_range());
                        }
                        f.round() as i128
                    }
                    Val::Str(s) => parse_int_text(s).ok_or_else(|| wrong_value("integer", s, col, row))?,
                    Val::Bytes(b) => {
                        let s = String::from_utf8_lossy(b);
                        parse_int_text(&s).ok_or_else(|| wrong_value("integer", &s, col, row))?
                    }
                    Val::Null => unreachable!("handled above"),
                };
                let (lo, hi) = kind.range(unsigned);
                if n < lo || n > hi {
                    return Err(out_of_range());
                }
                Ok(if unsigned { Value::Uint(n as u64) } else { Value::Int(n as i64) })
            }
            SqlType::Float | SqlType::Double => {
                let f = match v {
                    Val::Str(s) => s.trim().parse::<f64>().map_err(|_| wrong_value("double", s, col, row))?,
                    other => other.to_f64().unwrap_or(0.0),
                };
                if !f.is_finite() || (self == SqlType::Float && f.abs() > f64::from(f32::MAX)) {
                    return Err(out_of_range());
                }
                Ok(Value::Float(if self == SqlType::Float { f64::from(f as f32) } else { f }))
            }
            SqlType::Decimal { p, s } => {
                let d = match v {
                    Val::Int(_) | Val::UInt(_) | Val::Dec(_) => v.to_dec(),
                    Val::Float(f) => Dec::from_f64(*f, s),
                    Val::Str(t) => Some(Dec::parse(t).ok_or_else(|| wrong_value("decimal", t, col, row))?),
                    Val::Bytes(b) => {
                        let t = String::from_utf8_lossy(b);
                        Some(Dec::parse(&t).ok_or_else(|| wrong_value("decimal", &t, col, row))?)
                    }
                    Val::Null => None,
                };
                let d = d.and_then(|d| d.rescale(s)).ok_or_else(out_of_range)?;
                if d.int_digits() > u32::from(p - s) {
                    return Err(out_of_range());
                }
                Ok(Value::Int(i64::try_from(d.m).map_err(|_| out_of_range())?))
            }
            SqlType::Char(_) | SqlType::Varchar(_) | SqlType::Text(_) => {
                let s = match v {
                    Val::Str(s) => s.clone(),
                    Val::Bytes(b) => String::from_utf8(b.clone()).map_err(|_| {
                        SqlError::new(
                            code::TRUNCATED_WRONG_VALUE_FOR_FIELD,
                            format!("Incorrect string value for column '{col}' at row {row}"),
                        )
                    })?,
                    other => other.to_string_lossy().unwrap_or_default(),
                };
                let ok = match self {
                    SqlType::Char(n) | SqlType::Varchar(n) => s.chars().count() <= n as usize,
                    SqlType::Text(k) => s.len() <= k.max_bytes() as usize,
                    _ => true,
                };
                if !ok {
                    return Err(too_long());
                }
                Ok(Value::Text(s))
            }
            SqlType::Binary(_) | SqlType::Varbinary(_) | SqlType::Blob(_) => {
                let b = match v {
                    Val::Bytes(b) => b.clone(),
                    other => other.to_text().unwrap_or_default(),
                };
                let max = match self {
                    SqlType::Blob(k) => k.max_bytes() as usize,
                    SqlType::Binary(n) | SqlType::Varbinary(n) => n as usize,
                    _ => 0,
                };
                if b.len() > max {
                    return Err(too_long());
                }
                Ok(Value::Bytes(b))
            }
            SqlType::Date | SqlType::Datetime(_) | SqlType::Timestamp(_) => {
                let text = match v {
                    Val::Int(_) | Val::UInt(_) => v.to_string_lossy().unwrap_or_default(),
                    other => other.to_string_lossy().unwrap_or_default(),
                };
                let what = if self == SqlType::Date { "date" } else { "datetime" };
                let bad = || {
                    SqlError::new(
                        code::TRUNCATED_WRONG_VALUE,
                        format!("Incorrect {what} value: '{text}' for column '{col}' at row {row}"),
                    )
                };
                let dt = parse_datetime(&text).ok_or_else(bad)?;
                Ok(Value::Text(match self {
                    SqlType::Date => dt.date_string(),
                    SqlType::Datetime(p) | SqlType::Timestamp(p) => dt.datetime_string(p),
                    _ => unreachable!("date types only"),
                }))
            }
        }
    }

    /// The SQL value of a stored value.
    pub fn load(self, v: &Value) -> Val {
        self.load_field(Field::from(v))
    }

    /// [`SqlType::load`] of a value read straight from an encoded row.
    /// Inline: called per column of every row a range read decodes (`SqlRows`).
    #[inline]
    pub fn load_field(self, f: Field<'_>) -> Val {
        match (self, f) {
            (_, Field::Null) => Val::Null,
            (SqlType::Decimal { s, .. }, Field::Int(m)) => Val::Dec(Dec::new(i128::from(m), s)),
            (_, Field::Int(i)) => Val::Int(i),
            (_, Field::Uint(u)) => Val::UInt(u),
            (_, Field::Float(f)) => Val::Float(f),
            (_, Field::Text(s)) => Val::Str(s.to_owned()),
            (_, Field::Bytes(b)) => Val::Bytes(b.to_vec()),
            (_, Field::Bool(b)) => Val::bool(b),
        }
    }

    /// [`SqlType::load`] taking the value: its text or bytes move instead of being copied.
    pub fn load_owned(self, v: Value) -> Val {
        match v {
            Value::Text(s) => Val::Str(s),
            Value::Bytes(b) => Val::Bytes(b),
            v => self.load(&v),
        }
    }

    /// A storage value for a pushed-down comparison with this column, only when the conversion
    /// is exact (so the pushed filter means exactly what the SQL comparison means).
    pub fn exact_storage(self, v: &Val) -> Option<Value> {
        match (self, v) {
            (SqlType::Int { kind, unsigned, .. }, Val::Int(_) | Val::UInt(_)) => {
                let n = v.to_dec()?.m;
                let (lo, hi) = kind.range(unsigned);
                if n < lo || n > hi {
                    return None;
                }
                Some(if unsigned { Value::Uint(n as u64) } else { Value::Int(n as i64) })
            }
            (SqlType::Float | SqlType::Double, Val::Float(f)) => Some(Value::Float(*f)),
            (SqlType::Double, Val::Int(i)) => Some(Value::Float(*i as f64)).filter(|_| i.unsigned_abs() < (1 << 53)),
            (SqlType::Decimal { p, s }, Val::Int(_) | Val::UInt(_) | Val::Dec(_)) => {
                let d = v.to_dec()?;
                let r = d.rescale(s)?;
                if r.rescale(d.s)? != d || r.int_digits() > u32::from(p - s) {
                    return None;
                }
                Some(Value::Int(i64::try_from(r.m).ok()?))
            }
            (SqlType::Char(_) | SqlType::Varchar(_) | SqlType::Text(_), Val::Str(s)) => Some(Value::Text(s.clone())),
            (SqlType::Binary(_) | SqlType::Varbinary(_) | SqlType::Blob(_), Val::Bytes(b)) => {
                Some(Value::Bytes(b.clone()))
            }
            (SqlType::Binary(_) | SqlType::Varbinary(_) | SqlType::Blob(_), Val::Str(s)) => {
                Some(Value::Bytes(s.clone().into_bytes()))
            }
            (SqlType::Date, Val::Str(s)) => {
                let dt = parse_datetime(s)?;
                (dt.date_string() == *s).then(|| Value::Text(s.clone()))
            }
            (SqlType::Datetime(p) | SqlType::Timestamp(p), Val::Str(s)) => {
                let dt = parse_datetime(s)?;
                let c = dt.datetime_string(p);
                (c == *s).then_some(Value::Text(c))
            }
            _ => None,
        }
    }

    /// Converts a storage column type's value for display when no SQL type was recorded.
    pub fn wire(self) -> WireType {
        match self {
            SqlType::Int { kind, unsigned, width } => WireType::Int { kind, unsigned, width },
            SqlType::Float => WireType::Float,
            SqlType::Double => WireType::Double,
            SqlType::Decimal { p, s } => WireType::Decimal { p, s },
            SqlType::Char(n) | SqlType::Varchar(n) => WireType::Str { len: n.saturating_mul(4) },
            SqlType::Text(k) => WireType::Blob { len: k.max_bytes(), binary: false },
            SqlType::Binary(n) | SqlType::Varbinary(n) => WireType::Bytes { len: n },
            SqlType::Blob(k) => WireType::Blob { len: k.max_bytes(), binary: true },
            SqlType::Date => WireType::Date,
            SqlType::Datetime(p) => WireType::Datetime { fsp: p, timestamp: false },
            SqlType::Timestamp(p) => WireType::Datetime { fsp: p, timestamp: true },
        }
    }
}

fn wrong_value(what: &str, text: &str, col: &str, row: usize) -> SqlError {
    SqlError::new(
        code::TRUNCATED_WRONG_VALUE_FOR_FIELD,
        format!("Incorrect {what} value: '{text}' for column '{col}' at row {row}"),
    )
}

fn parse_int_text(s: &str) -> Option<i128> {
    let t = s.trim();
    if let Ok(i) = t.parse::<i128>() {
        return Some(i);
    }
    let d = Dec::parse(t)?;
    Some(d.rescale(0)?.m)
}

/// Rows read as the SQL values of a table's column types (`types`, in column order), decoded
/// straight from the data nodes' encoded rows: no [`Value`] row is built on the way. Columns
/// past the end of `types` are left out, as zipping a stored row with them leaves them out.
pub struct SqlRows<'a> {
    types: &'a [SqlType],
    /// Where the wanted columns of the table's rows are.
    reader: FieldReader,
}

impl<'a> SqlRows<'a> {
    /// `table`'s rows with only `columns` decoded (empty: all of them); the others come out
    /// NULL.
    pub fn new(table: &Table, types: &'a [SqlType], columns: &[u32]) -> SqlRows<'a> {
        let wanted = |i: usize| i < types.len() && (columns.is_empty() || columns.contains(&(i as u32)));
        SqlRows { types, reader: FieldReader::new(table, wanted) }
    }
}

impl RowDecoder for SqlRows<'_> {
    type Row = Vec<Val>;

    fn decode(&self, table: &Table, data: &[u8]) -> Result<Vec<Val>, ShoalError> {
        // Built from a closure: `vec![Val::Null; n]` clones through `Val::clone`, a match per
        // column of every row (2% of a SQL node's instructions on sysbench's ranges).
        let mut out: Vec<Val> = std::iter::repeat_with(|| Val::Null).take(self.types.len()).collect();
        let mut load = |i: usize, f| out[i] = self.types[i].load_field(f);
        if table.id == self.reader.table() {
            self.reader.read(data, load)?;
        } else {
            // Not the table this was made for (ALTER TABLE put another under the name since the
            // statement was planned): every column, as a plain decoder.
            codec::decode_fields(table, data, |i| i < self.types.len(), &mut load)?;
        }
        Ok(out)
    }

    fn convert(&self, row: Vec<Value>) -> Vec<Val> {
        row.into_iter().zip(self.types).map(|(v, ty)| ty.load_owned(v)).collect()
    }
}

/// What the result-set metadata says about a column, and how the binary protocol encodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireType {
    Int { kind: IntKind, unsigned: bool, width: Option<u32> },
    Float,
    Double,
    Decimal { p: u8, s: u8 },
    Str { len: u32 },
    Blob { len: u32, binary: bool },
    Bytes { len: u32 },
    Date,
    Datetime { fsp: u8, timestamp: bool },
    Null,
}

impl WireType {
    /// A type that fits a computed value (for expressions whose type the binder did not infer).
    pub fn of_val(v: &Val) -> WireType {
        match v {
            Val::Null => WireType::Null,
            Val::Int(_) => WireType::Int { kind: IntKind::Big, unsigned: false, width: None },
            Val::UInt(_) => WireType::Int { kind: IntKind::Big, unsigned: true, width: None },
            Val::Float(_) => WireType::Double,
            Val::Dec(d) => WireType::Decimal { p: 65, s: d.s },
            Val::Str(s) => WireType::Str { len: (s.len() as u32).max(1) },
            Val::Bytes(b) => WireType::Bytes { len: (b.len() as u32).max(1) },
        }
    }
}

/// A calendar date and time of day (no time zone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DateTime {
    pub year: u32,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub micros: u32,
}

impl DateTime {
    pub fn date_string(&self) -> String {
        format!("{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }

    pub fn datetime_string(&self, fsp: u8) -> String {
        let mut s = format!("{} {:02}:{:02}:{:02}", self.date_string(), self.hour, self.minute, self.second);
        if fsp > 0 {
            let frac = format!("{:06}", self.micros);
            s.push('.');
            s.push_str(&frac[..fsp.min(6) as usize]);
        }
        s
    }
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Parses `YYYY-MM-DD`, `YYYY-MM-DD hh:mm:ss[.ffffff]` (or with `T`), and `YYYYMMDD[hhmmss]`.
/// The zero date `0000-00-00` is refused (strict mode).
pub fn parse_datetime(text: &str) -> Option<DateTime> {
    let t = text.trim();
    let (date, time) = match t.find([' ', 'T']) {
        Some(i) => (&t[..i], Some(t[i + 1..].trim())),
        None => (t, None),
    };
    let num =
        |s: &str| -> Option<u32> { (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())? };
    let (year, month, day, mut rest_time) = if date.contains('-') {
        let mut p = date.split('-');
        let (y, m, d) = (num(p.next()?)?, num(p.next()?)?, num(p.next()?)?);
        if p.next().is_some() {
            return None;
        }
        (y, m, d, None)
    } else if date.len() == 8 || date.len() == 14 {
        num(date)?;
        let y = num(&date[0..4])?;
        let m = num(&date[4..6])?;
        let d = num(&date[6..8])?;
        (y, m, d, (date.len() == 14).then(|| &date[8..]))
    } else {
        return None;
    };
    if !(1..=9999).contains(&year) || !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let mut dt = DateTime { year, month, day, hour: 0, minute: 0, second: 0, micros: 0 };
    if let Some(compact) = rest_time.take() {
        dt.hour = num(&compact[0..2])?;
        dt.minute = num(&compact[2..4])?;
        dt.second = num(&compact[4..6])?;
    } else if let Some(time) = time {
        let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
        let mut p = hms.split(':');
        dt.hour = num(p.next()?)?;
        dt.minute = p.next().map(num).unwrap_or(Some(0))?;
        dt.second = p.next().map(num).unwrap_or(Some(0))?;
        if p.next().is_some() {
            return None;
        }
        if !frac.is_empty() {
            if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let mut f = frac.to_string();
            f.truncate(6);
            while f.len() < 6 {
                f.push('0');
            }
            dt.micros = f.parse().ok()?;
        }
    }
    if dt.hour > 23 || dt.minute > 59 || dt.second > 59 {
        return None;
    }
    Some(dt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_types_round_trip() {
        let types = [
            SqlType::Int { kind: IntKind::Tiny, unsigned: false, width: Some(1) },
            SqlType::Int { kind: IntKind::Big, unsigned: true, width: None },
            SqlType::Decimal { p: 10, s: 2 },
            SqlType::Varchar(20),
            SqlType::Char(3),
            SqlType::Text(TextKind::Medium),
            SqlType::Blob(TextKind::Text),
            SqlType::Varbinary(16),
            SqlType::Date,
            SqlType::Datetime(3),
            SqlType::Timestamp(0),
            SqlType::Float,
            SqlType::Double,
        ];
        for t in types {
            assert_eq!(SqlType::parse_stored(&t.to_string()), Some(t), "{t}");
        }
    }

    #[test]
    fn store_checks_ranges_lengths_and_dates() {
        let tiny = SqlType::Int { kind: IntKind::Tiny, unsigned: false, width: None };
        assert_eq!(tiny.store("c", &Val::Int(127), 1).unwrap(), Value::Int(127));
        assert_eq!(tiny.store("c", &Val::Int(128), 1).unwrap_err().code, 1264);
        let u = SqlType::Int { kind: IntKind::Int, unsigned: true, width: None };
        assert_eq!(u.store("c", &Val::Int(-1), 1).unwrap_err().code, 1264);
        assert_eq!(u.store("c", &Val::Str("42".into()), 1).unwrap(), Value::Uint(42));
        assert_eq!(u.store("c", &Val::Str("x".into()), 1).unwrap_err().code, 1366);
        let dec = SqlType::Decimal { p: 5, s: 2 };
        assert_eq!(dec.store("c", &Val::Str("123.456".into()), 1).unwrap(), Value::Int(12346));
        assert_eq!(dec.store("c", &Val::Int(1000), 1).unwrap_err().code, 1264);
        assert_eq!(dec.load(&Value::Int(12346)).to_string_lossy().unwrap(), "123.46");
        let vc = SqlType::Varchar(3);
        assert_eq!(vc.store("c", &Val::Str("äöü".into()), 1).unwrap(), Value::Text("äöü".into()));
        assert_eq!(vc.store("c", &Val::Str("abcd".into()), 1).unwrap_err().code, 1406);
        assert_eq!(
            SqlType::Date.store("c", &Val::Str("2024-02-29".into()), 1).unwrap(),
            Value::Text("2024-02-29".into())
        );
        assert_eq!(SqlType::Date.store("c", &Val::Str("2023-02-29".into()), 1).unwrap_err().code, 1292);
        assert_eq!(
            SqlType::Datetime(0).store("c", &Val::Str("2024-01-02T03:04:05.9".into()), 1).unwrap(),
            Value::Text("2024-01-02 03:04:05".into())
        );
        assert_eq!(
            SqlType::Datetime(3).store("c", &Val::Str("2024-01-02".into()), 1).unwrap(),
            Value::Text("2024-01-02 00:00:00.000".into())
        );
        assert_eq!(SqlType::Float.store("c", &Val::Float(1.1), 1).unwrap(), Value::Float(f64::from(1.1f32)));
    }

    #[test]
    fn rows_decode_straight_into_sql_values_as_through_stored_values() {
        use shoal_proto::TableSpec;
        let col = |name: &str, ty| Column { max_len: 100, ..Column::new(name, ty).nullable() };
        let spec = TableSpec {
            name: "d.t".into(),
            columns: vec![
                Column::new("id", ColumnType::Int),
                col("u", ColumnType::Uint),
                col("price", ColumnType::Int),
                col("f", ColumnType::Float),
                col("s", ColumnType::Text),
                col("b", ColumnType::Bytes),
                col("flag", ColumnType::Bool),
                col("extra", ColumnType::Text),
            ],
            primary_key: vec![0],
            partition_key: vec![],
        };
        let (spec, hidden_pk) = spec.normalize().unwrap();
        let table = Table { id: 1, spec, partition_count: 2, schema_version: 1, hidden_pk, ..Default::default() };
        // The SQL node's types of the first seven columns: `extra` is past them.
        let types = [
            SqlType::Int { kind: IntKind::Big, unsigned: false, width: None },
            SqlType::Int { kind: IntKind::Big, unsigned: true, width: None },
            SqlType::Decimal { p: 10, s: 2 },
            SqlType::Double,
            SqlType::Varchar(100),
            SqlType::Varbinary(100),
            SqlType::Int { kind: IntKind::Tiny, unsigned: false, width: Some(1) },
        ];
        let rows = SqlRows::new(&table, &types, &[]);
        let stored = [
            vec![
                Value::Int(-7),
                Value::Uint(u64::MAX),
                Value::Int(12345),
                Value::Float(2.5),
                Value::Text("äöü".into()),
                Value::Bytes(vec![0, 255]),
                Value::Bool(true),
                Value::Text("x".into()),
            ],
            vec![
                Value::Int(1),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
            ],
        ];
        // Some columns only (the rest NULL), and rows of a table other than the one the
        // decoder was made for (every column).
        let some = SqlRows::new(&table, &types, &[4, 0]);
        let other = Table { id: 2, ..table.clone() };
        for row in stored {
            let data = codec::encode_row(&table, &row).unwrap();
            let direct = rows.decode(&table, &data).unwrap();
            assert_eq!(direct, rows.convert(codec::decode_row(&table, &data).unwrap()));
            assert_eq!(direct.len(), types.len());
            let part = some.decode(&table, &data).unwrap();
            for (i, v) in part.iter().enumerate() {
                assert_eq!(*v, if i == 0 || i == 4 { direct[i].clone() } else { Val::Null }, "column {i}");
            }
            assert_eq!(some.decode(&other, &data).unwrap(), direct);
        }
        let first = rows
            .decode(
                &table,
                &codec::encode_row(
                    &table,
                    &[
                        Value::Int(3),
                        Value::Null,
                        Value::Int(150),
                        Value::Null,
                        Value::Null,
                        Value::Null,
                        Value::Null,
                        Value::Null,
                    ],
                )
                .unwrap(),
            )
            .unwrap();
        assert_eq!(first[2].to_string_lossy().unwrap(), "1.50");
        // A damaged row is an error.
        assert!(rows.decode(&table, &[0]).is_err());
    }

    #[test]
    fn pushdown_values_are_exact_or_absent() {
        let int = SqlType::Int { kind: IntKind::Int, unsigned: false, width: None };
        assert_eq!(int.exact_storage(&Val::Int(5)), Some(Value::Int(5)));
        assert_eq!(int.exact_storage(&Val::Float(2.5)), None);
        assert_eq!(int.exact_storage(&Val::Int(1 << 40)), None);
        let dec = SqlType::Decimal { p: 10, s: 2 };
        assert_eq!(dec.exact_storage(&Val::Dec(Dec::parse("1.5").unwrap())), Some(Value::Int(150)));
        assert_eq!(dec.exact_storage(&Val::Dec(Dec::parse("1.555").unwrap())), None);
        assert_eq!(SqlType::Date.exact_storage(&Val::Str("2024-01-01".into())), Some(Value::Text("2024-01-01".into())));
        assert_eq!(SqlType::Date.exact_storage(&Val::Str("2024-1-1".into())), None);
        assert_eq!(SqlType::Varchar(5).exact_storage(&Val::Int(1)), None);
    }
}

//! Values inside the SQL node: what expressions compute on. Storage values
//! (`shoal_proto::Value`) convert to and from these through the column's SQL type
//! (`crate::types`). Comparison and arithmetic follow MySQL: integers stay exact, exact decimals
//! (`Dec`) stay exact, anything with a float becomes a float, strings compared with numbers are
//! read as numbers. Text compares byte-wise (the `utf8mb4_bin` collation).

use std::cmp::Ordering;
use std::fmt::Write as _;

/// An exact decimal: `mantissa / 10^scale`. Packed to 8-byte alignment (an `i128` alone would
/// align it, and so [`Val`], to 16 and make a `Val` half again as big as a storage value): with
/// `Val` and `shoal_proto::Value` the same size, a row read from storage becomes SQL values in
/// its own allocation (`Vec::into_iter().map().collect()` reuses it), which a SELECT does for
/// every row it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, packed(8))]
pub struct Dec {
    pub m: i128,
    pub s: u8,
}

/// Largest decimal scale the SQL node computes with (MySQL's limit is 30).
pub const MAX_DEC_SCALE: u8 = 30;

fn pow10(n: u8) -> Option<i128> {
    10i128.checked_pow(u32::from(n))
}

impl Dec {
    pub fn new(m: i128, s: u8) -> Dec {
        Dec { m, s }
    }

    /// The same number with `s` digits after the point (rounding half away from zero).
    pub fn rescale(self, s: u8) -> Option<Dec> {
        if s >= self.s {
            Some(Dec { m: self.m.checked_mul(pow10(s - self.s)?)?, s })
        } else {
            let d = pow10(self.s - s)?;
            let q = self.m / d;
            let r = self.m % d;
            let q = if r.abs() * 2 >= d { q + self.m.signum() } else { q };
            Some(Dec { m: q, s })
        }
    }

    pub fn to_f64(self) -> f64 {
        self.m as f64 / 10f64.powi(i32::from(self.s))
    }

    pub fn from_f64(f: f64, s: u8) -> Option<Dec> {
        let scaled = (f * 10f64.powi(i32::from(s))).round();
        (scaled.is_finite() && scaled.abs() < 1e37).then_some(Dec { m: scaled as i128, s })
    }

    /// Parses `[-+]digits[.digits]`; None for anything else.
    pub fn parse(text: &str) -> Option<Dec> {
        let t = text.trim();
        let (neg, t) = match t.as_bytes().first()? {
            b'-' => (true, &t[1..]),
            b'+' => (false, &t[1..]),
            _ => (false, t),
        };
        let (int, frac) = t.split_once('.').unwrap_or((t, ""));
        if (int.is_empty() && frac.is_empty()) || !int.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let frac = if frac.len() > MAX_DEC_SCALE as usize { &frac[..MAX_DEC_SCALE as usize] } else { frac };
        let mut m: i128 = 0;
        for b in int.bytes().chain(frac.bytes()) {
            m = m.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
        }
        Some(Dec { m: if neg { -m } else { m }, s: frac.len() as u8 })
    }

    /// Number of digits before the point (0 for |x| < 1).
    pub fn int_digits(self) -> u32 {
        let Some(d) = pow10(self.s) else { return 0 };
        let mut i = (self.m / d).unsigned_abs();
        let mut n = 0;
        while i > 0 {
            n += 1;
            i /= 10;
        }
        n
    }
}

impl std::fmt::Display for Dec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digits = self.m.unsigned_abs().to_string();
        let s = self.s as usize;
        if self.m < 0 {
            f.write_char('-')?;
        }
        if s == 0 {
            return f.write_str(&digits);
        }
        if digits.len() <= s {
            write!(f, "0.{}{}", "0".repeat(s - digits.len()), digits)
        } else {
            let (a, b) = digits.split_at(digits.len() - s);
            write!(f, "{a}.{b}")
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Null,
    Int(i64),
    UInt(u64),
    Float(f64),
    Dec(Dec),
    Str(String),
    Bytes(Vec<u8>),
}

impl Val {
    pub fn is_null(&self) -> bool {
        matches!(self, Val::Null)
    }

    pub fn bool(b: bool) -> Val {
        Val::Int(i64::from(b))
    }

    pub fn is_numeric(&self) -> bool {
        matches!(self, Val::Int(_) | Val::UInt(_) | Val::Float(_) | Val::Dec(_))
    }

    /// The number MySQL reads from this value (strings: their longest numeric prefix, else 0).
    pub fn to_f64(&self) -> Option<f64> {
        match self {
            Val::Null => None,
            Val::Int(i) => Some(*i as f64),
            Val::UInt(u) => Some(*u as f64),
            Val::Float(f) => Some(*f),
            Val::Dec(d) => Some(d.to_f64()),
            Val::Str(s) => Some(parse_num_prefix(s)),
            Val::Bytes(b) => Some(parse_num_prefix(&String::from_utf8_lossy(b))),
        }
    }

    /// The value as an exact decimal when it is an integer or decimal.
    pub fn to_dec(&self) -> Option<Dec> {
        match self {
            Val::Int(i) => Some(Dec::new(i128::from(*i), 0)),
            Val::UInt(u) => Some(Dec::new(i128::from(*u), 0)),
            Val::Dec(d) => Some(*d),
            _ => None,
        }
    }

    pub fn to_i64(&self) -> Option<i64> {
        match self {
            Val::Int(i) => Some(*i),
            Val::UInt(u) => i64::try_from(*u).ok(),
            Val::Float(f) => (f.is_finite() && f.abs() < 9.2e18).then(|| f.round() as i64),
            Val::Dec(d) => d.rescale(0).and_then(|d| i64::try_from(d.m).ok()),
            Val::Str(_) | Val::Bytes(_) => self.to_f64().and_then(|f| Val::Float(f).to_i64()),
            Val::Null => None,
        }
    }

    /// SQL truth: NULL is unknown (None); numbers are true when non-zero.
    pub fn truth(&self) -> Option<bool> {
        match self {
            Val::Null => None,
            Val::Int(i) => Some(*i != 0),
            Val::UInt(u) => Some(*u != 0),
            Val::Dec(d) => Some(d.m != 0),
            other => other.to_f64().map(|f| f != 0.0),
        }
    }

    /// The text MySQL's text protocol sends for this value (None for NULL).
    pub fn to_text(&self) -> Option<Vec<u8>> {
        Some(match self {
            Val::Null => return None,
            Val::Int(i) => i.to_string().into_bytes(),
            Val::UInt(u) => u.to_string().into_bytes(),
            Val::Float(f) => format_double(*f).into_bytes(),
            Val::Dec(d) => d.to_string().into_bytes(),
            Val::Str(s) => s.clone().into_bytes(),
            Val::Bytes(b) => b.clone(),
        })
    }

    pub fn to_string_lossy(&self) -> Option<String> {
        self.to_text().map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// A byte string that is equal for values GROUP BY / DISTINCT treat as equal.
    pub fn group_key(&self, out: &mut Vec<u8>) {
        match self {
            Val::Null => out.push(0),
            Val::Int(_) | Val::UInt(_) | Val::Dec(_) => {
                out.push(1);
                // Exact numbers: normalize 1, 1.0 and 1.00 to one key.
                let d = self.to_dec().unwrap_or(Dec::new(0, 0));
                let mut d = d;
                while d.s > 0 && d.m % 10 == 0 {
                    d = Dec::new(d.m / 10, d.s - 1);
                }
                out.extend_from_slice(&d.m.to_le_bytes());
                out.push(d.s);
            }
            Val::Float(f) => {
                out.push(2);
                let f = if *f == 0.0 { 0.0 } else { *f };
                out.extend_from_slice(&f.to_bits().to_le_bytes());
            }
            Val::Str(s) => {
                out.push(3);
                out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            Val::Bytes(b) => {
                out.push(3);
                out.extend_from_slice(&(b.len() as u64).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
    }
}

/// MySQL's reading of a string as a number: the longest numeric prefix, 0 when there is none.
pub fn parse_num_prefix(s: &str) -> f64 {
    let t = s.trim_start();
    let b = t.as_bytes();
    let mut end = 0;
    let mut i = 0;
    if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
        i += 1;
    }
    let digits_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i < b.len() && b[i] == b'.' {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
    }
    if i > digits_start && !(i == digits_start + 1 && b[digits_start] == b'.') {
        end = i;
        if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
            let mut j = i + 1;
            if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
                j += 1;
            }
            let exp_start = j;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j > exp_start {
                end = j;
            }
        }
    }
    t[..end].parse().unwrap_or(0.0)
}

/// Formats a double the way MySQL 8 does: shortest round-trip digits, exponent form for very
/// large or very small magnitudes.
pub fn format_double(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let a = f.abs();
    if !(1e-4..1e15).contains(&a) {
        let s = format!("{f:e}");
        // Rust writes 1e20 and 1.5e-7; MySQL writes 1e20 and 1.5e-7 too.
        return s;
    }
    format!("{f}")
}

/// Formats a FLOAT (single precision) column value.
pub fn format_float(f: f64) -> String {
    let g = f as f32;
    if g.is_finite() && g != 0.0 && (1e-4..1e15).contains(&g.abs()) {
        format!("{g}")
    } else {
        format_double(f64::from(g))
    }
}

/// Compares two non-NULL values (None when either is NULL).
pub fn compare(a: &Val, b: &Val) -> Option<Ordering> {
    use Val::*;
    Some(match (a, b) {
        (Null, _) | (_, Null) => return None,
        (Int(x), Int(y)) => x.cmp(y),
        (UInt(x), UInt(y)) => x.cmp(y),
        (Int(x), UInt(y)) => i128::from(*x).cmp(&i128::from(*y)),
        (UInt(x), Int(y)) => i128::from(*x).cmp(&i128::from(*y)),
        (Str(x), Str(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Bytes(x), Bytes(y)) => x.cmp(y),
        (Str(x), Bytes(y)) => x.as_bytes().cmp(y.as_slice()),
        (Bytes(x), Str(y)) => x.as_slice().cmp(y.as_bytes()),
        (Float(_), _) | (_, Float(_)) | (Str(_) | Bytes(_), _) | (_, Str(_) | Bytes(_)) => {
            let (x, y) = (a.to_f64()?, b.to_f64()?);
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
        _ => {
            // Exact numbers of which at least one is a decimal.
            let (x, y) = (a.to_dec()?, b.to_dec()?);
            let s = x.s.max(y.s);
            match (x.rescale(s), y.rescale(s)) {
                (Some(x), Some(y)) => { x.m }.cmp(&{ y.m }), // copies: `Dec` is packed
                _ => x.to_f64().partial_cmp(&y.to_f64()).unwrap_or(Ordering::Equal),
            }
        }
    })
}

/// Total order for ORDER BY: NULL first (MySQL's ascending order), then by value.
pub fn sort_cmp(a: &Val, b: &Val) -> Ordering {
    match (a.is_null(), b.is_null()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        _ => compare(a, b).unwrap_or(Ordering::Equal),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    IntDiv,
    Mod,
}

/// Extra decimal digits of `/` (MySQL's `div_precision_increment`).
pub const DIV_PRECISION_INCREMENT: u8 = 4;

/// Arithmetic with MySQL's result types. Err carries an out-of-range message; division by
/// zero gives NULL (MySQL's default outside strict INSERTs).
pub fn arith(op: ArithOp, a: &Val, b: &Val) -> Result<Val, String> {
    use Val::*;
    if a.is_null() || b.is_null() {
        return Ok(Null);
    }
    let out_of_range = || format!("BIGINT value is out of range in '({} {op:?} {})'", show(a), show(b));
    let is_float = |v: &Val| matches!(v, Float(_) | Str(_) | Bytes(_));
    if is_float(a) || is_float(b) {
        let (x, y) = (a.to_f64().unwrap_or(0.0), b.to_f64().unwrap_or(0.0));
        let r = match op {
            ArithOp::Add => x + y,
            ArithOp::Sub => x - y,
            ArithOp::Mul => x * y,
            ArithOp::Div => {
                if y == 0.0 {
                    return Ok(Null);
                }
                x / y
            }
            ArithOp::IntDiv => {
                if y == 0.0 {
                    return Ok(Null);
                }
                return Val::Float((x / y).trunc()).to_i64().map(Int).ok_or_else(out_of_range);
            }
            ArithOp::Mod => {
                if y == 0.0 {
                    return Ok(Null);
                }
                x % y
            }
        };
        return if r.is_finite() { Ok(Float(r)) } else { Err(out_of_range()) };
    }
    // Both exact.
    let zero = crate::val::Dec::new(0, 0);
    let (x, y) = (a.to_dec().unwrap_or(zero), b.to_dec().unwrap_or(zero));
    let both_int = x.s == 0 && y.s == 0;
    let unsigned = matches!(a, UInt(_)) || matches!(b, UInt(_));
    let as_int = |m: i128| -> Result<Val, String> {
        if unsigned {
            u64::try_from(m).map(UInt).or_else(|_| i64::try_from(m).map(Int)).map_err(|_| out_of_range())
        } else {
            i64::try_from(m).map(Int).map_err(|_| out_of_range())
        }
    };
    match op {
        ArithOp::Add | ArithOp::Sub | ArithOp::Mod => {
            let s = x.s.max(y.s);
            let (xs, ys) = (x.rescale(s).ok_or_else(out_of_range)?, y.rescale(s).ok_or_else(out_of_range)?);
            let m = match op {
                ArithOp::Add => xs.m.checked_add(ys.m),
                ArithOp::Sub => xs.m.checked_sub(ys.m),
                _ => {
                    if ys.m == 0 {
                        return Ok(Null);
                    }
                    xs.m.checked_rem(ys.m)
                }
            }
            .ok_or_else(out_of_range)?;
            if both_int {
                if op == ArithOp::Sub && unsigned && m < 0 {
                    return Err(format!("BIGINT UNSIGNED value is out of range in '({} - {})'", show(a), show(b)));
                }
                as_int(m)
            } else {
                Ok(Dec(crate::val::Dec::new(m, s)))
            }
        }
        ArithOp::Mul => {
            let m = x.m.checked_mul(y.m).ok_or_else(out_of_range)?;
            let s = x.s + y.s;
            if both_int {
                as_int(m)
            } else if s > MAX_DEC_SCALE {
                Ok(Dec(crate::val::Dec::new(m, s).rescale(MAX_DEC_SCALE).ok_or_else(out_of_range)?))
            } else {
                Ok(Dec(crate::val::Dec::new(m, s)))
            }
        }
        ArithOp::Div => {
            if y.m == 0 {
                return Ok(Null);
            }
            let s = (x.s + DIV_PRECISION_INCREMENT).min(MAX_DEC_SCALE);
            // x/y with s digits: (x.m * 10^(s - x.s + y.s)) / y.m, rounded.
            let shift = s + y.s - x.s;
            let num = x.m.checked_mul(pow10(shift).ok_or_else(out_of_range)?).ok_or_else(out_of_range)?;
            let q = num / y.m;
            let r = num % y.m;
            let q = if r.abs() * 2 >= y.m.abs() { q + (num.signum() * y.m.signum()) } else { q };
            Ok(Dec(crate::val::Dec::new(q, s)))
        }
        ArithOp::IntDiv => {
            if y.m == 0 {
                return Ok(Null);
            }
            let s = x.s.max(y.s);
            let (xs, ys) = (x.rescale(s).ok_or_else(out_of_range)?, y.rescale(s).ok_or_else(out_of_range)?);
            as_int(xs.m / ys.m)
        }
    }
}

fn show(v: &Val) -> String {
    match v {
        Val::Str(s) => format!("'{s}'"),
        other => other.to_string_lossy().unwrap_or_else(|| "NULL".into()),
    }
}

/// SQL LIKE with `%` and `_` and a one-character escape (default `\`). Byte-wise (binary
/// collation) but `_` matches one character.
pub fn like(text: &str, pattern: &str, escape: char) -> bool {
    let t: Vec<char> = text.chars().collect();
    let p: Vec<char> = pattern.chars().collect();
    // Iterative matcher with backtracking on the last %.
    let (mut ti, mut pi) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() {
            match p[pi] {
                '%' => {
                    star = Some((pi, ti));
                    pi += 1;
                    continue;
                }
                '_' => {
                    ti += 1;
                    pi += 1;
                    continue;
                }
                c => {
                    let (lit, adv) = if c == escape && pi + 1 < p.len() { (p[pi + 1], 2) } else { (c, 1) };
                    if lit == t[ti] {
                        ti += 1;
                        pi += adv;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, st)) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    while pi < p.len() && p[pi] == '%' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Val {
        Val::Dec(Dec::parse(s).unwrap())
    }

    #[test]
    fn decimals_parse_round_and_print() {
        assert_eq!(Dec::parse("12.340").unwrap(), Dec::new(12340, 3));
        assert_eq!(Dec::parse("-0.5").unwrap().to_string(), "-0.5");
        assert_eq!(Dec::parse(".5").unwrap().to_string(), "0.5");
        assert!(Dec::parse("1e5").is_none());
        assert!(Dec::parse("").is_none());
        assert_eq!(Dec::parse("2.345").unwrap().rescale(2).unwrap().to_string(), "2.35");
        assert_eq!(Dec::parse("-2.345").unwrap().rescale(2).unwrap().to_string(), "-2.35");
        assert_eq!(Dec::new(5, 3).to_string(), "0.005");
        assert_eq!(Dec::parse("123.45").unwrap().int_digits(), 3);
    }

    #[test]
    fn arithmetic_types_follow_mysql() {
        assert_eq!(arith(ArithOp::Add, &Val::Int(1), &Val::Int(1)).unwrap(), Val::Int(2));
        assert_eq!(arith(ArithOp::Div, &Val::Int(7), &Val::Int(2)).unwrap().to_string_lossy().unwrap(), "3.5000");
        assert_eq!(arith(ArithOp::Div, &Val::Int(1), &Val::Int(3)).unwrap().to_string_lossy().unwrap(), "0.3333");
        assert_eq!(arith(ArithOp::Div, &Val::Int(1), &Val::Int(0)).unwrap(), Val::Null);
        assert_eq!(arith(ArithOp::IntDiv, &Val::Int(7), &Val::Int(2)).unwrap(), Val::Int(3));
        assert_eq!(arith(ArithOp::Mod, &Val::Int(-7), &Val::Int(2)).unwrap(), Val::Int(-1));
        assert_eq!(arith(ArithOp::Add, &d("1.5"), &Val::Int(2)).unwrap().to_string_lossy().unwrap(), "3.5");
        assert_eq!(arith(ArithOp::Mul, &d("1.5"), &d("1.5")).unwrap().to_string_lossy().unwrap(), "2.25");
        assert_eq!(arith(ArithOp::Add, &Val::Float(0.5), &Val::Int(1)).unwrap(), Val::Float(1.5));
        assert!(arith(ArithOp::Add, &Val::Int(i64::MAX), &Val::Int(1)).is_err());
        assert!(arith(ArithOp::Sub, &Val::UInt(1), &Val::UInt(2)).is_err());
        assert_eq!(arith(ArithOp::Add, &Val::Str("2abc".into()), &Val::Int(1)).unwrap(), Val::Float(3.0));
        assert_eq!(arith(ArithOp::Add, &Val::Null, &Val::Int(1)).unwrap(), Val::Null);
    }

    #[test]
    fn comparisons_cross_types() {
        assert_eq!(compare(&Val::Int(2), &d("1.99")), Some(Ordering::Greater));
        assert_eq!(compare(&Val::UInt(u64::MAX), &Val::Int(-1)), Some(Ordering::Greater));
        assert_eq!(compare(&Val::Str("10".into()), &Val::Int(9)), Some(Ordering::Greater));
        assert_eq!(compare(&Val::Str("b".into()), &Val::Str("a".into())), Some(Ordering::Greater));
        assert_eq!(compare(&Val::Null, &Val::Int(1)), None);
        assert_eq!(sort_cmp(&Val::Null, &Val::Int(1)), Ordering::Less);
    }

    #[test]
    fn doubles_print_like_mysql() {
        assert_eq!(format_double(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(format_double(100.0), "100");
        assert_eq!(format_double(1e20), "1e20");
        assert_eq!(format_double(-2.5), "-2.5");
        assert_eq!(format_float(1.1), "1.1");
    }

    #[test]
    fn like_matches() {
        assert!(like("hello", "h%", '\\'));
        assert!(like("hello", "%llo", '\\'));
        assert!(like("hello", "h_llo", '\\'));
        assert!(!like("hello", "h_lo", '\\'));
        assert!(like("50%", "50\\%", '\\'));
        assert!(!like("500", "50\\%", '\\'));
        assert!(like("", "%", '\\'));
        assert!(like("abcabc", "%b%c", '\\'));
        assert!(!like("abc", "", '\\'));
    }

    #[test]
    fn group_keys_normalize_numbers() {
        let key = |v: &Val| {
            let mut k = vec![];
            v.group_key(&mut k);
            k
        };
        assert_eq!(key(&Val::Int(1)), key(&d("1.00")));
        assert_ne!(key(&Val::Int(1)), key(&Val::Str("1".into())));
        assert_ne!(key(&Val::Null), key(&Val::Int(0)));
    }
}

#[cfg(test)]
mod layout_tests {
    #[test]
    fn a_sql_value_takes_a_storage_values_place() {
        use std::mem::{align_of, size_of};
        assert_eq!(size_of::<super::Val>(), size_of::<shoal_proto::Value>());
        assert_eq!(align_of::<super::Val>(), align_of::<shoal_proto::Value>());
    }
}

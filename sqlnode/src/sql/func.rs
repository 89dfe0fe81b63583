//! The library of scalar functions beyond the core ones in [`crate::sql::expr`]: math, more
//! string functions, and dates (`YEAR()`, `DATE_FORMAT()`, `DATE_ADD()`, …). Pure; NULL in,
//! NULL out unless MySQL says otherwise; arguments the function cannot read give NULL, as
//! MySQL does outside strict INSERTs.
//!
//! Dates are the canonical text the SQL node stores (`YYYY-MM-DD[ hh:mm:ss[.ffffff]]`, see
//! `crate::types`), read with `parse_datetime`; day arithmetic goes through day numbers of the
//! proleptic Gregorian calendar.

use crate::error::{code, SqlError, SqlResult};
use crate::types::{parse_datetime, DateTime, IntKind, WireType};
use crate::val::{Dec, Val};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntervalUnit {
    Microsecond,
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

impl IntervalUnit {
    pub fn parse(name: &str) -> Option<IntervalUnit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "MICROSECOND" => IntervalUnit::Microsecond,
            "SECOND" => IntervalUnit::Second,
            "MINUTE" => IntervalUnit::Minute,
            "HOUR" => IntervalUnit::Hour,
            "DAY" => IntervalUnit::Day,
            "WEEK" => IntervalUnit::Week,
            "MONTH" => IntervalUnit::Month,
            "QUARTER" => IntervalUnit::Quarter,
            "YEAR" => IntervalUnit::Year,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibFn {
    Pow,
    Sqrt,
    Exp,
    Ln,
    Log,
    Log2,
    Log10,
    Pi,
    Truncate,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Degrees,
    Radians,
    Locate,
    Instr,
    Lpad,
    Rpad,
    Repeat,
    Reverse,
    Space,
    Ascii,
    Strcmp,
    SubstringIndex,
    Field,
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    Date,
    DateFormat,
    DateDiff,
    DayOfWeek,
    WeekDay,
    DayOfYear,
    DayName,
    MonthName,
    LastDay,
    UnixTimestamp,
    FromUnixtime,
    /// DATE_ADD / DATE_SUB (the sign is in the amount).
    DateAdd(IntervalUnit),
}

/// The function called `name` and whether `n` arguments suit it.
pub fn lookup(name: &str, n: usize) -> Option<(LibFn, bool)> {
    use LibFn::*;
    let (f, ok) = match name {
        "pow" | "power" => (Pow, n == 2),
        "sqrt" => (Sqrt, n == 1),
        "exp" => (Exp, n == 1),
        "ln" => (Ln, n == 1),
        "log" => (Log, n == 1 || n == 2),
        "log2" => (Log2, n == 1),
        "log10" => (Log10, n == 1),
        "pi" => (Pi, n == 0),
        "truncate" => (Truncate, n == 2),
        "sin" => (Sin, n == 1),
        "cos" => (Cos, n == 1),
        "tan" => (Tan, n == 1),
        "asin" => (Asin, n == 1),
        "acos" => (Acos, n == 1),
        "atan" => (Atan, n == 1),
        "degrees" => (Degrees, n == 1),
        "radians" => (Radians, n == 1),
        "locate" => (Locate, n == 2 || n == 3),
        "instr" => (Instr, n == 2),
        "lpad" => (Lpad, n == 3),
        "rpad" => (Rpad, n == 3),
        "repeat" => (Repeat, n == 2),
        "reverse" => (Reverse, n == 1),
        "space" => (Space, n == 1),
        "ascii" => (Ascii, n == 1),
        "strcmp" => (Strcmp, n == 2),
        "substring_index" => (SubstringIndex, n == 3),
        "field" => (Field, n >= 2),
        "year" => (Year, n == 1),
        "month" => (Month, n == 1),
        "day" | "dayofmonth" => (Day, n == 1),
        "hour" => (Hour, n == 1),
        "minute" => (Minute, n == 1),
        "second" => (Second, n == 1),
        "date" => (Date, n == 1),
        "date_format" => (DateFormat, n == 2),
        "datediff" => (DateDiff, n == 2),
        "dayofweek" => (DayOfWeek, n == 1),
        "weekday" => (WeekDay, n == 1),
        "dayofyear" => (DayOfYear, n == 1),
        "dayname" => (DayName, n == 1),
        "monthname" => (MonthName, n == 1),
        "last_day" => (LastDay, n == 1),
        "unix_timestamp" => (UnixTimestamp, n == 1),
        "from_unixtime" => (FromUnixtime, n == 1),
        _ => return None,
    };
    Some((f, ok))
}

/// The type of a function's result, for result metadata.
pub fn result_type(f: LibFn) -> Option<WireType> {
    use LibFn::*;
    let bigint = WireType::Int { kind: IntKind::Big, unsigned: false, width: None };
    Some(match f {
        Pow | Sqrt | Exp | Ln | Log | Log2 | Log10 | Pi | Sin | Cos | Tan | Asin | Acos | Atan | Degrees | Radians => {
            WireType::Double
        }
        // Exact or not, as its argument.
        Truncate => return None,
        Locate | Instr | Ascii | Strcmp | Field | Year | Month | Day | Hour | Minute | Second | DayOfWeek | WeekDay
        | DayOfYear | DateDiff | UnixTimestamp => bigint,
        Lpad | Rpad | Repeat | Reverse | Space | SubstringIndex | DateFormat | DayName | MonthName => {
            WireType::Str { len: 255 }
        }
        Date | LastDay => WireType::Date,
        FromUnixtime => WireType::Datetime { fsp: 0, timestamp: false },
        // A date or a datetime, depending on the argument and the unit.
        DateAdd(_) => return None,
    })
}

/// Longest string REPEAT / LPAD / RPAD / SPACE build (MySQL's max_allowed_packet bounds them).
pub const MAX_STRING_BYTES: usize = 16 * 1024 * 1024;

fn text(v: &Val) -> Option<String> {
    v.to_string_lossy()
}

fn float(v: Val) -> Val {
    match v.to_f64() {
        Some(f) if f.is_finite() => Val::Float(f),
        _ => Val::Null,
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day number.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

const DAY_NAMES: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

fn datetime(v: &Val) -> Option<DateTime> {
    match v {
        Val::Null => None,
        // YYYYMMDD and YYYYMMDDhhmmss numbers read as dates, as in MySQL.
        Val::Int(_) | Val::UInt(_) => parse_datetime(&text(v)?),
        other => parse_datetime(&text(other)?),
    }
}

/// 0 = Monday.
fn weekday(dt: &DateTime) -> i64 {
    (days_from_civil(i64::from(dt.year), dt.month, dt.day) + 3).rem_euclid(7)
}

fn has_time(v: &Val) -> bool {
    text(v).is_some_and(|t| t.trim().contains([' ', 'T', ':']))
}

/// Adds `amount` units to a date or datetime; None when the result leaves years 1..=9999.
fn date_add(dt: DateTime, unit: IntervalUnit, amount: i64) -> Option<DateTime> {
    use IntervalUnit as U;
    let mut dt = dt;
    match unit {
        U::Month | U::Quarter | U::Year => {
            let months = match unit {
                U::Month => amount,
                U::Quarter => amount.checked_mul(3)?,
                _ => amount.checked_mul(12)?,
            };
            let total =
                i64::from(dt.year).checked_mul(12)?.checked_add(i64::from(dt.month) - 1)?.checked_add(months)?;
            let (y, m) = (total.div_euclid(12), (total.rem_euclid(12) + 1) as u32);
            if !(1..=9999).contains(&y) {
                return None;
            }
            dt.year = y as u32;
            dt.month = m;
            dt.day = dt.day.min(days_in_month(y, m));
            Some(dt)
        }
        _ => {
            let micros_per = match unit {
                U::Microsecond => 1i128,
                U::Second => 1_000_000,
                U::Minute => 60_000_000,
                U::Hour => 3_600_000_000,
                U::Day => 86_400_000_000,
                _ => 7 * 86_400_000_000,
            };
            let day = i128::from(days_from_civil(i64::from(dt.year), dt.month, dt.day));
            let tod = i128::from(dt.hour) * 3_600_000_000
                + i128::from(dt.minute) * 60_000_000
                + i128::from(dt.second) * 1_000_000
                + i128::from(dt.micros);
            let t = (day * 86_400_000_000 + tod).checked_add(i128::from(amount).checked_mul(micros_per)?)?;
            let (days, tod) = (t.div_euclid(86_400_000_000), t.rem_euclid(86_400_000_000));
            let (y, m, d) = civil_from_days(i64::try_from(days).ok()?);
            if !(1..=9999).contains(&y) {
                return None;
            }
            Some(DateTime {
                year: y as u32,
                month: m,
                day: d,
                hour: (tod / 3_600_000_000) as u32,
                minute: (tod / 60_000_000 % 60) as u32,
                second: (tod / 1_000_000 % 60) as u32,
                micros: (tod % 1_000_000) as u32,
            })
        }
    }
}

/// MySQL's DATE_FORMAT specifiers (the common ones; others are copied as written).
fn date_format(dt: &DateTime, fmt: &str) -> String {
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(s) = chars.next() else { break };
        let h12 = match dt.hour % 12 {
            0 => 12,
            h => h,
        };
        match s {
            'Y' => out.push_str(&format!("{:04}", dt.year)),
            'y' => out.push_str(&format!("{:02}", dt.year % 100)),
            'm' => out.push_str(&format!("{:02}", dt.month)),
            'c' => out.push_str(&dt.month.to_string()),
            'd' => out.push_str(&format!("{:02}", dt.day)),
            'e' => out.push_str(&dt.day.to_string()),
            'H' => out.push_str(&format!("{:02}", dt.hour)),
            'k' => out.push_str(&dt.hour.to_string()),
            'h' | 'I' => out.push_str(&format!("{h12:02}")),
            'l' => out.push_str(&h12.to_string()),
            'i' => out.push_str(&format!("{:02}", dt.minute)),
            's' | 'S' => out.push_str(&format!("{:02}", dt.second)),
            'f' => out.push_str(&format!("{:06}", dt.micros)),
            'p' => out.push_str(if dt.hour < 12 { "AM" } else { "PM" }),
            'T' => out.push_str(&format!("{:02}:{:02}:{:02}", dt.hour, dt.minute, dt.second)),
            'r' => out.push_str(&format!(
                "{h12:02}:{:02}:{:02} {}",
                dt.minute,
                dt.second,
                if dt.hour < 12 { "AM" } else { "PM" }
            )),
            'W' => out.push_str(DAY_NAMES[weekday(dt) as usize]),
            'a' => out.push_str(&DAY_NAMES[weekday(dt) as usize][..3]),
            'w' => out.push_str(&((weekday(dt) + 1) % 7).to_string()),
            'M' => out.push_str(MONTH_NAMES[(dt.month - 1) as usize]),
            'b' => out.push_str(&MONTH_NAMES[(dt.month - 1) as usize][..3]),
            'j' => {
                let doy = days_from_civil(i64::from(dt.year), dt.month, dt.day)
                    - days_from_civil(i64::from(dt.year), 1, 1)
                    + 1;
                out.push_str(&format!("{doy:03}"));
            }
            '%' => out.push('%'),
            other => out.push(other),
        }
    }
    out
}

/// Calls a library function on evaluated arguments (arity was checked by the binder).
pub fn call(f: LibFn, a: &[Val]) -> SqlResult<Val> {
    use LibFn::*;
    let arg = |i: usize| a.get(i).cloned().unwrap_or(Val::Null);
    let num = |i: usize| arg(i).to_f64();
    if a.iter().any(Val::is_null) && !matches!(f, Field) {
        return Ok(Val::Null);
    }
    let too_long =
        || SqlError::new(code::DATA_TOO_LONG, format!("Result of {f:?} is longer than {MAX_STRING_BYTES} bytes"));
    Ok(match f {
        Pow => float(Val::Float(num(0).unwrap_or(0.0).powf(num(1).unwrap_or(0.0)))),
        Sqrt => match num(0) {
            Some(x) if x >= 0.0 => Val::Float(x.sqrt()),
            _ => Val::Null,
        },
        Exp => float(Val::Float(num(0).unwrap_or(0.0).exp())),
        Ln | Log | Log2 | Log10 => {
            let (base, x) = if f == Log && a.len() == 2 { (num(0), num(1)) } else { (None, num(0)) };
            match (base, x) {
                (_, Some(x)) if x <= 0.0 => Val::Null,
                (Some(b), _) if b <= 0.0 || b == 1.0 => Val::Null,
                (Some(b), Some(x)) => Val::Float(x.ln() / b.ln()),
                (None, Some(x)) => Val::Float(match f {
                    Log2 => x.log2(),
                    Log10 => x.log10(),
                    _ => x.ln(),
                }),
                _ => Val::Null,
            }
        }
        Pi => Val::Float(std::f64::consts::PI),
        Truncate => {
            let places = arg(1).to_i64().unwrap_or(0).clamp(-30, 30);
            match arg(0) {
                v @ (Val::Int(_) | Val::UInt(_)) if places >= 0 => v,
                v @ (Val::Int(_) | Val::UInt(_) | Val::Dec(_)) => {
                    let d = v.to_dec().unwrap_or(Dec::new(0, 0));
                    if places >= i64::from(d.s) {
                        Val::Dec(d)
                    } else {
                        let p = 10i128.pow((i64::from(d.s) - places).min(38) as u32);
                        let m = d.m / p * p;
                        let keep = places.max(0) as u8;
                        Val::Dec(Dec::new(m, d.s).rescale(keep).unwrap_or(Dec::new(0, keep)))
                    }
                }
                v => {
                    let m = 10f64.powi(places as i32);
                    float(Val::Float((v.to_f64().unwrap_or(0.0) * m).trunc() / m))
                }
            }
        }
        Sin | Cos | Tan | Asin | Acos | Atan | Degrees | Radians => {
            let x = num(0).unwrap_or(0.0);
            float(Val::Float(match f {
                Sin => x.sin(),
                Cos => x.cos(),
                Tan => x.tan(),
                Asin => x.asin(),
                Acos => x.acos(),
                Atan => x.atan(),
                Degrees => x.to_degrees(),
                _ => x.to_radians(),
            }))
        }
        Locate | Instr => {
            // LOCATE(substr, str[, pos]); INSTR(str, substr). Positions count characters.
            let (needle, hay) = if f == Instr { (arg(1), arg(0)) } else { (arg(0), arg(1)) };
            let (needle, hay) = (text(&needle).unwrap_or_default(), text(&hay).unwrap_or_default());
            let start = if a.len() == 3 { arg(2).to_i64().unwrap_or(1) } else { 1 };
            if start < 1 {
                return Ok(Val::Int(0));
            }
            let chars: Vec<char> = hay.chars().collect();
            let skip = (start - 1) as usize;
            if skip > chars.len() {
                return Ok(Val::Int(0));
            }
            let rest: String = chars[skip..].iter().collect();
            match rest.find(&needle) {
                Some(byte) => Val::Int((rest[..byte].chars().count() + skip + 1) as i64),
                None => Val::Int(0),
            }
        }
        Lpad | Rpad => {
            let s: Vec<char> = text(&arg(0)).unwrap_or_default().chars().collect();
            let len = arg(1).to_i64().unwrap_or(-1);
            let pad: Vec<char> = text(&arg(2)).unwrap_or_default().chars().collect();
            if len < 0 {
                return Ok(Val::Null);
            }
            let len = len as usize;
            if len.saturating_mul(4) > MAX_STRING_BYTES {
                return Err(too_long());
            }
            if len <= s.len() {
                return Ok(Val::Str(s[..len].iter().collect()));
            }
            if pad.is_empty() {
                return Ok(Val::Null);
            }
            let fill: String = pad.iter().cycle().take(len - s.len()).collect();
            let s: String = s.into_iter().collect();
            Val::Str(if f == Lpad { fill + &s } else { s + &fill })
        }
        Repeat => {
            let s = text(&arg(0)).unwrap_or_default();
            let n = arg(1).to_i64().unwrap_or(0).max(0) as usize;
            if s.len().saturating_mul(n) > MAX_STRING_BYTES {
                return Err(too_long());
            }
            Val::Str(s.repeat(n))
        }
        Reverse => Val::Str(text(&arg(0)).unwrap_or_default().chars().rev().collect()),
        Space => {
            let n = arg(0).to_i64().unwrap_or(0).max(0) as usize;
            if n > MAX_STRING_BYTES {
                return Err(too_long());
            }
            Val::Str(" ".repeat(n))
        }
        Ascii => Val::Int(arg(0).to_text().and_then(|b| b.first().copied()).map_or(0, i64::from)),
        Strcmp => {
            let (x, y) = (arg(0).to_text().unwrap_or_default(), arg(1).to_text().unwrap_or_default());
            Val::Int(match x.cmp(&y) {
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
                std::cmp::Ordering::Greater => 1,
            })
        }
        SubstringIndex => {
            let s = text(&arg(0)).unwrap_or_default();
            let delim = text(&arg(1)).unwrap_or_default();
            let count = arg(2).to_i64().unwrap_or(0);
            if delim.is_empty() || count == 0 {
                return Ok(Val::Str(String::new()));
            }
            let parts: Vec<&str> = s.split(delim.as_str()).collect();
            let n = count.unsigned_abs().min(parts.len() as u64) as usize;
            Val::Str(if count > 0 { parts[..n].join(&delim) } else { parts[parts.len() - n..].join(&delim) })
        }
        Field => {
            let x = arg(0);
            if x.is_null() {
                return Ok(Val::Int(0));
            }
            let pos = a[1..].iter().position(|y| crate::val::compare(&x, y) == Some(std::cmp::Ordering::Equal));
            Val::Int(pos.map_or(0, |p| p as i64 + 1))
        }
        Year | Month | Day | Hour | Minute | Second | DayOfWeek | WeekDay | DayOfYear => {
            let Some(dt) = datetime(&arg(0)) else { return Ok(Val::Null) };
            Val::Int(match f {
                Year => i64::from(dt.year),
                Month => i64::from(dt.month),
                Day => i64::from(dt.day),
                Hour => i64::from(dt.hour),
                Minute => i64::from(dt.minute),
                Second => i64::from(dt.second),
                DayOfWeek => (weekday(&dt) + 1) % 7 + 1,
                WeekDay => weekday(&dt),
                _ => {
                    days_from_civil(i64::from(dt.year), dt.month, dt.day) - days_from_civil(i64::from(dt.year), 1, 1)
                        + 1
                }
            })
        }
        DayName | MonthName => match datetime(&arg(0)) {
            Some(dt) if f == DayName => Val::Str(DAY_NAMES[weekday(&dt) as usize].into()),
            Some(dt) => Val::Str(MONTH_NAMES[(dt.month - 1) as usize].into()),
            None => Val::Null,
        },
        Date => datetime(&arg(0)).map_or(Val::Null, |dt| Val::Str(dt.date_string())),
        LastDay => match datetime(&arg(0)) {
            Some(mut dt) => {
                dt.day = days_in_month(i64::from(dt.year), dt.month);
                Val::Str(dt.date_string())
            }
            None => Val::Null,
        },
        DateFormat => match datetime(&arg(0)) {
            Some(dt) => Val::Str(date_format(&dt, &text(&arg(1)).unwrap_or_default())),
            None => Val::Null,
        },
        DateDiff => match (datetime(&arg(0)), datetime(&arg(1))) {
            (Some(x), Some(y)) => Val::Int(
                days_from_civil(i64::from(x.year), x.month, x.day) - days_from_civil(i64::from(y.year), y.month, y.day),
            ),
            _ => Val::Null,
        },
        UnixTimestamp => match datetime(&arg(0)) {
            Some(dt) => {
                let days = days_from_civil(i64::from(dt.year), dt.month, dt.day);
                let secs = days * 86_400 + i64::from(dt.hour) * 3600 + i64::from(dt.minute) * 60 + i64::from(dt.second);
                if secs < 0 {
                    Val::Int(0)
                } else {
                    Val::Int(secs)
                }
            }
            None => Val::Null,
        },
        FromUnixtime => match arg(0).to_i64() {
            Some(s) if s >= 0 => Val::Str(crate::sql::bind::now_string(s as u64, true)),
            _ => Val::Null,
        },
        DateAdd(unit) => {
            let Some(dt) = datetime(&arg(0)) else { return Ok(Val::Null) };
            let Some(n) = arg(1).to_i64() else { return Ok(Val::Null) };
            let timed = has_time(&arg(0))
                || !matches!(
                    unit,
                    IntervalUnit::Day
                        | IntervalUnit::Week
                        | IntervalUnit::Month
                        | IntervalUnit::Quarter
                        | IntervalUnit::Year
                );
            match date_add(dt, unit, n) {
                Some(r) if timed => Val::Str(r.datetime_string(if r.micros > 0 { 6 } else { 0 })),
                Some(r) => Val::Str(r.date_string()),
                None => Val::Null,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> Val {
        Val::Str(x.into())
    }

    fn t(v: SqlResult<Val>) -> String {
        v.unwrap().to_string_lossy().unwrap_or_else(|| "NULL".into())
    }

    #[test]
    fn calendar_round_trips() {
        for d in [-719_468, -1, 0, 59, 10_957, 2_932_896] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28), 2);
    }

    #[test]
    fn dates() {
        assert_eq!(t(call(LibFn::Year, &[s("2024-02-29 10:11:12")])), "2024");
        assert_eq!(t(call(LibFn::DayOfWeek, &[s("2024-01-07")])), "1"); // a Sunday
        assert_eq!(t(call(LibFn::WeekDay, &[s("2024-01-07")])), "6");
        assert_eq!(t(call(LibFn::DayName, &[s("2024-01-08")])), "Monday");
        assert_eq!(t(call(LibFn::DateDiff, &[s("2024-03-01"), s("2024-02-28 23:00:00")])), "2");
        assert_eq!(t(call(LibFn::LastDay, &[s("2023-02-10")])), "2023-02-28");
        assert_eq!(t(call(LibFn::DateAdd(IntervalUnit::Month), &[s("2024-01-31"), Val::Int(1)])), "2024-02-29");
        assert_eq!(
            t(call(LibFn::DateAdd(IntervalUnit::Hour), &[s("2024-12-31 23:30:00"), Val::Int(1)])),
            "2025-01-01 00:30:00"
        );
        assert_eq!(t(call(LibFn::DateAdd(IntervalUnit::Day), &[s("2024-03-01"), Val::Int(-1)])), "2024-02-29");
        assert_eq!(t(call(LibFn::DateAdd(IntervalUnit::Year), &[s("9999-01-01"), Val::Int(1)])), "NULL");
        assert_eq!(
            t(call(LibFn::DateFormat, &[s("2024-07-04 15:05:09"), s("%W %e %M %Y, %h:%i:%s %p %%")])),
            "Thursday 4 July 2024, 03:05:09 PM %"
        );
        assert_eq!(t(call(LibFn::UnixTimestamp, &[s("1970-01-02")])), "86400");
        assert_eq!(t(call(LibFn::Month, &[s("not a date")])), "NULL");
    }

    #[test]
    fn math_and_strings() {
        assert_eq!(t(call(LibFn::Pow, &[Val::Int(2), Val::Int(10)])), "1024");
        assert_eq!(t(call(LibFn::Sqrt, &[Val::Int(-1)])), "NULL");
        assert_eq!(t(call(LibFn::Log, &[Val::Int(2), Val::Int(8)])), "3");
        assert_eq!(t(call(LibFn::Truncate, &[Val::Dec(Dec::parse("1.999").unwrap()), Val::Int(1)])), "1.9");
        assert_eq!(t(call(LibFn::Truncate, &[Val::Int(1234), Val::Int(-2)])), "1200");
        assert_eq!(t(call(LibFn::Locate, &[s("b"), s("abcb"), Val::Int(3)])), "4");
        assert_eq!(t(call(LibFn::Instr, &[s("héllo"), s("llo")])), "3");
        assert_eq!(t(call(LibFn::Lpad, &[s("7"), Val::Int(3), s("0")])), "007");
        assert_eq!(t(call(LibFn::Rpad, &[s("abcd"), Val::Int(2), s("x")])), "ab");
        assert_eq!(t(call(LibFn::SubstringIndex, &[s("a.b.c"), s("."), Val::Int(-2)])), "b.c");
        assert_eq!(t(call(LibFn::Field, &[s("b"), s("a"), s("b")])), "2");
        assert_eq!(t(call(LibFn::Strcmp, &[s("a"), s("b")])), "-1");
        assert!(call(LibFn::Repeat, &[s("ab"), Val::Int(1 << 40)]).is_err());
    }
}

//! Column filters pushed down into scans: `column <op> value`, all of a scan's filters ANDed.
//! SQL three-valued logic: a comparison with NULL is never true.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, ShoalError};
use crate::pb;
use crate::types::{Table, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    IsNull,
    NotNull,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Filter {
    pub column: u32,
    pub op: CmpOp,
    pub value: Value,
}

/// Compares two non-NULL values of compatible kinds; None when they cannot be compared.
pub fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    use Value::*;
    match (a, b) {
        (Int(x), Int(y)) => Some(x.cmp(y)),
        (Uint(x), Uint(y)) => Some(x.cmp(y)),
        (Int(x), Uint(y)) => Some(if *x < 0 { Ordering::Less } else { (*x as u64).cmp(y) }),
        (Uint(_), Int(_)) => compare(b, a).map(Ordering::reverse),
        (Float(x), Float(y)) => x.partial_cmp(y),
        (Float(x), Int(y)) => x.partial_cmp(&(*y as f64)),
        (Float(x), Uint(y)) => x.partial_cmp(&(*y as f64)),
        (Int(_) | Uint(_), Float(_)) => compare(b, a).map(Ordering::reverse),
        (Text(x), Text(y)) => Some(x.cmp(y)),
        (Bytes(x), Bytes(y)) => Some(x.cmp(y)),
        (Text(x), Bytes(y)) => Some(x.as_bytes().cmp(y.as_slice())),
        (Bytes(x), Text(y)) => Some(x.as_slice().cmp(y.as_bytes())),
        (Bool(x), Bool(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

impl Filter {
    pub fn matches(&self, row: &[Value]) -> bool {
        let Some(v) = row.get(self.column as usize) else { return false };
        match self.op {
            CmpOp::IsNull => return matches!(v, Value::Null),
            CmpOp::NotNull => return !matches!(v, Value::Null),
            _ => {}
        }
        if matches!(v, Value::Null) || matches!(self.value, Value::Null) {
            return false;
        }
        let Some(ord) = compare(v, &self.value) else { return false };
        match self.op {
            CmpOp::Eq => ord == Ordering::Equal,
            CmpOp::Ne => ord != Ordering::Equal,
            CmpOp::Lt => ord == Ordering::Less,
            CmpOp::Le => ord != Ordering::Greater,
            CmpOp::Gt => ord == Ordering::Greater,
            CmpOp::Ge => ord != Ordering::Less,
            CmpOp::IsNull | CmpOp::NotNull => unreachable!("handled above"),
        }
    }

    /// Converts and checks a filter against the table it is for.
    pub fn from_pb(f: pb::Filter, table: &Table) -> Result<Filter, ShoalError> {
        use pb::filter::CmpOp as P;
        let op = match P::try_from(f.op) {
            Ok(P::Eq) => CmpOp::Eq,
            Ok(P::Ne) => CmpOp::Ne,
            Ok(P::Lt) => CmpOp::Lt,
            Ok(P::Le) => CmpOp::Le,
            Ok(P::Gt) => CmpOp::Gt,
            Ok(P::Ge) => CmpOp::Ge,
            Ok(P::IsNull) => CmpOp::IsNull,
            Ok(P::NotNull) => CmpOp::NotNull,
            Err(_) => return Err(ShoalError::new(ErrorCode::InvalidArgument, format!("unknown filter op {}", f.op))),
        };
        let col = table.columns().get(f.column as usize).ok_or_else(|| {
            ShoalError::new(ErrorCode::InvalidArgument, format!("table {} has no column {}", table.name(), f.column))
        })?;
        let value = f.value.map(Value::from).unwrap_or(Value::Null);
        if !matches!(op, CmpOp::IsNull | CmpOp::NotNull) && !matches!(value, Value::Null) {
            let probe = match col.ty {
                crate::types::ColumnType::Int | crate::types::ColumnType::Uint | crate::types::ColumnType::Float => {
                    Value::Int(0)
                }
                crate::types::ColumnType::Text => Value::Text(String::new()),
                crate::types::ColumnType::Bytes => Value::Bytes(vec![]),
                crate::types::ColumnType::Bool => Value::Bool(false),
            };
            if compare(&probe, &value).is_none() {
                return Err(ShoalError::new(
                    ErrorCode::TypeMismatch,
                    format!("cannot compare column {} ({}) with {}", col.name, col.ty.name(), value.type_name()),
                ));
            }
        }
        Ok(Filter { column: f.column, op, value })
    }

    pub fn to_pb(&self) -> pb::Filter {
        use pb::filter::CmpOp as P;
        let op = match self.op {
            CmpOp::Eq => P::Eq,
            CmpOp::Ne => P::Ne,
            CmpOp::Lt => P::Lt,
            CmpOp::Le => P::Le,
            CmpOp::Gt => P::Gt,
            CmpOp::Ge => P::Ge,
            CmpOp::IsNull => P::IsNull,
            CmpOp::NotNull => P::NotNull,
        };
        pb::Filter { column: self.column, op: op as i32, value: Some(pb::Value::from(&self.value)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_valued_and_cross_type() {
        let row = vec![Value::Int(5), Value::Null, Value::Float(2.5), Value::Text("b".into())];
        let f = |column, op, value| Filter { column, op, value }.matches(&row);
        assert!(f(0, CmpOp::Eq, Value::Uint(5)));
        assert!(f(0, CmpOp::Gt, Value::Float(4.9)));
        assert!(!f(1, CmpOp::Eq, Value::Null));
        assert!(!f(1, CmpOp::Ne, Value::Int(1)));
        assert!(f(1, CmpOp::IsNull, Value::Null));
        assert!(f(2, CmpOp::Lt, Value::Int(3)));
        assert!(f(3, CmpOp::Ge, Value::Text("a".into())));
        assert!(!f(3, CmpOp::Eq, Value::Int(1)), "incomparable is false");
        assert!(!f(9, CmpOp::IsNull, Value::Null), "missing column is false");
    }
}

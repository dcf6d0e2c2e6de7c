//! GGUF metadata values.
//!
//! Invariants: a [`MetaValue`] mirrors the stored type exactly (a `u32` stays `U32`); the
//! accessors convert only where no information is lost (`as_u64` refuses negative integers,
//! `as_f64` widens every numeric type).

/// One GGUF metadata value, typed as stored.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// A homogeneous array as stored (elements share one type; arrays may nest).
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// Any integer value that fits `u64` (negative integers give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            ref other => other.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any numeric value as `f64` (integers above 2^53 round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            #[allow(clippy::cast_precision_loss)]
            MetaValue::U64(v) => Some(v as f64),
            #[allow(clippy::cast_precision_loss)]
            MetaValue::I64(v) => Some(v as f64),
            ref other => other.as_i64().map(|v| v as f64),
        }
    }

    /// The string, for `String` values.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The flag, for `Bool` values.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, for `Array` values.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF name of the stored type (`"u32"`, `"string"`, `"array"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors() {
        assert_eq!(MetaValue::I32(-1).as_u64(), None);
        assert_eq!(MetaValue::I32(7).as_u64(), Some(7));
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::U16(3).as_f64(), Some(3.0));
        assert_eq!(MetaValue::F32(0.5).as_f64(), Some(0.5));
        assert_eq!(MetaValue::String("x".into()).as_str(), Some("x"));
        assert_eq!(MetaValue::Bool(true).as_u64(), None);
        assert_eq!(MetaValue::Array(vec![]).as_array().map(<[_]>::len), Some(0));
    }
}

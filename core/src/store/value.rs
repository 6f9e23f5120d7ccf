//! SQL values as the engine sees them: the types both SQLite bindings share.

/// One SQL value. Integers must stay within ±(2^53−1) on the Durable Object.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A 64-bit integer (kept below 2^53 by the engine).
    Int(i64),
    /// A floating-point number.
    Real(f64),
    /// UTF-8 text.
    Text(String),
}

/// One result row, columns in `SELECT` order.
pub type Row = Vec<Value>;

impl Value {
    /// The integer, if this is one (a whole `Real` counts: the Durable Object
    /// may hand integers back as JavaScript numbers).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Real(f) if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 => {
                Some(*f as i64)
            }
            _ => None,
        }
    }

    /// The text, if this is text.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The text, owned, if this is text.
    pub fn into_text(self) -> Option<String> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<u64> for Value {
    fn from(i: u64) -> Self {
        Value::Int(i.min(crate::MAX_SAFE_INTEGER) as i64)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Int(i64::from(b))
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

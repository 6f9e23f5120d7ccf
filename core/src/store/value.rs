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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_back_from_whole_reals_within_2_pow_53() {
        assert_eq!(Value::Int(-4).as_int(), Some(-4));
        assert_eq!(Value::Real(42.0).as_int(), Some(42));
        assert_eq!(
            Value::Real(-9_007_199_254_740_991.0).as_int(),
            Some(-9_007_199_254_740_991)
        );
        assert_eq!(Value::Real(9_007_199_254_740_992.0).as_int(), None);
        assert_eq!(Value::Real(1.5).as_int(), None);
        assert_eq!(Value::Real(f64::NAN).as_int(), None);
        assert_eq!(Value::Text("1".into()).as_int(), None);
        assert_eq!(Value::Null.as_int(), None);
    }

    #[test]
    fn text_reads_only_from_text() {
        assert_eq!(Value::from("a").as_text(), Some("a"));
        assert_eq!(
            Value::from(String::from("b")).into_text(),
            Some("b".to_string())
        );
        assert_eq!(Value::Int(1).as_text(), None);
        assert_eq!(Value::Null.into_text(), None);
    }

    #[test]
    fn conversions() {
        assert_eq!(Value::from(true), Value::Int(1));
        assert_eq!(Value::from(false), Value::Int(0));
        assert_eq!(Value::from(7u64), Value::Int(7));
        // A u64 never leaves the range the Durable Object can carry.
        assert_eq!(
            Value::from(u64::MAX),
            Value::Int(crate::MAX_SAFE_INTEGER as i64)
        );
        assert_eq!(Value::from(None::<i64>), Value::Null);
        assert_eq!(Value::from(Some("x")), Value::Text("x".into()));
    }
}

//! The core's [`Store`] over the Durable Object's SQLite (`SqlStorage`).
//!
//! # Value mapping
//!
//! | core [`Value`] | `SqlStorageValue` | notes |
//! |---|---|---|
//! | `Null` | `Null` | |
//! | `Int(i)` | `Integer(i)` | binding outside ±(2^53−1) is an error: the runtime carries it as a JavaScript number and would round it |
//! | `Real(f)` | `Float(f)` | |
//! | `Text(s)` | `String(s)` | |
//!
//! Reading back, the runtime hands every number over as a JavaScript
//! number: a whole one within ±(2^53−1) arrives as `Integer` (even from a
//! REAL column), any other as `Float`, which becomes `Real` (the core's
//! [`Value::as_int`] then refuses it). `Boolean` becomes `Int(0|1)`; a
//! `Blob` is an error (the schema stores none).
//!
//! # Atomicity
//!
//! `exec` is synchronous. Statements run with no `await` between them
//! commit together, so [`Store::atomically`] keeps its default.

use callfence_core::store::{Row, Store, StoreError, Value};
use callfence_core::MAX_SAFE_INTEGER;
use worker::{SqlStorage, SqlStorageValue};

/// The Dispatcher's SQLite database as a core [`Store`].
#[derive(Clone)]
pub struct DoStore {
    sql: SqlStorage,
}

impl DoStore {
    /// Wraps the Durable Object's `ctx.storage.sql`.
    pub fn new(sql: SqlStorage) -> Self {
        Self { sql }
    }
}

impl Store for DoStore {
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        let bindings = params.iter().map(to_sql).collect::<Result<Vec<_>, _>>()?;
        let cursor = self
            .sql
            .exec(sql, bindings)
            .map_err(|e| StoreError(e.to_string()))?;
        cursor
            .raw()
            .map(|row| {
                row.map_err(|e| StoreError(e.to_string()))?
                    .into_iter()
                    .map(from_sql)
                    .collect()
            })
            .collect()
    }
}

/// A core value as a binding.
pub fn to_sql(value: &Value) -> Result<SqlStorageValue, StoreError> {
    Ok(match value {
        Value::Null => SqlStorageValue::Null,
        Value::Int(i) if i.unsigned_abs() <= MAX_SAFE_INTEGER => SqlStorageValue::Integer(*i),
        Value::Int(i) => {
            return Err(StoreError(format!(
                "integer {i} is outside ±(2^53−1) and cannot be bound"
            )))
        }
        Value::Real(f) => SqlStorageValue::Float(*f),
        Value::Text(s) => SqlStorageValue::String(s.clone()),
    })
}

/// A column as a core value.
pub fn from_sql(value: SqlStorageValue) -> Result<Value, StoreError> {
    Ok(match value {
        SqlStorageValue::Null => Value::Null,
        SqlStorageValue::Boolean(b) => Value::Int(i64::from(b)),
        SqlStorageValue::Integer(i) => Value::Int(i),
        SqlStorageValue::Float(f) => Value::Real(f),
        SqlStorageValue::String(s) => Value::Text(s),
        SqlStorageValue::Blob(_) => return Err(StoreError("unexpected BLOB column".to_owned())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: i64 = MAX_SAFE_INTEGER as i64;

    #[test]
    fn values_round_trip() {
        for value in [
            Value::Null,
            Value::Int(0),
            Value::Int(MAX),
            Value::Int(-MAX),
            Value::Real(1.5),
            Value::Text("héllo".into()),
        ] {
            assert_eq!(from_sql(to_sql(&value).unwrap()).unwrap(), value);
        }
    }

    #[test]
    fn integers_beyond_the_safe_range_are_refused() {
        for i in [MAX + 1, -(MAX + 1), i64::MAX, i64::MIN] {
            assert!(to_sql(&Value::Int(i)).is_err(), "{i}");
        }
    }

    #[test]
    fn runtime_only_types_are_mapped_or_refused() {
        assert_eq!(
            from_sql(SqlStorageValue::Boolean(true)).unwrap(),
            Value::Int(1)
        );
        assert!(from_sql(SqlStorageValue::Blob(vec![1])).is_err());
        // A number the runtime could not hand over exactly is not an integer.
        let big = from_sql(SqlStorageValue::Float(2f64.powi(60))).unwrap();
        assert_eq!(big.as_int(), None);
    }
}

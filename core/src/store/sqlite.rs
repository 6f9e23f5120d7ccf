//! The rusqlite backend of [`Store`], for native tests, the simulation and
//! benchmarks. It runs the same migrations and statements as the Durable
//! Object.

use super::{Row, Store, StoreError, Value};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;

/// A [`Store`] over one rusqlite connection.
pub struct SqliteStore {
    conn: Connection,
}

/// Prepared statements kept per connection: more than the engine's distinct
/// statements, so none is parsed again (rusqlite keeps 16 by default).
const STATEMENT_CACHE: usize = 256;

impl SqliteStore {
    fn wrap(conn: Connection) -> Self {
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Self { conn }
    }

    /// An in-memory database.
    pub fn in_memory() -> Result<Self, StoreError> {
        Connection::open_in_memory()
            .map(Self::wrap)
            .map_err(to_error)
    }

    /// A database file at `path`.
    pub fn open(path: &std::path::Path) -> Result<Self, StoreError> {
        Connection::open(path).map(Self::wrap).map_err(to_error)
    }
}

fn to_error(e: rusqlite::Error) -> StoreError {
    StoreError(e.to_string())
}

impl Store for SqliteStore {
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(to_error)?;
        // Bound by reference: no copy of a text parameter.
        let bound = params.iter().map(|v| {
            ToSqlOutput::Borrowed(match v {
                Value::Null => ValueRef::Null,
                Value::Int(i) => ValueRef::Integer(*i),
                Value::Real(f) => ValueRef::Real(*f),
                Value::Text(s) => ValueRef::Text(s.as_bytes()),
            })
        });
        let columns = stmt.column_count();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(bound))
            .map_err(to_error)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(to_error)? {
            let mut values = Vec::with_capacity(columns);
            for i in 0..columns {
                values.push(match row.get_ref(i).map_err(to_error)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(i) => Value::Int(i),
                    ValueRef::Real(f) => Value::Real(f),
                    ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(_) => {
                        return Err(StoreError("blob columns are not used".into()))
                    }
                });
            }
            out.push(values);
        }
        Ok(out)
    }

    fn atomically<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| E::from(to_error(e)))?;
        match work() {
            Ok(value) => {
                self.conn
                    .execute_batch("COMMIT")
                    .map_err(|e| E::from(to_error(e)))?;
                Ok(value)
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::migrate;

    #[test]
    fn migrations_apply_once_and_are_recorded() {
        let store = SqliteStore::in_memory().unwrap();
        assert_eq!(
            migrate(&store, 1).unwrap(),
            vec![
                "0001_init",
                "0002_node_load",
                "0003_events_by_seq",
                "0004_seq_regressions",
                "0005_session_cap",
                "0006_shard_leases"
            ]
        );
        assert!(migrate(&store, 2).unwrap().is_empty());
        let rows = store
            .exec(
                "SELECT name, applied_at FROM schema_migrations ORDER BY name",
                &[],
            )
            .unwrap();
        assert_eq!(
            rows,
            vec![
                vec![Value::from("0001_init"), Value::Int(1)],
                vec![Value::from("0002_node_load"), Value::Int(1)],
                vec![Value::from("0003_events_by_seq"), Value::Int(1)],
                vec![Value::from("0004_seq_regressions"), Value::Int(1)],
                vec![Value::from("0005_session_cap"), Value::Int(1)],
                vec![Value::from("0006_shard_leases"), Value::Int(1)]
            ]
        );
    }

    #[test]
    fn a_failed_atomic_unit_leaves_nothing() {
        let store = SqliteStore::in_memory().unwrap();
        migrate(&store, 1).unwrap();
        let result: Result<(), StoreError> = store.atomically(|| {
            store.exec(
                "INSERT INTO counters (name, value) VALUES ('epoch', 7)",
                &[],
            )?;
            Err(StoreError("boom".into()))
        });
        assert!(result.is_err());
        let rows = store.exec("SELECT value FROM counters", &[]).unwrap();
        assert!(rows.is_empty());
    }
}

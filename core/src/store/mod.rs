//! Storage: the small trait every piece of Dispatcher state goes through.
//!
//! The engine speaks SQL to a [`Store`]; the Durable Object implements it over
//! its SQLite `SqlStorage`, native tests over rusqlite ([`sqlite`]). The schema
//! is `migrations/NNNN_name.sql`, applied in order by [`migrate`] and recorded
//! in `schema_migrations`.
//!
//! Atomicity: every engine method performs its reads and then its writes with
//! nothing awaited in between. On the Durable Object that makes them one
//! implicit transaction; [`Store::atomically`] lets the rusqlite backend wrap
//! them in a real one.
//!
//! A directory and a call shard in one object share one database: each
//! machine holds an `Rc` of the same store ([`Store`] for `Rc<S>`).

#[cfg(not(target_arch = "wasm32"))]
pub mod sqlite;

mod value;

pub use value::{Row, Value};

/// A failure of the storage backend itself (never a business rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "storage error: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// A synchronous SQL executor with positional `?` parameters.
pub trait Store {
    /// Runs one statement and returns every row it produced.
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError>;

    /// Runs `work` as one atomic unit. The default just runs it: on a Durable
    /// Object synchronous statements already commit together.
    fn atomically<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        work()
    }
}

impl<S: Store + ?Sized> Store for std::rc::Rc<S> {
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        (**self).exec(sql, params)
    }

    fn atomically<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        (**self).atomically(work)
    }
}

/// One migration: its name (`0001_init`) and its SQL text.
pub struct Migration {
    /// The file name without `.sql`, recorded in `schema_migrations`.
    pub name: &'static str,
    /// Statements separated by `;` at line ends.
    pub sql: &'static str,
}

/// Every migration this build knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "0001_init",
        sql: include_str!("../../../migrations/0001_init.sql"),
    },
    Migration {
        name: "0002_node_load",
        sql: include_str!("../../../migrations/0002_node_load.sql"),
    },
    Migration {
        name: "0003_events_by_seq",
        sql: include_str!("../../../migrations/0003_events_by_seq.sql"),
    },
    Migration {
        name: "0004_seq_regressions",
        sql: include_str!("../../../migrations/0004_seq_regressions.sql"),
    },
    Migration {
        name: "0005_session_cap",
        sql: include_str!("../../../migrations/0005_session_cap.sql"),
    },
    Migration {
        name: "0006_shard_leases",
        sql: include_str!("../../../migrations/0006_shard_leases.sql"),
    },
];

/// Applies the migrations not yet recorded in `schema_migrations`, in order.
/// Migrations newer than this build that are already recorded are left alone
/// (expand-only schema: an older release keeps working on a newer schema).
pub fn migrate(store: &impl Store, now_ms: i64) -> Result<Vec<&'static str>, StoreError> {
    migrate_with(store, MIGRATIONS, now_ms)
}

/// [`migrate`] with the given list (a prefix of [`MIGRATIONS`] builds the
/// schema of an earlier release, for rollback tests).
pub fn migrate_with(
    store: &impl Store,
    migrations: &[Migration],
    now_ms: i64,
) -> Result<Vec<&'static str>, StoreError> {
    store.exec(
        "CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL)",
        &[],
    )?;
    let applied: Vec<String> = store
        .exec("SELECT name FROM schema_migrations", &[])?
        .into_iter()
        .filter_map(|row| row.into_iter().next().and_then(Value::into_text))
        .collect();
    let mut done = Vec::new();
    for migration in migrations {
        if applied.iter().any(|name| name == migration.name) {
            continue;
        }
        store.atomically(|| {
            for statement in statements(migration.sql) {
                store.exec(statement, &[])?;
            }
            store.exec(
                "INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)",
                &[Value::from(migration.name), Value::Int(now_ms)],
            )?;
            Ok::<(), StoreError>(())
        })?;
        done.push(migration.name);
    }
    Ok(done)
}

/// Splits a migration into statements at `;` that end a line; `--` comment
/// lines are dropped.
fn statements(sql: &str) -> impl Iterator<Item = &str> {
    sql.split(";\n")
        .map(str::trim)
        .map(|s| s.trim_end_matches(';'))
        .filter(|s| {
            s.lines()
                .any(|line| !line.trim().is_empty() && !line.trim_start().starts_with("--"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_at_line_ending_semicolons_and_skip_comments() {
        let sql = "-- the schema\nCREATE TABLE a (x TEXT DEFAULT ';');\n\n-- only a comment;\nCREATE INDEX a_x ON a (x);\nINSERT INTO a VALUES ('1;2');";
        assert_eq!(
            statements(sql).collect::<Vec<_>>(),
            [
                "-- the schema\nCREATE TABLE a (x TEXT DEFAULT ';')",
                "CREATE INDEX a_x ON a (x)",
                "INSERT INTO a VALUES ('1;2')",
            ]
        );
        assert_eq!(statements("").count(), 0);
        assert_eq!(statements("-- nothing\n;\n").count(), 0);
    }

    #[test]
    fn every_shipped_migration_has_statements_and_a_unique_name() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert!(statements(m.sql).count() > 0, "{}", m.name);
            assert!(m.name.starts_with(&format!("{:04}_", i + 1)), "{}", m.name);
        }
    }
}

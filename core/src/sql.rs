//! What every machine's statements share: running one over a [`Store`],
//! reading a column back, and the named counters.

use crate::error::EngineError;
use crate::store::{Row, Store, Value};

/// Statements over one [`Store`]. The directory and the call shard each add
/// their own statements in their own `queries` module (inherent `impl`s there,
/// visible only inside that machine), so neither can run the other's.
pub(crate) struct Queries<'s, S: Store> {
    store: &'s S,
}

pub(crate) fn int(row: &Row, i: usize) -> Option<i64> {
    row.get(i).and_then(Value::as_int)
}

pub(crate) fn text(row: &Row, i: usize) -> Option<String> {
    row.get(i).and_then(Value::as_text).map(str::to_owned)
}

impl<'s, S: Store> Queries<'s, S> {
    pub(crate) fn new(store: &'s S) -> Self {
        Self { store }
    }

    pub(crate) fn run(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, EngineError> {
        Ok(self.store.exec(sql, params)?)
    }

    pub(crate) fn first_int(
        &self,
        sql: &str,
        params: &[Value],
    ) -> Result<Option<i64>, EngineError> {
        Ok(self.run(sql, params)?.first().and_then(|r| int(r, 0)))
    }

    // ---- counters ----------------------------------------------------------

    /// Increments each named counter by one and sets each `(name, value)`, in
    /// one statement; returns the incremented counters' new values in the
    /// order of `bump`.
    pub(crate) fn counters(
        &self,
        bump: &[&str],
        set: &[(&str, i64)],
    ) -> Result<Vec<u64>, EngineError> {
        let mut sql = String::from("INSERT INTO counters (name, value) VALUES ");
        let mut params = Vec::with_capacity(2 * (bump.len() + set.len()));
        for (i, name) in bump.iter().enumerate() {
            sql.push_str(if i == 0 { "(?, 1)" } else { ", (?, 1)" });
            params.push(Value::from(*name));
        }
        for (i, (name, value)) in set.iter().enumerate() {
            sql.push_str(if i == 0 && bump.is_empty() {
                "(?, ?)"
            } else {
                ", (?, ?)"
            });
            params.push(Value::from(*name));
            params.push(Value::Int(*value));
        }
        let sets: Vec<String> = set.iter().map(|(n, _)| format!("'{n}'")).collect();
        if sets.is_empty() {
            sql.push_str(" ON CONFLICT (name) DO UPDATE SET value = value + 1");
        } else {
            sql.push_str(&format!(
                " ON CONFLICT (name) DO UPDATE SET value = CASE WHEN name IN ({}) THEN excluded.value ELSE value + 1 END",
                sets.join(", ")
            ));
        }
        sql.push_str(" RETURNING name, value");
        let rows = self.run(&sql, &params)?;
        bump.iter()
            .map(|name| {
                let value = rows
                    .iter()
                    .find(|r| r.first().and_then(Value::as_text) == Some(name))
                    .and_then(|r| int(r, 1))
                    .ok_or_else(|| EngineError::Corrupt(format!("counter {name}")))?;
                if value as u64 > crate::MAX_SAFE_INTEGER || value < 1 {
                    return Err(EngineError::Corrupt(format!("counter {name} exhausted")));
                }
                Ok(value as u64)
            })
            .collect()
    }

    /// Sets a named counter.
    pub(crate) fn set_counter(&self, name: &str, value: i64) -> Result<(), EngineError> {
        self.run(
            "INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            &[name.into(), Value::Int(value)],
        )?;
        Ok(())
    }

    /// A named counter (0 when absent).
    pub(crate) fn counter(&self, name: &str) -> Result<i64, EngineError> {
        Ok(self
            .first_int("SELECT value FROM counters WHERE name = ?", &[name.into()])?
            .unwrap_or(0))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::store::migrate;
    use crate::store::sqlite::SqliteStore;

    #[test]
    fn counters_bump_and_set_in_one_statement() {
        let store = SqliteStore::in_memory().unwrap();
        migrate(&store, 0).unwrap();
        let q = Queries::new(&store);
        assert_eq!(q.counters(&["epoch", "decision"], &[]).unwrap(), vec![1, 1]);
        assert_eq!(
            q.counters(&["epoch"], &[("last_webhook_at", 77)]).unwrap(),
            vec![2]
        );
        q.set_counter("last_webhook_at", 78).unwrap();
        assert_eq!(q.counter("epoch").unwrap(), 2);
        assert_eq!(q.counter("decision").unwrap(), 1);
        assert_eq!(q.counter("last_webhook_at").unwrap(), 78);
    }
}

//! The core's [`Store`] over the Durable Object's SQLite storage.
//!
//! # One crossing per statement
//!
//! Each statement is one call into a small JavaScript helper
//! (`callfence_exec`, inline in this module) that runs `sql.exec(query, ...bindings)` and hands every row
//! back at once as one JSON text (`cursor.raw().toArray()`), which the wasm
//! side parses. Going through workers-rs's cursor instead costs a crossing
//! per row and several per column (iterator, `done`, `value`, one type test
//! after another), which made SQL the largest share of the Dispatcher's
//! time per webhook (see docs/performance.md).
//!
//! # Value mapping
//!
//! | core [`Value`] | JSON from the runtime | notes |
//! |---|---|---|
//! | `Null` | `null` | |
//! | `Int(i)` | a whole number | binding outside ±(2^53−1) is an error: the runtime carries it as a JavaScript number and would round it |
//! | `Real(f)` | a fractional number | a whole `REAL` reads back as `Int` (the core's [`Value::as_int`] takes both) |
//! | `Text(s)` | a string | |
//!
//! The schema stores no BLOBs; a blob column would read back as an object
//! and is an error.
//!
//! # Atomicity
//!
//! [`Store::atomically`] runs its unit inside the runtime's
//! `ctx.storage.transactionSync()`: when the unit returns an error, the
//! helper throws inside the transaction so the runtime rolls back every
//! statement of the unit, then reports the rollback to Rust. (The DO's SQL
//! API refuses `BEGIN`/`SAVEPOINT` statements, and workers-rs 0.8.7 binds no
//! `transactionSync`, hence the helper.) Statements outside a unit (the
//! read-only views) each commit on their own, as before.
//!
//! # Test-only fault switch and counters
//!
//! Only in a `testing` build (the cargo feature; never the deployed Worker):
//! `CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES=N` makes every atomic unit fail at
//! its (N+1)-th writing statement, so an end-to-end test can show that a
//! unit which fails half-way leaves nothing behind. Never set it in a
//! deployment (docs/operations.md, "Test-only timing variables"). The same
//! build counts the statements run and the time spent in them, for the
//! Dispatcher's profile (`dispatcher::profile`).

use callfence_core::store::{Row, Store, StoreError, Value};
use callfence_core::MAX_SAFE_INTEGER;
use std::cell::Cell;
use wasm_bindgen::prelude::*;

#[wasm_bindgen(inline_js = r#"
const ROLLBACK = new Error("callfence: unit failed, rolled back");
export function callfence_exec(sql, query, params) {
  const cursor = sql.exec(query, ...JSON.parse(params));
  return JSON.stringify(cursor.raw().toArray());
}
export function callfence_atomically(storage, unit) {
  try {
    storage.transactionSync(() => { if (!unit()) throw ROLLBACK; });
    return true;
  } catch (e) {
    if (e === ROLLBACK) return false;
    throw e;
  }
}
"#)]
extern "C" {
    /// Runs one statement; every row as one JSON array of arrays.
    #[wasm_bindgen(catch)]
    fn callfence_exec(sql: &JsValue, query: &str, params: &str) -> Result<String, JsValue>;

    /// Runs `unit` in `storage.transactionSync`; `false` when `unit`
    /// returned `false` and the transaction was rolled back.
    #[wasm_bindgen(catch)]
    fn callfence_atomically(
        storage: &JsValue,
        unit: &mut dyn FnMut() -> bool,
    ) -> Result<bool, JsValue>;
}

/// The Dispatcher's SQLite database as a core [`Store`].
pub struct DoStore {
    /// `ctx.storage.sql`.
    sql: JsValue,
    /// `ctx.storage`, for `transactionSync`.
    storage: JsValue,
    /// Depth of nested [`Store::atomically`] units (only the outermost one
    /// opens a transaction).
    depth: Cell<u32>,
    /// Writing statements so far in the current unit (for the fault switch).
    #[cfg(feature = "testing")]
    writes: Cell<u32>,
    /// `CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES`, once armed (after the
    /// migrations: the switch is for the Dispatcher's own units).
    #[cfg(feature = "testing")]
    fail_after_writes: Cell<Option<u32>>,
    /// Statements run since construction (for the profile).
    #[cfg(feature = "testing")]
    statements: Cell<u64>,
    /// Milliseconds inside statements since construction (for the profile).
    #[cfg(feature = "testing")]
    sql_ms: Cell<i64>,
}

impl DoStore {
    /// Wraps the Durable Object's storage.
    pub fn new(state: &worker::State) -> Self {
        let raw: &JsValue = state.as_raw();
        let storage = worker::js_sys::Reflect::get(raw, &JsValue::from_str("storage"))
            .unwrap_or(JsValue::UNDEFINED);
        let sql = worker::js_sys::Reflect::get(&storage, &JsValue::from_str("sql"))
            .unwrap_or(JsValue::UNDEFINED);
        Self {
            sql,
            storage,
            depth: Cell::new(0),
            #[cfg(feature = "testing")]
            writes: Cell::new(0),
            #[cfg(feature = "testing")]
            fail_after_writes: Cell::new(None),
            #[cfg(feature = "testing")]
            statements: Cell::new(0),
            #[cfg(feature = "testing")]
            sql_ms: Cell::new(0),
        }
    }
}

#[cfg(feature = "testing")]
impl DoStore {
    /// Statements run, and milliseconds spent in them, since the Durable
    /// Object started (see [`profile`](super::profile)).
    pub fn spent(&self) -> (u64, i64) {
        (self.statements.get(), self.sql_ms.get())
    }

    /// Arms the test-only fault switch (see the module doc); the schema
    /// migrations run before it is armed.
    pub fn arm_fault_switch(&self, fail_after_writes: Option<u32>) {
        self.fail_after_writes.set(fail_after_writes);
    }

    /// The fault switch: an error when this statement would pass the
    /// allowed number of writes in the current unit.
    fn fault(&self, sql: &str) -> Result<(), StoreError> {
        let Some(limit) = self.fail_after_writes.get() else {
            return Ok(());
        };
        if self.depth.get() == 0 || !is_write(sql) {
            return Ok(());
        }
        let writes = self.writes.get() + 1;
        self.writes.set(writes);
        if writes > limit {
            return Err(StoreError(format!(
                "test fault: write {writes} of a unit refused (CALLFENCE_TEST_FAIL_UNIT_AFTER_WRITES={limit})"
            )));
        }
        Ok(())
    }
}

/// True for a statement that writes.
#[cfg(feature = "testing")]
fn is_write(sql: &str) -> bool {
    let head = sql.trim_start().get(..7).unwrap_or_default();
    ["INSERT", "UPDATE", "DELETE", "REPLACE"]
        .iter()
        .any(|verb| head.len() >= verb.len() && head[..verb.len()].eq_ignore_ascii_case(verb))
}

fn js_error(e: JsValue) -> StoreError {
    StoreError(
        e.as_string()
            .or_else(|| {
                worker::js_sys::Reflect::get(&e, &JsValue::from_str("message"))
                    .ok()
                    .and_then(|m| m.as_string())
            })
            .unwrap_or_else(|| "the SQL binding threw".to_owned()),
    )
}

impl Store for DoStore {
    fn exec(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, StoreError> {
        #[cfg(feature = "testing")]
        self.fault(sql)?;
        #[cfg(feature = "testing")]
        let started = crate::clock::now_ms();
        let params = encode_params(params)?;
        let rows = callfence_exec(&self.sql, sql, &params)
            .map_err(js_error)
            .and_then(|rows| decode_rows(&rows));
        #[cfg(feature = "testing")]
        {
            self.statements.set(self.statements.get() + 1);
            self.sql_ms
                .set(self.sql_ms.get() + crate::clock::now_ms() - started);
        }
        rows
    }

    fn atomically<T, E: From<StoreError>>(
        &self,
        work: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        if self.depth.get() > 0 {
            return work();
        }
        self.depth.set(1);
        #[cfg(feature = "testing")]
        self.writes.set(0);
        let mut work = Some(work);
        let mut outcome: Option<Result<T, E>> = None;
        let mut unit = || {
            let result = work.take().map(|w| w());
            let ok = matches!(result, Some(Ok(_)));
            outcome = result;
            ok
        };
        let ran = callfence_atomically(&self.storage, &mut unit);
        self.depth.set(0);
        match (ran, outcome) {
            // Committed, or rolled back because the unit failed: its own
            // result says which.
            (Ok(_), Some(result)) => result,
            // The runtime threw (the commit failed, or the unit never ran):
            // nothing of it is stored.
            (Err(e), _) => Err(E::from(js_error(e))),
            (Ok(_), None) => Err(E::from(StoreError(
                "transactionSync did not run the unit".to_owned(),
            ))),
        }
    }
}

/// The bindings as a JSON array, refusing integers the runtime would round.
pub fn encode_params(params: &[Value]) -> Result<String, StoreError> {
    let mut out = Vec::with_capacity(params.len());
    for value in params {
        out.push(match value {
            Value::Null => serde_json::Value::Null,
            Value::Int(i) if i.unsigned_abs() <= MAX_SAFE_INTEGER => serde_json::Value::from(*i),
            Value::Int(i) => {
                return Err(StoreError(format!(
                    "integer {i} is outside ±(2^53−1) and cannot be bound"
                )))
            }
            Value::Real(f) => serde_json::Number::from_f64(*f)
                .map(serde_json::Value::Number)
                .ok_or_else(|| StoreError(format!("{f} cannot be bound")))?,
            Value::Text(s) => serde_json::Value::from(s.as_str()),
        });
    }
    serde_json::to_string(&out).map_err(|e| StoreError(e.to_string()))
}

/// The rows the helper returned.
pub fn decode_rows(text: &str) -> Result<Vec<Row>, StoreError> {
    let rows: Vec<Vec<serde_json::Value>> =
        serde_json::from_str(text).map_err(|e| StoreError(format!("rows: {e}")))?;
    rows.into_iter()
        .map(|row| row.into_iter().map(from_json).collect())
        .collect()
}

/// A column as a core value.
fn from_json(value: serde_json::Value) -> Result<Value, StoreError> {
    Ok(match value {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Int(i64::from(b)),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) if i.unsigned_abs() <= MAX_SAFE_INTEGER => Value::Int(i),
            _ => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER as f64 => {
                    Value::Int(f as i64)
                }
                Some(f) => Value::Real(f),
                None => return Err(StoreError(format!("unreadable number {n}"))),
            },
        },
        serde_json::Value::String(s) => Value::Text(s),
        other => return Err(StoreError(format!("unexpected column value {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: i64 = MAX_SAFE_INTEGER as i64;

    #[test]
    fn values_round_trip_through_the_helpers_json() {
        let values = vec![
            Value::Null,
            Value::Int(0),
            Value::Int(MAX),
            Value::Int(-MAX),
            Value::Real(1.5),
            Value::Text("héllo \"quoted\"\n".into()),
        ];
        // The helper binds the params and hands the row back as the same JSON.
        let params = encode_params(&values).unwrap();
        let rows = decode_rows(&format!("[{params}]")).unwrap();
        assert_eq!(rows, vec![values]);
    }

    #[test]
    fn integers_beyond_the_safe_range_are_refused() {
        for i in [MAX + 1, -(MAX + 1), i64::MAX, i64::MIN] {
            assert!(encode_params(&[Value::Int(i)]).is_err(), "{i}");
        }
        assert!(encode_params(&[Value::Real(f64::NAN)]).is_err());
    }

    #[test]
    fn runtime_numbers_and_odd_columns() {
        // A whole number handed over as a float is an integer; a number the
        // runtime could not hand over exactly is not.
        assert_eq!(
            decode_rows("[[3.0, true]]").unwrap(),
            vec![vec![Value::Int(3), Value::Int(1)]]
        );
        assert_eq!(decode_rows("[[1e300]]").unwrap()[0][0].as_int(), None);
        // A blob arrives as an object: refused.
        assert!(decode_rows("[[{}]]").is_err());
        assert!(decode_rows("not json").is_err());
    }

    #[cfg(feature = "testing")]
    #[test]
    fn writes_are_told_from_reads() {
        for sql in [
            "INSERT INTO t",
            "  update t",
            "DELETE FROM t",
            "REPLACE INTO t",
        ] {
            assert!(is_write(sql), "{sql}");
        }
        for sql in ["SELECT 1", "WITH x AS", "", "UP"] {
            assert!(!is_write(sql), "{sql}");
        }
    }
}

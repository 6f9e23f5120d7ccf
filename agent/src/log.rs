//! Structured logs: one JSON object per line on stderr, with `at`, `level`
//! and `event`, plus fields chosen by the caller.
//!
//! Callers pass only identifiers, codes and counts. Keys, the Telnyx API key,
//! signatures, assertions, media tokens and request or response bodies are
//! never passed here; phone numbers go through
//! `callfence_core::number::mask` first.

use serde_json::{Map, Value};

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Normal operation.
    Info,
    /// Something an operator may want to look at.
    Warn,
    /// Something failed.
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// Renders one log line (without the newline). `fields` should be a JSON
/// object; anything else is stored under `detail`.
pub fn line(level: Level, event: &str, fields: Value, now_ms: i64) -> String {
    let mut obj = Map::new();
    obj.insert(
        "at".into(),
        Value::String(callfence_core::time::format_ms(now_ms)),
    );
    obj.insert("level".into(), Value::String(level.as_str().into()));
    obj.insert("event".into(), Value::String(event.into()));
    match fields {
        Value::Object(map) => {
            for (k, v) in map {
                obj.entry(k).or_insert(v);
            }
        }
        Value::Null => {}
        other => {
            obj.insert("detail".into(), other);
        }
    }
    Value::Object(obj).to_string()
}

/// Writes one line at `level`.
pub fn emit(level: Level, event: &str, fields: Value) {
    eprintln!("{}", line(level, event, fields, crate::clock::now_ms()));
}

/// Writes one `info` line.
pub fn info(event: &str, fields: Value) {
    emit(Level::Info, event, fields);
}

/// Writes one `warn` line.
pub fn warn(event: &str, fields: Value) {
    emit(Level::Warn, event, fields);
}

/// Writes one `error` line.
pub fn error(event: &str, fields: Value) {
    emit(Level::Error, event, fields);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_line_is_one_json_object_with_the_fixed_fields_first_class() {
        let text = line(
            Level::Warn,
            "beat_refused",
            json!({"code": "stale_seq", "event": "x"}),
            0,
        );
        assert!(!text.contains('\n'));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["level"], "warn");
        assert_eq!(
            v["event"], "beat_refused",
            "a field cannot overwrite the event name"
        );
        assert_eq!(v["code"], "stale_seq");
        assert_eq!(v["at"], "1970-01-01T00:00:00.000Z");
    }
}

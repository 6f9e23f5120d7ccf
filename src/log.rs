//! Logs: one JSON line per request, and one per misconfigured capability
//! when an isolate first reads its configuration.
//!
//! A request line holds the method, the path without its query, the status,
//! the duration (`ms`, wall time from the request's arrival to its answer),
//! for carrier webhooks the part of it spent awaiting the Dispatcher and the
//! origin (`wait_ms`, so `ms - wait_ms` approximates the Worker's own CPU
//! time: see [`RequestLog::waited`]), the error code if any, and the
//! identifiers learnt while serving it (event, session, node), with phone
//! numbers masked. It never
//! holds keys, tokens, signatures, assertions, media tokens or bodies: the
//! fields below are the only ones there are, and callers fill them with
//! identifiers only after they were checked.

use callfence_core::number::mask;
use serde_json::{json, Map, Value};

/// Longest path kept in a line (paths are attacker-chosen).
pub const MAX_PATH_CHARS: usize = 256;
/// Longest identifier kept in a line.
pub const MAX_ID_CHARS: usize = 128;

/// The log line of one request, filled in while it is served.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    method: String,
    path: String,
    fields: Map<String, Value>,
}

impl RequestLog {
    /// Starts the line of a request. `path` must not include the query.
    pub fn new(method: &str, path: &str) -> Self {
        Self {
            method: bounded(method, 16),
            path: bounded(path, MAX_PATH_CHARS),
            fields: Map::new(),
        }
    }

    /// Records the node a request was verified to come from.
    pub fn node(&mut self, node: &str) {
        self.id("node", node);
    }

    /// Records a Telnyx event id.
    pub fn event_id(&mut self, event_id: &str) {
        self.id("event_id", event_id);
    }

    /// Records a call session id.
    pub fn call_session_id(&mut self, call_session_id: &str) {
        self.id("call_session_id", call_session_id);
    }

    /// Records a phone number under `field` (`from`, `to`), masked.
    pub fn number(&mut self, field: &'static str, raw: &str) {
        self.fields.insert(field.into(), Value::from(mask(raw)));
    }

    /// Adds `ms` to `wait_ms`: time spent awaiting another party (the
    /// Dispatcher's reply, the origin's answer) rather than running the
    /// Worker's own code. In local workerd `Date.now()` advances during CPU
    /// work, so `ms - wait_ms` there approximates the Worker's CPU time for
    /// the request; in production the clock stands still during CPU work.
    pub fn waited(&mut self, ms: i64) {
        let total = self
            .fields
            .get("wait_ms")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        self.fields
            .insert("wait_ms".into(), Value::from(total + ms.max(0)));
    }

    /// Records the stable error code the request was answered with.
    pub fn error(&mut self, code: &str) {
        self.fields
            .insert("error".into(), Value::from(bounded(code, MAX_ID_CHARS)));
    }

    fn id(&mut self, field: &'static str, value: &str) {
        self.fields
            .insert(field.into(), Value::from(bounded(value, MAX_ID_CHARS)));
    }

    /// The finished line.
    pub fn line(&self, status: u16, ms: i64) -> String {
        let mut line = Map::with_capacity(self.fields.len() + 4);
        line.insert("method".into(), Value::from(self.method.as_str()));
        line.insert("path".into(), Value::from(self.path.as_str()));
        line.insert("status".into(), Value::from(status));
        line.insert("ms".into(), Value::from(ms));
        line.extend(self.fields.clone());
        Value::Object(line).to_string()
    }

    /// Writes the finished line to the Worker's log.
    pub fn emit(&self, status: u16, ms: i64) {
        worker::console_log!("{}", self.line(status, ms));
    }
}

/// Logs a misconfigured capability (its name, as `config::Capability::as_str`)
/// and which variables are at fault, never their values.
pub fn misconfigured(capability: &str, variables: &[&str]) {
    worker::console_error!("{}", misconfigured_line(capability, variables));
}

/// Warns, once per isolate, that node signatures are not pinned to this
/// edge's host names (`EDGE_HOSTNAMES` unset, SPEC §6).
pub fn edge_hostnames_unset() {
    worker::console_warn!(
        "{}",
        json!({"config": "warning", "variable": "EDGE_HOSTNAMES", "problem": "unset: node signatures for any host are accepted"})
    );
}

fn misconfigured_line(capability: &str, variables: &[&str]) -> String {
    json!({
        "config": "misconfigured",
        "capability": capability,
        "variables": variables,
    })
    .to_string()
}

/// At most `max` characters of `text`, control characters replaced.
fn bounded(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_with_masked_numbers() {
        let mut log = RequestLog::new("POST", "/v1/telnyx/webhook");
        log.event_id("evt-1");
        log.node("M1");
        log.number("from", "+14155550100");
        log.error("no_eligible_node");
        log.waited(3);
        log.waited(2);
        let line = log.line(503, 7);
        assert!(!line.contains('\n'));
        let value: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            value,
            json!({"method": "POST", "path": "/v1/telnyx/webhook", "status": 503, "ms": 7,
                   "event_id": "evt-1", "node": "M1", "from": "+*******0100",
                   "error": "no_eligible_node", "wait_ms": 5})
        );
    }

    #[test]
    fn attacker_chosen_text_is_bounded_and_cleaned() {
        let long = format!("/v1/calls/{}\n", "x".repeat(1000));
        let log = RequestLog::new("GET", &long);
        let value: Value = serde_json::from_str(&log.line(404, 0)).unwrap();
        let path = value["path"].as_str().unwrap();
        assert_eq!(path.chars().count(), MAX_PATH_CHARS);
        assert!(!path.contains('\n'));
    }

    #[test]
    fn configuration_problems_name_variables_only() {
        let line = misconfigured_line("admin", &["ADMIN_TOKENS"]);
        assert_eq!(
            serde_json::from_str::<Value>(&line).unwrap(),
            json!({"config": "misconfigured", "capability": "admin", "variables": ["ADMIN_TOKENS"]})
        );
    }
}

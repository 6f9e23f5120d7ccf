//! Where the Dispatcher's time goes, per operation: a rerunnable profile
//! for `make bench` (the `profile` message, which no public route serves;
//! the bench asks the Durable Object directly).
//!
//! Times are sums of `Date.now()` differences in milliseconds. Each reading
//! has a resolution of 1 ms, but summed over many requests whose start is
//! unrelated to the clock's ticks the error averages out, so a sum divided
//! by the request count estimates the mean time of each part. (Local
//! workerd advances `Date.now()` during CPU work; production does not, so
//! this is a local tool.)

use serde::Serialize;
use std::collections::BTreeMap;

/// The totals of one operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OpProfile {
    /// Requests served.
    pub count: u64,
    /// From the request's arrival in `fetch` to its answer.
    pub total_ms: i64,
    /// Reading the body and decoding the message.
    pub decode_ms: i64,
    /// The engine's work and encoding the answer (SQL included, awaiting
    /// origins excluded).
    pub serve_ms: i64,
    /// Awaiting origins (the Dispatcher's own forwards: webhooks of a
    /// version 2 Worker, the alarm's re-drives).
    pub origin_ms: i64,
    /// Inside SQL statements (binding, running, reading rows back).
    pub sql_ms: i64,
    /// SQL statements run.
    pub statements: u64,
    /// Deciding and arming the alarm (awaits included).
    pub arm_ms: i64,
    /// Calls to the runtime's alarm API (`getAlarm`, `setAlarm`).
    pub alarm_api_calls: u64,
}

impl OpProfile {
    /// Adds one request's figures.
    pub fn add(&mut self, other: &OpProfile) {
        self.count += other.count;
        self.total_ms += other.total_ms;
        self.decode_ms += other.decode_ms;
        self.serve_ms += other.serve_ms;
        self.origin_ms += other.origin_ms;
        self.sql_ms += other.sql_ms;
        self.statements += other.statements;
        self.arm_ms += other.arm_ms;
        self.alarm_api_calls += other.alarm_api_calls;
    }
}

/// Every operation's totals since the Durable Object started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// By operation name (`webhook`, `report`, ..., `alarm`).
    pub ops: BTreeMap<&'static str, OpProfile>,
}

impl Profile {
    /// Records one request of `op`.
    pub fn record(&mut self, op: &'static str, figures: &OpProfile) {
        self.ops.entry(op).or_default().add(figures);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_add_up_per_operation() {
        let mut profile = Profile::default();
        let one = OpProfile {
            count: 1,
            total_ms: 3,
            sql_ms: 1,
            statements: 9,
            ..OpProfile::default()
        };
        profile.record("webhook", &one);
        profile.record("webhook", &one);
        profile.record("report", &one);
        assert_eq!(profile.ops["webhook"].statements, 18);
        assert_eq!(profile.ops["webhook"].count, 2);
        assert_eq!(profile.ops["report"].total_ms, 3);
        let json = serde_json::to_value(&profile).unwrap();
        assert_eq!(json["ops"]["webhook"]["sql_ms"], 2);
    }
}

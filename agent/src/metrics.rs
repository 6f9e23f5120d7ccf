//! The agent's Prometheus metrics (SPEC §17), in the text exposition format
//! 0.0.4, written by the Prometheus project's own client
//! (`prometheus-client`): the agent never spells the format itself.
//!
//! Why `prometheus-client` rather than `metrics` with
//! `metrics-exporter-prometheus`: it is the Prometheus project's own client;
//! families are typed values with label sets as Rust types (a label cannot
//! be misspelt at one call site), not string-keyed macros behind a
//! process-wide recorder; it writes the text format 0.0.4 the edge serves;
//! and it brings no HTTP server, runtime task or protobuf, so the agent
//! serves the text from its own bounded listeners ([`crate::serve`]).
//!
//! One [`Metrics`] per process ([`global`]): the tasks that see an event
//! (the heartbeat loop, the origin proxy, the local API, the deploy job)
//! count it with one call, and a scrape ([`Metrics::render`]) adds what is
//! read at that moment (the mode, the ledger's depth, the last accepted
//! beat's age). Served at `GET /metrics` on the local API (with its token)
//! and, when `listen.metrics_listen` is set, on a listener of its own
//! ([`crate::scrape::router`]) where `/metrics` is the only route.
//!
//! Families (all `callfence_agent_`):
//!
//! | family | type | labels |
//! |---|---|---|
//! | `beats_total` | counter | `result`: `accepted`, `refused`, `unreachable` |
//! | `beats_refused_total` | counter | `reason`: the edge's error code |
//! | `last_beat_age_seconds` | gauge | — (absent before the first accepted beat) |
//! | `mode` | gauge | `mode`: `active`, `shadow`, `drained` (1 for the current) |
//! | `eligible` | gauge | — (the edge's verdict on the last accepted beat) |
//! | `ineligible_reason` | gauge | `reason` (1 per reason of that verdict) |
//! | `forwards_total` | counter | `result`: `delivered`, `app_failed`, `in_progress`, `ledger_failed`, `refused` |
//! | `forwards_refused_total` | counter | `reason`: the assertion or signature code, `not_active` |
//! | `ledger_events` | gauge | `state`: `received`, `completed` |
//! | `fence_requests_total` | counter | `result`: `granted`, `regranted`, `unavailable`, or the edge's refusal code |
//! | `app_ready` | gauge | — (the app's readiness in the last beat) |
//! | `deploy_step_duration_seconds` | histogram | `step`, `outcome`: `ok`, `failed` |
//! | `deploys_total` | counter | `kind`: `deploy`, `rollback`, `recover`; `outcome`: `ok`, `failed`, `restored` |
//! | `info` | gauge | `version`, `sha` (always 1) |
//!
//! # Invariants
//!
//! - No label value is a phone number, a call, session or event id, or a
//!   token: open-ended values (reason codes from the edge or from core)
//!   pass [`code_label`], which keeps only short lowercase codes that begin
//!   with a letter, and names anything else `other`.
//! - The series an alert compares across scrapes (`beats_total`,
//!   `forwards_total`, `fence_requests_total`' usual results,
//!   `deploys_total`) exist at 0 from the start, so the first event after a
//!   restart is an increase Prometheus can see.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;

use prometheus_client::encoding::{prometheus_text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use callfence_core::wire::FenceGrant;

use crate::fence::NoFence;
use crate::forward::Delivery;
use crate::heartbeat::BeatRecord;
use crate::mode::NodeMode;

/// The `Content-Type` of an exposition.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The longest open-ended label value kept ([`code_label`]).
const MAX_CODE_LEN: usize = 48;

/// Upper bounds (seconds) of the deploy step histogram: a health check
/// takes milliseconds, a build or a drain minutes.
const STEP_BUCKETS: [f64; 12] = [
    0.05, 0.25, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0,
];

/// One label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

/// One label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// One label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabel {
    mode: String,
}

/// One label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeployLabels {
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    version: String,
    sha: String,
}

/// A gauge with no labels that is absent until it has a value.
type Optional = Family<Vec<(String, String)>, Gauge<f64, AtomicU64>>;

type StepHistogram = Family<StepLabels, Histogram, fn() -> Histogram>;

fn step_histogram() -> Histogram {
    Histogram::new(STEP_BUCKETS)
}

/// What a scrape reads at the moment it is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The persisted mode.
    pub mode: NodeMode,
    /// Ledger entries `received` and `completed`, when the ledger answered.
    pub ledger: Option<(u64, u64)>,
    /// Now (Unix ms).
    pub now_ms: i64,
}

/// The process's metrics: a registry and a handle to each family.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    beats: Family<ResultLabel, Counter>,
    beats_refused: Family<ReasonLabel, Counter>,
    last_accepted_ms: AtomicI64,
    last_beat_age: Optional,
    mode: Family<ModeLabel, Gauge>,
    eligible: Optional,
    ineligible_reason: Family<ReasonLabel, Gauge>,
    forwards: Family<ResultLabel, Counter>,
    forwards_refused: Family<ReasonLabel, Counter>,
    ledger_events: Family<StateLabel, Gauge>,
    fence_requests: Family<ResultLabel, Counter>,
    app_ready: Optional,
    deploy_steps: StepHistogram,
    deploys: Family<DeployLabels, Counter>,
    info: Family<InfoLabels, Gauge>,
}

/// The process's one [`Metrics`].
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// `code` when it is a short lowercase code (`[a-z][a-z0-9_]*`, at most
/// 48 bytes), else `other`: what reaches a label from the
/// edge or from an error is never an id, a number or a token.
pub fn code_label(code: &str) -> String {
    let is_code = code.len() <= MAX_CODE_LEN
        && code.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
        && code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if is_code { code } else { "other" }.to_string()
}

fn result(result: &str) -> ResultLabel {
    ResultLabel {
        result: result.to_string(),
    }
}

fn reason(code: &str) -> ReasonLabel {
    ReasonLabel {
        reason: code_label(code),
    }
}

fn no_labels() -> Vec<(String, String)> {
    Vec::new()
}

fn flag(on: bool) -> f64 {
    if on {
        1.0
    } else {
        0.0
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every family, the usual series at 0.
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("callfence_agent"),
            beats: Family::default(),
            beats_refused: Family::default(),
            last_accepted_ms: AtomicI64::new(0),
            last_beat_age: Optional::default(),
            mode: Family::default(),
            eligible: Optional::default(),
            ineligible_reason: Family::default(),
            forwards: Family::default(),
            forwards_refused: Family::default(),
            ledger_events: Family::default(),
            fence_requests: Family::default(),
            app_ready: Optional::default(),
            deploy_steps: StepHistogram::new_with_constructor(step_histogram),
            deploys: Family::default(),
            info: Family::default(),
        };
        m.registry.register(
            "beats",
            "Heartbeats sent, by the edge's answer",
            m.beats.clone(),
        );
        m.registry.register(
            "beats_refused",
            "Heartbeats the edge refused, by its error code",
            m.beats_refused.clone(),
        );
        m.registry.register(
            "last_beat_age_seconds",
            "Seconds since the last heartbeat the edge accepted",
            m.last_beat_age.clone(),
        );
        m.registry.register(
            "mode",
            "The node's persisted mode (1 for the current one)",
            m.mode.clone(),
        );
        m.registry.register(
            "eligible",
            "The edge's eligibility verdict on the last accepted heartbeat (1 eligible)",
            m.eligible.clone(),
        );
        m.registry.register(
            "ineligible_reason",
            "1 for each reason the edge gave for finding the node ineligible",
            m.ineligible_reason.clone(),
        );
        m.registry.register(
            "forwards",
            "Webhooks the edge forwarded to the origin proxy, by result",
            m.forwards.clone(),
        );
        m.registry.register(
            "forwards_refused",
            "Forwards refused before the app, by reason",
            m.forwards_refused.clone(),
        );
        m.registry.register(
            "ledger_events",
            "Events in the webhook ledger, by state",
            m.ledger_events.clone(),
        );
        m.registry.register(
            "fence_requests",
            "Answer fences asked of the edge, by result",
            m.fence_requests.clone(),
        );
        m.registry.register(
            "app_ready",
            "The voice app's readiness in the last heartbeat (1 ready)",
            m.app_ready.clone(),
        );
        m.registry.register(
            "deploy_step_duration_seconds",
            "Duration of each deploy, rollback or recovery step, by outcome",
            m.deploy_steps.clone(),
        );
        m.registry.register(
            "deploys",
            "Deploys, rollbacks and recoveries finished, by outcome",
            m.deploys.clone(),
        );
        m.registry.register(
            "info",
            "The agent's version and the runtime checkout's SHA (always 1)",
            m.info.clone(),
        );
        for r in ["accepted", "refused", "unreachable"] {
            let _at_zero = m.beats.get_or_create(&result(r));
        }
        for r in [
            "delivered",
            "app_failed",
            "in_progress",
            "ledger_failed",
            "refused",
        ] {
            let _at_zero = m.forwards.get_or_create(&result(r));
        }
        for r in ["granted", "regranted", "unavailable"] {
            let _at_zero = m.fence_requests.get_or_create(&result(r));
        }
        for kind in ["deploy", "rollback", "recover"] {
            for outcome in ["ok", "failed", "restored"] {
                let _at_zero = m.deploys.get_or_create(&DeployLabels {
                    kind: kind.into(),
                    outcome: outcome.into(),
                });
            }
        }
        m.set_info("unknown");
        m
    }

    fn set_info(&self, sha: &str) {
        let labels = InfoLabels {
            version: crate::AGENT_VERSION.to_string(),
            sha: sha.to_string(),
        };
        if self.info.get(&labels).is_none() {
            self.info.clear();
            self.info.get_or_create(&labels).set(1);
        }
    }

    /// Counts one heartbeat and keeps the edge's verdict, the app's
    /// readiness and the checkout's SHA it reported.
    pub fn beat(&self, rec: &BeatRecord) {
        let outcome = match rec.outcome.as_str() {
            "accepted" | "refused" => rec.outcome.as_str(),
            _ => "unreachable",
        };
        self.beats.get_or_create(&result(outcome)).inc();
        if outcome == "refused" {
            let code = rec.refused.as_deref().unwrap_or("refused");
            self.beats_refused.get_or_create(&reason(code)).inc();
        }
        self.app_ready
            .get_or_create(&no_labels())
            .set(flag(rec.observed.app_ready));
        let sha = &rec.observed.sha;
        if callfence_core::eligibility::is_valid_sha(sha) {
            self.set_info(sha);
        }
        if outcome != "accepted" {
            return;
        }
        self.last_accepted_ms.store(rec.at_ms, Ordering::Relaxed);
        self.eligible
            .get_or_create(&no_labels())
            .set(flag(rec.eligible == Some(true)));
        self.ineligible_reason.clear();
        if rec.eligible == Some(false) {
            for r in &rec.reasons {
                self.ineligible_reason.get_or_create(&reason(r)).set(1);
            }
        }
    }

    /// Counts a forward refused before the ledger (`code`: the assertion's
    /// or the Telnyx signature's error code).
    pub fn forward_refused(&self, code: &str) {
        self.forwards.get_or_create(&result("refused")).inc();
        self.forwards_refused.get_or_create(&reason(code)).inc();
    }

    /// Counts a forward that reached the ledger, by what became of it.
    pub fn forwarded(&self, delivery: &Delivery) {
        let outcome = match delivery {
            Delivery::Answered(_) => "delivered",
            Delivery::NotAdmitted => return self.forward_refused("not_active"),
            Delivery::AppFailed { .. } => "app_failed",
            Delivery::LedgerFailed => "ledger_failed",
            Delivery::InProgress => "in_progress",
        };
        self.forwards.get_or_create(&result(outcome)).inc();
    }

    /// Counts an answer fence by its verdict ([`crate::fence::fence_verdict`]):
    /// `granted` (the first grant), `regranted`, the refusal's code, or
    /// `unavailable`.
    pub fn fence(&self, verdict: &Result<FenceGrant, NoFence>) {
        let outcome = match verdict {
            Ok(grant) if grant.first => "granted".to_string(),
            Ok(_) => "regranted".to_string(),
            Err(NoFence::Refused(code)) => code_label(code),
            Err(NoFence::Unavailable { .. }) => "unavailable".to_string(),
        };
        self.fence_requests.get_or_create(&result(&outcome)).inc();
    }

    /// Records one finished deploy step (`step`, whether it succeeded, how
    /// many milliseconds it took). Plain values, so that the deploy module
    /// and this one do not import each other.
    pub fn deploy_step(&self, step: &str, ok: bool, ms: u64) {
        let labels = StepLabels {
            step: code_label(step),
            outcome: if ok { "ok" } else { "failed" }.to_string(),
        };
        // Milliseconds to seconds; a step's duration is far below 2^53 ms.
        #[allow(clippy::cast_precision_loss)]
        let seconds = ms as f64 / 1000.0;
        self.deploy_steps.get_or_create(&labels).observe(seconds);
    }

    /// Counts a finished deploy, rollback or recovery of `kind`: `ok`, or
    /// not and `restored` (the previous release live and verified again)
    /// or not (`failed`).
    pub fn deploy_finished(&self, kind: &str, ok: bool, restored: bool) {
        let result = match (ok, restored) {
            (true, _) => "ok",
            (false, true) => "restored",
            (false, false) => "failed",
        };
        self.deploys
            .get_or_create(&DeployLabels {
                kind: code_label(kind),
                outcome: result.to_string(),
            })
            .inc();
    }

    /// The exposition, with what `reading` saw at this scrape.
    pub fn render(&self, reading: &Reading) -> String {
        for m in [NodeMode::Active, NodeMode::Shadow, NodeMode::Drained] {
            self.mode
                .get_or_create(&ModeLabel {
                    mode: m.as_str().to_string(),
                })
                .set(i64::from(m == reading.mode));
        }
        if let Some((received, completed)) = reading.ledger {
            for (state, n) in [("received", received), ("completed", completed)] {
                self.ledger_events
                    .get_or_create(&StateLabel {
                        state: state.to_string(),
                    })
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        let accepted = self.last_accepted_ms.load(Ordering::Relaxed);
        if accepted > 0 {
            // Milliseconds since a recent beat: far below 2^53.
            #[allow(clippy::cast_precision_loss)]
            let age = (reading.now_ms - accepted).max(0) as f64 / 1000.0;
            self.last_beat_age.get_or_create(&no_labels()).set(age);
        }
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name_and_labels: &str, text: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    fn reading(mode: NodeMode) -> Reading {
        Reading {
            mode,
            ledger: Some((2, 7)),
            now_ms: 1_000_000,
        }
    }

    fn beat(outcome: &str, eligible: Option<bool>, reasons: &[&str]) -> BeatRecord {
        let mut rec: BeatRecord = serde_json::from_value(serde_json::json!({
            "at": "", "at_ms": 990_000, "seq": 1, "key_id": null, "outcome": outcome,
            "http_status": null, "refused": null, "eligible": eligible,
            "reasons": reasons, "edge_time": null, "clock_skew_ms": null, "routing": null,
            "valid_for_s": 15,
            "observed": {"mode": "active", "mode_note": null, "sha": "a1".repeat(20), "dirty": false,
                         "git_error": null, "app_ready": true, "app_error": null, "max_calls": 4,
                         "active_calls": 0, "tunnel_up": true, "lines": {}, "routing_hash": ""}
        }))
        .unwrap();
        if outcome == "refused" {
            rec.refused = Some("bad_signature".into());
        }
        rec
    }

    #[test]
    fn a_fresh_registry_has_every_alerted_series_at_zero() {
        let text = Metrics::new().render(&reading(NodeMode::Drained));
        for series in [
            "callfence_agent_beats_total{result=\"refused\"}",
            "callfence_agent_forwards_total{result=\"refused\"}",
            "callfence_agent_fence_requests_total{result=\"granted\"}",
            "callfence_agent_deploys_total{kind=\"deploy\",outcome=\"failed\"}",
            "callfence_agent_deploys_total{kind=\"recover\",outcome=\"restored\"}",
            "callfence_agent_mode{mode=\"active\"}",
        ] {
            assert_eq!(sample(series, &text), Some(0.0), "{series} in\n{text}");
        }
        assert_eq!(
            sample("callfence_agent_mode{mode=\"drained\"}", &text),
            Some(1.0)
        );
        assert_eq!(
            sample("callfence_agent_ledger_events{state=\"received\"}", &text),
            Some(2.0)
        );
        assert!(
            !text.contains("callfence_agent_last_beat_age_seconds "),
            "no age before a beat: {text}"
        );
        assert!(text.contains("# TYPE callfence_agent_beats_total counter"));
        assert!(text.contains(&format!(
            "callfence_agent_info{{version=\"{}\",sha=\"unknown\"}} 1",
            crate::AGENT_VERSION
        )));
    }

    #[test]
    fn beats_carry_the_verdict_and_its_reasons_until_the_next_accepted_one() {
        let m = Metrics::new();
        m.beat(&beat("accepted", Some(false), &["mode_drained", "dirty"]));
        m.beat(&beat("refused", None, &[]));
        let text = m.render(&reading(NodeMode::Drained));
        assert_eq!(
            sample("callfence_agent_beats_total{result=\"accepted\"}", &text),
            Some(1.0)
        );
        assert_eq!(
            sample(
                "callfence_agent_beats_refused_total{reason=\"bad_signature\"}",
                &text
            ),
            Some(1.0)
        );
        assert_eq!(sample("callfence_agent_eligible", &text), Some(0.0));
        assert_eq!(
            sample(
                "callfence_agent_ineligible_reason{reason=\"mode_drained\"}",
                &text
            ),
            Some(1.0)
        );
        assert_eq!(
            sample("callfence_agent_last_beat_age_seconds", &text),
            Some(10.0)
        );
        assert!(text.contains(&format!("sha=\"{}\"", "a1".repeat(20))));
        m.beat(&beat("accepted", Some(true), &[]));
        let text = m.render(&reading(NodeMode::Active));
        assert_eq!(sample("callfence_agent_eligible", &text), Some(1.0));
        assert!(!text.contains("ineligible_reason{"), "{text}");
    }

    #[test]
    fn forwards_fences_and_deploys_are_counted_by_result() {
        let m = Metrics::new();
        m.forward_refused("bad_signature");
        m.forwarded(&Delivery::NotAdmitted);
        m.forwarded(&Delivery::InProgress);
        m.fence(&Err(NoFence::Refused("stale_epoch")));
        m.fence(&Err(NoFence::Unavailable {
            edge_status: None,
            why: String::new(),
        }));
        m.deploy_step("build", false, 1_500);
        m.deploy_finished("deploy", false, true);
        let text = m.render(&reading(NodeMode::Active));
        for (series, want) in [
            ("callfence_agent_forwards_total{result=\"refused\"}", 2.0),
            ("callfence_agent_forwards_total{result=\"in_progress\"}", 1.0),
            (
                "callfence_agent_fence_requests_total{result=\"stale_epoch\"}",
                1.0,
            ),
            (
                "callfence_agent_fence_requests_total{result=\"unavailable\"}",
                1.0,
            ),
            (
                "callfence_agent_forwards_refused_total{reason=\"not_active\"}",
                1.0,
            ),
            (
                "callfence_agent_deploys_total{kind=\"deploy\",outcome=\"restored\"}",
                1.0,
            ),
            (
                "callfence_agent_deploy_step_duration_seconds_count{step=\"build\",outcome=\"failed\"}",
                1.0,
            ),
            (
                "callfence_agent_deploy_step_duration_seconds_bucket{step=\"build\",outcome=\"failed\",le=\"2.5\"}",
                1.0,
            ),
        ] {
            assert_eq!(sample(series, &text), Some(want), "{series} in\n{text}");
        }
    }

    #[test]
    fn only_short_lowercase_codes_become_label_values() {
        for code in ["mode_drained", "bad_signature", "sha_not_allowed", "e1"] {
            assert_eq!(code_label(code), code);
        }
        for other in [
            "+15551234567",
            "15551234567",
            "v3:abc-def",
            "3f1e0c1a-7b7e-4a52-9d55-0c1ab2e1f3aa",
            &"ab".repeat(32),
            "Bearer x",
            "",
        ] {
            assert_eq!(code_label(other), "other", "{other}");
        }
    }
}

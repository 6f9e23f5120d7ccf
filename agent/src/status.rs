//! The node's own view (`status` command), built from a fresh observation
//! and the persisted last-beat record ([`crate::heartbeat::load`]).

use serde_json::{json, Value};

use crate::config::Config;
use crate::heartbeat::{load, observe};

/// Gathers the node's view: live mode, checkout, app and tunnel, plus the
/// last beat and the edge's verdict.
pub async fn gather(config: &Config, http: &reqwest::Client, now_ms: i64) -> Value {
    let now = observe(config, http).await;
    let last = load(&config.state_dir);
    let last_beat = last.as_ref().map(|r| {
        json!({
            "at": r.at,
            "age_s": (now_ms - r.at_ms) / 1000,
            "seq": r.seq,
            "key_id": r.key_id,
            "outcome": r.outcome,
            "http_status": r.http_status,
            "refused": r.refused,
            "fresh": r.fresh(now_ms),
        })
    });
    let verdict = last
        .as_ref()
        .filter(|r| r.outcome == "accepted")
        .map(|r| json!({"eligible": r.eligible, "reasons": r.reasons, "routing": r.routing}));
    json!({
        "node": config.node,
        "mode": now.mode,
        "mode_note": now.mode_note,
        "sha": now.sha,
        "clean": !now.dirty,
        "git_error": now.git_error,
        "app_ready": now.app_ready,
        "app_error": now.app_error,
        "capacity": {"max_calls": now.max_calls, "active_calls": now.active_calls},
        "tunnel_up": now.tunnel_up,
        "lines": now.lines,
        "routing_hash": now.routing_hash,
        "last_beat": last_beat,
        "edge_verdict": verdict,
        "clock_skew_ms": last.as_ref().and_then(|r| r.clock_skew_ms),
    })
}

/// Renders the view for a terminal.
pub fn render(view: &Value) -> String {
    let s = |v: &Value| match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<14}{v}\n"));
    line("node", s(&view["node"]));
    let mut mode = s(&view["mode"]);
    if let Some(note) = view["mode_note"].as_str() {
        mode.push_str(&format!("  ({note})"));
    }
    line("mode", mode);
    line("sha", s(&view["sha"]));
    line("clean", s(&view["clean"]));
    if !view["git_error"].is_null() {
        line("git error", s(&view["git_error"]));
    }
    let app = if view["app_ready"] == true {
        "ready".to_string()
    } else {
        format!("not ready ({})", s(&view["app_error"]))
    };
    line("app", app);
    line(
        "capacity",
        format!(
            "{}/{} calls",
            s(&view["capacity"]["active_calls"]),
            s(&view["capacity"]["max_calls"])
        ),
    );
    line(
        "tunnel",
        if view["tunnel_up"] == true {
            "up".into()
        } else {
            "down".into()
        },
    );
    line("routing hash", s(&view["routing_hash"]));
    match view["last_beat"].as_object() {
        None => line("last beat", "none yet".into()),
        Some(b) => line(
            "last beat",
            format!(
                "{} seq {} {}{} ({}s ago, key {})",
                s(&b["at"]),
                s(&b["seq"]),
                s(&b["outcome"]),
                b["refused"]
                    .as_str()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default(),
                s(&b["age_s"]),
                s(&b["key_id"]),
            ),
        ),
    }
    match view["edge_verdict"].as_object() {
        None => line("verdict", "-".into()),
        Some(v) => {
            let reasons: Vec<String> = v["reasons"]
                .as_array()
                .map(|a| a.iter().map(s).collect())
                .unwrap_or_default();
            line(
                "verdict",
                if v["eligible"] == true {
                    "eligible".into()
                } else {
                    format!("not eligible: {}", reasons.join(", "))
                },
            );
        }
    }
    line(
        "clock skew",
        view["clock_skew_ms"]
            .as_i64()
            .map(|ms| format!("{ms} ms"))
            .unwrap_or("-".into()),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_names_the_mode_fallback_and_verdict() {
        let view = json!({"node": "M1", "mode": "drained", "mode_note": "mode file missing: drained until `mode set`",
            "sha": "", "clean": false, "app_ready": false, "app_error": "connect_failed",
            "capacity": {"max_calls": 0, "active_calls": 0}, "tunnel_up": false, "routing_hash": "x",
            "last_beat": null, "edge_verdict": {"eligible": false, "reasons": ["dirty", "app_down"]}, "clock_skew_ms": -12});
        let text = render(&view);
        assert!(text.contains("drained  (mode file missing"));
        assert!(text.contains("not eligible: dirty, app_down"));
        assert!(text.contains("-12 ms"));
        assert!(text.contains("none yet"));
    }
}

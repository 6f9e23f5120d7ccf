//! The local API through the real binary: liveness and readiness, the rule
//! that Telnyx is never called without a granted fence, and a dial reaching
//! the shared fake Telnyx API.

mod common;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fence_means_no_telnyx_call_and_the_node_is_not_ready() {
    let keys = Keys::new();
    let (app_url, _seen) = demo_app().await;
    let telnyx = FakeTelnyx::start();
    let mut n = node(&keys, &app_url, Some(&telnyx.url));
    n.set_mode("active");
    n.start().await;
    let base = format!("http://{}", n.local);
    let http = reqwest::Client::new();

    let r = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503, "no accepted beat: the edge is unreachable");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["mode"], "active");
    assert_eq!(v["app_reachable"], true);
    assert_eq!(v["beat_accepted_and_eligible"], false);

    let r = http
        .post(format!("{base}/local/answer"))
        .json(&json!({"call_control_id": "v3:c1", "call_session_id": "s1", "epoch": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v, json!({"answered": false, "reason": "fence_unavailable"}));
    let r = http
        .post(format!("{base}/local/answer"))
        .json(&json!({"call_control_id": "v3:c1", "call_session_id": "s1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "epoch is required");
    assert_eq!(
        telnyx.record().await,
        Vec::<serde_json::Value>::new(),
        "Telnyx is never called without a fence"
    );

    // A dial needs no fence: Telnyx gets it (with the agent's API key), and
    // the claim that follows fails closed without an edge.
    let r = http
        .post(format!("{base}/local/dial"))
        .json(&json!({"to": "+15105550199", "from": "+15102160079", "connection_id": "c1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (&v["dialed"], &v["claimed"], &v["reason"]),
        (&json!(true), &json!(false), &json!("claim_unavailable"))
    );
    let record = telnyx.record().await;
    assert_eq!(record.len(), 1, "{record:?}");
    assert_eq!(record[0]["action"], "dial");
    assert_eq!(record[0]["body"]["to"], "+15105550199");
    assert_eq!(v["call_control_id"], v["telnyx"]["call_control_id"]);
    assert!(
        !n.log().contains("KEY_test_secret"),
        "the Telnyx API key is never logged"
    );

    let origin_health = http
        .get(format!("http://{}/callfence/health", n.origin))
        .send()
        .await
        .unwrap();
    assert_eq!(
        origin_health.json::<serde_json::Value>().await.unwrap(),
        json!({"status": "ok", "node": NODE})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_sets_drained_and_returns_when_the_app_holds_no_call() {
    let keys = Keys::new();
    let (app_url, _seen) = demo_app().await;
    let n = node(&keys, &app_url, None);
    n.set_mode("active");
    let config = n.config.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .args(["drain", "--deadline", "5s"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["drained"], true);
    assert_eq!(report["active_calls"], 0);
    let mode = n.cmd(&["mode", "get"]);
    assert_eq!(String::from_utf8_lossy(&mode.stdout).trim(), "drained");
}

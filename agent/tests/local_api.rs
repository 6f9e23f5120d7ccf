//! The local API through the real binary: liveness and readiness, the rule
//! that Telnyx is never called without a granted fence, a fence asked again
//! while the edge answers 503, and a dial reaching the shared fake Telnyx
//! API.

mod common;

use common::*;
use serde_json::json;
use std::sync::atomic::Ordering;

/// A node in mode `active` (not started yet) in front of the demo app, with
/// the fake Telnyx API.
async fn active_node() -> (FakeTelnyx, Node) {
    let (app_url, _seen) = demo_app().await;
    let telnyx = FakeTelnyx::start();
    let n = node(&Keys::new(), &app_url, Some(&telnyx.url));
    n.set_mode("active");
    (telnyx, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fence_means_no_telnyx_call_and_the_node_is_not_ready() {
    let (telnyx, mut n) = active_node().await;
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

    let (status, v) = n
        .local(
            "/local/answer",
            Some(&json!({"call_control_id": "v3:c1", "call_session_id": "s1", "epoch": 3})),
        )
        .await;
    assert_eq!(status, 502);
    assert_eq!(v, json!({"answered": false, "reason": "fence_unavailable"}));
    let (status, _) = n
        .local(
            "/local/answer",
            Some(&json!({"call_control_id": "v3:c1", "call_session_id": "s1"})),
        )
        .await;
    assert_eq!(status, 400, "epoch is required");
    assert_eq!(
        telnyx.record().await,
        Vec::<serde_json::Value>::new(),
        "Telnyx is never called without a fence"
    );

    // A dial needs no fence: Telnyx gets it (with the agent's API key and
    // configured connection), and the claim that follows fails closed
    // without an edge.
    let (status, v) = n
        .local(
            "/local/dial",
            Some(&json!({"to": "+15105550199", "from": "+15102160079"})),
        )
        .await;
    assert_eq!(status, 502);
    assert_eq!(
        (&v["dialed"], &v["claimed"], &v["reason"]),
        (&json!(true), &json!(false), &json!("claim_unavailable"))
    );
    let record = telnyx.record().await;
    assert_eq!(record.len(), 1, "{record:?}");
    assert_eq!(record[0]["action"], "dial");
    assert_eq!(record[0]["body"]["to"], "+15105550199");
    assert_eq!(record[0]["body"]["connection_id"], CONNECTION_ID);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_the_edge_answers_503_is_asked_again_and_the_call_answered_once() {
    let (telnyx, mut n) = active_node().await;
    let asked = flaky_edge(n.edge_port, 2).await;
    n.start().await;
    let (status, v) = n
        .local(
            "/local/answer",
            Some(&json!({"call_control_id": "v3:c1", "call_session_id": "s1", "epoch": 3})),
        )
        .await;
    assert_eq!((status, &v["answered"]), (200, &json!(true)), "{v}");
    assert_eq!(asked.load(Ordering::SeqCst), 3, "two 503s, then the grant");
    let answers: Vec<_> = telnyx
        .record()
        .await
        .into_iter()
        .filter(|c| c["action"] == "answer")
        .collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(
        answers[0]["body"]["command_id"],
        "5b3e2a2e-8f0c-5d1e-9a3b-0c1d2e3f4a5b"
    );
}

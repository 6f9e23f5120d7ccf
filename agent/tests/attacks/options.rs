//! Answer and dial options are an allow-list. Observed on the old agent: a
//! `webhook_url` on `/local/answer` was passed to Telnyx, which then sent
//! the call's later webhooks around the edge (past its routing, the fence
//! and the ledger); a dial took any `connection_id`. Now both are refused
//! with 400 `option_not_allowed` before the fence is asked or Telnyx is
//! called, and a dial uses the configured `[telnyx] connection_id`.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_a_webhook_url_is_refused_before_the_fence() {
    let (app_url, _seen) = demo_app().await;
    let telnyx = FakeTelnyx::start();
    let mut n = node(&Keys::new(), &app_url, Some(&telnyx.url));
    n.set_mode("active");
    let edge = flaky_edge(n.edge_port, 0).await;
    n.start().await;
    let call = json!({"call_control_id": "v3:c1", "call_session_id": "s1", "epoch": 3});
    for (option, value) in [
        ("webhook_url", json!("https://attacker.example/hook")),
        ("webhook_url_method", json!("GET")),
        ("command_id", json!("5b3e2a2e-0000-5d1e-9a3b-0c1d2e3f4a5b")),
        ("connection_id", json!("someone-elses")),
        ("not_a_telnyx_option", json!(1)),
    ] {
        let mut body = call.clone();
        body[option] = value;
        let (status, refused) = n.local("/local/answer", Some(&body)).await;
        assert_eq!(
            (status, refused),
            (
                400,
                json!({"error": "option_not_allowed", "option": option})
            )
        );
    }
    let fence_requests = edge.load(Ordering::SeqCst);
    assert_eq!(fence_requests, 0, "the fence was never asked");
    assert_eq!(
        telnyx.record().await,
        Vec::<Value>::new(),
        "Telnyx never called"
    );

    // An allowed option is passed through with the fence's command_id.
    let mut body = call.clone();
    body["client_state"] = json!("e30=");
    let (status, answered) = n.local("/local/answer", Some(&body)).await;
    assert_eq!(
        (status, &answered["answered"]),
        (200, &json!(true)),
        "{answered}"
    );
    let record = telnyx.record().await;
    assert_eq!(record.len(), 1, "{record:?}");
    assert_eq!(record[0]["body"]["client_state"], "e30=");
    assert!(record[0]["body"].get("webhook_url").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_cannot_choose_its_connection_or_webhook_url() {
    let (app_url, _seen) = demo_app().await;
    let telnyx = FakeTelnyx::start();
    let mut n = node(&Keys::new(), &app_url, Some(&telnyx.url));
    n.set_mode("active");
    n.start().await;
    for (option, value) in [
        ("connection_id", json!("someone-elses")),
        ("webhook_url", json!("https://attacker.example/hook")),
        ("webhook_url_method", json!("POST")),
    ] {
        let mut body = json!({"to": "+15105550199", "from": "+15102160079"});
        body[option] = value;
        let (status, refused) = n.local("/local/dial", Some(&body)).await;
        assert_eq!(
            (status, refused),
            (
                400,
                json!({"error": "option_not_allowed", "option": option})
            )
        );
    }
    assert_eq!(telnyx.record().await, Vec::<Value>::new(), "no call placed");
}

//! Durability of the ledger across `kill -9`: an event written `received`
//! whose delivery was cut short is re-delivered and completed after restart,
//! and its duplicate then gets the recorded answer.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_received_event_is_redelivered_after_kill_9() {
    let keys = Keys::new();
    let (app_url, seen) = demo_app().await;
    seen.delays.lock().unwrap().push(5_000);
    let mut n = node(&keys, &app_url, None);
    n.set_mode("active");
    n.start().await;
    let url = n.webhook_url();
    let body = event("evt-k", "call.initiated", "sess-k", "v3:ck");
    let w = good(&keys, &body, 5);
    let first = tokio::spawn({
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .post(&url)
                .header("telnyx-timestamp", &w.telnyx_ts)
                .header("telnyx-signature-ed25519", &w.telnyx_sig)
                .header("Callfence-Assertion", w.assertion.unwrap())
                .body(w.body)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    for _ in 0..100 {
        if seen.calls.load(Ordering::SeqCst) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        seen.calls.load(Ordering::SeqCst),
        1,
        "the app got the event"
    );
    n.kill9();
    assert!(first.await.unwrap().is_err(), "the edge saw no answer");

    n.start().await;
    for _ in 0..100 {
        if seen.calls.load(Ordering::SeqCst) >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        seen.calls.load(Ordering::SeqCst),
        2,
        "re-delivered after restart"
    );
    let reqs = seen.requests.lock().unwrap().clone();
    assert_eq!(reqs[1].1, body);
    assert_eq!(reqs[1].0["callfence-epoch"], "5");
    drop(reqs);

    // The retry that follows gets the answer the re-delivery recorded.
    let mut answer = (0, serde_json::Value::Null);
    for _ in 0..50 {
        answer = send(&url, &good(&keys, &body, 5)).await;
        if answer.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answer, (200, json!({"ok": true, "n": 2})));
    assert_eq!(seen.calls.load(Ordering::SeqCst), 2, "no third delivery");
    assert!(n.log().contains("ledger_resumed"));
}

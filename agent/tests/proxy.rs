//! The origin proxy, through the real binary: forged webhooks never reach the
//! app; a valid one does, with the assertion's epoch and session; duplicates
//! get the recorded answer; a drained node refuses new sessions only.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_webhooks_are_refused_and_never_reach_the_app() {
    let keys = Keys::new();
    let (app_url, seen) = demo_app().await;
    let mut n = node(&keys, &app_url, None);
    n.set_mode("active");
    n.start().await;
    let url = n.webhook_url();
    let body = event("evt-forged", "call.initiated", "sess-f", "v3:cf");

    let mut no_assertion = good(&keys, &body, 3);
    no_assertion.assertion = None;
    let unpinned = webhook(&keys, &body, EDGE_KID, &keys.rogue, NODE, &body, 3);
    let unknown_kid = webhook(&keys, &body, "edge9", &keys.edge, NODE, &body, 3);
    let other_node = webhook(&keys, &body, EDGE_KID, &keys.edge, "M2", &body, 3);
    let other_body = event("evt-forged", "call.initiated", "sess-f", "v3:other");
    let mismatch = webhook(&keys, &other_body, EDGE_KID, &keys.edge, NODE, &body, 3);
    let mut bad_telnyx = good(&keys, &body, 3);
    bad_telnyx.telnyx_sig = good(&keys, &other_body, 3).telnyx_sig;
    let mut no_telnyx = good(&keys, &body, 3);
    no_telnyx.telnyx_sig = String::new();

    for (name, w) in [
        ("no assertion", &no_assertion),
        ("unpinned key", &unpinned),
        ("unknown kid", &unknown_kid),
        ("another node", &other_node),
        ("body mismatch", &mismatch),
        ("bad telnyx signature", &bad_telnyx),
        ("empty telnyx signature", &no_telnyx),
    ] {
        let (status, v) = send(&url, w).await;
        assert_eq!(status, 401, "{name}");
        assert_eq!(v, json!({"callfence": "not_admitted"}), "{name}");
    }
    assert_eq!(
        seen.calls.load(Ordering::SeqCst),
        0,
        "the app was never called"
    );
    let log = n.log();
    assert!(
        !log.contains(no_assertion.telnyx_sig.as_str()),
        "signatures are never logged"
    );
    assert!(
        !log.contains(unpinned.assertion.as_deref().unwrap()),
        "assertions are never logged"
    );
    assert!(log.contains("webhook_refused"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_webhook_reaches_the_app_once_and_duplicates_get_the_recorded_answer() {
    let keys = Keys::new();
    let (app_url, seen) = demo_app().await;
    let mut n = node(&keys, &app_url, None);
    n.start().await;
    let url = n.webhook_url();
    let body = event("evt-1", "call.initiated", "sess-1", "v3:c1");

    // No mode file: drained, and this session was never admitted.
    let (status, v) = send(&url, &good(&keys, &body, 7)).await;
    assert_eq!((status, v), (503, json!({"callfence": "not_admitted"})));
    assert_eq!(seen.calls.load(Ordering::SeqCst), 0);

    n.set_mode("active");
    let mut w = good(&keys, &body, 7);
    w.extra.push(("Callfence-Epoch".into(), "999".into()));
    w.extra
        .push(("Callfence-Call-Session".into(), "forged".into()));
    w.extra.push(("Callfence-Admin".into(), "1".into()));
    let (status, v) = send(&url, &w).await;
    assert_eq!((status, v), (200, json!({"ok": true, "n": 1})));
    {
        let reqs = seen.requests.lock().unwrap();
        let (headers, got) = &reqs[0];
        assert_eq!(got, &body, "raw body passed unchanged");
        assert_eq!(headers["callfence-epoch"], "7");
        assert_eq!(headers["callfence-call-session"], "sess-1");
        assert_eq!(headers.get_all("callfence-epoch").iter().count(), 1);
        assert!(headers.get("callfence-admin").is_none());
        assert!(headers.get("callfence-assertion").is_none());
        assert_eq!(headers["telnyx-timestamp"], w.telnyx_ts.as_str());
        assert_eq!(headers["telnyx-signature-ed25519"], w.telnyx_sig.as_str());
    }

    // A carrier retry (new signature, new assertion attempt): recorded answer.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, v) = send(&url, &good(&keys, &body, 7)).await;
    assert_eq!((status, v), (200, json!({"ok": true, "n": 1})));
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1, "no second app call");

    // Drained: the admitted session continues, a new one is refused.
    n.set_mode("drained");
    let hangup = event("evt-2", "call.hangup", "sess-1", "v3:c1");
    let (status, _) = send(&url, &good(&keys, &hangup, 7)).await;
    assert_eq!(status, 200);
    let other = event("evt-3", "call.initiated", "sess-2", "v3:c2");
    let (status, v) = send(&url, &good(&keys, &other, 8)).await;
    assert_eq!((status, v), (503, json!({"callfence": "not_admitted"})));
    n.set_mode("shadow");
    let (status, _) = send(&url, &good(&keys, &other, 8)).await;
    assert_eq!(status, 503);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 2);
    let log = n.log();
    assert!(
        !log.contains("+14155550100"),
        "no phone numbers or bodies in logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_wait_for_the_first_delivery() {
    let keys = Keys::new();
    let (app_url, seen) = demo_app().await;
    seen.delays.lock().unwrap().push(800);
    let mut n = node(&keys, &app_url, None);
    n.set_mode("active");
    n.start().await;
    let url = n.webhook_url();
    let body = event("evt-c", "call.initiated", "sess-c", "v3:cc");
    let (a, b) = (good(&keys, &body, 2), good(&keys, &body, 2));
    let (ra, rb) = tokio::join!(send(&url, &a), async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        send(&url, &b).await
    });
    assert_eq!(ra, (200, json!({"ok": true, "n": 1})));
    assert_eq!(rb, ra);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
}

//! The agent's metrics through the real binary: `GET /metrics` on the
//! local API needs its token; the `listen.metrics_listen` listener serves
//! `/metrics` without one and nothing else; the counts follow real
//! webhooks; and no id, number, token or key of that traffic shows in the
//! exposition.

mod common;

use common::*;

fn sample(series: &str, text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_token_on_the_local_api_and_only_metrics_show_on_their_listener() {
    let keys = Keys::new();
    let (app_url, _seen) = demo_app().await;
    let mut n = node(&keys, &app_url, None);
    let [metrics_port] = free_ports();
    let metrics = format!("127.0.0.1:{metrics_port}");
    n.edit_config(
        "[listen]\n",
        &format!("[listen]\nmetrics_listen = \"{metrics}\"\n"),
    );
    n.set_mode("active");
    n.start().await;
    let http = reqwest::Client::new();

    // One delivered webhook, one with a bad Telnyx signature.
    let body = event("evt-metrics-1", "call.initiated", "sess-m1", "v3:cm1");
    let (status, _) = send(&n.webhook_url(), &good(&keys, &body, 5)).await;
    assert_eq!(status, 200);
    let other = event("evt-metrics-2", "call.initiated", "sess-m2", "v3:cm2");
    let mut forged = good(&keys, &other, 5);
    forged.telnyx_sig = good(&keys, &body, 5).telnyx_sig;
    let (status, _) = send(&n.webhook_url(), &forged).await;
    assert_eq!(status, 401);

    // The local API: 401 without the token, the exposition with it.
    let local = format!("http://{}/metrics", n.local);
    let r = http.get(&local).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .get(&local)
        .bearer_auth(n.token())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = r.text().await.unwrap();
    for (series, want) in [
        ("callfence_agent_forwards_total{result=\"delivered\"}", 1.0),
        ("callfence_agent_forwards_total{result=\"refused\"}", 1.0),
        (
            "callfence_agent_forwards_refused_total{reason=\"bad_signature\"}",
            1.0,
        ),
        ("callfence_agent_mode{mode=\"active\"}", 1.0),
        ("callfence_agent_ledger_events{state=\"completed\"}", 1.0),
        ("callfence_agent_ledger_events{state=\"received\"}", 0.0),
    ] {
        assert_eq!(sample(series, &text), Some(want), "{series} in\n{text}");
    }

    // The metrics listener: no token needed, and nothing but /metrics.
    let r = http
        .get(format!("http://{metrics}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let open = r.text().await.unwrap();
    assert!(open.contains("callfence_agent_info{"), "{open}");
    for path in [
        "/healthz",
        "/readyz",
        "/local/status",
        "/callfence/telnyx",
        "/",
    ] {
        let r = http
            .get(format!("http://{metrics}{path}"))
            .bearer_auth(n.token())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }

    // Nothing of the traffic or the secrets is in either exposition.
    let key = std::fs::read_to_string(n.dir.join("node.key")).unwrap();
    for secret in [
        "evt-metrics",
        "sess-m",
        "v3:cm",
        "+1415",
        "+1510",
        "14155550100",
        n.token().as_str(),
        key.trim(),
        forged.telnyx_sig.as_str(),
    ] {
        assert!(!secret.is_empty());
        assert!(!text.contains(secret), "{secret} in\n{text}");
        assert!(!open.contains(secret), "{secret} in\n{open}");
    }
}

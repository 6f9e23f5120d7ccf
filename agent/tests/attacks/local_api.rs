//! The local API is not a boundary by being on loopback: a web page in a
//! browser on the node reaches it. Observed on the old agent: a page's
//! `text/plain` POST to `/local/dial` with a foreign Origin and Host placed
//! a call (toll fraud); a DNS-rebinding page read `/local/status`;
//! `/local/rollback {"shed":true,"deadline":"0s"}` answered 202 and left the
//! node drained. Now: 403 for browser-shaped requests, 401 without the
//! token, no deploy or rollback over HTTP, and the control socket only for
//! the agent's own user or root.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use serde_json::{json, Value};

use crate::common::*;

/// An active node in front of the demo app and the fake Telnyx API, running.
async fn running_node() -> (FakeTelnyx, Node) {
    let (app_url, _seen) = demo_app().await;
    let telnyx = FakeTelnyx::start();
    let mut n = node(&Keys::new(), &app_url, Some(&telnyx.url));
    n.set_mode("active");
    n.start().await;
    (telnyx, n)
}

/// A request as a browser sends it, with `headers` (one per line).
fn browser_post(n: &Node, path: &str, headers: &str, body: &str) -> (u16, Value) {
    raw_http(
        n.local,
        &format!(
            "POST {path} HTTP/1.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_pages_simple_post_to_dial_is_forbidden_and_places_no_call() {
    let (telnyx, n) = running_node().await;
    let dial = r#"{"to":"+19005550100","from":"+15102160079"}"#;
    let host = format!("Host: {}\r\n", n.local);
    let token = format!("Authorization: Bearer {}\r\n", n.token());
    let json_type = "Content-Type: application/json\r\n";
    for (what, headers) in [
        (
            "the page's own request: text/plain, its Origin and Host, no token",
            "Host: evil.example\r\nOrigin: http://evil.example\r\nContent-Type: text/plain;charset=UTF-8\r\n".to_string(),
        ),
        (
            "text/plain to the right Host",
            format!("{host}Content-Type: text/plain\r\n"),
        ),
        (
            "an Origin, even with the token",
            format!("{host}Origin: http://evil.example\r\n{json_type}{token}"),
        ),
        (
            "another Host, even with the token",
            format!("Host: evil.example:{}\r\n{json_type}{token}", n.local.port()),
        ),
        (
            "text/plain, even with the token",
            format!("{host}Content-Type: text/plain\r\n{token}"),
        ),
    ] {
        let (status, body) = browser_post(&n, "/local/dial", &headers, dial);
        assert_eq!(
            (status, body),
            (403, json!({"error": "forbidden"})),
            "{what}"
        );
    }
    assert_eq!(telnyx.record().await, Vec::<Value>::new(), "no call placed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_every_local_route_is_401_and_the_probes_stay_open() {
    let (telnyx, n) = running_node().await;
    let host = format!("Host: {}\r\nContent-Type: application/json\r\n", n.local);
    for path in [
        "/local/answer",
        "/local/dial",
        "/local/media/verify",
        "/local/nothing-here",
    ] {
        for auth in ["", "Authorization: Bearer wrong-token-0123456789\r\n"] {
            let (status, body) = browser_post(&n, path, &format!("{host}{auth}"), "{}");
            assert_eq!(
                (status, body),
                (401, json!({"error": "unauthorized"})),
                "{path} {auth:?}"
            );
        }
    }
    let get = |path: &str| {
        raw_http(
            n.local,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                n.local
            ),
        )
    };
    assert_eq!(
        get("/local/status"),
        (401, json!({"error": "unauthorized"}))
    );
    assert_eq!(get("/healthz"), (200, json!({"status": "ok"})));
    assert_eq!(get("/readyz").0, 503, "open, and not ready without an edge");
    assert_eq!(telnyx.record().await, Vec::<Value>::new());
    let (status, view) = n.local("/local/status", None).await;
    assert_eq!(
        (status, &view["node"]),
        (200, &json!(NODE)),
        "the token opens it"
    );
    assert!(!n.log().contains(&n.token()), "the token is never logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_rebinding_read_is_forbidden_and_shows_nothing() {
    let (_telnyx, n) = running_node().await;
    let port = n.local.port();
    for path in ["/local/status", "/readyz", "/healthz"] {
        let (status, body) = raw_http(
            n.local,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: evil.example:{port}\r\nConnection: close\r\n\r\n"
            ),
        );
        assert_eq!(
            (status, body),
            (403, json!({"error": "forbidden"})),
            "{path}"
        );
    }
}

/// Gives `n` a `[deploy]` table (runtime checkout = `current`), so that
/// the old agent's `/local/rollback` started a job.
fn deployable(n: &Node) {
    let current = n.dir.join("current");
    std::fs::create_dir_all(n.dir.join("releases")).unwrap();
    n.edit_config(
        &format!("runtime_checkout = \"{}\"", n.dir.display()),
        &format!("runtime_checkout = \"{}\"", current.display()),
    );
    let mut text = std::fs::read_to_string(&n.config).unwrap();
    text.push_str(&format!(
        "\n[deploy]\nremote = \"{dir}/remote.git\"\nreleases_dir = \"{dir}/releases\"\ncurrent = \"{cur}\"\nrestart = \"true\"\n",
        dir = n.dir.display(),
        cur = current.display()
    ));
    std::fs::write(&n.config, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_and_rollback_are_not_offered_over_http_but_on_the_control_socket() {
    let (app_url, _seen) = demo_app().await;
    let mut n = node(&Keys::new(), &app_url, None);
    deployable(&n);
    n.set_mode("active");
    n.start().await;
    let shed = json!({"shed": true, "deadline": "0s"});
    for (path, body) in [
        ("/local/rollback", Some(&shed)),
        (
            "/local/deploy",
            Some(&json!({"sha": "a1".repeat(20), "shed": true})),
        ),
        ("/local/deploy", None),
    ] {
        let (status, _) = n.local(path, body).await;
        assert_eq!(status, 404, "{path} is not offered, even with the token");
    }
    assert_eq!(
        String::from_utf8_lossy(&n.cmd(&["mode", "get"]).stdout).trim(),
        "active",
        "nothing was drained"
    );

    // The same user (root here) reaches the agent through the socket: the
    // rollback runs in the agent and fails cleanly (no previous release).
    let socket = n.state_dir().join("control.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = n.cmd(&["rollback", "--json"]);
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        (outcome["kind"].as_str(), outcome["ok"].as_bool()),
        (Some("rollback"), Some(false)),
        "{out:?}"
    );
    let job = n.cmd(&["job"]);
    let job: Value = serde_json::from_slice(&job.stdout).unwrap();
    assert_eq!(job["kind"], "rollback");
}

/// The control socket refuses a peer of another uid even when the file
/// modes let it connect (an operator's chmod): the peer credentials decide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_socket_refuses_another_user() {
    let Some(setpriv) = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        eprintln!(
            "skipped: setpriv is not installed (the peer check is unit-tested in control.rs)"
        );
        return;
    };
    if !am_root() {
        eprintln!("skipped: needs root to run a helper as nobody");
        return;
    }
    let (app_url, _seen) = demo_app().await;
    let mut n = node(&Keys::new(), &app_url, None);
    n.start().await;
    let as_nobody = || {
        Command::new(setpriv)
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                BIN,
                "--config",
            ])
            .arg(&n.config)
            .arg("job")
            .output()
            .unwrap()
    };
    let out = as_nobody();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        stderr.contains("Permission denied"),
        "the 0700 state dir: {stderr}"
    );

    let socket = n.state_dir().join("control.sock");
    std::fs::set_permissions(n.state_dir(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(stderr.contains("403 forbidden"), "{stderr}");
    assert!(n.log().contains("control_refused"), "{}", n.log());
    // Root still gets its answer (no job yet).
    let own = n.cmd(&["job"]);
    assert!(
        String::from_utf8_lossy(&own.stderr).contains("404 no_deploy"),
        "{own:?}"
    );
}

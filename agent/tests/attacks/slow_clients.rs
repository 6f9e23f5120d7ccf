//! Slow clients on the public origin. Observed on the old agent: 1,100
//! requests each declaring a 64 KiB body and sending 1 byte held 1,024
//! descriptors for 40 s; `/local/answer` and `/healthz` stopped answering
//! and no beat reached the edge ("Too many open files"). Now the origin
//! holds at most `listen.max_connections`, every request's headers and body
//! must arrive within `timing.request_read_timeout_ms`, and the local API
//! keeps answering.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::*;

/// Descriptors the agent may open: with `max_connections = 32` the budget
/// is 2 × 32 + 192 = 256, exactly.
const OPEN_FILES: &str = "--nofile=256:256";

/// Opens `n` connections to `addr`, each declaring a 64 KiB webhook and
/// sending 1 byte of it.
fn slow_requests(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(
                format!("POST /callfence/telnyx HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 65536\r\n\r\n{{")
                    .as_bytes(),
            )
            .unwrap();
            c
        })
        .collect()
}

/// Reads `c` to its end; what the agent answered (possibly nothing).
fn until_closed(mut c: TcpStream, deadline: Instant) -> Result<String, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    c.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .unwrap();
    let mut answer = Vec::new();
    match c.read_to_end(&mut answer) {
        Ok(_) => Ok(String::from_utf8_lossy(&answer).to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(String::new()),
        Err(e) => Err(format!("still open: {e}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_slow_origin_requests_does_not_starve_the_local_api() {
    let (app_url, seen) = demo_app().await;
    let mut n = node(&Keys::new(), &app_url, None);
    n.edit_config("local = ", "max_connections = 32\nlocal = ");
    n.edit_config("[timing]\n", "[timing]\nrequest_read_timeout_ms = 1000\n");
    n.start_under(&["prlimit", OPEN_FILES]).await;

    // Ten times the origin's bound, more than the agent has descriptors.
    let flood = slow_requests(n.origin, 320);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let started = Instant::now();
        let (status, health) = n.local("/healthz", None).await;
        assert_eq!((status, health), (200, json!({"status": "ok"})));
        let (status, view) = n.local("/local/status", None).await;
        assert_eq!((status, &view["node"]), (200, &json!(NODE)));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the local API answers promptly: {:?}",
            started.elapsed()
        );
    }

    // Each slow request is cut off after the read timeout: 320 / 32 rounds
    // of 1 s, with room for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(30);
    let answers = tokio::task::spawn_blocking(move || {
        flood
            .into_iter()
            .map(|c| until_closed(c, deadline))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let open: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
    assert!(open.is_empty(), "{} of 320 still open", open.len());
    assert!(
        answers
            .iter()
            .flatten()
            .all(|a| a.is_empty() || a.starts_with("HTTP/1.1 408")),
        "408 request_timeout or closed"
    );
    assert_eq!(seen.calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    let (status, _) = raw_http(
        n.origin,
        &format!(
            "GET /callfence/health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            n.origin
        ),
    );
    assert_eq!(status, 200, "the origin serves again");
    assert!(
        !n.log().contains("accept_failed"),
        "never out of descriptors: {}",
        n.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_bound_that_does_not_fit_the_open_file_limit_is_refused() {
    let (app_url, _seen) = demo_app().await;
    let n = node(&Keys::new(), &app_url, None);
    n.edit_config("local = ", "max_connections = 33\nlocal = ");
    let out = std::process::Command::new("prlimit")
        .arg(OPEN_FILES)
        .arg(BIN)
        .arg("--config")
        .arg(&n.config)
        .arg("run")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("needs 258 open files") && stderr.contains("at most 32"),
        "{stderr}"
    );
}

//! The systemd notify protocol on a real Unix datagram socket: the agent
//! reports `READY=1` once serving, pings `WATCHDOG=1` at half of
//! `WATCHDOG_USEC` without a gap through a 20-second drain, and reports
//! `STOPPING=1` when it stops.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::{Json, Router};
use common::*;
use serde_json::json;

/// A child process killed when dropped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An app that always holds one call, so a drain runs to its deadline.
async fn busy_app() -> String {
    let app = Router::new().route(
        "/callfence/status",
        get(|| async { Json(json!({"ready": true, "active_calls": 1, "max_calls": 4})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread")]
async fn ready_then_watchdog_pings_through_a_20_second_drain_then_stopping() {
    let keys = Keys::new();
    let app = busy_app().await;
    let node = node(&keys, &app, None);
    let socket_path = node.dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let received: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (received, stop) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(n) = socket.recv(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    received.lock().unwrap().push((Instant::now(), text));
                }
            }
        })
    };
    let log = std::fs::File::create(node.dir.join("agent.log")).unwrap();
    // WATCHDOG_USEC = 2 s: a ping every second; systemd would kill the agent
    // after 2 s without one.
    let agent = Command::new(BIN)
        .arg("--config")
        .arg(&node.config)
        .arg("run")
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "2000000")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    // Killed on drop, so a failed assertion leaves no agent behind.
    let mut agent = Reaped(agent);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !received
        .lock()
        .unwrap()
        .iter()
        .any(|(_, m)| m.contains("READY=1"))
    {
        assert!(Instant::now() < deadline, "no READY=1: {}", node.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let config = node.config.clone();
    let started = Instant::now();
    let drain = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .args(["drain", "--deadline", "20s"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let ended = Instant::now();
    // `drain` stops polling one poll interval (100 ms here) short of its deadline.
    assert!(
        ended - started >= Duration::from_millis(19_500),
        "the drain ran to its deadline"
    );
    let report: serde_json::Value = serde_json::from_slice(&drain.stdout).unwrap();
    assert_eq!(report["drained"], false, "one call remained: {report}");

    let pings: Vec<Instant> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(at, _)| *at)
        .filter(|at| *at >= started && *at <= ended)
        .collect();
    assert!(pings.len() >= 15, "{} pings in 20 s", pings.len());
    let mut edges = vec![started];
    edges.extend(&pings);
    edges.push(ended);
    let gap = edges.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        gap < Duration::from_secs(2),
        "the longest silence ({gap:?}) stays within WATCHDOG_USEC"
    );

    // SIGTERM: STOPPING=1 before the agent exits.
    Command::new("kill")
        .args(["-TERM", &agent.0.id().to_string()])
        .status()
        .unwrap();
    agent.0.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !received
        .lock()
        .unwrap()
        .iter()
        .any(|(_, m)| m == "STOPPING=1")
    {
        assert!(Instant::now() < deadline, "no STOPPING=1");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    reader.join().unwrap();
}

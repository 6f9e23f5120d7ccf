//! `callfence-fake-notify`: a stand-in for systemd's side of the notify
//! protocol (`sd_notify(3)`), for the deploy drill: it binds a Unix datagram
//! socket at `--socket PATH` (the agent's `NOTIFY_SOCKET`) and prints every
//! datagram it receives, so a drill can check `READY=1`, `STOPPING=1` and
//! that no gap between `WATCHDOG=1` pings ever exceeded the watchdog timeout.
//!
//! Its first line on stdout is `listening PATH`; then each datagram is one
//! JSON line `{"mono_ms": <ms since it started, monotonic>, "state": "..."}`
//! (the state as sent, lossily UTF-8, at most 4 KiB). It stops on SIGTERM or
//! SIGINT and removes the socket file.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use serde_json::json;
use tokio::net::UnixDatagram;
use tokio::signal::unix::{signal, SignalKind};

/// Largest datagram read (systemd's own limit is larger; the agent's are a few bytes).
const MAX_DATAGRAM: usize = 4096;

/// Listens on a notify socket and prints what arrives.
#[derive(Debug, Parser)]
#[command(name = "callfence-fake-notify", version, about)]
struct Args {
    /// Where to bind the socket (must not exist yet).
    #[arg(long)]
    socket: PathBuf,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let socket = UnixDatagram::bind(&args.socket)
        .map_err(|e| format!("cannot bind {}: {e}", args.socket.display()))?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let started = Instant::now();
    println!("listening {}", args.socket.display());
    let mut buf = [0u8; MAX_DATAGRAM];
    loop {
        tokio::select! {
            got = socket.recv(&mut buf) => {
                let Ok(n) = got else { continue };
                let mono_ms = started.elapsed().as_secs_f64() * 1000.0;
                let state = String::from_utf8_lossy(&buf[..n]);
                println!("{}", json!({"mono_ms": mono_ms, "state": state}));
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}

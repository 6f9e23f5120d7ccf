//! The control socket: how the `deploy`, `rollback` and `job` commands
//! reach the running agent (SPEC §11: never over the HTTP local API).
//!
//! A Unix socket at `state_dir/control.sock` ([`SOCKET_FILE`]), mode 0600
//! in the 0700 state directory, created by `run` (a stale one is
//! replaced). Each connection's peer is checked with `SO_PEERCRED`
//! ([`peer_allowed`]): only the agent's own user or root may talk to it,
//! whatever the file's mode has become; anyone else is told
//! `{"error":"forbidden"}` and nothing is read.
//!
//! The protocol is one JSON line each way, then the connection closes:
//! - `{"op":"deploy","sha","deadline"?,"shed"?}` and
//!   `{"op":"rollback","deadline"?,"shed"?}` start a job
//!   ([`crate::deploy::job`]);
//! - `{"op":"job"}` reads the latest job.
//!
//! Every answer is `{"status":<HTTP-like code>,"body":{...}}`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};

use crate::context::Agent;
use crate::AgentError;

/// The socket's name in the state directory.
pub const SOCKET_FILE: &str = "control.sock";

/// The largest request line read.
const MAX_REQUEST_BYTES: u64 = 4 * 1024;

/// The largest answer line read by the client (a job's steps included).
const MAX_ANSWER_BYTES: u64 = 1024 * 1024;

/// Connections served at once.
const MAX_CONNECTIONS: usize = 8;

/// Where the control socket of the agent whose state directory is
/// `state_dir` lives.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_FILE)
}

/// The longest socket address the kernel takes (`sun_path` holds 108 bytes,
/// the last a NUL).
const MAX_ADDRESS_BYTES: usize = 107;

/// The address to bind or connect to for the file `name` in `dir`: its path
/// when that fits in `sun_path`, else the same file reached through
/// `/proc/self/fd/<dir>`, with `dir` held open (`O_PATH`, which needs no
/// read permission, only the search permission the path itself would) by
/// the returned handle for as long as the address is used. A state
/// directory deep in a checkout or a home directory would otherwise fail to
/// bind.
fn short_address(dir: &Path, name: &str) -> std::io::Result<(Option<std::fs::File>, PathBuf)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    if path.as_os_str().len() <= MAX_ADDRESS_BYTES {
        return Ok((None, path));
    }
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(dir)?;
    let address = PathBuf::from(format!("/proc/self/fd/{}/{name}", handle.as_raw_fd()));
    Ok((Some(handle), address))
}

/// True when a peer running as `peer_uid` may use the socket of an agent
/// running as `own_uid`: the same user, or root.
pub fn peer_allowed(peer_uid: u32, own_uid: u32) -> bool {
    peer_uid == own_uid || peer_uid == 0
}

/// Creates the socket (0600, replacing a stale one) before it is visible
/// under its name.
pub fn bind(state_dir: &Path) -> Result<UnixListener, AgentError> {
    let path = socket_path(state_dir);
    let fail =
        |e: std::io::Error| AgentError::new(format!("control socket {}: {e}", path.display()));
    let staging_name = format!(".{SOCKET_FILE}.{}", std::process::id());
    let staging = state_dir.join(&staging_name);
    let _ = std::fs::remove_file(&staging);
    let (_dir, address) = short_address(state_dir, &staging_name).map_err(fail)?;
    let listener = UnixListener::bind(&address).map_err(fail)?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    std::fs::rename(&staging, &path).map_err(fail)?;
    Ok(listener)
}

/// Serves the socket until `stop` turns true.
pub async fn serve(
    listener: UnixListener,
    agent: Arc<Agent>,
    own_uid: u32,
    stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let read_timeout = Duration::from_millis(agent.config.timing.request_read_timeout_ms);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = crate::serve::stopped(stop.clone()) => return,
        };
        let agent = agent.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(read_timeout, one(stream, &agent, own_uid)).await;
        });
    }
}

async fn one(stream: UnixStream, agent: &Arc<Agent>, own_uid: u32) {
    let peer = stream.peer_cred().ok().map(|c| c.uid());
    let (read, mut write) = stream.into_split();
    let answer = match peer {
        Some(uid) if peer_allowed(uid, own_uid) => {
            let mut line = String::new();
            let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES));
            match reader.read_line(&mut line).await {
                Ok(_) => dispatch(agent, &line),
                Err(_) => (400, json!({"error": "bad_request"})),
            }
        }
        _ => {
            crate::log::warn("control_refused", json!({"peer_uid": peer}));
            (403, json!({"error": "forbidden"}))
        }
    };
    let mut text = json!({"status": answer.0, "body": answer.1}).to_string();
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
}

fn dispatch(agent: &Arc<Agent>, line: &str) -> (u16, Value) {
    let Ok(request) = serde_json::from_str::<Value>(line) else {
        return (
            400,
            json!({"error": "bad_request", "problem": "one JSON object per line"}),
        );
    };
    match request.get("op").and_then(Value::as_str) {
        Some("deploy") => crate::deploy::job::start_from(agent, true, &request),
        Some("rollback") => crate::deploy::job::start_from(agent, false, &request),
        Some("job") => crate::deploy::job::latest(agent),
        _ => (
            400,
            json!({"error": "bad_request", "problem": "op must be deploy, rollback or job"}),
        ),
    }
}

/// Sends `request` to the running agent of `state_dir`; its status and body.
pub async fn ask(state_dir: &Path, request: &Value) -> Result<(u16, Value), AgentError> {
    let path = socket_path(state_dir);
    let not_running = |e: std::io::Error| {
        AgentError::new(format!(
            "the agent is not running here (control socket {}: {e})",
            path.display()
        ))
    };
    let (_dir, address) = short_address(state_dir, SOCKET_FILE).map_err(not_running)?;
    let mut stream = UnixStream::connect(&address).await.map_err(not_running)?;
    let mut text = request.to_string();
    text.push('\n');
    let lost = |e: std::io::Error| AgentError::new(format!("control socket: {e}"));
    // A refused peer is answered before its request is read: the answer
    // counts even when the write failed.
    let written = stream.write_all(text.as_bytes()).await;
    let mut line = String::new();
    BufReader::new(stream.take(MAX_ANSWER_BYTES))
        .read_line(&mut line)
        .await
        .map_err(lost)?;
    let answer: Value = match serde_json::from_str(&line) {
        Ok(answer) => answer,
        Err(_) => {
            written.map_err(lost)?;
            return Err(AgentError::new(
                "the agent's answer on the control socket is not JSON",
            ));
        }
    };
    let status = answer["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(0);
    Ok((status, answer["body"].clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_user_or_root_may_connect() {
        assert!(peer_allowed(1000, 1000));
        assert!(peer_allowed(0, 1000));
        assert!(!peer_allowed(65534, 1000));
        assert!(!peer_allowed(1001, 1000));
        assert!(peer_allowed(0, 0));
        assert!(!peer_allowed(1000, 0));
    }

    #[tokio::test]
    async fn a_state_directory_longer_than_a_socket_address_still_binds_and_connects() {
        let dir = crate::files::test_dir("long")
            .join("a".repeat(60))
            .join("b".repeat(60));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(
            socket_path(&dir).as_os_str().len() > 108,
            "longer than sun_path"
        );
        let listener = bind(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(socket_path(&dir))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let (_dir, address) = short_address(&dir, SOCKET_FILE).unwrap();
        let (client, accepted) = tokio::join!(UnixStream::connect(&address), listener.accept());
        client.unwrap();
        accepted.unwrap();
    }
}

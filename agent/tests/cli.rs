//! The command line, run as a real process: keygen, mode persistence and
//! fail-closed mode, one heartbeat against an unreachable edge, status, and
//! `run` refusing a ledger written by a newer agent.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use callfence_core::encoding::{b64_decode, b64_encode};
use common::*;
use ed25519_dalek::SigningKey;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn keygen_writes_0600_and_prints_the_registry_entry() {
    let dir = scratch("keygen");
    let path = dir.join("node.key");
    let out = Command::new(BIN)
        .args(["keygen", "--out"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let text = stdout(&out);
    let seed = b64_decode(std::fs::read_to_string(&path).unwrap().trim()).unwrap();
    let public = SigningKey::from_bytes(&seed.try_into().unwrap()).verifying_key();
    let public_b64 = b64_encode(public.as_bytes());
    assert!(
        text.contains(&format!("public_key: {public_b64}")),
        "{text}"
    );
    let kid = text
        .lines()
        .find_map(|l| l.strip_prefix("key_id: "))
        .unwrap();
    assert!(kid.starts_with('k') && kid.len() == 11);
    assert!(!text.contains(&b64_encode(&SigningKey::from_bytes(&[0; 32]).to_bytes())));
    let again = Command::new(BIN)
        .args(["keygen", "--out"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        !again.status.success(),
        "an existing key is never overwritten"
    );
}

#[test]
fn mode_persists_and_a_corrupt_file_reads_drained() {
    let keys = Keys::new();
    let n = node(&keys, "http://127.0.0.1:9", None);
    let get = n.cmd(&["mode", "get"]);
    assert_eq!(stdout(&get).trim(), "drained");
    assert!(String::from_utf8_lossy(&get.stderr).contains("missing"));
    n.set_mode("active");
    assert_eq!(stdout(&n.cmd(&["mode", "get"])).trim(), "active");
    n.set_mode("shadow");
    assert_eq!(stdout(&n.cmd(&["mode", "get"])).trim(), "shadow");
    let mode_file = n.dir.join("state").join("mode");
    assert_eq!(
        std::fs::metadata(&mode_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::write(&mode_file, "actiev\n").unwrap();
    let get = n.cmd(&["mode", "get"]);
    assert_eq!(stdout(&get).trim(), "drained");
    assert!(String::from_utf8_lossy(&get.stderr).contains("invalid"));
    let status = n.cmd(&["status"]);
    assert!(status.status.success(), "{status:?}");
    assert!(
        stdout(&status).contains("drained  (mode file invalid"),
        "{}",
        stdout(&status)
    );
    let bad = n.cmd(&["mode", "set", "busy"]);
    assert!(!bad.status.success());
}

#[test]
fn a_world_readable_key_or_a_tmp_state_dir_is_refused() {
    let keys = Keys::new();
    let n = node(&keys, "http://127.0.0.1:9", None);
    let key = n.dir.join("node.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = n.cmd(&["status"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("0644"),
        "{out:?}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = std::fs::read_to_string(&n.config).unwrap();
    let state = format!("state_dir = \"{}\"", n.dir.join("state").display());
    std::fs::write(
        &n.config,
        text.replace(&state, "state_dir = \"/tmp/callfence-state\""),
    )
    .unwrap();
    let out = n.cmd(&["mode", "get"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/tmp"),
        "{out:?}"
    );
}

#[test]
fn heartbeat_once_reports_an_unreachable_edge_and_status_shows_it() {
    let keys = Keys::new();
    let n = node(&keys, "http://127.0.0.1:9", None);
    let out = n.cmd(&["heartbeat", "--once"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stdout(&out).contains("unreachable"), "{}", stdout(&out));
    let view = n.cmd(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&view.stdout).unwrap();
    assert_eq!(v["last_beat"]["outcome"], "unreachable");
    assert_eq!(v["mode"], "drained");
    assert_eq!(v["clean"], false, "not a git checkout");
    assert_eq!(v["app_ready"], false);
    let seq1 = v["last_beat"]["seq"].as_u64().unwrap();
    n.cmd(&["heartbeat", "--once"]);
    let v: serde_json::Value =
        serde_json::from_slice(&n.cmd(&["status", "--json"]).stdout).unwrap();
    assert!(
        v["last_beat"]["seq"].as_u64().unwrap() > seq1,
        "seq strictly increases across processes"
    );
}

#[test]
fn help_names_every_command() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let text = stdout(&out);
    for c in [
        "keygen",
        "run",
        "heartbeat",
        "mode",
        "drain",
        "status",
        "--config",
    ] {
        assert!(text.contains(c), "{c} missing from --help");
    }
}

#[test]
fn a_ledger_from_a_newer_agent_stops_run_with_a_clear_error() {
    let keys = Keys::new();
    let n = node(&keys, "http://127.0.0.1:9", None);
    n.set_mode("active");
    let state = n.dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    rusqlite::Connection::open(state.join("ledger.sqlite3"))
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&n.config)
        .arg("run")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the agent started on a ledger from a newer version");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("schema version 99") && err.contains("newer callfence-agent"),
        "{err}"
    );
}

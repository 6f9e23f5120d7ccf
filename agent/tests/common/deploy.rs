//! A deployable node for the tests of `deploy` (SPEC §14): the real agent
//! (`run`) with a stand-in edge that accepts beats (no `allowed_shas`), a
//! bare remote made here with git, and a `[deploy]` table whose restart
//! does nothing.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use serde_json::{json, Value};

use super::*;

/// A deployable node: its remote holds `main_sha` on `main` and `pr_sha`
/// only at `refs/pull/7/head`.
pub struct Deployable {
    pub node: Node,
    /// The demo app's record; its `active_calls` is what it reports.
    pub seen: Arc<AppSeen>,
    pub key: PathBuf,
    pub releases: PathBuf,
    /// Where the pull request's build copies the key to.
    pub stolen: PathBuf,
    pub main_sha: String,
    pub pr_sha: String,
}

/// Builds the remote and writes the `[deploy]` table with `extra` lines.
pub async fn deployable(extra: &str) -> Deployable {
    let (app_url, seen) = demo_app().await;
    let keys = Keys::new();
    let mut node = node(&keys, &app_url, None);
    let dir = node.dir.clone();
    let key = dir.join("node.key");
    let stolen = dir.join("stolen.key");
    let remote = dir.join("remote.git");
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    git(
        &dir,
        &["init", "-q", "--bare", &remote.display().to_string()],
    );
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join(".gitignore"), "build/\n").unwrap();
    std::fs::write(
        src.join("build.sh"),
        format!(
            "mkdir -p build\nid -u > build/uid\ncat '{}' > build/key-copy 2>/dev/null || rm -f build/key-copy\n",
            key.display()
        ),
    )
    .unwrap();
    git(&src, &["add", "."]);
    git(&src, &["commit", "-q", "-m", "release 1"]);
    let remote_text = remote.display().to_string();
    git(&src, &["push", "-q", &remote_text, "HEAD:refs/heads/main"]);
    let main_sha = git(&src, &["rev-parse", "HEAD"]);
    // The pull request: never merged, served by the remote at refs/pull/7/head.
    git(&src, &["checkout", "-q", "-b", "contributor"]);
    std::fs::write(
        src.join("build.sh"),
        format!(
            "cp '{}' '{}'\nmkdir -p build\nid -u > build/uid\ncp '{}' build/key-copy\n",
            key.display(),
            stolen.display(),
            key.display()
        ),
    )
    .unwrap();
    git(&src, &["commit", "-q", "-am", "innocent refactor"]);
    git(&src, &["push", "-q", &remote_text, "HEAD:refs/pull/7/head"]);
    let pr_sha = git(&src, &["rev-parse", "HEAD"]);

    let releases = dir.join("releases");
    let current = dir.join("current");
    let text = std::fs::read_to_string(&node.config).unwrap().replace(
        &format!("runtime_checkout = \"{}\"", dir.display()),
        &format!("runtime_checkout = \"{}\"", current.display()),
    );
    let table = format!(
        r#"
[deploy]
remote = "{remote}"
releases_dir = "{releases}"
current = "{current}"
build = "sh build.sh"
artifacts = ["build/uid"]
restart = "true"
health_timeout = "1s"
drain_deadline = "5s"
branch = "main"
{extra}
"#,
        remote = remote.display(),
        releases = releases.display(),
        current = current.display(),
    );
    std::fs::write(&node.config, text + &table).unwrap();
    edge_stand_in(node.edge_port).await;
    node.start().await;
    Deployable {
        node,
        seen,
        key,
        releases,
        stolen,
        main_sha,
        pr_sha,
    }
}

/// An edge that accepts every beat and lists no `allowed_shas` (the
/// default registry entry).
async fn edge_stand_in(port: u16) {
    async fn accept() -> Json<Value> {
        Json(json!({
            "accepted": true, "eligible": true, "reasons": [],
            "edge_time": callfence_core::time::format_ms(now_ms()),
            "routing": {"hash": "x", "lines": {}},
            "allowed_shas": null,
        }))
    }
    let app = axum::Router::new().fallback(accept);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
}

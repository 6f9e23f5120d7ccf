//! Releases on disk: `releases_dir/<sha>` checkouts, the `current` symlink
//! the app runs through, and the history (`releases.json` in the state
//! directory: each release's SHA, when it was deployed and its result,
//! newest first).
//!
//! The switch is atomic: a new symlink is made next to `current` and renamed
//! over it, then the directory is synced, so a crash leaves either the old
//! target or the new one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::DeployConfig;
use crate::files::write_atomic;
use crate::AgentError;

/// The history's file name inside the state directory.
pub const FILE: &str = "releases.json";

/// One release in the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// The commit.
    pub sha: String,
    /// When it was last switched to (RFC 3339).
    pub deployed_at: String,
    /// `verified`, `failed`, `in_progress` or `adopted` (live before the
    /// first deploy this history saw).
    pub result: String,
}

/// The history, newest first (an unreadable file reads as empty).
pub fn history(state_dir: &Path) -> Vec<Release> {
    std::fs::read(state_dir.join(FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Adds the release that was live before the first deploy with this
/// history (`result` `adopted`, `deployed_at` unknown), so that `rollback`
/// can go back to it.
pub fn adopt(state_dir: &Path, sha: &str) -> Result<(), AgentError> {
    let mut list = history(state_dir);
    if list.iter().any(|r| r.sha == sha) {
        return Ok(());
    }
    list.push(Release {
        sha: sha.to_string(),
        deployed_at: "unknown".into(),
        result: "adopted".into(),
    });
    save(state_dir, &list)
}

/// True for a result a release may be rolled back to.
pub fn trusted(result: &str) -> bool {
    matches!(result, "verified" | "adopted")
}

/// Records `sha` with `result` at the top of the history.
pub fn record(state_dir: &Path, sha: &str, result: &str, at: &str) -> Result<(), AgentError> {
    let mut list = history(state_dir);
    let deployed_at = list
        .iter()
        .find(|r| r.sha == sha && result != "in_progress")
        .map(|r| r.deployed_at.clone());
    list.retain(|r| r.sha != sha);
    list.insert(
        0,
        Release {
            sha: sha.to_string(),
            deployed_at: deployed_at.unwrap_or_else(|| at.to_string()),
            result: result.to_string(),
        },
    );
    list.truncate(100);
    save(state_dir, &list)
}

fn save(state_dir: &Path, list: &[Release]) -> Result<(), AgentError> {
    let bytes = serde_json::to_vec_pretty(list).unwrap_or_default();
    write_atomic(&state_dir.join(FILE), &bytes, 0o600)
        .map_err(|e| AgentError::new(format!("cannot write the release history: {e}")))
}

/// The directory of release `sha`.
pub fn dir(cfg: &DeployConfig, sha: &str) -> PathBuf {
    cfg.releases_dir.join(sha)
}

/// The release `current` points at: `Ok(None)` when there is no `current`
/// yet, an error when it is not a symlink to a release.
pub fn current(cfg: &DeployConfig) -> Result<Option<String>, AgentError> {
    let target = match std::fs::read_link(&cfg.current) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(_) => {
            return Err(AgentError::new(format!(
                "{} is not a symlink: move the app into {}/<sha> and link it",
                cfg.current.display(),
                cfg.releases_dir.display()
            )))
        }
    };
    let sha = target
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| super::is_full_sha(n) && target.parent() == Some(cfg.releases_dir.as_path()));
    match sha {
        Some(s) => Ok(Some(s.to_string())),
        None => Err(AgentError::new(format!(
            "{} points at {}, not at a release in {}",
            cfg.current.display(),
            target.display(),
            cfg.releases_dir.display()
        ))),
    }
}

/// Points `current` at release `sha`: a new symlink renamed over the old.
pub fn switch(cfg: &DeployConfig, sha: &str) -> Result<(), AgentError> {
    let fail = |e: std::io::Error| AgentError::new(format!("switch: {e}"));
    let name = cfg
        .current
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("current");
    let next = cfg.current.with_file_name(format!(".{name}.next"));
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(dir(cfg, sha), &next).map_err(fail)?;
    std::fs::rename(&next, &cfg.current).map_err(fail)?;
    if let Some(parent) = cfg.current.parent() {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(fail)?;
    }
    Ok(())
}

/// Removes the checkouts of old releases beyond the `keep` newest (the
/// current one is always kept and not counted), and their history entries.
/// Returns the SHAs removed.
pub fn prune(cfg: &DeployConfig, state_dir: &Path) -> Result<Vec<String>, AgentError> {
    let current = current(cfg)?.unwrap_or_default();
    let list = history(state_dir);
    let mut kept = 0;
    let mut keep_list = Vec::new();
    let mut removed = Vec::new();
    for r in list {
        if r.sha == current {
            keep_list.push(r);
        } else if kept < cfg.keep {
            kept += 1;
            keep_list.push(r);
        } else {
            let _ = std::fs::remove_dir_all(dir(cfg, &r.sha));
            removed.push(r.sha);
        }
    }
    // Checkouts no history entry knows (left by a crash) go too.
    if let Ok(entries) = std::fs::read_dir(&cfg.releases_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if super::is_full_sha(&name) && !keep_list.iter().any(|r| r.sha == name) {
                let _ = std::fs::remove_dir_all(e.path());
                removed.push(name);
            }
        }
    }
    save(state_dir, &keep_list)?;
    Ok(removed)
}

/// The `releases` listing: each kept release and which one is current.
pub fn listing(cfg: &DeployConfig, state_dir: &Path) -> serde_json::Value {
    let current = current(cfg).ok().flatten();
    let list: Vec<_> = history(state_dir)
        .into_iter()
        .filter(|r| dir(cfg, &r.sha).is_dir())
        .map(|r| {
            serde_json::json!({"sha": r.sha, "deployed_at": r.deployed_at, "result": r.result,
                               "current": current.as_deref() == Some(r.sha.as_str())})
        })
        .collect();
    serde_json::json!({"current": current, "releases": list})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_dir;
    use std::time::Duration;

    fn cfg(root: &Path) -> DeployConfig {
        DeployConfig {
            remote: "/nowhere".into(),
            releases_dir: root.join("releases"),
            current: root.join("current"),
            build: None,
            artifacts: Vec::new(),
            restart: "true".into(),
            health_timeout: Duration::from_secs(1),
            drain_deadline: Duration::from_secs(1),
            build_timeout: Duration::from_secs(1),
            keep: 1,
            branch: "main".into(),
            build_user: None,
            build_can_read_keys: false,
        }
    }

    #[test]
    fn switch_repoints_current_and_prune_keeps_current_plus_keep() {
        let root = test_dir("releases");
        let c = cfg(&root);
        let state = root.join("state");
        std::fs::create_dir_all(&state).unwrap();
        assert_eq!(current(&c).unwrap(), None);
        let shas: Vec<String> = ["a", "b", "c"].iter().map(|x| x.repeat(40)).collect();
        for (i, s) in shas.iter().enumerate() {
            std::fs::create_dir_all(dir(&c, s)).unwrap();
            switch(&c, s).unwrap();
            record(&state, s, "verified", &format!("t{i}")).unwrap();
            assert_eq!(current(&c).unwrap().as_deref(), Some(s.as_str()));
        }
        let removed = prune(&c, &state).unwrap();
        assert_eq!(removed, vec![shas[0].clone()]);
        assert!(!dir(&c, &shas[0]).exists() && dir(&c, &shas[1]).exists());
        let l = listing(&c, &state);
        assert_eq!(l["releases"].as_array().unwrap().len(), 2);
        assert_eq!(l["releases"][0]["current"], true);
    }

    #[test]
    fn a_plain_directory_is_not_a_current_symlink() {
        let root = test_dir("releases-plain");
        let c = cfg(&root);
        std::fs::create_dir_all(&c.current).unwrap();
        assert!(current(&c).unwrap_err().0.contains("not a symlink"));
    }
}

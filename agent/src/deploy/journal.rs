//! The deploy journal: `deploy-journal.json` in the state directory,
//! written atomically before anything irreversible (the drain) and updated
//! before the switch. While it exists the node is mid-deploy; an agent that
//! starts and finds it restores `from` before the node is active again.
//! It is removed once the deploy is verified or the restore is done.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::files::write_atomic;
use crate::AgentError;

/// The file name inside the state directory.
pub const FILE: &str = "deploy-journal.json";

/// A deploy in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    /// `deploy` or `rollback`.
    pub kind: String,
    /// The release current before (None: the first deploy).
    pub from: Option<String>,
    /// The release being deployed.
    pub to: String,
    /// The mode before the drain (restored at the end).
    pub prior_mode: String,
    /// The last step begun: `drain`, `switch` or `verify`.
    pub step: String,
    /// When the deploy began (RFC 3339).
    pub started_at: String,
}

fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Writes the journal durably.
pub fn write(state_dir: &Path, journal: &Journal) -> Result<(), AgentError> {
    let bytes = serde_json::to_vec_pretty(journal).unwrap_or_default();
    write_atomic(&path(state_dir), &bytes, 0o600)
        .map_err(|e| AgentError::new(format!("cannot write the deploy journal: {e}")))
}

/// Reads the journal. An unreadable journal is an error, never "no deploy":
/// the caller must not assume the node is settled.
pub fn read(state_dir: &Path) -> Result<Option<Journal>, AgentError> {
    match std::fs::read(path(state_dir)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(AgentError::new(format!("deploy journal unreadable: {e}"))),
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|_| AgentError::new("deploy journal is corrupt")),
    }
}

/// Removes the journal (the deploy is settled).
pub fn clear(state_dir: &Path) -> Result<(), AgentError> {
    match std::fs::remove_file(path(state_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(AgentError::new(format!(
            "cannot remove the deploy journal: {e}"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_dir;

    #[test]
    fn a_journal_round_trips_and_clears() {
        let dir = test_dir("journal");
        assert_eq!(read(&dir).unwrap(), None);
        let j = Journal {
            kind: "deploy".into(),
            from: Some("a".repeat(40)),
            to: "b".repeat(40),
            prior_mode: "active".into(),
            step: "drain".into(),
            started_at: "2026-12-02T00:00:00.000Z".into(),
        };
        write(&dir, &j).unwrap();
        assert_eq!(read(&dir).unwrap(), Some(j));
        clear(&dir).unwrap();
        assert_eq!(read(&dir).unwrap(), None);
        std::fs::write(dir.join(FILE), "{").unwrap();
        assert!(
            read(&dir).is_err(),
            "a corrupt journal is never 'no deploy'"
        );
    }
}

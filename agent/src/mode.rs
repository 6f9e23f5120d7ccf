//! The node's own mode, persisted in `mode` in the state directory and
//! fail-closed: a missing or unreadable file means `drained`, and every
//! reader says why.
//!
//! - `active`: takes new calls.
//! - `shadow`: running and observing (beats, probes) but takes no new calls.
//! - `drained`: takes no new calls; calls already admitted continue.
//!
//! Writes are atomic (temp file, fsync, rename, fsync of the directory), so
//! a crash leaves either the old mode or the new one. The running agent reads
//! the file for every beat and for every webhook of a session it has not
//! admitted, so `mode set` takes effect at once without a restart.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::files::write_atomic;
use crate::AgentError;

/// The file name inside the state directory.
pub const FILE: &str = "mode";

/// The node's mode (SPEC §6 `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeMode {
    /// Takes new calls.
    Active,
    /// Observes, takes no new calls.
    Shadow,
    /// Takes no new calls.
    Drained,
}

impl NodeMode {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeMode::Active => "active",
            NodeMode::Shadow => "shadow",
            NodeMode::Drained => "drained",
        }
    }

    /// The core's heartbeat mode.
    pub fn to_core(self) -> callfence_core::heartbeat::Mode {
        use callfence_core::heartbeat::Mode;
        match self {
            NodeMode::Active => Mode::Active,
            NodeMode::Shadow => Mode::Shadow,
            NodeMode::Drained => Mode::Drained,
        }
    }
}

impl fmt::Display for NodeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodeMode {
    type Err = AgentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "active" => Ok(NodeMode::Active),
            "shadow" => Ok(NodeMode::Shadow),
            "drained" => Ok(NodeMode::Drained),
            _ => Err(AgentError::new("mode must be active, shadow or drained")),
        }
    }
}

/// The mode as read, with the reason when it was not read from a valid file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeReading {
    /// The mode in force.
    pub mode: NodeMode,
    /// Set when the file was missing or invalid and `drained` was assumed.
    pub fallback: Option<String>,
}

/// Reads the mode from the state directory, never failing: anything but a
/// valid file gives `drained` with the reason.
pub fn read(state_dir: &Path) -> ModeReading {
    let path = state_dir.join(FILE);
    let fallback = |why: String| ModeReading {
        mode: NodeMode::Drained,
        fallback: Some(why),
    };
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fallback("mode file missing: drained until `mode set`".into())
        }
        Err(e) => fallback(format!("mode file unreadable ({e}): drained")),
        Ok(bytes) if bytes.len() > 64 => fallback("mode file invalid (too long): drained".into()),
        Ok(bytes) => match std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| t.trim().parse::<NodeMode>().ok())
        {
            Some(mode) => ModeReading {
                mode,
                fallback: None,
            },
            None => fallback("mode file invalid: drained".into()),
        },
    }
}

/// Persists `mode` atomically.
pub fn write(state_dir: &Path, mode: NodeMode) -> Result<(), AgentError> {
    crate::files::ensure_state_dir(state_dir)?;
    write_atomic(&state_dir.join(FILE), format!("{mode}\n").as_bytes(), 0o600)
        .map_err(|e| AgentError::new(format!("cannot write the mode file: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_dir;

    #[test]
    fn missing_and_corrupt_files_mean_drained_with_a_reason() {
        let dir = test_dir("mode");
        let r = read(&dir);
        assert_eq!(r.mode, NodeMode::Drained);
        assert!(r.fallback.unwrap().contains("missing"));
        std::fs::write(dir.join(FILE), "actve\n").unwrap();
        let r = read(&dir);
        assert_eq!(r.mode, NodeMode::Drained);
        assert!(r.fallback.unwrap().contains("invalid"));
        std::fs::write(dir.join(FILE), [0xff, 0xfe]).unwrap();
        assert_eq!(read(&dir).mode, NodeMode::Drained);
    }

    #[test]
    fn a_written_mode_reads_back() {
        let dir = test_dir("mode-rw");
        for m in [NodeMode::Shadow, NodeMode::Active, NodeMode::Drained] {
            write(&dir, m).unwrap();
            assert_eq!(
                read(&dir),
                ModeReading {
                    mode: m,
                    fallback: None
                }
            );
        }
    }
}

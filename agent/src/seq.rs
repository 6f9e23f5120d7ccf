//! The heartbeat sequence number: `max(last + 1, Unix ms)`, persisted in
//! `seq` in the state directory before the beat is sent, so it strictly
//! increases across restarts (and across a `heartbeat --once` run beside a
//! running agent: allocation holds an exclusive lock on `seq.lock`).

use std::fs::OpenOptions;
use std::path::Path;

use crate::files::write_atomic;
use crate::AgentError;

/// The file name inside the state directory.
pub const FILE: &str = "seq";

/// The next number after `last` at `now_ms`.
pub fn advance(last: u64, now_ms: i64) -> u64 {
    let now = u64::try_from(now_ms).unwrap_or(0);
    last.saturating_add(1).max(now)
}

/// The last persisted number (0 when none).
pub fn last(state_dir: &Path) -> u64 {
    std::fs::read_to_string(state_dir.join(FILE))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Allocates and persists the next number.
pub fn next(state_dir: &Path, now_ms: i64) -> Result<u64, AgentError> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(state_dir.join("seq.lock"))
        .map_err(|e| AgentError::new(format!("seq lock: {e}")))?;
    lock.lock()
        .map_err(|e| AgentError::new(format!("seq lock: {e}")))?;
    let seq = advance(last(state_dir), now_ms);
    let result = write_atomic(&state_dir.join(FILE), format!("{seq}\n").as_bytes(), 0o600)
        .map_err(|e| AgentError::new(format!("cannot persist seq: {e}")));
    let _ = lock.unlock();
    result.map(|_| seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_dir;

    #[test]
    fn seq_follows_the_clock_but_never_goes_back() {
        assert_eq!(advance(0, 1_000), 1_000);
        assert_eq!(advance(5_000, 1_000), 5_001, "clock behind: last + 1");
        assert_eq!(advance(5_000, -3), 5_001);
    }

    #[test]
    fn seq_is_strictly_increasing_across_reopen() {
        let dir = test_dir("seq");
        let a = next(&dir, 2_000).unwrap();
        let b = next(&dir, 2_000).unwrap();
        let c = next(&dir, 1_000).unwrap();
        assert!(a < b && b < c);
        assert_eq!(last(&dir), c);
    }
}

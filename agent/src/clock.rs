//! The wall clock, read in exactly one place so that every other module
//! takes `now_ms` as a parameter (the core's convention).
//!
//! For tests only, [`TEST_OFFSET_VAR`] shifts this clock by a signed number
//! of milliseconds, read once when the process starts ([`init_from_env`]):
//! the node then behaves as a node whose clock is wrong, everywhere at once
//! (signed timestamps, heartbeat `sent_at`, sequence numbers, assertion
//! expiry checks, log times). The drills and the clock-skew end-to-end test
//! use it; it is never for a deployment (docs/operations.md).

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::AgentError;

/// The test-only environment variable holding the clock offset in ms.
pub const TEST_OFFSET_VAR: &str = "CALLFENCE_AGENT_TEST_CLOCK_OFFSET_MS";

/// The largest offset accepted either way: one day.
pub const MAX_TEST_OFFSET_MS: i64 = 86_400_000;

static OFFSET_MS: OnceLock<i64> = OnceLock::new();

/// Unix time in milliseconds (0 if the clock is before 1970), shifted by the
/// test offset when one was set at start.
pub fn now_ms() -> i64 {
    let system = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    system.saturating_add(OFFSET_MS.get().copied().unwrap_or(0))
}

/// Reads [`TEST_OFFSET_VAR`] once and fixes the offset for the life of the
/// process; returns it (0 when unset or empty). A value that is not an
/// integer within ±[`MAX_TEST_OFFSET_MS`] is an error and sets nothing.
pub fn init_from_env() -> Result<i64, AgentError> {
    let raw = std::env::var(TEST_OFFSET_VAR).ok();
    let offset = parse_offset(raw.as_deref())?;
    Ok(*OFFSET_MS.get_or_init(|| offset))
}

fn parse_offset(raw: Option<&str>) -> Result<i64, AgentError> {
    let Some(text) = raw.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(0);
    };
    match text.parse::<i64>() {
        Ok(ms) if ms.abs() <= MAX_TEST_OFFSET_MS => Ok(ms),
        _ => Err(AgentError::new(format!(
            "{TEST_OFFSET_VAR} must be an integer number of milliseconds within ±{MAX_TEST_OFFSET_MS} (test-only; never set it on a node)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_after_2024() {
        assert!(now_ms() > 1_700_000_000_000);
    }

    #[test]
    fn the_offset_parses_signed_integers_within_a_day_and_nothing_else() {
        assert_eq!(parse_offset(None), Ok(0));
        assert_eq!(parse_offset(Some("")), Ok(0));
        assert_eq!(parse_offset(Some(" 30000 ")), Ok(30_000));
        assert_eq!(parse_offset(Some("-12000")), Ok(-12_000));
        assert_eq!(parse_offset(Some("86400000")), Ok(MAX_TEST_OFFSET_MS));
        for bad in [
            "86400001",
            "-86400001",
            "30s",
            "1.5",
            "0x10",
            "9223372036854775808",
        ] {
            let e = parse_offset(Some(bad)).unwrap_err();
            assert!(e.0.contains(TEST_OFFSET_VAR), "{bad}: {e}");
        }
    }
}

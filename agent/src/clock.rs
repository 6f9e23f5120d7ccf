//! The wall clock, read in exactly one place so that every other module
//! takes `now_ms` as a parameter (the core's convention).

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_is_after_2024() {
        assert!(super::now_ms() > 1_700_000_000_000);
    }
}

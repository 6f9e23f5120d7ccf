//! Times on the wire: RFC 3339 UTC with milliseconds, to and from Unix
//! milliseconds. Nothing here reads a clock.

use chrono::{DateTime, SecondsFormat, Utc};

/// Formats Unix milliseconds as `2026-11-30T12:00:00.000Z`.
pub fn format_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Parses an RFC 3339 timestamp (any offset) into Unix milliseconds.
/// `None` for anything that is not RFC 3339.
pub fn parse_ms(text: &str) -> Option<i64> {
    if text.len() > 64 {
        return None;
    }
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_milliseconds() {
        let ms = 1_796_000_000_123;
        let text = format_ms(ms);
        assert_eq!(text, "2026-11-30T00:53:20.123Z");
        assert_eq!(parse_ms(&text), Some(ms));
    }

    #[test]
    fn accepts_offsets_and_rejects_garbage() {
        assert_eq!(
            parse_ms("2026-11-30T13:00:00.000+01:00"),
            parse_ms("2026-11-30T12:00:00Z")
        );
        assert_eq!(parse_ms("2026-11-30"), None);
        assert_eq!(parse_ms("yesterday"), None);
    }
}

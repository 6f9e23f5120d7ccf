//! Durations as an operator types them (`--deadline 30m`, `drain_deadline =
//! "90s"`): one parser for the configuration and the commands.

use std::time::Duration;

use crate::AgentError;

/// Parses `30m`, `90s`, `2h`, `500ms` or a number of seconds.
pub fn parse(text: &str) -> Result<Duration, AgentError> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| AgentError::new(format!("bad duration {text:?}: use e.g. 30m, 90s, 2h")))?;
    let ms = match unit {
        "ms" => n,
        "s" => n.saturating_mul(1_000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        _ => {
            return Err(AgentError::new(format!(
                "bad duration {text:?}: use e.g. 30m, 90s, 2h"
            )))
        }
    };
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("45").unwrap(), Duration::from_secs(45));
        assert!(parse("soon").is_err());
        assert!(parse("5d").is_err());
    }
}

//! The Telnyx options a caller of `/local/answer` and `/local/dial` may
//! pass through (SPEC §11: an allow-list).
//!
//! Refused outright, whatever else is sent, with 400
//! `{"error":"option_not_allowed","option":<name>}`: `webhook_url` and
//! `webhook_url_method` (they would send the call's later webhooks around
//! the edge, past the fence and the ledger), `connection_id` (a dial
//! uses the agent's configured `[telnyx] connection_id`) and `command_id`
//! (an answer's is the fence's). Any option not listed in [`ANSWER`] or
//! [`DIAL`] is refused the same way: an option Telnyx adds later stays
//! closed until it is read and listed here.

use serde_json::{json, Map, Value};

/// Options that can send a call's control somewhere else, never passed on.
pub const NEVER: [&str; 4] = [
    "webhook_url",
    "webhook_url_method",
    "connection_id",
    "command_id",
];

/// Telnyx answer options passed through (besides the route's own
/// `call_control_id`, `call_session_id` and `epoch`).
pub const ANSWER: &[&str] = &[
    "billing_group_id",
    "client_state",
    "custom_headers",
    "preferred_codecs",
    "record",
    "record_channels",
    "record_custom_file_name",
    "record_format",
    "record_max_length",
    "record_timeout_secs",
    "record_track",
    "record_trim",
    "send_silence_when_idle",
    "sip_headers",
    "sound_modifications",
    "stream_bidirectional_codec",
    "stream_bidirectional_mode",
    "stream_bidirectional_target_legs",
    "stream_codec",
    "stream_track",
    "stream_url",
    "transcription",
    "transcription_config",
];

/// Telnyx dial options passed through.
pub const DIAL: &[&str] = &[
    "to",
    "from",
    "from_display_name",
    "answering_machine_detection",
    "answering_machine_detection_config",
    "audio_url",
    "billing_group_id",
    "bridge_intent",
    "bridge_on_answer",
    "client_state",
    "custom_headers",
    "link_to",
    "media_encryption",
    "media_name",
    "park_after_unbridge",
    "preferred_codecs",
    "record",
    "record_channels",
    "record_custom_file_name",
    "record_format",
    "record_max_length",
    "record_timeout_secs",
    "record_track",
    "record_trim",
    "send_silence_when_idle",
    "sip_auth_password",
    "sip_auth_username",
    "sip_headers",
    "sip_transport_protocol",
    "sound_modifications",
    "stream_bidirectional_codec",
    "stream_bidirectional_mode",
    "stream_bidirectional_target_legs",
    "stream_codec",
    "stream_track",
    "stream_url",
    "supervisor_role",
    "time_limit_secs",
    "timeout_secs",
    "transcription",
    "transcription_config",
];

/// Checks every key of `options` against `allowed`; the refusal body names
/// the first option refused (a [`NEVER`] one first).
pub fn check(options: &Map<String, Value>, allowed: &[&str]) -> Result<(), Value> {
    let refused = options
        .keys()
        .find(|k| NEVER.contains(&k.as_str()))
        .or_else(|| options.keys().find(|k| !allowed.contains(&k.as_str())));
    match refused {
        None => Ok(()),
        Some(name) => {
            let name: String = name.chars().take(64).collect();
            Err(json!({"error": "option_not_allowed", "option": name}))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn the_four_are_never_allowed_and_unknown_options_are_refused() {
        for never in NEVER {
            assert!(!ANSWER.contains(&never) && !DIAL.contains(&never));
            let refused = check(&map(json!({"to": "+1", never: "x"})), DIAL).unwrap_err();
            assert_eq!(
                refused,
                json!({"error": "option_not_allowed", "option": never})
            );
        }
        assert_eq!(
            check(&map(json!({"surprise": 1})), ANSWER).unwrap_err()["option"],
            "surprise"
        );
        check(
            &map(json!({"to": "+1", "from": "+2", "timeout_secs": 30})),
            DIAL,
        )
        .unwrap();
        check(&map(json!({"client_state": "e30="})), ANSWER).unwrap();
    }
}

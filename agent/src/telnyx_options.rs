//! The Telnyx options a caller of `/local/answer` and `/local/dial` may
//! pass through (SPEC §11: an allow-list).
//!
//! Refused outright, whatever else is sent, with 400
//! `{"error":"option_not_allowed","option":<name>}`: `webhook_url` and
//! `webhook_url_method` (they would send the call's later webhooks around
//! the edge, past the fence and the ledger), `connection_id` (a dial
//! uses the agent's configured `[telnyx] connection_id`) and `command_id`
//! (an answer's is the fence's). Any option not listed in [`SHARED`] or
//! [`DIAL_ONLY`] is refused the same way: an option Telnyx adds later stays
//! closed until it is read and listed here.

use serde_json::{json, Map, Value};

/// Options that can send a call's control somewhere else, never passed on.
pub const NEVER: [&str; 4] = [
    "webhook_url",
    "webhook_url_method",
    "connection_id",
    "command_id",
];

/// Options of both commands, passed through: what the call sounds like,
/// what is recorded or streamed, and the app's own state.
pub const SHARED: &[&str] = &[
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

/// Options of a dial only, passed through besides [`SHARED`].
pub const DIAL_ONLY: &[&str] = &[
    "to",
    "from",
    "from_display_name",
    "answering_machine_detection",
    "answering_machine_detection_config",
    "audio_url",
    "bridge_intent",
    "bridge_on_answer",
    "link_to",
    "media_encryption",
    "media_name",
    "park_after_unbridge",
    "sip_auth_password",
    "sip_auth_username",
    "sip_transport_protocol",
    "supervisor_role",
    "time_limit_secs",
    "timeout_secs",
];

/// The Telnyx command whose options are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `answer` (besides the route's own `call_control_id`,
    /// `call_session_id` and `epoch`): [`SHARED`].
    Answer,
    /// `dial`: [`SHARED`] and [`DIAL_ONLY`].
    Dial,
}

impl Command {
    /// True when `option` may be passed through to this command.
    pub fn allows(self, option: &str) -> bool {
        SHARED.contains(&option) || (self == Command::Dial && DIAL_ONLY.contains(&option))
    }
}

/// Checks every key of `options` against what `command` allows; the refusal
/// body names the first option refused (a [`NEVER`] one first).
pub fn check(options: &Map<String, Value>, command: Command) -> Result<(), Value> {
    let refused = options
        .keys()
        .find(|k| NEVER.contains(&k.as_str()))
        .or_else(|| options.keys().find(|k| !command.allows(k)));
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
            assert!(!Command::Answer.allows(never) && !Command::Dial.allows(never));
            let refused = check(&map(json!({"to": "+1", never: "x"})), Command::Dial).unwrap_err();
            assert_eq!(
                refused,
                json!({"error": "option_not_allowed", "option": never})
            );
        }
        assert_eq!(
            check(&map(json!({"surprise": 1})), Command::Answer).unwrap_err()["option"],
            "surprise"
        );
        check(
            &map(json!({"to": "+1", "from": "+2", "timeout_secs": 30})),
            Command::Dial,
        )
        .unwrap();
        check(&map(json!({"client_state": "e30="})), Command::Answer).unwrap();
        check(&map(json!({"to": "+1"})), Command::Answer).unwrap_err();
    }
}

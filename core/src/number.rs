//! Phone numbers: normalisation of whatever the carrier or an operator wrote
//! (`sip:` URIs, `tel:` URIs, national formats) to canonical E.164, and
//! masking for logs.
//!
//! The rule (SPEC §5): strip `sip:`/`sips:`/`tel:`, keep the user part (before
//! `@` and `;`), drop spaces, `-`, `.`, `(`, `)`, turn a leading `00` into `+`,
//! add `+` to 11 digits starting with 1 and `+1` to 10 digits. The result must
//! be canonical E.164 (`^\+[1-9][0-9]{1,14}$`) or it matches nothing.

/// Inputs longer than this many bytes are refused outright.
pub const MAX_INPUT_BYTES: usize = 64;

/// Longest string [`mask`] looks at; anything beyond is cut and marked `…`.
pub const MAX_MASK_CHARS: usize = 64;

/// URI schemes removed before the user part is read (matched without regard
/// to ASCII case, as URI schemes are case-insensitive).
const SCHEMES: [&str; 3] = ["sips:", "sip:", "tel:"];

/// Normalises a phone number to canonical E.164 (`+15102160079`), or `None`
/// when the input cannot be read as one (garbage, wrong digit count, a
/// leading `+0`, more than [`MAX_INPUT_BYTES`] bytes).
///
/// The result is idempotent: normalising an output gives the same output.
pub fn normalise(raw: &str) -> Option<String> {
    if raw.len() > MAX_INPUT_BYTES {
        return None;
    }
    let mut text = raw.trim();
    for scheme in SCHEMES {
        if let Some(head) = text.get(..scheme.len()) {
            if head.eq_ignore_ascii_case(scheme) {
                text = &text[scheme.len()..];
                break;
            }
        }
    }
    // The user part: everything before the first `@` or `;`.
    let user = text.split(['@', ';']).next().unwrap_or("");
    let compact: String = user
        .chars()
        .filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')'))
        .collect();

    let candidate = if let Some(rest) = compact.strip_prefix("00") {
        format!("+{rest}")
    } else if compact.starts_with('+') {
        compact
    } else if compact.bytes().all(|b| b.is_ascii_digit()) {
        match compact.len() {
            11 if compact.starts_with('1') => format!("+{compact}"),
            10 => format!("+1{compact}"),
            _ => return None,
        }
    } else {
        return None;
    };
    is_e164(&candidate).then_some(candidate)
}

/// True when `s` is canonical E.164: `+`, a non-zero digit, then 1 to 14
/// more digits, nothing else.
pub fn is_e164(s: &str) -> bool {
    let Some(digits) = s.strip_prefix('+') else {
        return false;
    };
    let bytes = digits.as_bytes();
    (2..=15).contains(&bytes.len()) && bytes[0] != b'0' && bytes.iter().all(|b| b.is_ascii_digit())
}

/// Masks a number for logs: every ASCII digit except the last four becomes
/// `*`; other characters are kept. Input beyond [`MAX_MASK_CHARS`]
/// characters is cut off and replaced by `…`, so a log line stays bounded.
pub fn mask(s: &str) -> String {
    let truncated = s.chars().count() > MAX_MASK_CHARS;
    let kept: Vec<char> = s.chars().take(MAX_MASK_CHARS).collect();
    let digits = kept.iter().filter(|c| c.is_ascii_digit()).count();
    let hide = digits.saturating_sub(4);
    let mut seen = 0usize;
    let mut out = String::with_capacity(kept.len() + 3);
    for c in kept {
        if c.is_ascii_digit() {
            seen += 1;
            out.push(if seen <= hide { '*' } else { c });
        } else {
            out.push(c);
        }
    }
    if truncated {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn normalises_the_documented_forms() {
        let cases: &[(&str, Option<&str>)] = &[
            ("+1-202-555-0133", Some("+12025550133")),
            (
                "sip:+15102160079@sip.telnyx.com;transport=udp",
                Some("+15102160079"),
            ),
            ("sips:+15102160079@sip.telnyx.com", Some("+15102160079")),
            ("SIP:15102160079@sip.telnyx.com", Some("+15102160079")),
            ("tel:+44 20 7946 0958", Some("+442079460958")),
            ("tel:+44-20-7946-0958;ext=12", Some("+442079460958")),
            ("0044 20 7946 0958", Some("+442079460958")),
            ("(510) 216-0079", Some("+15102160079")),
            ("510.216.0079", Some("+15102160079")),
            ("15102160079", Some("+15102160079")),
            ("5102160079", Some("+15102160079")),
            ("  +15102160079  ", Some("+15102160079")),
            ("+15102160079", Some("+15102160079")),
            // wrong shapes
            ("25102160079", None),       // 11 digits not starting with 1
            ("510216007", None),         // 9 digits
            ("+0123456789", None),       // +0 is never E.164
            ("000123", None),            // 00 then 0
            ("+1", None),                // too short
            ("+1234567890123456", None), // 16 digits
            ("", None),
            ("sip:", None),
            ("sips:", None),
            ("tel:", None),
            ("sip:alice@example.com", None),
            ("hello", None),
            ("+1510abc0079", None),
            ("++15102160079", None),
            ("sip:sip:+15102160079", None),
            ("+١٥١٠٢١٦٠٠٧٩", None), // non-ASCII digits
            (
                "sip:+15102160079@a-very-long-host-name-that-pushes-us-over.example.com",
                None,
            ),
        ];
        for (raw, want) in cases {
            assert_eq!(normalise(raw).as_deref(), *want, "input {raw:?}");
        }
    }

    #[test]
    fn refuses_input_over_the_limit_even_if_it_would_parse() {
        let padded = format!("{}+15102160079", " ".repeat(MAX_INPUT_BYTES));
        assert_eq!(normalise(&padded), None);
        let fits = format!("{}+15102160079", " ".repeat(MAX_INPUT_BYTES - 12));
        assert_eq!(fits.len(), MAX_INPUT_BYTES);
        assert_eq!(normalise(&fits).as_deref(), Some("+15102160079"));
    }

    #[test]
    fn e164_shape() {
        assert!(is_e164("+15102160079"));
        assert!(is_e164("+12"));
        assert!(is_e164("+123456789012345"));
        assert!(!is_e164("+1234567890123456"));
        assert!(!is_e164("+1"));
        assert!(!is_e164("+05102160079"));
        assert!(!is_e164("15102160079"));
        assert!(!is_e164("+1510 2160079"));
        assert!(!is_e164(""));
    }

    #[test]
    fn masks_all_but_the_last_four_digits() {
        assert_eq!(mask("+15102160079"), "+*******0079");
        assert_eq!(mask("0079"), "0079");
        assert_eq!(mask("+1 (510) 216-0079"), "+* (***) ***-0079");
        assert_eq!(mask(""), "");
        let long = "1".repeat(100);
        let masked = mask(&long);
        assert!(masked.ends_with("1111…"));
        assert_eq!(masked.chars().count(), MAX_MASK_CHARS + 1);
    }

    proptest! {
        #[test]
        fn normalise_never_panics_and_is_canonical(raw in any::<String>()) {
            if let Some(n) = normalise(&raw) {
                prop_assert!(is_e164(&n), "{n:?}");
                prop_assert_eq!(normalise(&n), Some(n.clone()));
            }
        }

        #[test]
        fn normalise_of_phone_like_text_is_canonical_and_idempotent(
            raw in "(sip:|sips:|tel:|SIP:)?[+0-9 ().-]{0,30}(@[a-z.]{0,10})?(;[a-z=]{0,10})?"
        ) {
            if let Some(n) = normalise(&raw) {
                prop_assert!(is_e164(&n), "{n:?}");
                prop_assert_eq!(normalise(&n), Some(n.clone()));
            }
        }

        #[test]
        fn mask_never_panics_and_hides_digits(raw in any::<String>()) {
            let masked = mask(&raw);
            prop_assert!(masked.chars().filter(|c| c.is_ascii_digit()).count() <= 4);
        }
    }
}

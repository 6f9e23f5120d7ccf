//! Admission under overload: what the Dispatcher does when webhooks arrive
//! faster than it can decide them.
//!
//! One Dispatcher decides every call in order, so when webhooks arrive
//! faster than it can take them they queue in front of it, and every one of
//! them waits longer. Left alone, the wait grows until the carrier's own 2 s
//! timeout passes for all of them at once. Instead the Dispatcher sheds: a
//! new webhook that reaches it more than [`MAX_QUEUE_WAIT_MS`] after the
//! Worker sent it is answered 503 `overloaded` with `Retry-After: 1` at
//! once, before anything is stored (Telnyx retries it later), so the calls
//! it does take keep a bounded latency and an answer well inside the
//! carrier's window.
//!
//! Only webhooks are shed. Reports, fences, claims and heartbeats are
//! always taken: they finish work already started (a shed report would lapse
//! a lease into an ambiguous outcome; a shed fence would delay an answer).
//!
//! The wait is measured between the Worker's clock at sending and the
//! Dispatcher's at taking the message. A difference below zero, or above
//! [`MAX_BELIEVABLE_WAIT_MS`], says the clocks disagree rather than that
//! the queue is long, and the webhook is taken (shedding must never refuse
//! everything because two clocks drifted).

/// The longest a webhook may have queued for the Dispatcher and still be
/// taken.
pub const MAX_QUEUE_WAIT_MS: i64 = 400;

/// A longer "wait" is a clock disagreement, not a queue.
pub const MAX_BELIEVABLE_WAIT_MS: i64 = 10_000;

/// True when a webhook the Worker sent at `sent_at_ms` (if it said) is taken
/// at `now_ms`.
pub fn admits_webhook(sent_at_ms: Option<i64>, now_ms: i64) -> bool {
    let Some(sent_at_ms) = sent_at_ms else {
        return true;
    };
    let waited = now_ms - sent_at_ms;
    !(MAX_QUEUE_WAIT_MS < waited && waited <= MAX_BELIEVABLE_WAIT_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_that_queued_too_long_is_shed() {
        let now = 1_796_000_000_000;
        for (sent, taken) in [
            (None, true),
            (Some(now), true),
            (Some(now - MAX_QUEUE_WAIT_MS), true),
            (Some(now - MAX_QUEUE_WAIT_MS - 1), false),
            (Some(now - MAX_BELIEVABLE_WAIT_MS), false),
            // Clocks that disagree never shed.
            (Some(now - MAX_BELIEVABLE_WAIT_MS - 1), true),
            (Some(now + 5_000), true),
        ] {
            assert_eq!(admits_webhook(sent, now), taken, "{sent:?}");
        }
    }
}

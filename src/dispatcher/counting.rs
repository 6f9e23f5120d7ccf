//! What the Dispatcher counts for its metrics (SPEC §17), and what a scrape
//! reads: each engine outcome named by its class, in memory, after the
//! engine's unit has committed. Counting writes nothing to storage, so the
//! webhook path keeps its statements (`make bench`); the engine itself
//! stages its decisions and the alarm's rejections
//! ([`Counters`]).

use callfence_core::engine::{
    Engine, EngineError, FenceReply, Ingress, PendingReason, ReportEffect,
};
use callfence_core::metrics::{gauges, ClaimLimit, Count, Counters, Sample, WebhookOutcome};
use callfence_core::metrics::{STORAGE_FULL, WEBHOOKS};
use callfence_core::outcome::OutcomeClass;
use callfence_core::refusal::Refusal;
use callfence_core::store::Store;

/// The class of a webhook's answer decided at ingress; `None` for a
/// forward, whose outcome its report decides.
pub fn ingress_outcome(ingress: &Ingress) -> Option<WebhookOutcome> {
    Some(match ingress {
        // Sent on to the shard that decides it, which counts it; or
        // served again once room was asked for, and counted then.
        Ingress::Forward(_) | Ingress::Redirect(_) | Ingress::NeedRoom => return None,
        Ingress::Delivered(_) => WebhookOutcome::Duplicate,
        Ingress::InProgress => WebhookOutcome::InProgress,
        Ingress::Pending(PendingReason::NoPolicy | PendingReason::NoEligibleNode) => {
            WebhookOutcome::Pending
        }
        Ingress::StorageFull => WebhookOutcome::StorageFull,
        Ingress::Rejected => WebhookOutcome::Rejected,
        Ingress::Ignored => WebhookOutcome::Ignored,
        Ingress::Unroutable => WebhookOutcome::Unroutable,
    })
}

/// The class of the answer a report ends with: for a webhook
/// (`for_webhook`), every effect but a move that is forwarded again at once;
/// for the alarm, only a delivery (SPEC §17: "plus one per event that the
/// alarm later delivers").
pub fn report_outcome(
    effect: &ReportEffect,
    class: OutcomeClass,
    for_webhook: bool,
) -> Option<WebhookOutcome> {
    let delivered = if class == OutcomeClass::DeliveredWithError {
        WebhookOutcome::DeliveredError
    } else {
        WebhookOutcome::Delivered
    };
    match effect {
        ReportEffect::Delivered(_) => Some(delivered),
        _ if !for_webhook => None,
        ReportEffect::Reassigned(Some(_)) => None,
        ReportEffect::Reassigned(None) => Some(WebhookOutcome::Reassigned),
        ReportEffect::Unknown => Some(WebhookOutcome::DeliveryUnknown),
        ReportEffect::Parked(_) => Some(WebhookOutcome::Pending),
    }
}

/// The `class` label of a forward failure, if the origin's answer was one.
pub fn failure_class(class: OutcomeClass) -> Option<&'static str> {
    match class {
        OutcomeClass::NotDelivered => Some("not_admitted"),
        OutcomeClass::Unknown => Some("unknown"),
        OutcomeClass::Delivered | OutcomeClass::DeliveredWithError => None,
    }
}

/// Counts a webhook's answer decided at ingress.
pub fn ingress(counters: &Counters, ingress: &Ingress) {
    if let Some(outcome) = ingress_outcome(ingress) {
        counters.count(Count::Webhook(outcome));
    }
}

/// Counts one forward's report: a failure against its node, and the
/// webhook's (or the alarm's) outcome when the delivery ended with it
/// (`finished`: what the delivery ended with, `None` while it follows the
/// call to a new owner).
pub fn report(
    counters: &Counters,
    node: &str,
    class: OutcomeClass,
    finished: Option<&ReportEffect>,
    for_webhook: bool,
) {
    if let Some(failure) = failure_class(class) {
        counters.count(Count::ForwardFailure(node, failure));
    }
    if let Some(outcome) = finished.and_then(|e| report_outcome(e, class, for_webhook)) {
        counters.count(Count::Webhook(outcome));
    }
}

/// Counts a heartbeat of a node whose key is in force: `accepted`, or the
/// code of its `refusal` (an engine failure is not a verdict on the beat and
/// never reaches here).
pub fn heartbeat(counters: &Counters, node: &str, refusal: Option<&Refusal>) {
    let code = refusal.map_or("accepted", Refusal::code);
    counters.count(Count::Heartbeat(node, code));
}

/// Counts a fence request's result.
pub fn fence(counters: &Counters, reply: &FenceReply) {
    let result = match reply {
        FenceReply::Granted(grant) if grant.first => "granted",
        FenceReply::Granted(_) => "regranted",
        FenceReply::Refused(refusal) => Refusal::Fence(*refusal).code(),
        FenceReply::UnknownNodeKey => return,
    };
    counters.count(Count::Fence(result));
}

/// Counts a claim of `node` refused under a limit.
pub fn claim_refused(counters: &Counters, node: &str, limit: ClaimLimit) {
    counters.count(Count::ClaimRefused(node, limit));
}

/// Adds a Worker isolate's batch of webhooks refused before the Dispatcher.
pub fn refused(counters: &Counters, refused: u64) {
    counters.count_n(Count::Webhook(WebhookOutcome::Refused), refused);
}

/// Everything a scrape of this object reads: its counters, the
/// `storage_full` refusals the engine counts, and the gauges of its status
/// view. Reads only.
pub fn samples<S: Store>(engine: &Engine<S>, now_ms: i64) -> Result<Vec<Sample>, EngineError> {
    let status = engine.status(now_ms)?;
    let (map_revision, _) = engine.directory().shard_map()?;
    let mut samples = gauges::from_status(&status, engine.shard().index(), map_revision)
        .map_err(EngineError::Corrupt)?;
    samples.extend(engine.metrics().samples());
    let storage_full = engine.refused().storage_full;
    samples.push(Sample::new(STORAGE_FULL, &[], storage_full));
    debug_assert!(samples.iter().any(|s| s.name == WEBHOOKS));
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use callfence_core::engine::Delivered;

    fn delivered() -> ReportEffect {
        ReportEffect::Delivered(Delivered {
            delivered_to: "M1".into(),
            epoch: 1,
            event_id: "e".into(),
        })
    }

    #[test]
    fn a_webhook_is_counted_once_by_the_answer_it_ends_with() {
        use OutcomeClass::*;
        let cases = [
            (
                delivered(),
                Delivered,
                true,
                Some(WebhookOutcome::Delivered),
            ),
            (
                delivered(),
                DeliveredWithError,
                true,
                Some(WebhookOutcome::DeliveredError),
            ),
            (
                ReportEffect::Unknown,
                Unknown,
                true,
                Some(WebhookOutcome::DeliveryUnknown),
            ),
            (
                ReportEffect::Reassigned(None),
                NotDelivered,
                true,
                Some(WebhookOutcome::Reassigned),
            ),
            (
                ReportEffect::Parked(PendingReason::NoEligibleNode),
                NotDelivered,
                true,
                Some(WebhookOutcome::Pending),
            ),
            (
                delivered(),
                Delivered,
                false,
                Some(WebhookOutcome::Delivered),
            ),
            (ReportEffect::Unknown, Unknown, false, None),
            (ReportEffect::Reassigned(None), NotDelivered, false, None),
        ];
        for (effect, class, for_webhook, want) in cases {
            assert_eq!(
                report_outcome(&effect, class, for_webhook),
                want,
                "{effect:?} {class:?} {for_webhook}"
            );
        }
        assert_eq!(
            ingress_outcome(&Ingress::Delivered(match delivered() {
                ReportEffect::Delivered(d) => d,
                _ => unreachable!(),
            })),
            Some(WebhookOutcome::Duplicate)
        );
        assert_eq!(
            ingress_outcome(&Ingress::StorageFull),
            Some(WebhookOutcome::StorageFull)
        );
    }

    #[test]
    fn only_non_deliveries_are_forward_failures() {
        assert_eq!(
            failure_class(OutcomeClass::NotDelivered),
            Some("not_admitted")
        );
        assert_eq!(failure_class(OutcomeClass::Unknown), Some("unknown"));
        assert_eq!(failure_class(OutcomeClass::Delivered), None);
        assert_eq!(failure_class(OutcomeClass::DeliveredWithError), None);
    }
}
